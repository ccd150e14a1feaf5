"""NNSGHMC: reduction to SGHMC, exact and finite-difference Gamma, stationarity."""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path

import pytest
import torch
from compiled_packages import empty_package_registries
from statistical import (
    Banana,
    Moments,
    check_moments,
    diagonal_gaussian,
    moments,
    must_fail,
    random_gaussian,
    run_chains,
)

import metasampler as ms
from metasampler.learned import NNSGHMC
from metasampler.samplers import SGHMC
from metasampler.targets import Evaluation, energy_and_grad


def quadratic_target(dim: int = 5, seed: int = 0, noise: float = 0.0) -> tuple:
    """The harness's random zero-mean Gaussian: its target and its covariance."""
    case = random_gaussian(dim, seed)
    return case.target(noise), case.cov


class SplitPriorTarget:
    """A target whose energy has a likelihood part and a Gaussian prior part, with ``N = 3``:
    exercises the per-datum energy input and the ``D_train / D_test`` prior scaling."""

    dim = 3
    n_data = 3
    estimates_grad_noise = True  # (an arbitrary positive "estimate", for the paths' plumbing)

    def evaluate(self, theta, generator=None, create_graph=False, estimate_noise=False):
        def likelihood(x):
            return 0.5 * ((x - 1.0) ** 2).sum(-1) + 0.1 * (x**4).sum(-1)

        lik, lik_grad = energy_and_grad(likelihood, theta, create_graph)
        prior = 0.5 * (theta**2).sum(-1) / 4.0
        prior_grad = theta / 4.0
        if not create_graph:
            prior, prior_grad = prior.detach(), prior_grad.detach()
        noise_var = (0.2 + theta.detach().square()) if estimate_noise else None
        return Evaluation(lik + prior, lik_grad + prior_grad, prior, prior_grad, noise_var)


def strongly_state_dependent(gamma: str, scale: float = 2.5, **kwargs) -> NNSGHMC:
    """Random nets whose outputs vary strongly with U and p (so Gamma is large); tanh units,
    with which the tolerances below were measured (the default was tanh until session 17)."""
    kwargs.setdefault("activation", "tanh")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = NNSGHMC(q_hidden=(16,), d_hidden=(16,), gamma=gamma, seed=1, **kwargs)
    with torch.no_grad():
        for p in sampler.parameters():
            p.mul_(scale)
    return sampler


def test_reduces_to_sghmc_exactly():
    target, _ = quadratic_target(noise=0.5)
    init = torch.randn(10, 5, generator=torch.Generator().manual_seed(1))
    reference = ms.sample(
        SGHMC(eta=0.05, friction=0.7), target, 10, 200, init=init, seed=3, progress=False
    )
    for gamma in ("exact", "finite_difference"):
        sampler = NNSGHMC(eta=0.05, beta_off=1.0, alpha=0.0, c=0.7, d_output_scale=0.0, gamma=gamma)
        with torch.no_grad():
            sampler.f_q.head.weight.zero_()
            sampler.f_q.head.bias.zero_()
        result = ms.sample(sampler, target, 10, 200, init=init, seed=3, progress=False)
        torch.testing.assert_close(result.theta, reference.theta, atol=1e-6, rtol=0)


def test_known_gradient_noise_reduces_to_sghmc_noise_estimate():
    # With Q_f = 1 the injected variance 2 eta (T D_f) - eta^2 Q_f^2 V is SGHMC's
    # 2 eta (C - B) T with B = eta V / 2 (Chen et al. 2014): the same chains, step for step.
    target, _ = quadratic_target(noise=0.5)
    init = torch.randn(10, 5, generator=torch.Generator().manual_seed(1))
    eta, friction, noise_var = 0.05, 0.7, 0.25
    sghmc = SGHMC(eta=eta, friction=friction, noise_estimate=eta * noise_var / 2)
    reference = ms.sample(sghmc, target, 10, 200, init=init, seed=3, progress=False)
    plain = ms.sample(
        SGHMC(eta=eta, friction=friction), target, 10, 200, init=init, seed=3, progress=False
    )
    for gamma in ("exact", "finite_difference"):
        sampler = NNSGHMC(
            eta=eta, beta_off=1.0, c=friction, d_output_scale=0.0, gamma=gamma,
            grad_noise_var=noise_var,
        )  # fmt: skip
        with torch.no_grad():
            sampler.f_q.head.weight.zero_()
            sampler.f_q.head.bias.zero_()
        result = ms.sample(sampler, target, 10, 200, init=init, seed=3, progress=False)
        torch.testing.assert_close(result.theta, reference.theta, atol=1e-6, rtol=0)
    assert (plain.theta - reference.theta).abs().max() > 1e-3  # the correction is not a no-op


def test_estimated_gradient_noise_reduces_to_sghmc_with_the_estimate():
    # The same reduction with V estimated: Q_f = 1 gives SGHMC's B = eta V / 2 per coordinate
    # from the same running mean, step for step.
    target = random_gaussian(dim=5).target(0.7)
    init = torch.randn(10, 5, generator=torch.Generator().manual_seed(1))
    sghmc = SGHMC(eta=0.05, friction=0.7, grad_noise_estimate=True)
    reference = ms.sample(sghmc, target, 10, 200, init=init, seed=3, progress=False)
    sampler = NNSGHMC(eta=0.05, beta_off=1.0, c=0.7, d_output_scale=0.0, grad_noise_estimate=True)
    with torch.no_grad():
        sampler.f_q.head.weight.zero_()
        sampler.f_q.head.bias.zero_()
    result = ms.sample(sampler, target, 10, 200, init=init, seed=3, progress=False)
    torch.testing.assert_close(result.theta, reference.theta, atol=1e-6, rtol=0)
    plain = ms.sample(
        SGHMC(eta=0.05, friction=0.7), target, 10, 200, init=init, seed=3, progress=False
    )
    assert (plain.theta - reference.theta).abs().max() > 1e-3  # the estimate is not a no-op


def test_noise_friction_reduces_to_sghmc_with_the_estimate_as_friction():
    # grad_noise_friction with Q_f = 1: D_f + eta V / (2 T) is SGHMC's C + B, and the injected
    # noise 2 eta T (D_f + B / T) - eta^2 V is SGHMC's 2 eta C T: the same chains, step for
    # step, with exact and finite-difference Gamma.
    target = random_gaussian(dim=5).target(3.0)
    init = torch.randn(10, 5, generator=torch.Generator().manual_seed(1))

    def sghmc(friction: bool):
        sampler = SGHMC(
            eta=0.05, friction=0.7, grad_noise_estimate=True, grad_noise_friction=friction
        )
        return ms.sample(sampler, target, 10, 200, init=init, seed=3, progress=False).theta

    reference = sghmc(True)
    for gamma in ("exact", "finite_difference"):
        sampler = NNSGHMC(
            eta=0.05, beta_off=1.0, c=0.7, d_output_scale=0.0, gamma=gamma,
            grad_noise_estimate=True, grad_noise_friction=True,
        )  # fmt: skip
        with torch.no_grad():
            sampler.f_q.head.weight.zero_()
            sampler.f_q.head.bias.zero_()
        result = ms.sample(sampler, target, 10, 200, init=init, seed=3, progress=False)
        torch.testing.assert_close(result.theta, reference, atol=1e-5, rtol=0)
    assert (sghmc(False) - reference).abs().max() > 1e-2  # the friction is not a no-op


@pytest.mark.slow
def test_noise_friction_removes_the_heat_a_noise_correction_cannot():
    # Gradient noise N(0, 36) brings the momentum more variance per step than 2 eta T D_f in
    # most coordinates, so the correction (inject 2 eta T D_f - eta^2 Q_f^2 V, at least 0)
    # leaves the chains twice as hot (measured variance ratio 1.98-2.00). Dissipating the
    # noise's diffusion as friction cools them to 1.12-1.14 (exact and finite-difference
    # Gamma; the rest is the noise reaching the nets' inputs and Gamma's dQ_f/dU term, as in
    # the test above).
    case = random_gaussian(dim=5)
    target = case.target(6.0)
    errors = {}
    for gamma, friction in (("exact", False), ("exact", True), ("finite_difference", True)):
        sampler = strongly_state_dependent(
            gamma, eta=0.03, beta_off=1.0, c=0.2, grad_noise_estimate=True,
            grad_noise_friction=friction,
        )  # fmt: skip
        kept = run_kept(sampler, target)

        def check(kept=kept):
            return check_moments(kept, case.mean, case.cov, mean_atol=0.05, var_rtol=0.2)

        if friction:
            check()
        else:
            must_fail(check, "the noise correction left the chains hot")
        errors[gamma, friction] = moments(kept, case.mean, case.cov).max_var_error
    assert errors["exact", False] > 5 * max(
        errors["exact", True], errors["finite_difference", True]
    )


@pytest.mark.slow
def test_a_thermostat_removes_unknown_gradient_noise_heat_and_gamma_is_still_needed():
    # Gradient noise N(0, 36), not told to the sampler: state-dependent nets run 2.6 times too
    # hot. The thermostat's feedback takes the heat out without knowing V (measured variance
    # ratio 1.08-1.10: the noise also reaches the nets' inputs); without noise it leaves the
    # target in place (0.99-1.01), and without Gamma the chains stay biased (mean 33 standard
    # errors off, variances 0.87-0.89).
    case = random_gaussian(dim=5)
    runs = {  # gamma, gradient noise, thermostat, variance tolerance (None: must fail)
        "noisy, no thermostat": ("exact", 6.0, False, None),
        "noisy, thermostat": ("exact", 6.0, True, 0.15),
        "thermostat": ("exact", 0.0, True, 0.05),
        "thermostat, no Gamma": ("none", 0.0, True, None),
    }
    for name, (gamma, noise, thermostat, var_rtol) in runs.items():
        sampler = strongly_state_dependent(
            gamma, eta=0.03, beta_off=1.0, c=0.2, thermostat=thermostat
        )
        kept = run_kept(sampler, case.target(noise))

        def check(kept=kept, var_rtol=var_rtol or 0.15):
            return check_moments(kept, case.mean, case.cov, mean_atol=0.05, var_rtol=var_rtol)

        check() if var_rtol else must_fail(check, f"{name}: the chains must be off")


@pytest.mark.parametrize("friction_per_step", [0.3, 1.5])
def test_the_thermostat_keeps_the_positions_at_t_at_a_large_friction_per_step(friction_per_step):
    # The modified Euler step's momentum runs hot by 1 / (1 - eta D / 2) while its positions
    # stay at T (measured position variance 1.000 and 1.032 without a thermostat). A thermostat
    # on p itself cooled the positions to 0.876 (and heated them to 1.32 at 1.5); on the mean
    # of the momenta entering and leaving the step they stay where the step puts them
    # (measured 0.999 and 1.039).
    target = ms.EnergyTarget(lambda x: 0.5 * (x**2).sum(-1), dim=4)
    sampler = NNSGHMC(
        eta=0.1, beta_off=1.0, alpha=0.0, c=friction_per_step / 0.1, d_output_scale=0.0,
        thermostat=True, compile=False,
    )  # fmt: skip
    with torch.no_grad():  # Q_f = 1: SGHMC with a thermostat
        sampler.f_q.head.weight.zero_()
        sampler.f_q.head.bias.zero_()
    kept = ms.sample(
        sampler, target, 500, 1500, burn_in=500, thin=10, seed=0, progress=False,
        init=torch.zeros(500, 4),
    ).theta  # fmt: skip
    assert abs(kept.var().item() - 1.0) < 0.06


def sghmc_like(**kwargs) -> NNSGHMC:
    """``Q_f = 1`` and a constant friction ``c``: SGHMC written as NNSGHMC."""
    sampler = NNSGHMC(beta_off=1.0, alpha=0.0, d_output_scale=0.0, compile=False, **kwargs)
    with torch.no_grad():
        sampler.f_q.head.weight.zero_()
        sampler.f_q.head.bias.zero_()
    return sampler


@pytest.mark.parametrize("friction_per_step", [0.1, 0.5])
def test_leapfrog_positions_are_exact_for_a_stiff_gaussian(friction_per_step):
    # eta^2 k = 0.01, 1 and 2: the modified Euler positions run hot by >= 1 / (1 - eta^2 k / 4)
    # (measured 1.01 / 1.36 / 2.12 at friction 0.1 per step, 1.03 / 1.50 / 3.03 at 0.5); the
    # midpoints of its gradient points are exact for any k and friction (measured within 2 %).
    stiffness = torch.tensor([1.0, 100.0, 200.0])
    target = ms.EnergyTarget(lambda x: 0.5 * (stiffness * x**2).sum(-1), dim=3)
    ratios = {}
    for leapfrog in (False, True):
        sampler = sghmc_like(eta=0.1, c=friction_per_step / 0.1, leapfrog=leapfrog)
        kept = ms.sample(
            sampler, target, 500, 1500, burn_in=500, thin=10, seed=0, progress=False,
            init=torch.zeros(500, 3),
        ).theta  # fmt: skip
        ratios[leapfrog] = kept.reshape(-1, 3).var(0) * stiffness
    assert (ratios[True] - 1).abs().max() < 0.05
    assert ratios[False][-1] > 1.9  # (the test would fail on the Euler positions)


@pytest.mark.parametrize("gamma", ["exact", "finite_difference"])
def test_leapfrog_reports_the_midpoints_of_the_euler_chain(gamma):
    # The gradient points theta + half_step are the modified Euler chain, step for step (the
    # momenta too), and each reported position is the mean of two consecutive gradient points.
    target = SplitPriorTarget()
    # (float64: the finite-difference secants magnify float32 rounding of the midpoint)
    init = torch.randn(4, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    chains = {}
    for leapfrog in (False, True):
        sampler = strongly_state_dependent(gamma, eta=0.05, c=0.3, compile=False)
        sampler.leapfrog = leapfrog
        generator = torch.Generator().manual_seed(3)
        state = sampler.init(init, target, generator)
        chains[leapfrog] = [state := sampler.step(state, target, generator) for _ in range(6)]
    euler, leapfrog = chains[False], chains[True]
    points = [init] + [s.theta for s in euler]
    for k, state in enumerate(leapfrog):
        torch.testing.assert_close(state.theta + state.extras["half_step"], points[k + 1])
        torch.testing.assert_close(state.theta, 0.5 * (points[k] + points[k + 1]))
        torch.testing.assert_close(state.momentum, euler[k].momentum)
    assert "half_step" not in euler[-1].extras


@pytest.mark.slow
def test_leapfrog_keeps_the_target_with_state_dependent_nets_and_gamma_is_still_needed():
    # The reported midpoints sample the target with state-dependent nets (measured variance
    # ratios 0.99-1.03, means 1.0-1.3 standard errors off, exact and finite-difference Gamma)
    # and without Gamma stay biased as the Euler positions do (0.84-0.87, 31 standard errors).
    case = random_gaussian(dim=5)
    for gamma in ("exact", "finite_difference", "none"):
        sampler = strongly_state_dependent(gamma, eta=0.03, beta_off=1.0, c=0.2)
        sampler.leapfrog = True
        kept = run_kept(sampler, case.target())

        def check(kept=kept):
            return check_moments(kept, case.mean, case.cov, mean_atol=0.05, var_rtol=0.07)

        must_fail(check, "no Gamma: the chains must be off") if gamma == "none" else check()


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_the_thermostat_step_is_the_plain_step_between_two_friction_halves(temperature):
    # With the thermostat a step is: p exp(-eta xi / 2), the plain step from there (same noise),
    # then p exp(-eta xi / 2) again, and xi + eta (p_bar^2 - T) on the mean momentum p_bar of
    # the plain step (frozen at T = 0). Compiled or not, the step evaluates it in one function.
    target = SplitPriorTarget()
    gen = torch.Generator().manual_seed(5)
    theta = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    p = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    xi = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    eta = 0.05
    steps = {}
    for thermostat in (True, False):
        sampler = strongly_state_dependent("exact", eta=eta, c=0.3, compile=False)
        sampler.thermostat, sampler.temperature = thermostat, temperature
        state = sampler.init(theta, target, torch.Generator().manual_seed(0))
        state.momentum = p if thermostat else p * torch.exp(-0.5 * eta * xi)
        if thermostat:
            state.extras["xi"] = xi
        steps[thermostat] = sampler.step(state, target, torch.Generator().manual_seed(7))
    inner = steps[False]
    p_in = p * torch.exp(-0.5 * eta * xi)
    feedback = eta * ((0.5 * (p_in + inner.momentum)) ** 2 - temperature)
    torch.testing.assert_close(steps[True].theta, inner.theta)
    torch.testing.assert_close(steps[True].momentum, inner.momentum * torch.exp(-0.5 * eta * xi))
    torch.testing.assert_close(steps[True].extras["xi"], xi + feedback * (temperature > 0))


def test_the_thermostat_refuses_finite_difference_gamma_and_carries_its_state():
    with pytest.raises(ValueError, match="thermostat needs exact Gamma"):
        NNSGHMC(eta=0.03, gamma="finite_difference", thermostat=True)
    sampler = NNSGHMC(eta=0.03, gamma="finite_difference")
    sampler.thermostat = True  # (set on a loaded sampler: checked at the step)
    target = random_gaussian(dim=3).target()
    with pytest.raises(ValueError, match="thermostat needs exact Gamma"):
        ms.sample(sampler, target, 4, 2, progress=False)
    # xi starts at 0 and rises where the momentum is hotter than T; its friction slows p
    momenta = {}
    for thermostat in (False, True):
        sampler = NNSGHMC(eta=0.03, thermostat=thermostat, compile=False)
        state = sampler.init(torch.zeros(4, 3), target)
        state.momentum = torch.full((4, 3), 3.0)
        generator = torch.Generator().manual_seed(0)
        state = sampler.step(state, target, generator)
        if thermostat:
            assert (state.extras["xi"] > 0).all()
        momenta[thermostat] = sampler.step(state, target, generator).momentum
    assert (momenta[True].abs() < momenta[False].abs()).all()


@pytest.mark.slow
def test_known_or_estimated_gradient_noise_variance_removes_the_heating():
    # Gradient noise N(0, 4) adds eta^2 Q_f^2 V to the momentum's variance per step, which the
    # friction does not balance: state-dependent nets run about 26 % hot (measured 1.26-1.27,
    # mean 6 standard errors off). Told V, the injected noise leaves that part out: measured
    # 1.05-1.06 (0.99-1.03 with exact gradients; the rest is the noise reaching the nets'
    # gradient input and Gamma's dQ_f/dU term, which the correction does not model). With V
    # estimated from the noise's two halves (a chi^2_1 draw a step, averaged over ~20 steps)
    # the same: measured 1.05-1.06.
    case = random_gaussian(dim=5)
    target = case.target(2.0)
    errors = {}
    for told in ("nothing", "V = 4", "V estimated"):
        sampler = strongly_state_dependent(
            "exact", eta=0.03, beta_off=1.0, c=0.2,
            grad_noise_var=4.0 if told == "V = 4" else 0.0,
            grad_noise_estimate=told == "V estimated",
        )  # fmt: skip
        kept = run_kept(sampler, target)

        def check(kept=kept):
            return check_moments(kept, case.mean, case.cov, mean_atol=0.05, var_rtol=0.09)

        if told == "nothing":
            must_fail(check, "the gradient noise heated the chains")
        else:
            check()
        errors[told] = moments(kept, case.mean, case.cov).max_var_error
    assert errors["nothing"] > 0.2, errors
    assert errors["nothing"] > 3 * max(errors["V = 4"], errors["V estimated"]), errors


class _NoEstimateTarget:
    """A target that cannot estimate its gradient noise (no ``estimates_grad_noise``)."""

    dim, n_data = 5, 1

    def __init__(self) -> None:
        self.inner, _ = quadratic_target(noise=0.5)

    def evaluate(self, theta, generator=None, create_graph=False):
        return self.inner.evaluate(theta, generator, create_graph)


def test_estimating_the_gradient_noise_needs_a_target_that_can():
    target = _NoEstimateTarget()
    sampler = NNSGHMC(eta=0.05, grad_noise_estimate=True)
    with pytest.raises(ValueError, match="cannot estimate its gradient noise"):
        ms.sample(sampler, target, 2, 3, init=torch.zeros(2, 5), progress=False)


def test_gradient_noise_variance_is_checked():
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="grad_noise_var"):
            NNSGHMC(eta=0.1, grad_noise_var=bad)


def brute_force_gamma(sampler: NNSGHMC, target, theta: torch.Tensor, p: torch.Tensor, **kwargs):
    """``Gamma_i = sum_j d(D + Q)_ij / dz_j`` from the full Jacobian of the drift matrix."""
    dim = theta.shape[1]

    def drift_matrix(z):
        terms = sampler.drift_terms(z[:dim].unsqueeze(0), z[dim:].unsqueeze(0), target, **kwargs)
        q, d = torch.diag(terms.q[0]), torch.diag(terms.d[0])
        zero = torch.zeros(dim, dim, dtype=z.dtype)
        return torch.cat([torch.cat([zero, -q], 1), torch.cat([q, d], 1)], 0)

    z = torch.cat([theta[0], p[0]])
    jac = torch.autograd.functional.jacobian(drift_matrix, z)
    return torch.einsum("ijj->i", jac)


def split_prior_sampler(**kwargs) -> NNSGHMC:
    """A float64 sampler with non-trivial statistics for :class:`SplitPriorTarget`."""
    settings = dict(eta=0.05, beta_off=0.5, alpha=0.3, c=0.1, q_hidden=(8,), d_hidden=(7,))
    sampler = NNSGHMC(seed=2, **{**settings, **kwargs}).double()
    sampler.momentum_std.fill_(1.7)
    sampler.grad_std.fill_(0.6)
    sampler.train_dim.fill_(6)
    with torch.no_grad():
        for param in sampler.parameters():
            param.mul_(2.0)
    return sampler


@pytest.mark.parametrize(
    ("hidden", "q_momentum_input", "q_stiffness_input", "activation", "q_output"),
    [((8,), True, False, "tanh", "identity"), ((8, 6), True, False, "tanh", "identity"),
     ((8,), False, False, "tanh", "identity"), ((8,), False, True, "tanh", "identity"),
     ((8,), True, True, "tanh", "identity"), ((8, 6), True, False, "softsign", "identity"),
     ((8,), True, True, "softsign", "identity"), ((8,), True, False, "sigmoid", "identity"),
     ((8,), True, False, "softplus", "identity"), ((8,), True, False, "softsign", "softplus"),
     ((8, 6), True, True, "tanh", "softplus"), ((8,), True, False, "quadsat", "identity"),
     ((8, 6), True, False, "quadsat", "softplus")],
)  # fmt: skip
def test_exact_gamma_equals_brute_force_jacobian(
    hidden, q_momentum_input, q_stiffness_input, activation, q_output
):
    torch.manual_seed(0)
    target = SplitPriorTarget()
    # Non-trivial input statistics and prior scaling: every factor must enter the chain rule.
    sampler = split_prior_sampler(
        q_hidden=hidden, energy_input_scale=0.7, grad_input_scale=1.3, activation=activation,
        q_momentum_input=q_momentum_input, q_stiffness_input=q_stiffness_input, q_output=q_output,
    )  # fmt: skip
    sampler.energy_loc.fill_(0.2)
    sampler.energy_std.fill_(2.0)
    # The stiffness input comes from a chain's past gradients: a constant of z.
    kwargs = {"grad_sq": torch.tensor([[0.5, 30.0, 4.0]])} if q_stiffness_input else {}
    for _ in range(3):
        theta = torch.randn(1, 3, dtype=torch.float64)
        p = torch.randn(1, 3, dtype=torch.float64)
        expected = brute_force_gamma(sampler, target, theta, p, **kwargs)
        terms = sampler.drift_terms(theta.clone().requires_grad_(True), p, target, **kwargs)
        got = torch.cat([terms.gamma_theta[0], terms.gamma_p[0]])
        torch.testing.assert_close(got.detach(), expected, atol=1e-10, rtol=1e-8)
        assert expected.abs().max() > 1e-2  # the test is not comparing zeros


@pytest.mark.parametrize("q_output", ["identity", "softplus"])
@pytest.mark.parametrize("speed_limit", [None, 0.8])
def test_exact_gamma_with_a_binding_momentum_input_clamp_equals_brute_force_jacobian(
    q_output, speed_limit
):
    # The nets see clamp(p_hat, -m, m): Gamma must differentiate the clamp (0 beyond m), in
    # the curl's and the friction's momentum derivatives alike; and the curl's speed factor
    # (1 + (p_hat / m)^2)^(-1/2), a function of p_hat on both sides of the clamp.
    torch.manual_seed(1)
    target = SplitPriorTarget()
    sampler = split_prior_sampler(
        momentum_input_clamp=0.5, q_output=q_output, speed_limit=speed_limit
    )
    clamped = 0
    for _ in range(4):
        theta = torch.randn(1, 3, dtype=torch.float64)
        p = 1.7 * torch.randn(1, 3, dtype=torch.float64)  # p_hat = p / 1.7 ~ N(0, 1)
        clamped += int(((p / 1.7).abs() > 0.5).sum())
        expected = brute_force_gamma(sampler, target, theta, p)
        terms = sampler.drift_terms(theta.clone().requires_grad_(True), p, target)
        got = torch.cat([terms.gamma_theta[0], terms.gamma_p[0]])
        torch.testing.assert_close(got.detach(), expected, atol=1e-10, rtol=1e-8)
    assert 0 < clamped < 12  # both sides of the clamp were checked
    unclamped = split_prior_sampler(q_output=q_output, speed_limit=speed_limit)
    theta, p = torch.randn(1, 3, dtype=torch.float64), torch.full((1, 3), 1.7 * 3.0).double()
    with_clamp = sampler.drift_terms(theta, p, target).gamma_theta
    without = unclamped.drift_terms(theta, p, target).gamma_theta
    if speed_limit is None:  # the clamp binds at p_hat = 3: nothing of Q_f depends on p
        assert with_clamp.abs().max() == 0 < without.abs().max()
    else:  # only the speed factor does
        assert with_clamp.abs().min() > 0


def test_the_speed_limit_bounds_a_coordinates_move_per_step():
    # |Q_f(p) p| <= max|f_Q| m sigma_p with the limit, and grows with |p| without it.
    target = SplitPriorTarget()
    theta = torch.zeros(1, 3, dtype=torch.float64)
    p = torch.tensor([[1.7, 17.0, 170.0]], dtype=torch.float64)  # p_hat 1, 10, 100
    moves = {}
    for limit in (None, 2.0):
        sampler = split_prior_sampler(q_output="softplus", speed_limit=limit, beta_off=0.0)
        moves[limit] = (sampler.drift_terms(theta, p, target).q * p).abs()[0]
    assert moves[None][2] > 5 * moves[None][1]
    bound = sampler.q_clamp * 2.0 * 1.7
    assert moves[2.0].max() <= bound and moves[2.0][2] < 1.2 * moves[2.0][1]
    # An energy-only curl with the limit depends on p through it alone: Gamma_theta from it.
    sampler = split_prior_sampler(q_momentum_input=False, speed_limit=0.8)
    theta, p = torch.randn(1, 3, dtype=torch.float64), torch.randn(1, 3, dtype=torch.float64)
    expected = brute_force_gamma(sampler, target, theta, p)
    terms = sampler.drift_terms(theta.clone().requires_grad_(True), p, target)
    got = torch.cat([terms.gamma_theta[0], terms.gamma_p[0]])
    torch.testing.assert_close(got.detach(), expected, atol=1e-10, rtol=1e-8)
    assert terms.gamma_theta.abs().min() > 0


def gamma_error(gamma_mode_step: float) -> float:
    """Run exact and FD samplers on the same stream; return the max difference in theta after
    one step relative to the size of the Gamma contribution."""
    target, _ = quadratic_target(dim=4, seed=3)
    init = torch.randn(200, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    results = {}
    for mode in ("exact", "finite_difference", "none"):
        sampler = strongly_state_dependent(
            mode, scale=1.5, eta=gamma_mode_step, beta_off=1.0, alpha=0.2, c=0.3
        ).double()
        results[mode] = ms.sample(
            sampler, target, 200, 20, init=init, seed=4, progress=False, dtype=torch.float64
        ).theta[-1]
    gamma_effect = (results["exact"] - results["none"]).abs().mean()
    return float((results["finite_difference"] - results["exact"]).abs().mean() / gamma_effect)


def test_quadsat_units_saturate_with_a_continuous_slope():
    # quadsat is bounded like tanh (a unit cannot extrapolate, which ReLU nets did on a larger
    # test network: docs/RESULTS.md), C1 (exact Gamma needs its slope) and division-free.
    from metasampler.learned.nets import coordinate_mlp

    one, zero = torch.ones(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    one_unit = (((one.reshape(1, 1), zero),), (one, zero[0]))  # the unit itself: y = act(x)
    x = torch.linspace(-6.0, 6.0, 4801, dtype=torch.float64, requires_grad=True)
    y, (slope,) = coordinate_mlp(one_unit, [x], "quadsat", "identity", (0,))
    (autograd_slope,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(slope, autograd_slope)
    assert y.abs().max() <= 1.0 and bool((y[x.abs() >= 2] == torch.sign(x[x.abs() >= 2])).all())
    assert slope.diff().abs().max() < 1e-2  # no jump, at the saturation points either
    torch.testing.assert_close(y, -y.flip(0))  # odd, slope 1 at 0: tanh's shape
    assert slope[2400].item() == pytest.approx(1.0)


def test_the_compiled_softplus_is_torchs_to_float32_rounding():
    # Compiled sampling computes f_phiD's softplus and its sigmoid from one exp and a series
    # (#12: inductor's log1p and exp cost more than the nets); it must be the same function
    # over the whole float32 range, tails and 0 included, to within float32's own rounding.
    from metasampler.learned.nets import softplus_fused

    x = torch.cat([torch.linspace(-90.0, 90.0, 180001), torch.tensor([0.0, -0.0, 1e-8, -1e-8])])
    value, sigmoid = softplus_fused(x, slope=True)
    ulp = 1.5e-45  # the spacing of float32's subnormals, where x < -87
    for got, exact, rtol in [(value, torch.nn.functional.softplus(x.double()), 1e-6),
                             (sigmoid, torch.sigmoid(x.double()), 2e-6)]:  # fmt: skip
        assert bool(((got.double() - exact).abs() <= rtol * exact + ulp).all())
    assert softplus_fused(x, slope=False)[1] is None


def test_finite_difference_gamma_approaches_exact_gamma():
    errors = [gamma_error(eta) for eta in (0.04, 0.01, 0.0025)]
    # FD derivatives are secants over one step, whose momentum change is dominated by the
    # O(sqrt(eta)) noise: the error shrinks like sqrt(eta), i.e. by ~4x over a 16x smaller
    # step (measured 0.045 -> 0.024 -> 0.010); a wrong secant would not shrink at all.
    assert errors[2] < errors[1] < errors[0]
    assert errors[2] < 0.4 * errors[0]
    assert errors[0] < 0.2  # and FD is a close approximation already at the largest step


def run_kept(sampler, target) -> torch.Tensor:
    """1000 chains x 180 kept steps (1200 steps, burn-in 300, thinned by 5): ``(180, 1000, D)``."""
    result = run_chains(sampler, target, 1000, 1200, burn_in=300, thin=5, seed=0)
    return result.theta


@pytest.mark.slow
@pytest.mark.parametrize("task", ["gaussian", "banana"])
def test_stationarity_with_state_dependent_nets_and_bias_without_gamma(task):
    # Means are also checked against 5 ESS-based standard errors (measured <= 2 for exact and
    # finite-difference Gamma over 2 seeds; 31 and 59 without Gamma).
    if task == "gaussian":
        case = random_gaussian(dim=5)
        # Monte Carlo standard error of the mean is ~0.005; eta = 0.03 gives an O(eta)
        # variance bias of ~2-3% (measured 0.99-1.03); Gamma-free runs are off by 13-16%.
        mean_tol, var_tol, biased_var = 0.05, 0.07, 0.10
    else:
        case = Banana()
        # The banana's curved, heavier-tailed x2 makes the MC error larger (measured var
        # ratios 0.98-1.07); without Gamma the variances are about halved (0.47-0.56).
        mean_tol, var_tol, biased_var = 0.1, 0.15, 0.3
    target = case.target()
    var_errors = {}
    for mode in ("exact", "finite_difference", "none"):
        sampler = strongly_state_dependent(mode, eta=0.03, beta_off=1.0, c=0.2)
        kept = run_kept(sampler, target)

        def check(kept=kept):
            return check_moments(kept, case.mean, case.cov, mean_atol=mean_tol, var_rtol=var_tol)

        if mode == "none":
            # The same nets without Gamma: measurably biased, and the check above fails.
            must_fail(check, "the chain ran without Gamma")
            var_errors[mode] = moments(kept, case.mean, case.cov).max_var_error
        else:
            var_errors[mode] = check().max_var_error
    assert var_errors["none"] > biased_var, var_errors
    assert var_errors["none"] > 2 * max(var_errors["exact"], var_errors["finite_difference"]), (
        var_errors
    )


def moments_with_and_without_gamma(modes: tuple[str, ...], **nets) -> dict[str, Moments]:
    """State-dependent nets (``nets``: their inputs) on the harness Gaussian, once per Gamma
    mode: the moments must match with Gamma and must not without it (``"none"``). Returns each
    mode's moments."""
    case = random_gaussian(dim=5)
    target = case.target()
    errors = {}
    for mode in modes:
        sampler = strongly_state_dependent(mode, eta=0.03, beta_off=1.0, c=0.2, **nets)
        kept = run_kept(sampler, target)

        def check(kept=kept):
            return check_moments(kept, case.mean, case.cov, mean_atol=0.05, var_rtol=0.07)

        if mode == "none":
            must_fail(check, "the chain ran without Gamma")
        else:
            check()
        errors[mode] = moments(kept, case.mean, case.cov)
    return errors


@pytest.mark.slow
def test_stationarity_with_an_energy_only_curl_and_bias_without_gamma():
    # q_momentum_input=False: Q_f(U) has no momentum derivative, so Gamma_theta = 0, but
    # Gamma_p keeps dQ_f/dU * dU/dtheta and the friction's momentum derivative.
    modes = ("exact", "finite_difference", "none")
    errors = {
        mode: m.max_var_error
        for mode, m in moments_with_and_without_gamma(modes, q_momentum_input=False).items()
    }
    assert errors["none"] > 2 * max(errors["exact"], errors["finite_difference"]), errors


@pytest.mark.slow
def test_stationarity_with_a_positive_clamped_speed_limited_curl_and_bias_without_gamma():
    # q_output="softplus", a momentum input clamped at 1.5 (13 % of the draws beyond it) and
    # a speed limit at 2: Gamma through the softplus, the clamp and the speed factor keeps the
    # target; without Gamma the means are off by many standard errors.
    modes = ("exact", "finite_difference", "none")
    fits = moments_with_and_without_gamma(
        modes, q_output="softplus", momentum_input_clamp=1.5, speed_limit=2.0
    )
    assert fits["none"].kl > 10 * max(fits["exact"].kl, fits["finite_difference"].kl), fits


def test_finite_difference_guards_zero_denominators():
    # A flat energy gives U_t == U_{t-1} exactly: the energy secant has a zero denominator.
    flat = ms.EnergyTarget(lambda x: 0.0 * x.sum(-1), dim=3)
    sampler = strongly_state_dependent("finite_difference", eta=0.05, beta_off=1.0, c=0.1)
    state = sampler.init(torch.zeros(4, 3), flat, torch.Generator().manual_seed(0))
    for _ in range(5):
        state = sampler.step(state, flat, torch.Generator().manual_seed(1))
    state.theta.sum().backward()
    assert torch.isfinite(state.theta).all()
    assert all(torch.isfinite(p.grad).all() for p in sampler.parameters())


def test_non_finite_net_output_stops_with_clear_message():
    target, _ = quadratic_target()
    sampler = NNSGHMC(eta=0.05)
    with torch.no_grad():
        sampler.f_q.head.bias.fill_(float("nan"))
    with pytest.raises(ms.NonFiniteError, match="f_Q output in chain 0 at step 1"):
        ms.sample(sampler, target, 4, 10, progress=False)


def test_non_finite_energy_names_chain_and_step():
    def energy(x):
        return torch.where(x[:, 0] > 50.0, torch.full_like(x[:, 0], float("inf")), (x**2).sum(-1))

    target = ms.EnergyTarget(energy, dim=2)
    init = torch.zeros(3, 2)
    init[2, 0] = 100.0
    with pytest.raises(ms.NonFiniteError, match="energy in chain 2 at step 1"):
        ms.sample(NNSGHMC(eta=0.05), target, 3, 10, init=init, progress=False)


def test_meta_gradient_reaches_net_parameters_and_inputs_are_detached():
    target, _ = quadratic_target()
    sampler = strongly_state_dependent("exact", eta=0.05, beta_off=1.0, c=0.2)
    state = sampler.init(torch.randn(8, 5), target, torch.Generator().manual_seed(0))
    for _ in range(4):
        state = sampler.step(state, target, torch.Generator().manual_seed(2))
    state.theta.pow(2).mean().backward()
    for name, param in sampler.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_bad_arguments_raise_value_errors():
    for kwargs, name in [
        ({"gamma": "fancy"}, "gamma"),
        ({"alpha": -1.0}, "alpha"),
        ({"c": -0.1}, "c"),
        ({"q_clamp": 0.0}, "q_clamp"),
        ({"d_output": "identity"}, "d_output"),
        ({"activation": "gelu"}, "activation"),
    ]:
        with pytest.raises(ValueError, match=name):
            NNSGHMC(eta=0.1, **kwargs)
    with pytest.raises(ValueError, match="eta"):
        NNSGHMC(eta=-0.1)


# -- one step function, several ways to run it (issue #12) ------------------------------------
def run_path(sampler, path, target, init, n_steps=4, grad=False, seed=2):
    """``n_steps`` steps through ``fast`` path ``path``; returns the states' (theta, p)."""
    sampler.step_path = path
    gen = torch.Generator().manual_seed(seed)
    with torch.set_grad_enabled(grad):
        state = sampler.init(init.clone(), target, gen)
        for _ in range(n_steps):
            state = sampler.step(state, target, gen)
    return state


def path_sampler(hidden, gamma, **kwargs) -> NNSGHMC:
    kwargs.setdefault("activation", "tanh")  # (softsign is a case of CURL_INPUTS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = NNSGHMC(q_hidden=hidden, d_hidden=hidden, gamma=gamma, seed=1, **kwargs)
    with torch.no_grad():
        for p in sampler.parameters():
            p.mul_(2.0)
    sampler.momentum_std.fill_(1.3)
    sampler.train_dim.fill_(3)  # r != 1: the prior gradient enters the energy input
    return sampler


#: The curl's inputs besides the energy: the momentum, the stiffness (exact Gamma only).
CURL_INPUTS = {
    "momentum": dict(q_momentum_input=True),
    "energy": dict(q_momentum_input=False),
    "stiffness": dict(q_momentum_input=False, q_stiffness_input=True),
    "momentum+stiffness": dict(q_momentum_input=True, q_stiffness_input=True),
    # the stiffness as the curl's preconditioner, with and without it as an input
    "preconditioned": dict(q_momentum_input=True, precondition_power=0.7),
    "stiffness+preconditioned": dict(
        q_momentum_input=False, q_stiffness_input=True, precondition_power=1.0
    ),
    # not a curl input: the cheap hidden activation (#12), through the same paths
    "momentum+softsign": dict(q_momentum_input=True, activation="softsign"),
    "momentum+quadsat": dict(q_momentum_input=True, activation="quadsat"),
    # the sign-definite curl (q_output="softplus"), as the floor recipe trains it
    "momentum+positive": dict(q_momentum_input=True, activation="softsign", q_output="softplus"),
    # the nets' momentum input clamped where |p_hat| is large (about half the coordinates)
    "momentum+clamped": dict(q_momentum_input=True, momentum_input_clamp=0.8),
    # the curl's speed limit, binding at the momenta of these chains
    "momentum+speed limit": dict(q_momentum_input=True, speed_limit=0.7, q_output="softplus"),
    "energy+speed limit": dict(q_momentum_input=False, speed_limit=0.7),
    # not a curl input: the injected noise less the estimated gradient noise's share
    "momentum+noise estimate": dict(q_momentum_input=True, grad_noise_estimate=True),
    # ... or dissipated as friction, through alpha Q_f^2 (and Gamma's derivative of it)
    "momentum+noise friction": dict(
        q_momentum_input=True, grad_noise_estimate=True, grad_noise_friction=True
    ),
    # not a curl input: mSGNHT's thermostat around the step, carried from step to step
    "momentum+thermostat": dict(q_momentum_input=True, thermostat=True),
}
#: Curl inputs and options that need exact Gamma.
EXACT_ONLY = ("stiffness", "preconditioned", "thermostat")


@pytest.mark.parametrize("hidden", [(6,), (5, 4)])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize(
    ("gamma", "curl"),
    [("exact", curl) for curl in CURL_INPUTS]
    + [
        ("finite_difference", curl)
        for curl in CURL_INPUTS
        if not any(name in curl for name in EXACT_ONLY)
    ],
)
def test_plain_blocked_and_recomputed_steps_agree(hidden, gamma, temperature, curl, monkeypatch):
    from metasampler.learned import fast

    monkeypatch.setattr(fast, "_BLOCK_COORDS", 8)  # several column blocks of 2 coordinates
    target = SplitPriorTarget()
    init = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    kwargs = dict(eta=0.05, beta_off=0.5, alpha=0.2, c=0.1, temperature=temperature)
    kwargs.update(CURL_INPUTS[curl])
    states = {}
    for path, grad in (("plain", False), ("blocks", False), ("recompute", True)):
        sampler = path_sampler(hidden, gamma, **kwargs).double()
        states[path] = run_path(sampler, path, target, init, grad=grad)
    ref = states["plain"]
    assert ref.theta.std() > 0
    for path in ("blocks", "recompute"):
        torch.testing.assert_close(states[path].theta.detach(), ref.theta, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(states[path].momentum.detach(), ref.momentum)


@pytest.mark.parametrize(
    ("gamma", "detach", "thermostat"),
    [("exact", True, False), ("exact", False, False), ("finite_difference", True, False),
     ("finite_difference", False, False), ("exact", True, True), ("exact", False, True)],
)  # fmt: skip
def test_recomputing_backward_equals_autograd_and_finite_differences(
    gamma, detach, thermostat, monkeypatch
):
    # The meta-gradient of a 5-step unroll through the recomputing backward equals autograd
    # through the plain function; with undetached inputs (the exact gradient of the loss) it
    # also equals finite differences of the loss. With the thermostat its state xi is carried
    # from step to step, through the backward too.
    from metasampler.learned import fast

    monkeypatch.setattr(fast, "_BLOCK_COORDS", 8)
    target = SplitPriorTarget()
    init = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    kwargs = dict(eta=0.05, beta_off=0.5, alpha=0.2, c=0.1, detach_inputs=detach)
    kwargs["thermostat"] = thermostat
    sampler = path_sampler((5, 4), gamma, **kwargs).double()

    def loss(path: str) -> torch.Tensor:
        state = run_path(sampler, path, target, init, n_steps=5, grad=True)
        return (state.theta**2).mean() + (state.momentum**3).mean()

    params = list(sampler.parameters())
    grads = {}
    for path in ("plain", "recompute"):
        grads[path] = torch.autograd.grad(loss(path), params)
    for got, expected in zip(grads["recompute"], grads["plain"], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    assert any(g.abs().sum() > 0 for g in grads["recompute"])
    if detach:
        return
    # Finite differences on a few weights of each net.
    with torch.no_grad():
        for param, grad in zip(params, grads["recompute"], strict=True):
            flat, gflat = param.view(-1), grad.view(-1)
            for i in range(min(2, flat.numel())):
                old = float(flat[i])
                flat[i] = old + 1e-6
                up = float(loss("plain"))
                flat[i] = old - 1e-6
                down = float(loss("plain"))
                flat[i] = old
                assert abs((up - down) / 2e-6 - float(gflat[i])) < 1e-6 + 1e-5 * abs(gflat[i])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("gamma", "curl"),
    [("exact", "momentum"), ("finite_difference", "momentum"), ("finite_difference", "energy"),
     ("exact", "stiffness"), ("exact", "preconditioned"),
     ("finite_difference", "momentum+positive"), ("exact", "momentum+thermostat")],
)  # fmt: skip
def test_compiled_training_step_gives_the_plain_meta_gradient(gamma, curl, monkeypatch):
    # The compiled training step (meta-training's train.compile_steps: the compiled step
    # forward, the compiled vjp of the same function backward, over chunks of coordinates) is
    # a transformation of the same function: the meta-gradient of a 5-step unroll equals plain
    # autograd's, with the 12 coordinates cut into chunks of 5, 5 and 2 (and for the
    # energy-only curl, compiled with autograd, whose energy input enters per chain, as (K, 1)).
    from metasampler.learned import fast

    if fast.compile_unavailable(torch.device("cpu")):
        pytest.skip("no compiler for the compiled step")
    monkeypatch.setattr(fast, "_VJP_CHUNK", 5)
    monkeypatch.setattr(fast, "_VJP", {})
    target = SplitPriorTarget()
    init = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sampler = path_sampler(
        (3,), gamma, eta=0.05, beta_off=0.5, alpha=0.2, c=0.1, **CURL_INPUTS[curl]
    ).double()

    def meta_gradient(path: str) -> tuple[torch.Tensor, ...]:
        state = run_path(sampler, path, target, init, n_steps=5, grad=True)
        loss = (state.theta**2).mean() + (state.momentum**3).mean()
        return torch.autograd.grad(loss, list(sampler.parameters()))

    expected = meta_gradient("plain")
    fast._IN_PROCESS.clear()
    got = meta_gradient("compiled")
    assert len(fast._IN_PROCESS) == 1  # the compiled function ran (one configuration)
    # its compiled backward (one per set of inputs needing gradients); an energy-only curl is
    # compiled with autograd instead (fast._recomputing_pays)
    assert bool(fast._VJP) == (curl != "energy")
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-12)
    assert any(g.abs().sum() > 0 for g in got)


@pytest.mark.slow
def test_compiled_training_configurations_do_not_share_a_recompile_budget(monkeypatch):
    # dynamo allows `recompile_limit` compiles per code object; each configuration compiles
    # twice (the first step's chains do not require grad, later ones do). With the limit at 2,
    # two configurations fit only if they do not share a code object (they did, through the
    # frame torch.compile wraps a functools.partial in: the fifth configuration of a process
    # failed at the default limit of 8).
    from metasampler.learned import fast

    if fast.compile_unavailable(torch.device("cpu")):
        pytest.skip("no compiler for the compiled step")
    monkeypatch.setattr(fast, "_IN_PROCESS", {})
    target = SplitPriorTarget()
    init = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    # (config.patch, not monkeypatch: monkeypatch's undo left dynamo's config without the
    # entry, and every later compile in the process failed)
    with torch._dynamo.config.patch(recompile_limit=2):
        for hidden in ((2,), (3,)):
            sampler = path_sampler(hidden, "exact", eta=0.05, beta_off=0.5, c=0.1).double()
            state = run_path(sampler, "compiled", target, init, n_steps=2, grad=True)
            (state.theta**2).mean().backward()
    assert len(fast._IN_PROCESS) == 2
    assert torch._dynamo.config.recompile_limit == 8  # (restored)


# Each compiled case builds a package (~30 s on 2 cores), so the cases combine the options
# that can go together: every curl input and option of CURL_INPUTS is in one of them.
COMPILED_CASES = {
    "momentum+softsign+clamped+noise friction+per step": dict(
        q_momentum_input=True,
        activation="softsign",
        momentum_input_clamp=0.8,
        grad_noise_estimate=True,
        grad_noise_friction=True,  # (the estimate subtracted, and dissipated as friction)
        friction_units="per_step",  # (the shipped MNIST files': a scalar 1 / eta in the step)
    ),
    "momentum+positive+speed limit": CURL_INPUTS["momentum+speed limit"],
    "momentum+quadsat+thermostat": {**CURL_INPUTS["momentum+quadsat"], "thermostat": True},
    "energy": CURL_INPUTS["energy"],
    "stiffness+preconditioned": CURL_INPUTS["stiffness+preconditioned"],
}


#: The compiled cases in the order pytest runs them: the first builds its package in the test
#: (``compile=True`` waits for it); the others are built meanwhile, all at once in the
#: background (:func:`background_builds`), so the five builds overlap on the cores instead
#: of each waiting for the one before it (~180 s of the suite's time on 2 cores before).
COMPILED_PARAMS = [
    ((4,), "exact", "momentum+softsign+clamped+noise friction+per step"),
    ((4,), "finite_difference", "momentum+positive+speed limit"),
    ((3, 3), "exact", "momentum+quadsat+thermostat"),
    ((4,), "finite_difference", "energy"),
    ((4,), "exact", "stiffness+preconditioned"),
]


def compiled_case_sampler(hidden, gamma, case, compile):
    kwargs = dict(eta=0.03, beta_off=1.0, alpha=0.2, c=0.2, **COMPILED_CASES[case])
    return path_sampler(hidden, gamma, compile=compile, **kwargs)


def compiled_case_problem():
    target = random_gaussian(dim=5).target(0.5)
    return target, torch.randn(8, 5, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def background_builds(tmp_path_factory):
    """``(cache directory, {case: (build process, package)})`` for every compiled case but the
    first: the steps of a sampler with the default ``compile`` start each build in the
    background, as a user's first steps do; `aot`'s registries are left as they were found."""
    from metasampler.learned import aot, fast

    if fast.compile_unavailable(torch.device("cpu")):
        pytest.skip("no compiler for the compiled step")
    cache = tmp_path_factory.mktemp("packages")
    started: dict[str, tuple] = {}
    target, init = compiled_case_problem()
    start_build = aot._start
    with pytest.MonkeyPatch.context() as patch:
        empty_package_registries(patch, cache)
        patch.delenv("METASAMPLER_COMPILE", raising=False)
        for hidden, gamma, case in COMPILED_PARAMS[1:]:

            def start(spec, package, case=case):
                started[case] = (start_build(spec, package), package)
                return started[case][0]

            patch.setattr(aot, "_start", start)
            sampler = compiled_case_sampler(hidden, gamma, case, compile=None)
            run_path(sampler, "auto", target, init, n_steps=2)  # (FD builds from its 2nd step)
            assert case in started, f"no build started for {case}"
    yield cache, started
    for build, _ in started.values():
        if build.poll() is None:
            build.terminate()
            build.wait()


@pytest.mark.slow
@pytest.mark.parametrize(("hidden", "gamma", "case"), COMPILED_PARAMS)
def test_compiled_sampling_step_matches_the_eager_step(
    hidden, gamma, case, tmp_path, monkeypatch, background_builds
):
    # compile=True runs the same step function compiled ahead of time (AOTInductor, built in
    # a child process); it must give the eager trajectory up to float32 rounding, must not
    # have fallen back, and a later process (here: a cleared registry) loads the cached
    # package without building it again. The energy-only curl has a one-input f_Q and a
    # per-chain energy input: a package exported with other weight shapes read the wrong
    # weights (session 8). The stiffness input is one more (K, D) input of the package.
    from metasampler.learned import aot

    cache, built = background_builds
    if case in built:  # built in the background: this test's steps must load that package
        build, package = built[case]
        assert build.wait() == 0, package.with_suffix(".log").read_text()[-2000:]
        monkeypatch.setattr(aot, "_start", lambda *a: pytest.fail("rebuilt a package"))
    empty_package_registries(monkeypatch, cache if case in built else tmp_path)
    target, init = compiled_case_problem()
    eager = compiled_case_sampler(hidden, gamma, case, compile=False)
    compiled = compiled_case_sampler(hidden, gamma, case, compile=True)
    expected = run_path(eager, "auto", target, init, n_steps=30)
    got = run_path(compiled, "compiled", target, init, n_steps=30)
    assert len(aot._RUNNERS) == 1 and not aot._FAILED
    if case not in built:
        (package,) = tmp_path.glob("*.pt2")
    # built with its shortcuts, not on the (2x slower) retry
    assert aot.RETRY_NOTICE not in package.with_suffix(".log").read_text()
    torch.testing.assert_close(got.theta, expected.theta, atol=1e-4, rtol=1e-4)
    aot._RUNNERS.clear()
    monkeypatch.setattr(aot, "_start", lambda *a: pytest.fail("rebuilt a cached package"))
    again = run_path(compiled, "compiled", target, init, n_steps=30)
    torch.testing.assert_close(again.theta, got.theta, atol=0, rtol=0)


@pytest.mark.slow
def test_a_package_for_two_threads_runs_its_loop_on_both(tmp_path):
    # Inductor sizes a loop's threads from the export's example sizes: with a tiny example the
    # step for 2 threads was one single-threaded loop (1.7x SGHMC's step, which uses both).
    import zipfile

    from metasampler.learned import aot, fast
    from metasampler.learned.equations import StepConfig

    if fast.compile_unavailable(torch.device("cpu")):
        pytest.skip("no compiler for the compiled step")
    cfg = StepConfig("softsign", "softplus", "exact", True, False, True)
    q_shapes, d_shapes = ((4, 2), (4,), (4,), ()), ((4, 3), (4,), (4,), ())
    spec = aot.KernelSpec(cfg, q_shapes, d_shapes, "float32", "cpu", True, True, False, 2)
    package = tmp_path / "step.pt2"
    # (as the build in the background runs: exiting without the interpreter's teardown)
    command, env = aot._child_command("aot.main", [spec.to_json(), str(package)], True)
    subprocess.run(command, env=env, check=True, capture_output=True)
    assert aot._intact(package)
    with zipfile.ZipFile(package) as archive:
        (kernel,) = [name for name in archive.namelist() if name.endswith("kernel.cpp")]
        assert b"#pragma omp parallel" in archive.read(kernel)


def test_an_altered_compiled_package_is_deleted_not_loaded(tmp_path):
    from metasampler.learned import aot

    package = tmp_path / "step.pt2"
    package.write_bytes(b"compiled code")
    aot._checksum_path(package).write_text(aot._sha256(package))
    assert aot._intact(package)
    package.write_bytes(b"compiled code, altered")
    with pytest.warns(UserWarning, match="does not match its checksum"):
        assert not aot._intact(package)
    assert not package.exists() and not aot._checksum_path(package).exists()
    package.write_bytes(b"no checksum beside it")
    assert not aot._intact(package)


def test_an_unwritable_cache_directory_leaves_the_eager_step(tmp_path, monkeypatch):
    from metasampler.learned import aot, fast

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    empty_package_registries(monkeypatch, blocker / "compiled")
    monkeypatch.setattr(fast, "compile_unavailable", lambda device: None)
    target, _ = quadratic_target()
    init = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    sampler = path_sampler((4,), "exact", eta=0.03, beta_off=1.0, c=0.2, compile=True)
    reference = path_sampler((4,), "exact", eta=0.03, beta_off=1.0, c=0.2, compile=False)
    with pytest.warns(UserWarning, match="cannot start the build"):
        got = ms.sample(sampler, target, 4, 5, init=init, seed=0, progress=False).theta
    expected = ms.sample(reference, target, 4, 5, init=init, seed=0, progress=False).theta
    assert torch.equal(got, expected) and aot._BUILDS == {} and len(aot._FAILED) == 1


class _HeldBuild:
    """Stands in for the build's child process until ``done`` is set."""

    def __init__(self, spec):
        self.spec, self.done, self.returncode = spec, False, None

    def poll(self):
        self.returncode = 0 if self.done else None
        return self.returncode

    def wait(self, timeout=None):
        self.done = True
        return self.poll()


def test_default_compiles_in_the_background_and_switches_when_ready(monkeypatch):
    # The dispatch without a compiler: the build is held until the first steps have run
    # eagerly, and the "package" runs the uncompiled flat entry point.
    from metasampler.learned import aot, fast

    monkeypatch.delenv("METASAMPLER_COMPILE", raising=False)
    monkeypatch.setattr(fast, "compile_unavailable", lambda device: None)
    empty_package_registries(monkeypatch)
    builds, calls = [], []

    def start(spec, package):
        builds.append(_HeldBuild(spec))
        return builds[-1]

    def load(key, package):
        def runner(*flat):
            calls.append(key)
            return aot.step_from_flat(builds[-1].spec, *flat)

        aot._RUNNERS[key] = runner
        return runner

    monkeypatch.setattr(aot, "_start", start)
    monkeypatch.setattr(aot, "_intact", lambda package: bool(builds) and builds[-1].done)
    monkeypatch.setattr(aot, "_load", load)
    target, _ = quadratic_target(noise=0.5)
    init = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    sampler = path_sampler((4,), "exact", eta=0.03, beta_off=1.0, c=0.2)
    reference = path_sampler((4,), "exact", eta=0.03, beta_off=1.0, c=0.2, compile=False)
    gen, ref_gen = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    with torch.no_grad():
        state = sampler.init(init.clone(), target, gen)
        ref = reference.init(init.clone(), target, ref_gen)
        for _ in range(2):  # do not wait for the build
            state = sampler.step(state, target, gen)
            ref = reference.step(ref, target, ref_gen)
        assert calls == [] and len(builds) == 1 and len(aot._BUILDS) == 1
        builds[0].done = True
        for _ in range(3):
            state = sampler.step(state, target, gen)
            ref = reference.step(ref, target, ref_gen)
    assert len(calls) == 3 and len(builds) == 1 and aot._BUILDS == {}
    torch.testing.assert_close(state.theta, ref.theta)


def test_eager_steps_leave_a_core_to_a_running_build(monkeypatch):
    # The build compiles on one core; this process's OpenMP threads spinning against it made an
    # eager step 3x slower on 2 cores, and the target's gradient on both cores slowed the build
    # from ~19 to ~32 s. While it runs, eager steps (gradient and update) use one thread fewer,
    # and the user's setting comes back after each step; with no build running, it is unchanged.
    from types import SimpleNamespace

    from metasampler.learned import aot, fast

    threads, running = [], {"build": True}
    monkeypatch.delenv("METASAMPLER_COMPILE", raising=False)
    monkeypatch.setattr(fast, "compile_unavailable", lambda device: None)
    build = SimpleNamespace(poll=lambda: None if running["build"] else 0)
    monkeypatch.setattr(aot, "_BUILDS", {"a package": build})
    monkeypatch.setattr(aot, "run", lambda args, wait: None)  # (still building)
    eager = fast.run_blocks
    monkeypatch.setattr(
        fast, "run_blocks", lambda a: threads.append(torch.get_num_threads()) or eager(a)
    )
    target, _ = quadratic_target()
    init = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    sampler = path_sampler((4,), "exact", eta=0.03, beta_off=1.0, c=0.2)
    gradient_threads, evaluate = [], sampler.evaluate
    sampler.evaluate = lambda *a: gradient_threads.append(torch.get_num_threads()) or evaluate(*a)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        run_path(sampler, "auto", target, init, n_steps=2)
        assert threads == [2, 2] and gradient_threads[-2:] == [2, 2]
        assert torch.get_num_threads() == 3
        running["build"] = False
        run_path(sampler, "auto", target, init, n_steps=2)
        assert threads[2:] == [3, 3] and gradient_threads[-2:] == [3, 3]
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_without_a_compiler_the_eager_step_runs_after_a_notice(monkeypatch, capsys):
    from metasampler.learned import aot, fast

    monkeypatch.delenv("METASAMPLER_COMPILE", raising=False)
    monkeypatch.setattr(fast.shutil, "which", lambda name: None)
    monkeypatch.setattr(fast, "_NOTICE_GIVEN", False)
    monkeypatch.setattr(aot, "_BUILDS", {})
    target, _ = quadratic_target()
    init = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    sampler = path_sampler((4,), "exact", eta=0.03, beta_off=1.0, c=0.2)
    reference = path_sampler((4,), "exact", eta=0.03, beta_off=1.0, c=0.2, compile=False)
    got = ms.sample(sampler, target, 4, 5, init=init, seed=0, progress=False).theta
    expected = ms.sample(reference, target, 4, 5, init=init, seed=0, progress=False).theta
    assert torch.equal(got, expected) and aot._BUILDS == {}
    err = capsys.readouterr().err
    assert err.count("metasampler: NNSGHMC runs its eager step (no C++ compiler") == 1


@pytest.mark.parametrize("compile", [None, True, False])
def test_a_gpu_compiles_in_process_in_a_thread_by_default(compile, monkeypatch):
    # On CUDA the ahead-of-time package crashed the process at its first call (H200, torch
    # 2.11, speed/device_check.py): off the CPU no package is built. By default a thread
    # compiles the step in this process while eager steps run; compile=True compiles in this
    # process and waits; compile=False stays eager.
    from types import SimpleNamespace

    from metasampler.learned import aot, fast
    from metasampler.learned.equations import StepArgs, StepConfig

    ran = []
    monkeypatch.delenv("METASAMPLER_COMPILE", raising=False)
    monkeypatch.setattr(fast, "_THREAD_DEVICES", frozenset({"meta"}))  # (stands in for cuda)
    monkeypatch.setattr(fast, "compile_unavailable", lambda device: None)
    monkeypatch.setattr(fast, "run_blocks", lambda args: ran.append("eager"))
    monkeypatch.setattr(fast, "run_compiled_in_process", lambda *a: ran.append("compiled"))
    monkeypatch.setattr(fast, "run_thread_default", lambda args: ran.append("thread"))
    monkeypatch.setattr(aot, "run", lambda *a, **k: pytest.fail("built a package off the CPU"))
    cfg = StepConfig("tanh", "softplus", "exact", per_step=False, clamp_d=False, detach=True)
    net = (((torch.ones(2, 2), torch.ones(2)),), (torch.ones(2), torch.ones(())))
    x = torch.zeros(3, 4, device="meta")  # (a device that is not the CPU)
    args = StepArgs(x, x, x, None, x, None, None, net, net, {}, cfg)
    sampler = SimpleNamespace(step_path="auto", use_compile=compile)
    for _ in range(2):
        fast.run(args, sampler)
    assert ran == {None: ["thread"] * 2, True: ["compiled"] * 2, False: ["eager"] * 2}[compile]


def _finished_child(returncode: int, state: dict | None = None):
    """A stand-in for a child process, finished with ``returncode`` once ``state["done"]``."""
    from types import SimpleNamespace

    state = {"done": True} if state is None else state
    rc = lambda *_: returncode if state["done"] else None  # noqa: E731
    return SimpleNamespace(poll=rc, wait=rc, returncode=returncode)


def _fake_children(monkeypatch, fast, make) -> list:
    """``fast._start_child`` replaced by one that registers ``make()``; returns the keys."""
    started = []

    def start(key, spec, args):
        started.append(key)
        fast._CHILDREN[key] = make(), Path("child.log")

    monkeypatch.setattr(fast, "_start_child", start)
    return started


def test_the_thread_compiles_once_the_child_is_done_and_eager_steps_took_what_it_costs(
    monkeypatch,
):
    # The first step starts a child process (it fills the compile's caches); a thread compiles
    # here only once the child is done and the configuration's eager steps have taken
    # _THREAD_AFTER_SECONDS (ski rental; a fake clock: each eager step takes 1 s); compiled
    # steps follow once the thread is done (the "compile" here is instant and the compiled
    # step the plain one).
    from types import SimpleNamespace

    from metasampler.learned import fast
    from metasampler.learned.equations import nnsghmc_update

    ran, clock, child = [], iter(range(1000)), {"done": False}
    monkeypatch.delenv("METASAMPLER_COMPILE", raising=False)
    monkeypatch.setattr(fast, "compile_unavailable", lambda device: None)
    monkeypatch.setattr(fast, "_THREAD_DEVICES", frozenset({"cpu"}))
    monkeypatch.setattr(fast, "_THREAD_AFTER_SECONDS", 2.5)
    for name in ("_CHILDREN", "_WARMING", "_EAGER_SECONDS"):
        monkeypatch.setattr(fast, name, {})
    started = _fake_children(monkeypatch, fast, lambda: _finished_child(0, child))
    monkeypatch.setattr(fast, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    monkeypatch.setattr(fast, "_warm_up", lambda spec, flat, done: done.set_result(None))
    eager, plain = fast.run_blocks, nnsghmc_update
    monkeypatch.setattr(fast, "run_blocks", lambda a: ran.append("eager") or eager(a))
    monkeypatch.setattr(fast, "run_compiled_in_process", lambda a, *_: ran.append("c") or plain(*a))
    target, _ = quadratic_target()
    init = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    sampler = path_sampler((4,), "exact", eta=0.03, beta_off=1.0, c=0.2, q_momentum_input=True)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        state = sampler.init(init, target, gen)
        for step in range(8):
            child["done"] = step >= 5  # (its eager steps passed 2.5 s at the 4th step)
            state = sampler.step(state, target, gen)
            assert len(started) == 1 and len(fast._WARMING) == (step >= 5)
            fast.wait_for_compiles()
        assert ran == ["eager"] * 6 + ["c"] * 2
        # other chains' shape: another compile, so another child and eager steps (timed afresh)
        more = sampler.init(torch.cat([init, init[:2]]), target, gen)
        sampler.step(more, target, gen)
    assert ran[-1] == "eager" and len(started) == 2 and len(fast._WARMING) == 1


def test_a_failed_child_leaves_eager_steps_with_one_notice(monkeypatch, capsys):
    from metasampler.learned import fast

    monkeypatch.delenv("METASAMPLER_COMPILE", raising=False)
    monkeypatch.setattr(fast, "compile_unavailable", lambda device: None)
    monkeypatch.setattr(fast, "_THREAD_DEVICES", frozenset({"cpu"}))
    monkeypatch.setattr(fast, "_NOTICE_GIVEN", False)
    for name in ("_CHILDREN", "_WARMING", "_EAGER_SECONDS"):
        monkeypatch.setattr(fast, name, {})
    _fake_children(monkeypatch, fast, lambda: _finished_child(1))
    monkeypatch.setattr(fast, "_start_thread", lambda *a: pytest.fail("compiled after a failure"))
    target, _ = quadratic_target()
    init = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    sampler = path_sampler((4,), "exact", eta=0.03, beta_off=1.0, c=0.2, q_momentum_input=True)
    expected = run_path(sampler, "blocks", target, init, n_steps=4)
    got = run_path(sampler, "auto", target, init, n_steps=4)
    torch.testing.assert_close(got.theta, expected.theta, atol=0, rtol=0)
    err = capsys.readouterr().err
    assert err.count("NNSGHMC runs its eager step (its compile failed") == 1
    assert "in a child process, exit 1" in err


@pytest.fixture
def thread_compiling(monkeypatch, tmp_path):
    """The GPU's default on the CPU: a child process fills the compile's caches (empty, in
    ``tmp_path``), then a thread compiles the step in this process; returns
    :mod:`metasampler.learned.fast`."""
    from metasampler.learned import fast

    if fast.compile_unavailable(torch.device("cpu")):
        pytest.skip("no compiler for the compiled step")
    monkeypatch.delenv("METASAMPLER_COMPILE", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("METASAMPLER_CACHE_DIR", str(tmp_path / "metasampler"))
    monkeypatch.setattr(fast, "_THREAD_DEVICES", frozenset({"cpu"}))
    monkeypatch.setattr(fast, "_THREAD_AFTER_SECONDS", 0.0)  # (once the child is done)
    for name in ("_CHILDREN", "_WARMING", "_EAGER_SECONDS", "_IN_PROCESS"):
        monkeypatch.setattr(fast, name, {})
    return fast


@pytest.mark.slow
def test_the_thread_compiled_step_takes_over_from_eager_steps_and_agrees(
    thread_compiling, monkeypatch
):
    # The GPU's default, run on the CPU: the first step starts the child process and runs
    # eagerly; once the child is done, a step starts the thread; once it has compiled, the
    # steps run the compiled function (a spy counts its calls), and the trajectory equals the
    # eager one to float rounding. The thread's compile found the child's in inductor's cache,
    # and the steps use the function it compiled (no second compile: dynamo guards on the
    # inputs' types, and a net's Parameter once compiled the step again). Finite differences:
    # the child's inputs include the cache, and the first step (no history) is never compiled.
    from torch._dynamo.utils import counters

    gamma = "finite_difference"

    fast = thread_compiling
    calls = []
    compiled = fast.run_compiled_in_process
    monkeypatch.setattr(fast, "run_compiled_in_process", lambda *a: calls.append(1) or compiled(*a))
    target, _ = quadratic_target()
    init = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    kwargs = dict(eta=0.03, beta_off=1.0, c=0.2, q_momentum_input=True)
    sampler, reference = path_sampler((4,), gamma, **kwargs), path_sampler((4,), gamma, **kwargs)
    reference.use_compile = False
    gen, ref_gen = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)

    def both_step():
        return sampler.step(state, target, gen), reference.step(expected, target, ref_gen)

    hits, misses = (
        counters["inductor"]["fxgraph_cache_hit"],
        counters["inductor"]["fxgraph_cache_miss"],
    )
    graphs = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        state = sampler.init(init.clone(), target, gen)
        expected = reference.init(init.clone(), target, ref_gen)
        while not fast._CHILDREN:  # (finite differences: not at the first step, no history)
            state, expected = both_step()
        fast.wait_for_compiles()  # the child
        assert not fast._WARMING
        state, expected = both_step()  # starts the thread
        assert calls == [] and fast._WARMING  # the steps so far ran eagerly
        fast.wait_for_compiles()  # the thread
        for _ in range(5):
            state, expected = both_step()
    assert len(calls) == 5  # every step after the compile finished
    assert counters["inductor"]["fxgraph_cache_hit"] == hits + 1
    assert counters["inductor"]["fxgraph_cache_miss"] == misses
    assert counters["stats"]["unique_graphs"] == graphs + 1
    torch.testing.assert_close(state.theta, expected.theta, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state.momentum, expected.momentum, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_no_compiled_function_is_called_while_a_thread_compiles(thread_compiling, monkeypatch):
    # dynamo's tracing state is global: on an H200 a compiled step called while the thread
    # compiled another configuration failed ("FX to symbolically trace a dynamo-optimized
    # function") and the process aborted. A step asked to be compiled waits for the thread.
    import threading

    fast = thread_compiling
    compiled, asking = fast._compiled, threading.Event()

    def guarded(spec):  # a compiled function that checks no thread compiles when this one runs
        fn = compiled(spec)

        def call(*flat):
            if threading.current_thread() is threading.main_thread():
                assert not fast._warming_up(), "a compiled function ran while a thread compiled"
            else:  # the thread's compile is held until the main thread asks for a compiled step
                asking.wait(timeout=5)
            return fn(*flat)

        return call

    monkeypatch.setattr(fast, "_compiled", guarded)
    _fake_children(monkeypatch, fast, lambda: _finished_child(0))  # (the thread starts at once)
    target, _ = quadratic_target()
    init = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    kwargs = dict(eta=0.03, beta_off=1.0, c=0.2, q_momentum_input=True)
    warming = path_sampler((4,), "exact", **kwargs)  # no flags: compiles in a thread
    run_path(warming, "auto", target, init, n_steps=1)
    assert fast._warming_up()
    asked = path_sampler((3,), "exact", **kwargs)  # another configuration, compiled here
    asking.set()
    got = run_path(asked, "compiled", target, init, n_steps=3, grad=True)
    expected = run_path(asked, "plain", target, init, n_steps=3, grad=True)
    torch.testing.assert_close(got.theta, expected.theta, atol=1e-4, rtol=1e-4)
    assert not fast._warming_up() and len(fast._IN_PROCESS) == 2


# -- d_clamp, grad_input, friction_units (issue #11 item 2) --------------------------------------
@pytest.mark.parametrize("friction_units", ["absolute", "per_step"])
def test_exact_gamma_of_the_clamped_friction_equals_brute_force_jacobian(friction_units):
    target = SplitPriorTarget()
    sampler = split_prior_sampler(grad_input="per_datum", friction_units=friction_units)
    gen = torch.Generator().manual_seed(3)
    points = [
        (torch.randn(1, 3, generator=gen, dtype=torch.float64), torch.randn(1, 3, generator=gen))
        for _ in range(6)
    ]
    points = [(theta, p.double()) for theta, p in points]
    unclamped = torch.cat([sampler.drift_terms(t, p, target).d for t, p in points]).flatten()
    middle = unclamped.detach().sort().values[8:10]
    sampler.d_clamp = float(middle.mean())  # binds on half the coordinates, none at the edge
    clamped = 0
    for theta, p in points:
        expected = brute_force_gamma(sampler, target, theta, p)
        terms = sampler.drift_terms(theta.clone().requires_grad_(True), p, target)
        got = torch.cat([terms.gamma_theta[0], terms.gamma_p[0]])
        torch.testing.assert_close(got.detach(), expected, atol=1e-10, rtol=1e-8)
        assert float(terms.d.detach().max()) <= sampler.d_clamp
        clamped += int((terms.d == sampler.d_clamp).sum())
    assert clamped == 9  # of 18


def test_per_step_friction_is_eta_times_d_independent_of_eta():
    target = SplitPriorTarget()
    theta = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p = torch.randn(4, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    per_step = split_prior_sampler(friction_units="per_step")
    absolute = split_prior_sampler()
    friction = [eta * per_step.drift_terms(theta, p, target, eta=eta).d for eta in (0.1, 0.01)]
    torch.testing.assert_close(friction[0], friction[1], rtol=1e-12, atol=0)
    # It is the absolute D_f at unit step; the absolute D_f itself ignores eta.
    torch.testing.assert_close(friction[0], absolute.drift_terms(theta, p, target).d)
    d_abs = [absolute.drift_terms(theta, p, target, eta=eta).d for eta in (0.1, 0.01)]
    torch.testing.assert_close(d_abs[0], d_abs[1], rtol=0, atol=0)
    # The step uses it: one noise-free step with per-step units at eta equals an absolute
    # step whose D_f is divided by eta (here through c, alpha and s_D scaled by 1/eta).
    eta = 0.02
    scaled = split_prior_sampler(alpha=0.3 / eta, c=0.1 / eta, d_output_scale=1.0 / eta)
    per_step.eta = scaled.eta = eta
    steps = []
    for sampler in (per_step, scaled):
        sampler.temperature = 0.0
        state = sampler.init(theta.clone(), target)
        state.momentum = p.clone()
        steps.append(sampler.step(state, target).momentum)
    torch.testing.assert_close(steps[0], steps[1], rtol=1e-10, atol=1e-12)


def test_per_datum_gradient_input_is_scaled_by_n_not_by_the_statistic():
    target = SplitPriorTarget()  # N = 3
    theta = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p = torch.randn(4, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    per_datum = split_prior_sampler(grad_input="per_datum", grad_input_scale=7.0)
    reference = split_prior_sampler(grad_input_scale=7.0)
    reference.grad_std.fill_(target.n_data)  # standardised with sigma_g = N: s_g * grad / N
    d = per_datum.drift_terms(theta, p, target).d
    torch.testing.assert_close(d, reference.drift_terms(theta, p, target).d, rtol=1e-12, atol=0)
    per_datum.grad_std.fill_(123.0)  # the calibrated statistic plays no part
    torch.testing.assert_close(d, per_datum.drift_terms(theta, p, target).d, rtol=0, atol=0)
    reference.grad_std.fill_(0.6)
    assert not torch.allclose(d, reference.drift_terms(theta, p, target).d)


def test_new_constants_are_validated():
    for kwargs, name in [
        ({"d_clamp": 0.0}, "d_clamp"),
        ({"d_clamp": float("inf")}, "d_clamp"),
        ({"grad_input": "raw"}, "grad_input"),
        ({"friction_units": "per_datum"}, "friction_units"),
    ]:
        with pytest.raises(ValueError, match=name):
            NNSGHMC(eta=0.1, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("gamma", ["exact", "finite_difference"])
def test_stationarity_with_binding_friction_clamp(gamma):
    # The nets' D_f has median ~1.07 on this target: a clamp at 1.0 binds on about half the
    # coordinates. Gamma of the clamped D_f keeps the chain exact.
    case = random_gaussian(dim=5)
    target = case.target()
    sampler = strongly_state_dependent(gamma, eta=0.03, beta_off=1.0, c=0.2, d_clamp=1.0)
    kept = run_kept(sampler, target)
    check_moments(kept, case.mean, case.cov, mean_atol=0.05, var_rtol=0.07)
    theta = ms.sample(sampler, target, 200, 300, seed=1, progress=False).theta[-1]
    d = sampler.drift_terms(theta, torch.randn(theta.shape), target).d
    assert 0.2 < float((d == 1.0).double().mean()) < 0.8  # the clamp really binds


def test_calibrate_measures_the_input_statistics_of_its_run():
    # N(0, 9 I) in 4-D, chains started at exact samples with an SGHMC-like sampler: the
    # gradient x / 9 has RMS 1/3, the momentum RMS 1 (T = 1), the energy |x|^2 / 18 mean 2 and
    # standard deviation sqrt(2) (half a chi-square with 4 degrees of freedom).
    case = diagonal_gaussian((9.0, 9.0, 9.0, 9.0))
    # (a start drawn with another seed than the chains': with the same, the momentum would be
    # drawn equal to theta / 3 and push every chain outwards)
    init = 3.0 * torch.randn(400, 4, generator=torch.Generator().manual_seed(7))
    sampler = NNSGHMC(eta=0.05, beta_off=1.0, c=1.0, d_output_scale=0.0)
    with torch.no_grad():
        sampler.f_q.head.weight.zero_()
        sampler.f_q.head.bias.zero_()
    stats = sampler.calibrate(case.target(), n_chains=400, n_steps=50, init=init, energy=True)
    assert stats["grad_std"] == pytest.approx(1 / 3, rel=0.05)
    assert stats["momentum_std"] == pytest.approx(1.0, rel=0.05)
    assert stats["energy_loc"] == pytest.approx(2.0, rel=0.05)
    assert stats["energy_std"] == pytest.approx(2**0.5, rel=0.1)
    assert float(sampler.grad_std) == pytest.approx(stats["grad_std"])


def test_the_package_is_built_with_fmas_and_exact_steps_as_one_loop():
    # The compiled package's speed rests on two inductor settings (BENCHMARKS.md, session 18)
    # and its first build's time on two more (sessions 28 and 30): a torch that renamed them
    # would drop them silently (unknown keys are skipped), so this pins that the installed
    # torch still has them all, and which steps get which.
    from metasampler.learned import aot
    from metasampler.learned.equations import StepConfig

    def options(gamma: str) -> dict:
        return aot.inductor_options(StepConfig("softsign", "softplus", gamma, True, False, True))

    contract = {
        "cpp.enable_floating_point_contract_flag": "fast",
        "cpp.vec_isa_ok": True,
        "aot_inductor.precompile_headers": False,
        "aot_inductor.compile_wrapper_opt_level": "O0",
    }
    assert options("exact") == {**contract, "max_fusion_size": 1 << 16}
    assert options("finite_difference") == contract


def test_a_build_that_fails_with_its_shortcuts_is_retried_without_them(
    tmp_path, monkeypatch, capsys
):
    # Packages skip inductor's compile probes of the CPU's vector ISA and its extensions
    # (~10 + 3 s of a first build) and divide floats from the reciprocal estimate; a compiler
    # that cannot target the ISA the CPU reports (or reject the estimate's code) must still get
    # a package, built with the probes (which then pick an ISA it can target) and exact
    # division, not an eager fallback. Inductor keeps its ISA choice for the life of a process,
    # so the retry runs in a fresh interpreter.
    from torch._inductor import cpu_vec_isa
    from torch._inductor.codegen.cpp import CppVecOverrides

    from metasampler.learned import aot, vector_division
    from metasampler.learned.equations import StepConfig

    calls, check_build = [], cpu_vec_isa.VecISA.check_build

    def compile_and_package(program, package_path, inductor_configs):
        fast = CppVecOverrides.reciprocal is vector_division.reciprocal
        no_extension_probes = cpu_vec_isa.VecISA.check_build is not check_build
        calls.append((inductor_configs.get("cpp.vec_isa_ok"), fast, no_extension_probes))
        if inductor_configs.get("cpp.vec_isa_ok") or fast:
            raise RuntimeError("g++: error: unrecognized command-line option '-mavx512f'")
        Path(package_path).write_bytes(b"package")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compile_and_package)
    cfg = StepConfig("softsign", "softplus", "exact", True, False, True)
    q_shapes, d_shapes = ((4, 2), (4,), (4,), ()), ((4, 3), (4,), (4,), ())  # one layer of 4
    spec = aot.KernelSpec(cfg, q_shapes, d_shapes, "float32", "cpu", True, True, False, 1)
    package = tmp_path / "step.pt2"
    retries = []

    def run(command, env):  # (the fresh interpreter, here in this process)
        retries.append(command[3:])
        return subprocess.CompletedProcess(command, aot.main(command[3:]))

    monkeypatch.setattr(aot.subprocess, "run", run)
    assert aot.main([spec.to_json(), str(package)]) == 0
    assert calls == [(True, True, True), (None, False, False)]
    assert retries == [[spec.to_json(), str(package), aot.NO_SHORTCUTS]]
    assert aot.RETRY_NOTICE in capsys.readouterr().out
    assert package.read_bytes() == b"package" and aot._intact(package)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step.pt2", "step.sha256"]
    assert CppVecOverrides.reciprocal is not vector_division.reciprocal  # (restored)
    assert cpu_vec_isa.VecISA.check_build is check_build
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # (a build without shortcuts is not retried)
        aot.main([spec.to_json(), str(package), aot.NO_SHORTCUTS])
    assert len(retries) == 1


def test_fast_float_division_is_division_to_a_few_ulp():
    # The compiled step's divisions (vector_division): on an AVX-512 CPU inductor's code must
    # use the estimate (else the speed-up is gone), and the quotients must stay within a few
    # float32 ulp of exact division over divisors of every magnitude the step sees. Divisions
    # of scalars (the step's 1 / eta) keep inductor's scalar code.
    from torch._inductor.utils import run_and_get_code

    from metasampler.learned.vector_division import fast_float_division

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(4099, generator=gen) * 10.0 ** torch.randint(-6, 7, (4099,), generator=gen)
    b = 1.0 + a.abs()  # softsign's divisor, >= 1
    s = torch.tensor([0.3, 7.0])

    def divisions(a, b, s):
        return b.reciprocal(), a / b, a * b.reciprocal(), a * s[0].reciprocal() + s[0] / s[1]

    torch._dynamo.reset()
    with fast_float_division(), torch._inductor.config.patch(fx_graph_cache=False):
        (rec, quo, soft, scalars), code = run_and_get_code(
            torch.compile(divisions, dynamic=False), a, b, s
        )
    torch._dynamo.reset()
    ulp = torch.finfo(torch.float32).eps
    assert ((rec - 1.0 / b).abs() <= 2 * ulp * (1.0 / b)).all()
    assert ((quo - a / b).abs() <= 3 * ulp * (a / b).abs()).all()
    assert ((soft - a / b).abs() <= 3 * ulp * (a / b).abs()).all()
    torch.testing.assert_close(scalars, a * (1 / s[0]) + s[0] / s[1])
    if torch.backends.cpu.get_cpu_capability() == "AVX512":
        assert "_mm512_rcp14_ps" in "".join(code)


def test_a_package_loads_without_the_isa_probes(tmp_path, monkeypatch):
    # AOTInductor's loader compares the package's CPU ISA with this CPU's (for a warning), and
    # finding this CPU's ISA compiles inductor's probes in the user's process: with a fresh
    # inductor cache that stalled the sampling loop ~15 s (the ISA) and ~3 s (bf16/VNNI/AMX).
    from torch._inductor import codecache, cpu_vec_isa

    from metasampler.learned import aot

    probes = []
    monkeypatch.setattr(cpu_vec_isa, "pick_vec_isa", lambda: probes.append("probed"))

    def load(path):  # (what the loader asks before it loads the package)
        return torch._inductor.codecache.get_device_information("cpu")

    monkeypatch.setattr(torch._inductor, "aoti_load_package", load)
    monkeypatch.setattr(aot, "_RUNNERS", {})
    compare = codecache.get_device_information
    assert aot._load("key", tmp_path / "step.pt2") == {}
    assert probes == [] and codecache.get_device_information is compare  # (restored)


def test_a_package_built_for_another_cpu_has_another_key(monkeypatch):
    # Kernels are compiled with -march=native: a cache directory shared by machines with
    # different CPUs must not hand one a package built on another (illegal instructions).
    from metasampler.learned import aot
    from metasampler.learned.equations import StepConfig

    cfg = StepConfig("softsign", "softplus", "exact", True, False, True)
    q_shapes, d_shapes = ((4, 2), (4,), (4,), ()), ((4, 3), (4,), (4,), ())
    spec = aot.KernelSpec(cfg, q_shapes, d_shapes, "float32", "cpu", True, True, False, 1)
    keys = []
    for cpu in ("x86_64 AVX512 model name : A", "x86_64 AVX512 model name : B"):
        monkeypatch.setattr(aot, "_cpu_identity", lambda cpu=cpu: cpu)
        aot.KernelSpec.digest.cache_clear()
        keys.append(spec.digest())
    aot.KernelSpec.digest.cache_clear()
    assert keys[0] != keys[1]
