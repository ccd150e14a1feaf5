"""NNSGHMC's arguments are described once (metasampler/nnsghmc_args.py): the constructor, the
config schema, the config builder and the sampler-file header all follow that description."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

import metasampler as ms
from experiments.run_config import load_config
from metasampler.config import ConfigError, SamplerConfig
from metasampler.learned import NNSGHMC, NNSGHMCArgs
from metasampler.learned.nets import ACTIVATIONS
from metasampler.meta.build import build_sampler
from metasampler.nnsghmc_args import (
    ARCHITECTURE,
    CONSTANTS,
    Activation,
    arg_fields,
    gamma_conflict,
)
from metasampler.sampler_format import FORMAT_VERSION, SCHEMAS
from metasampler.sampler_write import build_header

# gamma="none" warns: expected here.
pytestmark = pytest.mark.filterwarnings("ignore:NNSGHMC\\(gamma='none'\\)")

NON_DEFAULT = dict(
    q_hidden=(4, 3), d_hidden=(5,), activation="relu", curl_input="momentum", gamma="none",
    alpha=0.1, friction_scale=2.0, grad_input_scale=70.0, thermostat=False,
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
    assert sampler.curl_input == "momentum"
    assert NNSGHMC(eta=0.01).arguments() == NNSGHMCArgs()


def test_the_constructor_takes_few_arguments():
    # seed, compile, eta, lr, temperature, schedule and the described arguments.
    parameters = inspect.signature(NNSGHMC).parameters
    assert len(parameters) <= 16, list(parameters)
    assert len(inspect.signature(ms.NNSGHMC).parameters) == len(parameters)


def test_the_signature_lists_every_argument():
    # help(NNSGHMC) and IDEs read the signature: the described arguments, not **arguments.
    parameters = inspect.signature(NNSGHMC).parameters
    for f in arg_fields():
        assert parameters[f.name].default == f.default
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in parameters.values())


@pytest.mark.parametrize(
    "name, bad",
    [("alpha", -1.0), ("friction_scale", float("inf")), ("friction_scale", -0.1),
     ("grad_input_scale", 0.0), ("gamma", "exactly"), ("curl_input", "energy"),
     ("thermostat", "yes"), ("thermostat", 1), ("q_hidden", ()), ("d_hidden", (0,)),
     ("activation", "gelu")],
)  # fmt: skip
def test_invalid_values_are_refused_naming_the_argument(name, bad):
    with pytest.raises(ValueError, match=name):
        NNSGHMC(eta=0.01, **{name: bad})
    with pytest.raises(ValueError, match=name):
        NNSGHMCArgs(**{name: bad})


@pytest.mark.parametrize(
    ("curl_input", "thermostat", "refused"),
    [("stiffness", True, "curl_input='stiffness' needs exact Gamma"),
     ("stiffness", False, "curl_input='stiffness' needs exact Gamma"),
     ("momentum", True, "thermostat needs exact Gamma"), ("momentum", False, None)],
)  # fmt: skip
def test_finite_differences_serve_the_paper_sampler_only(curl_input, thermostat, refused):
    # One rule (gamma_conflict) for the constructor, the arguments and the config check.
    args = dict(gamma="finite_difference", curl_input=curl_input, thermostat=thermostat)
    assert (gamma_conflict(**args) is None) == (refused is None)
    if refused is None:
        assert NNSGHMC(eta=0.01, **args).gamma == "finite_difference"
        return
    assert refused in gamma_conflict(**args)
    for build in (NNSGHMCArgs, lambda **a: NNSGHMC(eta=0.01, **a)):
        with pytest.raises(ValueError, match=re.escape(refused)):
            build(**args)
    with pytest.raises(ConfigError, match=re.escape(refused)):
        load_config(None, [f"sampler.{k}={v}" for k, v in args.items()])
    for gamma in ("exact", "none"):
        assert gamma_conflict(gamma, curl_input, thermostat) is None


def test_the_config_schema_has_the_arguments_with_their_defaults():
    names = [f.name for f in dataclasses.fields(SamplerConfig)]
    assert names == ["eta", "lr", *(f.name for f in arg_fields()), "calibrate_steps"]
    assert NNSGHMCArgs.from_config(load_config(None, []).sampler) == NNSGHMCArgs()


def test_build_sampler_passes_every_config_argument():
    overrides = [
        f"sampler.{k}={list(v) if isinstance(v, tuple) else v}" for k, v in NON_DEFAULT.items()
    ]
    sampler = build_sampler(load_config(None, overrides).sampler)
    assert sampler.arguments() == NNSGHMCArgs(**NON_DEFAULT)


def test_the_header_sections_and_the_file_schema_follow_the_description():
    sampler = NNSGHMC(eta=0.01, seed=0, **NON_DEFAULT)
    training = {"eta": 0.01, "lr": None, "temperature": 1.0}
    header = build_header(sampler.arguments(), training, sampler.state_dict(), {})
    assert header["format_version"] == FORMAT_VERSION == 10
    assert tuple(SCHEMAS) == (FORMAT_VERSION,)  # one readable version
    for section in (ARCHITECTURE, CONSTANTS):
        names = [f.name for f in arg_fields(section)]
        assert [k for k in header[section] if k != "dtype"] == names
        assert [k for k in SCHEMAS[FORMAT_VERSION][section] if k != "dtype"] == names
    assert NNSGHMCArgs.from_header(header[ARCHITECTURE], header[CONSTANTS]) == (sampler.arguments())


def test_the_activation_choices_are_those_the_nets_implement():
    assert tuple(m.value for m in Activation) == ACTIVATIONS
