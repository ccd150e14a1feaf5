"""NNSGHMC's coefficients at a given point: ``Q_f`` and ``D_f`` at given net inputs, and
``Q_f``, ``D_f`` and the exact Gamma at a state ``z`` (for plots, diagnostics and the tests that
differentiate them). The step never calls these: it runs the same equations
(:mod:`metasampler.learned.equations`) on the inputs of the chain's own evaluation.
:class:`~metasampler.learned.NNSGHMC` uses these functions as its methods (``self`` is an
``NNSGHMC``; not imported here: it imports this module)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..stepsize import resolve_eta
from ..targets import Target
from . import stiffness as stats
from .equations import nnsghmc_coefficients

__all__ = ["DriftTerms", "coefficients", "drift_terms"]


class _UnitTarget:
    """Stands in for a target where only the net inputs matter (``N = D = 1``)."""

    n_data = 1
    dim = 1


@dataclass
class DriftTerms:
    """``Q_f``, ``D_f`` and the exact ``Gamma`` at one point ``z`` (all ``(K, D)``)."""

    q: Tensor
    d: Tensor
    gamma_theta: Tensor
    gamma_p: Tensor


def coefficients(
    self,
    u: Tensor,
    p_hat: Tensor,
    g_hat: Tensor,
    eta: float | None = None,
    stiffness: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``Q_f`` and ``D_f`` at given standardised net inputs (e.g. for plots); ``eta``
    (default: the sampler's, else 1) turns the friction per step into ``D_f``; ``stiffness``
    (:func:`~metasampler.learned.stiffness.stiffness_input`) is the curl's input with
    ``curl_input="stiffness"``."""
    eta = eta if eta is not None else (self.eta if self.eta is not None else 1.0)
    v = self._scalars(_UnitTarget, eta, self.temperature)
    cfg = self._config("none", detach=False)  # no Gamma: its gradient input `du` is unused
    stiffness = self._stiffness_given(stiffness, p_hat)
    nets = self._nets(p_hat.dtype)
    q, d, _, _ = nnsghmc_coefficients(u, p_hat, g_hat, g_hat, *nets, v, cfg, None, stiffness)
    return q, d


def drift_terms(
    self,
    theta: Tensor,
    momentum: Tensor,
    target: Target,
    eta: float | None = None,
    grad_sq: Tensor | None = None,
) -> DriftTerms:
    """``Q_f``, ``D_f`` and the exact ``Gamma`` at ``z = (theta, momentum)``.

    Inputs are not detached and the target is evaluated with ``create_graph`` when
    ``theta`` requires grad, so tests can differentiate these terms with respect to ``z``.
    ``eta`` (default: the sampler's base step) turns the friction per step into ``D_f`` and
    enters the stiffness; ``grad_sq`` (the running mean of ``grad^2`` a chain carries in
    ``state.extras["grad_sq"]``, a constant of ``z``) is needed when :attr:`uses_stiffness`.
    """
    if eta is None:
        eta = resolve_eta(self.eta, self.lr, target.n_data, self.order)
    ev = target.evaluate(theta, None, create_graph=theta.requires_grad)
    u, prior_grad = self._energy_input(ev, target)
    v = self._scalars(target, eta, self.temperature)
    du = ev.grad if prior_grad is None else ev.grad - v["prior_w"] * prior_grad
    stiffness = None
    if grad_sq is not None:
        stiffness = stats.stiffness_input(grad_sq, eta)
    stiffness = self._stiffness_given(stiffness, momentum)
    q, d, gamma_p, dq_dph = nnsghmc_coefficients(
        u, momentum * v["inv_sp"], ev.grad * v["g_scale"], du * v["du_scale"],
        *self._nets(momentum.dtype), v, self._config("exact", detach=False), None, stiffness,
    )  # fmt: skip
    gamma_theta = torch.zeros_like(q) if dq_dph is None else -dq_dph * v["inv_sp"]
    return DriftTerms(q, d, gamma_theta, gamma_p)
