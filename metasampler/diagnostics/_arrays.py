"""Input handling shared by the diagnostics: float64 NumPy copies, ``(S, K, D)`` shapes, FFT
lagged products.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import fft as sp_fft

__all__ = []


# Largest number of float64 values one FFT chunk may hold (about 128 MiB of complex output).
_FFT_CHUNK_VALUES = 1 << 23


def _to_numpy(x: Any) -> np.ndarray:
    """float64 NumPy copy of an array-like or torch tensor (detached, on CPU)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor, without importing torch
        x = x.detach().cpu()
        if hasattr(x, "double"):
            x = x.double()
        x = x.numpy()
    return np.asarray(x, dtype=np.float64)


def _as_skd(samples: Any, name: str = "samples") -> tuple[np.ndarray, bool]:
    """Return ``(x, scalar)`` with ``x`` shaped ``(S, K, D)``; ``scalar`` if the input was 1-D."""
    x = _to_numpy(samples)
    if x.ndim == 1:
        return x[:, None, None], True
    if x.ndim == 2:
        return x[:, None, :], False
    if x.ndim == 3:
        return x, False
    raise ValueError(f"{name} must have shape (S,), (S, D) or (S, K, D); got {x.shape}")


def _out(v: np.ndarray, scalar: bool) -> np.ndarray | float:
    """Per-dimension result ``(D,)``; a float when the input was 1-D."""
    return float(v[0]) if scalar else v


def _pooled_2d(samples: Any, name: str = "samples") -> np.ndarray:
    """All samples of all chains as an ``(N, D)`` array (``(S,)`` -> ``(S, 1)``)."""
    x = _to_numpy(samples)
    if x.ndim == 1:
        return x[:, None]
    if x.ndim == 2:
        return x
    if x.ndim == 3:
        return x.reshape(-1, x.shape[-1])
    raise ValueError(f"{name} must have shape (S,), (S, D) or (S, K, D); got {x.shape}")


def _lagged_product_sums(xc: np.ndarray, n_lags: int) -> np.ndarray:
    """``out[l, ...] = sum_{t=0}^{S-1-l} xc[t, ...] * xc[t+l, ...]`` for ``l < n_lags``, by FFT.

    ``xc`` is ``(S, ...)`` (normally already centred). Zero padding to at least ``2S - 1``
    makes the circular correlation equal to the linear one. Columns are processed in chunks
    so memory stays bounded for long, wide runs.
    """
    s = xc.shape[0]
    n_lags = int(min(max(n_lags, 1), s))
    rest = xc.shape[1:]
    flat = xc.reshape(s, -1)
    nfft = sp_fft.next_fast_len(2 * s - 1, real=True)
    out = np.empty((n_lags, flat.shape[1]), dtype=np.float64)
    step = max(1, _FFT_CHUNK_VALUES // nfft)
    for j0 in range(0, flat.shape[1], step):
        f = sp_fft.rfft(flat[:, j0 : j0 + step], n=nfft, axis=0)
        out[:, j0 : j0 + step] = sp_fft.irfft(f.real**2 + f.imag**2, n=nfft, axis=0)[:n_lags]
    return out.reshape((n_lags,) + rest)
