"""The 1-D double-well toy target of Li et al. (2016, §3, after Ding et al. 2014).

:class:`DoubleWell` — ``U(x) = (x+4)(x+1)(x-1)(x-3)/14 + 0.5``, with its normaliser, mean and
variance by quadrature and exact histogram-bin probabilities for the histogram KL of
Li et al. 2016, Fig. 1.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import integrate
from torch import Tensor

from metasampler import diagnostics

from .toy_base import ToyTask, _as_tensor, _count, _float_dtype, _positive

__all__ = ["DoubleWell"]


class DoubleWell(ToyTask):
    """1-D double well ``U(x) = (x+4)(x+1)(x-1)(x-3)/14 + 0.5`` (Li et al. 2016, §3).

    ``pi(x) ∝ exp(-U(x))`` has modes at ``x ≈ -2.935`` and ``x ≈ 2.224``. The normaliser,
    mean and variance come from adaptive quadrature (``scipy.integrate.quad``, relative
    tolerance 1e-13) at construction. The stated default grid ``[-6, 5]`` holds all but
    3e-17 of the mass.

    Gradient noise: Li et al. (2016) write ``grad Ũ h = grad U h + N(0, 2 B h)`` with ``B = 1``;
    see :meth:`noise_std_for`.
    """

    #: expanded polynomial coefficients of ``14 (U - 0.5)``: x^4 + x^3 - 13 x^2 - x + 12
    _COEF = (1.0, 1.0, -13.0, -1.0, 12.0)

    def __init__(
        self, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
    ) -> None:
        dtype = _float_dtype(dtype)
        self.dim = 1
        self.lo, self.hi = -6.0, 5.0

        def unnorm(x: float) -> float:
            return math.exp(-self._energy_np(x))

        opts = {"epsabs": 0.0, "epsrel": 1e-13, "limit": 200}
        z = integrate.quad(unnorm, -math.inf, math.inf, **opts)[0]
        m1 = integrate.quad(lambda x: x * unnorm(x), -math.inf, math.inf, **opts)[0] / z
        m2 = integrate.quad(lambda x: (x - m1) ** 2 * unnorm(x), -math.inf, math.inf, **opts)[0]
        self.log_normaliser = math.log(z)
        self.var = m2 / z
        self.mean = torch.tensor([m1], dtype=dtype, device=device)
        self.cov = torch.tensor([[self.var]], dtype=dtype, device=device)

    @staticmethod
    def _energy_np(x):
        return ((((x + 1.0) * x - 13.0) * x - 1.0) * x + 12.0) / 14.0 + 0.5

    @staticmethod
    def _u(x: Tensor) -> Tensor:
        return (x + 4.0) * (x + 1.0) * (x - 1.0) * (x - 3.0) / 14.0 + 0.5

    @staticmethod
    def _du(x: Tensor) -> Tensor:
        return (((4.0 * x + 3.0) * x - 26.0) * x - 1.0) / 14.0

    def _energy(self, theta: Tensor) -> Tensor:
        return self._u(theta[:, 0])

    def _grad(self, theta: Tensor) -> Tensor:
        return self._du(theta)

    @staticmethod
    def noise_std_for(noise_b: float = 1.0, step: float | None = None) -> float:
        """``grad_noise_std`` for Li et al.'s noise ``N(0, 2 B h)`` on ``h * grad U``.

        ``step=None`` gives the reading used here, gradient-noise variance ``2 B``
        (``sqrt(2 B)``); with ``step = h`` the literal reading ``Var = 2 B / h``.
        """
        b = _positive("noise_b", noise_b)
        return math.sqrt(2.0 * b) if step is None else math.sqrt(2.0 * b / _positive("step", step))

    def log_density(self, x: Tensor) -> Tensor:
        """Normalised ``log pi(x)`` for ``x`` of any shape (elementwise)."""
        if not (isinstance(x, Tensor) and x.is_floating_point()):
            raise ValueError("x must be a floating torch.Tensor")
        return -self._u(x) - self.log_normaliser

    def density(self, x: Tensor) -> Tensor:
        """Normalised ``pi(x)`` for ``x`` of any shape (elementwise); integrates to 1."""
        return torch.exp(self.log_density(x))

    def grid(self, n_bins: int = 100, lo: float | None = None, hi: float | None = None) -> Tensor:
        """``n_bins + 1`` equally spaced bin edges (float64) on ``[lo, hi]``, default
        ``[-6, 5]``."""
        n_bins = _count("n_bins", n_bins)
        lo = self.lo if lo is None else float(lo)
        hi = self.hi if hi is None else float(hi)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"lo and hi must be finite with lo < hi, got lo={lo}, hi={hi}")
        return torch.linspace(lo, hi, n_bins + 1, dtype=torch.float64)

    def bin_probabilities(self, edges: Tensor) -> Tensor:
        """Exact probability of each bin ``[e_i, e_{i+1})``; the outer bins absorb the tails
        (``(-inf, e_1)`` and ``[e_{n-1}, inf)``), so the result sums to 1.

        Per-bin 64-point Gauss-Legendre quadrature (exact to ~1e-15 for bins narrower than
        the wells); tails by ``quad``.
        """
        e = _as_tensor(edges, torch.float64, "cpu")
        if e.ndim != 1 or e.numel() < 2 or not bool((e[1:] > e[:-1]).all()):
            raise ValueError("edges must be a 1-D increasing tensor with at least 2 entries")
        nodes, weights = np.polynomial.legendre.leggauss(64)
        a, b = e[:-1].numpy()[:, None], e[1:].numpy()[:, None]
        x = 0.5 * (b - a) * nodes[None, :] + 0.5 * (a + b)
        dens = np.exp(-self._energy_np(x) - self.log_normaliser)
        probs = 0.5 * (b[:, 0] - a[:, 0]) * (dens * weights[None, :]).sum(1)

        def pdf(t: float) -> float:
            return math.exp(-self._energy_np(t) - self.log_normaliser)

        probs[0] += integrate.quad(pdf, -math.inf, float(e[0]))[0]
        probs[-1] += integrate.quad(pdf, float(e[-1]), math.inf)[0]
        return torch.from_numpy(probs)

    def histogram_kl(self, samples: Tensor, n_bins: int = 100, *, direction: str) -> float:
        """Histogram KL between the histogram of ``samples`` on :meth:`grid` and the exact
        :meth:`bin_probabilities`; samples outside the grid fall in the outer bins.

        Computed by :func:`metasampler.diagnostics.histogram_kl_from_counts`, which documents
        ``direction``; it has no default here: ``"hist||true"`` is ``KL(p_hat || p)`` (the
        published ``kl_hist_true`` of ``reproduction/double_well.py``), ``"true||hist"``
        ``KL(p || p_hat)`` with the smoothed histogram.
        """
        edges = self.grid(n_bins)
        x = samples.detach().double().reshape(-1).cpu()
        if x.numel() == 0 or not bool(torch.isfinite(x).all()):
            raise ValueError("samples must be non-empty and finite")
        idx = torch.bucketize(x, edges[1:-1], right=True)
        counts = torch.bincount(idx, minlength=n_bins)
        log_p = torch.log(self.bin_probabilities(edges))
        return diagnostics.histogram_kl_from_counts(counts, log_p, direction=direction)

    def __repr__(self) -> str:
        return f"DoubleWell(mean={float(self.mean[0]):.4f}, var={self.var:.4f})"
