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
    gradient_noise_diffusion,
    thermostat_feedback,
    thermostat_friction,
)
from .nets import NetParams, coordinate_mlp

__all__ = ["SCALARS", "StepArgs", "StepConfig", "nnsghmc_coefficients", "nnsghmc_update"]

# Secant denominators smaller than this (in standardised input units) give a zero derivative.
_FD_MIN_STEP = 1e-4
#: Names of the scalars of :func:`nnsghmc_update` (floats, or 0-d tensors when compiled).
SCALARS = (
    "eta", "temperature", "inv_sp", "g_scale", "du_scale", "prior_w", "alpha", "c", "s_d",
    "q_clamp", "beta_off", "d_clamp", "grad_noise_var", "precond_power", "precond_ref",
    "precond_range", "p_clamp", "speed_limit",
)  # fmt: skip


@dataclass(frozen=True)
class StepConfig:
    """The switches :func:`nnsghmc_update` branches on (static under ``torch.compile``)."""

    activation: str
    d_output: str
    gamma: str  # "exact" | "finite_difference" | "none" (also: no noise, T = 0)
    per_step: bool  # friction_units == "per_step"
    clamp_d: bool  # d_clamp is set
    detach: bool  # stop-gradient net inputs
    q_momentum: bool = True  # f_phiQ takes p_hat (else Q_f = f_phiQ(U): no Gamma_theta)
    q_stiffness: bool = False  # f_phiQ also takes the per-coordinate stiffness (constant in z)
    noise_correction: bool = False  # V known or estimated: subtract the gradient noise's heating
    noise_friction: bool = False  # ... or dissipate it: D_f + eta Q_f^2 V / (2 T) (needs V)
    precondition: bool = False  # the curl is scaled by P(stiffness) (precondition_power > 0)
    q_output: str = "identity"  # f_phiQ's output transform ("softplus": Q_f >= 0)
    clamp_p: bool = False  # the nets' momentum input is clamped (momentum_input_clamp is set)
    limit_speed: bool = False  # Q_f / sqrt(1 + (p_hat / m)^2) (speed_limit is set)
    thermostat: bool = False  # a Nosé–Hoover friction xi per coordinate around the step

    @property
    def curl_sees_momentum(self) -> bool:
        """Whether ``Q_f`` depends on ``p`` (then ``Q_f(z~)`` differs from ``Q_f(z)``)."""
        return self.q_momentum or self.limit_speed


# -- the NNSGHMC equations, written once ------------------------------------------------------
def _secant(numerator: Tensor, denominator: Tensor) -> Tensor:
    """``numerator / denominator`` where ``|denominator| >= _FD_MIN_STEP``, else 0 (no NaN/Inf,
    also in the backward pass)."""
    ok = denominator.abs() >= _FD_MIN_STEP
    return torch.where(ok, numerator / torch.where(ok, denominator, 1.0), 0.0)


def _momentum_input(p_hat: Tensor, v, cfg: StepConfig) -> tuple[Tensor, Tensor | None]:
    """The nets' momentum input ``clamp(p_hat, -p_clamp, p_clamp)`` and where its derivative
    is 1 (``None``: no clamp, everywhere)."""
    if not cfg.clamp_p:
        return p_hat, None
    return p_hat.clamp(-v["p_clamp"], v["p_clamp"]), p_hat.abs() < v["p_clamp"]


def _masked(derivative: Tensor, inside: Tensor | None) -> Tensor:
    """A derivative with respect to ``p_hat`` through the clamp of :func:`_momentum_input`."""
    return derivative if inside is None else torch.where(inside, derivative, 0.0)


def _speed_factor(p_hat: Tensor, v) -> tuple[Tensor, Tensor]:
    """``r = (1 + (p_hat / m)^2)^(-1/2)`` and ``dr / dp_hat = -p_hat r^3 / m^2``: the curl
    times ``r`` moves a coordinate by at most about ``eta Q_f m sigma_p`` per step."""
    x = p_hat / v["speed_limit"]
    r = torch.rsqrt(1.0 + x * x)
    return r, -x * r * r * r / v["speed_limit"]


def _curl(
    q_net: NetParams,
    u: Tensor,
    p_hat: Tensor,
    stiffness: Tensor | None,
    v,
    cfg: StepConfig,
    wrt: Sequence[int],
):
    """``Q_f = beta_off + clamp(f_phiQ(u, p_hat, s))`` (``f_phiQ``'s output transform
    ``cfg.q_output``) and ``dQ_f / d(u, p_hat)[wrt]``, at the
    shape of ``p_hat``; without the momentum input ``dQ_f / dp_hat`` is ``None`` (zero).

    SPEC §3 (004 eq. 9) feeds ``f_phiQ`` the energy and the momentum. ``cfg.q_momentum=False``
    (``q_momentum_input``, not in the SPEC) drops the momentum: the momentum-dependent curl
    learned a bias in the toy transfer's stiff directions (docs/RESULTS.md, #11); Gamma stays
    exact, its ``dQ_f/dp`` terms being zero. ``cfg.q_stiffness`` adds the stiffness ``s``
    (``q_stiffness_input``), built from earlier steps only: a constant of ``z``, so no term of
    Gamma differentiates it. ``cfg.limit_speed`` multiplies ``Q_f`` by the speed factor of
    :func:`_speed_factor` (product rule in the derivatives; with or without the momentum
    input, ``Q_f`` then depends on ``p_hat``). ``cfg.precondition`` multiplies
    ``Q_f`` and its derivatives by the preconditioner ``P(s)``, also a constant of ``z``."""
    p_in, p_inside = _momentum_input(p_hat, v, cfg)
    inputs = [u, p_in] if cfg.q_momentum else [u]
    n_differentiable = len(inputs)
    if cfg.q_stiffness:
        inputs.append(stiffness)
    present = [f for f in wrt if f < n_differentiable]
    raw, grads = coordinate_mlp(q_net, inputs, cfg.activation, cfg.q_output, present)
    inside = raw.abs() < v["q_clamp"]
    q = raw.clamp(-v["q_clamp"], v["q_clamp"]) + v["beta_off"]
    grads = [torch.where(inside, g, 0.0).expand_as(p_hat) for g in grads]
    derivs = {f: _masked(g, p_inside) if f == 1 else g for f, g in zip(present, grads, strict=True)}
    if cfg.limit_speed:  # Q_f r(p_hat): the product rule
        r, dr = _speed_factor(p_hat, v)
        derivs = {f: g * r for f, g in derivs.items()}
        if 1 in wrt:
            derivs[1] = derivs.get(1, 0.0) + q * dr
        q = q * r
    if cfg.precondition:
        scale = _preconditioner(stiffness, v)
        q, derivs = q * scale, {f: g * scale for f, g in derivs.items()}
    return q.expand_as(p_hat), [derivs.get(f) for f in wrt]


def _preconditioner(stiffness: Tensor, v) -> Tensor:
    """``P = exp(clamp(-gamma_P (s - s_ref), -range, range))``, ``s_ref`` the median stiffness
    (``precondition_power``; :mod:`metasampler.learned.stiffness`)."""
    log_p = (stiffness - v["precond_ref"]) * -v["precond_power"]
    return log_p.clamp(-v["precond_range"], v["precond_range"]).exp()


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
    friction_var: Tensor | float | None = None,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """``Q_f``, ``D_f``, ``Gamma_p`` and ``dQ_f/dp_hat`` at ``z`` from the net inputs
    (``stiffness``: ``(K, D)``, used when ``cfg.q_stiffness``).

    ``friction_var`` ``V`` (the gradient's noise variance; ``None``: none) adds the diffusion
    ``B = eta Q_f^2 V / 2`` the noisy gradient brings to the friction, ``D_f + B / T``: a term
    ``alpha Q_f^2`` already has, so ``alpha`` grows by ``eta V / (2 T)`` per coordinate (times
    ``eta`` in per-step units) and Gamma differentiates it with the rest.

    ``Gamma_p`` is exact (the nets' chain rule) or, for finite differences, from the previous
    step's ``cache = (u, Q_f(z~), p_hat, dQ_f/dp_hat(z~))`` (``None`` without history: no
    Gamma on the first step); ``None`` for ``gamma="none"``.
    """
    exact = cfg.gamma == "exact"
    q, dq = _curl(q_net, u, p_hat, stiffness, v, cfg, (0, 1) if exact else ())
    p_in, p_inside = _momentum_input(p_hat, v, cfg)
    fd, dfd = coordinate_mlp(
        d_net, [u, p_in, g_hat], cfg.activation, cfg.d_output, (1,) if exact else ()
    )
    alpha = v["alpha"]
    if friction_var is not None:  # (V is a constant of p: Gamma_p needs no term for it)
        per_curl = gradient_noise_diffusion(v["eta"], friction_var, v["temperature"])
        alpha = alpha + (per_curl * v["eta"] if cfg.per_step else per_curl)
    d = alpha * q * q + v["s_d"] * fd + v["c"]
    # dD_f/dD_raw: 1/eta in per-step units, 0 where the clamp binds (Gamma of the clamped D_f)
    factor = 1.0
    if cfg.per_step:
        factor = 1.0 / v["eta"]  # (one scalar division; a product per coordinate)
        d = d * factor
    if cfg.clamp_d:
        factor = torch.where(d < v["d_clamp"], factor, 0.0)
        d = torch.minimum(d, torch.as_tensor(v["d_clamp"], dtype=d.dtype))
    if exact:
        (dq_du, dq_dph), dfd_dph = dq, _masked(dfd[0], p_inside)
    elif cfg.gamma == "finite_difference" and cache is not None:
        u_prev, q_prev, p_hat_prev, dq_dph = cache  # dQ_f/dp: last step's secant (004 eq. 22)
        # d f_Q/du ~ (f_Q(u_t, p_t) - f_Q(u_{t-1}, p_t)) / (u_t - u_{t-1}): the second value
        # is the previous step's Q(z~); d f_D/dp a secant at fixed (u_t, g_t).
        dq_du = _secant(q - q_prev, u - u_prev)
        p_prev_in, _ = _momentum_input(p_hat_prev, v, cfg)
        fd_prev, _ = coordinate_mlp(d_net, [u, p_prev_in, g_hat], cfg.activation, cfg.d_output)
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
    noise_var: Tensor | None = None,
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
        stiffness: ``(K, D)`` stiffness input of ``f_phiQ`` (``cfg.q_stiffness``), else ``None``.
        noise_var: ``(K, D)`` estimated variance of ``grad``'s noise (``cfg.noise_correction``
            with an estimate); ``None``: the known ``v["grad_noise_var"]``.
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
    if noise_var is None:
        noise_var = v["grad_noise_var"]
    noise_var = noise_var if cfg.noise_correction else None
    # (without noise, T = 0: no diffusion to dissipate)
    friction_var = noise_var if cfg.noise_friction and noise is not None else None
    q, d, gamma_p, _ = nnsghmc_coefficients(
        u, p_hat, g_hat, du, q_net, d_net, v, cfg, cache, stiffness, friction_var
    )
    new_p = complete_recipe_momentum(p, grad, q, d, gamma_p, noise, eta, temperature, noise_var)
    new_p_hat = new_p * v["inv_sp"]
    if cfg.detach:
        new_p_hat = new_p_hat.detach()
    exact = cfg.gamma == "exact"
    q_tilde, dqt_dph, new_cache = q, None, None  # Q_f(z~) = Q_f(z) if Q_f does not see p
    if cfg.curl_sees_momentum:
        q_tilde, dq = _curl(q_net, u, new_p_hat, stiffness, v, cfg, (1,) if exact else ())
        dqt_dph = dq[0] if exact else None
    if cfg.gamma == "finite_difference":
        if cfg.curl_sees_momentum:
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
    noise_var: Tensor | None = None
    xi: Tensor | None = None

    def columns(self, cols: slice) -> StepArgs:
        """The same step restricted to the coordinate columns ``cols``."""

        def cut(x: Tensor | None) -> Tensor | None:
            return x if x is None or x.shape[-1] == 1 else x[..., cols]

        cache = None if self.cache is None else tuple(cut(x) for x in self.cache)
        return self._replace(
            theta=cut(self.theta), p=cut(self.p), grad=cut(self.grad),
            prior_grad=cut(self.prior_grad), u=cut(self.u), noise=cut(self.noise), cache=cache,
            stiffness=cut(self.stiffness), noise_var=cut(self.noise_var), xi=cut(self.xi),
        )  # fmt: skip
