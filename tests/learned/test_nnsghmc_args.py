"""NNSGHMC's arguments are described once (metasampler/nnsghmc_args.py): the constructor, the
config schema, the config builder and the sampler-file header all follow that description."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from experiments.run_config import load_config
from metasampler.config import SamplerConfig
from metasampler.learned import NNSGHMC, NNSGHMCArgs
from metasampler.learned.nets import ACTIVATIONS
from metasampler.meta.build import build_sampler
from metasampler.nnsghmc_args import ARCHITECTURE, CONSTANTS, Activation, arg_fields
from metasampler.sampler_format import FORMAT_VERSION, SCHEMAS
from metasampler.sampler_write import build_header

# gamma="none" (the stiffness input refuses finite differences) warns: expected here.
pytestmark = pytest.mark.filterwarnings("ignore:NNSGHMC\\(gamma='none'\\)")

NON_DEFAULT = dict(
    q_hidden=(4, 3), d_hidden=(5,), activation="relu", d_output="abs", q_output="softplus",
    beta_off=-0.5,
    alpha=0.1, c=0.2, q_clamp=3.0, d_output_scale=2.0, energy_input_scale=1.5,
    grad_input_scale=70.0, gamma="none", momentum_init="zeros",
    detach_inputs=False, d_clamp=5.0, grad_input="per_datum", friction_units="per_step",
    energy_input="per_coordinate", q_momentum_input=False, q_stiffness_input=True,
    stiffness_decay=0.9, stiffness_freeze_after=200, precondition_power=0.5,
    precondition_range=3.0, momentum_input_clamp=4.0, speed_limit=3.0, thermostat=True,
    leapfrog=True,
)  # fmt: skip


def test_non_default_values_cover_every_argument():
    assert set(NON_DEFAULT) == {f.name for f in arg_fields()}
    defaults = NNSGHMCArgs()
    assert all(getattr(defaults, name) != value for name, value in NON_DEFAULT.items())


def test_the_constructor_takes_every_argument_and_reports_it_back():
    sampler = NNSGHMC(eta=0.01, seed=0, **NON_DEFAULT)
    assert sampler.arguments() == NNSGHMCArgs(**NON_DEFAULT)
    for f in arg_fields(CONSTANTS):
        assert getattr(sampler, f.name) == NON_DEFAULT[f.name]
    assert NNSGHMC(eta=0.01).arguments() == NNSGHMCArgs()


def test_the_signature_lists_every_argument():
    # help(NNSGHMC) and IDEs read the signature: the described arguments, not **arguments.
    parameters = inspect.signature(NNSGHMC).parameters
    for f in arg_fields():
        assert parameters[f.name].default == f.default
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in parameters.values())


@pytest.mark.parametrize(
    "name, bad",
    [("alpha", -1.0), ("q_clamp", 0.0), ("beta_off", float("inf")), ("d_clamp", -2.0),
     ("gamma", "exactly"), ("d_output", "identity"), ("momentum_init", "ones"),
     ("q_hidden", ()), ("activation", "gelu"), ("energy_input", "per_dimension"),
     ("stiffness_freeze_after", 0), ("stiffness_freeze_after", 2.5),
     ("stiffness_freeze_after", True), ("stiffness_freeze_after", "x"),
     ("stiffness_freeze_after", float("nan"))],
)  # fmt: skip
def test_invalid_values_are_refused_naming_the_argument(name, bad):
    with pytest.raises(ValueError, match=name):
        NNSGHMC(eta=0.01, **{name: bad})
    with pytest.raises(ValueError, match=name):
        NNSGHMCArgs(**{name: bad})


def test_the_config_schema_has_the_config_arguments_with_their_defaults():
    names = [f.name for f in dataclasses.fields(SamplerConfig)]
    config_args = [f.name for f in arg_fields() if f.metadata["config"]]
    extras = ["calibrate_steps", "grad_noise_var", "grad_noise_estimate", "grad_noise_friction"]
    assert names == ["eta", "lr", *config_args, *extras]
    assert "momentum_init" not in names  # (not a config key)
    assert NNSGHMCArgs.from_config(load_config(None, []).sampler) == NNSGHMCArgs()


def test_build_sampler_passes_every_config_argument():
    overrides = [
        f"sampler.{k}={list(v) if isinstance(v, tuple) else v}"
        for k, v in NON_DEFAULT.items()
        if k not in ("momentum_init", "leapfrog")  # (not config keys)
    ]
    sampler = build_sampler(load_config(None, overrides).sampler)
    expected = {**NON_DEFAULT, "momentum_init": "normal", "leapfrog": False}
    assert sampler.arguments() == NNSGHMCArgs(**expected)


def test_the_header_sections_and_the_file_schema_follow_the_description():
    sampler = NNSGHMC(eta=0.01, seed=0, **NON_DEFAULT)
    training = {"eta": 0.01, "lr": None, "temperature": 1.0}
    header = build_header(sampler.arguments(), training, sampler.state_dict(), {})
    for section in (ARCHITECTURE, CONSTANTS):
        names = [f.name for f in arg_fields(section)]
        assert [k for k in header[section] if k != "dtype"] == names
        assert [k for k in SCHEMAS[FORMAT_VERSION][section] if k != "dtype"] == names
        assert NNSGHMCArgs.from_header(header[ARCHITECTURE], header[CONSTANTS]) == (
            sampler.arguments()
        )
    # Version 1 files lack the arguments added by version 2; those take their defaults.
    v1 = [f.name for f in arg_fields(CONSTANTS, 1)]
    assert list(SCHEMAS[1][CONSTANTS]) == v1
    old = {k: v for k, v in header[CONSTANTS].items() if k in v1}
    rebuilt = NNSGHMCArgs.from_header(header[ARCHITECTURE], old)
    assert (rebuilt.d_clamp, rebuilt.grad_input, rebuilt.friction_units) == (
        None, "standardised", "absolute",
    )  # fmt: skip
    # Version 2 files lack energy_input (version 3): per datum, as they were trained.
    v2 = [f.name for f in arg_fields(CONSTANTS, 2)]
    assert list(SCHEMAS[2][CONSTANTS]) == v2 and "energy_input" not in v2
    old = {k: v for k, v in header[CONSTANTS].items() if k in v2}
    assert NNSGHMCArgs.from_header(header[ARCHITECTURE], old).energy_input == "per_datum"


def test_the_activation_choices_are_those_the_nets_implement():
    assert tuple(m.value for m in Activation) == ACTIVATIONS
