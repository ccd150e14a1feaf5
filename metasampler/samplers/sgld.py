"""SGLD — stochastic gradient Langevin dynamics (Welling & Teh, ICML 2011).

SDE (overdamped Langevin at temperature ``T``)::

    d theta = -grad U(theta) dt + N(0, 2 T dt)

Discretised by Euler–Maruyama with a stochastic gradient (docs/METHOD.md §2)::

    theta <- theta - eta grad Ũ(theta) + N(0, 2 eta T)

One gradient evaluation per step. ``lr`` converts as ``eta = lr / N``. With a
:class:`~metasampler.schedules.PolynomialDecay` schedule this is the original decreasing-step
SGLD; with a :class:`~metasampler.schedules.CyclicalCosine` schedule it is cSGLD (Zhang et al.
2020, see :func:`metasampler.samplers.cyclical.cyclical_sgld`).
"""

from __future__ import annotations

import torch

from ..integrators import langevin_step
from ..targets import Target
from .base import Sampler, SamplerState

__all__ = ["SGLD"]


class SGLD(Sampler):
    """Stochastic gradient Langevin dynamics.

    Args:
        eta / lr: step (see :class:`~metasampler.samplers.base.Sampler`); ``eta = lr / N``.
        temperature, schedule: as for every sampler.
    """

    order = "first"

    def _step(
        self,
        state: SamplerState,
        target: Target,
        eta: float,
        temperature: float,
        generator: torch.Generator | None,
    ) -> SamplerState:
        ev = self.evaluate(target, state.theta, state.step + 1, generator)
        theta = langevin_step(state.theta, ev.grad, eta, temperature, generator)
        return SamplerState(theta, None, {}, state.step, state.eta, ev.energy)
