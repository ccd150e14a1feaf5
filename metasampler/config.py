"""Library config schemas (OmegaConf structured configs) and the loading helpers behind them.

The sampler and meta-training schemas (:class:`SamplerConfig`, :class:`TrainConfig`) and their
enums live here; the application's experiment configs (``experiments.run_config``, the
benchmark config) build on them. :func:`load_structured` merges a schema, a YAML file and
``key=value`` overrides; unknown keys and values of the wrong type fail *before any work
starts*, with a :class:`ConfigError` naming the key.
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

from .nnsghmc_args import Activation, CurlInput, GammaMode, config_fields

__all__ = [
    "ConfigError",
    "Activation",
    "CurlInput",
    "GammaMode",
    "PoolSpan",
    "SamplerConfig",
    "TrainConfig",
    "check_device",
    "check_run_placement",
    "check_step_scale_range",
    "load_structured",
]


class ConfigError(ValueError):
    """A config key or value is not valid; the message names the key."""


class PoolSpan(str, Enum):
    """What the in-chain pool of positions spans (see ``metasampler.meta.schedule``)."""

    window = "window"  # cleared after every BPTT window
    segment = "segment"  # the whole segment: one Stein estimate over all its pooled samples
    # the segment, plus the (detached) pooled samples of the epoch's earlier segments in the
    # Stein estimate: with continue_chains the pool spans the chains' whole run
    epoch = "epoch"


#: NNSGHMC architecture and constants (:class:`metasampler.nnsghmc_args.NNSGHMCArgs`, one
#: field per argument), with the step and ``calibrate_steps``.
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
    """Meta-training loop (Gong et al. 2019, §3.3 and appendix F)."""

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
    # The defaults cut each window on its own; the paper's toy schedule is
    # accumulate=true, step_per_loss=true, continue_chains=true, in_chain_span=segment.
    accumulate: bool = False  # true: sum the windows' gradients, step once per segment
    step_per_loss: bool = False  # true: one optimiser step per loss (cross, then in-chain)
    continue_chains: bool = False  # true: chains run on across an epoch's sub-epochs
    in_chain_span: PoolSpan = PoolSpan.window
    cross_chain_every: int = 2  # 0 disables the cross-chain loss
    cross_chain_weight: float = 1.0
    in_chain_weight: float = 1.0  # 0 disables the in-chain loss
    # > 0: also the held-out predictive loss (metasampler/meta/heldout.py) on the cross-chain
    # slices, with this weight: the NLL of the samples' pooled predictive on a minibatch of
    # `heldout_batch` examples of the training problem's validation split (Bayesian tasks)
    heldout_weight: float = 0.0
    heldout_batch: int = 500
    # > 0: also the temperature loss (metasampler/meta/virial.py) on the cross-chain slices,
    # with this weight: each layer's configurational temperature asked to be 1 (on the slices
    # `temperature_burn_in` steps or more after the chains' start)
    temperature_weight: float = 0.0
    temperature_burn_in: int = 0  # steps after the chains' start before a slice counts
    in_chain_burn_in: int = 50
    in_chain_thinning: int = 3
    in_chain_chains: int = 5
    replay_prob: float = 0.15
    replay_capacity: int = 1000
    stein_bandwidth_factor: float = 0.5
    stein_ridge: float = 0.04
    # > 0: export the mean of the nets at the ends of the last n epochs (stochastic weight
    # averaging, metasampler/meta/averaging.py); 0: the nets of the last epoch
    average_last: int = 0
    # [lo, hi]: each epoch's chains run at the step eta times a factor drawn log-uniformly
    # from [lo, hi] (lr times its square), so the nets see the range of steps a user tunes
    # over (metasampler/meta/trainer.py); null: always the sampler's step
    step_scale_range: list[float] | None = None
    checkpoint_every: int = 5  # epochs
    eval_every: int = 10  # epochs; 0 disables evaluation during training
    # true: meta-training steps through torch.compile with autograd (fused forward and
    # backward; the first window waits about a minute for the compile; BENCHMARKS.md);
    # false: eager steps; null (default): compiled where that pays, on a CPU with a C++
    # compiler for n_chains x dim >= 100,000 (metasampler.learned.fast.training_compile_pays)
    compile_steps: bool | None = None


def check_step_scale_range(value: Sequence[float] | None) -> None:
    """Raise :class:`ConfigError` unless ``train.step_scale_range`` is ``None`` or two finite
    numbers ``0 < lo <= hi``."""
    if value is None:
        return
    bounds = list(value)
    if not (
        len(bounds) == 2
        and all(b > 0 and math.isfinite(b) for b in bounds)
        and bounds[0] <= bounds[1]
    ):
        raise ConfigError(
            "train.step_scale_range must be null or two finite numbers 0 < lo <= hi, got "
            f"{bounds!r}"
        )


def load_structured(
    schema: type,
    path: str | Path | None = None,
    overrides: Sequence[str] | None = None,
    validate: Callable[[DictConfig], None] | None = None,
) -> DictConfig:
    """Merge ``schema`` <- YAML file ``path`` <- ``key=value`` ``overrides``; read-only result.

    The one loader behind ``experiments.run_config.load_config``, the benchmark config and
    the reproductions' ``load_experiment_config``.

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
            document = _document_kind(path)
            if document is not None:
                raise ConfigError(
                    f"config file {path} must hold a mapping of keys to values (key: value "
                    f"lines), not {document}"
                )
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


def _document_kind(path: Path) -> str | None:
    """What the YAML file holds when that is not a mapping (e.g. ``"a str"``), else ``None``.

    ``OmegaConf.load`` reads a file holding only a scalar, such as ``hello``, as the mapping
    ``{hello: null}``, so the document itself is looked at."""
    import yaml  # (OmegaConf's own dependency)

    try:
        document = yaml.safe_load(path.read_text())
    except Exception:  # (OmegaConf's loader has parsed it: its reading stands)
        return None
    if document is None or isinstance(document, dict):
        return None
    kinds = {str: "a string", list: "a list", bool: "a boolean", int: "a number", float: "a number"}
    return f"{kinds.get(type(document), 'a ' + type(document).__name__)} ({str(document)[:40]!r})"


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


def check_run_placement(cfg: DictConfig) -> None:
    """The checks every CLI config shares: ``name``, ``out_dir`` and ``device`` keys, checked
    before anything is written; raises :class:`ConfigError`."""
    _check_name(cfg.name)
    _check_out_dir(cfg.out_dir)
    run_dir = Path(cfg.out_dir) / cfg.name
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"out_dir/name: {str(run_dir)!r} exists and is not a directory")
    check_device(cfg.device)


def _describe(err: OmegaConfBaseException) -> str:
    key = getattr(err, "full_key", None)
    message = str(err).splitlines()[0]
    return f"invalid config key {key!r}: {message}" if key else f"invalid config: {message}"
