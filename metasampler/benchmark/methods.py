"""The method registry: every method of the transfer benchmark, described once.

One :class:`MethodSpec` per method holds its config key, display label, config section schema
(the per-method grid dataclass, also the defaults of :func:`build_method`), the sampler class
(whose ``order`` is the lr -> eta conversion: ``eta = lr / N`` for first-order,
``sqrt(lr / N)`` for second-order samplers, :mod:`metasampler.stepsize`), the builder and the
parameter the tuner chooses (``lr``, from the section's ``lr_grid``). The benchmark config
(``experiments.benchmark_config``: the ``methods`` section and its validation), the benchmark
run and the plots all read :data:`METHODS`.

Friction-type constants are given per step (``momentum_decay = eta * C``), so they follow the
tuned step.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..config import ConfigError, GammaMode
from ..export import load_sampler
from ..learned import NNSGHMC
from ..learned.ablation import stored_net_means, with_constant_nets
from ..samplers import (
    PSGLD,
    SGHMC,
    SGLD,
    SGNHT,
    Adam,
    Sampler,
    SGDMomentum,
    cyclical_sghmc,
    cyclical_sgld,
)
from ..stepsize import resolve_eta

__all__ = [
    "FRICTION",
    "METHODS",
    "AdamMethod",
    "BuildContext",
    "ConstantNetsMethod",
    "CyclicalSGHMCMethod",
    "CyclicalSGLDMethod",
    "MethodGrid",
    "MethodSpec",
    "NNSGHMCMethod",
    "PSGLDMethod",
    "SGDMMethod",
    "SGHMCMethod",
    "SGLDMethod",
    "SGNHTEulerMethod",
    "SGNHTMethod",
    "build_method",
    "check_method_section",
    "method_label",
    "uses_sampler_file",
]


# --------------------------------------------------------------------------------------------
# Config sections (structured-config schemas; their defaults are the builders' defaults)
# --------------------------------------------------------------------------------------------
@dataclass
class MethodGrid:
    """One method: whether to run it and its per-batch learning-rate grid (docs/METHOD.md §1)."""

    enabled: bool = True
    lr_grid: list[float] = field(default_factory=lambda: [0.01])
    # The posterior's temperature T the method samples, pi ∝ exp(-U / T) (samplers only; the
    # optimiser references run at T = 0): 1 is the posterior; another value samples a tempered
    # posterior, a control for how a test score moves with the temperature of the chains
    # (research/NOTEBOOK.md).
    temperature: float = 1.0


@dataclass
class NNSGHMCMethod(MethodGrid):
    """The loaded sampler. An empty ``lr_grid`` uses the step stored in the sampler file."""

    lr_grid: list[float] = field(default_factory=lambda: [0.005, 0.01, 0.018])
    gamma: GammaMode | None = None  # override the file's Gamma mode
    # How sampling steps run (NNSGHMC's `compile`): true (default here) = the compiled step
    # from the first step, waiting for its build if it is not cached yet (bit-reproducible, and
    # the speed the tables' ms/step should show), false = eager (also bit-reproducible), null
    # = compile in the background while eager steps run (the library default; results differ
    # at float rounding from the switch on). Speeds: BENCHMARKS.md.
    compile: bool | None = True


@dataclass
class ConstantNetsMethod(NNSGHMCMethod):
    """The ablation of meta-learning: the loaded sampler with each net replaced by its mean
    output on the training run (stored in the file; :mod:`metasampler.learned.ablation`), so
    the same design, frame and step tuning with constant ``Q_f`` and ``D_f``."""


@dataclass
class SGLDMethod(MethodGrid):
    """SGLD."""

    lr_grid: list[float] = field(default_factory=lambda: [0.1, 0.2, 0.4])


@dataclass
class PSGLDMethod(MethodGrid):
    """pSGLD (RMSprop preconditioner: decay ``beta``, damping ``lam``)."""

    lr_grid: list[float] = field(default_factory=lambda: [7e-4, 1.4e-3, 2.8e-3])
    beta: float = 0.99
    lam: float = 1e-5


@dataclass
class _Friction(MethodGrid):
    """``momentum_decay`` is the per-step friction ``a = eta * C`` (paper: 0.01), so the
    friction ``C = a / eta`` follows the tuned step. A non-empty ``momentum_decay_grid`` tunes
    the friction too (replacing ``momentum_decay``): the step is tuned at every friction and
    the pair with the lowest validation NLL is chosen, both grids extended until interior."""

    momentum_decay: float = 0.01
    momentum_decay_grid: list[float] = field(default_factory=list)


@dataclass
class _Cycles(MethodGrid):
    """``n_cycles`` cosine cycles over the run, the first ``explore_fraction`` of each
    exploring (temperature 0)."""

    n_cycles: int = 4
    explore_fraction: float = 0.25


@dataclass
class SGHMCMethod(_Friction):
    """SGHMC with friction ``C = momentum_decay / eta``."""

    lr_grid: list[float] = field(default_factory=lambda: [0.005, 0.01, 0.02])


@dataclass
class SGNHTMethod(_Friction):
    """mSGNHT with the symmetric-splitting integrator; diffusion ``A = momentum_decay / eta``."""

    lr_grid: list[float] = field(default_factory=lambda: [0.005, 0.01, 0.02])


@dataclass
class SGNHTEulerMethod(SGNHTMethod):
    """mSGNHT with the first-order Euler integrator (mSGNHT-E, Li et al. 2016's baseline). Off
    unless a config enables it: beside mSGNHT-S it separates what the thermostat gives from
    what the splitting integrator gives (research/NOTEBOOK.md)."""

    enabled: bool = False


@dataclass
class CyclicalSGLDMethod(_Cycles):
    """cSGLD."""

    lr_grid: list[float] = field(default_factory=lambda: [0.2, 0.4, 0.8])


@dataclass
class CyclicalSGHMCMethod(_Friction, _Cycles):
    """cSGHMC: cSGLD's cycles with SGHMC's per-step friction."""

    lr_grid: list[float] = field(default_factory=lambda: [0.01, 0.02, 0.04])


@dataclass
class SGDMMethod(MethodGrid):
    """SGD with momentum (an optimiser reference, not a sampler)."""

    lr_grid: list[float] = field(default_factory=lambda: [0.001, 0.003, 0.01])
    momentum: float = 0.9


@dataclass
class AdamMethod(MethodGrid):
    """Adam (an optimiser reference, not a sampler)."""

    lr_grid: list[float] = field(default_factory=lambda: [5e-4, 1e-3, 2e-3])


# --------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BuildContext:
    """What a builder needs besides the options and the learning rate.

    Attributes:
        n_data: ``N`` of the training set (converts ``momentum_decay`` into a friction).
        n_steps: planned run length (cyclical schedules).
        sampler_path: the NNSGHMC file.
        device: where the chains run (a loaded NNSGHMC's nets are moved there).
    """

    n_data: int
    n_steps: int
    sampler_path: str | os.PathLike | None = None
    device: str = "cpu"


FRICTION = "momentum_decay"  # the friction methods' tuned option
Builder = Callable[[Mapping[str, Any], Any, BuildContext], Sampler]


def _friction(options: Mapping[str, Any], lr: float, ctx: BuildContext, order: str) -> float:
    """``C = momentum_decay / eta`` at the step ``eta`` of ``lr``."""
    return options["momentum_decay"] / resolve_eta(None, lr, ctx.n_data, order)


def _cycles(options: Mapping[str, Any], ctx: BuildContext) -> dict[str, Any]:
    return {
        "total_steps": ctx.n_steps,
        "n_cycles": options["n_cycles"],
        "explore_fraction": options["explore_fraction"],
    }


def _nnsghmc(options: Mapping[str, Any], lr: float | None, ctx: BuildContext) -> Sampler:
    if ctx.sampler_path is None:
        raise ValueError("nnsghmc needs a sampler file (sampler_path or --sampler)")
    gamma = options.get("gamma")
    sampler = load_sampler(
        ctx.sampler_path, lr=lr, device=ctx.device, gamma=getattr(gamma, "value", gamma)
    )
    sampler.use_compile = options["compile"]
    return sampler


def _constant_nets(options: Mapping[str, Any], lr: float | None, ctx: BuildContext) -> Sampler:
    sampler = _nnsghmc(options, lr, ctx)
    try:
        return with_constant_nets(sampler, stored_net_means(ctx.sampler_path))
    except ValueError as err:
        raise ValueError(f"methods.nnsghmc_constant: {err}") from None


def _sghmc(options: Mapping[str, Any], lr: float, ctx: BuildContext) -> Sampler:
    return SGHMC(lr=lr, friction=_friction(options, lr, ctx, SGHMC.order))


def _msgnht(integrator: str) -> Builder:
    def build(options: Mapping[str, Any], lr: float, ctx: BuildContext) -> Sampler:
        diffusion = _friction(options, lr, ctx, SGNHT.order)
        return SGNHT(lr=lr, diffusion=diffusion, multivariate=True, integrator=integrator)

    return build


def _csghmc(options: Mapping[str, Any], lr: float, ctx: BuildContext) -> Sampler:
    friction = _friction(options, lr, ctx, SGHMC.order)
    return cyclical_sghmc(lr=lr, friction=friction, **_cycles(options, ctx))


# --------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MethodSpec:
    """A method of the benchmark.

    Attributes:
        key: config key (``methods.<key>``) and result key.
        label: display label.
        schema: the config section's dataclass; its defaults are the builder's defaults.
        sampler_class: the class :attr:`build` returns; its ``order`` converts ``lr``.
        build: ``(options, lr, context) -> Sampler``; options complete (schema defaults
            filled in).
        is_sampler: ``False`` for the optimiser references (temperature 0).
        tuned: the parameter the tuner chooses; its grid is the section's ``<tuned>_grid``.
        stored_step: an empty grid means the step stored in the sampler file.
        tuned_options: the constants of the method that may be tuned with the step (the
            friction per step ``momentum_decay`` of the momentum methods); a config tunes
            those whose ``<option>_grid`` it sets (several one after the other,
            :meth:`tuning_stages`).
    """

    key: str
    label: str
    schema: type[MethodGrid]
    sampler_class: type[Sampler]
    build: Builder
    is_sampler: bool = True
    tuned: str = "lr"
    stored_step: bool = False
    tuned_options: tuple[str, ...] = ()

    @property
    def order(self) -> str:
        """``"first"`` (``eta = lr / N``) or ``"second"`` (``eta = sqrt(lr / N)``)."""
        return self.sampler_class.order

    @property
    def display(self) -> str:
        """The label, marked ``(optimiser)`` for a method that is not a sampler."""
        return self.label if self.is_sampler else f"{self.label} (optimiser)"

    def grid(self, section: Mapping[str, Any]) -> list[float]:
        """The grid of the tuned parameter in a config section."""
        return [float(v) for v in section[f"{self.tuned}_grid"]]

    def tuned_option(self, section: Mapping[str, Any]) -> str | None:
        """The first option a config section tunes with the step (see :meth:`tuning_stages`),
        else the first of :attr:`tuned_options` (its fixed value is reported); ``None`` for a
        method without any."""
        return (self.tuning_stages(section) or list(self.tuned_options) or [None])[0]

    def options_with_grid(self, section: Mapping[str, Any]) -> list[str]:
        """The :attr:`tuned_options` whose ``<option>_grid`` a config section sets."""
        return [name for name in self.tuned_options if section.get(f"{name}_grid")]

    def tuning_stages(self, section: Mapping[str, Any]) -> list[str]:
        """The options a config section tunes with the step, in the order they are tuned:
        the one with a grid, or with grids for several, the order of the section's
        ``tune_options_in_order`` (:func:`check_method_section` requires it to name them
        all)."""
        with_grid = self.options_with_grid(section)
        if len(with_grid) < 2:
            return with_grid
        return [name for name in section.get("tune_options_in_order") or [] if name in with_grid]

    def stage_grid_sizes(self, section: Mapping[str, Any]) -> list[int]:
        """The size of each :meth:`tuning_stages` option's grid, in order."""
        return [len(self.option_grid(section, option)) for option in self.tuning_stages(section)]

    def adapt_start(self, section: Mapping[str, Any]) -> tuple[float | None, dict[str, float]]:
        """Where an adapted run (``tune.mode: adapt``) starts: the step grid's middle value
        (``None``, the stored step, without one) and each tuned option at its grid's first
        value."""
        grid = sorted(self.grid(section)) or [None]
        options = {o: self.option_grid(section, o)[0] for o in self.tuning_stages(section)}
        return grid[len(grid) // 2], options

    def option_grid(self, section: Mapping[str, Any], option: str | None = None) -> list[float]:
        """The grid of ``option`` (default: :meth:`tuned_option`) in a config section (empty:
        the section's fixed value, or a method without one)."""
        option = option or self.tuned_option(section)
        if option is None:
            return []
        return [float(v) for v in section.get(f"{option}_grid") or []]


METHODS: dict[str, MethodSpec] = {
    spec.key: spec
    for spec in (
        MethodSpec(
            "nnsghmc",
            "NNSGHMC",
            NNSGHMCMethod,
            NNSGHMC,
            _nnsghmc,
            stored_step=True,
        ),
        MethodSpec(
            "nnsghmc_constant",
            "NNSGHMC, constant nets",
            ConstantNetsMethod,
            NNSGHMC,
            _constant_nets,
            stored_step=True,
        ),
        MethodSpec("sgld", "SGLD", SGLDMethod, SGLD, lambda o, lr, c: SGLD(lr=lr)),
        MethodSpec(
            "psgld",
            "pSGLD",
            PSGLDMethod,
            PSGLD,
            lambda o, lr, c: PSGLD(lr=lr, beta=o["beta"], lam=o["lam"]),
        ),
        MethodSpec("sghmc", "SGHMC", SGHMCMethod, SGHMC, _sghmc, tuned_options=(FRICTION,)),
        MethodSpec(
            "msgnht",
            "mSGNHT-S",
            SGNHTMethod,
            SGNHT,
            _msgnht("splitting"),
            tuned_options=(FRICTION,),
        ),
        MethodSpec(
            "msgnht_euler",
            "mSGNHT-E",
            SGNHTEulerMethod,
            SGNHT,
            _msgnht("euler"),
            tuned_options=(FRICTION,),
        ),
        MethodSpec(
            "csgld",
            "cSGLD",
            CyclicalSGLDMethod,
            SGLD,
            lambda o, lr, c: cyclical_sgld(lr=lr, **_cycles(o, c)),
        ),
        MethodSpec(
            "csghmc", "cSGHMC", CyclicalSGHMCMethod, SGHMC, _csghmc, tuned_options=(FRICTION,)
        ),
        MethodSpec(
            "sgdm",
            "SGD-M",
            SGDMMethod,
            SGDMomentum,
            lambda o, lr, c: SGDMomentum(lr=lr, momentum=o["momentum"]),
            is_sampler=False,
        ),
        MethodSpec(
            "adam", "Adam", AdamMethod, Adam, lambda o, lr, c: Adam(lr=lr), is_sampler=False
        ),
    )
}


def uses_sampler_file(key: str) -> bool:
    """Whether method ``key`` samples with the loaded NNSGHMC file (``nnsghmc``,
    ``nnsghmc_constant``)."""
    return METHODS[key].sampler_class is NNSGHMC


def build_method(
    key: str,
    options: Mapping[str, Any],
    lr: float | None,
    *,
    n_data: int,
    n_steps: int,
    sampler_path: str | os.PathLike | None = None,
    device: str = "cpu",
) -> Sampler:
    """The sampler of method ``key`` at per-batch learning rate ``lr``.

    Args:
        key: a key of :data:`METHODS`.
        options: the method's config section (``momentum_decay``, ``n_cycles``, ...); missing
            keys take the section schema's defaults.
        lr: per-batch learning rate; ``None`` only for a method with a stored step (the
            NNSGHMC file's).
        n_data: ``N`` of the training set (converts ``momentum_decay`` into a friction).
        n_steps: planned run length (cyclical schedules).
        sampler_path: the NNSGHMC file.
        device: where the chains will run (a loaded NNSGHMC's nets are moved there).
    """
    if key not in METHODS:
        raise ValueError(f"unknown method {key!r}; known: {sorted(METHODS)}")
    spec = METHODS[key]
    if lr is None and not spec.stored_step:
        raise ValueError(f"method {key!r} needs a learning rate")
    options = {**asdict(spec.schema()), **options}
    sampler = spec.build(options, lr, BuildContext(n_data, n_steps, sampler_path, str(device)))
    if spec.is_sampler:
        sampler.temperature = float(options["temperature"])
    return sampler


def method_label(key: str, section: Mapping[str, Any]) -> str:
    """Method ``key``'s display label, with its temperature when that is not 1."""
    temperature = float(section.get("temperature", 1.0))
    label = METHODS[key].label
    return label if temperature == 1.0 else f"{label} (T = {temperature:g})"


# --------------------------------------------------------------------------------------------
# Validation of a config section (experiments.benchmark_config)
# --------------------------------------------------------------------------------------------
_POSITIVE_OPTIONS = ("momentum_decay", "lam")
_UNIT_INTERVAL_OPTIONS = ("momentum", "beta", "explore_fraction")


def _finite_positive(value: Any) -> bool:
    return value > 0 and math.isfinite(value)


def _check_temperature(key: str, section: Mapping[str, Any]) -> None:
    temperature = section.get("temperature", 1.0)
    if not METHODS[key].is_sampler and temperature != 1.0:
        raise ConfigError(
            f"methods.{key}.temperature: {METHODS[key].label} is an optimiser reference (it runs "
            f"at temperature 0); leave temperature at 1, got {temperature!r}"
        )
    if not _finite_positive(temperature):
        raise ConfigError(
            f"methods.{key}.temperature must be a finite number > 0, got {temperature!r}"
        )


def _check_option_grids(key: str, section: Mapping[str, Any]) -> None:
    spec = METHODS[key]
    with_grid = spec.options_with_grid(section)
    order = list(section.get("tune_options_in_order") or [])
    unknown = [name for name in order if name not in spec.tuned_options]
    if unknown or len(set(order)) < len(order):
        raise ConfigError(
            f"methods.{key}.tune_options_in_order must list distinct options of "
            f"{list(spec.tuned_options)}, got {order!r}"
        )
    if len(with_grid) > 1 and not set(with_grid) <= set(order):
        raise ConfigError(
            f"methods.{key}: grids for {' and '.join(with_grid)}; set "
            f"methods.{key}.tune_options_in_order to the order in which to tune them (each "
            "with the step, after the ones before it are fixed)"
        )
    for option in with_grid:
        _check_option_grid(key, option, section[f"{option}_grid"])


def _check_option_grid(key: str, option: str, grid: Any) -> None:
    if not all(_finite_positive(value) for value in grid):
        raise ConfigError(
            f"methods.{key}.{option}_grid values must be finite numbers > 0, got {list(grid)!r}"
        )


def check_method_section(key: str, section: Mapping[str, Any], shortest_run: int) -> None:
    """Range checks of the config section ``methods.<key>``.

    Args:
        key: a key of :data:`METHODS`.
        section: the section (a mapping with the schema's keys).
        shortest_run: the shortest run length (``n_cycles`` must fit into it).

    Raises:
        ConfigError: naming the key.
    """
    spec = METHODS[key]
    grid = list(section[f"{spec.tuned}_grid"])
    if not grid and not spec.stored_step:
        raise ConfigError(f"methods.{key}.{spec.tuned}_grid must list at least one learning rate")
    if not all(_finite_positive(value) for value in grid):
        raise ConfigError(
            f"methods.{key}.{spec.tuned}_grid values must be finite numbers > 0, got {grid!r}"
        )
    _check_option_grids(key, section)
    _check_temperature(key, section)
    for name in _POSITIVE_OPTIONS:
        if section.get(name) is not None and not _finite_positive(section[name]):
            raise ConfigError(
                f"methods.{key}.{name} must be a finite number > 0, got {section[name]!r}"
            )
    for name in _UNIT_INTERVAL_OPTIONS:
        if name in section and not 0 <= section[name] < 1:
            raise ConfigError(f"methods.{key}.{name} must be in [0, 1), got {section[name]!r}")
    if "n_cycles" in section and not 1 <= section["n_cycles"] <= shortest_run:
        raise ConfigError(
            f"methods.{key}.n_cycles must be in [1, {shortest_run}] (the shortest run, "
            f"budget.n_steps or tune.n_steps), got {section['n_cycles']!r}"
        )
