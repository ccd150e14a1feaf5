"""Toy sampling tasks with exact densities and moments (SPEC §4 toy settings, §5).

Every task is a small object that holds the exact target ``pi(theta) ∝ exp(-U(theta))``
(temperature 1, SPEC §1) and its known moments, and hands out a
:class:`metasampler.EnergyTarget` with a closed-form gradient (no autograd in the sampling
loop) and optional injected gradient noise ``grad Ũ = grad U + sigma * N(0, I)``.
Energies omit additive constants; ``log_density`` is normalised. Exact parameters are kept
in float64 (unless another ``dtype`` is asked for); ``energy``/``grad`` compute in the
dtype and on the device of the positions they are given, which are ``(K, D)`` tensors
(one row per chain), and every method is vectorised over chains.

Tasks:

* :class:`GaussianTask` — ``U = 0.5 (x - m)^T P (x - m)``, ``P = Sigma^{-1}``.
  :func:`paper_train_gaussian` / :func:`paper_test_gaussian` are the meta-training and test
  densities of Gong et al. (ICLR 2019, paper 004, §5.1 and appendix F.1): a 10-D Gaussian
  with mean 3 and random diagonal covariance, and a 20-D correlated Gaussian with mean 3.
  The paper does not say how the covariances are drawn; the public reference code uses
  ``diag(U(0, 1))`` for training and ``L L^T``, ``L = 0.6 N(0, 1)^{20x20}`` for the test
  (its stored test covariance has eigenvalues 0.021 ... 25.5, condition number 1240).
  We follow those constructions with seeded generators and bound the spectra so that no seed
  gives a near-singular target (see the two functions).
* :class:`DoubleWell` — ``U(x) = (x+4)(x+1)(x-1)(x-3)/14 + 0.5`` in 1-D (paper 001, §3,
  after Ding et al. 2014), with its normaliser, mean and variance by quadrature and exact
  histogram-bin probabilities for the histogram KL of paper 001 Fig. 1.
* :class:`GaussianMixtureTask` — ``U = -log sum_m w_m exp(-||x - c_m||^2 / (2 s^2))``;
  :func:`mixture_25` (paper 000 §5.1: means on ``{-4,-2,0,2,4}^2``, covariance ``0.03 I``)
  and :func:`mixture_4` (paper 002 §5.1: means ``(±0.4, ±0.4)``, covariance ``0.02 I``).
* :class:`BananaTask` — the 2-D twisted Gaussian of Haario et al. (1999):
  ``x1 ~ N(0, a^2)``, ``x2 | x1 ~ N(b (x1^2 - a^2), s^2)``, with exact mean
  ``(0, 0)`` and covariance ``diag(a^2, s^2 + 2 a^4 b^2)``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np
import torch
from scipy import integrate
from torch import Tensor

from metasampler.targets import EnergyTarget, check_positions

__all__ = [
    "ToyTask",
    "GaussianTask",
    "gaussian",
    "gaussian_2d",
    "paper_train_gaussian",
    "paper_test_gaussian",
    "DoubleWell",
    "GaussianMixtureTask",
    "mixture_25",
    "mixture_4",
    "BananaTask",
]

_LOG_2PI = math.log(2.0 * math.pi)


# -- argument checks ----------------------------------------------------------------------
def _is_real(value) -> bool:
    """A real number (Python or numpy scalar, not bool)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _positive(name: str, value: float) -> float:
    if not (_is_real(value) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _noise_std(value: float) -> float:
    if not (_is_real(value) and math.isfinite(value) and value >= 0):
        raise ValueError(f"grad_noise_std must be a finite number >= 0, got {value!r}")
    return float(value)


def _count(name: str, value: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _float_dtype(dtype: torch.dtype) -> torch.dtype:
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    return dtype


def _as_tensor(value, dtype: torch.dtype, device) -> Tensor:
    if isinstance(value, Tensor):
        return value.detach().to(dtype=dtype, device=device)
    return torch.as_tensor(np.asarray(value, dtype=np.float64), dtype=dtype, device=device)


def _vector(name: str, value, dim: int, dtype: torch.dtype, device) -> Tensor:
    """A ``(dim,)`` tensor from a scalar or a length-``dim`` sequence/tensor."""
    t = _as_tensor(value, dtype, device)
    if t.ndim == 0:
        t = t.expand(dim).clone()
    if t.shape != (dim,):
        raise ValueError(f"{name} must be a scalar or have shape ({dim},), got {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} must be finite")
    return t


def _generator(seed: int) -> torch.Generator:
    if isinstance(seed, bool) or int(seed) != seed:
        raise ValueError(f"seed must be an integer, got {seed!r}")
    return torch.Generator(device="cpu").manual_seed(int(seed))


# -- base class ---------------------------------------------------------------------------
class ToyTask:
    """Shared machinery: parameter casting, target construction, argument checks.

    Subclasses set ``dim``, ``mean`` ``(D,)`` and ``cov`` ``(D, D)`` and implement
    ``_energy(theta)`` and ``_grad(theta)`` on already-validated ``(K, D)`` tensors.
    """

    dim: int
    mean: Tensor
    cov: Tensor
    # Constant added to the energy that :meth:`target` hands out (what a learned sampler's
    # nets see); gradients, densities and moments ignore it. See
    # :meth:`GaussianTask.with_normalised_energy`.
    energy_offset: float = 0.0

    def _cast(self, t: Tensor, like: Tensor) -> Tensor:
        """``t`` in ``like``'s dtype and device (no copy when they already match)."""
        return t.to(dtype=like.dtype, device=like.device)

    def _energy(self, theta: Tensor) -> Tensor:
        raise NotImplementedError

    def _grad(self, theta: Tensor) -> Tensor:
        raise NotImplementedError

    def energy(self, theta: Tensor) -> Tensor:
        """Energy ``U(theta)`` without additive constant, shape ``(K,)``."""
        check_positions(theta, self.dim)
        return self._energy(theta)

    def grad(self, theta: Tensor) -> Tensor:
        """Closed-form ``grad U(theta)``, shape ``(K, D)``."""
        check_positions(theta, self.dim)
        return self._grad(theta)

    def target(
        self,
        grad_noise_std: float = 0.0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> EnergyTarget:
        """An :class:`~metasampler.EnergyTarget` for this task.

        Args:
            grad_noise_std: ``sigma`` of the injected gradient noise
                ``grad Ũ = grad U + sigma N(0, I)`` (SPEC §1); 0 gives exact gradients.
            dtype, device: where the chains will live; the task's parameters are cast
                there once. Positions of another dtype/device still work (cast per call).

        The target carries the closed-form ``grad_fn`` (used whenever ``create_graph`` is
        false) and the differentiable ``energy_fn`` (autograd fallback for second-order
        meta-training).
        """
        sigma = _noise_std(grad_noise_std)
        _float_dtype(dtype)
        cast = self.to(dtype=dtype, device=device)
        energy = cast._energy
        if self.energy_offset != 0.0:
            offset = float(self.energy_offset)

            def energy(theta: Tensor) -> Tensor:
                return cast._energy(theta) + offset

        return EnergyTarget(energy, self.dim, grad_noise_std=sigma, grad_fn=cast._grad)

    def to(
        self, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> ToyTask:
        """A copy with every tensor parameter cast to ``dtype`` / moved to ``device``."""
        new = object.__new__(type(self))
        for key, value in self.__dict__.items():
            if isinstance(value, Tensor) and value.is_floating_point():
                value = value.to(dtype=dtype or value.dtype, device=device or value.device)
            new.__dict__[key] = value
        return new

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim})"


# -- Gaussians ----------------------------------------------------------------------------
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
        self._log_norm = 0.5 * dim * _LOG_2PI + float(torch.log(torch.diagonal(chol)).sum())

    @property
    def log_normaliser(self) -> float:
        """``log Z = ½ log((2 pi)^D det cov)``: ``-log N(x) = U(x) + log Z``."""
        return float(self._log_norm)

    def with_normalised_energy(self) -> GaussianTask:
        """A copy whose :meth:`target` energy is ``U + ½ log(2 pi det cov)``.

        The paper's toy code (``U_Gaussian`` in its ``Util.py``) feeds its nets this energy
        (SPEC §4), with the normaliser written with one ``2 pi`` rather than ``(2 pi)^D``;
        we add the same constant so that nets trained here see the paper's inputs. A sampler
        trained with it must be tested with it (config ``task.energy_log_normaliser``).
        """
        new = self.to()
        chol = torch.diagonal(self.cov_cholesky).double()
        new.energy_offset = 0.5 * _LOG_2PI + float(torch.log(chol).sum())
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

    def log_density(self, theta: Tensor) -> Tensor:
        """Normalised ``log N(theta; mean, cov)``, shape ``(K,)``."""
        return -self.energy(theta) - self._log_norm

    def sample(
        self,
        n: int,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
    ) -> Tensor:
        """``n`` exact samples ``mean + L z``, ``L L^T = cov``, shape ``(n, D)``."""
        n = _count("n", n)
        z = torch.randn(
            n, self.dim, generator=generator, dtype=self.cov.dtype, device=self.cov.device
        )
        x = self.mean + z @ self.cov_cholesky.T
        return x if dtype is None else x.to(_float_dtype(dtype))

    def kl_from_moments(self, mean: Tensor, cov: Tensor) -> float:
        """``KL(N(mean, cov) || this)``, the bias metric of paper 004 §5.1 / Ma et al. (2015).

        With ``mean, cov`` the moments of all samples so far this is SPEC §5's
        "KL(Gaussian fit to samples ‖ target)".
        """
        m = _vector("mean", mean, self.dim, torch.float64, self.cov.device)
        s = _as_tensor(cov, torch.float64, self.cov.device)
        if s.shape != (self.dim, self.dim):
            raise ValueError(f"cov must have shape ({self.dim}, {self.dim}), got {tuple(s.shape)}")
        chol_s, info = torch.linalg.cholesky_ex(0.5 * (s + s.T))
        if int(info) != 0:
            raise ValueError("cov must be positive definite")
        p = self._precision.double()
        d = m - self.mean.double()
        logdet_t = 2.0 * torch.log(torch.diagonal(self.cov_cholesky.double())).sum()
        logdet_s = 2.0 * torch.log(torch.diagonal(chol_s)).sum()
        kl = 0.5 * ((p * s).sum() + d @ p @ d - self.dim + logdet_t - logdet_s)
        return float(kl)

    def kl_from_samples(self, samples: Tensor) -> float:
        """``KL(N(sample mean, sample cov) || this)`` for samples of shape ``(n, D)``."""
        check_positions(samples, self.dim, "samples")
        if samples.shape[0] <= self.dim:
            raise ValueError(
                f"samples needs more than D={self.dim} rows for a full-rank covariance, "
                f"got {samples.shape[0]}"
            )
        x = samples.detach().double().to(self.cov.device)
        return self.kl_from_moments(x.mean(0), torch.cov(x.T).reshape(self.dim, self.dim))

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
        if cov not in ("identity", "diagonal", "correlated", "wishart"):
            raise ValueError(
                "cov must be 'identity', 'diagonal', 'correlated', 'wishart' or a tensor, "
                f"got {cov!r}"
            )
        if spacing not in ("log", "uniform"):
            raise ValueError(f"spacing must be 'log' or 'uniform', got {spacing!r}")
        if not (
            isinstance(eig_range, (tuple, list))
            and len(eig_range) == 2
            and all(_is_real(v) and math.isfinite(v) for v in eig_range)
            and 0 < eig_range[0] <= eig_range[1]
        ):
            raise ValueError(f"eig_range must be (lo, hi) with 0 < lo <= hi, got {eig_range!r}")
        _positive("wishart_scale", wishart_scale)
        if not (_is_real(eig_floor) and math.isfinite(eig_floor) and eig_floor >= 0):
            raise ValueError(f"eig_floor must be a finite number >= 0, got {eig_floor!r}")
        if cov == "identity":
            c = torch.eye(dim, dtype=torch.float64)
        elif cov == "diagonal":
            c = torch.diag(_spectrum(dim, eig_range, spacing, gen))
        elif cov == "correlated":
            eig = _spectrum(dim, eig_range, spacing, gen)
            rot = _rotation(dim, gen)
            c = (rot * eig) @ rot.T
        else:
            lower = wishart_scale * torch.randn(dim, dim, generator=gen, dtype=torch.float64)
            c = lower @ lower.T
            if eig_floor > 0:
                eig, vec = torch.linalg.eigh(c)
                c = (vec * eig.clamp_min(eig_floor)) @ vec.T
        c = 0.5 * (c + c.T)
    else:
        c = _as_tensor(cov, torch.float64, None)
        if c.ndim == 1:
            if c.shape != (dim,):
                raise ValueError(f"cov as variances must have shape ({dim},), got {tuple(c.shape)}")
            if not bool((c > 0).all()):
                raise ValueError("cov variances must be > 0")
            c = torch.diag(c)
        elif c.shape != (dim, dim):
            raise ValueError(f"cov must have shape ({dim}, {dim}), got {tuple(c.shape)}")
    return GaussianTask(_vector("mean", mean, dim, torch.float64, None), c, dtype, device)


def paper_train_gaussian(
    seed: int = 0, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> GaussianTask:
    """Meta-training density of paper 004 (appendix F.1): 10-D, mean 3, random diagonal cov.

    The paper says only "randomly generated covariance matrix"; the public reference code
    draws variances ``U(0, 1)``. We draw them uniformly in ``[0.1, 1.0]`` with both ends
    attained (condition number exactly 10), which avoids the near-zero variances a raw
    ``U(0, 1)`` draw can produce.
    """
    return gaussian(
        10,
        mean=3.0,
        cov="diagonal",
        seed=seed,
        eig_range=(0.1, 1.0),
        spacing="uniform",
        dtype=dtype,
        device=device,
    )


def paper_test_gaussian(
    seed: int = 0, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> GaussianTask:
    """Test density of paper 004 (§5.1, appendix F.1): 20-D correlated Gaussian, mean 3.

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
    """A 2-D Gaussian for trajectory plots (paper 004 Fig. 2 plots one on ``[0, 6]^2``).

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


# -- double well --------------------------------------------------------------------------
class DoubleWell(ToyTask):
    """1-D double well ``U(x) = (x+4)(x+1)(x-1)(x-3)/14 + 0.5`` (paper 001 §3).

    ``pi(x) ∝ exp(-U(x))`` has modes at ``x ≈ -2.935`` and ``x ≈ 2.224``. The normaliser,
    mean and variance come from adaptive quadrature (``scipy.integrate.quad``, relative
    tolerance 1e-13) at construction. The stated default grid ``[-6, 5]`` holds all but
    3e-17 of the mass.

    Gradient noise: paper 001 writes ``grad Ũ h = grad U h + N(0, 2 B h)`` with ``B = 1``;
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
        """``grad_noise_std`` for paper 001's noise ``N(0, 2 B h)`` on ``h * grad U``.

        ``step=None`` gives SPEC §5's reading, gradient-noise variance ``2 B``
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

    def histogram_kl(self, samples: Tensor, n_bins: int = 100) -> float:
        """``KL(p_hat || p)`` between the histogram of ``samples`` on :meth:`grid` and the
        exact bin probabilities (samples outside the grid fall in the outer bins)."""
        edges = self.grid(n_bins)
        x = samples.detach().double().reshape(-1).cpu()
        if x.numel() == 0 or not bool(torch.isfinite(x).all()):
            raise ValueError("samples must be non-empty and finite")
        idx = torch.bucketize(x, edges[1:-1], right=True)
        p_hat = torch.bincount(idx, minlength=n_bins).double() / x.numel()
        p = self.bin_probabilities(edges)
        nz = p_hat > 0
        return float((p_hat[nz] * torch.log(p_hat[nz] / p[nz])).sum())

    def __repr__(self) -> str:
        return f"DoubleWell(mean={float(self.mean[0]):.4f}, var={self.var:.4f})"


# -- Gaussian mixtures --------------------------------------------------------------------
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
        self._log_norm = 0.5 * dim * (_LOG_2PI + math.log(var))

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

    def log_density(self, theta: Tensor) -> Tensor:
        """Normalised ``log p(theta)``, shape ``(K,)``."""
        return -self.energy(theta) - self._log_norm

    def sample(
        self,
        n: int,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
    ) -> Tensor:
        """``n`` exact samples (component by weight, then Gaussian), shape ``(n, D)``."""
        n = _count("n", n)
        comp = torch.multinomial(self.weights, n, replacement=True, generator=generator)
        z = torch.randn(
            n, self.dim, generator=generator, dtype=self.centres.dtype, device=self.centres.device
        )
        x = self.centres[comp] + math.sqrt(self.var) * z
        return x if dtype is None else x.to(_float_dtype(dtype))

    def mode_counts(self, samples: Tensor, radius: float = 0.25) -> Tensor:
        """Number of samples within ``radius`` of each centre, shape ``(M,)`` (paper 000 §5.1)."""
        check_positions(samples, self.dim, "samples")
        radius = _positive("radius", radius)
        x = samples.detach().double()
        c = self.centres.to(device=x.device, dtype=torch.float64)
        d2 = (x * x).sum(-1, keepdim=True) - 2.0 * x @ c.T + (c * c).sum(-1)  # (n, M), float64
        return (d2 <= radius * radius).sum(0)

    def modes_covered(self, samples: Tensor, radius: float = 0.25, min_count: int = 100) -> int:
        """Modes with at least ``min_count`` samples within ``radius`` (paper 000 Table 4:
        ``radius = 0.25``, ``min_count = 100``)."""
        min_count = _count("min_count", min_count)
        return int((self.mode_counts(samples, radius) >= min_count).sum())

    def __repr__(self) -> str:
        return (
            f"GaussianMixtureTask(n_components={self.centres.shape[0]}, dim={self.dim}, "
            f"var={self.var})"
        )


def mixture_25(
    dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> GaussianMixtureTask:
    """25 equal-weight Gaussians, means on ``{-4,-2,0,2,4}^2``, cov ``0.03 I`` (paper 000)."""
    g = torch.tensor([-4.0, -2.0, 0.0, 2.0, 4.0], dtype=torch.float64)
    centres = torch.cartesian_prod(g, g)
    return GaussianMixtureTask(centres, 0.03, dtype=dtype, device=device)


def mixture_4(
    dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> GaussianMixtureTask:
    """4 equal-weight Gaussians, means ``(±0.4, ±0.4)``, cov ``0.02 I`` (paper 002 §5.1)."""
    centres = torch.tensor(
        [[-0.4, -0.4], [-0.4, 0.4], [0.4, -0.4], [0.4, 0.4]], dtype=torch.float64
    )
    return GaussianMixtureTask(centres, 0.02, dtype=dtype, device=device)


# -- banana -------------------------------------------------------------------------------
class BananaTask(ToyTask):
    """2-D twisted Gaussian (Haario, Saksman & Tamminen 1999).

    ``x1 ~ N(0, a^2)``, ``x2 | x1 ~ N(b (x1^2 - a^2), s^2)``, so
    ``U(x) = x1^2 / (2 a^2) + (x2 - b (x1^2 - a^2))^2 / (2 s^2)``.
    Exact moments (``E x1^3 = 0``, ``Var x1^2 = 2 a^4``): ``mean = (0, 0)``,
    ``cov = diag(a^2, s^2 + 2 a^4 b^2)``. The curvature grows with ``|x1|``
    (``d^2 U / d x1^2`` reaches ``~ 4 b^2 x1^2 / s^2``), which makes state-dependent samplers
    and their correction terms matter.

    Args:
        a: standard deviation of ``x1``.
        b: twist.
        s: conditional standard deviation of ``x2``.
    """

    def __init__(
        self,
        a: float = 1.0,
        b: float = 1.0,
        s: float = 1.0,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        dtype = _float_dtype(dtype)
        self.a = _positive("a", a)
        if not (_is_real(b) and math.isfinite(b)):
            raise ValueError(f"b must be a finite number, got {b!r}")
        self.b = float(b)
        self.s = _positive("s", s)
        self.dim = 2
        self.mean = torch.zeros(2, dtype=dtype, device=device)
        var2 = self.s**2 + 2.0 * self.a**4 * self.b**2
        self.cov = torch.diag(torch.tensor([self.a**2, var2], dtype=dtype, device=device))
        self._log_norm = _LOG_2PI + math.log(self.a * self.s)

    def _residual(self, theta: Tensor) -> Tensor:
        x1, x2 = theta[:, 0], theta[:, 1]
        return x2 - self.b * (x1 * x1 - self.a**2)

    def _energy(self, theta: Tensor) -> Tensor:
        x1 = theta[:, 0]
        r = self._residual(theta)
        return 0.5 * x1 * x1 / self.a**2 + 0.5 * r * r / self.s**2

    def _grad(self, theta: Tensor) -> Tensor:
        x1 = theta[:, 0]
        r = self._residual(theta) / self.s**2
        return torch.stack((x1 / self.a**2 - 2.0 * self.b * x1 * r, r), dim=-1)

    def log_density(self, theta: Tensor) -> Tensor:
        """Normalised ``log p(theta)``, shape ``(K,)``."""
        return -self.energy(theta) - self._log_norm

    def sample(
        self,
        n: int,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
    ) -> Tensor:
        """``n`` exact samples, shape ``(n, 2)``."""
        n = _count("n", n)
        z = torch.randn(n, 2, generator=generator, dtype=self.mean.dtype, device=self.mean.device)
        x1 = self.a * z[:, 0]
        x2 = self.b * (x1 * x1 - self.a**2) + self.s * z[:, 1]
        x = torch.stack((x1, x2), dim=-1)
        return x if dtype is None else x.to(_float_dtype(dtype))

    def __repr__(self) -> str:
        return f"BananaTask(a={self.a}, b={self.b}, s={self.s})"
