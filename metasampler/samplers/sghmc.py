"""SGHMC — stochastic gradient Hamiltonian Monte Carlo (Chen, Fox & Guestrin, ICML 2014).

SDE (Hamiltonian ``H = U(theta) + p.p/2``, friction ``C``, gradient-noise estimate ``B``)::

    d theta = p dt
    d p     = -grad U(theta) dt - C p dt + N(0, 2 (C - B) T dt)

Discretised by the modified Euler scheme (Gong et al. ICLR 2019, appendix A, eq. 17)::

    p     <- (1 - eta C) p - eta grad Ũ(theta) + N(0, 2 eta (C - B) T)
    theta <- theta + eta p

One gradient evaluation per step. ``lr`` converts as ``eta = sqrt(lr / N)``. With a
:class:`~metasampler.schedules.CyclicalCosine` schedule this is cSGHMC (Zhang et al. 2020).
"""

from __future__ import annotations

import math

import torch

from ..gradient_noise import update_noise_var
from ..integrators import gaussian_like, gradient_noise_diffusion, sghmc_step
from ..schedules import Schedule
from ..targets import Target
from .base import Sampler, SamplerState

__all__ = ["SGHMC"]


class SGHMC(Sampler):
    """SGHMC with friction ``C`` and gradient-noise estimate ``B`` (``0 <= B <= C``).

    Args:
        eta / lr: step (see :class:`~metasampler.samplers.base.Sampler`).
        friction: ``C > 0``.
        noise_estimate: ``B >= 0``, the estimated variance scale of the gradient noise
            (injected noise ``N(0, 2 B eta)`` per coordinate corresponds to ``B``).
        grad_noise_estimate: estimate ``B`` instead, per chain and coordinate, as
            ``eta V / (2 T)`` from the running mean of the target's estimated gradient-noise
            variance ``V`` (:mod:`metasampler.gradient_noise`; e.g.
            :class:`~metasampler.BayesianModel`, :class:`~metasampler.EnergyTarget`), so that
            the injected noise leaves out the ``eta^2 V`` the gradient's noise brings.
        grad_noise_friction: while ``grad_noise_estimate`` is on, add the estimate to the friction
            instead, ``C + B``, and inject ``N(0, 2 eta C T)``: the gradient's noise is then
            dissipated where it exceeds ``C`` too (as a thermostat's friction rises with it),
            rather than leaving those coordinates hot. The step multiplies the momentum by
            ``1 - eta (C + B)``: where that friction per step nears 2 (a large ``V`` at a large
            step) it overshoots and the chain diverges (research/NOTEBOOK.md).
        temperature, schedule: as for every sampler.
        momentum_init: ``"normal"`` draws ``p ~ N(0, T I)`` (the stationary law), ``"zeros"``
            starts at rest.
    """

    order = "second"
    unit_gaussian_momentum = True

    def __init__(
        self,
        *,
        eta: float | None = None,
        lr: float | None = None,
        friction: float = 1.0,
        noise_estimate: float = 0.0,
        temperature: float = 1.0,
        schedule: Schedule | None = None,
        momentum_init: str = "normal",
        grad_noise_estimate: bool = False,
        grad_noise_friction: bool = False,
    ) -> None:
        super().__init__(eta=eta, lr=lr, temperature=temperature, schedule=schedule)
        if not (friction > 0 and math.isfinite(friction)):
            raise ValueError(f"friction must be a finite number > 0, got {friction!r}")
        if not 0 <= noise_estimate <= friction:
            raise ValueError(
                f"noise_estimate must satisfy 0 <= noise_estimate <= friction ({friction}), "
                f"got {noise_estimate!r}"
            )
        if momentum_init not in ("normal", "zeros"):
            raise ValueError(f"momentum_init must be 'normal' or 'zeros', got {momentum_init!r}")
        self.friction = float(friction)
        self.noise_estimate = float(noise_estimate)
        self.momentum_init = momentum_init
        self.grad_noise_estimate = bool(grad_noise_estimate)
        self.grad_noise_friction = bool(grad_noise_friction)

    def _init_extras(
        self, state: SamplerState, target: Target, generator: torch.Generator | None
    ) -> SamplerState:
        state.momentum = init_momentum(state.theta, self.momentum_init, self.temperature, generator)
        return state

    def _step(self, state, target, eta, temperature, generator):
        k = state.step + 1
        ev = self.evaluate(
            target, state.theta, k, generator, estimate_noise=self.grad_noise_estimate
        )
        noise_var = update_noise_var(state.extras.get("noise_var"), ev, k)
        noise_estimate, friction = self.noise_estimate, self.friction
        if noise_var is not None and temperature > 0:
            noise_estimate = gradient_noise_diffusion(eta, noise_var, temperature)
            if self.grad_noise_friction:
                friction = friction + noise_estimate
        theta, momentum = sghmc_step(
            state.theta, state.momentum, ev.grad, eta, friction, noise_estimate,
            temperature, generator,
        )  # fmt: skip
        extras = {} if noise_var is None else {"noise_var": noise_var}
        return SamplerState(theta, momentum, extras, state.step, state.eta, ev.energy)


def init_momentum(
    theta: torch.Tensor, how: str, temperature: float, generator: torch.Generator | None
) -> torch.Tensor:
    """Initial momenta: ``N(0, T I)`` (``"normal"``) or zeros (``"zeros"``)."""
    if how == "zeros":
        return torch.zeros_like(theta)
    return gaussian_like(theta, generator, math.sqrt(temperature))
