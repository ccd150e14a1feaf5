"""The NNSGHMC equations (see :mod:`metasampler.learned.nnsghmc` for them in full), written
once as pure, out-of-place functions of the coordinates: :func:`nnsghmc_coefficients`
(nets -> ``Q_f``, ``D_f``, exact or finite-difference ``Gamma``) and :func:`nnsghmc_update`
(the modified Euler step, inside the optional thermostat's two friction halves). Sampling,
meta-training, ``drift_terms`` and every fast path
(:mod:`metasampler.learned.fast`) evaluate these and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..integrators import (
    complete_recipe_momentum,
    complete_recipe_position,
    thermostat_feedback,
    thermostat_friction,
)
from .nets import NetParams, coordinate_mlp

__all__ = ["Q_CLAMP", "SCALARS", "StepArgs", "StepConfig", "nnsghmc_coefficients", "nnsghmc_update"]

# Secant denominators smaller than this (in standardised input units) give a zero derivative.
_FD_MIN_STEP = 1e-4
#: ``f_phiQ`` is clamped to ``[-Q_CLAMP, Q_CLAMP]`` (Gong et al. 2019).
Q_CLAMP = 5.0
#: Names of the scalars of :func:`nnsghmc_update` (floats, or 0-d tensors when compiled).
SCALARS = ("eta", "temperature", "inv_sp", "g_scale", "du_scale", "prior_w", "alpha", "s_d")


@dataclass(frozen=True)
class StepConfig:
    """The switches :func:`nnsghmc_update` branches on (static under ``torch.compile``)."""

    activation: str
    gamma: str  # "exact" | "finite_difference" | "none" (also: no noise, T = 0)
    detach: bool  # stop-gradient net inputs
    curl_momentum: bool = (
        False  # f_phiQ takes p_hat (then Q_f(z~) differs from Q_f(z)); else the stiffness
    )
    thermostat: bool = False  # a Nosé–Hoover friction xi per coordinate around the step


# -- the NNSGHMC equations, written once ------------------------------------------------------
def _secant(numerator: Tensor, denominator: Tensor) -> Tensor:
    """``numerator / denominator`` where ``|denominator| >= _FD_MIN_STEP``, else 0 (no NaN/Inf,
    also in the backward pass)."""
    ok = denominator.abs() >= _FD_MIN_STEP
    return torch.where(ok, numerator / torch.where(ok, denominator, 1.0), 0.0)


def _curl(
    q_net: NetParams,
    u: Tensor,
    p_hat: Tensor,
    stiffness: Tensor | None,
    cfg: StepConfig,
    wrt: Sequence[int],
):
    """``Q_f = clamp(f_phiQ(u, x), -Q_CLAMP, Q_CLAMP)`` with ``x`` the momentum ``p_hat`` or
    the stiffness, and ``dQ_f / d(u, p_hat)[wrt]`` at the shape of ``p_hat``; with the
    stiffness ``dQ_f / dp_hat`` is ``None`` (zero). The stiffness is built from earlier steps
    only: a constant of ``z``, so no term of Gamma differentiates it."""
    inputs = [u, p_hat] if cfg.curl_momentum else [u, stiffness]
    present = [f for f in wrt if f < 1 + cfg.curl_momentum]
    raw, grads = coordinate_mlp(q_net, inputs, cfg.activation, "identity", present)
    inside = raw.abs() < Q_CLAMP
    q = raw.clamp(-Q_CLAMP, Q_CLAMP)
    derivs = {
        f: torch.where(inside, g, 0.0).expand_as(p_hat) for f, g in zip(present, grads, strict=True)
    }
    return q.expand_as(p_hat), [derivs.get(f) for f in wrt]


def nnsghmc_coefficients(
    u: Tensor,
    p_hat: Tensor,
    g_hat: Tensor,
    du: Tensor,
    q_net: NetParams,
    d_net: NetParams,
    v: Mapping[str, float | Tensor],
    cfg: StepConfig,
    cache: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
    stiffness: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """``Q_f``, ``D_f``, ``Gamma_p`` and ``dQ_f/dp_hat`` at ``z`` from the net inputs
    (``stiffness``: ``(K, D)``, the curl's input unless it sees the momentum).

    The friction is given per step: ``eta D_f = alpha Q_f^2 + s_D f_phiD(u, p_hat, g_hat)``.
    ``Gamma_p`` is exact (the nets' chain rule) or, for finite differences, from the previous
    step's ``cache = (u, Q_f(z~), p_hat, dQ_f/dp_hat(z~))`` (``None`` without history: no
    Gamma on the first step); ``None`` for ``gamma="none"``.
    """
    exact = cfg.gamma == "exact"
    q, dq = _curl(q_net, u, p_hat, stiffness, cfg, (0, 1) if exact else ())
    fd, dfd = coordinate_mlp(
        d_net, [u, p_hat, g_hat], cfg.activation, "softplus", (1,) if exact else ()
    )
    alpha = v["alpha"]
    factor = 1.0 / v["eta"]  # (one scalar division; a product per coordinate)
    d = (alpha * q * q + v["s_d"] * fd) * factor
    if exact:
        (dq_du, dq_dph), dfd_dph = dq, dfd[0]
    elif cfg.gamma == "finite_difference" and cache is not None:
        u_prev, q_prev, p_hat_prev, dq_dph = cache  # dQ_f/dp: last step's secant
        # d f_Q/du ~ (f_Q(u_t, p_t) - f_Q(u_{t-1}, p_t)) / (u_t - u_{t-1}): the second value
        # is the previous step's Q(z~); d f_D/dp a secant at fixed (u_t, g_t).
        dq_du = _secant(q - q_prev, u - u_prev)
        fd_prev, _ = coordinate_mlp(d_net, [u, p_hat_prev, g_hat], cfg.activation, "softplus")
        dfd_dph = _secant(fd - fd_prev, p_hat - p_hat_prev)
    else:
        return q, d, None, None
    dd_dph = v["s_d"] * dfd_dph
    if dq_dph is not None:
        dd_dph = dd_dph + 2.0 * alpha * q * dq_dph
    dd_dph = factor * dd_dph
    return q, d, dq_du * du + dd_dph * v["inv_sp"], dq_dph


def nnsghmc_update(
    theta: Tensor,
    p: Tensor,
    grad: Tensor,
    prior_grad: Tensor | None,
    u: Tensor,
    noise: Tensor | None,
    cache: tuple[Tensor, Tensor, Tensor, Tensor] | None,
    q_net: NetParams,
    d_net: NetParams,
    v: Mapping[str, float | Tensor],
    cfg: StepConfig,
    stiffness: Tensor | None = None,
    xi: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor, Tensor, Tensor] | None, Tensor | None]:
    """One NNSGHMC step (modified Euler), pure and element-wise over the coordinates.

    Args:
        theta, p, grad: ``(K, D)`` position, momentum and ``grad Ũ(theta)``.
        prior_grad: the prior's gradient (``None`` when ``r = 1``: it has weight 0).
        u: standardised energy input, ``(K, 1)`` or expanded.
        noise: ``N(0, I)`` draws ``(K, D)`` (``None`` at ``T = 0``).
        cache: finite-difference history (see :func:`nnsghmc_coefficients`).
        q_net, d_net: the nets' weights; v: the scalars ``SCALARS``; cfg: the switches.
        stiffness: ``(K, D)`` stiffness input of ``f_phiQ`` (unless it sees the momentum).
        xi: ``(K, D)`` thermostat (``cfg.thermostat``): the step runs between two halves of
            its friction, ``p exp(-eta xi / 2)``, and ``xi`` follows the step's mean momentum
            (frozen without noise, ``T = 0``).

    Returns:
        ``(theta_{t+1}, p_{t+1}, sum(Q_f + D_f), new cache, xi_{t+1})``; the sum is for a cheap
        finiteness check, the cache ``None`` unless ``cfg.gamma == "finite_difference"``,
        ``xi_{t+1}`` ``None`` unless ``cfg.thermostat``.
    """
    eta, temperature = v["eta"], v["temperature"]
    if cfg.thermostat:
        p = thermostat_friction(p, xi, 0.5 * eta)
    p_hat = p * v["inv_sp"]
    g_hat = grad * v["g_scale"]
    du = grad if prior_grad is None else grad - v["prior_w"] * prior_grad
    du = du * v["du_scale"]
    if cfg.detach:
        u, p_hat, g_hat = u.detach(), p_hat.detach(), g_hat.detach()
    q, d, gamma_p, _ = nnsghmc_coefficients(
        u, p_hat, g_hat, du, q_net, d_net, v, cfg, cache, stiffness
    )
    new_p = complete_recipe_momentum(p, grad, q, d, gamma_p, noise, eta, temperature)
    new_p_hat = new_p * v["inv_sp"]
    if cfg.detach:
        new_p_hat = new_p_hat.detach()
    exact = cfg.gamma == "exact"
    q_tilde, dqt_dph, new_cache = q, None, None  # Q_f(z~) = Q_f(z) if Q_f does not see p
    if cfg.curl_momentum:
        q_tilde, dq = _curl(q_net, u, new_p_hat, stiffness, cfg, (1,) if exact else ())
        dqt_dph = dq[0] if exact else None
    if cfg.gamma == "finite_difference":
        if cfg.curl_momentum:
            dqt_dph = _secant(q_tilde - q, new_p_hat - p_hat)
        new_cache = (u, q_tilde, p_hat, torch.zeros_like(q) if dqt_dph is None else dqt_dph)
    gamma_theta = None if dqt_dph is None else -dqt_dph * v["inv_sp"]
    new_theta = complete_recipe_position(theta, new_p, q_tilde, gamma_theta, eta, temperature)
    new_xi = None
    if cfg.thermostat:
        # the feedback on the step's mean momentum (frozen without noise, T = 0), and the
        # second friction half with the first half's xi, so that the two mirror each other
        new_xi = xi
        if noise is not None:
            new_xi = thermostat_feedback(xi, 0.5 * (p + new_p), eta, temperature)
        new_p = thermostat_friction(new_p, xi, 0.5 * eta)
    # one reduction (two made inductor store D_f for a second loop over it)
    return new_theta, new_p, (q + d).sum(), new_cache, new_xi


class StepArgs(NamedTuple):
    """The arguments of :func:`nnsghmc_update`, in its order."""

    theta: Tensor
    p: Tensor
    grad: Tensor
    prior_grad: Tensor | None
    u: Tensor
    noise: Tensor | None
    cache: tuple[Tensor, Tensor, Tensor, Tensor] | None
    q_net: Any
    d_net: Any
    v: dict[str, float]
    cfg: Any
    stiffness: Tensor | None = None
    xi: Tensor | None = None

    def columns(self, cols: slice) -> StepArgs:
        """The same step restricted to the coordinate columns ``cols``."""

        def cut(x: Tensor | None) -> Tensor | None:
            return x if x is None or x.shape[-1] == 1 else x[..., cols]

        cache = None if self.cache is None else tuple(cut(x) for x in self.cache)
        return self._replace(
            theta=cut(self.theta), p=cut(self.p), grad=cut(self.grad),
            prior_grad=cut(self.prior_grad), u=cut(self.u), noise=cut(self.noise), cache=cache,
            stiffness=cut(self.stiffness), xi=cut(self.xi),
        )  # fmt: skip
