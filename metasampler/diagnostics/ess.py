"""Autocorrelation and effective sample size: Geyer / Stan multi-chain ESS and the BEAST /
Tracer ESS behind the toy ESS of Gong et al. 2019.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import special, stats

from ._arrays import _as_skd, _lagged_product_sums, _out, _to_numpy

__all__ = ["autocovariance", "autocorrelation", "ess", "ess_beast", "ess_beast_paper"]


# --------------------------------------------------------------------------------------------
# Autocorrelation
# --------------------------------------------------------------------------------------------


def autocovariance(x: Any, max_lag: int | None = None) -> np.ndarray:
    """Biased autocovariance of each chain and dimension, by FFT.

    ``gamma_hat(l) = (1/S) sum_{t=1}^{S-l} (x_t - xbar)(x_{t+l} - xbar)``, with ``xbar`` the
    mean of that chain. The ``1/S`` (not ``1/(S-l)``) normalisation keeps the sequence positive
    semi-definite (Geyer 1992; Stan; Vehtari et al. 2021).

    Args:
        x: ``(S, K, D)``, ``(S, D)`` or ``(S,)`` samples.
        max_lag: return lags ``0 .. max_lag`` (default: all ``S`` lags ``0 .. S-1``).

    Returns:
        Array with the input's shape, the sample axis replaced by the lag axis.
    """
    a = _to_numpy(x)
    if a.ndim == 0:
        raise ValueError("x must have a sample axis")
    s = a.shape[0]
    n_lags = s if max_lag is None else min(int(max_lag) + 1, s)
    return _lagged_product_sums(a - a.mean(axis=0), n_lags) / s


def autocorrelation(x: Any, max_lag: int | None = None) -> np.ndarray:
    """Autocorrelation ``rho_hat(l) = gamma_hat(l) / gamma_hat(0)`` per chain and dim, via FFT.

    ``gamma_hat`` is the biased (``1/S``) autocovariance of :func:`autocovariance`, so
    ``rho_hat(0) = 1`` and ``|rho_hat(l)| <= 1``. A constant chain gives NaN.

    Args:
        x: ``(S, K, D)``, ``(S, D)`` or ``(S,)`` samples (NumPy or torch).
        max_lag: return lags ``0 .. max_lag`` (default all ``S`` lags).

    Returns:
        ``(L, K, D)``, ``(L, D)`` or ``(L,)`` for the matching input, ``L`` = number of lags.
    """
    acov = autocovariance(x, max_lag)
    with np.errstate(invalid="ignore", divide="ignore"):
        return acov / acov[:1]


# --------------------------------------------------------------------------------------------
# ESS: Geyer / Stan multi-chain
# --------------------------------------------------------------------------------------------


def _split_chains(x: np.ndarray) -> np.ndarray:
    """``(S, K, D)`` -> ``(S//2, 2K, D)``: first and last halves (middle draw dropped if S odd)."""
    half = x.shape[0] // 2
    return np.concatenate([x[:half], x[x.shape[0] - half :]], axis=1)


def _rank_normalize(x: np.ndarray) -> np.ndarray:
    """Vehtari et al. (2021) eq. 14: ``z = Phi^{-1}((r - 3/8) / (N + 1/4))``, ranks pooled over
    chains, per dimension (average ranks for ties)."""
    s, k, d = x.shape
    r = stats.rankdata(x.reshape(s * k, d), axis=0)
    return special.ndtri((r - 0.375) / (s * k + 0.25)).reshape(s, k, d)


def ess(samples: Any, *, split: bool = True, rank_normalize: bool = False) -> np.ndarray | float:
    """Multi-chain effective sample size, Geyer's initial monotone sequence (Stan style).

    With ``M`` chains of ``n`` draws (after splitting each chain in half when ``split``), per
    dimension:

    * ``W = mean_m s_m^2`` (within-chain variance, ``s_m^2`` with ``1/(n-1)``),
      ``B/n = var_m(xbar_m)`` (between-chain variance of chain means, ``1/(M-1)``; 0 if M=1),
      ``var_plus = (n-1)/n * W + B/n``.
    * ``rho_t = 1 - (W - mean_m gamma_m(t)) / var_plus`` with ``gamma_m`` the biased FFT
      autocovariance of chain ``m`` (Vehtari et al. 2021, eq. 10; BDA3 eq. 11.7).
    * Geyer (1992): pair sums ``P_j = rho_{2j} + rho_{2j+1}``; keep ``P_0 .. P_{J-1}`` up to the
      first non-positive one (initial positive sequence), replace each by the running minimum
      (initial monotone sequence); ``tau = -1 + 2 sum_{j<J} P_j``.
    * ``ESS = M n / tau``, with ``tau >= 1 / log10(M n)`` as in Stan (caps antithetic chains).

    Between-chain disagreement lowers the ESS (``var_plus`` grows while ``mean gamma_m`` does
    not). Stan's final small correction (adding the last positive even-lag term once) is not
    applied; it changes ``tau`` by at most one lag's autocorrelation.

    Args:
        samples: ``(S, K, D)``, ``(S, D)`` (one chain) or ``(S,)``.
        split: split each chain into two halves first (Stan / Vehtari et al. 2021). Detects
            within-chain non-stationarity; needs ``S >= 4``.
        rank_normalize: compute the bulk-ESS of Vehtari et al. (2021) on rank-normalised
            draws instead of the plain ESS of the raw values.

    Returns:
        ``(D,)`` total ESS over all chains (a float for 1-D input). NaN for constant dims.
    """
    x, scalar = _as_skd(samples)
    if rank_normalize:
        x = _rank_normalize(x)
    if split:
        if x.shape[0] < 4:
            raise ValueError("split ESS needs at least 4 samples per chain")
        x = _split_chains(x)
    n, m, _ = x.shape
    if n < 2:
        raise ValueError("ESS needs at least 2 samples per chain")
    acov = autocovariance(x)  # (n, M, D), biased
    chain_mean = x.mean(axis=0)  # (M, D)
    mean_var = acov[0].mean(axis=0) * n / (n - 1.0)  # W
    var_plus = mean_var * (n - 1.0) / n
    if m > 1:
        var_plus = var_plus + chain_mean.var(axis=0, ddof=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = 1.0 - (mean_var - acov.mean(axis=1)) / var_plus  # (n, D)
    n_pairs = n // 2
    pairs = rho[0 : 2 * n_pairs : 2] + rho[1 : 2 * n_pairs : 2]  # (n_pairs, D)
    positive = np.cumprod(pairs > 0, axis=0).astype(bool)
    positive[0] = True  # P_0 = 1 + rho_1 always enters (Geyer; Stan)
    monotone = np.minimum.accumulate(pairs, axis=0)
    tau = -1.0 + 2.0 * np.where(positive, monotone, 0.0).sum(axis=0)
    total = float(n * m)
    tau = np.maximum(tau, 1.0 / np.log10(total))
    out = total / tau
    out = np.where(np.isfinite(rho[1]), out, np.nan)
    return _out(out, scalar)


# --------------------------------------------------------------------------------------------
# ESS: BEAST / Tracer (the toy ESS of Gong et al. 2019)
# --------------------------------------------------------------------------------------------


def _beast_lagged_cov(x: np.ndarray, max_lag: int) -> tuple[np.ndarray, int]:
    """``gamma(l) = (1/(S-l)) sum_t (x_t - xbar)(x_{t+l} - xbar)``, ``l < L = min(S//3, max_lag)``.

    Per chain and dim; ``x`` is ``(S, K, D)``. Returns ``(L, K, D)`` and ``L``.
    """
    s = x.shape[0]
    n_lags = min(s // 3, int(max_lag))
    if n_lags < 1:
        raise ValueError(f"BEAST ESS needs at least 3 samples per chain, got {s}")
    sums = _lagged_product_sums(x - x.mean(axis=0), n_lags)
    denom = (s - np.arange(n_lags, dtype=np.float64)).reshape((-1,) + (1,) * (x.ndim - 1))
    return sums / denom, n_lags


def _beast_act(gamma: np.ndarray, threshold: float | None) -> np.ndarray:
    """Autocorrelation time from lagged covariances ``gamma`` of shape ``(L, ...)``.

    ``threshold=None`` (Tracer rule): ``var = gamma_0 + 2 sum_{m=1}^{M} (gamma_{2m-1} +
    gamma_{2m})`` over the pairs before the first pair with a non-positive sum (only pairs with
    ``2m <= L-1``); ``ACT = var / gamma_0``.
    ``threshold=c``: ``ACT = 1 + 2 sum_{l=1}^{l*-1} rho_l`` with ``l*`` the first lag whose
    autocorrelation ``rho_l = gamma_l / gamma_0`` is ``< c``.
    """
    g0 = gamma[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        if threshold is None:
            n_pairs = (gamma.shape[0] - 1) // 2
            if n_pairs == 0:
                return g0 / g0
            pairs = gamma[1 : 2 * n_pairs : 2] + gamma[2 : 2 * n_pairs + 1 : 2]
            keep = np.cumprod(pairs > 0, axis=0)
            return (g0 + 2.0 * (pairs * keep).sum(axis=0)) / g0
        rho = gamma[1:] / g0
        keep = np.cumprod(rho >= threshold, axis=0)
        return 1.0 + 2.0 * (rho * keep).sum(axis=0)


def ess_beast(
    samples: Any,
    threshold: float | None = None,
    *,
    max_lag: int = 1000,
    pool_dims: bool = False,
    per_chain: bool = False,
) -> np.ndarray | float:
    """BEAST/Tracer-style ESS, computed per chain and then **averaged** over chains.

    This is the ESS of Gong et al. (2019, §5.1 footnote 2, "follows the ESS function
    in the BEAST package"). The public reference code (``Toy Example/Util.py``,
    ``effectiveSampleSize``, a Python port of BEAST's ``TraceCorrelation``) does, for each
    chain separately, with ``S`` samples:

    * lagged covariances ``gamma(l) = (1/(S-l)) sum_{t=1}^{S-l} (x_t - xbar)(x_{t+l} - xbar)``
      (note ``1/(S-l)``, not ``1/S``) for lags ``l = 0 .. L-1``, ``L = min(floor(S/3), 1000)``;
    * ``var = gamma(0) + 2 sum_{m>=1} [gamma(2m-1) + gamma(2m)]``, stopping at the first pair
      whose sum is ``<= 0`` (Geyer's initial *positive* sequence, no monotone step);
    * ``ACT = var / gamma(0)`` and ``ESS = S / ACT``.

    The reference then prints the **mean over the 50 chains** (not the sum), so 59 and 22 in
    the paper are per-chain ESS values out of 12,000 steps. It is *not* a "truncate when the
    autocorrelation first drops below 0.05" rule; that rule is available through ``threshold``
    for comparison but is not the default. See :func:`ess_beast_paper` for the dimension pooling
    the reference applies.

    Args:
        samples: ``(S, K, D)``, ``(S, D)`` or ``(S,)``.
        threshold: ``None`` (default) for the Tracer pair rule above. A float ``c`` instead
            truncates the sum ``ACT = 1 + 2 sum_{l>=1} rho_l`` before the first lag with
            ``rho_l = gamma(l)/gamma(0) < c`` (``c = 0.05`` is the rule used e.g. in Zanella's
            code); it ignores the negative tail and overestimates ESS by ``~2 sum_{l>=l*} rho_l``.
        max_lag: cap on the number of lags (1000 in Tracer's Python port and the reference).
        pool_dims: sum ``gamma(l)`` over dimensions before the rule — exactly what the reference
            does when handed an ``(S, D)`` chain (``np.sum(v)`` over all entries) — giving one ESS
            per chain, i.e. ``S`` over a ``gamma_d(0)``-weighted ACT of the dimensions.
        per_chain: return the per-chain values instead of their mean over chains.

    Returns:
        ``pool_dims=False``: ``(D,)`` (``(K, D)`` if ``per_chain``); a float for 1-D input.
        ``pool_dims=True``: a float (``(K,)`` if ``per_chain``).
    """
    x, scalar = _as_skd(samples)
    gamma, _ = _beast_lagged_cov(x, max_lag)  # (L, K, D)
    if pool_dims:
        gamma = gamma.sum(axis=-1)  # (L, K)
    with np.errstate(invalid="ignore", divide="ignore"):
        per = x.shape[0] / _beast_act(gamma, threshold)  # (K, D) or (K,)
    if per_chain:
        return per[:, 0] if (scalar and not pool_dims) else per
    res = per.mean(axis=0)
    if pool_dims:
        return float(res)
    return _out(res, scalar)


def ess_beast_paper(samples: Any) -> float:
    """The toy ESS exactly as the public code of Gong et al. 2019 computes it (one number).

    ``mean over chains k of S / ACT_k``, where ``ACT_k`` is the Tracer autocorrelation time
    (see :func:`ess_beast`) of the **dimension-pooled** lagged covariance
    ``Gamma_k(l) = sum_d gamma_{k,d}(l)``, i.e. ``ess_beast(samples, pool_dims=True)``.

    To reproduce the paper's setting (``NNSGHMC 59 vs SGHMC 22``: 20-D test Gaussian,
    50 chains, 12,000 steps of ``eta = 0.025``), pass **all** 12,000 positions of each chain:
    the reference used ``burn_in=0`` and ``interval=1``, so the transient from the
    ``U([0, 6]^D)`` initialisation is included and counts as slow autocorrelation. Dropping a
    burn-in gives larger, not comparable, values.

    Args:
        samples: ``(S, K, D)`` or ``(S, D)``.

    Returns:
        The ESS per chain, averaged over chains (float).
    """
    return float(ess_beast(samples, pool_dims=True))
