"""Mode coverage of a multimodal target (Zhang et al. 2020, Table 4, 25-Gaussian mixture)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import _pooled_2d, _to_numpy

__all__ = ["mode_coverage"]


def mode_coverage(
    samples_2d: Any,
    centres: Any,
    radius: float = 0.25,
    min_count: int = 100,
    *,
    return_counts: bool = False,
) -> int | tuple[int, np.ndarray]:
    """Number of modes covered: a mode counts when ``>= min_count`` samples lie within
    ``radius`` (Euclidean, ``||x - c|| <= radius``) of its centre (Zhang et al. 2020, Table 4,
    25-Gaussian mixture: radius 0.25, 100 samples). All chains are pooled. The one mode count:
    ``tasks.mixture.GaussianMixtureTask.mode_counts`` / ``modes_covered`` call it.

    Args:
        samples_2d: ``(N, d)`` or ``(S, K, d)`` samples (``d = 2`` for the paper's task).
        centres: ``(M, d)`` mode centres.
        radius: ball radius.
        min_count: samples needed in a ball for its mode to count.
        return_counts: also return the ``(M,)`` per-mode sample counts.

    Returns:
        The number of covered modes (int), and the counts if ``return_counts``.
    """
    x = _pooled_2d(samples_2d, "samples_2d")
    c = np.atleast_2d(_to_numpy(centres))
    if c.shape[1] != x.shape[1]:
        raise ValueError(f"centres must be (M, {x.shape[1]}), got {c.shape}")
    counts = np.zeros(c.shape[0], dtype=np.int64)
    r2 = float(radius) ** 2
    step = max(1, (1 << 22) // max(1, c.shape[0]))
    for i0 in np.arange(0, x.shape[0], step):
        chunk = x[i0 : i0 + step]
        d2 = ((chunk[:, None, :] - c[None, :, :]) ** 2).sum(axis=-1)
        counts += (d2 <= r2).sum(axis=0)
    covered = int((counts >= min_count).sum())
    return (covered, counts) if return_counts else covered
