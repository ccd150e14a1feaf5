"""The temperature loss of meta-training (issue #11): it reads each group's temperature off
exact samples, its gradient carries the virial's Hessian term, its meta-gradient moves the
nets downhill, and runs with it resume bit-exactly; bad settings are refused before any work."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_heldout import (
    assert_slice_loss_descends,
    assert_term_trains_and_resumes,
    heldout_settings,
    tiny_problem,
)

from experiments.run_config import load_config
from metasampler.bayesian import BayesianModel
from metasampler.config import ConfigError
from metasampler.learned import NNSGHMC
from metasampler.meta.unroll import WindowSamples, unroll_window
from metasampler.meta.update import MetaUpdate
from metasampler.meta.virial import TemperatureLoss, group_temperatures
from metasampler.targets import EnergyTarget


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_exact_samples_of_exp_minus_u_over_t_read_t_in_every_group(temperature: float) -> None:
    gen = torch.Generator().manual_seed(0)
    dim = 12
    scales = torch.linspace(0.5, 3.0, dim, dtype=torch.float64)  # stiff and soft coordinates
    mean = torch.linspace(-1.0, 1.0, dim, dtype=torch.float64)  # (the virial holds off 0 too)
    target = EnergyTarget(lambda th: (((th - mean) / scales) ** 2).sum(-1) / 2, dim)
    draws = mean + scales * temperature**0.5 * torch.randn(16000, dim, generator=gen).double()
    groups = [slice(0, 3), slice(3, 8), slice(8, 12)]
    slices = [draws[:8000].requires_grad_(True), draws[8000:].requires_grad_(True)]
    read = group_temperatures(slices, target, groups, gen)
    assert read.shape == (3,)
    assert torch.allclose(read, torch.full((3,), temperature, dtype=read.dtype), rtol=0.08)
    cold = group_temperatures([(0.5 * (draws - mean) + mean).requires_grad_(True)], target, groups)
    assert (cold < 0.3 * temperature).all()  # a narrower law reads colder


def test_the_gradient_carries_the_hessian_term_of_the_virial() -> None:
    problem = tiny_problem()
    full = problem.target  # float64 and full batch: a deterministic loss
    target = BayesianModel(full.module, (full.x, full.y), dtype=torch.float64)
    loss_fn = TemperatureLoss(target, torch.Generator().manual_seed(0))
    theta = problem.init(3, torch.Generator().manual_seed(1)).double().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss_fn.loss([theta]), theta)
    direction = torch.randn(theta.shape, generator=torch.Generator().manual_seed(2)).double()
    h = 1e-5
    with torch.no_grad():
        up = loss_fn.loss([(theta + h * direction).requires_grad_(True)])
        down = loss_fn.loss([(theta - h * direction).requires_grad_(True)])
    numeric = float((up - down) / (2 * h))
    assert float((grad * direction).sum()) == pytest.approx(numeric, rel=1e-5)
    # Without the Hessian term (the gradient held fixed) the derivative is another number.
    frozen = SimpleNamespace(
        evaluate=lambda th, gen, create_graph=False: target.evaluate(th.detach(), gen)
    )
    first, second = group_temperatures([theta], frozen, loss_fn.groups, halves=True) - 1.0
    (partial,) = torch.autograd.grad((first * second).mean(), theta)
    assert abs(float((partial * direction).sum()) - numeric) > 0.05 * abs(numeric)


def test_the_loss_is_unbiased_for_the_squared_deviation_where_a_square_is_not() -> None:
    # Exact samples of the posterior (T = 1), noisy gradients: (T - 1)^2 = 0.
    gen = torch.Generator().manual_seed(5)
    target = EnergyTarget(lambda th: (th * th).sum(-1) / 2, dim=4, grad_noise_std=2.0)
    loss_fn = TemperatureLoss(target, gen)
    halves, squares = [], []
    for _ in range(400):
        theta = torch.randn(20, 4, generator=gen).requires_grad_(True)
        halves.append(float(loss_fn.loss([theta]).detach()))
        read = group_temperatures([theta], target, loss_fn.groups, gen)
        squares.append(float((read.detach() - 1.0).square().mean()))
    halves_t, squares_t = torch.tensor(halves), torch.tensor(squares)
    se = halves_t.std() / len(halves) ** 0.5
    assert abs(float(halves_t.mean())) < 3 * se
    assert float(squares_t.mean()) > 10 * se  # the square adds the estimate's variance


def test_a_step_against_its_meta_gradient_lowers_the_temperature_loss() -> None:
    problem = tiny_problem()
    loss = TemperatureLoss(problem.target, torch.Generator())
    assert_slice_loss_descends(
        problem, lambda slices: (loss.generator.manual_seed(4), loss.loss(slices))[1]
    )


def temperature_settings(**overrides):
    return heldout_settings(**{"heldout_weight": 0.0, "temperature_weight": 1.0, **overrides})


def test_training_with_the_temperature_loss_logs_it_and_resumes_bit_exactly(tmp_path):
    assert_term_trains_and_resumes(temperature_settings, "temperature", tmp_path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.temperature_weight=-1"], "temperature_weight must be >= 0"),
        (["train.temperature_burn_in=-1"], "temperature_burn_in must be >= 0"),
        (
            ["train.temperature_weight=1", "train.cross_chain_every=0"],
            "temperature_weight > 0 needs train.cross_chain_every",
        ),
    ],
)
def test_the_config_refuses_temperature_settings_that_cannot_run(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_the_temperature_loss_alone_is_a_loss_the_config_accepts():
    overrides = ["train.cross_chain_weight=0", "train.in_chain_weight=0"]
    with pytest.raises(ConfigError, match="every loss is disabled"):
        load_config(None, overrides)
    cfg = load_config(None, [*overrides, "train.temperature_weight=1"])
    assert cfg.train.temperature_weight == 1.0


def test_only_slices_past_the_burn_in_reach_a_slice_loss() -> None:
    seen: list[int] = []
    term = SimpleNamespace(burn_in=4, loss=lambda kept: seen.append(len(kept)) or torch.zeros(()))
    slices = [torch.zeros(2, 3) for _ in range(3)]
    window = WindowSamples(positions=slices, grads=slices, steps=[2, 4, 6])
    assert set(MetaUpdate._slice_terms(window, {"temperature": term})) == {"temperature"}
    assert seen == [2]  # steps 4 and 6
    term.burn_in = 7
    assert MetaUpdate._slice_terms(window, {"temperature": term}) == {}  # none: no term
    assert seen == [2]


def test_unrolled_windows_record_the_chains_step_at_each_slice() -> None:
    problem = tiny_problem()
    sampler = NNSGHMC(eta=0.05, q_hidden=(3,), d_hidden=(3,), seed=0)
    gen = torch.Generator().manual_seed(0)
    state = sampler.init(problem.init(4, gen), problem.target, gen)
    state, _ = unroll_window(
        sampler, state, problem.target, gen, length=5, segment_start=0, cross_chain_every=2
    )
    state, window = unroll_window(
        sampler, state, problem.target, gen, length=6, segment_start=0, cross_chain_every=2
    )
    assert window.steps == [6, 8, 10]  # the window's first position (step 5) is detached
    with pytest.raises(ValueError, match="burn_in"):
        TemperatureLoss(problem.target, gen, burn_in=-1)
