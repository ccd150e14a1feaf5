"""pSGLD — preconditioned SGLD with an RMSprop preconditioner (Li, Chen, Carlson & Carin,
AAAI 2016a).

With the per-datum mean gradient ``g = grad Ũ / N`` (``N = target.n_data``), the update of
docs/METHOD.md §2 is::

    V     <- beta V + (1 - beta) g * g
    G     =  1 / (lam + sqrt(V))
    theta <- theta - eta G grad Ũ(theta) + N(0, 2 eta T G)

``G`` is diagonal (element-wise). The exact algorithm adds the drift correction
``eta * Gamma(theta)``, ``Gamma_i = T * d G_i / d theta_i``; as is common practice (and as
the pSGLD paper suggests for ``beta`` close to 1), it is **dropped** here. ``V`` averages
``g * g`` over about ``1 / (1 - beta)`` steps, so ``G`` changes slowly and the neglected term
is small, but not zero: when that window is comparable to the chain's relaxation time, ``V``
tracks the local gradient magnitude, ``G`` effectively depends on ``theta`` and the samples
are biased beyond SGLD's ``O(eta)``. (Measured on a 4-D correlated Gaussian: covariance
errors of 10-20 % with ``beta = 0.99`` at ``eta = 0.02 ... 0.1``, 2-4 % with ``beta = 0.999``
at ``eta = 0.05 ... 0.1``.)

Initialising ``V``: with ``V = 0`` the first update gives ``V = (1 - beta) g * g``, a preconditioner
``1 / sqrt(1 - beta) = 10`` times too large (for ``beta = 0.99``) that decays only over ~100
steps: the first steps are ten times longer than intended and can diverge. We therefore set
``V = g * g`` from the first gradient (``v_init="first"``, default; Adam's bias correction
serves the same purpose); ``v_init="zeros"`` gives the literal ``V_0 = 0`` recursion.

One gradient evaluation per step. ``lr`` converts as ``eta = lr / N``: the drift
``eta * G * grad Ũ = lr * g / (lam + sqrt(V))`` is then exactly an RMSprop step on the mean loss,
so at ``T = 0`` pSGLD is RMSprop (without momentum) with learning rate ``lr``.
"""

from __future__ import annotations

import math

import torch

from ..integrators import langevin_step
from ..schedules import Schedule
from ..targets import Target
from .base import Sampler, SamplerState

__all__ = ["PSGLD"]


class PSGLD(Sampler):
    """Preconditioned SGLD (RMSprop preconditioner, Gamma term dropped).

    Args:
        eta / lr: step (see :class:`~metasampler.samplers.base.Sampler`); ``eta = lr / N``.
        beta: decay of the squared-gradient average ``V``, in ``[0, 1)``.
        lam: the regulariser ``lambda > 0`` in ``G = 1 / (lambda + sqrt(V))``.
        temperature, schedule: as for every sampler.
        v_init: ``"first"`` sets ``V`` to ``g * g`` at the first step (default), ``"zeros"``
            starts the recursion from ``V = 0``.

    State: ``state.extras["V"]``, ``(K, D)``.
    """

    order = "first"

    def __init__(
        self,
        *,
        eta: float | None = None,
        lr: float | None = None,
        beta: float = 0.99,
        lam: float = 1e-5,
        temperature: float = 1.0,
        schedule: Schedule | None = None,
        v_init: str = "first",
    ) -> None:
        super().__init__(eta=eta, lr=lr, temperature=temperature, schedule=schedule)
        if not 0 <= beta < 1:
            raise ValueError(f"beta must be in [0, 1), got {beta!r}")
        if not (lam > 0 and math.isfinite(lam)):
            raise ValueError(f"lam (lambda) must be a finite number > 0, got {lam!r}")
        if v_init not in ("first", "zeros"):
            raise ValueError(f"v_init must be 'first' or 'zeros', got {v_init!r}")
        self.beta = float(beta)
        self.lam = float(lam)
        self.v_init = v_init

    def _init_extras(
        self, state: SamplerState, target: Target, generator: torch.Generator | None
    ) -> SamplerState:
        state.extras["V"] = torch.zeros_like(state.theta)
        return state

    def _step(
        self,
        state: SamplerState,
        target: Target,
        eta: float,
        temperature: float,
        generator: torch.Generator | None,
    ) -> SamplerState:
        ev = self.evaluate(target, state.theta, state.step + 1, generator)
        g = ev.grad / target.n_data
        if state.step == 0 and self.v_init == "first":
            v = g * g
        else:
            v = self.beta * state.extras["V"] + (1.0 - self.beta) * g * g
        precond = 1.0 / (self.lam + v.sqrt())
        theta = langevin_step(state.theta, ev.grad, eta, temperature, generator, precond)
        return SamplerState(theta, None, {"V": v}, state.step, state.eta, ev.energy)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, beta={self.beta}, lam={self.lam})"
