"""Tests for metasampler.diagnostics.

ESS estimators are checked against AR(1) chains ``x_t = rho x_{t-1} + sqrt(1-rho^2) e_t``
(stationary variance 1) whose asymptotic variance is ``(1+rho)/(1-rho)`` and whose ESS is
``n (1-rho)/(1+rho)``. Tolerances come from the spread of each estimator measured over many
replicates (numbers in comments: relative standard deviation of one estimate at the sizes used
here); each check averages ``R`` independent dimensions and allows about four standard errors
of that average, plus the estimator's known, computed bias where it has one. All random inputs
use fixed seeds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.signal import lfilter

from metasampler import diagnostics as dg

RHOS = [0.0, 0.5, 0.9]


def ar1(rho, S, K, D, seed):
    """Stationary AR(1) chains ``(S, K, D)`` with unit variance; ``rho`` scalar or ``(D,)``."""
    rng = np.random.default_rng(seed)
    rho = np.broadcast_to(np.asarray(rho, dtype=np.float64), (D,))
    e = rng.standard_normal((S, K, D))
    out = np.empty_like(e)
    for d in range(D):
        r = rho[d]
        ed = e[:, :, d].copy()
        ed[0] /= np.sqrt(1.0 - r**2)  # x_0 ~ N(0, 1) after the filter's sqrt(1-r^2) gain
        out[:, :, d] = lfilter([np.sqrt(1.0 - r**2)], [1.0, -r], ed, axis=0)
    return out


def true_ess(rho, n):
    return n * (1.0 - rho) / (1.0 + rho)


def bm_expected_sigma2(rho, b):
    """E[b * Var(batch mean)] of a unit-variance AR(1): the batch-means estimand at size b."""
    if rho == 0:
        return 1.0
    return (1 + rho) / (1 - rho) - 2 * rho * (1 - rho**b) / (b * (1 - rho) ** 2)


def sv_expected_sigma2(rho, b, S):
    """E[Bartlett spectral variance] of a unit-variance AR(1) (biased 1/S autocovariances)."""
    lags = np.arange(1, b)
    return 1.0 + 2.0 * np.sum((1 - lags / b) * (1 - lags / S) * rho**lags)


# --------------------------------------------------------------------------------------------
# Autocorrelation
# --------------------------------------------------------------------------------------------


def test_autocorrelation_matches_direct_sum_and_ar1():
    x = ar1(0.7, 300, 2, 3, seed=0)
    rho = dg.autocorrelation(x, max_lag=20)
    assert rho.shape == (21, 2, 3)
    xc = x - x.mean(axis=0)
    for lag in (0, 1, 5, 20):
        direct = (xc[: 300 - lag] * xc[lag:]).sum(axis=0) / (xc**2).sum(axis=0)
        np.testing.assert_allclose(rho[lag], direct, rtol=1e-10, atol=1e-12)
    # Shapes for (S, D) and (S,) inputs, and torch input.
    assert dg.autocorrelation(x[:, 0]).shape == (300, 3)
    assert dg.autocorrelation(x[:, 0, 0], max_lag=4).shape == (5,)
    np.testing.assert_allclose(dg.autocorrelation(torch.from_numpy(x), max_lag=20), rho, rtol=1e-12)
    # Long AR(1): rho_hat(l) ~ 0.7^l (sd of rho_hat(l) ~ sqrt((1+r^2)/(1-r^2)/n) ~ 0.004 here).
    y = ar1(0.7, 20000, 4, 1, seed=1)
    r = dg.autocorrelation(y, max_lag=3).mean(axis=(1, 2))
    np.testing.assert_allclose(r, 0.7 ** np.arange(4), atol=0.02)


# --------------------------------------------------------------------------------------------
# ESS against the AR(1) closed form
# --------------------------------------------------------------------------------------------

S_AR, K_AR, R_AR = 10000, 4, 16  # samples per chain, chains, independent replicate dims


@pytest.fixture(scope="module")
def ar1_sets():
    return {rho: ar1(rho, S_AR, K_AR, R_AR, seed=10 + i) for i, rho in enumerate(RHOS)}


@pytest.mark.parametrize("rho", RHOS)
def test_ess_geyer_matches_ar1(ar1_sets, rho):
    # One estimate's relative sd (n = 40,000): 1.2% / 2.9% / 5.9% for rho = 0 / 0.5 / 0.9,
    # unbiased. Mean of 16 dims: sd <= 1.5% -> 6% tolerance; single dims within 25%.
    e = dg.ess(ar1_sets[rho])
    assert e.shape == (R_AR,)
    ratio = e / true_ess(rho, S_AR * K_AR)
    assert abs(ratio.mean() - 1) < 0.06, ratio.mean()
    assert np.all(np.abs(ratio - 1) < 0.25), ratio


def test_ess_geyer_single_chain_shapes_and_torch(ar1_sets):
    x = ar1_sets[0.5]
    one = dg.ess(x[:, 0])  # (S, D): one chain
    assert one.shape == (R_AR,)
    assert abs(one.mean() / true_ess(0.5, S_AR) - 1) < 0.06
    scalar = dg.ess(x[:, 0, 0])
    assert isinstance(scalar, float)
    assert scalar == pytest.approx(one[0], rel=1e-12)
    np.testing.assert_allclose(dg.ess(torch.from_numpy(x).float()), dg.ess(x), rtol=1e-3)


def test_ess_geyer_penalises_disagreeing_chains():
    # Four well-mixed iid chains whose means differ: pooled ESS must collapse (the between-
    # chain variance enters var_plus), while each chain on its own has ESS ~ S.
    x = ar1(0.0, 2000, 4, 2, seed=3) + np.array([0.0, 1.0, 2.0, 3.0])[None, :, None]
    assert np.all(dg.ess(x) < 0.05 * 4 * 2000)
    assert np.all(dg.ess(x[:, 1]) > 0.8 * 2000)
    # Splitting catches a single drifting chain.
    drift = ar1(0.0, 2000, 1, 1, seed=4) + np.linspace(0, 6, 2000)[:, None, None]
    assert dg.ess(drift)[0] < 0.1 * 2000
    # Antithetic chains: ESS above n, capped by Stan's tau >= 1/log10(n).
    anti = ar1(-0.5, 4000, 2, 1, seed=5)
    assert 2 * 4000 < dg.ess(anti)[0] <= 8000 * np.log10(8000) + 1e-6


@pytest.mark.parametrize("rho", RHOS)
def test_ess_beast_matches_ar1(ar1_sets, rho):
    # Per-chain Tracer ESS (S = 10,000), averaged over 4 chains; measured relative sd of one
    # chain-dim value 1.5% / 3.2% / 6.2%, bias -2% at rho=0 (positive noise pairs get added).
    # Mean of 16 dims (64 chain-dims): sd < 1% -> 8% tolerance ("looser").
    e = dg.ess_beast(ar1_sets[rho])
    assert e.shape == (R_AR,)
    ratio = e / true_ess(rho, S_AR)  # per-chain ESS: compare with one chain's length
    assert abs(ratio.mean() - 1) < 0.08, ratio.mean()
    # The 0.05-threshold variant drops the tail sum_{l >= l*} rho^l: +5% for rho = 0.5, 0.9.
    e05 = dg.ess_beast(ar1_sets[rho], threshold=0.05)
    assert abs(e05.mean() / true_ess(rho, S_AR) - 1) < 0.10


def _tracer_loop(y, max_lag=1000):
    """Straight transcription of BEAST/Tracer's ESS loop for one series (``y`` 1-D), or for an
    ``(S, D)`` array with the products summed over all entries (what the seed-004 code does)."""
    n = y.shape[0]
    max_l = min(n // 3, max_lag)
    yc = y - y.mean(axis=0)
    gamma = np.zeros(max_l)
    var = 0.0
    for lag in range(max_l):
        gamma[lag] = np.sum(yc[: n - lag] * yc[lag:]) / (n - lag)
        if lag == 0:
            var = gamma[0]
        elif lag % 2 == 0:
            pair = gamma[lag - 1] + gamma[lag]
            if pair > 0:
                var += 2.0 * pair
            else:
                break
    return n / (var / gamma[0])


def test_ess_beast_equals_tracer_loop():
    rng = np.random.default_rng(7)
    x = ar1([0.3, 0.8, 0.95], 601, 3, 3, seed=8) * np.array([1.0, 3.0, 0.5]) + 2.0
    per = dg.ess_beast(x, per_chain=True)
    assert per.shape == (3, 3)
    for k in range(3):
        for d in range(3):
            assert per[k, d] == pytest.approx(_tracer_loop(x[:, k, d]), rel=1e-9)
    np.testing.assert_allclose(dg.ess_beast(x), per.mean(axis=0), rtol=1e-12)
    # Dimension pooling as in the reference code (mean over chains of the pooled value).
    ref = np.mean([_tracer_loop(x[:, k, :]) for k in range(3)])
    assert dg.ess_beast_paper(x) == pytest.approx(ref, rel=1e-9)
    pooled = dg.ess_beast(x, pool_dims=True, per_chain=True)
    assert pooled.shape == (3,)
    # The lag cap matters for slow chains.
    z = rng.standard_normal(3000).cumsum()
    assert dg.ess_beast(z, max_lag=50) == pytest.approx(_tracer_loop(z, 50), rel=1e-9)


# --------------------------------------------------------------------------------------------
# Batch means / spectral variance
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rho", RHOS)
def test_batch_means_matches_ar1(ar1_sets, rho):
    x = ar1_sets[rho]
    b = int(np.sqrt(S_AR))
    # sigma^2_bm: measured relative sd 6-8% per dim -> mean of 16 within 8% of its expectation
    # at batch size b (which is below (1+rho)/(1-rho) by 2 rho/(b(1-rho)^2): -9.5% at 0.9).
    sig2 = dg.asymptotic_variance_batch_means(x)
    assert abs(sig2.mean() / bm_expected_sigma2(rho, b) - 1) < 0.08
    # ESS vs the closed form n(1-rho)/(1+rho): exact up to that batch-size bias.
    ratio = dg.ess_batch_means(x) / true_ess(rho, S_AR * K_AR)
    expected_ratio = ((1 + rho) / (1 - rho)) / bm_expected_sigma2(rho, b)
    assert abs(ratio.mean() / expected_ratio - 1) < 0.08, (ratio.mean(), expected_ratio)
    assert abs(ratio.mean() - 1) < 0.2
    # Larger batches shrink the bias.
    big = dg.ess_batch_means(x, n_batches=20) / true_ess(rho, S_AR * K_AR)
    assert abs(big.mean() / (((1 + rho) / (1 - rho)) / bm_expected_sigma2(rho, 500)) - 1) < 0.15


@pytest.mark.parametrize("rho", RHOS)
def test_spectral_variance_matches_ar1(ar1_sets, rho):
    x = ar1_sets[rho]
    b = int(np.sqrt(S_AR))
    # Measured relative sd 4-7.5% per dim -> 8% on the mean of 16.
    sig2 = dg.asymptotic_variance_spectral(x)
    assert abs(sig2.mean() / sv_expected_sigma2(rho, b, S_AR) - 1) < 0.08
    ratio = dg.ess_spectral_variance(x) / true_ess(rho, S_AR * K_AR)
    expected_ratio = ((1 + rho) / (1 - rho)) / sv_expected_sigma2(rho, b, S_AR)
    assert abs(ratio.mean() / expected_ratio - 1) < 0.08
    assert abs(ratio.mean() - 1) < 0.2


def test_batch_means_and_spectral_formulas_one_chain():
    # Seed 002's formulas written out on a tiny single chain.
    x = np.random.default_rng(11).standard_normal(103).cumsum()
    b, a = 10, 10
    ybar = x[: a * b].reshape(a, b).mean(axis=1)
    bm = b / (a - 1) * np.sum((ybar - ybar.mean()) ** 2)
    assert dg.asymptotic_variance_batch_means(x) == pytest.approx(bm, rel=1e-12)
    assert dg.asymptotic_variance_batch_means(x, batch_size=10) == pytest.approx(bm, rel=1e-12)
    xc = x - x.mean()
    r = np.array([np.sum(xc[: 103 - k] * xc[k:]) / 103 for k in range(b)])
    sv = r[0] + 2 * np.sum((1 - np.arange(1, b) / b) * r[1:])
    assert dg.asymptotic_variance_spectral(x) == pytest.approx(sv, rel=1e-10)
    lam2 = np.var(x, ddof=1)
    assert dg.ess_batch_means(x) == pytest.approx(103 * lam2 / bm, rel=1e-12)
    assert dg.ess_spectral_variance(x) == pytest.approx(103 * lam2 / sv, rel=1e-10)


# --------------------------------------------------------------------------------------------
# Multivariate ESS
# --------------------------------------------------------------------------------------------


def test_multivariate_ess_independent_ar1():
    rhos = np.array(RHOS)
    n = 10000 * 4
    b = 100
    expected = n * np.prod([1 / bm_expected_sigma2(r, b) for r in rhos]) ** (1 / 3)
    truth = n * np.prod((1 - rhos) / (1 + rhos)) ** (1 / 3)  # geometric mean of the ESSs
    vals = np.array([dg.multivariate_ess(ar1(rhos, 10000, 4, 3, seed=100 + i)) for i in range(8)])
    # Measured relative sd of one mESS 4.5% -> mean of 8 within 6% of its expectation;
    # within 10% of the closed form (batch-size bias +4% here).
    assert abs(vals.mean() / expected - 1) < 0.06, vals.mean() / expected
    assert abs(vals.mean() / truth - 1) < 0.10


def test_multivariate_ess_invariance_and_1d_identity():
    x = ar1([0.2, 0.6, 0.9], 4000, 3, 3, seed=21)
    a = np.random.default_rng(22).standard_normal((3, 3)) + 3 * np.eye(3)
    m1 = dg.multivariate_ess(x)
    m2 = dg.multivariate_ess(x @ a.T + 5.0)
    assert m2 == pytest.approx(m1, rel=1e-8)  # determinant ratio is affine invariant
    # Not the mean of marginal ESSs: for p = 1 it is exactly the batch-means ESS.
    assert dg.multivariate_ess(x[:, :, 2:]) == pytest.approx(
        float(dg.ess_batch_means(x[:, :, 2:])[0]), rel=1e-10
    )
    # Singular batch-means covariance (too few batches for D) -> NaN.
    assert np.isnan(dg.multivariate_ess(ar1(0.5, 16, 1, 5, seed=1)))


# --------------------------------------------------------------------------------------------
# Split R-hat
# --------------------------------------------------------------------------------------------


def test_split_rhat():
    mixed = ar1(0.5, 2000, 4, 5, seed=30)
    r = dg.split_rhat(mixed)
    assert r.shape == (5,)
    assert np.all(np.abs(r - 1) < 0.01), r
    shifted = mixed + np.array([0.0, 0.0, 0.0, 2.0])[None, :, None]
    assert np.all(dg.split_rhat(shifted) > 1.1)
    # One chain that drifts: only the split version detects it.
    drift = ar1(0.0, 2000, 1, 1, seed=31)[:, 0, 0] + np.linspace(0.0, 3.0, 2000)
    assert dg.split_rhat(drift) > 1.1
    # Classic formula by hand on the split halves.
    x = mixed[:, :, 0]
    halves = np.concatenate([x[:1000], x[1000:]], axis=1)
    w = halves.var(axis=0, ddof=1).mean()
    vp = 999 / 1000 * w + halves.mean(axis=0).var(ddof=1)
    assert r[0] == pytest.approx(np.sqrt(vp / w), rel=1e-12)
    # Rank-normalised version agrees for well-mixed chains, detects scale differences.
    assert np.all(np.abs(dg.split_rhat(mixed, rank_normalize=True) - 1) < 0.01)
    scaled = mixed * np.array([1.0, 1.0, 1.0, 4.0])[None, :, None]
    assert np.all(dg.split_rhat(scaled, rank_normalize=True) > 1.1)


# --------------------------------------------------------------------------------------------
# Gaussian KL
# --------------------------------------------------------------------------------------------


def samples_with_moments(mean, cov, n, seed):
    """``n`` samples whose sample mean and (ddof=1) covariance equal ``mean``, ``cov`` exactly."""
    d = len(mean)
    z = np.random.default_rng(seed).standard_normal((n, d))
    z -= z.mean(axis=0)
    lz = np.linalg.cholesky(np.atleast_2d(np.cov(z, rowvar=False)))
    z = np.linalg.solve(lz, z.T).T  # now cov(z) = I
    return mean + z @ np.linalg.cholesky(cov).T


def random_cov(d, seed):
    a = np.random.default_rng(seed).standard_normal((d, d))
    return a @ a.T / d + 0.3 * np.eye(d)


def test_gaussian_kl_zero_for_exact_moments():
    mu, cov = np.full(5, 3.0), random_cov(5, 0)
    x = samples_with_moments(mu, cov, 600, seed=1).reshape(200, 3, 5)
    assert abs(dg.gaussian_kl(x, mu, cov)) < 1e-10
    assert dg.gaussian_kl(x + 0.1, mu, cov) > 1e-3
    assert abs(dg.gaussian_kl(torch.from_numpy(x), torch.from_numpy(mu), cov)) < 1e-10


def test_gaussian_kl_known_pair():
    d = 4
    m1, c1 = np.array([0.5, -1.0, 0.0, 2.0]), random_cov(d, 2)
    mu, sig = np.zeros(d), random_cov(d, 3)
    x = samples_with_moments(m1, c1, 1000, seed=4)
    kl = dg.gaussian_kl(x, mu, sig)
    # Monte Carlo E_{N(m1,c1)}[log N(m1,c1) - log N(mu,sig)]: fixes the direction of the KL.
    draws = stats.multivariate_normal(m1, c1).rvs(100000, random_state=5)
    lr = stats.multivariate_normal(m1, c1).logpdf(draws) - stats.multivariate_normal(
        mu, sig
    ).logpdf(draws)
    se = lr.std() / np.sqrt(lr.size)
    assert abs(kl - lr.mean()) < 5 * se, (kl, lr.mean(), se)
    reverse = dg.gaussian_kl(samples_with_moments(mu, sig, 1000, seed=6), m1, c1)
    assert abs(reverse - kl) > 10 * se  # the two directions differ for this pair
    # 1-D: log(s2/s1) + (s1^2 + (m1-m2)^2) / (2 s2^2) - 1/2.
    y = samples_with_moments(np.array([1.0]), np.array([[0.25]]), 50, seed=7)[:, 0]
    exact = np.log(2.0 / 0.5) + (0.25 + 1.0) / (2 * 4.0) - 0.5
    assert dg.gaussian_kl(y, 0.0, 4.0) == pytest.approx(exact, rel=1e-12)
    # Too few samples for a full-rank fit.
    assert dg.gaussian_kl(x[:3], mu, sig) == np.inf


def test_cumulative_gaussian_kl_equals_brute_force():
    d, s, k = 3, 400, 5
    mu = np.array([1e4, -2.0, 3.0])  # far from the origin: running sums are shifted by mu
    sig = random_cov(d, 8)
    rng = np.random.default_rng(9)
    x = mu + 0.3 + np.cumsum(rng.standard_normal((s, k, d)), axis=0) * 0.05
    x += rng.standard_normal((s, k, d)) @ np.linalg.cholesky(sig).T
    at = [400, 1, 37, 100, 100, 2, 399]
    got = dg.cumulative_gaussian_kl(x, mu, sig, at)
    want = [dg.gaussian_kl(x[:t], mu, sig) for t in at]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert np.all(np.isfinite(got))
    full = dg.cumulative_gaussian_kl(x, mu, sig)  # every step
    assert full.shape == (s,)
    np.testing.assert_allclose(full[[0, 36, 399]], [want[1], want[2], want[0]], rtol=1e-9)
    # One chain: the first step has a single sample -> no covariance -> inf.
    assert dg.cumulative_gaussian_kl(x[:, 0], mu, sig, [1, 50])[0] == np.inf
    with pytest.raises(ValueError):
        dg.cumulative_gaussian_kl(x, mu, sig, [0])


# --------------------------------------------------------------------------------------------
# Histogram KL
# --------------------------------------------------------------------------------------------


def double_well_logp(x):
    return -((x + 4) * (x + 1) * (x - 1) * (x - 3) / 14 + 0.5)


def sample_1d(logp, lo, hi, n, seed):
    grid = np.linspace(lo, hi, 200001)
    p = np.exp(logp(grid) - logp(grid).max())
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    return np.interp(np.random.default_rng(seed).random(n), cdf, grid)


def test_histogram_kl_double_well():
    x = sample_1d(double_well_logp, -6, 5, 200000, seed=0)
    good = dg.histogram_kl(x, double_well_logp, bins=100, range=(-6, 5))
    shifted = dg.histogram_kl(x + 1.0, double_well_logp, bins=100, range=(-6, 5))
    assert good < 0.005  # expected ~ (bins-1)/(2n) = 2.5e-4 from histogram noise
    assert shifted > 0.3
    assert np.isfinite(shifted)  # bins with true mass but no samples are smoothed by eps
    # Samples in a (S, K) layout and torch input give the same answer.
    assert dg.histogram_kl(
        torch.from_numpy(x.reshape(-1, 4)), double_well_logp, 100, (-6, 5)
    ) == pytest.approx(good, rel=1e-9)
    # Density on the bin-centre grid instead of a log-density callable.
    centres = -6 + (np.arange(100) + 0.5) * 11 / 100
    grid = dg.histogram_kl(x, np.exp(double_well_logp(centres)), 100, (-6, 5))
    assert grid == pytest.approx(good, abs=2e-3)


def test_histogram_kl_known_values_and_direction():
    # Samples from N(0, 1.5^2), target N(0, 1):
    # KL(true||hist) = KL(N(0,1)||N(0,2.25)) = log 1.5 + 1/4.5 - 1/2 = 0.1277
    # KL(hist||true) = KL(N(0,2.25)||N(0,1)) = -log 1.5 + 2.25/2 - 1/2 = 0.2195
    x = np.random.default_rng(1).normal(0.0, 1.5, 400000)

    def logp(t):
        return -0.5 * t**2

    fwd = dg.histogram_kl(x, logp, bins=360, range=(-9, 9))
    rev = dg.histogram_kl(x, logp, bins=360, range=(-9, 9), direction="hist||true")
    assert fwd == pytest.approx(np.log(1.5) + 1 / 4.5 - 0.5, abs=0.01)
    assert rev == pytest.approx(-np.log(1.5) + 2.25 / 2 - 0.5, abs=0.01)
    # A torch-only density callable (log_density=False) works too.
    dens = dg.histogram_kl(x, lambda t: torch.exp(-0.5 * t**2), 360, (-9, 9), log_density=False)
    assert dens == pytest.approx(fwd, rel=1e-9)
    with pytest.raises(ValueError):
        dg.histogram_kl(x, logp, 10)


# --------------------------------------------------------------------------------------------
# Mode coverage
# --------------------------------------------------------------------------------------------


def test_mode_coverage_counts():
    g = np.array([-4.0, -2.0, 0.0, 2.0, 4.0])
    centres = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    rng = np.random.default_rng(0)
    parts = []
    for i in range(10):  # covered: 150 samples within 0.2
        ang = rng.uniform(0, 2 * np.pi, 150)
        rad = rng.uniform(0, 0.2, 150)
        parts.append(centres[i] + np.c_[rad * np.cos(ang), rad * np.sin(ang)])
    for i in range(10, 15):  # not covered: only 99 samples
        parts.append(centres[i] + rng.uniform(-0.1, 0.1, (99, 2)))
    for i in range(15, 18):  # covered at the boundary: exactly 100 samples
        parts.append(centres[i] + rng.uniform(-0.1, 0.1, (100, 2)))
    for i in range(18, 20):  # not covered: 500 samples at distance 0.3 > radius
        ang = rng.uniform(0, 2 * np.pi, 500)
        parts.append(centres[i] + 0.3 * np.c_[np.cos(ang), np.sin(ang)])
    x = np.concatenate(parts)
    x = x[rng.permutation(len(x))]
    n_cov, counts = dg.mode_coverage(x, centres, return_counts=True)
    assert n_cov == 13
    assert list(counts[:18]) == [150] * 10 + [99] * 5 + [100] * 3
    assert counts[18:].sum() == 0
    # (S, K, 2) input (pooled over chains) and torch input; a larger radius adds 2 modes.
    xs = torch.from_numpy(x[: len(x) // 4 * 4].reshape(-1, 4, 2))
    assert dg.mode_coverage(xs, centres) == dg.mode_coverage(x[: len(x) // 4 * 4], centres)
    assert dg.mode_coverage(x, centres, radius=0.35) == 15
    assert dg.mode_coverage(x, centres, min_count=151) == 0
