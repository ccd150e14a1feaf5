"""Toy tasks: exact densities, closed-form gradients, exact samples and moments.

Reference values come from independent routes (scipy.stats, autograd, explicit sums,
fine-grid quadrature, numpy root finding), never from the code under test.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.special import logsumexp

import metasampler as ms
import tasks
from metasampler import EnergyTarget
from tasks.linear_regression import linear_regression
from tasks.logistic_regression import logistic_regression
from tasks.toy import (
    BananaTask,
    DoubleWell,
    GaussianMixtureTask,
    GaussianTask,
    gaussian,
    gaussian_2d,
    mixture_4,
    mixture_25,
    paper_test_gaussian,
    paper_train_gaussian,
)


def _points(dim: int, n: int = 64, scale: float = 3.0, shift: float = 0.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return shift + scale * torch.randn(n, dim, generator=g, dtype=torch.float64)


def _close(got: torch.Tensor, ref: torch.Tensor, rtol: float = 1e-7, atol: float = 0.0) -> None:
    # numpy comparison: torch.testing.assert_close imports torch.distributed (~5 s)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    np.testing.assert_allclose(got.detach().double().numpy(), ref.detach().double().numpy(),
                               rtol=rtol, atol=atol)  # fmt: skip


def _autograd(task, theta: torch.Tensor) -> torch.Tensor:
    x = theta.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(task.energy(x).sum(), x)
    return g


@functools.cache
def _all_tasks():  # built once: the tasks are never mutated
    return {
        "gauss_identity": gaussian(3),
        "gauss_diagonal": gaussian(5, mean=1.0, cov="diagonal", seed=3),
        "gauss_correlated": gaussian(6, mean=-2.0, cov="correlated", seed=4),
        "paper_test": paper_test_gaussian(),
        "double_well": DoubleWell(),
        "mixture_25": mixture_25(),
        "mixture_4": mixture_4(),
        "mixture_weighted": GaussianMixtureTask(
            [[0.0, 1.0], [2.0, -1.0], [-3.0, 0.5]], 0.3, weights=[0.2, 0.5, 0.3]
        ),  # fmt: skip
        "banana": BananaTask(a=1.3, b=0.7, s=0.8),
    }


# -- Gaussians ----------------------------------------------------------------------------
@pytest.mark.parametrize("cov", ["identity", "diagonal", "correlated", "wishart"])
def test_gaussian_log_density_matches_scipy(cov):
    task = gaussian(7, mean=[0.5 * i for i in range(7)], cov=cov, seed=11, eig_floor=0.05)
    x = _points(7)
    ref = stats.multivariate_normal(task.mean.numpy(), task.cov.numpy()).logpdf(x.numpy())
    # normalised log density: float64 agreement to ~1e-12; a missing 0.5, a wrong log-det
    # or a transposed precision shows as O(1) errors.
    np.testing.assert_allclose(task.log_density(x).numpy(), ref, rtol=0, atol=1e-9)
    # energy = -log pdf up to one constant shared by all points
    diff = task.energy(x).numpy() + ref
    np.testing.assert_allclose(diff, diff[0], rtol=0, atol=1e-9)
    # precision really is the inverse covariance
    eye = task.precision @ task.cov
    np.testing.assert_allclose(eye.numpy(), np.eye(7), atol=1e-10)


def test_gaussian_exact_samples_have_stated_moments():
    task = paper_test_gaussian()
    n = 100_000
    x = task.sample(n, torch.Generator().manual_seed(0))
    assert x.shape == (n, 20) and x.dtype == torch.float64
    # per-coordinate mean within 5 standard errors sqrt(Sigma_ii / n)
    se = torch.sqrt(torch.diagonal(task.cov) / n)
    assert bool(((x.mean(0) - task.mean).abs() < 5 * se).all())
    # KL of the Gaussian fit: for exact samples 2n KL ~ chi2 with D(D+3)/2 = 230 dof, i.e.
    # KL = 1.15e-3 +- 1e-4;
    # a sampler drawing L^T z instead of L z (cov L^T L != Sigma) gives KL > 1.
    kl = task.kl_from_samples(x)
    assert 0 <= kl < 2e-3, kl
    wrong = task.mean + torch.randn(n, 20, generator=torch.Generator().manual_seed(1),
                                    dtype=torch.float64) @ task.cov_cholesky  # fmt: skip
    assert task.kl_from_samples(wrong) > 0.1


def test_kl_from_moments_matches_independent_formula():
    task = gaussian(4, mean=[1.0, -1.0, 0.0, 2.0], cov="correlated", seed=2)
    assert abs(task.kl_from_moments(task.mean, task.cov)) < 1e-12
    other = gaussian(4, mean=0.5, cov="wishart", seed=5, wishart_scale=0.8, eig_floor=0.1)
    m0, s0 = other.mean.numpy(), other.cov.numpy()
    m1, s1 = task.mean.numpy(), task.cov.numpy()
    inv1 = np.linalg.inv(s1)
    ref = 0.5 * (
        np.trace(inv1 @ s0)
        + (m1 - m0) @ inv1 @ (m1 - m0)
        - 4
        + np.linalg.slogdet(s1)[1]
        - np.linalg.slogdet(s0)[1]
    )
    assert task.kl_from_moments(other.mean, other.cov) == pytest.approx(ref, rel=1e-10)


def test_paper_gaussians_settings_and_reproducibility():
    torch.manual_seed(123)  # the global RNG must not matter
    train, test = paper_train_gaussian(), paper_test_gaussian()
    torch.manual_seed(999)
    train2, test2 = paper_train_gaussian(0), paper_test_gaussian(0)
    assert train.dim == 10 and test.dim == 20
    for task in (train, test):
        assert torch.equal(task.mean, torch.full((task.dim,), 3.0, dtype=torch.float64))
        assert torch.equal(task.cov, task.cov.T)
        assert float(task.eigenvalues[0]) > 0
    # same seed -> bit-identical; another seed -> another covariance
    assert torch.equal(train.cov, train2.cov) and torch.equal(test.cov, test2.cov)
    assert not torch.allclose(train.cov, paper_train_gaussian(1).cov)
    assert not torch.allclose(test.cov, paper_test_gaussian(1).cov)
    # training: diagonal, variances in [0.1, 1] with both ends attained (documented)
    var = torch.diagonal(train.cov)
    assert torch.equal(train.cov, torch.diag(var))
    assert float(var.min()) == pytest.approx(0.1) and float(var.max()) == pytest.approx(1.0)
    assert len(set(var.tolist())) == 10
    # test: genuinely correlated, spectrum floored at 0.02 and close to the reference's
    # (0.021 ... 25.5); a diagonal or identity covariance would fail the correlation check.
    sd = torch.sqrt(torch.diagonal(test.cov))
    corr = test.cov / torch.outer(sd, sd) - torch.eye(20, dtype=torch.float64)
    assert float(corr.abs().max()) > 0.4
    eig = test.eigenvalues
    assert float(eig[0]) == pytest.approx(0.02, rel=1e-9)
    assert 15 < float(eig[-1]) < 40
    for seed in range(1, 4):
        assert float(paper_test_gaussian(seed).eigenvalues[0]) >= 0.02 * (1 - 1e-9)


def test_gaussian_constructor_spectra():
    diag = gaussian(6, cov="diagonal", seed=1, eig_range=(0.5, 8.0))
    assert torch.equal(diag.cov, torch.diag(torch.diagonal(diag.cov)))
    corr = gaussian(6, cov="correlated", seed=1, eig_range=(0.5, 8.0))
    # same spectrum, rotated; condition number exactly hi / lo
    np.testing.assert_allclose(corr.eigenvalues.numpy(), diag.eigenvalues.numpy(), rtol=1e-12)
    assert corr.condition_number == pytest.approx(16.0, rel=1e-10)
    assert float(corr.cov.abs().sub(torch.diag(torch.diagonal(corr.cov))).max()) > 0.1
    ident = gaussian(3, mean=2.0)
    assert torch.equal(ident.cov, torch.eye(3, dtype=torch.float64))
    var = gaussian(3, cov=torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(var.cov, torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)))
    g2 = gaussian_2d(mean=(1.0, 2.0), std=(2.0, 0.5), rho=-0.6)
    ref = torch.tensor([[4.0, -0.6], [-0.6, 0.25]], dtype=torch.float64)
    assert torch.allclose(g2.cov, ref, atol=1e-15) and g2.dim == 2


# -- gradients and targets ----------------------------------------------------------------
@pytest.mark.parametrize("name", list(_all_tasks()))
def test_closed_form_grad_matches_autograd(name):
    task = _all_tasks()[name]
    # spread points widely: far from every mode (mixture softmax saturation), in the wells
    # and barrier (double well), on the banana's curved arms.
    x = torch.cat([_points(task.dim, scale=s, seed=i) for i, s in enumerate((0.3, 2.0, 6.0))])
    ref = _autograd(task, x)
    got = task.grad(x)
    assert got.shape == x.shape
    # float64: agreement to rounding; any wrong coefficient or sign is O(1) relative
    _close(got, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["paper_test", "double_well", "mixture_25", "banana"])
def test_target_matches_task_in_requested_dtype(name):
    task = _all_tasks()[name]
    target = task.target(dtype=torch.float32)
    assert isinstance(target, EnergyTarget) and target.grad_fn is not None
    assert target.dim == task.dim and target.grad_noise_std == 0.0
    x64 = _points(task.dim, n=32, scale=2.0)
    ev = target.evaluate(x64.float())
    assert ev.grad.dtype == torch.float32 and ev.energy.dtype == torch.float32
    # float32 evaluation of the same formula: relative error ~1e-6
    _close(ev.energy.double(), task.energy(x64), rtol=1e-5, atol=1e-4)
    _close(ev.grad.double(), task.grad(x64), rtol=1e-5, atol=1e-4)
    # the autograd path (create_graph=True, second-order meta-training) agrees
    x = x64.clone().requires_grad_(True)
    ev2 = task.target(dtype=torch.float64).evaluate(x, create_graph=True)
    assert ev2.grad.requires_grad
    _close(ev2.grad.detach(), task.grad(x64), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("sigma", [0.0, 0.7, 1.0])
def test_gradient_noise_has_requested_std(sigma):
    task = paper_train_gaussian()
    target = task.target(grad_noise_std=sigma, dtype=torch.float64)
    x = _points(10, n=10_000, scale=1.0, shift=3.0)
    ev = target.evaluate(x, torch.Generator().manual_seed(0))
    noise = ev.grad - task.grad(x)
    # 100k draws: the sample std has relative standard error 1/sqrt(2n) = 0.22%, so 2% is
    # ~9 SE; a variance-for-std mix-up (0.49 vs 0.7) fails; the mean is 0 within 5 SE.
    if sigma == 0:
        assert torch.equal(noise, torch.zeros_like(noise))
    else:
        assert float(noise.std()) == pytest.approx(sigma, rel=0.02)
        assert abs(float(noise.mean())) < 5 * sigma / math.sqrt(noise.numel())
    # reproducible from the generator
    ev2 = target.evaluate(x, torch.Generator().manual_seed(0))
    assert torch.equal(ev.grad, ev2.grad)


@pytest.mark.parametrize("sigma", [0.0, 0.7])
def test_gradient_noise_estimate_is_unbiased_and_keeps_the_noise(sigma):
    # Asked for an estimate, the noise is drawn as a minibatch's: the mean of two halves. It
    # must keep its N(0, sigma^2) law, and the halves' estimate must average to sigma^2 (100k
    # chi^2_1 draws: relative standard error 0.45%, so 2% is ~4.5 SE; an estimate of sigma,
    # 0.7 against 0.49, or of 2 sigma^2 fails).
    task = paper_train_gaussian()
    target = task.target(grad_noise_std=sigma, dtype=torch.float64)
    x = _points(10, n=10_000, scale=1.0, shift=3.0)
    ev = target.evaluate(x, torch.Generator().manual_seed(0), estimate_noise=True)
    noise = ev.grad - task.grad(x)
    assert ev.grad_noise_var.shape == x.shape
    if sigma == 0:
        assert torch.equal(noise, torch.zeros_like(noise))
        assert torch.equal(ev.grad_noise_var, torch.zeros_like(noise))
        return
    assert float(noise.std()) == pytest.approx(sigma, rel=0.02)
    assert abs(float(noise.mean())) < 5 * sigma / math.sqrt(noise.numel())
    assert float(ev.grad_noise_var.mean()) == pytest.approx(sigma**2, rel=0.02)
    # a one-draw estimate per coordinate (chi^2_1: variance 2 sigma^4), not the noise itself
    assert float(ev.grad_noise_var.var()) == pytest.approx(2 * sigma**4, rel=0.05)
    assert target.evaluate(x, torch.Generator().manual_seed(0)).grad_noise_var is None


# -- double well --------------------------------------------------------------------------
def _fine_grid_moments():
    x = np.linspace(-9.0, 8.0, 400_001)
    u = (x + 4) * (x + 1) * (x - 1) * (x - 3) / 14 + 0.5  # the paper's product form
    w = np.exp(-u)
    z = np.trapezoid(w, x)
    mean = np.trapezoid(x * w, x) / z
    var = np.trapezoid((x - mean) ** 2 * w, x) / z
    return x, u, z, mean, var


def test_double_well_density_and_moments():
    dw = DoubleWell()
    x, u, z, mean, var = _fine_grid_moments()
    dens = dw.density(torch.from_numpy(x)).numpy()
    # trapezoid on h = 4e-5 over the whole support: error ~1e-10, far below the tolerance
    assert np.trapezoid(dens, x) == pytest.approx(1.0, abs=1e-8)
    np.testing.assert_allclose(dens, np.exp(-u) / z, rtol=1e-8)
    assert float(dw.mean[0]) == pytest.approx(mean, rel=1e-8)
    assert dw.var == pytest.approx(var, rel=1e-8)
    assert float(dw.cov[0, 0]) == pytest.approx(var, rel=1e-8)
    # energy: the paper's product form at a few points, and stationary points = roots of
    # U'(x) = (4x^3 + 3x^2 - 26x - 1)/14 (the deeper left well holds most mass: mean < 0)
    pts = torch.tensor([[-4.0], [-1.0], [0.0], [1.0], [3.0], [2.5]], dtype=torch.float64)
    expected = [0.5, 0.5, 12 / 14 + 0.5, 0.5, 0.5, 6.5 * 3.5 * 1.5 * -0.5 / 14 + 0.5]
    np.testing.assert_allclose(dw.energy(pts).numpy(), expected, rtol=1e-14)
    roots = torch.from_numpy(np.sort(np.roots([4.0, 3.0, -26.0, -1.0]).real)[:, None])
    assert float(dw.grad(roots).abs().max()) < 1e-12
    assert float(dw.mean[0]) < -1.5


def test_double_well_bins_and_histogram_kl():
    dw = DoubleWell()
    edges = dw.grid(50)
    assert edges.shape == (51,) and float(edges[0]) == -6.0 and float(edges[-1]) == 5.0
    probs = dw.bin_probabilities(edges)
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-12)
    # each bin against fine-grid trapezoid integration of the independent density
    x, u, z, _, _ = _fine_grid_moments()
    cdf = np.concatenate([[0.0], np.cumsum(0.5 * (np.exp(-u[1:]) + np.exp(-u[:-1])) * np.diff(x))])
    cdf /= z
    ref = np.diff(np.interp(edges.numpy(), x, cdf))
    np.testing.assert_allclose(probs.numpy()[1:-1], ref[1:-1], rtol=1e-6, atol=1e-12)
    # exact samples by inverse CDF: KL(hist || p) ~ (bins - 1) / (2 n) = 2.5e-4 for n = 1e5;
    # a unit Gaussian (wrong target) gives KL of order 1.
    g = torch.Generator().manual_seed(0)
    uniform = torch.rand(100_000, generator=g, dtype=torch.float64).numpy()
    exact = torch.from_numpy(np.interp(uniform, cdf, x))
    assert dw.histogram_kl(exact, n_bins=50, direction="hist||true") < 1.5e-3
    wide = torch.randn(100_000, generator=g)
    assert dw.histogram_kl(wide, n_bins=50, direction="hist||true") > 0.3
    assert DoubleWell.noise_std_for(1.0) == pytest.approx(math.sqrt(2.0))
    assert DoubleWell.noise_std_for(1.0, step=0.5) == pytest.approx(2.0)


# -- mixtures -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mixture_25", "mixture_4", "mixture_weighted"])
def test_mixture_log_density_matches_explicit_sum(name):
    task = _all_tasks()[name]
    x = torch.cat([_points(2, n=40, scale=s, seed=i) for i, s in enumerate((0.5, 3.0, 10.0))])
    comps = [
        np.log(w) + stats.multivariate_normal(c, task.var * np.eye(2)).logpdf(x.numpy())
        for c, w in zip(task.centres.numpy(), task.weights.numpy(), strict=True)
    ]
    ref = logsumexp(np.stack(comps), axis=0)
    np.testing.assert_allclose(task.log_density(x).numpy(), ref, rtol=1e-12, atol=1e-9)
    diff = task.energy(x).numpy() + ref  # energy = -log p + const
    np.testing.assert_allclose(diff, diff[0], atol=1e-9)
    # stable far from all modes (naive log(sum(exp)) would give -inf / nan here)
    far = torch.tensor([[60.0, -80.0]], dtype=torch.float64)
    assert bool(torch.isfinite(task.energy(far)).all() and torch.isfinite(task.grad(far)).all())


def test_mixture_settings_and_exact_moments():
    m25, m4 = mixture_25(), mixture_4()
    grid = {(a, b) for a in (-4, -2, 0, 2, 4) for b in (-4, -2, 0, 2, 4)}
    assert {tuple(int(v) for v in c) for c in m25.centres.tolist()} == grid
    assert m25.var == 0.03 and m4.var == 0.02
    assert {tuple(c) for c in m4.centres.tolist()} == {
        (a, b) for a in (-0.4, 0.4) for b in (-0.4, 0.4)
    }
    # uniform on {-4,-2,0,2,4}: variance (16+4+0+4+16)/5 = 8, plus 0.03
    _close(m25.mean, torch.zeros(2, dtype=torch.float64), atol=1e-12)
    _close(m25.cov, 8.03 * torch.eye(2, dtype=torch.float64), atol=1e-12)
    _close(m4.cov, 0.18 * torch.eye(2, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("name", ["mixture_25", "mixture_4", "mixture_weighted"])
def test_mixture_moments_match_monte_carlo(name):
    task = _all_tasks()[name]
    n = 100_000
    x = task.sample(n, torch.Generator().manual_seed(1))
    d = x - x.mean(0)
    emp_cov = d.T @ d / (n - 1)
    # 5 standard errors from the samples themselves; for mixture_4 dropping the s^2 I term
    # (0.16 vs 0.18) is ~55 SE away (5 SE = 0.0018), and ignoring the weights of the weighted
    # mixture shifts its mean by (0.43, 0.32) (>> 5 SE <= 0.035).
    se_mean = x.std(0) / math.sqrt(n)
    assert bool(((x.mean(0) - task.mean).abs() < 5 * se_mean).all())
    se_cov = (d[:, :, None] * d[:, None, :]).std(0) / math.sqrt(n)
    assert bool(((emp_cov - task.cov).abs() < 5 * se_cov).all())


def test_mixture_mode_coverage_on_exact_samples():
    task = mixture_25()
    n = 50_000
    x = task.sample(n, torch.Generator().manual_seed(2))
    counts = task.mode_counts(x)
    # P(|z| < 0.25) for N(0, 0.03 I) in 2-D is 1 - exp(-0.25^2 / 0.06) = 0.647; each mode's
    # count is Binomial(n, 0.647 / 25) with sd ~ 36, so +-5 sd is +-180.
    expected = n / 25 * (1 - math.exp(-(0.25**2) / (2 * 0.03)))
    assert bool(((counts.double() - expected).abs() < 180).all())
    assert task.modes_covered(x) == 25
    one_mode = task.centres[7] + 0.1 * torch.randn(1000, 2, generator=torch.Generator(),
                                                   dtype=torch.float64)  # fmt: skip
    assert task.modes_covered(one_mode) == 1


# -- banana -------------------------------------------------------------------------------
def test_banana_density_and_closed_form_moments_by_quadrature():
    task = BananaTask(a=1.3, b=0.7, s=0.8)
    # steps 0.05 / 0.1 against scales 1.3 / 0.8: trapezoid error ~exp(-2 pi^2 s^2 / h^2)
    x1 = np.linspace(-11.0, 11.0, 441)
    x2 = np.linspace(-10.0, 90.0, 1001)
    xx1, xx2 = np.meshgrid(x1, x2, indexing="ij")
    pts = torch.from_numpy(np.stack([xx1.ravel(), xx2.ravel()], axis=1))
    p = torch.exp(task.log_density(pts)).numpy().reshape(xx1.shape)
    # independent density: N(x1; 0, a^2) N(x2; b (x1^2 - a^2), s^2)
    ref = stats.norm(0, 1.3).pdf(xx1) * stats.norm(0.7 * (xx1**2 - 1.69), 0.8).pdf(xx2)
    np.testing.assert_allclose(p, ref, rtol=1e-10, atol=1e-300)

    def integral(f):
        return np.trapezoid(np.trapezoid(f * p, x2, axis=1), x1)

    assert integral(1.0) == pytest.approx(1.0, abs=1e-7)
    mean = np.array([integral(xx1), integral(xx2)])
    np.testing.assert_allclose(mean, task.mean.numpy(), atol=1e-6)
    cov = np.array(
        [[integral(xx1 * xx1), integral(xx1 * xx2)], [integral(xx1 * xx2), integral(xx2 * xx2)]]
    )
    # quadrature (spectrally accurate for this smooth, fast-decaying integrand) vs closed form
    # diag(a^2, s^2 + 2 a^4 b^2) = diag(1.69, 3.4388)
    np.testing.assert_allclose(cov, task.cov.numpy(), atol=1e-6)


def test_banana_exact_samples_have_stated_moments():
    task = BananaTask()
    n = 100_000
    x = task.sample(n, torch.Generator().manual_seed(3))
    d = x - x.mean(0)
    # 5 SE thresholds from the samples; the x2 variance is 3 (a wrong twist sign or a
    # missing -a^2 offset moves the mean of x2 by 1, i.e. >> 5 SE = 0.027)
    assert bool(((x.mean(0) - task.mean).abs() < 5 * x.std(0) / math.sqrt(n)).all())
    se = (d[:, :, None] * d[:, None, :]).std(0) / math.sqrt(n)
    assert bool(((d.T @ d / (n - 1) - task.cov).abs() < 5 * se).all())


# -- validation ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "param"),
    [
        (lambda: gaussian(0), "dim"),
        (lambda: gaussian(3, cov="banded"), "cov"),
        (lambda: gaussian(3, cov="diagonal", eig_range=(2.0, 1.0)), "eig_range"),
        (lambda: gaussian(3, cov="diagonal", spacing="cubic"), "spacing"),
        (lambda: gaussian(3, mean=[1.0, 2.0]), "mean"),
        (lambda: gaussian(3, cov="wishart", eig_floor=-1.0), "eig_floor"),
        (lambda: gaussian(3, seed=1.5), "seed"),
        (lambda: GaussianTask(torch.zeros(2), torch.tensor([[1.0, 2.0], [2.0, 1.0]])), "cov"),
        (lambda: GaussianTask(torch.zeros(2), torch.ones(2, 3)), "cov"),
        (lambda: gaussian_2d(rho=1.0), "rho"),
        (lambda: gaussian_2d(std=(1.0, 0.0)), "std"),
        (lambda: gaussian(2).target(grad_noise_std=-0.1), "grad_noise_std"),
        (lambda: gaussian(2).target(dtype=torch.int64), "dtype"),
        (lambda: gaussian(2).sample(0), "n"),
        (lambda: gaussian(2).energy(torch.zeros(4, 3)), "theta"),
        (lambda: DoubleWell().grid(10, lo=2.0, hi=1.0), "lo"),
        (lambda: DoubleWell.noise_std_for(-1.0), "noise_b"),
        (lambda: GaussianMixtureTask(torch.zeros(3, 2), 0.0), "var"),
        (lambda: GaussianMixtureTask(torch.zeros(3), 1.0), "centres"),
        (lambda: GaussianMixtureTask(torch.zeros(2, 2), 1.0, weights=[1.0, -1.0]), "weights"),
        (lambda: mixture_25().modes_covered(torch.zeros(3, 2), radius=0.0), "radius"),
        (lambda: BananaTask(a=0.0), "a"),
        (lambda: BananaTask(s=-1.0), "s"),
    ],
)
def test_bad_arguments_raise_value_error_naming_parameter(make, param):
    with pytest.raises(ValueError, match=param):
        make()


def test_package_exports_and_cast_copy():
    assert tasks.paper_test_gaussian is paper_test_gaussian
    task = mixture_4().to(dtype=torch.float32)
    assert task.centres.dtype == torch.float32 and task.cov.dtype == torch.float32
    assert mixture_4().centres.dtype == torch.float64  # the original is untouched


def test_normalised_energy_adds_the_papers_constant_to_the_energy_only():
    from experiments.run_config import load_config
    from tasks.registry import build_problem

    task = paper_test_gaussian()
    normalised = task.with_normalised_energy()
    constant = 0.5 * math.log(2 * math.pi * float(torch.linalg.det(task.cov)))
    assert normalised.energy_offset == pytest.approx(constant, rel=1e-9)
    x = task.sample(4, generator=torch.Generator().manual_seed(0))
    plain, shifted = task.target(1.0, dtype=torch.float64), normalised.target(1.0, torch.float64)
    torch.testing.assert_close(
        shifted.energy(x) - plain.energy(x), torch.full((4,), constant, dtype=torch.float64)
    )
    torch.testing.assert_close(normalised.grad(x), task.grad(x))
    torch.testing.assert_close(normalised.log_density(x), task.log_density(x))
    assert task.energy_offset == 0.0  # the original is unchanged
    cfg = load_config(None, ["task.energy_log_normaliser=true"])
    problem = build_problem(cfg.task, dtype=torch.float64)
    assert problem.exact.energy_offset == pytest.approx(
        problem.exact.with_normalised_energy().energy_offset
    )


def test_a_rotated_gaussian_keeps_its_spectrum_mean_and_energy_constant():
    from tasks.gaussian import paper_train_gaussian

    diagonal = paper_train_gaussian().with_normalised_energy()
    rotated = diagonal.rotated(seed=7)
    off_diagonal = rotated.cov - torch.diag(torch.diagonal(rotated.cov))
    assert float(off_diagonal.abs().max()) > 0.05  # correlated coordinates
    torch.testing.assert_close(
        torch.linalg.eigvalsh(rotated.cov), torch.linalg.eigvalsh(diagonal.cov)
    )
    assert torch.equal(rotated.mean, diagonal.mean)
    assert rotated.energy_offset == diagonal.energy_offset != 0.0
    assert torch.equal(diagonal.rotated(seed=7).cov, rotated.cov)
    assert not torch.equal(diagonal.rotated(seed=8).cov, rotated.cov)


def test_the_linear_regression_s_posterior_is_the_exact_one():
    """The stated moments are the posterior of the model's energy: its gradient vanishes at
    the mean and its Hessian is the inverse covariance."""
    task = linear_regression(n=200, scales=(1.0, 2.0), seed=3)
    model = task.model
    mean = task.mean.float().unsqueeze(0)
    assert model.full_grad(mean).abs().max() < 1e-2 * model.full_grad(mean + 0.1).abs().max()
    hessian = torch.func.hessian(lambda t: model.energy(t.unsqueeze(0)).sum())(task.mean.float())
    torch.testing.assert_close(hessian.double(), torch.linalg.inv(task.cov), rtol=1e-3, atol=1e-3)


def test_the_logistic_regression_s_hmc_reference_matches_its_laplace_approximation():
    """The HMC reference samples the model's posterior: its chains agree (R-hat), its
    standard deviations are those of the Laplace approximation at the MAP (the posterior is
    near Gaussian with 300 examples and 4 parameters) and its mean sits within a fraction of
    a standard deviation of the MAP (a logistic posterior's skew moves it a little)."""
    task = logistic_regression()
    reference = task.reference(trajectories=600)
    assert ms.summary(reference, warn=False).max_rhat < 1.05
    mean, cov = task.moments(reference)
    energy = task.full_data.energy
    theta = torch.zeros(4, requires_grad=True)
    lbfgs = torch.optim.LBFGS([theta], max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        lbfgs.zero_grad()
        value = energy(theta.unsqueeze(0)).sum()
        value.backward()
        return value

    lbfgs.step(closure)
    mode = theta.detach()
    hessian = torch.func.hessian(lambda t: energy(t.unsqueeze(0)).sum())(mode).double()
    laplace_sd = torch.linalg.inv(hessian).diag().sqrt()
    torch.testing.assert_close(cov.diag().sqrt(), laplace_sd, rtol=0.05, atol=0.0)
    assert ((mean - mode.double()).abs() / laplace_sd).max() < 0.35
