"""Build the parts of a meta-training run from a validated config."""

from __future__ import annotations

import copy
from typing import Any

from ..config import TrainConfig
from ..learned.nnsghmc import NNSGHMC
from ..nnsghmc_args import NNSGHMCArgs

__all__ = ["build_sampler", "settings_from_config", "with_step"]


def build_sampler(cfg: Any, seed: int = 0) -> NNSGHMC:
    """An untrained :class:`NNSGHMC` from a ``SamplerConfig``."""
    args = NNSGHMCArgs.from_config(cfg)
    return NNSGHMC(eta=cfg.eta, lr=cfg.lr, seed=seed, **args.as_kwargs())


def with_step(sampler: NNSGHMC, eta: float | None = None, lr: float | None = None) -> NNSGHMC:
    """A copy of ``sampler`` that uses another step (e.g. the evaluation step)."""
    other = copy.deepcopy(sampler)
    other.eta, other.lr = eta, lr
    return other


def settings_from_config(cfg: Any) -> TrainConfig:
    """A :class:`~metasampler.config.TrainConfig` from an OmegaConf ``train`` node (or a
    plain mapping)."""
    values = {k: cfg[k] for k in TrainConfig.__dataclass_fields__ if k in cfg}
    for key in ("adam_betas", "step_scale_range"):
        if values.get(key) is not None:
            values[key] = [float(b) for b in values[key]]
    return TrainConfig(**values)
