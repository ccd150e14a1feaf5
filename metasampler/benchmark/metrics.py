"""Metrics of predictions of ``K`` chains (Gong et al. 2019, §5.2).

Every chain's network gives logits ``(K, B, C)``; the *ensemble* predictive is the average of
the chains' probabilities, ``p(y | x) = 1/K sum_k softmax(f_k(x))_y`` (computed in log space,
:func:`ensemble_log_probs`). From a ``(B, C)`` predictive: test error, negative
log-likelihood (mean over examples), expected calibration error
(:func:`expected_calibration_error`, equal-width confidence bins, Guo et al. 2017) and
predictive entropy. :class:`RunningAverage` is the *posterior average* predictive, the mean of
the probabilities of all chains over every kept sample since burn-in, accumulated in log space
(float64) so that no sample has to be stored. Sequence tasks are scored per frame
(:func:`frame_metrics`). :func:`mean_se` aggregates a metric over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..bayesian import BayesianModel, bernoulli_frame_log_lik

__all__ = [
    "RunningAverage",
    "calibration_bins",
    "ensemble_log_probs",
    "ensemble_log_probs_from_lp",
    "ensemble_metrics",
    "error_rate",
    "expected_calibration_error",
    "frame_metrics",
    "frame_targets",
    "is_sequence_model",
    "mean_se",
    "member_and_ensemble_nll",
    "member_nll",
    "metrics_from_log_probs",
    "negative_log_likelihood",
    "predict_frame_log_probs",
    "predict_log_probs",
    "predictive_entropy",
]


def ensemble_log_probs(logits: Tensor) -> Tensor:
    """Log of the chain-averaged predictive probabilities.

    Args:
        logits: ``(K, B, C)`` logits of ``K`` chains on ``B`` examples.

    Returns:
        ``(B, C)``: ``log(1/K sum_k softmax(logits_k))``, computed with ``logsumexp``.
    """
    if logits.ndim != 3:
        raise ValueError(f"logits must have shape (K, B, C), got {tuple(logits.shape)}")
    log_p = F.log_softmax(logits.double(), dim=-1)
    return torch.logsumexp(log_p, dim=0) - math.log(logits.shape[0])


def _check_pred(log_probs: Tensor, y: Tensor | None = None) -> None:
    if log_probs.ndim != 2:
        raise ValueError(f"log_probs must have shape (B, C), got {tuple(log_probs.shape)}")
    if y is not None and (y.ndim != 1 or y.shape[0] != log_probs.shape[0]):
        raise ValueError(f"labels must have shape ({log_probs.shape[0]},), got {tuple(y.shape)}")


def error_rate(log_probs: Tensor, y: Tensor) -> float:
    """Fraction of examples whose most probable class is not the label.

    Args:
        log_probs: ``(B, C)`` log predictive probabilities (or anything monotone in them).
        y: ``(B,)`` integer labels.
    """
    _check_pred(log_probs, y)
    return float((log_probs.argmax(-1) != y.to(log_probs.device)).double().mean())


def negative_log_likelihood(log_probs: Tensor, y: Tensor) -> float:
    """Mean negative log predictive probability of the labels, ``-1/B sum_b log p(y_b|x_b)``."""
    _check_pred(log_probs, y)
    picked = log_probs.gather(-1, y.to(log_probs.device).long().unsqueeze(-1)).squeeze(-1)
    return float(-picked.double().mean())


def member_nll(log_probs: Tensor, y: Tensor) -> float:
    """The members' mean NLL: :func:`negative_log_likelihood` of each of ``K`` members'
    ``(K, B, C)`` log-probabilities, averaged over the members (not the NLL of their average)."""
    if log_probs.ndim != 3:
        raise ValueError(f"log_probs must have shape (K, B, C), got {tuple(log_probs.shape)}")
    labels = y.to(log_probs.device).repeat(log_probs.shape[0])
    return negative_log_likelihood(log_probs.flatten(0, 1), labels)


def member_and_ensemble_nll(log_probs: Tensor, y: Tensor) -> tuple[float, float]:
    """``(members' mean NLL, their ensemble's NLL)`` of ``(K, B, C)`` log-probabilities: the
    ensemble averages the members' probabilities, so the second is at most the first."""
    return member_nll(log_probs, y), negative_log_likelihood(
        ensemble_log_probs_from_lp(log_probs), y
    )


def calibration_bins(
    log_probs: Tensor, y: Tensor, n_bins: int = 15
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-bin mean confidence, accuracy and count for equal-width confidence bins.

    The confidence of an example is its top predictive probability; bin ``b`` holds
    confidences in ``(b/n_bins, (b+1)/n_bins]`` (a confidence of exactly 0 goes to bin 0).
    Empty bins have confidence and accuracy ``nan``.
    """
    _check_pred(log_probs, y)
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins!r}")
    conf, pred = log_probs.double().exp().max(-1)
    correct = (pred == y.to(pred.device)).double()
    index = (torch.ceil(conf * n_bins).long() - 1).clamp(0, n_bins - 1)
    count = torch.bincount(index, minlength=n_bins).double()
    conf_sum = torch.bincount(index, weights=conf, minlength=n_bins)
    acc_sum = torch.bincount(index, weights=correct, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = (conf_sum / count).cpu().numpy()
        mean_acc = (acc_sum / count).cpu().numpy()
    return mean_conf, mean_acc, count.cpu().numpy()


def expected_calibration_error(log_probs: Tensor, y: Tensor, n_bins: int = 15) -> float:
    """``ECE = sum_b (n_b / B) |accuracy_b - confidence_b|`` over equal-width confidence bins
    (Guo et al., ICML 2017; 15 bins by default)."""
    conf, acc, count = calibration_bins(log_probs, y, n_bins)
    used = count > 0
    return float(np.sum(count[used] / count.sum() * np.abs(acc[used] - conf[used])))


def predictive_entropy(log_probs: Tensor) -> Tensor:
    """Per-example entropy ``-sum_c p_c log p_c`` (nats) of ``(B, C)`` log-probabilities;
    ``log C`` for a uniform predictive, 0 for a certain one."""
    _check_pred(log_probs)
    log_probs = log_probs.double()
    p = log_probs.exp()
    terms = torch.where(p > 0, p * log_probs, torch.zeros_like(p))
    return -terms.sum(-1)


def metrics_from_log_probs(log_probs: Tensor, y: Tensor, n_bins: int = 15) -> dict[str, float]:
    """``error``, ``nll``, ``ece`` and mean ``entropy`` of a ``(B, C)`` log predictive."""
    return {
        "error": error_rate(log_probs, y),
        "nll": negative_log_likelihood(log_probs, y),
        "ece": expected_calibration_error(log_probs, y, n_bins),
        "entropy": float(predictive_entropy(log_probs).mean()),
    }


def ensemble_metrics(logits: Tensor, y: Tensor, n_bins: int = 15) -> dict[str, float]:
    """Metrics of the ``K``-chain ensemble (average of the chains' probabilities).

    Args:
        logits: ``(K, B, C)`` logits.
        y: ``(B,)`` labels.
        n_bins: ECE bins.

    Returns:
        ``{"error", "nll", "ece", "entropy"}`` (entropy: mean over examples, nats).
    """
    return metrics_from_log_probs(ensemble_log_probs(logits), y, n_bins)


class RunningAverage:
    """Running posterior-average predictive: mean probabilities over chains and kept samples.

    ``update`` takes the ``(K, B, C)`` log-probabilities of the ``K`` current chains; after
    ``S`` updates :meth:`log_mean` is ``log(1/(S K) sum_s sum_k p_{s,k})``, accumulated as a
    float64 ``logsumexp`` (no underflow, nothing stored but one ``(B, C)`` tensor).
    """

    def __init__(self) -> None:
        self._log_sum: Tensor | None = None
        self.count = 0

    def update(self, log_probs: Tensor) -> None:
        """Add every chain of a ``(K, B, C)`` tensor of log-probabilities."""
        if log_probs.ndim != 3:
            raise ValueError(f"log_probs must have shape (K, B, C), got {tuple(log_probs.shape)}")
        part = torch.logsumexp(log_probs.double(), dim=0)
        if self._log_sum is None:
            self._log_sum = part
        else:
            if part.shape != self._log_sum.shape:
                raise ValueError(
                    f"shape changed: accumulated {tuple(self._log_sum.shape)}, "
                    f"got {tuple(part.shape)}"
                )
            self._log_sum = torch.logaddexp(self._log_sum, part)
        self.count += log_probs.shape[0]

    @property
    def log_sum(self) -> Tensor | None:
        """``(B, C)`` log of the summed probabilities; ``None`` while nothing was added."""
        return self._log_sum

    @classmethod
    def from_log_sum(cls, log_sum: Tensor, count: int) -> RunningAverage:
        """An average holding ``count`` chain samples whose probabilities sum to
        ``exp(log_sum)`` (e.g. the sums of all ranks, combined)."""
        average = cls()
        average._log_sum, average.count = log_sum, int(count)
        return average

    def log_mean(self) -> Tensor:
        """``(B, C)`` log of the average probabilities; raises if nothing was added."""
        if self._log_sum is None:
            raise ValueError("RunningAverage is empty: no sample has been added")
        return self._log_sum - math.log(self.count)

    def mean(self) -> Tensor:
        """``(B, C)`` average probabilities."""
        return self.log_mean().exp()


@torch.no_grad()
def predict_log_probs(
    model: BayesianModel, theta: Tensor, x: Tensor, batch_size: int = 1000
) -> Tensor:
    """``(K, B, C)`` log-softmax outputs of every chain's network, in chunks of examples."""
    pieces = [
        F.log_softmax(model.forward(theta, x[i : i + batch_size]).double(), dim=-1)
        for i in range(0, x.shape[0], batch_size)
    ]
    return torch.cat(pieces, dim=1)


def ensemble_log_probs_from_lp(log_probs: Tensor) -> Tensor:
    """``(K, ...)`` per-sample log-probabilities -> ``(...)`` the log of their average over
    the first axis (e.g. ``(K, B, C)`` per-chain class log-probabilities -> ``(B, C)``)."""
    return torch.logsumexp(log_probs, 0) - math.log(log_probs.shape[0])


# --------------------------------------------------------------------------------------------
# Sequence tasks (likelihood "bernoulli_sequence": 88-key piano rolls, tasks/chorales.py)
# --------------------------------------------------------------------------------------------
# A sequence task is scored per frame: its "examples" are the real (unpadded) frames, and its
# per-chain "log-probabilities" are (K, F, 1 + P): column 0 is log p(frame_f | theta_k) (the
# product of the P independent Bernoullis), columns 1: are log P(key on | theta_k). Averaging
# probabilities over chains (ensemble_log_probs_from_lp, RunningAverage) then gives the chain
# mixture of every frame and its per-key marginals, so the classification accumulators apply
# unchanged.
def is_sequence_model(model: Any) -> bool:
    """Whether ``model`` (a target) is scored per frame (``bernoulli_sequence`` likelihood)."""
    return getattr(model, "likelihood", None) == "bernoulli_sequence"


def frame_targets(y: Tensor) -> Tensor:
    """The real frames of padded targets ``(B, T, P)`` (frames of ``-1`` dropped), ``(F, P)``
    booleans, in the order of :func:`predict_frame_log_probs`."""
    if y.ndim != 3:
        raise ValueError(f"sequence targets must have shape (B, T, P), got {tuple(y.shape)}")
    return y[(y >= 0).all(-1)] > 0.5


@torch.no_grad()
def predict_frame_log_probs(
    model: BayesianModel, theta: Tensor, x: Tensor, y: Tensor, batch_size: int = 1000
) -> Tensor:
    """``(K, F, 1 + P)`` per-frame log-likelihoods and per-key log-marginals of every chain on
    the real frames of ``(x, y)`` (sequences in chunks of ``batch_size``); see above."""
    pieces = []
    for i in range(0, x.shape[0], batch_size):
        logits = model.forward(theta, x[i : i + batch_size]).double()  # (K, b, T, P)
        targets = y[i : i + batch_size].to(logits.device, torch.float64).expand_as(logits)
        frame = bernoulli_frame_log_lik(logits, targets).unsqueeze(-1)
        valid = (targets[0] >= 0).all(-1)
        pieces.append(torch.cat([frame, F.logsigmoid(logits)], dim=-1)[:, valid])
    return torch.cat(pieces, dim=1)


def frame_metrics(log_probs: Tensor, targets: Tensor) -> dict[str, float]:
    """Metrics of an ``(F, 1 + P)`` frame predictive (see above) against ``(F, P)`` targets.

    ``nll``: mean over frames of ``-log p(frame)`` (nats per frame, summed over keys);
    ``error``: ``1 - `` frame-level accuracy ``TP / (TP + FP + FN)`` (Bay et al. 2009) of keys
    predicted on where their predictive marginal exceeds 1/2; ``ece`` and ``entropy`` are
    ``nan`` (not defined here).
    """
    if log_probs.ndim != 2 or log_probs.shape[0] != targets.shape[0]:
        raise ValueError(
            f"frame log-probs (F, 1 + P) and targets (F, P) do not match: "
            f"{tuple(log_probs.shape)}, {tuple(targets.shape)}"
        )
    on = log_probs[:, 1:] > -math.log(2.0)
    truth = targets.to(on.device).bool()
    tp = float((on & truth).sum())
    wrong = float((on ^ truth).sum())  # false positives + false negatives
    accuracy = tp / (tp + wrong) if tp + wrong > 0 else 1.0
    return {
        "error": 1.0 - accuracy,
        "nll": float(-log_probs[:, 0].double().mean()),
        "ece": math.nan,
        "entropy": math.nan,
    }


def mean_se(values: Iterable[float]) -> dict[str, float | int]:
    """``{"mean", "se", "n"}`` of the finite values (``se = std(ddof=1) / sqrt(n)``; ``nan``
    for fewer than two values, ``mean`` too for none)."""
    vals = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = int(vals.size)
    if n == 0:
        return {"mean": math.nan, "se": math.nan, "n": 0}
    se = float(vals.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return {"mean": float(vals.mean()), "se": se, "n": n}
