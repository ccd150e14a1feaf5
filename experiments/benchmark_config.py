"""The benchmark config of ``evaluate.py`` (``configs/eval/*.yaml``): an OmegaConf structured
config, validated before any work starts.

The ``methods`` section is built from the benchmark's method registry
(:data:`metasampler.benchmark.METHODS`: one section per method, its schema and checks), so a
method is described in one place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from metasampler.adapt import MIN_BURN_IN
from metasampler.benchmark.methods import METHODS, check_method_section
from metasampler.benchmark.tables import TUNE_METRICS
from metasampler.config import Activation, ConfigError, check_run_placement, load_structured

from .run_config import DistributedConfig, TaskConfig, TaskKind

__all__ = [
    "BenchmarkConfig",
    "BudgetConfig",
    "MethodsConfig",
    "SyntheticTaskConfig",
    "TuneConfig",
    "load_benchmark_config",
]


@dataclass
class SyntheticTaskConfig:
    """A small synthetic classification problem (Gaussian blobs through a tiny MLP), used
    instead of ``task`` when set. For tests and smoke runs only: it needs no data files."""

    n_train: int = 400
    n_val: int = 200
    n_test: int = 200
    n_ood: int = 200  # out-of-distribution inputs (wider, shifted blobs); 0: none
    n_features: int = 8
    n_classes: int = 3
    hidden: list[int] = field(default_factory=lambda: [16])
    activation: Activation = Activation.relu
    separation: float = 2.0  # distance scale of the class means
    batch_size: int = 50
    prior_std: float = 1.0
    seed: int = 0


@dataclass
class BudgetConfig:
    """The budget every method gets (same steps, chains and minibatch size)."""

    n_chains: int = 20
    n_steps: int = 1000
    burn_in: int = 200  # steps before the running posterior average starts
    thin: int = 10  # add the K current chains to the running average every `thin` steps
    eval_every: int = 50  # test-set learning-curve points
    eval_batch_size: int = 1000  # examples per forward pass when predicting
    max_test: int = 0  # >0: score only the first max_test test examples (CPU budgets)
    # Warm-up phase, every method alike (tuning runs too): the first warmup_steps steps run at
    # warmup_lr_factor times the per-batch learning rate (Gong et al.'s MNIST code: one data epoch
    # at lr 0.0085, then 0.018, a factor of ~0.47). 0 steps: no warm-up.
    warmup_steps: int = 0
    warmup_lr_factor: float = 1.0


@dataclass
class TuneConfig:
    """Step-size tuning on the validation split: a short run per grid value, lowest NLL."""

    enabled: bool = True  # false: the first grid value of every method is used
    n_steps: int = 200
    n_chains: int = 0  # 0: budget.n_chains
    burn_in: int = 100  # validation NLL of the running average after burn_in
    thin: int = 10
    seed: int = 10_000  # chains of tuning runs use seeds that evaluation does not
    # Runs per grid value (seeds seed, seed + 1, ...), their validation NLLs averaged: one run
    # is a noisy score (a rounding-level change moved MNIST NT scores by 2-6 %).
    n_seeds: int = 1
    max_val: int = 0  # >0: tune on the first max_val validation examples
    # While the best value sits at an end of the grid, add the next value beyond that end (by
    # the ratio of the two values nearest it) and tune again, at most this many times; the
    # results report the initial grid, the extensions and whether the choice is interior.
    max_extensions: int = 4
    # > 0: also extend past an end of the grid that scores within this fraction of the best
    # (one run per value is a noisy score: a bump next to the best can hide a better value
    # beyond it). The extensions' cap is the same.
    edge_tolerance: float = 0.0
    # What a tuning run is scored by: the validation NLL of the posterior average of its
    # samples after burn_in ("average_nll") or of the final K-chain ensemble ("ensemble_nll",
    # the paper's reported metric; it needs n_chains 0, an ensemble's NLL depends
    # on its number of chains).
    metric: str = "average_nll"
    # How each sampler's step is chosen: "grid" (the short runs above), "adapt" (no tuning
    # runs: every seed chooses its step, and a momentum method its friction, during its own
    # burn-in from the grid's middle value, ranked by the validation NLL;
    # metasampler.Adapt) or "both" (a row of each; the adapted row is "<key>_adapted").
    # Optimisers keep the grid.
    mode: str = "grid"


#: ``tune.mode``: how each sampler's step is chosen (see :class:`TuneConfig`).
TUNE_MODES = ("grid", "adapt", "both")

#: Every method the benchmark knows, one section per entry of the registry (its schema);
#: switch any off with ``methods.<key>.enabled=false``.
MethodsConfig = make_dataclass(
    "MethodsConfig",
    [(key, spec.schema, field(default_factory=spec.schema)) for key, spec in METHODS.items()],
)
MethodsConfig.__module__ = __name__
MethodsConfig.__doc__ = (
    "Every method the benchmark knows (the registry's sections); switch any off with "
    "``methods.<key>.enabled=false``."
)


@dataclass
class BenchmarkConfig:
    """``evaluate.py``: a loaded NNSGHMC against the baselines on one Bayesian-NN task."""

    name: str = "eval"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    device: str = "cpu"
    threads: int = 0  # torch intra-op threads; 0 keeps torch's default
    out_dir: str = "runs/eval"
    progress: bool = True
    tensorboard: bool = True
    sampler_path: str | None = None  # NNSGHMC file; --sampler overrides
    task: TaskConfig = field(
        default_factory=lambda: TaskConfig(kind=TaskKind.mnist_mlp, hidden=[40, 40])
    )
    synthetic: SyntheticTaskConfig | None = None  # set: use it instead of `task`
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    methods: MethodsConfig = field(default_factory=MethodsConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    ece_bins: int = 15
    ood_max: int = 2000  # at most this many out-of-distribution inputs are scored


_BENCH_POSITIVE_INT = [
    "budget.n_chains",
    "budget.n_steps",
    "budget.thin",
    "budget.eval_every",
    "budget.eval_batch_size",
    "tune.n_steps",
    "tune.n_seeds",
    "tune.thin",
    "ece_bins",
    "task.batch_size",
    "task.seq_len",
]
_BENCH_NON_NEGATIVE_INT = [
    "budget.burn_in",
    "budget.max_test",
    "tune.n_chains",
    "tune.burn_in",
    "tune.max_val",
    "tune.max_extensions",
    "budget.warmup_steps",
    "threads",
    "ood_max",
]
_SYNTH_POSITIVE_INT = ["n_train", "n_val", "n_test", "n_features", "batch_size"]


def _get(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key)


def _check_ranges(cfg: DictConfig) -> None:
    """Integer ranges, seeds and the distributed timeout."""
    for key in _BENCH_POSITIVE_INT:
        if _get(cfg, key) < 1:
            raise ConfigError(f"{key} must be >= 1, got {_get(cfg, key)!r}")
    for key in _BENCH_NON_NEGATIVE_INT:
        if _get(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0, got {_get(cfg, key)!r}")
    tolerance = cfg.tune.edge_tolerance
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise ConfigError(f"tune.edge_tolerance must be a finite number >= 0, got {tolerance!r}")
    if cfg.tune.metric == "ensemble_nll" and cfg.tune.n_chains not in (0, cfg.budget.n_chains):
        # A K-chain ensemble's NLL depends on K: 5-chain scores on MNIST NT chose a step 64x
        # smaller than the posterior average did, and doubled the test error.
        raise ConfigError(
            "tune.metric=ensemble_nll scores the final ensemble, whose NLL depends on its "
            f"number of chains: tune.n_chains ({cfg.tune.n_chains}) must be 0 or "
            f"budget.n_chains ({cfg.budget.n_chains})"
        )
    if cfg.tune.mode not in TUNE_MODES:
        raise ConfigError(f"tune.mode must be one of {list(TUNE_MODES)}, got {cfg.tune.mode!r}")
    if cfg.tune.mode != "grid" and cfg.budget.burn_in < MIN_BURN_IN:
        raise ConfigError(
            f"tune.mode={cfg.tune.mode} adapts the step during the burn-in: budget.burn_in "
            f"must be >= {MIN_BURN_IN}, got {cfg.budget.burn_in}"
        )
    if cfg.tune.metric not in TUNE_METRICS:
        raise ConfigError(
            f"tune.metric must be one of {list(TUNE_METRICS)}, got {cfg.tune.metric!r}"
        )
    check_run_placement(cfg)
    if not cfg.seeds:
        raise ConfigError("seeds must be a non-empty list of ints")
    timeout = cfg.distributed.timeout_s
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ConfigError(f"distributed.timeout_s must be a finite number > 0, got {timeout!r}")
    if len(set(cfg.seeds)) != len(cfg.seeds):
        raise ConfigError(f"seeds must be distinct, got {list(cfg.seeds)}")


def _check_budget(cfg: DictConfig) -> None:
    """The budget's phases fit into its runs; the tuning runs' burn-in too."""
    budget = cfg.budget
    if budget.burn_in >= budget.n_steps:
        raise ConfigError(
            f"budget.burn_in ({budget.burn_in}) must be < budget.n_steps "
            f"({budget.n_steps}), else no sample enters the posterior average"
        )
    if budget.warmup_steps >= budget.n_steps:
        raise ConfigError(
            f"budget.warmup_steps ({budget.warmup_steps}) must be < budget.n_steps "
            f"({budget.n_steps})"
        )
    factor = budget.warmup_lr_factor
    if not (factor > 0 and math.isfinite(factor)):
        raise ConfigError(f"budget.warmup_lr_factor must be a finite number > 0, got {factor!r}")
    if cfg.tune.enabled and cfg.tune.burn_in >= cfg.tune.n_steps:
        raise ConfigError(
            f"tune.burn_in ({cfg.tune.burn_in}) must be < tune.n_steps ({cfg.tune.n_steps})"
        )


def _check_task(task: DictConfig) -> None:
    if not math.isfinite(task.prior_std) or task.prior_std <= 0:
        raise ConfigError(f"task.prior_std must be a finite number > 0, got {task.prior_std!r}")
    if not task.hidden or any(w < 1 for w in task.hidden):
        raise ConfigError(f"task.hidden must be a list of positive ints, got {task.hidden!r}")
    if task.classes is not None and (
        len(task.classes) < 2 or len(set(task.classes)) != len(task.classes)
    ):
        raise ConfigError(f"task.classes must list >= 2 distinct labels, got {task.classes!r}")


def _check_synthetic(synthetic: DictConfig) -> None:
    for key in _SYNTH_POSITIVE_INT:
        if synthetic[key] < 1:
            raise ConfigError(f"synthetic.{key} must be >= 1, got {synthetic[key]!r}")
    if synthetic.n_classes < 2:
        raise ConfigError(f"synthetic.n_classes must be >= 2, got {synthetic.n_classes!r}")
    if synthetic.n_ood < 0:
        raise ConfigError(f"synthetic.n_ood must be >= 0, got {synthetic.n_ood!r}")
    if synthetic.batch_size > synthetic.n_train:
        raise ConfigError(
            f"synthetic.batch_size ({synthetic.batch_size}) must be <= synthetic.n_train "
            f"({synthetic.n_train})"
        )
    if not synthetic.hidden or any(w < 1 for w in synthetic.hidden):
        raise ConfigError(
            f"synthetic.hidden must be a list of positive ints, got {synthetic.hidden!r}"
        )
    for key in ("separation", "prior_std"):
        if not (synthetic[key] > 0 and math.isfinite(synthetic[key])):
            raise ConfigError(
                f"synthetic.{key} must be a finite number > 0, got {synthetic[key]!r}"
            )


def _check_methods(cfg: DictConfig) -> None:
    """At least one method enabled; every section passes the registry's checks."""
    if not any(cfg.methods[key].enabled for key in METHODS):
        raise ConfigError("methods: every method is disabled; enable at least one")
    shortest = min(cfg.budget.n_steps, cfg.tune.n_steps) if cfg.tune.enabled else cfg.budget.n_steps
    for key in METHODS:
        check_method_section(key, cfg.methods[key], shortest)


def _validate_benchmark(cfg: DictConfig) -> None:
    """Range checks of a :class:`BenchmarkConfig` the type system cannot express."""
    _check_ranges(cfg)
    _check_budget(cfg)
    _check_task(cfg.task)
    if cfg.synthetic is not None:
        _check_synthetic(cfg.synthetic)
    _check_methods(cfg)


def load_benchmark_config(
    path: str | Path | None = None, overrides: list[str] | None = None
) -> DictConfig:
    """:class:`BenchmarkConfig` schema <- YAML file <- ``key=value`` overrides, validated.

    Raises :class:`~metasampler.config.ConfigError` naming the key for unknown keys, wrong
    types and bad values, before any work starts.
    """
    return load_structured(BenchmarkConfig, path, overrides, _validate_benchmark)
