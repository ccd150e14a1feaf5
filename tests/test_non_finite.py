"""Non-finite chains and step scalars (issue #15): a :class:`NonFiniteError` naming the step,
chain and quantity, with a hint that matches the cause."""

from __future__ import annotations

import pickle

import pytest
import torch

import metasampler as ms
from metasampler.learned import NNSGHMC
from metasampler.samplers import SGHMC, SGLD

STEP_HINT = "step size is probably too large"


def quadratic(dim: int = 3, shift: float = 0.0) -> ms.EnergyTarget:
    return ms.EnergyTarget(lambda th: 0.5 * ((th - shift) ** 2).sum(-1), dim=dim)


@pytest.mark.parametrize(
    ("eta", "temperature", "quantity"),
    [(1e39, 1.0, "step size eta"), (1e20, 1e30, "2 * eta * temperature")],
)
def test_overflowing_step_or_temperature_is_a_non_finite_error(eta, temperature, quantity):
    sampler = NNSGHMC(eta=eta, temperature=temperature, q_hidden=(4,), d_hidden=(4,), seed=0)
    with pytest.raises(ms.NonFiniteError, match="too large") as info:
        ms.sample(sampler, quadratic(), 4, 5, seed=0, progress=False)
    err = info.value
    assert (err.step, err.chain, err.quantity) == (1, None, quantity)
    assert "cannot be converted" not in str(err)


def test_overflow_of_a_product_formed_inside_a_sampler_is_a_non_finite_error():
    # eta and 2 eta T fit float32, but NNSGHMC's eta * T / momentum_std does not.
    sampler = NNSGHMC(eta=1e18, temperature=1e19, q_hidden=(4,), d_hidden=(4,), seed=0)
    sampler.momentum_std.fill_(1e-10)
    with pytest.raises(ms.NonFiniteError, match="too large") as info:
        ms.sample(sampler, quadratic(), 4, 3, seed=0, progress=False)
    assert info.value.step == 1


def test_diverging_chain_names_step_chain_and_quantity():
    with pytest.raises(ms.NonFiniteError, match=STEP_HINT) as info:
        ms.sample(SGLD(eta=5.0), quadratic(), 3, 200, seed=0, progress=False)
    err = info.value
    assert err.step >= 2 and err.chain == 0 and err.quantity in ("position", "energy", "gradient")
    again = pickle.loads(pickle.dumps(err))  # fields survive (errors cross torchrun ranks)
    assert (again.step, again.chain, again.quantity, str(again)) == (
        err.step,
        err.chain,
        err.quantity,
        str(err),
    )


@pytest.mark.parametrize("make", [lambda: SGHMC(eta=0.01), lambda: NNSGHMC(eta=0.01, seed=0)])
def test_nan_start_positions_say_so_without_the_step_size_hint(make):
    init = torch.zeros(4, 3)
    init[2, 1] = float("nan")
    with pytest.raises(ms.NonFiniteError, match="start positions") as info:
        ms.sample(make(), quadratic(), 4, 5, init=init, seed=0, progress=False)
    err = info.value
    assert (err.step, err.chain, err.quantity) == (0, 2, "start position")
    assert STEP_HINT not in str(err)


@pytest.mark.parametrize("make", [lambda: SGHMC(eta=0.01), lambda: NNSGHMC(eta=0.01, seed=0)])
def test_nan_data_in_a_target_blames_the_target_not_the_step(make):
    target = quadratic(shift=float("nan"))  # e.g. a data set with a NaN in it
    with pytest.raises(ms.NonFiniteError, match="check the data") as info:
        ms.sample(make(), target, 4, 5, seed=0, progress=False)
    assert info.value.step == 1 and info.value.quantity == "energy"
    assert STEP_HINT not in str(info.value)


def test_nan_data_in_a_bayesian_model_is_rejected_at_construction():
    x = torch.randn(20, 3)
    x[4, 0] = float("nan")
    with pytest.raises(ValueError, match="x has 1 non-finite"):
        ms.BayesianModel(torch.nn.Linear(3, 2), (x, torch.zeros(20, dtype=torch.long)))


def test_finiteness_check_names_the_chain_and_passes_finite_values_whose_sum_overflows():
    from metasampler.samplers.base import check_finite
    from metasampler.targets import NonFiniteError

    big = torch.full((3, 4), 3e38)  # finite entries whose sum is inf in float32
    check_finite(5, grad=big)
    bad = torch.ones(3, 4)
    bad[2, 1] = float("nan")
    with pytest.raises(NonFiniteError, match="non-finite grad in chain 2 at step 5") as err:
        check_finite(5, energy=torch.ones(3), grad=bad)
    assert (err.value.chain, err.value.quantity) == (2, "grad")
    both = torch.ones(3, 4)
    both[1, 0], both[1, 1] = float("inf"), float("-inf")  # a sum of nan, also caught
    with pytest.raises(NonFiniteError, match="chain 1"):
        check_finite(1, grad=both)
