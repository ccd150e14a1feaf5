"""SGNHT / mSGNHT — stochastic gradient Nosé–Hoover thermostats (Ding et al., NIPS 2014;
multivariate: Gan et al., ICML 2015), with the Euler or the symmetric-splitting integrator of
Li, Chen, Fan & Carin (AAAI 2016).

State ``(theta, p, xi)``; SDE at temperature ``T`` with diffusion constant ``A``::

    d theta = p dt
    d p     = -grad U(theta) dt - xi * p dt + N(0, 2 A T dt)
    d xi    = (p * p - T) dt                 (mSGNHT: one thermostat per coordinate)
    d xi    = (mean_i p_i^2 - T) dt          (SGNHT: one thermostat per chain)

Its stationary law has ``theta ~ exp(-U / T)``, ``p ~ N(0, T I)`` and ``xi`` centred on ``A``.
The thermostat absorbs unknown gradient noise: with gradient noise of variance ``sigma^2`` the
momentum receives extra diffusion ``B = eta sigma^2 / 2`` and ``xi`` settles near
``A + B / T``.

Integrators (docs/METHOD.md §2, written for ``T = 1`` there; see
:func:`~metasampler.integrators.thermostat_euler_step` and
:func:`~metasampler.integrators.thermostat_splitting_step`):

* ``"euler"`` (Li et al. 2016, §2.2, first order)::

      theta <- theta + h p
      p     <- p - h grad Ũ(theta) - h xi p + N(0, 2 A h T)
      xi    <- xi + h (p * p - T)

* ``"splitting"`` (Li et al. 2016, §3, symmetric A-B-O-B-A, second order)::

      A: theta += p h/2, xi += (p * p - T) h/2;   B: p *= exp(-xi h/2)
      O: p += -h grad Ũ(theta) + N(0, 2 A h T);   B;   A

Both move ``theta`` before the one gradient evaluation of the step, so the energy recorded in
the state is that of the intermediate position (``theta_{t+1}`` for Euler, ``theta_{t+1/2}``
for splitting). ``lr`` converts as ``eta = sqrt(lr / N)`` (``h = eta``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..integrators import thermostat_euler_step, thermostat_splitting_step
from ..schedules import Schedule
from ..targets import Evaluation, Target
from .base import Sampler, SamplerState
from .sghmc import init_momentum

__all__ = ["SGNHT"]

_INTEGRATORS = {"euler": thermostat_euler_step, "splitting": thermostat_splitting_step}


class SGNHT(Sampler):
    """Stochastic gradient Nosé–Hoover thermostat, scalar (SGNHT) or per coordinate (mSGNHT).

    Args:
        eta / lr: step ``h`` (see :class:`~metasampler.samplers.base.Sampler`).
        diffusion: ``A >= 0``, the diffusion constant; also the initial thermostat value.
            ``A = 0`` injects no noise at all (the gradient noise then drives the chain).
        multivariate: one thermostat per coordinate (mSGNHT) instead of one per chain.
        integrator: ``"euler"`` or ``"splitting"`` (symmetric splitting, SSI).
        temperature, schedule: as for every sampler.
        momentum_init: ``"normal"`` draws ``p ~ N(0, T I)``, ``"zeros"`` starts at rest.

    State: ``state.momentum`` and ``state.extras["xi"]``, both ``(K, D)``; the scalar
    thermostat stores its one value per chain repeated over the coordinates.
    """

    order = "second"
    unit_gaussian_momentum = True
    thermostatted = True

    def __init__(
        self,
        *,
        eta: float | None = None,
        lr: float | None = None,
        diffusion: float = 1.0,
        multivariate: bool = False,
        integrator: str = "splitting",
        temperature: float = 1.0,
        schedule: Schedule | None = None,
        momentum_init: str = "normal",
    ) -> None:
        super().__init__(eta=eta, lr=lr, temperature=temperature, schedule=schedule)
        if not (diffusion >= 0 and math.isfinite(diffusion)):
            raise ValueError(f"diffusion (A) must be a finite number >= 0, got {diffusion!r}")
        if integrator not in _INTEGRATORS:
            raise ValueError(
                f"integrator must be one of {sorted(_INTEGRATORS)}, got {integrator!r}"
            )
        if momentum_init not in ("normal", "zeros"):
            raise ValueError(f"momentum_init must be 'normal' or 'zeros', got {momentum_init!r}")
        self.diffusion = float(diffusion)
        self.multivariate = bool(multivariate)
        self.integrator = integrator
        self.momentum_init = momentum_init

    def _init_extras(
        self, state: SamplerState, target: Target, generator: torch.Generator | None
    ) -> SamplerState:
        state.momentum = init_momentum(state.theta, self.momentum_init, self.temperature, generator)
        state.extras["xi"] = torch.full_like(state.theta, self.diffusion)
        return state

    def _step(
        self,
        state: SamplerState,
        target: Target,
        eta: float,
        temperature: float,
        generator: torch.Generator | None,
    ) -> SamplerState:
        k = state.step + 1
        evaluations: list[Evaluation] = []

        def grad_fn(theta: Tensor) -> Tensor:
            ev = self.evaluate(target, theta, k, generator)
            evaluations.append(ev)
            return ev.grad

        theta, momentum, xi = _INTEGRATORS[self.integrator](
            state.theta,
            state.momentum,
            state.extras["xi"],
            grad_fn,
            eta,
            self.diffusion,
            temperature,
            self.multivariate,
            generator,
        )
        (ev,) = evaluations  # the integrators make exactly one gradient evaluation
        return SamplerState(theta, momentum, {"xi": xi}, state.step, state.eta, ev.energy)

    def __repr__(self) -> str:
        kind = "mSGNHT" if self.multivariate else "SGNHT"
        return (
            f"{super().__repr__()[:-1]}, diffusion={self.diffusion}, {kind}, "
            f"integrator={self.integrator!r})"
        )
