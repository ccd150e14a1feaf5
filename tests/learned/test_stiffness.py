"""NNSGHMC's stiffness input (``q_stiffness_input``): the running mean of ``grad^2``, what it
measures, the sampler's stationarity with it, and its file round trip."""

from __future__ import annotations

import math

import pytest
import torch
from statistical import GaussianCase
from test_nnsghmc import moments_with_and_without_gamma, strongly_state_dependent

import metasampler as ms
from metasampler.learned import NNSGHMC
from metasampler.learned.stiffness import stiffness_input, update_grad_sq
from metasampler.samplers import SamplerState


def test_running_mean_is_plain_then_exponential():
    grads = [torch.tensor([float(v)]) for v in (1, 2, 3, 4, 5, 6)]
    v = None
    for k, g in enumerate(grads, start=1):
        v = update_grad_sq(v, g, k, decay=0.75)  # plain mean while 1/k > 0.25, i.e. k < 4
        if k == 3:
            torch.testing.assert_close(v, torch.tensor([(1 + 4 + 9) / 3]))
    expected = (1 + 4 + 9) / 3
    for g in (4, 5, 6):  # k = 4 (1/k = 0.25: either rule), 5, 6: weight 0.25
        expected += 0.25 * (g * g - expected)
    torch.testing.assert_close(v, torch.tensor([expected]))
    # The input is log(eta sqrt(V)): the step over the length scale 1 / sqrt(V).
    torch.testing.assert_close(
        stiffness_input(torch.tensor([100.0]), 0.01), torch.tensor([math.log(0.1)])
    )


def stiff_and_broad() -> GaussianCase:
    """A diagonal Gaussian whose standard deviations are 0.1 (stiff) and 1 (broad)."""
    cov = torch.diag(torch.tensor([0.01, 1.0]))
    return GaussianCase(torch.zeros(2, dtype=torch.float64), cov, torch.linalg.inv(cov))


def test_stiffness_input_measures_each_coordinates_length_scale():
    # At equilibrium E[(d_i U)^2] = 1 / sigma_i^2 for a diagonal Gaussian, so the two
    # coordinates' inputs differ by log(sigma_broad / sigma_stiff) = log 10. Measured over
    # 200 chains after 600 steps from exact samples (the running mean covers the last ~100).
    case = stiff_and_broad()
    sampler = NNSGHMC(
        eta=0.02, q_hidden=(4,), d_hidden=(4,), q_momentum_input=False, q_stiffness_input=True,
        beta_off=1.0, c=1.0, d_output_scale=0.0, seed=0, compile=False,
    )  # fmt: skip
    with torch.no_grad():
        sampler.f_q.head.weight.zero_()  # Q_f = 1: SGHMC, which samples this target well
        sampler.f_q.head.bias.zero_()
    gen = torch.Generator().manual_seed(0)
    init = torch.randn(200, 2, generator=gen) * case.cov.diagonal().sqrt().float()
    target = case.target()
    with torch.no_grad():
        state = sampler.init(init, target, gen)
        for _ in range(600):
            state = sampler.step(state, target, gen)
    s = stiffness_input(state.extras["grad_sq"], 0.02).mean(0)
    assert abs(float(s[0] - s[1]) - math.log(10.0)) < 0.15, s
    assert abs(float(s[1]) - math.log(0.02)) < 0.15, s  # sigma = 1: log(eta / 1)


@pytest.mark.slow
def test_stationarity_with_a_stiffness_input_and_bias_without_gamma():
    # The curl sees the energy and the per-coordinate stiffness; V holds earlier gradients
    # only, so Gamma needs no derivative of it and the chain stays stationary up to the step's
    # O(eta) bias (the adapting V adds no bias measurable here); without Gamma it is biased.
    fits = moments_with_and_without_gamma(
        ("exact", "none"), q_momentum_input=False, q_stiffness_input=True
    )
    errors = {mode: fit.max_var_error for mode, fit in fits.items()}
    assert errors["none"] > 2 * errors["exact"], errors


def one_stiff_two_broad() -> GaussianCase:
    """A diagonal Gaussian with standard deviations 0.1, 1, 1: the median coordinate is broad."""
    cov = torch.diag(torch.tensor([0.01, 1.0, 1.0]))
    return GaussianCase(torch.zeros(3, dtype=torch.float64), cov, torch.linalg.inv(cov))


def constant_curl(**kwargs) -> NNSGHMC:
    """``Q_f = 1`` before preconditioning, constant friction: SGHMC with friction 1."""
    sampler = NNSGHMC(
        q_hidden=(4,), d_hidden=(4,), q_momentum_input=False, beta_off=1.0, c=1.0,
        d_output_scale=0.0, seed=0, compile=False, **kwargs,
    )  # fmt: skip
    with torch.no_grad():
        sampler.f_q.head.weight.zero_()
        sampler.f_q.head.bias.zero_()
    return sampler


@pytest.mark.parametrize(("power", "limit"), [(0.5, 5.0), (1.0, 5.0), (1.0, 1.0)])
def test_preconditioner_divides_the_curl_by_the_rms_gradient_ratio(power, limit):
    # V at equilibrium is the precision's diagonal (100, 1, 1): the stiff coordinate's RMS
    # gradient is 10 times the median's, so its curl is 10^-power (at most e^limit smaller).
    case = one_stiff_two_broad()
    sampler = constant_curl(eta=0.05, precondition_power=power, precondition_range=limit)
    theta = torch.zeros(4, 3)
    grad_sq = case.cov.diagonal().reciprocal().float().expand(4, 3)
    q = sampler.drift_terms(theta, theta, case.target(), grad_sq=grad_sq).q
    stiff = max(10.0**-power, math.exp(-limit))
    torch.testing.assert_close(q, torch.tensor([stiff, 1.0, 1.0]).expand(4, 3))


def test_preconditioned_sampler_samples_a_target_too_stiff_for_its_step():
    # At eta = 0.25 the stiff coordinate (sigma 0.1) turns 2.5 rad a step: beyond the
    # integrator's stability limit of 2, SGHMC's chains blow up. Preconditioned with power 1
    # it turns 0.25 rad, like the broad ones, and the chains sample all three variances.
    case = one_stiff_two_broad()
    gen = torch.Generator().manual_seed(0)
    init = (torch.randn(200, 3, generator=gen) * case.cov.diagonal().sqrt()).float()

    def run(power: float) -> ms.SampleResult:
        sampler = constant_curl(eta=0.25, precondition_power=power)
        return ms.sample(
            sampler, case.target(), 200, 1500, init=init, seed=1, progress=False, burn_in=500,
            thin=10,
        )  # fmt: skip

    ratio = run(1.0).theta.reshape(-1, 3).double().var(0) / case.cov.diagonal()
    assert (ratio - 1).abs().max() < 0.1, ratio
    with pytest.raises(ms.NonFiniteError):
        run(0.0)


def test_a_frozen_statistic_stops_adapting_after_its_step():
    # With stiffness_freeze_after = 30, V (and so the preconditioner) keeps its value after
    # step 30 from then on; until it matters the chains run exactly as the adapting ones.
    case = one_stiff_two_broad()
    init = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))

    def run(freeze_after: int | None) -> list[SamplerState]:
        sampler = constant_curl(
            eta=0.05,
            precondition_power=1.0,
            stiffness_decay=0.8,
            stiffness_freeze_after=freeze_after,
        )
        gen = torch.Generator().manual_seed(1)
        states = [sampler.init(init, case.target(), gen)]
        with torch.no_grad():
            for _ in range(60):
                states.append(sampler.step(states[-1], case.target(), gen))
        return states

    frozen, adapting = run(30), run(None)
    # (step k uses V of steps 1 .. k - 1: the first step that sees the freeze is 32)
    assert torch.equal(frozen[31].theta, adapting[31].theta)
    assert not torch.equal(frozen[32].theta, adapting[32].theta)
    for state in frozen[31:]:
        assert torch.equal(state.extras["grad_sq"], frozen[30].extras["grad_sq"])
    assert not torch.equal(adapting[60].extras["grad_sq"], adapting[30].extras["grad_sq"])


@pytest.mark.slow
@pytest.mark.parametrize("freeze_after", [None, 50])
def test_stationarity_with_a_preconditioned_curl_and_bias_without_gamma(freeze_after):
    # The momentum-dependent curl times P: Gamma_theta = -P dQ/dp and Gamma_p's curl term
    # scale with P (a constant of z); without Gamma the chain is biased. Frozen after step 50
    # (of a 300-step burn-in), P is a constant of the whole run: the same holds.
    fits = moments_with_and_without_gamma(
        ("exact", "none"), q_momentum_input=True, precondition_power=1.0,
        stiffness_freeze_after=freeze_after,
    )  # fmt: skip
    errors = {mode: fit.max_var_error for mode, fit in fits.items()}
    assert errors["none"] > 2 * errors["exact"], errors


@pytest.mark.parametrize("power", [0.0, 0.5])
def test_a_saved_stiffness_sampler_loads_and_samples_the_same(tmp_path, power):
    case = stiff_and_broad()
    sampler = strongly_state_dependent(
        "exact", eta=0.02, beta_off=1.0, c=0.3, q_stiffness_input=True, stiffness_decay=0.9,
        precondition_power=power, precondition_range=2.0, stiffness_freeze_after=20,
    )  # fmt: skip
    path = tmp_path / "stiff.safetensors"
    sampler.save(str(path))
    loaded = ms.load_sampler(path)
    assert loaded.q_stiffness_input and loaded.stiffness_decay == 0.9
    assert loaded.precondition_power == power and loaded.precondition_range == 2.0
    assert loaded.stiffness_freeze_after == 20
    init = torch.randn(8, 2, generator=torch.Generator().manual_seed(1))
    runs = [
        ms.sample(s, case.target(), 8, 50, init=init, seed=3, progress=False).theta
        for s in (sampler, loaded)
    ]
    torch.testing.assert_close(runs[1], runs[0], rtol=0, atol=0)


def test_stiffness_arguments_are_checked():
    with pytest.raises(ValueError, match="q_stiffness_input needs exact Gamma"):
        NNSGHMC(eta=0.1, q_stiffness_input=True, gamma="finite_difference")
    with pytest.raises(ValueError, match="precondition_power 0.5 needs exact Gamma"):
        NNSGHMC(eta=0.1, precondition_power=0.5, gamma="finite_difference")
    with pytest.raises(ValueError, match="precondition_range"):
        NNSGHMC(eta=0.1, precondition_power=0.5, precondition_range=0.0)
    with pytest.raises(ValueError, match="stiffness_decay"):
        NNSGHMC(eta=0.1, q_stiffness_input=True, stiffness_decay=1.0)
    sampler = NNSGHMC(eta=0.1, q_stiffness_input=True)
    theta = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="grad_sq"):
        sampler.drift_terms(theta, theta, stiff_and_broad().target())
