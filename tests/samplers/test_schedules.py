"""Step-size schedules and cyclical SG-MCMC (cSGLD / cSGHMC, paper 000 eq. 1, SPEC §2).

Reference values are written out independently of ``schedules.py``: paper 000 eq. 1 with
``L = ceil(K_total / M)``, ``alpha_k = alpha_0 / 2 * (cos(pi * ((k - 1) mod L) / L) + 1)`` and
the exploration stage ``((k - 1) mod L) / L < beta``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from statistical import isotropic_gaussian

from metasampler.samplers.cyclical import cyclical_sghmc, cyclical_sgld
from metasampler.samplers.sghmc import SGHMC
from metasampler.samplers.sgld import SGLD
from metasampler.sampling import sample
from metasampler.schedules import (
    Constant,
    CyclicalCosine,
    DecayThenHold,
    HoldThenDecay,
    PolynomialDecay,
)
from metasampler.targets import EnergyTarget


def _zero_gradient_target(dim: int = 3) -> EnergyTarget:
    return EnergyTarget(
        lambda x: torch.zeros(x.shape[0], dtype=x.dtype), dim, grad_fn=torch.zeros_like
    )


def _quadratic_target(dim: int = 3) -> EnergyTarget:
    """``U = |x|^2 / 2``: the standard normal of the shared harness."""
    return isotropic_gaussian(dim).target()


# -- schedule values ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("total", "cycles", "k", "scale", "explore"),
    [
        # K = 100, M = 4 -> L = 25: r(k) = ((k - 1) mod 25) / 25
        (100, 4, 1, 1.0, True),  # r = 0: a cycle starts at the full step
        (100, 4, 6, 0.5 * (math.cos(math.pi * 5 / 25) + 1), True),  # r = 0.2 < 0.25
        (100, 4, 7, 0.5 * (math.cos(math.pi * 6 / 25) + 1), True),  # r = 0.24
        (100, 4, 8, 0.5 * (math.cos(math.pi * 7 / 25) + 1), False),  # r = 0.28
        (100, 4, 13, 0.5 * (math.cos(math.pi * 12 / 25) + 1), False),  # r = 0.48
        (100, 4, 25, 0.5 * (math.cos(math.pi * 24 / 25) + 1), False),  # last step of cycle 1
        (100, 4, 26, 1.0, True),  # restart
        (100, 4, 100, 0.5 * (math.cos(math.pi * 24 / 25) + 1), False),
        # K = 10, M = 3 -> L = ceil(10 / 3) = 4 (not 3): steps 1, 5, 9 restart
        (10, 3, 4, 0.5 * (math.cos(math.pi * 3 / 4) + 1), False),
        (10, 3, 5, 1.0, True),
        (10, 3, 9, 1.0, True),
        (10, 3, 10, 0.5 * (math.cos(math.pi / 4) + 1), False),  # r = 0.25 is not < 0.25
    ],
)
def test_cyclical_cosine_matches_eq1(total, cycles, k, scale, explore):
    value = CyclicalCosine(total, cycles, explore_fraction=0.25)(k)
    assert value.scale == pytest.approx(scale, rel=1e-12, abs=1e-15)
    assert value.explore is explore


def test_cyclical_cosine_over_a_whole_run():
    # Vectorised restatement of eq. 1 over every k of a run, for another beta and a K not
    # divisible by M.
    total, cycles, beta = 1000, 7, 0.4
    schedule = CyclicalCosine(total, cycles, beta)
    length = -(-total // cycles)  # ceil
    assert schedule.cycle_length == length == 143
    k = torch.arange(1, total + 1, dtype=torch.float64)
    r = torch.remainder(k - 1, length) / length
    values = [schedule(int(i)) for i in k]
    got = torch.tensor([v.scale for v in values], dtype=torch.float64)
    np.testing.assert_allclose(
        got.numpy(), (0.5 * (torch.cos(math.pi * r) + 1)).numpy(), rtol=1e-12
    )
    assert [v.explore for v in values] == (r < beta).tolist()
    # r < 0.4 <=> (k - 1) mod 143 <= 57: 58 exploration steps in each of the 7 cycles (the
    # last cycle is one step short: 6 * 143 + 142 = 1000)
    assert sum(v.explore for v in values) == 7 * 58


def test_constant_and_polynomial_decay():
    assert Constant()(17) == (1.0, False)
    decay = PolynomialDecay(b=3.0, gamma=0.55)
    for k in (1, 2, 10, 1000):
        assert decay(k).scale == pytest.approx((3.0 + k) ** -0.55, rel=1e-12)
        assert decay(k).explore is False


def test_schedule_scales_the_step():
    # At T = 0 (exploration) SGLD is gradient descent with the scheduled step: on U = |x|^2 / 2
    # one step maps x to (1 - eta_k) x exactly.
    target = _quadratic_target()
    sampler = cyclical_sgld(eta=0.3, total_steps=40, n_cycles=2, explore_fraction=0.5)
    theta = torch.ones(2, 3, dtype=torch.float64)
    state = sampler.init(theta, target)
    for k in range(1, 11):  # steps 1..10 of a 20-step cycle are exploration
        before = state.theta
        state = sampler.step(state, target, torch.Generator().manual_seed(k))
        eta_k = 0.3 * 0.5 * (math.cos(math.pi * (k - 1) / 20) + 1)
        np.testing.assert_allclose(state.theta.numpy(), ((1 - eta_k) * before).numpy(), rtol=1e-12)


# -- exploration: no noise, no samples ------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda: cyclical_sgld(eta=0.1, total_steps=60, n_cycles=3),
        lambda: cyclical_sghmc(eta=0.1, total_steps=60, n_cycles=3, momentum_init="zeros"),
    ],
    ids=["csgld", "csghmc"],
)
def test_exploration_injects_no_noise(make):
    # With a zero gradient only injected noise can move theta; cSGHMC starts at rest, so its
    # momentum stays zero until the first sampling stage. L = 20, beta = 1/4: steps 1-5,
    # 21-25 and 41-45 explore. cSGLD must stand still in every exploration stage, cSGHMC in the
    # first (afterwards its momentum decays deterministically: see the next test); every
    # sampling step moves every chain.
    sampler = make()
    target = _zero_gradient_target()
    gen = torch.Generator().manual_seed(0)
    state = sampler.init(torch.randn(8, 3, generator=gen, dtype=torch.float64), target, gen)
    for k in range(1, 61):
        before = state.theta
        state = sampler.step(state, target, gen)
        explore = (k - 1) % 20 < 5
        assert sampler.schedule(k).explore is explore
        if explore and (k <= 5 or isinstance(sampler, SGLD)):
            assert torch.equal(state.theta, before), k
        elif not explore:
            assert bool((state.theta != before).all()), k


def test_csghmc_exploration_is_deterministic():
    # Two runs that share the state at the start of an exploration stage but use different
    # generators agree exactly through that stage (no random draw is used) and differ at the
    # first sampling step.
    sampler = cyclical_sghmc(eta=0.1, total_steps=60, n_cycles=3)
    target = _quadratic_target()
    gen = torch.Generator().manual_seed(0)
    state = sampler.init(torch.randn(8, 3, generator=gen, dtype=torch.float64), target, gen)
    for _ in range(20):  # cycle 1; step 21 starts an exploration stage
        state = sampler.step(state, target, gen)
    runs = []
    for seed in (1, 2):
        s, g = state, torch.Generator().manual_seed(seed)
        for _ in range(5):  # steps 21-25
            s = sampler.step(s, target, g)
        runs.append((s, g))
    (s1, g1), (s2, g2) = runs
    assert torch.equal(s1.theta, s2.theta) and torch.equal(s1.momentum, s2.momentum)
    assert not torch.equal(s1.theta, state.theta)  # it did move (momentum, gradient)
    assert not torch.equal(sampler.step(s1, target, g1).theta, sampler.step(s2, target, g2).theta)


@pytest.mark.parametrize(("burn_in", "thin"), [(0, 1), (7, 3)])
def test_sample_keeps_only_sampling_stage(burn_in: int, thin: int):
    total, cycles = 90, 3  # L = 30, beta = 1/4: r < 0.25 for (k - 1) mod 30 in 0..7
    sampler = cyclical_sgld(eta=0.01, total_steps=total, n_cycles=cycles)
    result = sample(
        sampler, _quadratic_target(), 4, total, burn_in=burn_in, thin=thin, seed=0,
        progress=False, dtype=torch.float64,
    )  # fmt: skip
    expected = [
        k
        for k in range(1, total + 1)
        if (k - 1) % 30 >= 8 and k > burn_in and (k - burn_in) % thin == 0
    ]
    assert result.steps.tolist() == expected
    assert result.theta.shape == (len(expected), 4, 3)
    assert result.energy.shape == (len(expected), 4)
    assert all(sampler.collects(k) == ((k - 1) % 30 >= 8) for k in range(1, total + 1))


# -- factories and validation --------------------------------------------------------------
def test_factories_build_cyclical_samplers():
    csgld = cyclical_sgld(lr=0.5, total_steps=1000, n_cycles=10, explore_fraction=0.3)
    assert type(csgld) is SGLD and csgld.lr == 0.5 and csgld.temperature == 1.0
    assert csgld.schedule == CyclicalCosine(1000, 10, 0.3)
    csghmc = cyclical_sghmc(
        eta=0.05, total_steps=200, n_cycles=4, friction=2.0, noise_estimate=0.5, temperature=0.5
    )
    assert type(csghmc) is SGHMC and csghmc.eta == 0.05
    assert (csghmc.friction, csghmc.noise_estimate, csghmc.temperature) == (2.0, 0.5, 0.5)
    assert csghmc.schedule == CyclicalCosine(200, 4, 0.25)


@pytest.mark.parametrize(
    ("build", "param"),
    [
        (lambda: cyclical_sgld(eta=0.1, total_steps=0, n_cycles=1), "total_steps"),
        (lambda: cyclical_sgld(eta=0.1, total_steps=10, n_cycles=0), "n_cycles"),
        (lambda: cyclical_sgld(eta=0.1, total_steps=10, n_cycles=11), "n_cycles"),
        (lambda: cyclical_sgld(eta=0.1, total_steps=10, n_cycles=2, explore_fraction=1.0),
         "explore_fraction"),
        (lambda: cyclical_sgld(eta=0.1, total_steps=10, n_cycles=2, explore_fraction=-0.1),
         "explore_fraction"),
        (lambda: cyclical_sgld(eta=0.0, total_steps=10, n_cycles=2), "eta"),
        (lambda: cyclical_sghmc(eta=0.1, total_steps=10, n_cycles=2, friction=-1.0), "friction"),
        (lambda: PolynomialDecay(gamma=-0.5), "gamma"),
        (lambda: PolynomialDecay(b=-1.0), "b"),
    ],
)  # fmt: skip
def test_bad_schedule_parameters_raise(build, param: str):
    with pytest.raises(ValueError, match=param):
        build()


def test_hold_then_decay_and_decay_then_hold():
    """The papers' SGLD schedules: seed 000 holds then decays from the switch (continuous
    there), seed 002 decays then holds at ``until ** -gamma``."""
    hold = HoldThenDecay(hold=5, gamma=0.5)
    assert [hold(k).scale for k in (1, 5)] == [1.0, 1.0]
    assert hold(6).scale == 1.0 and hold(9).scale == pytest.approx(0.5)  # (9 - 5)^-0.5
    cap = DecayThenHold(until=200, gamma=0.55)
    assert cap(1).scale == 1.0 and cap(200).scale == pytest.approx(200**-0.55)
    assert cap(5000).scale == cap(200).scale
    assert not hold(7).explore and not cap(7).explore
