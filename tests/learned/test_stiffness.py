"""NNSGHMC's stiffness input (``curl_input="stiffness"``, the default): the running mean of
``grad^2``, what it measures, its end at the warm-up, the sampler's stationarity with it, and
its file round trip."""

from __future__ import annotations

import math

import pytest
import torch
from statistical import Z_MEAN, GaussianCase
from test_nnsghmc import moments_with_and_without_gamma, sghmc_like, strongly_state_dependent

import metasampler as ms
from metasampler.learned import NNSGHMC
from metasampler.learned.stiffness import FROZEN, stiffness_input, update_grad_sq


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
    # Q_f = 1, D_f = 1: SGHMC, which samples this target well (the curl sees the stiffness)
    sampler = sghmc_like(1.0, 0.02, q_hidden=(4,), d_hidden=(4,))
    assert sampler.uses_stiffness
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
    # The curl sees the energy and the per-coordinate stiffness, without a thermostat; V
    # holds earlier gradients only and is fixed after the burn-in, so Gamma needs no
    # derivative of it and the chain stays stationary up to the step's O(eta) bias (measured
    # variance ratios 0.97-1.01); without Gamma the means are 14-16 standard errors off.
    fits = moments_with_and_without_gamma(
        ("exact", "none"), curl_input="stiffness", thermostat=False
    )
    assert fits["none"].mean_z > 2 * Z_MEAN, fits["none"]


def test_the_statistic_is_fixed_when_the_warm_up_ends():
    # sample(..., burn_in=B) ends the warm-up after step B (Sampler.end_warmup): V keeps its
    # value of step B from then on, in a continued run too, while the chains move on. Without
    # a burn-in it adapts at every step; until step B the two runs are the same chains.
    target = stiff_and_broad().target()
    sampler = NNSGHMC(eta=0.02, q_hidden=(4,), d_hidden=(4,), seed=0, compile=False)
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def record(state):
        seen[state.step] = (state.extras["grad_sq"].clone(), state.theta.clone())

    def run(burn_in: int) -> ms.SampleResult:
        seen.clear()
        return ms.sample(
            sampler, target, 4, 60, burn_in=burn_in, seed=0, progress=False, callback=record
        )

    result = run(30)
    warm = dict(seen)
    fixed = warm[30][0]
    assert all(torch.equal(warm[k][0], fixed) for k in range(30, 61))
    assert not torch.equal(warm[29][0], fixed)  # (it adapted until then)
    assert FROZEN in result.final_state.extras
    more = ms.sample(sampler, target, 4, 20, init=result.final_state, seed=1, progress=False)
    assert torch.equal(more.final_state.extras["grad_sq"], fixed)
    assert not torch.equal(more.final_state.theta, result.final_state.theta)
    run(0)
    adapting = dict(seen)
    assert all(not torch.equal(adapting[k][0], adapting[k + 1][0]) for k in range(30, 60))
    assert torch.equal(adapting[31][1], warm[31][1])  # step 31 used V of steps 1 to 30
    assert not torch.equal(adapting[32][1], warm[32][1])
    # The momentum curl carries no statistic: nothing to fix
    paper = NNSGHMC(eta=0.02, curl_input="momentum", thermostat=False, compile=False)
    state = paper.init(torch.zeros(4, 2), target)
    assert paper.end_warmup(state) is state and "grad_sq" not in state.extras


def test_a_saved_stiffness_sampler_loads_and_samples_the_same(tmp_path):
    case = stiff_and_broad()
    sampler = strongly_state_dependent("exact", eta=0.02, curl_input="stiffness")
    path = tmp_path / "stiff.safetensors"
    sampler.save(str(path))
    loaded = ms.load_sampler(path)
    assert loaded.arguments() == sampler.arguments() and loaded.uses_stiffness
    init = torch.randn(8, 2, generator=torch.Generator().manual_seed(1))
    runs = [
        ms.sample(s, case.target(), 8, 50, init=init, burn_in=20, seed=3, progress=False).theta
        for s in (sampler, loaded)
    ]
    torch.testing.assert_close(runs[1], runs[0], rtol=0, atol=0)


def test_stiffness_arguments_are_checked():
    with pytest.raises(ValueError, match="curl_input='stiffness' needs exact Gamma"):
        NNSGHMC(eta=0.1, gamma="finite_difference")
    sampler = NNSGHMC(eta=0.1)
    sampler.gamma = "finite_difference"  # (set on a loaded sampler: checked at the step)
    with pytest.raises(ValueError, match="curl_input='stiffness' needs exact Gamma"):
        ms.sample(sampler, stiff_and_broad().target(), 2, 2, progress=False)
    theta = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="grad_sq"):
        NNSGHMC(eta=0.1).drift_terms(theta, theta, stiff_and_broad().target())


def test_a_fixed_v_gives_its_stiffness_input_once_and_the_same_chain(monkeypatch):
    # After the warm-up V is fixed: its input log(eta sqrt(V)) is computed once, not per step,
    # and the chain is bit for bit the one that recomputes it each step.
    from metasampler.learned import stiffness as stats

    calls = []
    original = stats.stiffness_input
    monkeypatch.setattr(
        stats, "stiffness_input", lambda v, eta: calls.append(eta) or original(v, eta)
    )
    target = ms.EnergyTarget(lambda x: 0.5 * (x * x * torch.arange(1.0, 4.0)).sum(-1), 3)
    init = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    thetas = []
    for cached in (True, False):
        sampler = NNSGHMC(eta=0.05, q_hidden=(4,), d_hidden=(4,), compile=False)
        if not cached:
            sampler._fixed_stiffness = type("PerStep", (), {"of": staticmethod(original)})()
        gen = torch.Generator().manual_seed(1)
        state = sampler.init(init.clone(), target, gen)
        for _ in range(3):
            state = sampler.step(state, target, gen)
        state, calls[:] = sampler.end_warmup(state), []
        for _ in range(4):
            state = sampler.step(state, target, gen)
        assert len(calls) == (1 if cached else 0)
        thetas.append(state.theta)
    assert torch.equal(*thetas)
    # another V, V changed in place, or another step: computed afresh
    fixed, v = stats.FixedStiffness(), torch.tensor([4.0, 9.0])
    first = fixed.of(v, 0.1)
    assert fixed.of(v, 0.1) is first and fixed.of(v.clone(), 0.1) is not first
    v.mul_(4.0)
    torch.testing.assert_close(fixed.of(v, 0.1), first + math.log(2.0))
    torch.testing.assert_close(fixed.of(v, 0.2), first + 2 * math.log(2.0))
