"""What the toy targets share: argument checks and the :class:`ToyTask` base class.

Every toy task holds the exact target ``pi(theta) ∝ exp(-U(theta))`` (temperature 1, docs/METHOD.md
§1) and its known moments, and hands out a :class:`metasampler.EnergyTarget` with a closed-form
gradient (no autograd in the sampling loop) and optional injected gradient noise
``grad Ũ = grad U + sigma * N(0, I)``. Energies omit additive constants; ``log_density`` is
normalised. Exact parameters are kept in float64 (unless another ``dtype`` is asked for);
``energy``/``grad`` compute in the dtype and on the device of the positions they are given,
which are ``(K, D)`` tensors (one row per chain), and every method is vectorised over chains.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
from torch import Tensor

from metasampler.targets import EnergyTarget, check_positions

__all__ = ["ToyTask", "LOG_2PI"]

LOG_2PI = math.log(2.0 * math.pi)


# -- argument checks (shared by the toy task modules) --------------------------------------
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

    Subclasses set ``dim``, ``mean`` ``(D,)``, ``cov`` ``(D, D)`` and ``_log_norm`` (``log Z``
    of ``pi = exp(-U) / Z``) and implement ``_energy(theta)`` and ``_grad(theta)`` on
    already-validated ``(K, D)`` tensors, and ``_sample(n, generator)`` if they can draw exact
    samples.
    """

    dim: int
    mean: Tensor
    cov: Tensor
    _log_norm: float
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

    def _sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} draws no exact samples")

    def energy(self, theta: Tensor) -> Tensor:
        """Energy ``U(theta)`` without additive constant, shape ``(K,)``."""
        check_positions(theta, self.dim)
        return self._energy(theta)

    def grad(self, theta: Tensor) -> Tensor:
        """Closed-form ``grad U(theta)``, shape ``(K, D)``."""
        check_positions(theta, self.dim)
        return self._grad(theta)

    def log_density(self, theta: Tensor) -> Tensor:
        """Normalised ``log pi(theta) = -U(theta) - log Z``, shape ``(K,)``."""
        return -self.energy(theta) - self._log_norm

    def sample(
        self,
        n: int,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
    ) -> Tensor:
        """``n`` exact samples, shape ``(n, D)``, in the task's dtype unless ``dtype`` is given."""
        x = self._sample(_count("n", n), generator)
        return x if dtype is None else x.to(_float_dtype(dtype))

    def target(
        self,
        grad_noise_std: float = 0.0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> EnergyTarget:
        """An :class:`~metasampler.EnergyTarget` for this task.

        Args:
            grad_noise_std: ``sigma`` of the injected gradient noise
                ``grad Ũ = grad U + sigma N(0, I)`` (docs/METHOD.md §1); 0 gives exact gradients.
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
