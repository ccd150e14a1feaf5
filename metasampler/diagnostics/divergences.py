"""KL divergences between samples and a target: the KL of a Gaussian fit (Gong et al. 2019, Fig. 2)
and the histogram KL of a 1-D target (Li et al. 2016, Fig. 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy import special

from ._arrays import _as_skd, _pooled_2d, _to_numpy

__all__ = [
    "gaussian_kl",
    "gaussian_kl_from_moments",
    "cumulative_gaussian_kl",
    "histogram_kl",
    "histogram_kl_from_counts",
    "KL_DIRECTIONS",
]


# --------------------------------------------------------------------------------------------
# Gaussian KL (Gong et al. 2019, Fig. 2)
# --------------------------------------------------------------------------------------------


def _target_moments(mean: Any, cov: Any, d: int) -> tuple[np.ndarray, np.ndarray]:
    mu = _to_numpy(mean).reshape(-1)
    if mu.size == 1 and d > 1:
        mu = np.full(d, mu[0])
    sig = _to_numpy(cov)
    if sig.ndim == 0:
        sig = np.eye(d) * sig
    elif sig.ndim == 1:
        sig = np.diag(sig)
    if mu.shape != (d,) or sig.shape != (d, d):
        raise ValueError(
            f"mean must be (D,) and cov (D, D) (or scalar/diagonal) with D={d}; "
            f"got {mu.shape} and {sig.shape}"
        )
    return mu, sig


def _kl_to_target(
    m: np.ndarray, c: np.ndarray, mu: np.ndarray, chol: np.ndarray, logdet_sig: float
) -> float:
    """``KL(N(m, c) || N(mu, L L^T))`` with ``chol = L`` (float64)."""
    d = m.shape[0]
    try:
        lc = np.linalg.cholesky(0.5 * (c + c.T))
    except np.linalg.LinAlgError:
        return float("inf")
    logdet_c = 2.0 * np.log(np.diag(lc)).sum()
    # tr(Sigma^{-1} C) = ||L^{-1} L_c||_F^2 ; Mahalanobis = ||L^{-1}(mu - m)||^2
    a = np.linalg.solve(chol, lc)
    z = np.linalg.solve(chol, mu - m)
    return float(0.5 * ((a * a).sum() + z @ z - d + logdet_sig - logdet_c))


def _target_factor(mu: Any, sig: np.ndarray) -> tuple[np.ndarray, float]:
    """Cholesky factor ``L`` of the target covariance and ``log det Sigma``."""
    chol = np.linalg.cholesky(sig)
    return chol, float(2.0 * np.log(np.diag(chol)).sum())


def gaussian_kl_from_moments(mean: Any, cov: Any, target_mean: Any, target_cov: Any) -> float:
    """``KL(N(mean, cov) || N(target_mean, target_cov))`` in closed form: THE Gaussian KL that
    :func:`gaussian_kl`, :func:`cumulative_gaussian_kl` and the toy tasks use.

        ``KL = 1/2 [ tr(Sigma^{-1} C) + (mu - m)^T Sigma^{-1} (mu - m) - D
                     + log det Sigma - log det C ]``

    with ``m, C = mean, cov`` and ``mu, Sigma = target_mean, target_cov`` (e.g. Ma et al.
    2015's bias measure, Gong et al. 2019, §5.1), evaluated in float64 with Cholesky factors (no
    explicit inverses or determinants).

    Args:
        mean, cov: ``(D,)`` and ``(D, D)`` moments of the first Gaussian (e.g. a fit to samples).
        target_mean, target_cov: the target's moments; a scalar mean is broadcast, a ``(D,)``
            covariance means a diagonal and a scalar ``target_cov * I``.

    Returns:
        The KL divergence (float); ``inf`` if ``cov`` is not positive definite.
    """
    m = _to_numpy(mean).reshape(-1)
    c = _to_numpy(cov)
    d = m.shape[0]
    if c.shape != (d, d):
        raise ValueError(f"cov must have shape ({d}, {d}), got {c.shape}")
    mu, sig = _target_moments(target_mean, target_cov, d)
    return _kl_to_target(m, c, mu, *_target_factor(mu, sig))


def gaussian_kl(samples: Any, mean: Any, cov: Any, *, ddof: int = 1) -> float:
    """KL( N(m_hat, C_hat) || N(mu, Sigma) ) for the Gaussian fitted to the pooled samples.

    ``m_hat`` and ``C_hat`` (``1/(n - ddof)``; ``np.cov``'s default ``ddof=1``, as the paper's
    reference code) are the mean and covariance of all ``n = S K`` samples of all chains; the
    KL is :func:`gaussian_kl_from_moments`'s closed form.

    Args:
        samples: ``(S, K, D)``, ``(S, D)`` or ``(S,)``.
        mean: target mean ``(D,)`` (a scalar is broadcast).
        cov: target covariance ``(D, D)``; a ``(D,)`` vector means a diagonal, a scalar
            ``cov * I``.
        ddof: delta degrees of freedom of the fitted covariance.

    Returns:
        The KL divergence (float); ``inf`` if the fitted covariance is singular (e.g.
        ``n - ddof < D``).
    """
    x = _pooled_2d(samples)
    n, d = x.shape
    mu, sig = _target_moments(mean, cov, d)
    if n - ddof <= 0:
        return float("inf")
    chol, logdet_sig = _target_factor(mu, sig)
    m = x.mean(axis=0)
    dev = x - m
    c = dev.T @ dev / (n - ddof)
    return _kl_to_target(m, c, mu, chol, logdet_sig)


def cumulative_gaussian_kl(
    samples: Any,
    mean: Any,
    cov: Any,
    at: Sequence[int] | np.ndarray | None = None,
    *,
    ddof: int = 1,
) -> np.ndarray:
    """KL of the Gaussian fitted to *all samples so far*, at each step count in ``at``.

    Entry ``i`` is ``gaussian_kl(samples[:at[i]], mean, cov)``: the samples of the first
    ``t = at[i]`` steps of every chain, pooled (``n_t = t K`` samples) — the curve of
    Gong et al. 2019, Fig. 2 ("KL of all samples so far", public code: every 100 steps,
    ``burn_in=0``).

    Computed in one pass with running sums of ``y = x - mu`` and ``y y^T`` (the shift by the
    target mean avoids cancellation), accumulated block by block between consecutive
    requested steps: ``O(S K D^2)`` time and ``O(D^2)`` extra memory in total, instead of
    refitting for every point. Then ``m_t = mu + sum y / n_t`` and
    ``C_t = (sum y y^T - n_t ybar ybar^T) / (n_t - ddof)``.

    Args:
        samples: ``(S, K, D)`` or ``(S, D)`` (one chain).
        mean, cov: target moments (as in :func:`gaussian_kl`).
        at: step counts ``1 <= t <= S`` (any order, repeats allowed). Default: every step.
        ddof: delta degrees of freedom of the fitted covariance.

    Returns:
        ``(len(at),)`` float64 array (``inf`` where the fitted covariance is singular).
    """
    x, _ = _as_skd(samples)
    s, k, d = x.shape
    mu, sig = _target_moments(mean, cov, d)
    at_arr = np.arange(1, s + 1) if at is None else np.asarray(at, dtype=np.int64).reshape(-1)
    if at_arr.size and (at_arr.min() < 1 or at_arr.max() > s):
        raise ValueError(f"'at' entries must be in [1, {s}]")
    chol, logdet_sig = _target_factor(mu, sig)
    uniq, inverse = np.unique(at_arr, return_inverse=True)
    vals = np.empty(uniq.shape[0], dtype=np.float64)
    sum_y = np.zeros(d)
    sum_yy = np.zeros((d, d))
    prev = 0
    for i, t in enumerate(uniq):
        block = (x[prev:t] - mu).reshape(-1, d)
        sum_y += block.sum(axis=0)
        sum_yy += block.T @ block
        prev = int(t)
        n = int(t) * k
        if n - ddof <= 0:
            vals[i] = np.inf
            continue
        ybar = sum_y / n
        c = (sum_yy - n * np.outer(ybar, ybar)) / (n - ddof)
        vals[i] = _kl_to_target(mu + ybar, c, mu, chol, logdet_sig)
    return vals[inverse.reshape(-1)]


# --------------------------------------------------------------------------------------------
# Histogram KL (Li et al. 2016, Fig. 1)
# --------------------------------------------------------------------------------------------


def _call_density(fn: Callable, pts: np.ndarray) -> np.ndarray:
    """Evaluate a NumPy- or torch-based function on ``pts``."""
    try:
        return _to_numpy(fn(pts))
    except Exception:  # fall back to a torch-only callable
        import torch

        return _to_numpy(fn(torch.from_numpy(pts)))


KL_DIRECTIONS = ("true||hist", "hist||true")


def histogram_kl_from_counts(
    counts: Any, log_p: Any, *, direction: str = "true||hist", eps: float = 1e-6
) -> float:
    """THE histogram KL: target bin masses ``p`` against histogram masses ``q`` (nats).

    The direction (the one convention of this package, also taken by :func:`histogram_kl`
    and ``tasks.double_well.DoubleWell.histogram_kl``):

    * ``"true||hist"`` (default; Li et al. 2016, Fig. 1 plots "the KL divergences between the true
      distributions and the estimated density"): ``KL(p || q~) = sum_i p_i log(p_i / q~_i)``
      with the smoothed ``q~_i = (q_i + eps) / (1 + M eps)``, so empty bins cost
      ``p_i log(p_i / eps)`` but never ``inf``;
    * ``"hist||true"``: ``KL(q || p) = sum_i q_i log(q_i / p_i)`` (no smoothing needed,
      ``0 log 0 = 0``; ``inf`` only if samples fall in a bin of zero target mass).

    Args:
        counts: ``(M,)`` sample counts per bin; ``q_i = c_i / sum_j c_j``.
        log_p: ``(M,)`` log target masses of the same bins, normalised (``sum exp = 1``;
            ``-inf`` for bins without mass).
        direction: ``"true||hist"`` or ``"hist||true"``.
        eps: smoothing floor for the histogram in ``"true||hist"``.
    """
    if direction not in KL_DIRECTIONS:
        raise ValueError("direction must be 'true||hist' or 'hist||true'")
    c = _to_numpy(counts).reshape(-1)
    log_p = _to_numpy(log_p).reshape(-1)
    if c.shape != log_p.shape:
        raise ValueError(f"counts and log_p must have the same shape, got {c.shape}, {log_p.shape}")
    total = c.sum()
    if total == 0:
        raise ValueError("no samples fall inside range")
    q = c / total
    if direction == "true||hist":
        p = np.exp(log_p)
        log_q = np.log((q + eps) / (1.0 + q.shape[0] * eps))
        terms = np.where(p > 0, p * (log_p - log_q), 0.0)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(q > 0, q * (np.log(q) - log_p), 0.0)
    return float(terms.sum())


def _bin_log_masses(
    target: Callable[[Any], Any] | Any,
    bins: int,
    lo: float,
    hi: float,
    log_density: bool | None,
    n_sub: int,
) -> np.ndarray:
    """Normalised log masses of ``bins`` equal bins on ``[lo, hi]`` (see :func:`histogram_kl`)."""
    width = (hi - lo) / bins
    if callable(target):
        is_log = True if log_density is None else bool(log_density)
        offs = (np.arange(n_sub, dtype=np.float64) + 0.5) / n_sub
        pts = lo + width * (np.arange(bins, dtype=np.float64)[:, None] + offs[None, :])
        vals = _call_density(target, pts.reshape(-1)).reshape(bins, n_sub)
        with np.errstate(divide="ignore"):
            logv = vals if is_log else np.log(vals)
        log_p = special.logsumexp(logv, axis=1)
    else:
        is_log = False if log_density is None else bool(log_density)
        vals = _to_numpy(target).reshape(-1)
        if vals.shape[0] != bins:
            raise ValueError(
                f"a grid target must have one value per bin ({bins}), got {vals.shape}"
            )
        with np.errstate(divide="ignore"):
            log_p = vals if is_log else np.log(vals)
    return log_p - special.logsumexp(log_p)


def histogram_kl(
    samples: Any,
    target: Callable[[Any], Any] | Any,
    bins: int = 100,
    range: tuple[float, float] | None = None,
    *,
    direction: str = "true||hist",
    log_density: bool | None = None,
    eps: float = 1e-6,
    n_sub: int = 16,
) -> float:
    """KL divergence between a 1-D target and the histogram of the samples.

    Both are discretised on ``bins`` equal bins over ``range = (lo, hi)`` and compared by
    :func:`histogram_kl_from_counts`, which documents ``direction`` (default ``KL(true || hist)``,
    Li et al. 2016, Fig. 1):

    * true bin masses ``p_i``: ``target`` integrated over bin ``i`` with ``n_sub`` midpoints
      (callable) or taken at the bin centres (grid array), renormalised over the range;
    * histogram masses ``q_i = c_i / sum_j c_j`` of the samples inside the range (samples
      outside are ignored, so choose a range that holds the target's mass).

    Args:
        samples: 1-D samples (any shape; flattened, all chains pooled).
        target: a callable ``f(x)`` of an array of points, returning the (unnormalised)
            log-density (default for callables) or density; or an array of length ``bins``
            with the (unnormalised) density (default for arrays) or log-density at the bin
            centres ``lo + (i + 1/2)(hi - lo)/bins``.
        bins: number of equal-width bins.
        range: ``(lo, hi)``; required.
        direction: ``"true||hist"`` (default) or ``"hist||true"``.
        log_density: whether ``target`` gives log-densities (default: True for callables,
            False for arrays).
        eps: smoothing floor for the histogram in ``true||hist``.
        n_sub: sub-points per bin used to integrate a callable target.

    Returns:
        The KL divergence (float, nats).
    """
    if range is None:
        raise ValueError("range=(lo, hi) is required (it must cover the target's mass)")
    lo, hi = float(range[0]), float(range[1])
    if not hi > lo:
        raise ValueError(f"range must satisfy lo < hi, got {range}")
    if direction not in KL_DIRECTIONS:
        raise ValueError("direction must be 'true||hist' or 'hist||true'")
    x = _to_numpy(samples).reshape(-1)
    log_p = _bin_log_masses(target, bins, lo, hi, log_density, n_sub)
    counts, _ = np.histogram(x, bins=bins, range=(lo, hi))
    return histogram_kl_from_counts(counts, log_p, direction=direction, eps=eps)
