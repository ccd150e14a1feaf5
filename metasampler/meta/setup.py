"""Build the parts of a meta-training run from a validated config."""

from __future__ import annotations

import copy
from typing import Any

from ..learned.nnsghmc import NNSGHMC

__all__ = ["build_sampler", "with_step"]


def build_sampler(cfg: Any, seed: int = 0) -> NNSGHMC:
    """An untrained :class:`NNSGHMC` from a ``SamplerConfig``."""
    return NNSGHMC(
        eta=cfg.eta,
        lr=cfg.lr,
        q_hidden=tuple(cfg.q_hidden),
        d_hidden=tuple(cfg.d_hidden),
        activation=_value(cfg.activation),
        d_output=_value(cfg.d_output),
        beta_off=cfg.beta_off,
        alpha=cfg.alpha,
        c=cfg.c,
        q_clamp=cfg.q_clamp,
        d_output_scale=cfg.d_output_scale,
        energy_input_scale=cfg.energy_input_scale,
        grad_input_scale=cfg.grad_input_scale,
        gamma=_value(cfg.gamma),
        detach_inputs=cfg.detach_inputs,
        d_clamp=cfg.d_clamp,
        grad_input=_value(cfg.grad_input),
        friction_units=_value(cfg.friction_units),
        seed=seed,
    )


def with_step(sampler: NNSGHMC, eta: float | None = None, lr: float | None = None) -> NNSGHMC:
    """A copy of ``sampler`` that uses another step (e.g. the evaluation step)."""
    other = copy.deepcopy(sampler)
    other.eta, other.lr = eta, lr
    return other


def _value(x: Any) -> Any:
    return getattr(x, "value", x)
