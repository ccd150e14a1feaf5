"""Gaussian-mixture toy targets with exact moments and mode coverage.

:class:`GaussianMixtureTask` — ``U = -log sum_m w_m exp(-||x - c_m||^2 / (2 s^2))``;
:func:`mixture_25` (Zhang et al. 2020, §5.1: means on ``{-4,-2,0,2,4}^2``, covariance ``0.03 I``)
and :func:`mixture_4` (Pal et al., §5.1: means ``(±0.4, ±0.4)``, covariance ``0.02 I``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from metasampler import diagnostics
from metasampler.targets import check_positions

from .toy_base import LOG_2PI, ToyTask, _as_tensor, _count, _float_dtype, _positive, _vector

__all__ = ["GaussianMixtureTask", "mixture_25", "mixture_4"]


class GaussianMixtureTask(ToyTask):
    """Mixture ``sum_m w_m N(c_m, s^2 I)`` of isotropic Gaussians with shared variance.

    ``U(x) = -logsumexp_m(log w_m - ||x - c_m||^2 / (2 s^2))`` (stable),
    ``grad U(x) = (x - sum_m r_m(x) c_m) / s^2`` with responsibilities
    ``r = softmax(log w_m - ||x - c_m||^2 / (2 s^2))``.
    Exact moments: ``mean = sum_m w_m c_m``,
    ``cov = s^2 I + sum_m w_m (c_m - mean)(c_m - mean)^T``.

    Args:
        centres: ``(M, D)`` component means.
        var: shared isotropic component variance ``s^2``.
        weights: ``(M,)`` positive weights (normalised here); default equal.
    """

    def __init__(
        self,
        centres: Tensor | Sequence[Sequence[float]],
        var: float,
        weights: Tensor | Sequence[float] | None = None,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        dtype = _float_dtype(dtype)
        c = _as_tensor(centres, dtype, device)
        if c.ndim != 2 or c.shape[0] < 1 or c.shape[1] < 1:
            raise ValueError(f"centres must have shape (M, D), got {tuple(c.shape)}")
        if not bool(torch.isfinite(c).all()):
            raise ValueError("centres must be finite")
        n_comp, dim = c.shape
        var = _positive("var", var)
        if weights is None:
            w = torch.full((n_comp,), 1.0 / n_comp, dtype=dtype, device=device)
        else:
            w = _vector("weights", weights, n_comp, dtype, device)
            if not bool((w > 0).all()):
                raise ValueError("weights must all be > 0")
            w = w / w.sum()
        self.dim = dim
        self.centres = c
        self.var = var
        self.weights = w
        self._log_w = torch.log(w)
        self.mean = w @ c
        dc = c - self.mean
        self.cov = var * torch.eye(dim, dtype=dtype, device=device) + (dc * w[:, None]).T @ dc
        self._log_norm = 0.5 * dim * (LOG_2PI + math.log(var))

    def _logits(self, theta: Tensor) -> Tensor:
        # explicit differences (K, M, D): exact near the centres, unlike the |x|^2 - 2 x.c
        # + |c|^2 expansion, which loses ~1e-4 of the logits in float32 for mixture_25.
        diff = theta[:, None, :] - self._cast(self.centres, theta)
        return self._cast(self._log_w, theta) - 0.5 * (diff * diff).sum(-1) / self.var

    def _energy(self, theta: Tensor) -> Tensor:
        return -torch.logsumexp(self._logits(theta), dim=-1)

    def _grad(self, theta: Tensor) -> Tensor:
        r = torch.softmax(self._logits(theta), dim=-1)
        return (theta - r @ self._cast(self.centres, theta)) / self.var

    def _sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        """Component by weight, then Gaussian."""
        comp = torch.multinomial(self.weights, n, replacement=True, generator=generator)
        z = torch.randn(
            n, self.dim, generator=generator, dtype=self.centres.dtype, device=self.centres.device
        )
        return self.centres[comp] + math.sqrt(self.var) * z

    def mode_counts(self, samples: Tensor, radius: float = 0.25) -> Tensor:
        """Number of samples within ``radius`` of each centre, shape ``(M,)`` (Zhang et al. 2020,
        §5.1; :func:`metasampler.diagnostics.mode_coverage`)."""
        return self._coverage(samples, radius, 1)[1]

    def modes_covered(self, samples: Tensor, radius: float = 0.25, min_count: int = 100) -> int:
        """Modes with at least ``min_count`` samples within ``radius`` (Zhang et al. 2020, Table 4:
        ``radius = 0.25``, ``min_count = 100``; :func:`metasampler.diagnostics.mode_coverage`)."""
        return self._coverage(samples, radius, _count("min_count", min_count))[0]

    def _coverage(self, samples: Tensor, radius: float, min_count: int) -> tuple[int, Tensor]:
        check_positions(samples, self.dim, "samples")
        radius = _positive("radius", radius)
        covered, counts = diagnostics.mode_coverage(
            samples, self.centres, radius, min_count, return_counts=True
        )
        return covered, torch.from_numpy(counts)

    def __repr__(self) -> str:
        return (
            f"GaussianMixtureTask(n_components={self.centres.shape[0]}, dim={self.dim}, "
            f"var={self.var})"
        )


def mixture_25(
    dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> GaussianMixtureTask:
    """25 equal-weight Gaussians, means on ``{-4,-2,0,2,4}^2``, cov ``0.03 I``
    (Zhang et al. 2020)."""
    g = torch.tensor([-4.0, -2.0, 0.0, 2.0, 4.0], dtype=torch.float64)
    centres = torch.cartesian_prod(g, g)
    return GaussianMixtureTask(centres, 0.03, dtype=dtype, device=device)


def mixture_4(
    dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> GaussianMixtureTask:
    """4 equal-weight Gaussians, means ``(±0.4, ±0.4)``, cov ``0.02 I`` (Pal et al., §5.1)."""
    centres = torch.tensor(
        [[-0.4, -0.4], [-0.4, 0.4], [0.4, -0.4], [0.4, 0.4]], dtype=torch.float64
    )
    return GaussianMixtureTask(centres, 0.02, dtype=dtype, device=device)
