"""Typed experiment configs (OmegaConf structured configs).

A run config is a YAML file merged over the :class:`RunConfig` schema, then ``key=value``
overrides from the command line. Unknown keys and values of the wrong type or outside the
allowed choices fail *before any work starts*, with a :class:`ConfigError` naming the key.

Example (``configs/toy_gaussian.yaml``)::

    name: toy_gaussian
    seed: 0
    task: {kind: paper_train_gaussian, grad_noise_std: 1.0, init_low: 0.0, init_high: 6.0}
    sampler: {q_hidden: [40], d_hidden: [40], eta: 0.01}
    train: {epochs: 100, sub_epochs: 4, steps_per_sub_epoch: 100, n_chains: 50, unroll: 20}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, make_dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .nnsghmc_args import (
    Activation,
    FrictionUnits,
    GammaMode,
    GradInput,
    config_fields,
)

__all__ = [
    "ConfigError",
    "TaskKind",
    "GammaMode",
    "PoolSpan",
    "GradInput",
    "FrictionUnits",
    "TaskConfig",
    "SamplerConfig",
    "TrainConfig",
    "EvalConfig",
    "RunConfig",
    "load_config",
    "load_structured",
    "to_yaml",
]


class ConfigError(ValueError):
    """A config key or value is not valid; the message names the key."""


class TaskKind(str, Enum):
    """Targets the meta-trainer and evaluator know how to build (``tasks/registry.py``)."""

    gaussian = "gaussian"  # any-D Gaussian (identity / diagonal / correlated)
    paper_train_gaussian = "paper_train_gaussian"  # 004 F.1: 10-D, mean 3, random diagonal
    paper_test_gaussian = "paper_test_gaussian"  # 004 F.1: 20-D, mean 3, correlated
    random_gaussians = "random_gaussians"  # a new random Gaussian every meta-epoch
    mnist_mlp = "mnist_mlp"  # 004 F.2 (transfer issue)
    fmnist_cnn = "fmnist_cnn"  # 004 F.3 stand-in (transfer issue)
    chorale_gru = "chorale_gru"  # 004 F.4 (transfer issue)


class MusicDataset(str, Enum):
    bach = "bach"  # four-part chorales (music21 corpus), the JSB set's source
    palestrina = "palestrina"  # a 200-piece subset of the music21 Palestrina corpus


class PoolSpan(str, Enum):
    """What the in-chain pool of positions spans (see ``metasampler.meta.schedule``)."""

    window = "window"  # cleared after every BPTT window (the recipe before issue #11)
    segment = "segment"  # the whole segment: one Stein estimate over all its pooled samples


@dataclass
class TaskConfig:
    """What to sample: a toy target or a Bayesian neural network with its data."""

    kind: TaskKind = TaskKind.paper_train_gaussian
    dim: int = 10  # gaussian / random_gaussians
    mean: float = 3.0
    cov: str = "correlated"  # gaussian: identity | diagonal | correlated
    seed: int = 0  # seeds the random covariance / data split
    grad_noise_std: float = 1.0  # toy targets: injected gradient noise sigma
    # Gaussian targets: the energy fed to a learned sampler's nets includes the constant
    # ½ log(2 pi det Sigma), as the paper's toy code (SPEC §4; GaussianTask.with_normalised_energy)
    energy_log_normaliser: bool = False
    init_low: float = 0.0  # toy chains start uniform in [init_low, init_high]^D
    init_high: float = 6.0
    # Bayesian neural networks (mnist_mlp, fmnist_cnn, chorale_gru)
    hidden: list[int] = field(default_factory=lambda: [20])
    activation: Activation = Activation.relu
    channels: int = 8
    batch_size: int = 500
    prior_std: float = 1.0
    data_dir: str | None = None
    classes: list[int] | None = None  # restrict the training classes (NT+Data)
    # chorale_gru only (tasks/chorales.py): the music21 corpus and the chunk length in frames
    dataset: MusicDataset = MusicDataset.bach
    seq_len: int = 32


#: NNSGHMC architecture and constants (:class:`metasampler.nnsghmc_args.NNSGHMCArgs`, one
#: field per argument it marks ``config``), with the step and ``calibrate_steps``.
SamplerConfig = make_dataclass(
    "SamplerConfig",
    [
        ("eta", float | None, field(default=0.01)),
        # per-batch learning rate; eta = sqrt(lr / N)
        ("lr", float | None, field(default=None)),
        *config_fields(),
        # >0: measure input statistics with the untrained sampler
        ("calibrate_steps", int, field(default=0)),
    ],
    namespace={"__doc__": "NNSGHMC architecture and constants (see :class:`NNSGHMCArgs`)."},
)
SamplerConfig.__module__ = __name__


@dataclass
class TrainConfig:
    """Meta-training loop (004 §3.3, appendix F)."""

    epochs: int = 100
    sub_epochs: int = 4
    steps_per_sub_epoch: int = 100
    n_chains: int = 50
    unroll: int = 20
    optimizer_lr: float = 5e-4
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # paper toy: 0.5, 0.99
    grad_clip: float = 10.0  # max global norm of the meta-gradient; 0 disables (paper)
    # Truncation schedule (metasampler/meta/schedule.py). A segment is the
    # `steps_per_sub_epoch` steps of one sub-epoch; the graph is cut every `unroll` steps.
    # The defaults are the recipe before issue #11; the paper's toy schedule is
    # accumulate=true, step_per_loss=true, continue_chains=true, in_chain_span=segment.
    accumulate: bool = False  # true: sum the windows' gradients, step once per segment
    step_per_loss: bool = False  # true: one optimiser step per loss (cross, then in-chain)
    continue_chains: bool = False  # true: chains run on across an epoch's sub-epochs
    in_chain_span: PoolSpan = PoolSpan.window
    cross_chain_every: int = 2  # 0 disables the cross-chain loss
    cross_chain_weight: float = 1.0
    in_chain_weight: float = 1.0  # 0 disables the in-chain loss
    in_chain_burn_in: int = 50
    in_chain_thinning: int = 3
    in_chain_chains: int = 5
    replay_prob: float = 0.15
    replay_capacity: int = 1000
    stein_bandwidth_factor: float = 0.5
    stein_ridge: float = 0.04
    checkpoint_every: int = 5  # epochs
    eval_every: int = 10  # epochs; 0 disables evaluation during training


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
    "train.in_chain_burn_in",
    "train.eval_every",
    "task.grad_noise_std",
    "sampler.alpha",
    "sampler.c",
    "sampler.d_output_scale",
    "sampler.calibrate_steps",
    "threads",
]
_POSITIVE = [
    "distributed.timeout_s",
    "train.optimizer_lr",
    "train.stein_bandwidth_factor",
    "train.stein_ridge",
    "sampler.q_clamp",
    "sampler.energy_input_scale",
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
    if cfg.train.in_chain_span == PoolSpan.segment and not cfg.train.accumulate:
        raise ConfigError(
            "train.in_chain_span=segment needs train.accumulate=true: the pooled positions "
            "hold the graph of every window, which an optimiser step inside the segment breaks"
        )
    if cfg.train.in_chain_chains > cfg.train.n_chains:
        raise ConfigError(
            f"train.in_chain_chains ({cfg.train.in_chain_chains}) must be <= train.n_chains "
            f"({cfg.train.n_chains})"
        )
    if cfg.train.cross_chain_every == 0 and cfg.train.in_chain_weight == 0:
        raise ConfigError(
            "both losses are disabled: set train.cross_chain_every or train.in_chain_weight"
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
    d_clamp = get("sampler.d_clamp")
    if d_clamp is not None and not (d_clamp > 0 and math.isfinite(d_clamp)):
        raise ConfigError(f"sampler.d_clamp must be a finite number > 0 or null, got {d_clamp!r}")
    if cfg.task.init_high <= cfg.task.init_low:
        raise ConfigError("task.init_high must be > task.init_low")
    for key in ("sampler.q_hidden", "sampler.d_hidden", "task.hidden"):
        widths = get(key)
        if not widths or any(w < 1 for w in widths):
            raise ConfigError(f"{key} must be a non-empty list of positive ints, got {widths!r}")
    for key in ("task.cov", "eval.task.cov"):
        if get(key) not in _COVARIANCES:
            raise ConfigError(f"{key} must be one of {', '.join(_COVARIANCES)}, got {get(key)!r}")
    if cfg.train.eval_every > 0:
        # Checked here, not at the first evaluation (which would stop a training run).
        outside = [t for t in cfg.eval.kl_at if not 1 <= t <= cfg.eval.n_steps]
        if outside:
            raise ConfigError(
                f"eval.kl_at entries must be steps in [1, eval.n_steps={cfg.eval.n_steps}], "
                f"got {list(cfg.eval.kl_at)} (outside: {outside})"
            )
    _check_run_placement(cfg)


def load_structured(
    schema: type,
    path: str | Path | None = None,
    overrides: Sequence[str] | None = None,
    validate: Callable[[DictConfig], None] | None = None,
) -> DictConfig:
    """Merge ``schema`` <- YAML file ``path`` <- ``key=value`` ``overrides``; read-only result.

    The one loader behind :func:`load_config`, :func:`load_benchmark_config` and the
    reproductions' ``load_experiment_config``.

    Args:
        schema: a structured-config dataclass (its defaults are the bottom layer).
        path: YAML file holding a mapping of keys to values, or ``None`` for none.
        overrides: ``key=value`` strings (OmegaConf dotlist syntax), applied last.
        validate: range checks the type system cannot express; called on the merged config
            before it is made read-only, and expected to raise :class:`ConfigError`.

    Raises:
        ConfigError: missing file, YAML that does not parse or is not a mapping, unknown
            keys, wrong types, bad override syntax, or a value ``validate`` rejects; the
            message names the key.
    """
    layers: list[Any] = [OmegaConf.structured(schema)]
    try:
        if path is not None:
            path = Path(path)
            if not path.is_file():
                raise ConfigError(f"config file not found: {path}")
            try:
                loaded = OmegaConf.load(path)
            except OmegaConfBaseException:
                raise
            except Exception as err:  # YAML syntax errors and the like
                problem = _yaml_problem(err)
                raise ConfigError(f"cannot parse config file {path}: {problem}") from None
            if not isinstance(loaded, DictConfig):
                raise ConfigError(f"config file {path} must hold a mapping of keys to values")
            if len(loaded) == 0:
                # An empty file would silently run every default (e.g. a 100-epoch training).
                raise ConfigError(
                    f"config file {path} is empty (or only comments); give at least one key"
                )
            layers.append(loaded)
        if overrides:
            bad = [o for o in overrides if "=" not in o]
            if bad:
                raise ConfigError(f"overrides must look like key=value, got {bad}")
            layers.append(OmegaConf.from_dotlist(list(overrides)))
        cfg = OmegaConf.merge(*layers)
    except OmegaConfBaseException as err:
        raise ConfigError(_describe(err)) from None
    if validate is not None:
        validate(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _yaml_problem(err: Exception) -> str:
    """A YAML parse error as ``line L, column C: problem`` (1-based, as editors count)."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or (str(err).splitlines() or [type(err).__name__])[0]
    if mark is None:
        return str(problem)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


def _check_name(name: str) -> None:
    """A run name is one plain path component, so ``out_dir / name`` stays inside ``out_dir``."""
    if (
        not name
        or name != name.strip()
        or name in (".", "..")
        or any(sep in name for sep in ("/", "\\", "\0"))
        or name.startswith(".")
    ):
        raise ConfigError(
            "name must be a non-empty file name without '/', '\\', surrounding spaces or a "
            f"leading '.', so that results stay inside out_dir; got {name!r}"
        )


def _check_out_dir(out_dir: str) -> None:
    """``out_dir`` and every existing ancestor must be directories (checked before any write)."""
    if not out_dir:
        raise ConfigError("out_dir must not be empty")
    path = Path(out_dir)
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                raise ConfigError(f"out_dir {out_dir!r}: {str(candidate)!r} is not a directory")
            return


def check_device(device: str) -> None:
    """Raise :class:`ConfigError` unless ``device`` names a torch device this build can use."""
    import torch  # local: the schema itself needs no torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as err:
        raise ConfigError(
            f"device {device!r} is not a torch device ('cpu', 'cuda', 'cuda:1', ...): {err}"
        ) from None
    if parsed.type == "cpu":
        return
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {device!r}: this torch build or machine has no CUDA device "
                f"(torch {torch.__version__}); use device=cpu"
            )
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) visible"
            )
        return
    if parsed.type == "mps" and torch.backends.mps.is_available():
        return
    raise ConfigError(f"device {device!r} is not available here; use device=cpu")


def _check_run_placement(cfg: DictConfig) -> None:
    """The checks both CLIs share: name, out_dir and device, before anything is written."""
    _check_name(cfg.name)
    _check_out_dir(cfg.out_dir)
    run_dir = Path(cfg.out_dir) / cfg.name
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"out_dir/name: {str(run_dir)!r} exists and is not a directory")
    check_device(cfg.device)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> DictConfig:
    """Schema <- YAML file <- ``key=value`` overrides, validated; raises :class:`ConfigError`."""
    return load_structured(RunConfig, path, overrides, _validate)


def _describe(err: OmegaConfBaseException) -> str:
    key = getattr(err, "full_key", None)
    message = str(err).splitlines()[0]
    return f"invalid config key {key!r}: {message}" if key else f"invalid config: {message}"


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


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
    _check_run_placement(cfg)
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


__all__ += [
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
