"""The run config of ``train_meta.py``: what to sample, the sampler, training and evaluation.

A run config is a YAML file merged over the :class:`RunConfig` schema, then ``key=value``
overrides from the command line. Unknown keys and values of the wrong type or outside the
allowed choices fail *before any work starts*, with a :class:`~metasampler.config.ConfigError`
naming the key. The ``sampler`` and ``train`` sections are the library's
:class:`~metasampler.config.SamplerConfig` and :class:`~metasampler.config.TrainConfig`; the
task section is the tasks' own schema (:class:`tasks.config.TaskConfig`, built by
``tasks.registry``).

Example (``configs/toy_gaussian.yaml``)::

    name: toy_gaussian
    seed: 0
    task: {kind: paper_train_gaussian, grad_noise_std: 1.0, init_low: 0.0, init_high: 6.0}
    sampler: {q_hidden: [40], d_hidden: [40], eta: 0.01}
    train: {epochs: 100, sub_epochs: 4, steps_per_sub_epoch: 100, n_chains: 50, unroll: 20}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from metasampler.config import (
    ConfigError,
    PoolSpan,
    SamplerConfig,
    TrainConfig,
    check_run_placement,
    check_step_scale_range,
    load_structured,
)
from metasampler.nnsghmc_args import gamma_conflict
from tasks.bnn import BNN_KINDS
from tasks.config import MusicDataset, TaskConfig, TaskKind
from tasks.gaussian import check_spectrum
from tasks.registry import check_train_activations

__all__ = [
    "Backend",
    "DistributedConfig",
    "EvalConfig",
    "MusicDataset",
    "RunConfig",
    "TaskConfig",
    "TaskKind",
    "load_config",
    "to_yaml",
]


@dataclass
class EvalConfig:
    """Evaluation during training (toy: Gaussian-fit KL and ESS on a test target)."""

    task: TaskConfig = field(
        default_factory=lambda: TaskConfig(kind=TaskKind.paper_test_gaussian, dim=20)
    )
    eta: float | None = 0.025
    lr: float | None = None
    n_chains: int = 50
    n_steps: int = 2000
    kl_at: list[int] = field(default_factory=lambda: [1000, 2000])


class Backend(str, Enum):
    """``torch.distributed`` backend under torchrun: ``auto`` picks NCCL for CUDA devices
    and gloo otherwise."""

    auto = "auto"
    gloo = "gloo"
    nccl = "nccl"


@dataclass
class DistributedConfig:
    """Chains sharded across processes (``torchrun``, docs/DISTRIBUTED.md); ignored when the
    script is not launched by torchrun."""

    backend: Backend = Backend.auto
    # Every collective fails after this long, so a rank that stops answering ends the job
    # instead of hanging it; must exceed the longest rank-0-only phase (evaluation, saving).
    timeout_s: float = 1800.0


@dataclass
class RunConfig:
    """A meta-training run (``train_meta.py``): where it writes, the task, the sampler, the
    training loop and the evaluation during training."""

    name: str = "run"
    seed: int = 0
    device: str = "cpu"
    threads: int = 0  # torch intra-op threads; 0 keeps torch's default
    out_dir: str = "runs"
    progress: bool = True
    task: TaskConfig = field(default_factory=TaskConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)


_POSITIVE_INT = [
    "train.epochs",
    "train.sub_epochs",
    "train.steps_per_sub_epoch",
    "train.n_chains",
    "train.unroll",
    "train.in_chain_thinning",
    "train.in_chain_chains",
    "train.replay_capacity",
    "train.checkpoint_every",
    "train.heldout_batch",
    "eval.n_chains",
    "eval.n_steps",
    "task.dim",
    "task.batch_size",
    "task.seq_len",
]
_NON_NEGATIVE = [
    "train.grad_clip",
    "train.cross_chain_every",
    "train.cross_chain_weight",
    "train.in_chain_weight",
    "train.heldout_weight",
    "train.temperature_weight",
    "train.temperature_burn_in",
    "train.in_chain_burn_in",
    "train.eval_every",
    "train.average_last",
    "task.grad_noise_std",
    "sampler.alpha",
    "sampler.friction_scale",
    "sampler.calibrate_steps",
    "threads",
]
_POSITIVE = [
    "distributed.timeout_s",
    "train.optimizer_lr",
    "train.stein_bandwidth_factor",
    "train.stein_ridge",
    "sampler.grad_input_scale",
    "task.prior_std",
]


_COVARIANCES = ("identity", "diagonal", "correlated")


def _validate(cfg: DictConfig) -> None:
    """Range checks the type system cannot express."""

    def get(key: str) -> Any:
        return OmegaConf.select(cfg, key)

    for key in _POSITIVE_INT:
        if get(key) < 1:
            raise ConfigError(f"{key} must be >= 1, got {get(key)!r}")
    for key in _NON_NEGATIVE:
        if not get(key) >= 0:
            raise ConfigError(f"{key} must be >= 0, got {get(key)!r}")
    for key in _POSITIVE:
        value = get(key)
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"{key} must be a finite number > 0, got {value!r}")
    if not 0 <= cfg.train.replay_prob <= 1:
        raise ConfigError(f"train.replay_prob must be in [0, 1], got {cfg.train.replay_prob!r}")
    betas = list(cfg.train.adam_betas)
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ConfigError(f"train.adam_betas must be two numbers in [0, 1), got {betas!r}")
    check_step_scale_range(cfg.train.step_scale_range)
    span = cfg.train.in_chain_span
    if span in (PoolSpan.segment, PoolSpan.epoch) and not cfg.train.accumulate:
        raise ConfigError(
            f"train.in_chain_span={span.value} needs train.accumulate=true: the pooled positions "
            "hold the graph of every window, which an optimiser step inside the segment breaks"
        )
    if span == PoolSpan.epoch and not cfg.train.continue_chains:
        raise ConfigError(
            "train.in_chain_span=epoch needs train.continue_chains=true: the pool follows the "
            "same chains across the epoch's segments"
        )
    if cfg.train.average_last > cfg.train.epochs:
        raise ConfigError(
            f"train.average_last ({cfg.train.average_last}) must be <= train.epochs "
            f"({cfg.train.epochs})"
        )
    if cfg.train.in_chain_chains > cfg.train.n_chains:
        raise ConfigError(
            f"train.in_chain_chains ({cfg.train.in_chain_chains}) must be <= train.n_chains "
            f"({cfg.train.n_chains})"
        )
    crossing = cfg.train.cross_chain_every > 0 and cfg.train.cross_chain_weight > 0
    slice_terms = [
        name for name in ("heldout_weight", "temperature_weight") if getattr(cfg.train, name) > 0
    ]
    if not (crossing or cfg.train.in_chain_weight > 0 or slice_terms):
        raise ConfigError(
            "every loss is disabled: set train.cross_chain_every and train.cross_chain_weight, "
            "train.in_chain_weight, train.heldout_weight or train.temperature_weight"
        )
    kind = getattr(cfg.task.kind, "value", cfg.task.kind)
    if cfg.train.heldout_weight > 0 and kind not in BNN_KINDS:
        raise ConfigError(
            f"train.heldout_weight > 0 needs a Bayesian task with a validation split "
            f"(task.kind in {list(BNN_KINDS)}), got task.kind={kind}"
        )
    for name in slice_terms:
        if cfg.train.cross_chain_every == 0:
            raise ConfigError(
                f"train.{name} > 0 needs train.cross_chain_every >= 1: that loss scores the "
                "cross-chain slices"
            )
    for section in ("sampler", "eval"):
        eta, lr = get(f"{section}.eta"), get(f"{section}.lr")
        if (eta is None) == (lr is None):
            raise ConfigError(
                f"give exactly one of {section}.eta and {section}.lr (set the "
                f"other to null), got eta={eta!r}, lr={lr!r}"
            )
        for key, value in ((f"{section}.eta", eta), (f"{section}.lr", lr)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"{key} must be a finite number > 0, got {value!r}")
    if cfg.task.init_high <= cfg.task.init_low:
        raise ConfigError("task.init_high must be > task.init_low")
    for key in ("sampler.q_hidden", "sampler.d_hidden", "task.hidden"):
        widths = get(key)
        if not widths or any(w < 1 for w in widths):
            raise ConfigError(f"{key} must be a non-empty list of positive ints, got {widths!r}")
    for key in ("task.cov", "eval.task.cov"):
        if get(key) not in _COVARIANCES:
            raise ConfigError(f"{key} must be one of {', '.join(_COVARIANCES)}, got {get(key)!r}")
    for section in ("task", "eval.task"):
        _check_spectrum(section, get(f"{section}.eig_range"), get(f"{section}.eig_spacing"))
    gamma = getattr(cfg.sampler.gamma, "value", cfg.sampler.gamma)
    sampler = cfg.sampler
    curl_input = getattr(sampler.curl_input, "value", sampler.curl_input)
    conflict = gamma_conflict(gamma, curl_input, sampler.thermostat)
    if conflict:
        raise ConfigError(f"sampler: {conflict}")
    try:
        check_train_activations(cfg.task.kind, cfg.task.train_activations)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if cfg.train.eval_every > 0:
        # Checked here, not at the first evaluation (which would stop a training run).
        outside = [t for t in cfg.eval.kl_at if not 1 <= t <= cfg.eval.n_steps]
        if outside:
            raise ConfigError(
                f"eval.kl_at entries must be steps in [1, eval.n_steps={cfg.eval.n_steps}], "
                f"got {list(cfg.eval.kl_at)} (outside: {outside})"
            )
    check_run_placement(cfg)


def _check_spectrum(section: str, eig_range: Any, spacing: Any) -> None:
    """``eig_range`` / ``eig_spacing`` of a task section (null: the kind's default), checked by
    the task code's own :func:`tasks.gaussian.check_spectrum`."""
    for key, value, check in (
        ("eig_range", eig_range, lambda v: check_spectrum(list(v), "log")),
        ("eig_spacing", spacing, lambda v: check_spectrum((1.0, 1.0), v)),
    ):
        if value is None:
            continue
        try:
            check(value)
        except ValueError as err:
            raise ConfigError(f"{section}.{key}: {err}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> DictConfig:
    """Schema <- YAML file <- ``key=value`` overrides, validated; raises :class:`ConfigError`."""
    return load_structured(RunConfig, path, overrides, _validate)


def to_yaml(cfg: DictConfig) -> str:
    """The config as YAML with interpolations resolved (what a run directory records)."""
    return OmegaConf.to_yaml(cfg, resolve=True)
