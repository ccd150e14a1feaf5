"""Gaussian toy targets (docs/METHOD.md §5).

:class:`GaussianTask` — ``U = 0.5 (x - m)^T P (x - m)``, ``P = Sigma^{-1}``.
:func:`paper_train_gaussian` / :func:`paper_test_gaussian` are the meta-training and test
densities of Gong et al. (ICLR 2019, §5.1 and appendix F.1): a 10-D Gaussian
with mean 3 and random diagonal covariance, and a 20-D correlated Gaussian with mean 3.
The paper does not say how the covariances are drawn; the public reference code uses
``diag(U(0, 1))`` for training and ``L L^T``, ``L = 0.6 N(0, 1)^{20x20}`` for the test
(its stored test covariance has eigenvalues 0.021 ... 25.5, condition number 1240).
We follow those constructions with seeded generators and bound the spectra so that no seed
gives a near-singular target (see the two functions). :func:`gaussian` builds any-D Gaussians
with seeded random covariances, :func:`gaussian_2d` a correlated 2-D one for plots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from metasampler import diagnostics
from metasampler.targets import check_positions

from .toy_base import (
    LOG_2PI,
    ToyTask,
    _as_tensor,
    _count,
    _float_dtype,
    _generator,
    _is_real,
    _positive,
    _vector,
)

__all__ = [
    "GaussianTask",
    "gaussian",
    "gaussian_2d",
    "paper_train_gaussian",
    "paper_test_gaussian",
]

_COVARIANCE_KINDS = ("identity", "diagonal", "correlated", "wishart")


class GaussianTask(ToyTask):
    """Gaussian ``N(mean, cov)``: ``U(x) = 0.5 (x - m)^T P (x - m)``, ``P = cov^{-1}``.

    Args:
        mean: ``(D,)`` mean.
        cov: ``(D, D)`` symmetric positive-definite covariance.
        dtype, device: storage of the exact parameters (default float64 on CPU).
    """

    def __init__(
        self,
        mean: Tensor,
        cov: Tensor,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        dtype = _float_dtype(dtype)
        cov = _as_tensor(cov, dtype, device)
        if cov.ndim != 2 or cov.shape[0] != cov.shape[1] or cov.shape[0] < 1:
            raise ValueError(f"cov must be a square (D, D) matrix, got shape {tuple(cov.shape)}")
        dim = cov.shape[0]
        mean = _vector("mean", mean, dim, dtype, device)
        if not bool(torch.isfinite(cov).all()):
            raise ValueError("cov must be finite")
        tol = 1e-10 * float(cov.abs().max()) + 1e-300
        if float((cov - cov.T).abs().max()) > tol:
            raise ValueError("cov must be symmetric")
        cov = 0.5 * (cov + cov.T)
        chol, info = torch.linalg.cholesky_ex(cov)
        if int(info) != 0:
            raise ValueError("cov must be positive definite (Cholesky factorisation failed)")
        self.dim = dim
        self.mean = mean
        self.cov = cov
        self.cov_cholesky = chol
        self._precision = torch.cholesky_inverse(chol)
        self._precision = 0.5 * (self._precision + self._precision.T)
        self._log_norm = 0.5 * dim * LOG_2PI + float(torch.log(torch.diagonal(chol)).sum())

    @property
    def log_normaliser(self) -> float:
        """``log Z = ½ log((2 pi)^D det cov)``: ``-log N(x) = U(x) + log Z``."""
        return float(self._log_norm)

    def with_normalised_energy(self) -> GaussianTask:
        """A copy whose :meth:`target` energy is ``U + ½ log(2 pi det cov)``.

        The paper's toy code (``U_Gaussian`` in its ``Util.py``) feeds its nets this energy
        (docs/METHOD.md §5), with the normaliser written with one ``2 pi`` rather than ``(2 pi)^D``;
        we add the same constant so that nets trained here see the paper's inputs. A sampler
        trained with it must be tested with it (config ``task.energy_log_normaliser``).
        """
        new = self.to()
        chol = torch.diagonal(self.cov_cholesky).double()
        new.energy_offset = 0.5 * LOG_2PI + float(torch.log(chol).sum())
        return new

    def rotated(self, seed: int = 0) -> GaussianTask:
        """The same spectrum and mean in a random orthonormal basis (``seed``): ``cov' = B cov
        B^T``, so a diagonal covariance gets correlated coordinates with its eigenvalues kept.
        The energy constant (:meth:`with_normalised_energy`) is kept too."""
        generator = torch.Generator().manual_seed(int(seed))
        draw = torch.randn(self.dim, self.dim, generator=generator, dtype=torch.float64)
        basis, _ = torch.linalg.qr(draw)
        cov = basis @ self.cov.double() @ basis.T
        new = GaussianTask(self.mean, 0.5 * (cov + cov.T), self.mean.dtype, self.mean.device)
        new.energy_offset = self.energy_offset
        return new

    @property
    def precision(self) -> Tensor:
        """``P = cov^{-1}``, shape ``(D, D)``."""
        return self._precision

    @property
    def eigenvalues(self) -> Tensor:
        """Eigenvalues of ``cov`` in ascending order."""
        return torch.linalg.eigvalsh(self.cov)

    @property
    def condition_number(self) -> float:
        """``lambda_max / lambda_min`` of ``cov``."""
        eig = self.eigenvalues
        return float(eig[-1] / eig[0])

    def _energy(self, theta: Tensor) -> Tensor:
        d = theta - self._cast(self.mean, theta)
        return 0.5 * ((d @ self._cast(self._precision, theta)) * d).sum(-1)

    def _grad(self, theta: Tensor) -> Tensor:
        return (theta - self._cast(self.mean, theta)) @ self._cast(self._precision, theta)

    def _sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        """``mean + L z``, ``L L^T = cov``."""
        z = torch.randn(
            n, self.dim, generator=generator, dtype=self.cov.dtype, device=self.cov.device
        )
        return self.mean + z @ self.cov_cholesky.T

    def kl_from_moments(self, mean: Tensor, cov: Tensor) -> float:
        """``KL(N(mean, cov) || this)``: the bias metric of Gong et al.
        (2019, §5.1), after Ma et al. (2015).

        With ``mean, cov`` the moments of all samples so far this is the toy test's
        "KL(Gaussian fit to samples ‖ target)".
        """
        m = _vector("mean", mean, self.dim, torch.float64, self.cov.device)
        s = _as_tensor(cov, torch.float64, self.cov.device)
        if s.shape != (self.dim, self.dim):
            raise ValueError(f"cov must have shape ({self.dim}, {self.dim}), got {tuple(s.shape)}")
        if int(torch.linalg.cholesky_ex(0.5 * (s + s.T))[1]) != 0:
            raise ValueError("cov must be positive definite")
        return diagnostics.gaussian_kl_from_moments(m, s, self.mean, self.cov)

    def kl_from_samples(self, samples: Tensor) -> float:
        """``KL(N(sample mean, sample cov) || this)`` for samples of shape ``(n, D)``."""
        check_positions(samples, self.dim, "samples")
        if samples.shape[0] <= self.dim:
            raise ValueError(
                f"samples needs more than D={self.dim} rows for a full-rank covariance, "
                f"got {samples.shape[0]}"
            )
        return diagnostics.gaussian_kl(samples, self.mean, self.cov)

    def __repr__(self) -> str:
        return f"GaussianTask(dim={self.dim}, condition_number={self.condition_number:.3g})"


def _spectrum(
    dim: int, eig_range: tuple[float, float], spacing: str, gen: torch.Generator
) -> Tensor:
    """``dim`` random eigenvalues in ``eig_range``, smallest and largest pinned to its ends.

    ``spacing="log"`` draws ``log lambda`` uniformly, ``"uniform"`` draws ``lambda``
    uniformly. The order is random (so a diagonal covariance is not sorted).
    """
    u = torch.rand(dim, generator=gen, dtype=torch.float64)
    if dim >= 2:
        u[torch.argmin(u)] = 0.0
        u[torch.argmax(u)] = 1.0
    lo, hi = eig_range
    if spacing == "log":
        return torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
    return lo + u * (hi - lo)


def _rotation(dim: int, gen: torch.Generator) -> Tensor:
    """A Haar-distributed random orthogonal matrix (QR of a Gaussian, signs fixed)."""
    a = torch.randn(dim, dim, generator=gen, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    return q * torch.sign(torch.diagonal(r))


def check_spectrum(eig_range: Sequence[float], spacing: str) -> None:
    """Raise :class:`ValueError` unless ``eig_range`` is ``(lo, hi)`` with ``0 < lo <= hi`` and
    ``spacing`` is ``"log"`` or ``"uniform"`` (also used by the run config's checks)."""
    if spacing not in ("log", "uniform"):
        raise ValueError(f"spacing must be 'log' or 'uniform', got {spacing!r}")
    if not (
        isinstance(eig_range, (tuple, list))
        and len(eig_range) == 2
        and all(_is_real(v) and math.isfinite(v) for v in eig_range)
        and 0 < eig_range[0] <= eig_range[1]
    ):
        raise ValueError(f"eig_range must be (lo, hi) with 0 < lo <= hi, got {eig_range!r}")


def _named_covariance(
    dim: int,
    kind: str,
    gen: torch.Generator,
    eig_range: tuple[float, float],
    spacing: str,
    wishart_scale: float,
    eig_floor: float,
) -> Tensor:
    """The ``(D, D)`` float64 covariance :func:`gaussian` builds for ``cov=kind``."""
    if kind not in _COVARIANCE_KINDS:
        raise ValueError(
            f"cov must be 'identity', 'diagonal', 'correlated', 'wishart' or a tensor, got {kind!r}"
        )
    check_spectrum(eig_range, spacing)
    _positive("wishart_scale", wishart_scale)
    if not (_is_real(eig_floor) and math.isfinite(eig_floor) and eig_floor >= 0):
        raise ValueError(f"eig_floor must be a finite number >= 0, got {eig_floor!r}")
    if kind == "identity":
        c = torch.eye(dim, dtype=torch.float64)
    elif kind == "diagonal":
        c = torch.diag(_spectrum(dim, eig_range, spacing, gen))
    elif kind == "correlated":
        eig = _spectrum(dim, eig_range, spacing, gen)
        rot = _rotation(dim, gen)
        c = (rot * eig) @ rot.T
    else:
        lower = wishart_scale * torch.randn(dim, dim, generator=gen, dtype=torch.float64)
        c = lower @ lower.T
        if eig_floor > 0:
            eig, vec = torch.linalg.eigh(c)
            c = (vec * eig.clamp_min(eig_floor)) @ vec.T
    return 0.5 * (c + c.T)


def _given_covariance(dim: int, cov: Tensor) -> Tensor:
    """A ``(D, D)`` covariance, or a ``(D,)`` vector of variances, as a float64 matrix."""
    c = _as_tensor(cov, torch.float64, None)
    if c.ndim == 1:
        if c.shape != (dim,):
            raise ValueError(f"cov as variances must have shape ({dim},), got {tuple(c.shape)}")
        if not bool((c > 0).all()):
            raise ValueError("cov variances must be > 0")
        return torch.diag(c)
    if c.shape != (dim, dim):
        raise ValueError(f"cov must have shape ({dim}, {dim}), got {tuple(c.shape)}")
    return c


def gaussian(
    dim: int,
    mean: float | Sequence[float] | Tensor = 0.0,
    cov: str | Tensor = "identity",
    seed: int = 0,
    eig_range: tuple[float, float] = (0.1, 10.0),
    spacing: str = "log",
    wishart_scale: float = 0.6,
    eig_floor: float = 0.0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> GaussianTask:
    """A Gaussian task with a seeded random covariance.

    Args:
        dim: dimension ``D``.
        mean: scalar (repeated) or ``(D,)``.
        cov: one of
            * ``"identity"``: ``I``;
            * ``"diagonal"``: ``diag(lambda)`` with ``lambda`` from ``eig_range``/``spacing``;
            * ``"correlated"``: ``R diag(lambda) R^T`` with ``R`` a Haar-random rotation and
              the same spectrum — the condition number is exactly
              ``eig_range[1] / eig_range[0]`` (for ``D >= 2``);
            * ``"wishart"``: ``L L^T`` with ``L = wishart_scale * N(0, 1)^{D x D}`` (the
              public reference code's ``generate_Cov``), eigenvalues below ``eig_floor``
              raised to ``eig_floor``. Raw square Wishart draws are often near-singular
              (condition numbers 1e2 ... 1e6 over seeds), hence the floor;
            * a ``(D, D)`` SPD tensor, or a ``(D,)`` tensor of variances.
        seed: seeds a private CPU generator; the same seed gives the same covariance.
        eig_range: ``(lambda_min, lambda_max)`` for ``"diagonal"``/``"correlated"``.
        spacing: ``"log"`` (log-uniform) or ``"uniform"`` eigenvalues within ``eig_range``.
        wishart_scale, eig_floor: for ``"wishart"``.
        dtype, device: storage of the exact parameters.
    """
    dim = _count("dim", dim)
    gen = _generator(seed)
    if isinstance(cov, str):
        c = _named_covariance(dim, cov, gen, eig_range, spacing, wishart_scale, eig_floor)
    else:
        c = _given_covariance(dim, cov)
    return GaussianTask(_vector("mean", mean, dim, torch.float64, None), c, dtype, device)


def paper_train_gaussian(
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    eig_range: tuple[float, float] = (0.1, 1.0),
    spacing: str = "uniform",
) -> GaussianTask:
    """Meta-training density of Gong et al. (2019, appendix F.1): 10-D, mean 3, random diagonal cov.

    The paper says only "randomly generated covariance matrix"; the public reference code
    draws variances ``U(0, 1)``. We draw them uniformly in ``[0.1, 1.0]`` with both ends
    attained (condition number exactly 10), which avoids the near-zero variances a raw
    ``U(0, 1)`` draw can produce. ``eig_range`` / ``spacing`` choose other variances.
    """
    return gaussian(
        10,
        mean=3.0,
        cov="diagonal",
        seed=seed,
        eig_range=eig_range,
        spacing=spacing,
        dtype=dtype,
        device=device,
    )


def paper_test_gaussian(
    seed: int = 0, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> GaussianTask:
    """Test density of Gong et al. (2019, §5.1, appendix F.1): 20-D correlated Gaussian, mean 3.

    Construction (the public reference code's ``generate_Cov`` with the scale of its stored
    test covariance): ``Sigma = L L^T``, ``L = 0.6 N(0, 1)^{20 x 20}``, with eigenvalues
    below 0.02 raised to 0.02 (the smallest eigenvalue of the reference's stored matrix is
    0.0206; raw draws go as low as 1e-4, which would make ``eta = 0.025`` unstable).
    ``seed=0`` gives eigenvalues 0.020 ... 25.7, condition number 1286 (the reference: 0.021
    ... 25.5, 1240); over seeds 0-5 the condition number ranges 590 ... 1500.
    """
    return gaussian(
        20,
        mean=3.0,
        cov="wishart",
        seed=seed,
        wishart_scale=0.6,
        eig_floor=0.02,
        dtype=dtype,
        device=device,
    )


def gaussian_2d(
    mean: float | Sequence[float] | Tensor = 3.0,
    std: tuple[float, float] = (1.0, 1.0),
    rho: float = 0.9,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> GaussianTask:
    """A 2-D Gaussian for trajectory plots (Gong et al. 2019, Fig. 2 plots one on ``[0, 6]^2``).

    ``cov = [[s1^2, rho s1 s2], [rho s1 s2, s2^2]]``; the paper does not give its
    covariance, ``rho = 0.9`` (strongly correlated) is our default.
    """
    if not (isinstance(std, (tuple, list)) and len(std) == 2):
        raise ValueError(f"std must be a pair (s1, s2), got {std!r}")
    s1, s2 = _positive("std", std[0]), _positive("std", std[1])
    if not (_is_real(rho) and -1 < rho < 1):
        raise ValueError(f"rho must lie in (-1, 1), got {rho!r}")
    c = torch.tensor([[s1 * s1, rho * s1 * s2], [rho * s1 * s2, s2 * s2]], dtype=torch.float64)
    return GaussianTask(_vector("mean", mean, 2, torch.float64, None), c, dtype, device)
