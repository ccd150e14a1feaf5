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
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

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


class GammaMode(str, Enum):
    exact = "exact"
    finite_difference = "finite_difference"
    none = "none"


class GradInput(str, Enum):
    """Gradient input of ``f_phiD``: ``s_g * grad / sigma_g`` or the paper's ``s_g * grad / N``."""

    standardised = "standardised"
    per_datum = "per_datum"


class FrictionUnits(str, Enum):
    """``D_f`` as written (absolute) or divided by the step in use (per-step friction)."""

    absolute = "absolute"
    per_step = "per_step"


class Activation(str, Enum):
    tanh = "tanh"
    relu = "relu"
    sigmoid = "sigmoid"
    softplus = "softplus"


class MusicDataset(str, Enum):
    bach = "bach"  # four-part chorales (music21 corpus), the JSB set's source
    palestrina = "palestrina"  # a 200-piece subset of the music21 Palestrina corpus


class DOutput(str, Enum):
    softplus = "softplus"
    abs = "abs"


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


@dataclass
class SamplerConfig:
    """NNSGHMC architecture and constants (see :class:`metasampler.learned.NNSGHMC`)."""

    eta: float | None = 0.01
    lr: float | None = None  # per-batch learning rate; eta = sqrt(lr / N)
    q_hidden: list[int] = field(default_factory=lambda: [40])
    d_hidden: list[int] = field(default_factory=lambda: [40])
    activation: Activation = Activation.tanh
    d_output: DOutput = DOutput.softplus
    beta_off: float = 0.0
    alpha: float = 0.0
    c: float = 0.0
    q_clamp: float = 5.0
    d_output_scale: float = 1.0
    energy_input_scale: float = 1.0
    grad_input_scale: float = 1.0
    gamma: GammaMode = GammaMode.exact
    detach_inputs: bool = True
    d_clamp: float | None = None  # D_f clamped to [0, d_clamp] (paper toy: 5); null: none
    grad_input: GradInput = GradInput.standardised
    friction_units: FrictionUnits = FrictionUnits.absolute
    calibrate_steps: int = 0  # >0: measure input statistics with the untrained sampler


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


__all__ += ["Backend", "DistributedConfig"]
