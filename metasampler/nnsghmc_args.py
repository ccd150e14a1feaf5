"""NNSGHMC's arguments, described once: name, type, default, meaning and valid values.

:class:`NNSGHMCArgs` lists the keyword arguments that describe an NNSGHMC sampler: its
architecture (the nets and what the curl sees) and its constants. Everything else reads this
one description:

* the :class:`~metasampler.learned.NNSGHMC` constructor takes them as keywords (validated
  and documented from here);
* the config schema ``SamplerConfig`` (:mod:`metasampler.config`) has one field per argument
  (with the step and ``calibrate_steps`` added);
* ``metasampler.meta.build.build_sampler`` builds a sampler from that config;
* a sampler file's header (:mod:`metasampler.sampler_write` writes it, :mod:`metasampler.export`
  rebuilds the sampler from it) holds the ``architecture`` and ``constants`` sections, in
  this order, and :mod:`metasampler.sampler_file` checks them with the same valid values.

The equations these arguments enter are in ``docs/METHOD.md`` §3 and
:mod:`metasampler.learned.equations`. This module imports nothing of the package, so each of
those can import it.
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
    "ARCHITECTURE",
    "CONSTANTS",
    "GAMMA_MODES",
    "CURL_INPUTS",
    "Activation",
    "CurlInput",
    "GammaMode",
    "NNSGHMCArgs",
    "arg_fields",
    "config_fields",
    "describe_args",
    "gamma_conflict",
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
CurlInput = _choices(
    "CurlInput",
    "What ``f_phiQ`` sees besides the energy: each coordinate's ``stiffness`` or its "
    "``momentum`` (Gong et al. 2019).",
    "stiffness",
    "momentum",
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

GAMMA_MODES = tuple(m.value for m in GammaMode)
CURL_INPUTS = tuple(m.value for m in CurlInput)

#: Header sections: ``architecture`` (the nets) and ``constants``.
ARCHITECTURE = "architecture"
CONSTANTS = "constants"


def _arg(default: Any, doc: str, *, check: str | type[Enum], section: str = CONSTANTS) -> Any:
    """One argument: ``check`` names its valid values (``"widths"``, ``"non_negative"``,
    ``"positive"``, ``"bool"``) or is the :class:`Enum` of its choices."""
    return field(default=default, metadata={"doc": doc, "check": check, "section": section})


@dataclass(frozen=True)
class NNSGHMCArgs:
    """The arguments that describe an NNSGHMC sampler (architecture and constants).

    Values are checked and normalised (choices to plain strings, numbers to ``float``) on
    construction; a bad value raises :class:`ValueError` naming the argument.
    """

    q_hidden: tuple[int, ...] = _arg(
        (10,), "hidden widths of the curl net ``f_phiQ``.", check="widths", section=ARCHITECTURE
    )
    d_hidden: tuple[int, ...] = _arg(
        (10,),
        "hidden widths of the diffusion net ``f_phiD``.",
        check="widths",
        section=ARCHITECTURE,
    )
    activation: str = _arg(
        "softsign",
        "hidden activation of both nets (``softsign``: ``a / (1 + |a|)``, about half tanh's "
        "arithmetic per unit).",
        check=Activation,
        section=ARCHITECTURE,
    )
    curl_input: str = _arg(
        "stiffness",
        "what the curl net sees besides the energy. ``stiffness``: ``Q_f(u, s_i)`` with "
        "``s_i = log(eta sqrt(V_i))``, ``V_i`` the chain's running mean of ``(d_i U)^2`` "
        "(the step over the coordinate's length scale; fixed after the warm-up), so the curl "
        "can move stiff and broad coordinates at different speeds; needs exact Gamma. "
        "``momentum``: ``Q_f(u, p_i)``, the curl of Gong et al. (2019).",
        check=CurlInput,
        section=ARCHITECTURE,
    )
    gamma: str = _arg(
        "exact",
        "``exact`` (the nets' forward-mode chain rule), ``finite_difference`` (secants of "
        "cached net outputs, Gong et al. 2019 appendix B) or ``none`` (drops Gamma: a "
        "diagnostic only, the chain no longer targets the posterior).",
        check=GammaMode,
    )
    alpha: float = _arg(
        0.0,
        "weight of ``Q_f^2`` in the friction per step ``eta D_f``.",
        check="non_negative",
    )
    friction_scale: float = _arg(
        0.017,
        "``s_D``, the scale of the learned friction per step: ``eta D_f = alpha Q_f^2 + s_D "
        "f_phiD``.",
        check="non_negative",
    )
    grad_input_scale: float = _arg(
        1.0,
        "``s_g``: the diffusion net sees the per-datum gradient ``s_g d_i U / N``.",
        check="positive",
    )
    thermostat: bool = _arg(
        True,
        "run the step inside a Nosé-Hoover thermostat per coordinate (Ding et al. 2014): an "
        "extra friction ``xi_i`` that rises while coordinate ``i``'s momentum runs hotter than "
        "``T`` and falls while it runs colder, so the heat of the gradient noise is taken out "
        "without knowing the noise. Needs exact Gamma (or none).",
        check="bool",
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _checked(f, getattr(self, f.name)))
        conflict = gamma_conflict(self.gamma, self.curl_input, self.thermostat)
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
        """The arguments a file's header holds."""
        given = {**architecture, **constants}
        return cls(**{f.name: given[f.name] for f in fields(cls) if f.name in given})

    @classmethod
    def from_config(cls, cfg: Any):
        """The arguments a ``SamplerConfig`` (or a mapping with its keys) holds."""
        return cls(**{f.name: cfg[f.name] for f in arg_fields()})


def arg_fields(section: str | None = None) -> tuple[Field, ...]:
    """The argument fields, in order: all, or those of one header ``section``."""
    return tuple(
        f for f in fields(NNSGHMCArgs) if section is None or f.metadata["section"] == section
    )


def config_fields() -> list[tuple[str, Any, Any]]:
    """``(name, type, field)`` for each argument, as :func:`dataclasses.make_dataclass` takes
    them for an OmegaConf structured config: choices as their :class:`Enum`, widths as
    ``list[int]``."""
    result = []
    for f in arg_fields():
        check = f.metadata["check"]
        if isinstance(check, type):
            result.append((f.name, check, field(default=check(f.default))))
        elif check == "widths":
            result.append((f.name, list[int], field(default_factory=partial(list, f.default))))
        else:
            result.append((f.name, bool if check == "bool" else float, field(default=f.default)))
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
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
        return value
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    ok = number and math.isfinite(value) and (value > 0 if check == "positive" else value >= 0)
    if not ok:
        what = "a finite number > 0" if check == "positive" else "a finite number >= 0"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return float(value)


def gamma_conflict(gamma: str | None, curl_input: str, thermostat: bool) -> str | None:
    """Why a curl fed the stiffness, or a thermostat, cannot run with Gamma mode ``gamma``, or
    ``None`` (the one rule behind :class:`NNSGHMCArgs`, the config check and the builder)."""
    if gamma != "finite_difference":
        return None
    if curl_input == "stiffness":
        return (
            "curl_input='stiffness' needs exact Gamma, not finite_difference (the secant in U "
            "would also see the stiffness change between steps): set gamma='exact' or "
            "curl_input='momentum'"
        )
    if thermostat:
        return (
            "thermostat needs exact Gamma, not finite_difference (the thermostat moves the "
            "momentum between steps, which the secants assume fixed): set gamma='exact' or "
            "thermostat=False"
        )
    return None
