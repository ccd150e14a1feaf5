"""HMC: exact at a step where the uncorrected leapfrog chain is far off, its step adaptation,
its trajectory bookkeeping and its refusal of inexact targets."""

from __future__ import annotations

import pytest
import torch
from statistical import check_moments, correlated_gaussian, moments, run_chains

from metasampler import BayesianModel
from metasampler.samplers import HMC
from tasks.bnn import make_mlp

# The 4-D correlated Gaussian's stiffest direction has curvature 5.14: at eta = 0.6 a leapfrog
# trajectory without the Metropolis test samples a position variance 1 / (1 - eta^2 5.14 / 4)
# = 1.86 times the target's in that direction (the harmonic oscillator's shadow Hamiltonian).
ETA, LEAPFROG, TRAJECTORIES = 0.6, 5, 300


class _Unadjusted(HMC):
    """HMC with every proposal kept: the leapfrog chain without its Metropolis test."""

    def _metropolis(self, log_ratio, generator):
        return torch.ones_like(log_ratio, dtype=torch.bool), torch.ones_like(log_ratio)


def _kept(sampler: HMC, seed: int = 0) -> torch.Tensor:
    case = correlated_gaussian()
    result = run_chains(
        sampler, case.target(), 50, LEAPFROG * TRAJECTORIES, seed=seed, dtype=torch.float64,
        burn_in=LEAPFROG * 50, init=case.mean.expand(50, -1).clone(),
    )  # fmt: skip
    assert (result.steps % LEAPFROG == 0).all()  # only a trajectory's ends are samples
    return result.theta


@pytest.mark.parametrize("preconditioned", [False, True])
def test_hmc_is_exact_at_a_step_that_biases_the_uncorrected_leapfrog(preconditioned: bool) -> None:
    case = correlated_gaussian()
    # A diagonal inverse mass (the target's variances) changes the trajectories, not the law.
    inverse_mass = torch.diagonal(case.cov).clone() if preconditioned else 1.0
    kept = _kept(HMC(eta=ETA, n_leapfrog=LEAPFROG, inverse_mass=inverse_mass))
    got = check_moments(kept, case.mean, case.cov, mean_atol=0.1, var_rtol=0.1, kl_max=0.01)
    biased = moments(_kept(_Unadjusted(eta=ETA, n_leapfrog=LEAPFROG)), case.mean, case.cov)
    assert biased.kl > 10 * max(got.kl, 1e-3), (str(got), str(biased))
    assert biased.var_ratio.max() > 1.3, str(biased)


def test_adaptation_brings_the_acceptance_rate_to_its_target() -> None:
    case = correlated_gaussian()
    sampler = HMC(eta=0.05, n_leapfrog=5, adapt_trajectories=150, target_accept=0.7)
    result = run_chains(sampler, case.target(), 50, 5 * 350, seed=1, dtype=torch.float64)
    state = result.final_state
    assert (state.extras["step_scale"] > 4.0).all()  # every chain's step grew from a timid start
    assert 0.6 < float(sampler.acceptance_rate(state).mean()) < 0.8


def test_a_diverging_trajectory_is_rejected_not_raised() -> None:
    case = correlated_gaussian()
    sampler = HMC(eta=3.0, n_leapfrog=20, jitter=0.0)  # the stiff direction grows 8x a step
    start = case.mean.expand(4, -1).clone()
    result = run_chains(sampler, case.target(), 4, 20, seed=0, dtype=torch.float64, init=start)
    final = result.final_state
    assert torch.equal(final.theta, start)  # every chain rejected, back at the start
    assert float(final.extras["accepted"].sum()) == 0.0


def test_hmc_refuses_minibatch_and_noisy_targets() -> None:
    x, y = torch.randn(100, 3), torch.randint(0, 2, (100,))
    minibatch = BayesianModel(make_mlp(3, [4], 2), (x, y), batch_size=20)
    with pytest.raises(ValueError, match="batch_size=100"):
        HMC(eta=0.01).init(torch.zeros(2, minibatch.dim), minibatch)
    full = BayesianModel(make_mlp(3, [4], 2), (x, y), batch_size=100)
    HMC(eta=0.01).init(torch.zeros(2, full.dim), full)
    with pytest.raises(ValueError, match="grad_noise_std"):
        HMC(eta=0.01).init(torch.zeros(2, 4), correlated_gaussian().target(grad_noise_std=0.1))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"n_leapfrog": 0}, "n_leapfrog"), ({"inverse_mass": -1.0}, "inverse_mass"),
        ({"inverse_mass": torch.ones(2, 2)}, "inverse_mass"),
        ({"target_accept": 1.0}, "target_accept"), ({"jitter": 1.0}, "jitter"),
        ({"temperature": 0.0}, "temperature"), ({"adapt_trajectories": -1}, "adapt"),
    ],
)  # fmt: skip
def test_bad_hmc_settings_raise(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        HMC(eta=0.1, **kwargs)
