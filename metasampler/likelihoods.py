"""Likelihoods of a :class:`~metasampler.bayesian.BayesianModel`: ``(outputs (B, ...), y (B, ...))
-> log p(y_b | x_b, theta)``, shape ``(B,)``."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "LogLik",
    "bernoulli_frame_log_lik",
    "bernoulli_log_lik",
    "bernoulli_sequence_log_lik",
    "categorical_log_lik",
    "gaussian_log_lik",
]

LogLik = Callable[[Tensor, Tensor], Tensor]


def _per_example(logp: Tensor) -> Tensor:
    """Sum a ``(B, ...)`` tensor of log-probabilities over everything but the batch dim."""
    return logp.reshape(logp.shape[0], -1).sum(-1) if logp.ndim > 1 else logp


def categorical_log_lik(outputs: Tensor, y: Tensor) -> Tensor:
    """``log softmax(outputs)[y] = outputs[y] - logsumexp(outputs)``: logits ``(B, ..., C)``,
    integer labels ``(B, ...)``."""
    if outputs.shape[:-1] != y.shape:
        raise ValueError(
            f"categorical likelihood needs outputs (B, ..., C) and labels (B, ...), got outputs "
            f"{tuple(outputs.shape)} and y {tuple(y.shape)}"
        )
    # gather - logsumexp rather than log_softmax: the same value without the (K, B, C) output
    logp = outputs.gather(-1, y.unsqueeze(-1)).squeeze(-1) - outputs.logsumexp(-1)
    return _per_example(logp)


def _match_shape(outputs: Tensor, y: Tensor, name: str) -> Tensor:
    if outputs.shape == y.shape:
        return outputs
    if outputs.ndim == y.ndim + 1 and outputs.shape[-1] == 1 and outputs.shape[:-1] == y.shape:
        return outputs.squeeze(-1)  # a (B, 1) regression head with (B,) targets
    raise ValueError(
        f"{name} likelihood needs outputs and y of the same shape (or outputs (B, 1) with y "
        f"(B,)), got outputs {tuple(outputs.shape)} and y {tuple(y.shape)}"
    )


def gaussian_log_lik(outputs: Tensor, y: Tensor, noise_std: float = 1.0) -> Tensor:
    """``log N(y; outputs, noise_std^2)`` summed over output dimensions (constant included)."""
    mean = _match_shape(outputs, y, "gaussian")
    z = (y - mean) / noise_std
    logp = -0.5 * z * z - (math.log(noise_std) + 0.5 * math.log(2 * math.pi))
    return _per_example(logp)


def bernoulli_log_lik(outputs: Tensor, y: Tensor) -> Tensor:
    """``y log sigmoid(o) + (1 - y) log sigmoid(-o) = y o - softplus(o)`` for logits ``o``,
    summed over every non-batch dimension (e.g. time and the 88 keys of a piano roll)."""
    logits = _match_shape(outputs, y, "bernoulli")
    return _per_example(y * logits - F.softplus(logits))


def bernoulli_frame_log_lik(outputs: Tensor, y: Tensor) -> Tensor:
    """Per-frame log-likelihood of independent Bernoulli notes: logits and 0/1 targets
    ``(..., T, P)`` (e.g. ``P = 88`` piano keys) give ``sum_p y o - softplus(o)``, shape
    ``(..., T)``. A frame whose targets are negative (padding, marked ``-1``) gives 0, so
    sequences of different lengths share one padded tensor (and padding gets no gradient)."""
    if outputs.shape != y.shape or outputs.ndim < 2:
        raise ValueError(
            "sequence likelihood needs logits and targets of the same shape (..., T, P), got "
            f"outputs {tuple(outputs.shape)} and y {tuple(y.shape)}"
        )
    valid = (y >= 0).all(-1)
    logp = (y.clamp(min=0) * outputs - F.softplus(outputs)).sum(-1)
    return logp * valid.to(logp.dtype)


def bernoulli_sequence_log_lik(outputs: Tensor, y: Tensor) -> Tensor:
    """:func:`bernoulli_frame_log_lik` summed over the frames of each sequence: logits and
    targets ``(B, T, P)`` (padding frames ``-1``) give ``log p(sequence_b)``, shape ``(B,)``."""
    if outputs.ndim != 3:
        raise ValueError(f"sequence likelihood needs (B, T, P) outputs, got {tuple(outputs.shape)}")
    return bernoulli_frame_log_lik(outputs, y).sum(-1)
