"""Targets: energies evaluated on ``K`` chains at once (docs/METHOD.md §1).

A target is anything with a ``dim``, an ``n_data`` and an ``evaluate`` method that maps a
``(K, D)`` tensor of positions to an :class:`Evaluation`. The sampling distribution is
``pi(theta) ∝ exp(-U(theta) / T)``.

Two kinds ship with the library:

* :class:`EnergyTarget` wraps any differentiable ``energy_fn: (K, D) -> (K,)`` (toy tasks),
  optionally with injected Gaussian gradient noise ``grad Ũ = grad U + sigma * N(0, I)``.
* :class:`metasampler.BayesianModel` turns an ``nn.Module`` and a dataset into a minibatch
  energy (see ``bayesian.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = ["Evaluation", "Target", "EnergyTarget", "NonFiniteError", "check_positions"]


class NonFiniteError(RuntimeError):
    """A chain produced a NaN or infinite energy, gradient or position, or a step's scalars
    (step size, temperature) overflow the chains' dtype.

    Attributes:
        step: the 1-based step at which it happened (0: the start positions), or ``None``.
        chain: the first affected chain, or ``None`` when every chain is (a bad step size).
        quantity: what is not finite (``"position"``, ``"energy"``, ``"step size"``, ...).
    """

    def __init__(
        self,
        message: str,
        *,
        step: int | None = None,
        chain: int | None = None,
        quantity: str | None = None,
    ) -> None:
        super().__init__(message)
        self.step = step
        self.chain = chain
        self.quantity = quantity

    def __reduce__(self):  # keep the fields through pickling (torchrun sends errors around)
        return (_rebuild_non_finite, (str(self), self.step, self.chain, self.quantity))


def _rebuild_non_finite(message, step, chain, quantity) -> NonFiniteError:
    return NonFiniteError(message, step=step, chain=chain, quantity=quantity)


@dataclass
class Evaluation:
    """One (stochastic) evaluation of a target on ``K`` chains.

    Attributes:
        energy: ``(K,)`` minibatch energy ``Ũ(theta)`` (likelihood part scaled by ``N/M``).
        grad: ``(K, D)`` gradient ``grad Ũ(theta)`` including any injected noise.
        prior_energy: ``(K,)`` ``-log p(theta)`` part of ``energy`` (zeros for toy targets).
        prior_grad: ``(K, D)`` gradient of ``prior_energy``.
        grad_noise_var: ``(K, D)`` an unbiased estimate of the variance of ``grad``'s
            noise per coordinate, detached; ``None`` unless asked for
            (``evaluate(..., estimate_noise=True)`` of a target with ``estimates_grad_noise``:
            :class:`~metasampler.BayesianModel`, :class:`EnergyTarget`).
    """

    energy: Tensor
    grad: Tensor
    prior_energy: Tensor
    prior_grad: Tensor
    grad_noise_var: Tensor | None = None


@runtime_checkable
class Target(Protocol):
    """What a sampler needs from a target."""

    dim: int
    n_data: int

    def evaluate(
        self, theta: Tensor, generator: torch.Generator | None = None, create_graph: bool = False
    ) -> Evaluation:
        """Energy and gradient at ``theta`` of shape ``(K, dim)``.

        ``generator`` drives every random choice (minibatch, injected noise) so runs are
        reproducible. ``create_graph=True`` keeps the gradient differentiable with respect
        to ``theta`` (second-order meta-training); otherwise the returned tensors are detached.
        """
        ...


def check_positions(theta: Tensor, dim: int, name: str = "theta") -> None:
    """Raise ``ValueError`` unless ``theta`` is a floating ``(K, dim)`` tensor."""
    if not isinstance(theta, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape (K, {dim}), got {type(theta)}")
    if theta.ndim != 2 or theta.shape[1] != dim:
        raise ValueError(
            f"{name} must have shape (K, {dim}) (one row per chain), got {tuple(theta.shape)}"
        )
    if not theta.is_floating_point():
        raise ValueError(f"{name} must be floating point, got {theta.dtype}")


def energy_and_grad(
    energy_fn: Callable[[Tensor], Tensor], theta: Tensor, create_graph: bool = False
) -> tuple[Tensor, Tensor]:
    """``(U, grad U)`` of a batched energy by reverse-mode autograd.

    Chains are independent, so the gradient of ``sum_k U(theta_k)`` is the per-chain gradient.
    """
    with torch.enable_grad():
        x = theta if create_graph and theta.requires_grad else theta.detach().requires_grad_(True)
        energy = energy_fn(x)
        if energy.shape != theta.shape[:1]:
            raise ValueError(
                f"energy_fn must map (K, D) to (K,), got output shape {tuple(energy.shape)} "
                f"for input {tuple(theta.shape)}"
            )
        (grad,) = torch.autograd.grad(energy.sum(), x, create_graph=create_graph)
    if not create_graph:
        energy, grad = energy.detach(), grad.detach()
    return energy, grad


class EnergyTarget:
    """A target given by a differentiable batched energy ``U: (K, D) -> (K,)``.

    Args:
        energy_fn: maps positions ``(K, D)`` to energies ``(K,)``; differentiable by autograd.
        dim: dimension ``D`` of the position space.
        grad_noise_std: standard deviation ``sigma`` of Gaussian noise added to every gradient
            coordinate, mimicking minibatch noise (docs/METHOD.md §1). ``0`` gives exact gradients.
        grad_fn: optional closed-form gradient ``(K, D) -> (K, D)``; skips autograd when given
            (used only when ``create_graph`` is false).
        n_data: the ``N`` used to turn energies into per-datum energies (1 for toy targets).
    """

    def __init__(
        self,
        energy_fn: Callable[[Tensor], Tensor],
        dim: int,
        grad_noise_std: float = 0.0,
        grad_fn: Callable[[Tensor], Tensor] | None = None,
        n_data: int = 1,
    ) -> None:
        if not callable(energy_fn):
            raise ValueError("energy_fn must be callable: (K, D) -> (K,)")
        if int(dim) != dim or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        if not grad_noise_std >= 0:
            raise ValueError(f"grad_noise_std must be >= 0, got {grad_noise_std!r}")
        if int(n_data) != n_data or n_data < 1:
            raise ValueError(f"n_data must be a positive integer, got {n_data!r}")
        self.energy_fn = energy_fn
        self.grad_fn = grad_fn
        self.dim = int(dim)
        self.grad_noise_std = float(grad_noise_std)
        self.n_data = int(n_data)

    def energy(self, theta: Tensor) -> Tensor:
        """Exact energy ``U(theta)``, shape ``(K,)``."""
        return self.energy_fn(theta)

    #: :meth:`evaluate` can estimate its injected noise's variance (``estimate_noise=True``),
    #: as a minibatch's two halves do (``NNSGHMC(grad_noise_estimate=True)`` asks for it).
    estimates_grad_noise = True

    def evaluate(
        self,
        theta: Tensor,
        generator: torch.Generator | None = None,
        create_graph: bool = False,
        estimate_noise: bool = False,
    ) -> Evaluation:
        """Energy and gradient (plus the injected noise) at ``theta`` ``(K, D)``.

        ``estimate_noise=True`` draws the noise as a minibatch's is, the mean of two
        independent halves ``h_a, h_b ~ N(0, 2 sigma^2)`` (the same ``N(0, sigma^2)`` in
        ``grad``), and returns ``grad_noise_var = (h_a - h_b)^2 / 4``, an unbiased one-draw
        estimate of ``sigma^2`` per coordinate, as
        :meth:`BayesianModel.evaluate <metasampler.BayesianModel.evaluate>` gives from its
        minibatch's halves. The sampler is not told ``sigma``: it sees the halves only.
        """
        check_positions(theta, self.dim)
        if self.grad_fn is not None and not create_graph:
            with torch.no_grad():
                energy, grad = self.energy_fn(theta), self.grad_fn(theta)
        else:
            energy, grad = energy_and_grad(self.energy_fn, theta, create_graph)
        noise_var = None
        if estimate_noise and self.grad_noise_std == 0:
            noise_var = torch.zeros_like(grad)
        elif estimate_noise:
            shape = (2, *theta.shape)
            z = torch.randn(shape, generator=generator, dtype=theta.dtype, device=theta.device)
            halves = z * (math.sqrt(2.0) * self.grad_noise_std)
            grad = grad + 0.5 * (halves[0] + halves[1])
            noise_var = 0.25 * (halves[0] - halves[1]).square()
        elif self.grad_noise_std > 0:
            noise = torch.randn(
                theta.shape, generator=generator, dtype=theta.dtype, device=theta.device
            )
            grad = grad + self.grad_noise_std * noise
        zeros = torch.zeros_like(energy)
        return Evaluation(energy, grad, zeros, torch.zeros_like(grad), noise_var)
