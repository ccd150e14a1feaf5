"""NNSGHMC's arguments, described once: name, type, default, meaning and valid values.

:class:`NNSGHMCArgs` lists the keyword arguments that describe an NNSGHMC sampler — its
architecture (the nets) and its constants. Everything else reads this one description:

* the :class:`~metasampler.learned.NNSGHMC` constructor takes them as keywords (validated
  and documented from here);
* the config schema ``SamplerConfig`` (:mod:`metasampler.config`) has one field per argument
  marked ``config`` (with the step and ``calibrate_steps`` added);
* ``metasampler.meta.build.build_sampler`` builds a sampler from that config;
* a sampler file's header (:mod:`metasampler.sampler_write` writes it, :mod:`metasampler.export`
  rebuilds the sampler from it) holds the ``architecture`` and ``constants`` sections, in
  this order, and :mod:`metasampler.sampler_file` checks them with the same valid values
  (``since``: the format version that added the argument; older files take the default).

This module imports nothing of the package, so each of those can import it.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from enum import Enum
from functools import partial
from typing import Any

__all__ = [
    "gamma_conflict",
    "is_step",
    "Activation",
    "ARCHITECTURE",
    "CONSTANTS",
    "DOutput",
    "QOutput",
    "FRICTION_UNITS",
    "FrictionUnits",
    "GAMMA_MODES",
    "GRAD_INPUTS",
    "GammaMode",
    "GradInput",
    "EnergyInput",
    "MomentumInit",
    "NNSGHMCArgs",
    "arg_fields",
    "config_fields",
    "describe_args",
]


def _choices(name: str, doc: str, *values: str) -> type[Enum]:
    """A ``str`` :class:`Enum` whose members are named by their values."""
    choices = Enum(name, [(v, v) for v in values], type=str, module=__name__)
    choices.__doc__ = doc
    return choices


GammaMode = _choices(
    "GammaMode",
    "How the Gamma correction's derivatives are obtained (``none``: a diagnostic only).",
    "exact",
    "finite_difference",
    "none",
)
GradInput = _choices(
    "GradInput",
    "Gradient input of ``f_phiD``: ``s_g * grad / sigma_g`` or the paper's ``s_g * grad / N``.",
    "standardised",
    "per_datum",
)
FrictionUnits = _choices(
    "FrictionUnits",
    "``D_f`` as written (absolute) or divided by the step in use (per-step friction).",
    "absolute",
    "per_step",
)
Activation = _choices(
    "Activation",
    "Hidden activation of the nets (``metasampler.learned.nets.ACTIVATIONS``).",
    "tanh",
    "relu",
    "sigmoid",
    "softplus",
    "softsign",
    "quadsat",
)
DOutput = _choices(
    "DOutput", "Output transform of ``f_phiD`` (both keep it >= 0).", "softplus", "abs"
)
QOutput = _choices(
    "QOutput",
    "Output transform of ``f_phiQ``: ``identity`` (either sign) or ``softplus`` (``Q_f >= 0``).",
    "identity",
    "softplus",
)
EnergyInput = _choices(
    "EnergyInput",
    "Energy input of the nets: per datum ``U / N`` or per datum and coordinate ``U / (N D)``.",
    "per_datum",
    "per_coordinate",
)
MomentumInit = _choices(
    "MomentumInit", "Initial momentum: ``N(0, T I)`` or zeros.", "normal", "zeros"
)

GAMMA_MODES = tuple(m.value for m in GammaMode)
GRAD_INPUTS = tuple(m.value for m in GradInput)
FRICTION_UNITS = tuple(m.value for m in FrictionUnits)

#: Header sections: ``architecture`` (the nets) and ``constants``.
ARCHITECTURE = "architecture"
CONSTANTS = "constants"


def _arg(
    default: Any,
    doc: str,
    *,
    check: str | type[Enum],
    section: str = CONSTANTS,
    since: int = 1,
    config: bool = True,
) -> Any:
    """One argument: ``check`` names its valid values (``"widths"``, ``"finite"``,
    ``"non_negative"``, ``"positive"``, ``"positive_or_none"``, ``"step_or_none"``: a whole
    number of steps, ``"bool"``, ``"fraction"``: ``[0, 1)``) or is the :class:`Enum` of its
    choices."""
    metadata = {"doc": doc, "check": check, "section": section, "since": since, "config": config}
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class NNSGHMCArgs:
    """The arguments that describe an NNSGHMC sampler (architecture and constants).

    Values are checked and normalised (choices to plain strings, numbers to ``float``, steps
    to ``int``) on construction; a bad value raises :class:`ValueError` naming the argument.
    """

    q_hidden: tuple[int, ...] = _arg(
        (40,), "hidden widths of ``f_phiQ`` (paper toy: 40; MNIST: 10).",
        check="widths", section=ARCHITECTURE,
    )  # fmt: skip
    d_hidden: tuple[int, ...] = _arg(
        (40,), "hidden widths of ``f_phiD``.", check="widths", section=ARCHITECTURE
    )
    activation: str = _arg(
        "softsign",
        "hidden activation of both nets; ``softsign`` ``a / (1 + |a|)`` costs about half "
        "tanh's arithmetic per unit (``BENCHMARKS.md``; the default was ``tanh`` until "
        "session 17, and every sampler file records its own).",
        check=Activation,
        section=ARCHITECTURE,
    )
    d_output: str = _arg("softplus", "keeps ``f_phiD >= 0``.", check=DOutput, section=ARCHITECTURE)
    q_output: str = _arg(
        "identity",
        "output transform of ``f_phiQ``. ``identity`` (004 eq. 9) lets ``Q_f`` take either "
        "sign, and a curl fed the momentum can change sign as ``|p|`` grows past what "
        "training saw; a step whose momentum kick and position move use curls of opposite "
        "signs climbs the energy, which feeds itself (a MNIST-trained sampler diverged so on "
        "the CNN at every step size, docs/RESULTS.md). ``softplus`` keeps ``Q_f >= 0``: every "
        "step moves downhill as SGHMC's does. Not in the SPEC.",
        check=QOutput, section=ARCHITECTURE, since=7,
    )  # fmt: skip
    q_momentum_input: bool = _arg(
        True,
        "feed ``f_phiQ`` the momentum ``p_i`` as well as the energy (004 eq. 9). ``False``: "
        "``Q_f = f_phiQ(U)`` is the same for every coordinate of a chain, so ``Gamma_theta = "
        "0`` and the curl is not re-evaluated at the half step; on the toy transfer it removes "
        "the stiff-direction bias a momentum-dependent ``Q_f`` learns (docs/RESULTS.md, #11).",
        check="bool", section=ARCHITECTURE, since=4,
    )  # fmt: skip
    beta_off: float = _arg(
        0.0, "offset added to ``f_phiQ`` (``Q_f = beta_off + clamp(f_phiQ)``). Paper toy: 0.",
        check="finite",
    )  # fmt: skip
    alpha: float = _arg(
        0.0,
        "weight of ``Q_f^2`` in ``D_f`` (paper MNIST: ``0.01 / eta``). It is a number, "
        "stored in the exported file: a sampler loaded with another step keeps the training "
        "``alpha``. The paper instead re-derives ``alpha = 0.01 / eta`` for each test step "
        "(004 F.2). To follow it, set ``sampler.alpha = 0.01 / eta`` after loading.",
        check="non_negative",
    )
    c: float = _arg(0.0, "constant added to ``D_f``.", check="non_negative")
    q_clamp: float = _arg(
        5.0, "``f_phiQ`` is clamped to ``[-q_clamp, q_clamp]`` (paper: 5).", check="positive"
    )
    d_output_scale: float = _arg(
        1.0, "``s_D`` multiplying ``f_phiD`` (paper MNIST: 50).", check="non_negative"
    )
    energy_input_scale: float = _arg(
        1.0, "``s_U`` on the per-datum energy input.", check="positive"
    )
    grad_input_scale: float = _arg(
        1.0, "``s_g`` on the gradient input (paper MNIST: 70, per datum).", check="positive"
    )
    gamma: str = _arg(
        "exact",
        "``exact`` (the nets' forward-mode chain rule), ``finite_difference`` (004 appendix B) "
        "or ``none`` (drops Gamma: a diagnostic only, the chain no longer targets the "
        "posterior).",
        check=GammaMode,
    )
    momentum_init: str = _arg(
        "normal", "``normal`` (``N(0, T I)``) or ``zeros``.", check=MomentumInit, config=False
    )
    detach_inputs: bool = _arg(
        True,
        "feed the nets stop-gradient inputs during meta-training; with ``False`` the "
        "meta-gradient also flows through ``U``, ``p`` and ``grad U`` (second order: the "
        "target is evaluated with ``create_graph=True``).",
        check="bool",
    )
    d_clamp: float | None = _arg(
        None,
        "upper clamp of ``D_f`` (paper toy: 5); ``None``: none. Gamma uses the clamped "
        "``D_f``'s derivative, so the sampler stays exact.",
        check="positive_or_none",
        since=2,
    )
    momentum_input_clamp: float | None = _arg(
        None,
        "the nets see the standardised momentum clamped to ``[-m, m]`` (``None``: unclamped, "
        "as 004). Beyond what meta-training saw (``|p_hat|`` up to ~4) the nets extrapolate: "
        "a curl trained on the MNIST MLP changes sign at ``p_hat`` 5-10, and on the CNN, "
        "whose stiff coordinates kick the momentum to 10-40 in a few steps, its chains "
        "diverged at every step size; clamped at 4 they ran (docs/RESULTS.md). Gamma "
        "differentiates the clamped input (0 beyond ``m``), so the sampler stays exact. A "
        "constant: settable on a loaded sampler (not in the SPEC; #11).",
        check="positive_or_none",
        since=7,
    )
    speed_limit: float | None = _arg(
        None,
        "``m``: the curl is multiplied by ``(1 + (p_hat / m)^2)^(-1/2)``, so a coordinate "
        "moves at most about ``eta Q_f m sigma_p`` per step however large its momentum "
        "(``None``: no limit, as 004). A stiff coordinate whose momentum is kicked far beyond "
        "training's range then cannot overshoot by more than that: on the CNN a MNIST "
        "sampler's stiff coordinates reached ``|p_hat| ~ 370`` at the step SGHMC runs at "
        "(docs/RESULTS.md). A function of ``z``: Gamma differentiates it (also without "
        "``q_momentum_input``). A constant: settable on a loaded sampler (not in the SPEC; #11).",
        check="positive_or_none",
        since=7,
    )
    grad_input: str = _arg(
        "standardised",
        "``standardised`` (``s_g * grad Ũ / sigma_g``) or ``per_datum`` (``s_g * grad Ũ / N``, "
        "the paper's, e.g. ``s_g = 70`` on MNIST).",
        check=GradInput,
        since=2,
    )
    friction_units: str = _arg(
        "absolute",
        "``absolute`` (``D_f`` as written) or ``per_step`` (``alpha``, ``s_D`` and ``c`` give "
        "the friction per step: ``D_f`` is divided by the step in use; the paper's MNIST "
        "``alpha = 0.01 / eta`` is ``alpha = 0.01`` here).",
        check=FrictionUnits,
        since=2,
    )
    energy_input: str = _arg(
        "per_datum",
        "``per_datum`` (``U / N``, 004 appendix E) or ``per_coordinate`` (``U / (N D)``: a "
        "Gaussian's energy at equilibrium is about ``D / 2``, so this input has the same scale "
        "on a 10-D training and a 20-D test target, and the nets behave at test as in "
        "training).",
        check=EnergyInput,
        since=3,
    )
    q_stiffness_input: bool = _arg(
        False,
        "also feed ``f_phiQ`` each coordinate's stiffness ``s_i = log(eta sqrt(V_i))``, ``V_i`` "
        "a running mean of ``(d_i Ũ)^2`` over the chain's past steps (at equilibrium "
        "``E[(d_i U)^2] = E[d_i^2 U]``, the curvature): ``s_i`` is the step over the "
        "coordinate's length scale, the same number whatever ``N`` and ``eta`` are, so the curl "
        "can be smaller where the target is stiff. ``V`` is frozen within a step (it holds "
        "earlier gradients only), so Gamma needs no derivative of it; it adapts as pSGLD's "
        "preconditioner does (``stiffness_decay``). Needs ``gamma='exact'`` (not in the SPEC; "
        "#11).",
        check="bool", section=ARCHITECTURE, since=5,
    )  # fmt: skip
    stiffness_decay: float = _arg(
        0.99,
        "``V_i`` is the mean of ``(d_i Ũ)^2`` over the first ``1 / (1 - decay)`` steps, then "
        "an exponential average with this decay (used with ``q_stiffness_input`` and "
        "``precondition_power``).",
        check="fraction", since=5,
    )  # fmt: skip
    stiffness_freeze_after: int | None = _arg(
        None,
        "after this many steps of a chain ``V`` stops adapting: the stiffness and the "
        "preconditioner keep their values from then on, as an adaptive MCMC's warm-up fixes "
        "its metric, so the chain is a time-homogeneous sampler that Gamma makes exact. While "
        "``V`` keeps adapting, the preconditioner follows where the chains have just been, a "
        "dependence Gamma has no term for; on the MNIST MLP the learned sampler's last layers "
        "then ran hot and fitted the data worse (docs/RESULTS.md, session 45). ``None``: "
        "``V`` adapts throughout, as pSGLD's does. Set it to the run's burn-in (not in the SPEC; "
        "#11).",
        check="step_or_none", since=8,
    )  # fmt: skip
    precondition_power: float = _arg(
        0.0,
        "``gamma_P``: multiply the curl by the per-coordinate preconditioner ``P_i = "
        "exp(clamp(-gamma_P (s_i - median_j s_j), -precondition_range, precondition_range))`` "
        "(``s_i = log(eta sqrt(V_i))`` as for ``q_stiffness_input``, ``V`` averaged over the "
        "chains, which share the target), so a coordinate whose "
        "RMS gradient is ``k`` times the median's moves ``k^-gamma_P`` as fast: ``0.5`` is "
        "pSGLD's rescaling in the high-friction limit, ``1`` gives every coordinate of a "
        "Gaussian the same frequency. ``0``: none. ``P`` is a constant of ``z`` (earlier "
        "gradients only), so Gamma has no term for it; the nets learn what is left. Needs "
        "``gamma='exact'`` (not in the SPEC; #11).",
        check="non_negative", since=6,
    )  # fmt: skip
    precondition_range: float = _arg(
        5.0,
        "``|log P_i|`` is at most this (``e^5 ~ 150`` either way), so a coordinate with no "
        "gradient (a dead unit) is not moved without limit.",
        check="positive", since=6,
    )  # fmt: skip
    thermostat: bool = _arg(
        False,
        "a Nosé–Hoover thermostat per coordinate around the step (``state.extras[\"xi\"]``, "
        "from 0): ``p *= exp(-eta xi / 2)``, the step, ``p *= exp(-eta xi / 2)``, ``xi += eta "
        "(p_bar^2 - T)`` on the step's mean momentum ``p_bar``. Its friction rises where the "
        "momentum runs hotter than ``T``, so it takes out gradient-noise heat without knowing "
        "the noise (the complete recipe admits it: the sampler stays exact in the limit). "
        "Frozen while ``T = 0``. Needs ``gamma='exact'`` (or ``'none'``): it moves ``p`` "
        "between steps, which the finite-difference secants assume fixed. On the toy transfer "
        "it lowers KL@12k by 20-40 % (docs/RESULTS.md, sessions 54-55); strong gradient noise "
        "still heats the positions a little (``scripts/thermostat_probe.py``, session 56). Not "
        "in the SPEC.",
        check="bool", since=9,
    )  # fmt: skip
    leapfrog: bool = _arg(
        False,
        "report the midpoints of the chain's gradient points, the leapfrog (ABA) splitting's "
        "positions (``state.extras[\"half_step\"]``; ``state.energy`` and ``state.grad`` are "
        "at the gradient point): exact for a Gaussian at any stiffness, where the modified "
        "Euler positions run hot in stiff directions. For sampling only: meta-training pairs "
        "each position with its gradient and refuses it. Not in the SPEC.",
        check="bool", since=9, config=False,
    )  # fmt: skip

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _checked(f, getattr(self, f.name)))
        conflict = gamma_conflict(
            self.precondition_power, self.thermostat, self.gamma, self.q_stiffness_input
        )
        if conflict:
            raise ValueError(conflict)

    def as_kwargs(self) -> dict[str, Any]:
        """The arguments as constructor keywords."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def header_section(self, section: str) -> dict[str, Any]:
        """The values of one header section (``ARCHITECTURE`` or ``CONSTANTS``), as JSON, in
        field order."""
        return {f.name: _json_value(getattr(self, f.name)) for f in arg_fields(section)}

    @classmethod
    def from_header(cls, architecture: Mapping[str, Any], constants: Mapping[str, Any]):
        """The arguments a file's header holds; arguments its format version lacks take
        their defaults."""
        given = {**architecture, **constants}
        return cls(**{f.name: given[f.name] for f in fields(cls) if f.name in given})

    @classmethod
    def from_config(cls, cfg: Any):
        """The arguments a ``SamplerConfig`` (or a mapping with its keys) holds."""
        return cls(**{f.name: cfg[f.name] for f in arg_fields() if f.metadata["config"]})


def arg_fields(section: str | None = None, version: int | None = None) -> tuple[Field, ...]:
    """The argument fields, in order: all, or those of one header ``section`` that files of
    format ``version`` hold."""
    return tuple(
        f
        for f in fields(NNSGHMCArgs)
        if (section is None or f.metadata["section"] == section)
        and (version is None or f.metadata["since"] <= version)
    )


def config_fields() -> list[tuple[str, Any, Any]]:
    """``(name, type, field)`` for each argument marked ``config``, as
    :func:`dataclasses.make_dataclass` takes them for an OmegaConf structured config: choices
    as their :class:`Enum`, widths as ``list[int]``."""
    result = []
    for f in arg_fields():
        if not f.metadata["config"]:
            continue
        check = f.metadata["check"]
        if isinstance(check, type):
            result.append((f.name, check, field(default=check(f.default))))
        elif check == "widths":
            result.append((f.name, list[int], field(default_factory=partial(list, f.default))))
        else:
            kinds = {"bool": bool, "positive_or_none": float | None, "step_or_none": int | None}
            kind = kinds.get(check, float)
            result.append((f.name, kind, field(default=f.default)))
    return result


def signature_with_args(init: Any) -> inspect.Signature:
    """The full keyword list of a constructor that takes ``**arguments`` as
    :class:`NNSGHMCArgs`: its own keywords, then every field, so that ``help`` and
    ``inspect.signature`` show each argument."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    own = [p for p in inspect.signature(init).parameters.values() if p.kind is keyword]
    described = [
        inspect.Parameter(f.name, keyword, default=f.default, annotation=f.type)
        for f in fields(NNSGHMCArgs)
    ]
    return inspect.Signature([*own, *described], return_annotation=None)


def describe_args() -> str:
    """An ``Args:`` docstring block describing every argument (for the constructor)."""
    lines = []
    for f in arg_fields():
        check = f.metadata["check"]
        choices = f" One of {[m.value for m in check]}." if isinstance(check, type) else ""
        default = f.default if f.default is not MISSING else None
        lines.append(f"    {f.name}: {f.metadata['doc']}{choices} Default: ``{default!r}``.")
    return "\n".join(lines)


def _json_value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def is_step(value: Any) -> bool:
    """Whether ``value`` counts steps: a whole number >= 1 (not a bool, NaN or a string)."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value == int(value)
        and value >= 1
    )


def _checked(f: Field, value: Any) -> Any:
    """``value`` checked against ``f``'s valid values and normalised."""
    name, check = f.name, f.metadata["check"]
    if isinstance(check, type):
        value = getattr(value, "value", value)
        choices = tuple(m.value for m in check)
        if value not in choices:
            raise ValueError(f"{name} must be one of {choices}, got {value!r}")
        return value
    if check == "widths":
        widths = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else []
        if not widths or any(int(h) != h or h < 1 for h in widths):
            raise ValueError(f"{name} must be a non-empty list of positive ints, got {value!r}")
        return tuple(int(h) for h in widths)
    if check == "bool":
        return bool(value)
    if check == "step_or_none":
        if value is not None and not is_step(value):
            raise ValueError(f"{name} must be a whole number of steps >= 1 or None, got {value!r}")
        return None if value is None else int(value)
    if check == "positive_or_none":
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number > 0 or None, got {value!r}")
        return None if value is None else float(value)
    ok = {
        "finite": lambda v: math.isfinite(v),
        "non_negative": lambda v: v >= 0 and math.isfinite(v),
        "positive": lambda v: v > 0 and math.isfinite(v),
        "fraction": lambda v: 0 <= v < 1,
    }[check]
    if not ok(value):
        what = {
            "finite": "finite",
            "non_negative": "a finite number >= 0",
            "fraction": "a number in [0, 1)",
        }.get(check, "a finite number > 0")
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return float(value)


def gamma_conflict(
    power: float, thermostat: bool, gamma: str | None, stiffness_input: bool = False
) -> str | None:
    """Why a curl preconditioner ``power``, a thermostat or the curl's stiffness input cannot
    run with Gamma mode ``gamma``, or ``None`` (the one rule behind :class:`NNSGHMCArgs`, the
    config check, the builder and ``evaluate.py``'s pre-flight)."""
    if gamma != "finite_difference":
        return None
    if stiffness_input:
        return (
            "q_stiffness_input needs exact Gamma, not finite_difference (the secant in U would "
            "also see the stiffness change between steps): set gamma=exact"
        )
    if power > 0:
        return (
            f"precondition_power {power} needs exact Gamma, not finite_difference (the secant "
            "in U would see the stiffness change between steps): set gamma=exact"
        )
    if thermostat:
        return (
            "thermostat needs exact Gamma, not finite_difference (the thermostat moves the "
            "momentum between steps, which the secants assume fixed): set gamma=exact"
        )
    return None
