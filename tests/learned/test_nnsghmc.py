"""NNSGHMC: reduction to SGHMC, exact and finite-difference Gamma, stationarity, the friction
per step, and the ways a step runs (plain, in blocks, recomputed, compiled).

Two designs are tested throughout: the default (``curl_input="stiffness"`` inside a
thermostat, exact Gamma) and the sampler of Gong et al. (2019) (``curl_input="momentum"``,
``thermostat=False``, exact or finite-difference Gamma)."""

from __future__ import annotations

import math
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
from compiled_packages import empty_package_registries
from statistical import (
    Z_MEAN,
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

#: The two designs: the default one, and the paper's sampler (the only one finite-difference
#: Gamma serves).
DEFAULT = dict(curl_input="stiffness", thermostat=True)
PAPER = dict(curl_input="momentum", thermostat=False)


def quadratic_target(dim: int = 5, seed: int = 0, noise: float = 0.0) -> tuple:
    """The harness's random zero-mean Gaussian: its target and its covariance."""
    case = random_gaussian(dim, seed)
    return case.target(noise), case.cov


class SplitPriorTarget:
    """A target whose energy has a likelihood part and a Gaussian prior part, with ``N = 3``:
    exercises the per-datum energy and gradient inputs and the ``D_train / D_test`` prior
    scaling."""

    dim = 3
    n_data = 3

    def evaluate(self, theta, generator=None, create_graph=False):
        def likelihood(x):
            return 0.5 * ((x - 1.0) ** 2).sum(-1) + 0.1 * (x**4).sum(-1)

        lik, lik_grad = energy_and_grad(likelihood, theta, create_graph)
        prior = 0.5 * (theta**2).sum(-1) / 4.0
        prior_grad = theta / 4.0
        if not create_graph:
            prior, prior_grad = prior.detach(), prior_grad.detach()
        return Evaluation(lik + prior, lik_grad + prior_grad, prior, prior_grad)


def strongly_state_dependent(gamma: str, scale: float = 2.5, **kwargs) -> NNSGHMC:
    """Random nets whose outputs vary strongly with their inputs (so Gamma is large); tanh
    units, with which the tolerances below were measured. The curl's head bias is raised by 1,
    so ``Q_f`` is mostly positive and the chains move."""
    kwargs.setdefault("activation", "tanh")
    kwargs.setdefault("compile", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (gamma="none" warns)
        sampler = NNSGHMC(q_hidden=(16,), d_hidden=(16,), gamma=gamma, seed=1, **kwargs)
    with torch.no_grad():
        for p in sampler.parameters():
            p.mul_(scale)
        sampler.f_q.head.bias.add_(1.0)
    return sampler


def sghmc_like(friction: float, eta: float, **kwargs) -> NNSGHMC:
    """``Q_f = 1`` and ``D_f = friction`` everywhere: SGHMC written as NNSGHMC (each head's
    weights zero, its bias the value: ``f_D = 1`` and ``eta D_f = s_D``); no thermostat
    unless asked for."""
    kwargs.setdefault("thermostat", False)
    kwargs.setdefault("compile", False)
    sampler = NNSGHMC(eta=eta, alpha=0.0, friction_scale=friction * eta, **kwargs)
    with torch.no_grad():
        sampler.f_q.head.weight.zero_()
        sampler.f_q.head.bias.fill_(1.0)
        sampler.f_d.head.weight.zero_()
        sampler.f_d.head.bias.fill_(math.log(math.e - 1.0))  # softplus(b) = 1
    return sampler


@pytest.mark.parametrize(
    ("gamma", "design"),
    [("exact", DEFAULT), ("exact", PAPER), ("finite_difference", PAPER)],
    ids=["default", "paper-exact", "paper-finite_difference"],
)
def test_reduces_to_sghmc_exactly(gamma, design):
    # Constant nets have no derivatives: Gamma is 0 and the step is SGHMC's, step for step.
    target, _ = quadratic_target(noise=0.5)
    init = torch.randn(10, 5, generator=torch.Generator().manual_seed(1))
    reference = ms.sample(
        SGHMC(eta=0.05, friction=0.7), target, 10, 200, init=init, seed=3, progress=False
    )
    sampler = sghmc_like(0.7, 0.05, gamma=gamma, curl_input=design["curl_input"])
    result = ms.sample(sampler, target, 10, 200, init=init, seed=3, progress=False)
    torch.testing.assert_close(result.theta, reference.theta, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_a_thermostat_removes_unknown_gradient_noise_heat_and_gamma_is_still_needed():
    # Gradient noise N(0, 36), not told to the sampler: the default design's nets without the
    # thermostat run 6.4 times too hot. The thermostat's feedback takes the heat out without
    # knowing the noise (measured variance ratio 1.08-1.11: the noise also reaches the nets'
    # inputs); without noise it leaves the target in place (1.00-1.02), and without Gamma the
    # chains stay biased (means 10-11 standard errors off).
    case = random_gaussian(dim=5)
    runs = {  # gamma, gradient noise, thermostat, variance tolerance (None: must fail)
        "noisy, no thermostat": ("exact", 6.0, False, None),
        "noisy, thermostat": ("exact", 6.0, True, 0.15),
        "thermostat": ("exact", 0.0, True, 0.05),
        "thermostat, no Gamma": ("none", 0.0, True, None),
    }
    for name, (gamma, noise, thermostat, var_rtol) in runs.items():
        sampler = strongly_state_dependent(
            gamma, eta=0.03, curl_input="stiffness", thermostat=thermostat
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
    sampler = sghmc_like(friction_per_step / 0.1, 0.1, thermostat=True)  # SGHMC, thermostat
    kept = ms.sample(
        sampler, target, 500, 1500, burn_in=500, thin=10, seed=0, progress=False,
        init=torch.zeros(500, 4),
    ).theta  # fmt: skip
    assert abs(kept.var().item() - 1.0) < 0.06


@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("curl_input", ["stiffness", "momentum"])
def test_the_thermostat_step_is_the_plain_step_between_two_friction_halves(temperature, curl_input):
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
        sampler = strongly_state_dependent(
            "exact", eta=eta, curl_input=curl_input, thermostat=thermostat
        ).double()
        sampler.temperature = temperature
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
        NNSGHMC(eta=0.03, gamma="finite_difference", curl_input="momentum", thermostat=True)
    sampler = NNSGHMC(eta=0.03, gamma="finite_difference", **PAPER)
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
        else:
            assert "xi" not in state.extras
        momenta[thermostat] = sampler.step(state, target, generator).momentum
    assert (momenta[True].abs() < momenta[False].abs()).all()


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
    settings = dict(eta=0.05, alpha=0.3, friction_scale=0.02, q_hidden=(8,), d_hidden=(7,))
    sampler = NNSGHMC(seed=2, compile=False, **{**settings, **kwargs}).double()
    sampler.momentum_std.fill_(1.7)
    sampler.train_dim.fill_(6)
    with torch.no_grad():
        for param in sampler.parameters():
            param.mul_(2.0)
    return sampler


#: The stiffness statistic ``V`` of one chain of :class:`SplitPriorTarget` (a constant of z).
GRAD_SQ = torch.tensor([[0.5, 30.0, 4.0]], dtype=torch.float64)


@pytest.mark.parametrize(
    ("hidden", "curl_input", "activation"),
    [((8,), "momentum", "tanh"), ((8, 6), "momentum", "tanh"), ((8,), "stiffness", "tanh"),
     ((8, 6), "stiffness", "tanh"), ((8, 6), "momentum", "softsign"),
     ((8,), "stiffness", "softsign"), ((8,), "momentum", "sigmoid"),
     ((8,), "momentum", "softplus"), ((8,), "stiffness", "quadsat"),
     ((8, 6), "momentum", "quadsat")],
)  # fmt: skip
def test_exact_gamma_equals_brute_force_jacobian(hidden, curl_input, activation):
    torch.manual_seed(0)
    target = SplitPriorTarget()
    # Non-trivial input statistics and prior scaling: every factor must enter the chain rule.
    sampler = split_prior_sampler(
        q_hidden=hidden, grad_input_scale=1.3, activation=activation, curl_input=curl_input
    )
    sampler.energy_loc.fill_(0.2)
    sampler.energy_std.fill_(2.0)
    # The stiffness input comes from a chain's past gradients: a constant of z.
    kwargs = {"grad_sq": GRAD_SQ} if curl_input == "stiffness" else {}
    for _ in range(3):
        theta = torch.randn(1, 3, dtype=torch.float64)
        p = torch.randn(1, 3, dtype=torch.float64)
        expected = brute_force_gamma(sampler, target, theta, p, **kwargs)
        terms = sampler.drift_terms(theta.clone().requires_grad_(True), p, target, **kwargs)
        got = torch.cat([terms.gamma_theta[0], terms.gamma_p[0]])
        torch.testing.assert_close(got.detach(), expected, atol=1e-10, rtol=1e-8)
        assert expected.abs().max() > 1e-2  # the test is not comparing zeros
        if curl_input == "stiffness":  # Q_f(u, s) does not see p: no Gamma_theta
            assert terms.gamma_theta.abs().max() == 0


def gamma_error(gamma_mode_step: float) -> float:
    """Run exact and FD samplers on the same stream; return the max difference in theta after
    one step relative to the size of the Gamma contribution."""
    target, _ = quadratic_target(dim=4, seed=3)
    init = torch.randn(200, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    results = {}
    for mode in ("exact", "finite_difference", "none"):
        # (the same dynamics at every step: the friction per step scales with it)
        per_step = dict(alpha=0.2 * gamma_mode_step, friction_scale=0.3 * gamma_mode_step)
        sampler = strongly_state_dependent(
            mode, scale=1.5, eta=gamma_mode_step, **per_step, **PAPER
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
    # (inductor's log1p and exp cost more than the nets); it must be the same function
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
    # step (measured 0.051 -> 0.023 -> 0.009); a wrong secant would not shrink at all.
    assert errors[2] < errors[1] < errors[0]
    assert errors[2] < 0.4 * errors[0]
    assert errors[0] < 0.2  # and FD is a close approximation already at the largest step


def run_kept(sampler, target) -> torch.Tensor:
    """1000 chains x 180 kept steps (1200 steps, burn-in 300, thinned by 5): ``(180, 1000, D)``.
    The burn-in is the warm-up: the default design's stiffness statistic is fixed after it."""
    result = run_chains(sampler, target, 1000, 1200, burn_in=300, thin=5, seed=0)
    return result.theta


#: (task, design, step, mean tolerance, variance tolerance) of the stationarity test.
STATIONARITY_CASES = {
    # The random Gaussian: Monte Carlo standard error of the mean ~0.005. The paper's sampler
    # at eta = 0.015: variance ratios 0.98-1.03 (exact and finite-difference Gamma, 2 seeds;
    # at eta = 0.03 the O(eta) bias is 1.03-1.09); without Gamma 0.63-0.65, means 23-25
    # standard errors off.
    "gaussian, paper": ("gaussian", PAPER, 0.015, 0.05, 0.07),
    # The default design: variance ratios 0.99-1.02; without Gamma the means are 14-15
    # standard errors off (variances 1.03-1.06: the thermostat holds the momentum at T).
    "gaussian, default": ("gaussian", DEFAULT, 0.015, 0.05, 0.07),
    # The banana's curved, heavier-tailed x2 makes the MC error larger (measured variance
    # ratios 0.96-1.05 at eta = 0.03); without Gamma the variances are about halved
    # (0.44-0.57), means 57-59 standard errors off.
    "banana, paper": ("banana", PAPER, 0.03, 0.1, 0.15),
}


@pytest.mark.slow
@pytest.mark.parametrize("case_name", list(STATIONARITY_CASES))
def test_stationarity_with_state_dependent_nets_and_bias_without_gamma(case_name):
    # Means are also checked against 5 ESS-based standard errors (measured <= 3 with Gamma).
    task, design, eta, mean_tol, var_tol = STATIONARITY_CASES[case_name]
    case = random_gaussian(dim=5) if task == "gaussian" else Banana()
    target = case.target()
    modes = ("exact", "finite_difference", "none") if design is PAPER else ("exact", "none")
    fits = {}
    for mode in modes:
        sampler = strongly_state_dependent(mode, eta=eta, **design)
        kept = run_kept(sampler, target)

        def check(kept=kept):
            return check_moments(kept, case.mean, case.cov, mean_atol=mean_tol, var_rtol=var_tol)

        if mode == "none":
            # The same nets without Gamma: measurably biased, and the check above fails.
            must_fail(check, "the chain ran without Gamma")
            fits[mode] = moments(kept, case.mean, case.cov)
        else:
            fits[mode] = check()
    assert fits["none"].mean_z > 2 * Z_MEAN, fits["none"]
    if design is PAPER:
        errors = {mode: fit.max_var_error for mode, fit in fits.items()}
        assert errors["none"] > 3 * max(errors["exact"], errors["finite_difference"]), errors


def moments_with_and_without_gamma(
    modes: tuple[str, ...], eta: float = 0.015, **nets
) -> dict[str, Moments]:
    """State-dependent nets (``nets``: the design's arguments) on the harness Gaussian, once
    per Gamma mode: the moments must match with Gamma and must not without it (``"none"``).
    Returns each mode's moments."""
    case = random_gaussian(dim=5)
    target = case.target()
    errors = {}
    for mode in modes:
        sampler = strongly_state_dependent(mode, eta=eta, **nets)
        kept = run_kept(sampler, target)

        def check(kept=kept):
            return check_moments(kept, case.mean, case.cov, mean_atol=0.05, var_rtol=0.07)

        if mode == "none":
            must_fail(check, "the chain ran without Gamma")
        else:
            check()
        errors[mode] = moments(kept, case.mean, case.cov)
    return errors


def test_finite_difference_guards_zero_denominators():
    # A flat energy gives U_t == U_{t-1} exactly: the energy secant has a zero denominator.
    flat = ms.EnergyTarget(lambda x: 0.0 * x.sum(-1), dim=3)
    sampler = strongly_state_dependent("finite_difference", eta=0.05, **PAPER)
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


@pytest.mark.parametrize("design", [DEFAULT, PAPER], ids=["default", "paper"])
def test_meta_gradient_reaches_net_parameters(design):
    target, _ = quadratic_target()
    sampler = strongly_state_dependent("exact", eta=0.05, **design)
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
        ({"friction_scale": -0.1}, "friction_scale"),
        ({"friction_scale": float("inf")}, "friction_scale"),
        ({"grad_input_scale": 0.0}, "grad_input_scale"),
        ({"curl_input": "energy"}, "curl_input"),
        ({"thermostat": 1}, "thermostat"),
        ({"activation": "gelu"}, "activation"),
    ]:
        with pytest.raises(ValueError, match=name):
            NNSGHMC(eta=0.1, **kwargs)
    with pytest.raises(ValueError, match="eta"):
        NNSGHMC(eta=-0.1)
    with pytest.raises(TypeError, match=r"unknown argument\(s\) \['c'\]"):
        NNSGHMC(eta=0.1, c=0.2)


# -- one step function, several ways to run it ------------------------------------------------
def run_path(sampler, path, target, init, n_steps=4, grad=False, seed=2):
    """``n_steps`` steps through ``fast`` path ``path``; returns the final state."""
    sampler.step_path = path
    gen = torch.Generator().manual_seed(seed)
    with torch.set_grad_enabled(grad):
        state = sampler.init(init.clone(), target, gen)
        for _ in range(n_steps):
            state = sampler.step(state, target, gen)
    return state


def path_sampler(hidden, gamma, **kwargs) -> NNSGHMC:
    kwargs.setdefault("activation", "tanh")  # (softsign is a case of DESIGNS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = NNSGHMC(q_hidden=hidden, d_hidden=hidden, gamma=gamma, seed=1, **kwargs)
    with torch.no_grad():
        for p in sampler.parameters():
            p.mul_(2.0)
        sampler.f_q.head.bias.add_(1.0)
    sampler.momentum_std.fill_(1.3)
    sampler.train_dim.fill_(2)  # r != 1: the prior gradient enters the energy input
    return sampler


#: What the curl sees and whether a thermostat runs around the step.
DESIGNS = {
    "stiffness+thermostat": DEFAULT,  # the default design
    "momentum": PAPER,  # the paper's sampler
    "stiffness": dict(curl_input="stiffness", thermostat=False),
    "momentum+thermostat": dict(curl_input="momentum", thermostat=True),
    # not a curl input: the hidden activation, through the same paths
    "stiffness+thermostat+softsign": {**DEFAULT, "activation": "softsign"},
    "momentum+quadsat": {**PAPER, "activation": "quadsat"},
}


def fd_allowed(design: dict) -> bool:
    """Finite-difference Gamma serves the momentum curl without a thermostat only."""
    return design["curl_input"] == "momentum" and not design["thermostat"]


@pytest.mark.parametrize("hidden", [(6,), (5, 4)])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize(
    ("gamma", "design"),
    [("exact", name) for name in DESIGNS]
    + [("finite_difference", name) for name, d in DESIGNS.items() if fd_allowed(d)],
)
def test_plain_blocked_and_recomputed_steps_agree(hidden, gamma, temperature, design, monkeypatch):
    from metasampler.learned import fast

    monkeypatch.setattr(fast, "_BLOCK_COORDS", 8)  # several column blocks of 2 coordinates
    target = SplitPriorTarget()
    init = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    kwargs = dict(eta=0.05, alpha=0.2, friction_scale=0.01, temperature=temperature)
    kwargs.update(DESIGNS[design])
    states = {}
    for path, grad in (("plain", False), ("blocks", False), ("recompute", True)):
        sampler = path_sampler(hidden, gamma, **kwargs).double()
        states[path] = run_path(sampler, path, target, init, grad=grad)
    ref = states["plain"]
    assert ref.theta.std() > 0
    for path in ("blocks", "recompute"):
        torch.testing.assert_close(states[path].theta.detach(), ref.theta, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(states[path].momentum.detach(), ref.momentum)
        for key, value in ref.extras.items():  # the thermostat, V, the secants' cache
            torch.testing.assert_close(states[path].extras[key].detach(), value)


@pytest.mark.parametrize(
    ("gamma", "design"),
    [("exact", "stiffness+thermostat"), ("exact", "momentum"), ("finite_difference", "momentum"),
     ("exact", "momentum+thermostat")],
)  # fmt: skip
def test_recomputing_backward_equals_autograd(gamma, design, monkeypatch):
    # The meta-gradient of a 5-step unroll through the recomputing backward equals autograd
    # through the plain function. With the thermostat its state xi is carried from step to
    # step, through the backward too.
    from metasampler.learned import fast

    monkeypatch.setattr(fast, "_BLOCK_COORDS", 8)
    target = SplitPriorTarget()
    init = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    kwargs = dict(eta=0.05, alpha=0.2, friction_scale=0.01, **DESIGNS[design])
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
    assert all(g.abs().sum() > 0 for g in grads["recompute"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("gamma", "design"),
    [("exact", "stiffness+thermostat"), ("exact", "momentum"), ("finite_difference", "momentum")],
)  # fmt: skip
def test_compiled_training_step_gives_the_plain_meta_gradient(gamma, design, monkeypatch):
    # The compiled training step (meta-training's train.compile_steps: the compiled step
    # forward, the compiled vjp of the same function backward, over chunks of coordinates) is
    # a transformation of the same function: the meta-gradient of a 5-step unroll equals plain
    # autograd's, with the 12 coordinates cut into chunks of 5, 5 and 2.
    from metasampler.learned import fast

    if fast.compile_unavailable(torch.device("cpu")):
        pytest.skip("no compiler for the compiled step")
    monkeypatch.setattr(fast, "_VJP_CHUNK", 5)
    monkeypatch.setattr(fast, "_VJP", {})
    target = SplitPriorTarget()
    init = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sampler = path_sampler(
        (3,), gamma, eta=0.05, alpha=0.2, friction_scale=0.01, **DESIGNS[design]
    ).double()

    def meta_gradient(path: str) -> tuple[torch.Tensor, ...]:
        state = run_path(sampler, path, target, init, n_steps=5, grad=True)
        loss = (state.theta**2).mean() + (state.momentum**3).mean()
        return torch.autograd.grad(loss, list(sampler.parameters()))

    expected = meta_gradient("plain")
    fast._IN_PROCESS.clear()
    got = meta_gradient("compiled")
    assert len(fast._IN_PROCESS) == 1  # the compiled function ran (one configuration)
    assert fast._VJP  # and its compiled backward (one per set of inputs needing gradients)
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
            sampler = path_sampler(hidden, "exact", eta=0.05, friction_scale=0.01).double()
            state = run_path(sampler, "compiled", target, init, n_steps=2, grad=True)
            (state.theta**2).mean().backward()
    assert len(fast._IN_PROCESS) == 2
    assert torch._dynamo.config.recompile_limit == 8  # (restored)


# Each compiled case builds a package (~30 s on 2 cores), so the cases combine the options
# that can go together: each curl input, the thermostat, both Gamma modes and the activations.
COMPILED_CASES = {
    "stiffness+thermostat+softsign": DESIGNS["stiffness+thermostat+softsign"],  # the default
    "momentum": DESIGNS["momentum"],  # the paper's, with finite-difference Gamma
    "momentum+quadsat+thermostat": {**DESIGNS["momentum+thermostat"], "activation": "quadsat"},
}


#: The compiled cases in the order pytest runs them: the first builds its package in the test
#: (``compile=True`` waits for it); the others are built meanwhile, all at once in the
#: background (:func:`background_builds`), so the builds overlap on the cores instead of each
#: waiting for the one before it.
COMPILED_PARAMS = [
    ((4,), "exact", "stiffness+thermostat+softsign"),
    ((4,), "finite_difference", "momentum"),
    ((3, 3), "exact", "momentum+quadsat+thermostat"),
]


def compiled_case_sampler(hidden, gamma, case, compile):
    kwargs = dict(eta=0.03, alpha=0.2, **COMPILED_CASES[case])
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
    # package without building it again. The stiffness input is one more (K, D) input of the
    # package, and the thermostat's xi one more state.
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
    cfg = StepConfig("softsign", "exact", True, curl_momentum=False, thermostat=True)
    q_shapes, d_shapes = ((4, 2), (4,), (4,), ()), ((4, 3), (4,), (4,), ())
    spec = aot.KernelSpec(cfg, q_shapes, d_shapes, "float32", "cpu", True, True, False, 2, True)
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
    sampler = path_sampler((4,), "exact", eta=0.03, compile=True)
    reference = path_sampler((4,), "exact", eta=0.03, compile=False)
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
    sampler = path_sampler((4,), "exact", eta=0.03)
    reference = path_sampler((4,), "exact", eta=0.03, compile=False)
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
    sampler = path_sampler((4,), "exact", eta=0.03)
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
    sampler = path_sampler((4,), "exact", eta=0.03)
    reference = path_sampler((4,), "exact", eta=0.03, compile=False)
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
    cfg = StepConfig("tanh", "exact", detach=True)
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
    sampler = path_sampler((4,), "exact", eta=0.03, **PAPER)
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
    sampler = path_sampler((4,), "exact", eta=0.03, **PAPER)
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
    kwargs = dict(eta=0.03, **PAPER)
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
    kwargs = dict(eta=0.03, **PAPER)
    warming = path_sampler((4,), "exact", **kwargs)  # no flags: compiles in a thread
    run_path(warming, "auto", target, init, n_steps=1)
    assert fast._warming_up()
    asked = path_sampler((3,), "exact", **kwargs)  # another configuration, compiled here
    asking.set()
    got = run_path(asked, "compiled", target, init, n_steps=3, grad=True)
    expected = run_path(asked, "plain", target, init, n_steps=3, grad=True)
    torch.testing.assert_close(got.theta, expected.theta, atol=1e-4, rtol=1e-4)
    assert not fast._warming_up() and len(fast._IN_PROCESS) == 2


# -- the friction per step and the per-datum inputs -------------------------------------------
def net_outputs(sampler: NNSGHMC, target, theta: torch.Tensor, p: torch.Tensor, g_scale: float):
    """``Q_f`` and ``f_phiD`` evaluated by the nets themselves on the documented inputs: the
    energy input, ``p / sigma_p`` and the gradient times ``g_scale`` (the curl sees the
    momentum)."""
    ev = target.evaluate(theta, None)
    u, _ = sampler._energy_input(ev, target)
    p_hat = p / float(sampler.momentum_std)
    with torch.no_grad():
        q, _ = sampler.f_q([u, p_hat])
        f_d, _ = sampler.f_d([u, p_hat, g_scale * ev.grad])
    return q.clamp(-5.0, 5.0), f_d, ev.grad


def test_the_friction_is_per_step_whatever_the_step():
    # eta D_f = alpha Q_f^2 + s_D f_phiD: the same friction per step at any eta. A noise-free
    # step (T = 0: no noise, no Gamma) uses it: p' = (1 - eta D_f) p - eta Q_f grad U.
    target = SplitPriorTarget()
    theta = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p = torch.randn(4, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    sampler = split_prior_sampler(alpha=0.3, friction_scale=0.02, **PAPER)
    per_step = [eta * sampler.drift_terms(theta, p, target, eta=eta).d for eta in (0.1, 0.01)]
    torch.testing.assert_close(per_step[0], per_step[1], rtol=1e-12, atol=0)
    q, f_d, grad = net_outputs(sampler, target, theta, p, sampler.grad_input_scale / 3)
    torch.testing.assert_close(per_step[0], 0.3 * q**2 + 0.02 * f_d, rtol=1e-12, atol=0)
    assert float((0.3 * q**2).min()) > 0 and float(f_d.min()) > 0  # both terms present
    eta = 0.02
    sampler.eta, sampler.temperature = eta, 0.0
    state = sampler.init(theta.clone(), target)
    state.momentum = p.clone()
    got = sampler.step(state, target).momentum
    torch.testing.assert_close(got, (1.0 - per_step[0]) * p - eta * q * grad)


def test_the_gradient_input_is_per_datum():
    # The diffusion net sees s_g * grad U / N (N = 3 here), not the raw gradient.
    target = SplitPriorTarget()
    theta = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p = torch.randn(4, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    sampler = split_prior_sampler(grad_input_scale=7.0, alpha=0.0, **PAPER)
    eta_d = sampler.eta * sampler.drift_terms(theta, p, target).d
    _, per_datum, _ = net_outputs(sampler, target, theta, p, 7.0 / 3)
    torch.testing.assert_close(eta_d, sampler.friction_scale * per_datum, rtol=1e-12, atol=0)
    _, raw, _ = net_outputs(sampler, target, theta, p, 7.0)
    assert not torch.allclose(eta_d, sampler.friction_scale * raw)


def test_calibrate_measures_the_input_statistics_of_its_run():
    # N(0, 9 I) in 4-D, chains started at exact samples with SGHMC (constant nets): the
    # momentum RMS is 1 (T = 1); the energy input of an energy without data is per coordinate,
    # |x|^2 / 18 / 4: mean 1/2 and standard deviation sqrt(2) / 4 (half a chi-square with 4
    # degrees of freedom, over 4).
    case = diagonal_gaussian((9.0, 9.0, 9.0, 9.0))
    # (a start drawn with another seed than the chains': with the same, the momentum would be
    # drawn equal to theta / 3 and push every chain outwards)
    init = 3.0 * torch.randn(400, 4, generator=torch.Generator().manual_seed(7))
    sampler = sghmc_like(1.0, 0.05)
    stats = sampler.calibrate(case.target(), n_chains=400, n_steps=50, init=init, energy=True)
    assert stats["momentum_std"] == pytest.approx(1.0, rel=0.05)
    assert stats["energy_loc"] == pytest.approx(0.5, rel=0.05)
    assert stats["energy_std"] == pytest.approx(2**0.5 / 4, rel=0.1)
    assert float(sampler.momentum_std) == pytest.approx(stats["momentum_std"])
    assert float(sampler.energy_std) == pytest.approx(stats["energy_std"])


def test_the_package_is_built_with_fmas_and_exact_steps_as_one_loop():
    # The compiled package's speed rests on two inductor settings (BENCHMARKS.md) and its
    # first build's time on two more: a torch that renamed them would drop them silently
    # (unknown keys are skipped), so this pins that the installed torch still has them all,
    # and which steps get which.
    from metasampler.learned import aot
    from metasampler.learned.equations import StepConfig

    def options(gamma: str) -> dict:
        return aot.inductor_options(StepConfig("softsign", gamma, True, curl_momentum=True))

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
    cfg = StepConfig("softsign", "exact", True, curl_momentum=False, thermostat=True)
    q_shapes, d_shapes = ((4, 2), (4,), (4,), ()), ((4, 3), (4,), (4,), ())  # one layer of 4
    spec = aot.KernelSpec(cfg, q_shapes, d_shapes, "float32", "cpu", True, True, False, 1, True)
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

    cfg = StepConfig("softsign", "exact", True, curl_momentum=False, thermostat=True)
    q_shapes, d_shapes = ((4, 2), (4,), (4,), ()), ((4, 3), (4,), (4,), ())
    spec = aot.KernelSpec(cfg, q_shapes, d_shapes, "float32", "cpu", True, True, False, 1, True)
    keys = []
    for cpu in ("x86_64 AVX512 model name : A", "x86_64 AVX512 model name : B"):
        monkeypatch.setattr(aot, "_cpu_identity", lambda cpu=cpu: cpu)
        aot.KernelSpec.digest.cache_clear()
        keys.append(spec.digest())
    aot.KernelSpec.digest.cache_clear()
    assert keys[0] != keys[1]
