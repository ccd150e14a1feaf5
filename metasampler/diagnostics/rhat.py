"""Split R-hat (Gelman et al. BDA3 §11.4; Vehtari et al. 2021)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import _as_skd, _out
from .ess import _rank_normalize, _split_chains

__all__ = ["split_rhat"]


def _rhat_core(x: np.ndarray) -> np.ndarray:
    """Classic R-hat of ``(n, M, D)`` chains (BDA3 eq. 11.4), no splitting."""
    n = x.shape[0]
    w = x.var(axis=0, ddof=1).mean(axis=0)
    b_over_n = x.mean(axis=0).var(axis=0, ddof=1)
    var_plus = (n - 1.0) / n * w + b_over_n
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sqrt(var_plus / w)


def split_rhat(samples: Any, *, rank_normalize: bool = False) -> np.ndarray | float:
    """Split potential scale reduction factor R-hat (Gelman et al. BDA3 §11.4; Vehtari 2021).

    Each chain is split into its first and second halves (middle draw dropped if ``S`` is odd),
    giving ``M = 2K`` chains of ``n = floor(S/2)`` draws. Per dimension:

        ``W = mean_m s_m^2``, ``B/n = var_m(xbar_m)`` (``1/(M-1)``),
        ``var_plus = (n-1)/n W + B/n``,  ``R-hat = sqrt(var_plus / W)``.

    Splitting makes a single drifting chain show ``R-hat > 1``.

    Args:
        samples: ``(S, K, D)``, ``(S, D)`` or ``(S,)``; needs ``S >= 4``.
        rank_normalize: return Vehtari et al.'s (2021) ``max(bulk, tail)`` R-hat: the split
            R-hat of the rank-normalised draws and of the rank-normalised folded draws
            ``|x - median|``.

    Returns:
        ``(D,)`` (a float for 1-D input). NaN for constant dims.
    """
    x, scalar = _as_skd(samples)
    if x.shape[0] < 4:
        raise ValueError("split R-hat needs at least 4 samples per chain")
    if rank_normalize:
        bulk = _rhat_core(_split_chains(_rank_normalize(x)))
        folded = np.abs(x - np.median(x.reshape(-1, x.shape[-1]), axis=0))
        tail = _rhat_core(_split_chains(_rank_normalize(folded)))
        out = np.maximum(bulk, tail)
    else:
        out = _rhat_core(_split_chains(x))
    return _out(out, scalar)
