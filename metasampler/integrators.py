"""Pure step functions: the discretisations the samplers are built from.

Kept apart from the samplers (BlackJAX-style) so that a sampler file only says which
integrator, which coefficients and which schedule. Every function works on ``(K, D)``
tensors and returns new tensors; nothing is modified in place. Gradients come in either as a
tensor (integrators that use the gradient at the incoming position) or through
``grad_fn(theta) -> (K, D)`` (integrators that move ``theta`` before evaluating it).

Equations: docs/METHOD.md §2; the SGHMC update is the modified Euler scheme of Gong et al. (ICLR
2019, appendix A, eq. 17); thermostat integrators follow Li et al. (AAAI 2016, §3).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "complete_recipe_momentum",
    "complete_recipe_position",
    "gaussian_like",
    "gradient_noise_diffusion",
    "langevin_step",
    "sghmc_step",
    "thermostat_euler_step",
    "thermostat_feedback",
    "thermostat_friction",
    "thermostat_splitting_step",
]


def gaussian_like(
    x: Tensor, generator: torch.Generator | None, std: float | Tensor = 1.0
) -> Tensor:
    """``std * N(0, I)`` with the shape, dtype and device of ``x``."""
    return std * torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)


def langevin_step(
    theta: Tensor,
    grad: Tensor,
    eta: float,
    temperature: float,
    generator: torch.Generator | None,
    preconditioner: Tensor | float = 1.0,
) -> Tensor:
    """Euler–Maruyama for overdamped Langevin, optionally preconditioned by diagonal ``G``:
    ``theta - eta * G * grad + N(0, 2 * eta * T * G)``."""
    new = theta - eta * preconditioner * grad
    if temperature > 0:
        std = (2.0 * eta * temperature * preconditioner) ** 0.5
        new = new + gaussian_like(theta, generator, std)
    return new


def gradient_noise_diffusion(
    eta: float | Tensor, noise_var: float | Tensor, temperature: float | Tensor
) -> float | Tensor:
    """``B / T = eta V / (2 T)``: a gradient with noise variance ``V`` taken with step ``eta``
    adds ``eta^2 V`` to the momentum's variance per step, the diffusion ``B`` (Chen et al.
    2014's ``B_hat``), at temperature ``T``, per unit curl squared. A sampler either leaves
    ``B`` out of its injected noise (it must stay below the friction) or adds ``B / T`` to its
    friction (``grad_noise_friction``), so that ``B`` is dissipated whatever its size."""
    return eta * noise_var / (2.0 * temperature)


def sghmc_step(
    theta: Tensor,
    momentum: Tensor,
    grad: Tensor,
    eta: float,
    friction: float | Tensor,
    noise_estimate: float | Tensor,
    temperature: float,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor]:
    """Modified Euler for SGHMC:
    ``p <- (1 - eta*C) p - eta*grad + N(0, 2*eta*(C - B)*T)``; ``theta <- theta + eta*p``;
    ``C`` and ``B`` numbers or per coordinate (where ``B > C`` no noise is injected)."""
    new_p = (1.0 - eta * friction) * momentum - eta * grad
    if temperature > 0:
        variance = 2.0 * eta * (friction - noise_estimate) * temperature
        if isinstance(variance, Tensor):
            new_p = new_p + gaussian_like(momentum, generator) * variance.clamp_min(0.0).sqrt()
        elif variance > 0:
            new_p = new_p + gaussian_like(momentum, generator, math.sqrt(variance))
    return theta + eta * new_p, new_p


def complete_recipe_momentum(
    momentum: Tensor,
    grad: Tensor,
    curl: Tensor,
    diffusion: Tensor,
    gamma_p: Tensor | None,
    noise: Tensor | None,
    eta: float | Tensor,
    temperature: float | Tensor,
    grad_noise_var: float | Tensor | None = None,
) -> Tensor:
    """Momentum half of the modified Euler step of a diagonal complete recipe (NNSGHMC,
    Gong et al. 2019, eq. 7) with per-coordinate curl ``Q`` and friction ``D``:
    ``p <- (1 - eta D) p - eta Q grad + eta T Gamma_p + sqrt(2 eta T D - eta^2 Q^2 V) xi``;
    ``noise`` is ``xi ~ N(0, I)`` (``None``: no noise), ``gamma_p`` ``None``: no Gamma term.

    ``grad_noise_var`` ``V`` (``None``: 0) is the known variance of the gradient's noise per
    coordinate: ``eta Q grad`` already carries ``eta^2 Q^2 V`` of momentum variance, so the
    injected noise gives only the rest (SGHMC's ``B_hat = eta Q^2 V / 2`` correction, Chen et
    al. 2014; where ``B_hat > T D`` it injects none and the chain stays a little hot)."""
    new_p = (1.0 - eta * diffusion) * momentum - eta * curl * grad
    if gamma_p is not None:
        new_p = new_p + (eta * temperature) * gamma_p
    if noise is not None:
        variance = (2.0 * eta * temperature) * diffusion
        if grad_noise_var is not None:
            variance = variance - (eta * curl).square() * grad_noise_var
        # below 1e-20 counts as 0 inside the root, so its gradient stays finite
        new_p = new_p + noise * torch.sqrt(variance.clamp_min(1e-20))
    return new_p


def complete_recipe_position(
    theta: Tensor,
    new_momentum: Tensor,
    curl: Tensor,
    gamma_theta: Tensor | None,
    eta: float | Tensor,
    temperature: float | Tensor,
) -> Tensor:
    """Position half: ``theta <- theta + eta Q(z~) p_{t+1} + eta T Gamma_theta(z~)`` with
    ``z~ = (theta_t, p_{t+1})``."""
    new_theta = theta + eta * curl * new_momentum
    if gamma_theta is not None:
        new_theta = new_theta + (eta * temperature) * gamma_theta
    return new_theta


def thermostat_feedback(
    xi: Tensor, momentum: Tensor, h: float, temperature: float, multivariate: bool = True
) -> Tensor:
    """The thermostat's own flow for a time ``h``: ``xi + h (p*p - T)`` per coordinate
    (mSGNHT) or with ``p*p`` averaged over each chain's coordinates (scalar SGNHT). It is the
    feedback that raises the friction where the momentum runs hot, whatever heats it."""
    kinetic = momentum * momentum
    if not multivariate:
        kinetic = kinetic.mean(dim=1, keepdim=True).expand_as(momentum)
    return xi + h * (kinetic - temperature)


def thermostat_friction(momentum: Tensor, xi: Tensor, h: float) -> Tensor:
    """The momentum under the thermostat's friction alone for a time ``h``, solved exactly:
    ``p exp(-xi h)``."""
    return momentum * torch.exp(-h * xi)


def thermostat_euler_step(
    theta: Tensor,
    momentum: Tensor,
    xi: Tensor,
    grad_fn: Callable[[Tensor], Tensor],
    h: float,
    diffusion: float,
    temperature: float,
    multivariate: bool,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Euler for (m)SGNHT: ``theta += h p``;
    ``p += -h grad U(theta) - h xi p + sqrt(2 A h T) N(0, 1)``; ``xi += h (p*p - T)``.

    ``xi`` has the shape of ``theta``; the scalar thermostat keeps one value per chain,
    repeated over coordinates. At ``T = 1`` this is exactly the update of docs/METHOD.md §2. No
    noise is drawn when ``T = 0`` or ``A = 0``.
    """
    theta = theta + h * momentum
    momentum = momentum - h * grad_fn(theta) - h * xi * momentum
    if temperature > 0 and diffusion > 0:
        momentum = momentum + gaussian_like(
            momentum, generator, math.sqrt(2 * diffusion * h * temperature)
        )
    xi = thermostat_feedback(xi, momentum, h, temperature, multivariate)
    return theta, momentum, xi


def thermostat_splitting_step(
    theta: Tensor,
    momentum: Tensor,
    xi: Tensor,
    grad_fn: Callable[[Tensor], Tensor],
    h: float,
    diffusion: float,
    temperature: float,
    multivariate: bool,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Symmetric splitting A-B-O-B-A for (m)SGNHT, one gradient per step (Li et al. 2016, §3):

    A: ``theta += p h/2``, ``xi += (p*p - T) h/2``; B: ``p *= exp(-xi h/2)``;
    O: ``p += -grad U(theta) h + sqrt(2 A h T) N(0, 1)``; B; A.
    """
    half = 0.5 * h
    # A (its two halves commute: both read p alone), B
    theta = theta + half * momentum
    xi = thermostat_feedback(xi, momentum, half, temperature, multivariate)
    momentum = thermostat_friction(momentum, xi, half)
    momentum = momentum - h * grad_fn(theta)
    if temperature > 0 and diffusion > 0:
        momentum = momentum + gaussian_like(
            momentum, generator, math.sqrt(2 * diffusion * h * temperature)
        )
    momentum = thermostat_friction(momentum, xi, half)  # B, A
    xi = thermostat_feedback(xi, momentum, half, temperature, multivariate)
    theta = theta + half * momentum
    return theta, momentum, xi
