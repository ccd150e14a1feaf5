"""Batch-means and spectral-variance estimates of the asymptotic variance, the ESS built on
them, and the multivariate ESS (Pal et al.; Flegal & Jones 2010; Vats, Flegal & Jones 2019).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import _as_skd, _lagged_product_sums, _out

__all__ = [
    "asymptotic_variance_batch_means",
    "asymptotic_variance_spectral",
    "ess_batch_means",
    "ess_spectral_variance",
    "batch_means_covariance",
    "multivariate_ess",
]


# --------------------------------------------------------------------------------------------
# Batch means / spectral variance (Pal et al.; Flegal & Jones 2010; Vats & Knudson 2021)
# --------------------------------------------------------------------------------------------


def _batching(s: int, n_batches: int | None, batch_size: int | None) -> tuple[int, int]:
    """``(a, b)``: number of batches and batch size; default ``b = floor(sqrt(S))``."""
    if batch_size is not None and n_batches is not None:
        raise ValueError("give n_batches or batch_size, not both")
    if batch_size is not None:
        b = int(batch_size)
        a = s // b if b > 0 else 0
    elif n_batches is not None:
        a = int(n_batches)
        b = s // a if a > 0 else 0
    else:
        b = int(np.floor(np.sqrt(s)))
        a = s // b if b > 0 else 0
    if b < 1 or a < 2:
        raise ValueError(f"need at least 2 batches of size >= 1 (S={s}, a={a}, b={b})")
    return a, b


def _batch_means(x: np.ndarray, a: int, b: int) -> np.ndarray:
    """``(a, K, D)`` batch means of the first ``a*b`` samples of each chain."""
    s, k, d = x.shape
    return x[: a * b].reshape(a, b, k, d).mean(axis=1)


def asymptotic_variance_batch_means(
    samples: Any, n_batches: int | None = None, *, batch_size: int | None = None
) -> np.ndarray | float:
    """Batch-means estimate of the asymptotic variance ``sigma^2 = lim n Var(mean)``.

    Pal et al., §2.4 / Flegal & Jones (2010): with batch size ``b`` and ``a = floor(S/b)``
    batches of each chain, batch means ``Ybar_{k,j}`` and grand mean ``mu_hat``,

        ``sigma^2_bm = b / (aK - 1) * sum_{k=1}^{K} sum_{j=1}^{a} (Ybar_{k,j} - mu_hat)^2``.

    For one chain (``K = 1``) this is the paper's ``b/(a-1) sum_j (Ybar_j - mu_hat)^2``; for
    several chains it is the replicated batch-means estimator of Vats & Knudson (2021), whose
    single grand mean also picks up disagreement between chains. Default ``b = floor(sqrt(S))``
    (Pal et al.; mcmcse's default). Only the first ``a*b`` samples of a chain are used.

    Args:
        samples: ``(S, K, D)``, ``(S, D)`` or ``(S,)``.
        n_batches: number of batches ``a`` per chain (then ``b = floor(S/a)``).
        batch_size: batch size ``b`` (alternative to ``n_batches``).

    Returns:
        ``(D,)`` (a float for 1-D input).
    """
    x, scalar = _as_skd(samples)
    s, k, _ = x.shape
    a, b = _batching(s, n_batches, batch_size)
    ybar = _batch_means(x, a, b)
    mu = ybar.mean(axis=(0, 1))
    sig2 = b * ((ybar - mu) ** 2).sum(axis=(0, 1)) / (a * k - 1.0)
    return _out(sig2, scalar)


def asymptotic_variance_spectral(samples: Any, window: int | None = None) -> np.ndarray | float:
    """Spectral-variance (Bartlett lag window) estimate of the asymptotic variance.

    Pal et al., §2.4 / Flegal & Jones (2010):

        ``sigma^2_sv = sum_{|l| < b} w(l/b) R_hat(l)``,  ``w(u) = (1 - |u|) 1[|u| <= 1]``,
        ``R_hat(l) = (1/S) sum_{t=1}^{S-l} (x_t - mu_hat)(x_{t+l} - mu_hat)``,

    i.e. ``R_hat(0) + 2 sum_{l=1}^{b-1} (1 - l/b) R_hat(l)``, with truncation point ``b``
    (``window``), default ``floor(sqrt(S))`` (Pal et al. write ``w(k/(b-1))``, which gives the
    last lag weight 0; the difference is one lag). With several chains ``R_hat`` is averaged
    over chains with the grand mean ``mu_hat`` of all chains (replicated spectral variance of
    Vats & Knudson 2021); with one chain it is the paper's estimator.

    Args:
        samples: ``(S, K, D)``, ``(S, D)`` or ``(S,)``.
        window: truncation point ``b >= 1`` (``b = 1`` gives the plain variance).

    Returns:
        ``(D,)`` (a float for 1-D input).
    """
    x, scalar = _as_skd(samples)
    s = x.shape[0]
    b = int(np.floor(np.sqrt(s))) if window is None else int(window)
    if not 1 <= b <= s:
        raise ValueError(f"window must be in [1, S={s}], got {b}")
    mu = x.mean(axis=(0, 1))
    r = _lagged_product_sums(x - mu, b) / s  # (b, K, D)
    r = r.mean(axis=1)  # (b, D)
    w = 1.0 - np.arange(b, dtype=np.float64) / b
    w[1:] *= 2.0
    return _out(np.tensordot(w, r, axes=(0, 0)), scalar)


def _ess_from_sigma2(x: np.ndarray, sig2: np.ndarray) -> np.ndarray:
    """``ESS = n * lambda^2 / sigma^2``, ``n = S K``, ``lambda^2`` the pooled sample variance."""
    lam2 = x.reshape(-1, x.shape[-1]).var(axis=0, ddof=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return x.shape[0] * x.shape[1] * lam2 / sig2


def ess_batch_means(
    samples: Any, n_batches: int | None = None, *, batch_size: int | None = None
) -> np.ndarray | float:
    """ESS from the batch-means asymptotic variance (Pal et al., §2.4, Table 1).

    ``ESS = n * lambda^2 / sigma^2_bm`` with ``n = S K`` samples in total, ``lambda^2`` the
    sample variance (``1/(n-1)``) of all samples pooled, and ``sigma^2_bm`` from
    :func:`asymptotic_variance_batch_means` (default batch size ``floor(sqrt(S))``).

    For an AR(1) chain with coefficient ``rho`` this targets ``n (1-rho)/(1+rho)``; with
    ``b = sqrt(S)`` it is biased upwards by a factor ``~1/(1 - 2 rho / (b (1-rho^2)))``
    (e.g. ~10% for ``rho = 0.9``, ``b = 100``), the usual bias of batch means.

    Returns:
        ``(D,)`` total ESS over all chains (a float for 1-D input).
    """
    x, scalar = _as_skd(samples)
    sig2 = np.atleast_1d(asymptotic_variance_batch_means(x, n_batches, batch_size=batch_size))
    return _out(_ess_from_sigma2(x, sig2), scalar)


def ess_spectral_variance(samples: Any, window: int | None = None) -> np.ndarray | float:
    """ESS from the Bartlett spectral-variance asymptotic variance (Pal et al., §2.4, Table 1).

    ``ESS = n * lambda^2 / sigma^2_sv`` with ``n = S K``, ``lambda^2`` the pooled sample
    variance and ``sigma^2_sv`` from :func:`asymptotic_variance_spectral` (default truncation
    ``floor(sqrt(S))``). Same bias order as batch means.

    Returns:
        ``(D,)`` total ESS over all chains (a float for 1-D input).
    """
    x, scalar = _as_skd(samples)
    sig2 = np.atleast_1d(asymptotic_variance_spectral(x, window))
    return _out(_ess_from_sigma2(x, sig2), scalar)


def batch_means_covariance(
    samples: Any, n_batches: int | None = None, *, batch_size: int | None = None
) -> np.ndarray:
    """Multivariate (replicated) batch-means estimate of the asymptotic covariance ``Sigma``.

    ``Sigma_bm = b / (aK - 1) sum_{k,j} (Ybar_{k,j} - mu_hat)(Ybar_{k,j} - mu_hat)^T``
    (Vats, Flegal & Jones 2019, eq. 4 for ``K = 1``; Vats & Knudson 2021 for ``K > 1``),
    default batch size ``b = floor(sqrt(S))``.

    Returns:
        ``(D, D)``.
    """
    x, _ = _as_skd(samples)
    s, k, d = x.shape
    a, b = _batching(s, n_batches, batch_size)
    ybar = _batch_means(x, a, b).reshape(a * k, d)
    dev = ybar - ybar.mean(axis=0)
    return b * dev.T @ dev / (a * k - 1.0)


def multivariate_ess(
    samples: Any, n_batches: int | None = None, *, batch_size: int | None = None
) -> float:
    """Multivariate ESS (Vats, Flegal & Jones 2019), determinant form with batch means.

    ``mESS = n * (det(Lambda) / det(Sigma))^(1/p)`` with ``n = S K`` samples, ``p = D``,
    ``Lambda`` the sample covariance (``1/(n-1)``) of all samples pooled and ``Sigma`` the
    batch-means asymptotic covariance of :func:`batch_means_covariance` (default batch size
    ``floor(sqrt(S))``, as mcmcse's ``multiESS``). Log-determinants via ``slogdet``.
    Invariant under invertible linear maps of the samples; for independent components it is
    the geometric mean of the per-component ESS.

    Returns:
        A float; NaN if either matrix is not positive definite (e.g. ``aK <= D``).
    """
    x, _ = _as_skd(samples)
    d = x.shape[-1]
    flat = x.reshape(-1, d)
    lam = np.atleast_2d(np.cov(flat, rowvar=False, ddof=1))
    sig = batch_means_covariance(x, n_batches, batch_size=batch_size)
    s1, ld_lam = np.linalg.slogdet(lam)
    s2, ld_sig = np.linalg.slogdet(sig)
    if s1 <= 0 or s2 <= 0:
        return float("nan")
    return float(flat.shape[0] * np.exp((ld_lam - ld_sig) / d))
