"""The per-coordinate stiffness input of NNSGHMC's curl (``curl_input="stiffness"``).

``Q_f`` from the energy alone cannot tell a stiff coordinate from a broad one. At equilibrium
``E[(d_i U)^2] = E[d_i^2 U]`` (integration by parts), so a running mean ``V_i`` of the
squared stochastic gradient measures coordinate ``i``'s curvature (plus the gradient noise,
which errs on the careful side), as pSGLD's preconditioner does (Li et al. 2016). The net
input is

    s_i = log(eta sqrt(V_i)),

the step over the coordinate's length scale: dimensionless, so the same number whatever ``N``
and ``eta`` are at test time. ``V`` holds earlier steps' gradients only, so within a step it
is a constant of ``z`` and Gamma needs no derivative of it. It adapts during the warm-up (a
plain mean over the first ``1 / (1 - DECAY)`` steps, then exponential) and is fixed when the
warm-up ends (:meth:`~metasampler.samplers.base.Sampler.end_warmup`), as an adaptive MCMC's
warm-up fixes its metric: from then on the chain is a time-homogeneous sampler that Gamma
makes exact.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping

import torch
from torch import Tensor

from ..gradient_noise import running_mean
from ..targets import Evaluation

__all__ = [
    "DECAY",
    "FROZEN",
    "FixedStiffness",
    "stiffness_input",
    "update_chain_statistics",
    "update_grad_sq",
]

#: ``V`` is a running mean over about ``1 / (1 - DECAY)`` steps.
DECAY = 0.99
#: The key of a chain's extras that marks ``V`` as fixed (set when the warm-up ends).
FROZEN = "grad_sq_frozen"


def update_grad_sq(past: Tensor | None, grad: Tensor, step: int, decay: float = DECAY) -> Tensor:
    """The running mean ``V`` of ``grad^2`` after a chain's ``step``-th gradient (1-based);
    detached, as it is a statistic of the chain's past, not a function of its current state."""
    return running_mean(past, grad.detach().square(), step, decay)


def update_chain_statistics(past: Mapping[str, Tensor], ev: Evaluation, step: int) -> dict:
    """``grad_sq``, the running mean of a chain's squared gradients after its ``step``-th
    evaluation ``ev``; held at its value once the warm-up has ended (``FROZEN`` in ``past``)."""
    if FROZEN in past and "grad_sq" in past:
        return {"grad_sq": past["grad_sq"], FROZEN: past[FROZEN]}
    return {"grad_sq": update_grad_sq(past.get("grad_sq"), ev.grad, step)}


def freeze(extras: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``extras`` with ``V`` marked as fixed from now on (the end of the warm-up)."""
    if "grad_sq" not in extras:
        return dict(extras)
    return {**extras, FROZEN: torch.ones_like(extras["grad_sq"][..., :1])}  # one per chain


def stiffness_input(grad_sq: Tensor, eta: float) -> Tensor:
    """``s_i = log(eta sqrt(V_i))`` from the running mean ``V`` of ``(d_i Ũ)^2``."""
    # (in place on clamp_min's new tensor: one allocation, the same operations and numbers)
    return grad_sq.clamp_min(1e-30).mul_(eta * eta).log_().mul_(0.5)


class FixedStiffness:
    """The stiffness input of a fixed ``V`` (after the warm-up), computed once: while the
    chains' ``V`` is the same tensor, unchanged, and the step is the same, :meth:`of` returns
    the input it computed before (the same numbers), so a step after the warm-up makes no
    pass over the coordinates for it. Holds a weak reference to ``V``."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._value: Tensor | None = None

    def of(self, grad_sq: Tensor, eta: float) -> Tensor:
        """``stiffness_input(grad_sq, eta)``, from the cache when ``grad_sq`` is unchanged."""
        key = self._key
        if key is not None and key[0]() is grad_sq and key[1:] == (grad_sq._version, eta):
            return self._value
        value = stiffness_input(grad_sq, eta)
        self._key, self._value = (weakref.ref(grad_sq), grad_sq._version, eta), value
        return value

    def __getstate__(self) -> dict:
        return {"_key": None, "_value": None}  # (a weak reference cannot be pickled)
