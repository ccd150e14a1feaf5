"""The method registry is the one description of the benchmark's methods (config sections,
builders, lr -> eta order), and a divergence's step comes from ``NonFiniteError.step``."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_evaluation import _tiny_problem

from experiments.benchmark_config import MethodsConfig, load_benchmark_config
from metasampler.benchmark import METHODS, EvalSet, build_method, run_method
from metasampler.benchmark.methods import check_method_section, method_label
from metasampler.benchmark.prior_check import prior_only_variances, sampled_variance
from metasampler.config import ConfigError
from metasampler.samplers import SGLD
from metasampler.stepsize import resolve_eta
from metasampler.targets import NonFiniteError


def test_the_methods_section_is_the_registry():
    sections = {f.name: f.type for f in dataclasses.fields(MethodsConfig)}
    assert list(sections) == list(METHODS)
    cfg = load_benchmark_config(None)
    for key, spec in METHODS.items():
        assert set(cfg.methods[key]) == {f.name for f in dataclasses.fields(spec.schema)}
        assert spec.grid(cfg.methods[key]) == list(spec.schema().lr_grid)


@pytest.mark.parametrize("key", [k for k in METHODS if not METHODS[k].stored_step])
def test_builders_return_the_registered_class_and_order(key):
    sampler = build_method(key, {}, 0.01, n_data=100, n_steps=20)
    spec = METHODS[key]
    assert isinstance(sampler, spec.sampler_class)
    assert sampler.order == spec.order
    expected = 0.01 / 100 if spec.order == "first" else (0.01 / 100) ** 0.5
    assert resolve_eta(sampler.eta, sampler.lr, 100, sampler.order) == pytest.approx(expected)


def test_friction_follows_the_step_of_the_registered_order():
    sghmc = build_method("sghmc", {"momentum_decay": 0.02}, 0.04, n_data=100, n_steps=10)
    assert sghmc.friction == pytest.approx(0.02 / (0.04 / 100) ** 0.5)


def test_msgnht_comes_with_both_integrators_and_the_euler_one_is_off_by_default():
    built = {
        key: build_method(key, {"momentum_decay": 0.02}, 0.04, n_data=100, n_steps=10)
        for key in ("msgnht", "msgnht_euler")
    }
    assert {key: s.integrator for key, s in built.items()} == {
        "msgnht": "splitting",
        "msgnht_euler": "euler",
    }
    assert all(s.multivariate and s.diffusion == pytest.approx(1.0) for s in built.values())
    cfg = load_benchmark_config(None)
    assert cfg.methods.msgnht.enabled and not cfg.methods.msgnht_euler.enabled


def test_section_checks_name_the_key():
    cfg = load_benchmark_config(None)
    with pytest.raises(ConfigError, match="methods.csgld.n_cycles"):
        check_method_section("csgld", {**cfg.methods.csgld, "n_cycles": 50}, shortest_run=20)
    with pytest.raises(ConfigError, match="methods.sgld.lr_grid must list"):
        check_method_section("sgld", {**cfg.methods.sgld, "lr_grid": []}, shortest_run=20)
    check_method_section("nnsghmc", {**cfg.methods.nnsghmc, "lr_grid": []}, shortest_run=20)


class _FailsAt(SGLD):
    """SGLD that reports a non-finite chain at step ``at`` with a message naming no step."""

    def __init__(self, at: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.at = at

    def _step(self, state, target, eta, temperature, generator):
        if state.step + 1 == self.at:
            raise NonFiniteError("chain 1 blew up", step=self.at, chain=1, quantity="position")
        return super()._step(state, target, eta, temperature, generator)


def test_divergence_step_comes_from_the_error_field_not_its_message():
    problem = _tiny_problem()
    run = run_method(
        _FailsAt(13, lr=0.01),
        problem.target,
        problem.init,
        main=EvalSet(problem.data.x_test, problem.data.y_test),
        n_chains=2,
        n_steps=20,
        burn_in=5,
        thin=1,
        eval_every=5,
        seed=0,
    )
    assert run.diverged_at == 13
    assert run.message == "chain 1 blew up"
    assert [row["step"] for row in run.curves] == [5, 10]
    assert torch.isnan(torch.tensor(run.final["average_nll"]))


def test_the_constant_nets_method_is_the_loaded_sampler_with_the_files_net_means(tmp_path):
    """``nnsghmc_constant`` loads the file and replaces each net by the mean the file's
    provenance stores (``net_means``): ``Q_f`` and ``f_phiD`` constant, the rest the file's."""
    from metasampler.learned import NNSGHMC

    path = tmp_path / "s.safetensors"
    NNSGHMC(lr=0.01, q_hidden=(3,), d_hidden=(3,)).save(
        str(path), provenance={"net_means": {"q": 0.8, "f_d": 0.3}}
    )
    plain = build_method("nnsghmc", {}, 0.02, n_data=100, n_steps=40, sampler_path=path)
    constant = build_method("nnsghmc_constant", {}, 0.02, n_data=100, n_steps=40, sampler_path=path)
    assert isinstance(constant, NNSGHMC) and constant.lr == plain.lr == 0.02
    assert constant.arguments() == plain.arguments()
    u, p_hat = torch.randn(5, 1), torch.randn(5, 4)
    q, d = constant.coefficients(u, p_hat, torch.randn(5, 4), eta=0.1, stiffness=p_hat)
    torch.testing.assert_close(q, torch.full_like(q, 0.8))
    torch.testing.assert_close(d, torch.full_like(d, constant.friction_scale * 0.3 / 0.1))
    assert not torch.equal(plain.coefficients(u, p_hat, p_hat, 0.1, p_hat)[0], q)
    bare = tmp_path / "bare.safetensors"
    NNSGHMC(lr=0.01, q_hidden=(3,), d_hidden=(3,)).save(str(bare))
    with pytest.raises(ValueError, match="methods.nnsghmc_constant: .*stores no net means"):
        build_method("nnsghmc_constant", {}, 0.02, n_data=100, n_steps=40, sampler_path=bare)


def test_a_learned_method_alone_still_needs_the_sampler_file():
    import evaluate

    overrides = [f"methods.{k}.enabled=false" for k in METHODS]
    cfg = load_benchmark_config(None, [*overrides, "methods.nnsghmc_constant.enabled=true"])
    with pytest.raises(evaluate._Stop, match="methods.nnsghmc_constant is enabled but no sampler"):
        evaluate._sampler_path(cfg, None)


def test_the_loaded_sampler_goes_to_the_chains_device(monkeypatch):
    # evaluate.py with device=cuda loaded the NNSGHMC file onto the CPU, and its first step
    # refused chains on the GPU (found on a GPU machine): the factory of a
    # benchmark run passes the config's device on to load_sampler.
    from metasampler.benchmark import methods
    from metasampler.benchmark.protocol import MethodFactory

    asked = []
    real_load = methods.load_sampler

    def load_on_cpu(path, **kwargs):
        asked.append(kwargs["device"])
        return real_load(path, **{**kwargs, "device": "cpu"})  # (no GPU here)

    monkeypatch.setattr(methods, "load_sampler", load_on_cpu)
    make = MethodFactory("nnsghmc", {}, 100, sampler_path="pretrained/toy_gaussian.safetensors",
                         device="cuda:1")  # fmt: skip
    assert make(0.01, 10).lr == 0.01
    assert asked == ["cuda:1"]


@pytest.mark.parametrize(("key", "lr"), [("sghmc", 0.15), ("sgld", 35.0)])
def test_a_method_at_temperature_two_samples_twice_the_prior_variance(key, lr):
    # a prior-only N(0, 1) coordinate: pi ∝ exp(-theta^2 / (2 T)) has variance T (SGLD at
    # eta = 0.01, so that 2,000 steps relax it)
    def variance(temperature: float) -> float:
        section = {"temperature": temperature, "momentum_decay": 0.01}
        make = lambda: build_method(key, section, lr, n_data=3500, n_steps=2000)  # noqa: E731
        rows = prior_only_variances(make, 3500, 20, 2000, dim=500)
        return sampled_variance(rows, 500, 2000)

    assert build_method(key, {"temperature": 2.0}, lr, n_data=3500, n_steps=10).temperature == 2.0
    assert variance(1.0) == pytest.approx(1.0, rel=0.1)
    assert variance(2.0) == pytest.approx(2.0, rel=0.1)


def test_temperature_is_checked_and_named_in_the_label():
    cfg = load_benchmark_config(None)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="methods.sghmc.temperature must be a finite"):
            check_method_section("sghmc", {**cfg.methods.sghmc, "temperature": bad}, 20)
    with pytest.raises(ConfigError, match="methods.adam.temperature: Adam is an optimiser"):
        check_method_section("adam", {**cfg.methods.adam, "temperature": 0.5}, 20)
    check_method_section("csghmc", {**cfg.methods.csghmc, "temperature": 0.5}, 20)
    assert method_label("sghmc", {"temperature": 1.5}) == "SGHMC (T = 1.5)"
    assert method_label("sghmc", cfg.methods.sghmc) == "SGHMC"
    assert build_method("adam", {}, 0.01, n_data=10, n_steps=10).temperature == 0.0
