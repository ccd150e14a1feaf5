"""The benchmark config of ``evaluate.py`` (``configs/eval/*.yaml``).

Moved verbatim out of ``metasampler/config.py`` with the run config (helper "tasks", issue
#13), so that the library no longer lists the application's task kinds; the benchmark split
(helper "bench") replaces this file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from metasampler.config import (
    Activation,
    ConfigError,
    GammaMode,
    check_run_placement,
    load_structured,
)

from .run_config import Backend, DistributedConfig, TaskConfig, TaskKind


# ============================================================================================
# Transfer-generalisation benchmark (``evaluate.py``, ``configs/eval/*.yaml``)
# ============================================================================================
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
    # warmup_lr_factor times the per-batch learning rate (004's MNIST code: one data epoch at
    # lr 0.0085, then 0.018, a factor of ~0.47). 0 steps: no warm-up.
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
    max_val: int = 0  # >0: tune on the first max_val validation examples
    # While the best value sits at an end of the grid, add the next value beyond that end (by
    # the ratio of the two values nearest it) and tune again, at most this many times; the
    # results report the initial grid, the extensions and whether the choice is interior.
    max_extensions: int = 4


@dataclass
class MethodGrid:
    """One method: whether to run it and its per-batch learning-rate grid (SPEC §1)."""

    enabled: bool = True
    lr_grid: list[float] = field(default_factory=lambda: [0.01])


@dataclass
class NNSGHMCMethod(MethodGrid):
    """The loaded sampler. An empty ``lr_grid`` uses the step stored in the sampler file."""

    lr_grid: list[float] = field(default_factory=lambda: [0.005, 0.01, 0.018])
    gamma: GammaMode | None = None  # override the file's Gamma mode (paper: finite differences)
    # How sampling steps run (NNSGHMC's `compile`): false = eager (bit-reproducible; the
    # default here so benchmark runs repeat exactly), true = compile first and wait (also
    # bit-reproducible), null = compile in the background while eager steps run (the library
    # default; results differ at float rounding from the switch on). Speeds: BENCHMARKS.md.
    compile: bool | None = False
    # The paper's alpha handling (004 F.2): alpha = alpha_per_step / eta_warmup, set from the
    # step of the warm-up phase (the test step when there is none) and kept for the whole run,
    # for a sampler whose friction_units is "absolute". None (default): keep the file's alpha,
    # the value it was meta-trained with (a file does not say how it was derived, and a
    # "per_step" sampler's alpha already transfers across N and eta).
    alpha_per_step: float | None = None


@dataclass
class SGLDMethod(MethodGrid):
    lr_grid: list[float] = field(default_factory=lambda: [0.1, 0.2, 0.4])


@dataclass
class PSGLDMethod(MethodGrid):
    lr_grid: list[float] = field(default_factory=lambda: [7e-4, 1.4e-3, 2.8e-3])
    beta: float = 0.99
    lam: float = 1e-5


@dataclass
class SGHMCMethod(MethodGrid):
    """``momentum_decay`` is the per-step friction ``a = eta * C`` (paper: 0.01), so the
    friction ``C = a / eta`` follows the tuned step."""

    lr_grid: list[float] = field(default_factory=lambda: [0.005, 0.01, 0.02])
    momentum_decay: float = 0.01


@dataclass
class SGNHTMethod(MethodGrid):
    """mSGNHT with the symmetric-splitting integrator; diffusion ``A = momentum_decay / eta``."""

    lr_grid: list[float] = field(default_factory=lambda: [0.005, 0.01, 0.02])
    momentum_decay: float = 0.01


@dataclass
class CyclicalSGLDMethod(MethodGrid):
    lr_grid: list[float] = field(default_factory=lambda: [0.2, 0.4, 0.8])
    n_cycles: int = 4
    explore_fraction: float = 0.25


@dataclass
class CyclicalSGHMCMethod(MethodGrid):
    lr_grid: list[float] = field(default_factory=lambda: [0.01, 0.02, 0.04])
    n_cycles: int = 4
    explore_fraction: float = 0.25
    momentum_decay: float = 0.01


@dataclass
class SGDMMethod(MethodGrid):
    lr_grid: list[float] = field(default_factory=lambda: [0.001, 0.003, 0.01])
    momentum: float = 0.9


@dataclass
class AdamMethod(MethodGrid):
    lr_grid: list[float] = field(default_factory=lambda: [5e-4, 1e-3, 2e-3])


@dataclass
class MethodsConfig:
    """Every method the benchmark knows; switch any off with ``methods.<key>.enabled=false``."""

    nnsghmc: NNSGHMCMethod = field(default_factory=NNSGHMCMethod)
    sgld: SGLDMethod = field(default_factory=SGLDMethod)
    psgld: PSGLDMethod = field(default_factory=PSGLDMethod)
    sghmc: SGHMCMethod = field(default_factory=SGHMCMethod)
    msgnht: SGNHTMethod = field(default_factory=SGNHTMethod)
    csgld: CyclicalSGLDMethod = field(default_factory=CyclicalSGLDMethod)
    csghmc: CyclicalSGHMCMethod = field(default_factory=CyclicalSGHMCMethod)
    sgdm: SGDMMethod = field(default_factory=SGDMMethod)
    adam: AdamMethod = field(default_factory=AdamMethod)


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


def _validate_benchmark(cfg: DictConfig) -> None:
    """Range checks of a :class:`BenchmarkConfig` the type system cannot express."""

    def get(key: str) -> Any:
        return OmegaConf.select(cfg, key)

    for key in _BENCH_POSITIVE_INT:
        if get(key) < 1:
            raise ConfigError(f"{key} must be >= 1, got {get(key)!r}")
    for key in _BENCH_NON_NEGATIVE_INT:
        if get(key) < 0:
            raise ConfigError(f"{key} must be >= 0, got {get(key)!r}")
    check_run_placement(cfg)
    if not cfg.seeds:
        raise ConfigError("seeds must be a non-empty list of ints")
    timeout = cfg.distributed.timeout_s
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ConfigError(f"distributed.timeout_s must be a finite number > 0, got {timeout!r}")
    if len(set(cfg.seeds)) != len(cfg.seeds):
        raise ConfigError(f"seeds must be distinct, got {list(cfg.seeds)}")
    if cfg.budget.burn_in >= cfg.budget.n_steps:
        raise ConfigError(
            f"budget.burn_in ({cfg.budget.burn_in}) must be < budget.n_steps "
            f"({cfg.budget.n_steps}), else no sample enters the posterior average"
        )
    if cfg.budget.warmup_steps >= cfg.budget.n_steps:
        raise ConfigError(
            f"budget.warmup_steps ({cfg.budget.warmup_steps}) must be < budget.n_steps "
            f"({cfg.budget.n_steps})"
        )
    factor = cfg.budget.warmup_lr_factor
    if not (factor > 0 and math.isfinite(factor)):
        raise ConfigError(f"budget.warmup_lr_factor must be a finite number > 0, got {factor!r}")
    alpha_per_step = cfg.methods.nnsghmc.alpha_per_step
    if alpha_per_step is not None and not (alpha_per_step >= 0 and math.isfinite(alpha_per_step)):
        raise ConfigError(
            f"methods.nnsghmc.alpha_per_step must be a finite number >= 0 or null, "
            f"got {alpha_per_step!r}"
        )
    if cfg.tune.enabled and cfg.tune.burn_in >= cfg.tune.n_steps:
        raise ConfigError(
            f"tune.burn_in ({cfg.tune.burn_in}) must be < tune.n_steps ({cfg.tune.n_steps})"
        )
    if not math.isfinite(cfg.task.prior_std) or cfg.task.prior_std <= 0:
        raise ConfigError(f"task.prior_std must be a finite number > 0, got {cfg.task.prior_std!r}")
    if not cfg.task.hidden or any(w < 1 for w in cfg.task.hidden):
        raise ConfigError(f"task.hidden must be a list of positive ints, got {cfg.task.hidden!r}")
    if cfg.task.classes is not None and (
        len(cfg.task.classes) < 2 or len(set(cfg.task.classes)) != len(cfg.task.classes)
    ):
        raise ConfigError(f"task.classes must list >= 2 distinct labels, got {cfg.task.classes!r}")
    if cfg.synthetic is not None:
        for key in _SYNTH_POSITIVE_INT:
            if get(f"synthetic.{key}") < 1:
                raise ConfigError(f"synthetic.{key} must be >= 1, got {get(f'synthetic.{key}')!r}")
        if cfg.synthetic.n_classes < 2:
            raise ConfigError(f"synthetic.n_classes must be >= 2, got {cfg.synthetic.n_classes!r}")
        if cfg.synthetic.n_ood < 0:
            raise ConfigError(f"synthetic.n_ood must be >= 0, got {cfg.synthetic.n_ood!r}")
        if cfg.synthetic.batch_size > cfg.synthetic.n_train:
            raise ConfigError(
                f"synthetic.batch_size ({cfg.synthetic.batch_size}) must be <= synthetic.n_train "
                f"({cfg.synthetic.n_train})"
            )
        if not cfg.synthetic.hidden or any(w < 1 for w in cfg.synthetic.hidden):
            raise ConfigError(
                f"synthetic.hidden must be a list of positive ints, got {cfg.synthetic.hidden!r}"
            )
        for key in ("separation", "prior_std"):
            value = get(f"synthetic.{key}")
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"synthetic.{key} must be a finite number > 0, got {value!r}")
    enabled = [name for name in cfg.methods if cfg.methods[name].enabled]
    if not enabled:
        raise ConfigError("methods: every method is disabled; enable at least one")
    for name in cfg.methods:
        method = cfg.methods[name]
        grid = list(method.lr_grid)
        if not grid and name != "nnsghmc":
            raise ConfigError(f"methods.{name}.lr_grid must list at least one learning rate")
        for value in grid:
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(
                    f"methods.{name}.lr_grid values must be finite numbers > 0, got {grid!r}"
                )
        for key in ("momentum_decay", "lam"):
            if key in method and not (method[key] > 0 and math.isfinite(method[key])):
                raise ConfigError(
                    f"methods.{name}.{key} must be a finite number > 0, got {method[key]!r}"
                )
        for key in ("momentum", "beta", "explore_fraction"):
            if key in method and not 0 <= method[key] < 1:
                raise ConfigError(f"methods.{name}.{key} must be in [0, 1), got {method[key]!r}")
        if "n_cycles" in method:
            shortest = (
                min(cfg.budget.n_steps, cfg.tune.n_steps)
                if cfg.tune.enabled
                else (cfg.budget.n_steps)
            )
            if not 1 <= method.n_cycles <= shortest:
                raise ConfigError(
                    f"methods.{name}.n_cycles must be in [1, {shortest}] (the shortest run, "
                    f"budget.n_steps or tune.n_steps), got {method.n_cycles!r}"
                )


def load_benchmark_config(
    path: str | Path | None = None, overrides: list[str] | None = None
) -> DictConfig:
    """:class:`BenchmarkConfig` schema <- YAML file <- ``key=value`` overrides, validated.

    Raises :class:`ConfigError` naming the key for unknown keys, wrong types and bad values,
    before any work starts.
    """
    return load_structured(BenchmarkConfig, path, overrides, _validate_benchmark)


__all__ = [
    "AdamMethod",
    "Backend",
    "BenchmarkConfig",
    "DistributedConfig",
    "BudgetConfig",
    "CyclicalSGHMCMethod",
    "CyclicalSGLDMethod",
    "MethodGrid",
    "MethodsConfig",
    "NNSGHMCMethod",
    "PSGLDMethod",
    "SGDMMethod",
    "SGHMCMethod",
    "SGLDMethod",
    "SGNHTMethod",
    "SyntheticTaskConfig",
    "TuneConfig",
    "load_benchmark_config",
]
