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

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..config import ConfigError, GammaMode
from ..export import load_sampler
from ..learned import NNSGHMC
from ..nnsghmc_args import gamma_conflict, is_step
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
from ..schedules import CyclicalCosine
from ..stepsize import resolve_eta

__all__ = [
    "FREEZE",
    "FRICTION",
    "METHODS",
    "AdamMethod",
    "BuildContext",
    "CyclicalNNSGHMCMethod",
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
    "replace_file_constants",
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
    gamma: GammaMode | None = None  # override the file's Gamma mode (paper: finite differences)
    # How sampling steps run (NNSGHMC's `compile`): false = eager (bit-reproducible; the
    # default here so benchmark runs repeat exactly), true = compile first and wait (also
    # bit-reproducible), null = compile in the background while eager steps run (the library
    # default; results differ at float rounding from the switch on). Speeds: BENCHMARKS.md.
    compile: bool | None = False
    # The paper's alpha handling (Gong et al. 2019, appendix F.2): alpha = alpha_per_step /
    # eta_warmup, set from the step of the warm-up phase (the test step when there is none) and kept
    # for the whole run, for a sampler whose friction_units is "absolute". None (default): keep the
    # file's alpha, the value it was meta-trained with (a file does not say how it was derived, and
    # a "per_step" sampler's alpha already transfers across N and eta).
    alpha_per_step: float | None = None
    # The constant friction per step under the learned one (the sampler's `c`, as a per-step
    # friction a = eta c in absolute units): null keeps the file's value (what it was trained
    # with); a value replaces it, and a `momentum_decay_grid` tunes it with the step as the
    # momentum methods' friction is tuned, so that every momentum method has its friction
    # level chosen on the validation split.
    momentum_decay: float | None = None
    momentum_decay_grid: list[float] = field(default_factory=list)
    # The nets' momentum input clamped to [-m, m] and the curl's speed limit (the sampler's
    # `momentum_input_clamp` and `speed_limit`): null keeps the file's value; a value replaces
    # it (a file trained without them).
    momentum_input_clamp: float | None = None
    speed_limit: float | None = None
    # The curl's stiffness preconditioner (the sampler's `precondition_power` gamma_P; 0 turns a
    # file's off): null keeps the file's value. Needs gamma exact (research/NOTEBOOK.md).
    precondition_power: float | None = None
    # The step after which each chain's gradient statistic V (the preconditioner's and the
    # stiffness input's) stops adapting, so that the sampler is time-homogeneous from then on
    # (the sampler's `stiffness_freeze_after`): null keeps the file's value; e.g. the burn-in.
    # A `stiffness_freeze_after_grid` tunes it with the step instead (as the friction grid;
    # steps, extended geometrically to whole steps; a step past the run's end is no freeze).
    stiffness_freeze_after: int | None = None
    stiffness_freeze_after_grid: list[int] = field(default_factory=list)
    # With grids for both options above: the order in which they are tuned, each with the
    # step and after the ones before it are fixed at their chosen values (e.g.
    # [stiffness_freeze_after, momentum_decay]); each stage's step grid starts centred on the
    # previous stage's chosen step.
    tune_options_in_order: list[str] = field(default_factory=list)
    # Estimate each coordinate's minibatch gradient-noise variance from the minibatch's two
    # halves and leave its share out of the injected noise (the sampler's
    # `grad_noise_estimate`; the sampler is not told any variance by default).
    grad_noise_estimate: bool = False
    # A cooling stage: the estimate off before this step of every run (tuning runs too) and
    # on from it, so hot chains feed the posterior average and cooled ones the final
    # ensemble (research/NOTEBOOK.md); a run shorter than the step never estimates;
    # null: `grad_noise_estimate` for the whole run.
    grad_noise_estimate_from: int | None = None
    # While the estimate is on: its diffusion B = eta Q_f^2 V / 2 joins the friction, D_f + B / T,
    # instead of being left out of the injected noise, so coordinates whose gradient noise
    # exceeds the learned friction are cooled rather than left hot (the sampler's
    # `grad_noise_friction`; research/NOTEBOOK.md).
    grad_noise_friction: bool = False
    # A Nosé–Hoover thermostat per coordinate around the learned step (the sampler's
    # `thermostat`: mSGNHT's feedback on the momentum's temperature, which takes out the heat of
    # the gradient noise without an estimate of it; needs gamma exact;
    # research/NOTEBOOK.md); null keeps the file's (format version 9 stores it; older files: off).
    thermostat: bool | None = None
    # The positions of the leapfrog splitting: the gradient is taken half a position step
    # ahead of the reported position, which is the midpoint of two gradient points (the
    # sampler's `leapfrog`): exact positions for a Gaussian at any stiffness, where the
    # modified Euler step's positions run hot in stiff directions (research/NOTEBOOK.md);
    # null keeps the file's.
    leapfrog: bool | None = None


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
    # B estimated per coordinate from the minibatch's two halves (SGHMC's
    # `grad_noise_estimate`; the control for NNSGHMC's option of that name)
    grad_noise_estimate: bool = False
    # the cooling stage of NNSGHMC's option of that name
    grad_noise_estimate_from: int | None = None
    # the estimate joins the friction, C + B (SGHMC's `grad_noise_friction`)
    grad_noise_friction: bool = False


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
class CyclicalNNSGHMCMethod(NNSGHMCMethod, _Cycles):
    """cNNSGHMC (not in the paper): the loaded sampler driven by cSGLD's cyclical cosine
    schedule. The learned dynamics and the step schedule are separate choices, so NNSGHMC
    against SGHMC and cNNSGHMC against cSGHMC each compare like with like. Off unless a
    config enables it."""

    enabled: bool = False


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
FREEZE = "stiffness_freeze_after"  # NNSGHMC's other tunable option (a step)
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


# Constants of the sampler file an NNSGHMC section may replace (null keeps the file's), and
# their types.
_FILE_CONSTANTS = {
    "momentum_input_clamp": float,
    "speed_limit": float,
    "precondition_power": float,
    "stiffness_freeze_after": int,
    "thermostat": bool,
    "leapfrog": bool,
}


def _nnsghmc(options: Mapping[str, Any], lr: float | None, ctx: BuildContext) -> Sampler:
    if ctx.sampler_path is None:
        raise ValueError("nnsghmc needs a sampler file (sampler_path or --sampler)")
    sampler = load_sampler(ctx.sampler_path, lr=lr, device=ctx.device)
    try:
        replace_file_constants(sampler, options)
    except ValueError as err:
        raise ValueError(f"{ctx.sampler_path}: {err}") from None
    sampler.use_compile = options["compile"]
    decay = options.get(FRICTION)
    if decay is not None:  # the constant friction per step a, replacing the file's
        per_step = sampler.friction_units == "per_step"
        eta = resolve_eta(sampler.eta, sampler.lr, ctx.n_data, sampler.order)
        sampler.c = decay if per_step else decay / eta
    sampler.grad_noise_estimate = bool(options.get("grad_noise_estimate", False))
    sampler.grad_noise_friction = bool(options.get("grad_noise_friction", False))
    return sampler


def replace_file_constants(sampler: NNSGHMC, options: Mapping[str, Any]) -> None:
    """Set the file's constants that an NNSGHMC section sets (``gamma`` and the constants of
    :data:`_FILE_CONSTANTS`; null keeps the file's), checked together by the arguments' one
    rule, so that e.g. finite-difference Gamma can replace a file's thermostat.

    Raises:
        ValueError: the values, with the file's others, are not a valid sampler (the message
            names the argument); the sampler is then unchanged.
    """
    gamma = options.get("gamma")
    replaced = {"gamma": getattr(gamma, "value", gamma)} if gamma is not None else {}
    for name, kind in _FILE_CONSTANTS.items():
        if options.get(name) is not None:
            replaced[name] = kind(options[name])
    args = dataclasses.replace(sampler.arguments(), **replaced)
    for name in replaced:
        setattr(sampler, name, getattr(args, name))


def _cnnsghmc(options: Mapping[str, Any], lr: float | None, ctx: BuildContext) -> Sampler:
    sampler = _nnsghmc(options, lr, ctx)
    sampler.schedule = CyclicalCosine(**_cycles(options, ctx))
    return sampler


def _sghmc(options: Mapping[str, Any], lr: float, ctx: BuildContext) -> Sampler:
    friction = _friction(options, lr, ctx, SGHMC.order)
    estimate = bool(options.get("grad_noise_estimate", False))
    noise_friction = bool(options.get("grad_noise_friction", False))
    return SGHMC(
        lr=lr, friction=friction, grad_noise_estimate=estimate, grad_noise_friction=noise_friction
    )


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
        warmup_alpha: the paper's test-time ``alpha = alpha_per_step / eta_warmup`` applies
            (:func:`metasampler.benchmark.protocol.set_alpha_from_warmup`).
        tuned_options: the constants of the method that may be tuned with the step (the
            friction per step ``momentum_decay``; NNSGHMC's ``stiffness_freeze_after`` too);
            a config tunes those whose ``<option>_grid`` it sets (several one after the
            other, :meth:`tuning_stages`).
    """

    key: str
    label: str
    schema: type[MethodGrid]
    sampler_class: type[Sampler]
    build: Builder
    is_sampler: bool = True
    tuned: str = "lr"
    stored_step: bool = False
    warmup_alpha: bool = False
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
            warmup_alpha=True,
            tuned_options=(FRICTION, FREEZE),
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
            "cnnsghmc",
            "cNNSGHMC",
            CyclicalNNSGHMCMethod,
            NNSGHMC,
            _cnnsghmc,
            stored_step=True,
            warmup_alpha=True,
            tuned_options=(FRICTION, FREEZE),
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
    ``cnnsghmc``)."""
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
_POSITIVE_OPTIONS = ("momentum_decay", "lam", "momentum_input_clamp", "speed_limit")
_UNIT_INTERVAL_OPTIONS = ("momentum", "beta", "explore_fraction")
_NON_NEGATIVE_OPTIONS = ("precondition_power",)


def _finite_positive(value: Any) -> bool:
    return value > 0 and math.isfinite(value)


_STEP_OPTIONS = ("grad_noise_estimate_from", "stiffness_freeze_after")


def _check_steps(key: str, section: Mapping[str, Any]) -> None:
    for name in _STEP_OPTIONS:
        step = section.get(name)
        if step is not None and not is_step(step):
            raise ConfigError(f"methods.{key}.{name} must be a step >= 1 or null, got {step!r}")
    if section.get("grad_noise_estimate_from") is not None and section.get("grad_noise_estimate"):
        raise ConfigError(
            f"methods.{key}: grad_noise_estimate_from turns the estimate on from a step; "
            "set grad_noise_estimate to false with it (true estimates for the whole run)"
        )


def _check_noise_friction(key: str, section: Mapping[str, Any]) -> None:
    estimating = section.get("grad_noise_estimate") or section.get("grad_noise_estimate_from")
    if section.get("grad_noise_friction") and not estimating:
        raise ConfigError(
            f"methods.{key}.grad_noise_friction adds the gradient-noise estimate to the "
            "friction: set grad_noise_estimate (or grad_noise_estimate_from) with it"
        )


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


def is_step_option(name: str | None) -> bool:
    """Whether a method option counts steps (its values and grid are whole steps >= 1)."""
    return name in _STEP_OPTIONS


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
    if is_step_option(option):
        if not all(is_step(v) for v in grid):
            raise ConfigError(
                f"methods.{key}.{option}_grid values must be steps >= 1, got {list(grid)!r}"
            )
    elif not all(_finite_positive(value) for value in grid):
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
    for name in _NON_NEGATIVE_OPTIONS:
        value = section.get(name)
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise ConfigError(f"methods.{key}.{name} must be a finite number >= 0, got {value!r}")
    conflict = gamma_conflict(
        section.get("precondition_power") or 0,
        bool(section.get("thermostat")),
        section.get("gamma"),
    )
    if conflict:
        raise ConfigError(f"methods.{key}: {conflict}")
    for name in _UNIT_INTERVAL_OPTIONS:
        if name in section and not 0 <= section[name] < 1:
            raise ConfigError(f"methods.{key}.{name} must be in [0, 1), got {section[name]!r}")
    if "n_cycles" in section and not 1 <= section["n_cycles"] <= shortest_run:
        raise ConfigError(
            f"methods.{key}.n_cycles must be in [1, {shortest_run}] (the shortest run, "
            f"budget.n_steps or tune.n_steps), got {section['n_cycles']!r}"
        )
    _check_steps(key, section)
    _check_noise_friction(key, section)
    alpha = section.get("alpha_per_step")
    if alpha is not None and not (alpha >= 0 and math.isfinite(alpha)):
        raise ConfigError(
            f"methods.{key}.alpha_per_step must be a finite number >= 0 or null, got {alpha!r}"
        )
