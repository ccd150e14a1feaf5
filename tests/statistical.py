"""The shared statistical harness of the sampler tests: targets with known answers, one way to
run ``K`` chains, and moment / stationarity checks with stated tolerances.

In the spirit of posteriors' ``tests/sgmcmc/utils.py``: a test builds a target here, runs any
sampler on it with :func:`run_chains` and hands the samples to :func:`check_stationary` or
:func:`check_moments`; a test that shows a *wrong* setting breaks stationarity runs the very
same check through :func:`must_fail`.

Tolerances. The mean of a stationary chain is checked against an ESS-based Monte Carlo standard
error: ``se_i = sqrt(Var_i / ESS_i)`` with the multi-chain ESS of
:func:`metasampler.diagnostics.ess` (Geyer's initial monotone sequence over all chains), and a
coordinate passes when ``|mean_i - m_i| <= z se_i`` (``z = 5``: a false alarm about once in
``3.5e6`` coordinates if the chain is exact). Covariance, variance and Gaussian-fit KL bounds
include the samplers' O(eta) discretisation bias, so their values are stated per test, next to
the computation that justifies them; the absolute caps carried over from the earlier per-file
checks stay on top of the standard-error bound (a check only ever gets tighter).

Import: ``tests/conftest.py`` sits in a directory without ``__init__.py``, so pytest puts
``tests/`` on ``sys.path`` and the test modules below it ``import statistical``. (A ``tests``
package cannot be used: a dependency installs one into site-packages.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from metasampler.diagnostics import cumulative_gaussian_kl, ess, gaussian_kl
from metasampler.samplers.base import Sampler
from metasampler.sampling import SampleResult, sample
from metasampler.targets import EnergyTarget

Z_MEAN = 5.0  # standard errors allowed between a stationary chain's mean and the target's


# -- targets ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GaussianCase:
    """``N(mean, cov)`` with the energy ``U = (x - m)^T P (x - m) / 2`` and its closed-form
    gradient. ``prec`` is kept in the dtype it was computed in (the energy casts it to the
    chains' dtype), ``mean`` and ``cov`` as given."""

    mean: Tensor
    cov: Tensor
    prec: Tensor

    @classmethod
    def from_cov(cls, mean: Tensor, cov: Tensor) -> GaussianCase:
        """The case of a mean and covariance; the precision is ``inv(cov)`` in ``cov``'s dtype."""
        return cls(mean, cov, torch.linalg.inv(cov))

    @property
    def dim(self) -> int:
        """The dimension ``D``."""
        return int(self.mean.shape[0])

    def target(self, grad_noise_std: float = 0.0, n_data: int = 1) -> EnergyTarget:
        """An :class:`EnergyTarget` (closed-form gradient, optional gradient noise and ``N``)."""
        mean, prec = self.mean, self.prec

        def energy(x: Tensor) -> Tensor:
            d = x - mean.to(x)
            return 0.5 * ((d @ prec.to(x)) * d).sum(-1)

        def grad(x: Tensor) -> Tensor:
            return (x - mean.to(x)) @ prec.to(x)

        return EnergyTarget(energy, self.dim, grad_noise_std, grad_fn=grad, n_data=n_data)

    def kl(self, samples: Tensor) -> float:
        """Gaussian-fit ``KL(N(mean(x), cov(x)) || N(mean, cov))`` of pooled samples."""
        return gaussian_kl(samples, self.mean, self.cov)


def isotropic_gaussian(dim: int = 3) -> GaussianCase:
    """``N(0, I_dim)`` in float64."""
    return GaussianCase.from_cov(torch.zeros(dim, dtype=torch.float64), torch.eye(dim).double())


def diagonal_gaussian(variances: tuple[float, ...], mean: tuple[float, ...] | None = None):
    """``N(mean, diag(variances))`` in float64 (mean 0 unless given)."""
    var = torch.tensor(variances, dtype=torch.float64)
    m = torch.zeros_like(var) if mean is None else torch.tensor(mean, dtype=torch.float64)
    return GaussianCase.from_cov(m, torch.diag(var))


def correlated_gaussian() -> GaussianCase:
    """The 4-D correlated Gaussian of the baseline and thermostat tests (float64).

    AR(1)-type correlation ``0.6^|i-j|`` with scales (1, 0.7, 1.3, 0.8) and mean
    (1, -1, 0.5, 2): covariance eigenvalues 0.19 ... 2.44 (``lambda_max(P) = 5.14``); a start
    at the origin is 3.6 Mahalanobis units from the mean.
    """
    mean = torch.tensor([1.0, -1.0, 0.5, 2.0], dtype=torch.float64)
    scales = torch.tensor([1.0, 0.7, 1.3, 0.8], dtype=torch.float64)
    lags = (torch.arange(4)[:, None] - torch.arange(4)[None, :]).abs()
    return GaussianCase.from_cov(mean, scales[:, None] * scales[None, :] * 0.6**lags)


def random_gaussian(dim: int = 5, seed: int = 0) -> GaussianCase:
    """Zero-mean Gaussian with ``cov = A A^T / D + 0.3 I``, ``A`` standard normal (float32, as
    the NNSGHMC tests have always drawn it)."""
    a = torch.randn(dim, dim, generator=torch.Generator().manual_seed(seed))
    cov = a @ a.T / dim + 0.3 * torch.eye(dim)
    return GaussianCase(torch.zeros(dim, dtype=torch.float64), cov, torch.linalg.inv(cov))


@dataclass(frozen=True)
class Banana:
    """2-D twisted Gaussian (Haario et al. 1999) with ``a = b = s = 1``: ``x1 ~ N(0, 1)``,
    ``x2 | x1 ~ N(x1^2 - 1, 1)``; exact ``mean = 0`` and ``cov = diag(1, 3)``. Non-Gaussian:
    curved, with a heavier-tailed ``x2`` and a curvature that grows with ``|x1|``."""

    dim: int = 2

    @property
    def mean(self) -> Tensor:
        """The exact mean (float64)."""
        return torch.zeros(2, dtype=torch.float64)

    @property
    def cov(self) -> Tensor:
        """The exact covariance (float64)."""
        return torch.diag(torch.tensor([1.0, 3.0], dtype=torch.float64))

    def target(self, grad_noise_std: float = 0.0) -> EnergyTarget:
        """An :class:`EnergyTarget` with the closed-form gradient."""

        def energy(x: Tensor) -> Tensor:
            r = x[:, 1] - (x[:, 0] * x[:, 0] - 1.0)
            return 0.5 * x[:, 0] * x[:, 0] + 0.5 * r * r

        def grad(x: Tensor) -> Tensor:
            r = x[:, 1] - (x[:, 0] * x[:, 0] - 1.0)
            return torch.stack((x[:, 0] - 2.0 * x[:, 0] * r, r), dim=-1)

        return EnergyTarget(energy, 2, grad_noise_std, grad_fn=grad)


class DoubleWell:
    """1-D double well of paper 001 Fig. 1, ``U = (x + 4)(x + 1)(x - 1)(x - 3) / 14 + 0.5``,
    with exact bin probabilities on ``[-6, 5]`` (110 bins) and exact draws (inverse CDF).

    The density outside ``[-6, 5]`` is below ``1e-15`` of the total; bin probabilities come from
    the trapezoid rule with 40 nodes per bin.
    """

    dim = 1
    edges = np.linspace(-6.0, 5.0, 111)
    _fine = np.linspace(-6.0, 5.0, 110 * 40 + 1)

    @staticmethod
    def energy(x: Tensor) -> Tensor:
        """``U(x)`` for positions ``(K, 1)``."""
        x = x[:, 0]
        return (x + 4) * (x + 1) * (x - 1) * (x - 3) / 14 + 0.5

    @staticmethod
    def grad(x: Tensor) -> Tensor:
        """``U'(x)``: ``U = (x^4 + x^3 - 13 x^2 - x + 12) / 14 + 0.5``."""
        return (4 * x**3 + 3 * x**2 - 26 * x - 1) / 14

    def _cdf(self) -> tuple[np.ndarray, float]:
        dens = np.exp(-self.energy(torch.from_numpy(self._fine)[:, None]).numpy())
        steps = (dens[1:] + dens[:-1]) / 2 * np.diff(self._fine)
        cdf = np.concatenate([[0.0], np.cumsum(steps)])
        return cdf, float(cdf[-1])

    def bin_probabilities(self) -> np.ndarray:
        """Exact probabilities of the 110 bins of :attr:`edges`."""
        cdf, mass = self._cdf()
        return np.diff(cdf[::40]) / mass

    def exact_draws(self, n: int, seed: int) -> Tensor:
        """``n`` draws from the density, shape ``(n, 1)`` (inverse CDF on the quadrature grid)."""
        cdf, mass = self._cdf()
        u = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        return torch.from_numpy(np.interp(u.numpy(), cdf / mass, self._fine))[:, None]

    def target(self, grad_noise_std: float = 0.0) -> EnergyTarget:
        """An :class:`EnergyTarget` with the closed-form gradient."""
        return EnergyTarget(self.energy, 1, grad_noise_std, grad_fn=self.grad)

    def histogram_kl(self, samples: Tensor) -> float:
        """``KL(q || p)`` of the samples' histogram ``q`` to the exact bin probabilities ``p``
        (bins with ``q = 0`` contribute nothing); asserts that (almost) no sample falls outside
        the grid."""
        counts, _ = np.histogram(samples.numpy().ravel(), bins=self.edges)
        q = counts / samples.numel()
        assert q.sum() > 0.999, q.sum()
        p, m = self.bin_probabilities(), q > 0
        return float((q[m] * np.log(q[m] / p[m])).sum())


# -- running chains -----------------------------------------------------------------------------
def run_chains(
    sampler: Sampler,
    target: Any,
    n_chains: int,
    n_steps: int,
    *,
    seed: int,
    init: Tensor | None = None,
    burn_in: int = 0,
    thin: int = 1,
    dtype: torch.dtype | None = None,
) -> SampleResult:
    """``K = n_chains`` chains of any sampler, seeded, without a progress bar.

    ``dtype`` defaults to the start's dtype (float32 for the default ``N(0, I)`` starts).
    """
    if dtype is None:
        dtype = torch.float32 if init is None else init.dtype
    return sample(
        sampler, target, n_chains, n_steps, init=init, burn_in=burn_in, thin=thin, seed=seed,
        progress=False, dtype=dtype,
    )  # fmt: skip


# -- checks -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Moments:
    """How far the pooled samples' moments are from the target's.

    Attributes:
        mean_error: ``|mean(x) - m|`` per coordinate.
        mean_se: ESS-based Monte Carlo standard error of each sample mean.
        cov_error: ``max_ij |C_hat - C|_ij / (sd_i sd_j)`` (correlation units).
        var_ratio: ``diag(C_hat) / diag(C)``.
        kl: Gaussian-fit KL to ``N(m, C)`` (meaningful for Gaussian targets).
    """

    mean_error: np.ndarray
    mean_se: np.ndarray
    cov_error: float
    var_ratio: np.ndarray
    kl: float

    @property
    def max_mean_error(self) -> float:
        """The largest coordinate error of the mean."""
        return float(self.mean_error.max())

    @property
    def mean_z(self) -> float:
        """The largest mean error in standard errors."""
        return float((self.mean_error / self.mean_se).max())

    @property
    def max_var_error(self) -> float:
        """``max_i |var_ratio_i - 1|``."""
        return float(np.abs(self.var_ratio - 1.0).max())

    def __str__(self) -> str:
        return (
            f"mean error {np.round(self.mean_error, 4)} (z {self.mean_z:.2f}), "
            f"cov error {self.cov_error:.4f}, var ratio {np.round(self.var_ratio, 4)}, "
            f"KL {self.kl:.2e}"
        )


def moments(samples: Tensor, mean: Tensor, cov: Tensor) -> Moments:
    """Compare ``(S, K, D)`` samples (chains stay apart for the ESS) with ``N(mean, cov)``."""
    x = samples.detach().double().cpu().numpy()
    m, c = mean.double().cpu().numpy(), cov.double().cpu().numpy()
    flat = x.reshape(-1, x.shape[-1])
    c_hat = np.cov(flat.T).reshape(c.shape)
    sd = np.sqrt(np.diag(c))
    se = np.sqrt(np.diag(c_hat) / ess(x))
    return Moments(
        mean_error=np.abs(flat.mean(0) - m),
        mean_se=se,
        cov_error=float((np.abs(c_hat - c) / np.outer(sd, sd)).max()),
        var_ratio=np.diag(c_hat) / np.diag(c),
        kl=gaussian_kl(flat, m, c),
    )


def check_moments(
    samples: Tensor,
    mean: Tensor,
    cov: Tensor,
    *,
    mean_atol: float,
    z: float | None = Z_MEAN,
    cov_atol: float | None = None,
    var_rtol: float | None = None,
    kl_max: float | None = None,
) -> Moments:
    """Assert that the moments of ``(S, K, D)`` samples match ``N(mean, cov)``'s.

    Args:
        samples: kept samples (after burn-in).
        mean, cov: the target's mean and covariance.
        mean_atol: cap on every coordinate's mean error.
        z: every mean error must also be within ``z`` ESS-based standard errors (``None``:
            skip, for targets where the sampler's bias moves the mean).
        cov_atol: cap on the covariance error in correlation units.
        var_rtol: cap on ``|var_ratio - 1|``.
        kl_max: cap on the Gaussian-fit KL.

    Returns:
        The :class:`Moments` (for further assertions).
    """
    got = moments(samples, mean, cov)
    assert got.max_mean_error < mean_atol, f"mean: {got}"
    if z is not None:
        assert got.mean_z < z, f"mean beyond {z} standard errors: {got}"
    if cov_atol is not None:
        assert got.cov_error < cov_atol, f"covariance: {got}"
    if var_rtol is not None:
        assert got.max_var_error < var_rtol, f"variance: {got}"
    if kl_max is not None:
        assert got.kl < kl_max, f"KL: {got}"
    return got


def check_stationary(
    theta: Tensor,
    case: GaussianCase,
    burn_in: int,
    *,
    kl_max: float = 0.01,
    mean_atol: float = 0.1,
    cov_atol: float = 0.1,
    z: float | None = Z_MEAN,
) -> Moments:
    """A run of all steps ``(n, K, D)`` from a start far out converges to ``case``:

    * the Gaussian-fit KL of all samples so far falls over the run (at n/20, n/4 and n steps);
    * after ``burn_in``, :func:`check_moments` with the given caps.
    """
    n = theta.shape[0]
    cumulative = cumulative_gaussian_kl(theta, case.mean, case.cov, at=[n // 20, n // 4, n])
    assert cumulative[0] > cumulative[1] > cumulative[2], cumulative
    return check_moments(
        theta[burn_in:], case.mean, case.cov, mean_atol=mean_atol, z=z, cov_atol=cov_atol,
        kl_max=kl_max,
    )  # fmt: skip


def must_fail(check: Callable[[], Any], why: str) -> AssertionError:
    """Run a check that must *fail* (a wrong setting must break stationarity); return its
    assertion error. Fails the test if the check passes."""
    try:
        check()
    except AssertionError as error:
        return error
    raise AssertionError(f"the check passed although {why}")
