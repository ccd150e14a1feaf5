"""NNSGHMC — the learnable complete-recipe sampler (Gong, Li & Hernández-Lobato, ICLR 2019 §3).

State ``z = (theta, p)``, Hamiltonian ``H = U(theta) + p.p / 2``, target ``exp(-H / T)``.
Diagonal curl and diffusion from per-coordinate nets with shared weights (SPEC §3)::

    Q_f,i = beta_off + clamp(f_phiQ(u, p_i), -q_clamp, q_clamp)
    D_f,i = clamp((alpha * Q_f,i^2 + s_D * f_phiD(u, p_i, g_i) + c) / e, 0, d_clamp)   (f_phiD >= 0)

    Q = [[0, -Q_f], [Q_f, 0]],   D = [[0, 0], [0, D_f]]
    dz = -(D + Q) grad H dt + T Gamma dt + sqrt(2 T D) dW,   Gamma_i = sum_j d_j (D + Q)_ij

with ``e = 1`` (``friction_units="absolute"``) or ``e = eta``, the step in use
(``friction_units="per_step"``: the constants are per-step friction, so ``eta D_f`` is what
training saw whatever ``N`` and ``eta`` are at test time); ``d_clamp = None`` means no upper
clamp. This leaves ``pi`` invariant for any nets (Ma, Chen & Fox 2015). For this design::

    Gamma_theta,i = -d Q_f,i / d p_i
    Gamma_p,i     =  d Q_f,i / d theta_i + d D_f,i / d p_i

where ``d D_f,i / d p_i`` is that of the clamped ``D_f`` (0 where the clamp binds).

Net inputs (004 appendix E): ``u = s_U * (U_pd - mu_U) / sigma_U`` with the per-datum energy
``U_pd = (Ũ - (1 - r) * prior) / N`` (``= mean_m -log p(y_m|x_m, theta) - r/N log p(theta)``,
``r = D_train / D_test``), ``p_hat_i = p_i / sigma_p`` and the gradient input
``g_i = s_g * d_i Ũ / sigma_g`` (``grad_input="standardised"``) or ``g_i = s_g * d_i Ũ / N``
(``grad_input="per_datum"``, the paper's; no calibrated statistic).
Every transformation enters the chain rule, e.g.
``d Q_f,i / d theta_i = (d f_phiQ / d u) * s_U / (sigma_U N) * (d_i Ũ - (1 - r) d_i prior)``.

Discretisation (modified Euler, 004 eq. 7), ``z~_t = (theta_t, p_{t+1})``, used identically
in meta-training and evaluation::

    p_{t+1}     = (1 - eta D_f(z_t)) p_t - eta Q_f(z_t) grad Ũ(theta_t) + eta T Gamma_p(z_t)
                  + N(0, 2 eta T D_f(z_t))
    theta_{t+1} = theta_t + eta Q_f(z~_t) p_{t+1} + eta T Gamma_theta(z~_t)

``gamma`` chooses how the derivatives are obtained:

* ``"exact"`` — the nets' own forward-mode chain rule (no Hessian of ``U``), differentiable;
* ``"finite_difference"`` — 004 appendix B with cached net outputs (secants in ``p`` at fixed
  ``U``, in ``U`` at fixed ``p``, one extra ``f_D`` pass at the previous momentum); tiny
  denominators fall back to a zero derivative, so no NaN or Inf can appear;
* ``"none"`` — drops Gamma. A diagnostic only: it breaks stationarity (the stationarity tests
  show the bias).

Reduction: ``f_phiQ ≡ 0, beta_off = 1, alpha = 0, s_D = 0, c = C`` is exactly SGHMC with
friction ``C``.
"""

from __future__ import annotations

import math
import types
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..integrators import gaussian_like
from ..samplers.base import Sampler, SamplerState, check_finite
from ..samplers.sghmc import init_momentum
from ..schedules import Schedule
from ..stepsize import resolve_eta
from ..targets import Evaluation, NonFiniteError, Target
from .nets import CoordinateMLP, elementwise_forward

__all__ = ["NNSGHMC", "DriftTerms", "GAMMA_MODES", "GRAD_INPUTS", "FRICTION_UNITS"]

GAMMA_MODES = ("exact", "finite_difference", "none")
GRAD_INPUTS = ("standardised", "per_datum")
FRICTION_UNITS = ("absolute", "per_step")
# Secant denominators smaller than this (in standardised input units) give a zero derivative.
_FD_MIN_STEP = 1e-4
# D_f below this is treated as 0 inside sqrt, so its gradient stays finite.
_TINY = 1e-20


@dataclass
class DriftTerms:
    """``Q_f``, ``D_f`` and the exact ``Gamma`` at one point ``z`` (all ``(K, D)``)."""

    q: Tensor
    d: Tensor
    gamma_theta: Tensor
    gamma_p: Tensor


class NNSGHMC(nn.Module, Sampler):
    """The learnable SG-MCMC sampler. Same protocol as every baseline: ``init`` / ``step``.

    Args:
        eta / lr: step (``lr`` converts as ``eta = sqrt(lr / N)``); evaluation may use a
            different step from training.
        q_hidden, d_hidden: hidden widths of ``f_phiQ`` and ``f_phiD`` (paper toy: 40; MNIST: 10).
        activation: hidden activation of both nets.
        d_output: ``"softplus"`` or ``"abs"``: keeps ``f_phiD >= 0``.
        beta_off: offset added to ``f_phiQ`` (``Q_f = beta_off + clamp(f_phiQ)``). Paper toy: 0.
        alpha: weight of ``Q_f^2`` in ``D_f`` (paper MNIST: ``0.01 / eta``). Default 0. It is a
            number, stored in the exported file: a sampler loaded with another step keeps the
            training ``alpha``. The paper instead re-derives ``alpha = 0.01 / eta`` for each test
            step (004 F.2). To follow it, set ``sampler.alpha = 0.01 / eta`` after loading.
        c: constant added to ``D_f``. Default 0.
        q_clamp: ``f_phiQ`` is clamped to ``[-q_clamp, q_clamp]`` (paper: 5).
        d_output_scale: ``s_D`` multiplying ``f_phiD`` (paper MNIST: 50).
        energy_input_scale: ``s_U`` on the per-datum energy input.
        grad_input_scale: ``s_g`` on the gradient input (paper MNIST: 70, per datum).
        gamma: ``"exact"``, ``"finite_difference"`` or ``"none"`` (diagnostic only).
        detach_inputs: feed the nets stop-gradient inputs during meta-training (default); with
            ``False`` the meta-gradient also flows through ``U``, ``p`` and ``grad U`` (second
            order: the target is evaluated with ``create_graph=True``).
        temperature, schedule: as for every sampler.
        momentum_init: ``"normal"`` (``N(0, T I)``) or ``"zeros"``.
        seed: seeds the nets' initial weights.
        d_clamp: upper clamp of ``D_f`` (paper toy: 5); ``None``: none. Gamma uses the clamped
            ``D_f``'s derivative, so the sampler stays exact.
        grad_input: ``"standardised"`` (``s_g * grad Ũ / sigma_g``) or ``"per_datum"``
            (``s_g * grad Ũ / N``, the paper's, e.g. ``s_g = 70`` on MNIST).
        friction_units: ``"absolute"`` (``D_f`` as written) or ``"per_step"`` (``alpha``, ``s_D``
            and ``c`` give the friction per step: ``D_f`` is divided by the step in use; the
            paper's MNIST ``alpha = 0.01 / eta`` is ``alpha = 0.01`` here).
        compile: run sampling steps (under ``torch.no_grad()``, float32 chains and nets with
            one hidden layer and one activation) through two kernels generated by
            ``torch.compile`` (inductor; on CPU it needs a C++ compiler) that fuse the nets,
            Gamma and the update into one pass over the coordinates: about 3x less overhead
            over SGHMC than the eager step on a BNN. Same results up to float rounding (tanh
            from a rational approximation, a few ulp). The first step of each configuration
            compiles: ~1.5 min for 10 hidden units in a fresh environment, ~5-20 s once
            inductor's on-disk cache holds the kernels. Other steps (grad enabled, as in
            meta-training; other dtypes or nets) use the eager step; so does everything after
            a compile failure (with a warning). Not part of the exported sampler; can be
            switched on a loaded one through the ``use_compile`` attribute.
    """

    order = "second"

    def __init__(
        self,
        *,
        eta: float | None = None,
        lr: float | None = None,
        q_hidden: Sequence[int] = (40,),
        d_hidden: Sequence[int] = (40,),
        activation: str = "tanh",
        d_output: str = "softplus",
        beta_off: float = 0.0,
        alpha: float = 0.0,
        c: float = 0.0,
        q_clamp: float = 5.0,
        d_output_scale: float = 1.0,
        energy_input_scale: float = 1.0,
        grad_input_scale: float = 1.0,
        gamma: str = "exact",
        detach_inputs: bool = True,
        temperature: float = 1.0,
        schedule: Schedule | None = None,
        momentum_init: str = "normal",
        seed: int | None = 0,
        compile: bool = False,
        d_clamp: float | None = None,
        grad_input: str = "standardised",
        friction_units: str = "absolute",
    ) -> None:
        nn.Module.__init__(self)
        Sampler.__init__(self, eta=eta, lr=lr, temperature=temperature, schedule=schedule)
        for name, value in (("alpha", alpha), ("c", c), ("d_output_scale", d_output_scale)):
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name, value in (
            ("q_clamp", q_clamp),
            ("energy_input_scale", energy_input_scale),
            ("grad_input_scale", grad_input_scale),
        ):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if not math.isfinite(beta_off):
            raise ValueError(f"beta_off must be finite, got {beta_off!r}")
        if d_clamp is not None and not (d_clamp > 0 and math.isfinite(d_clamp)):
            raise ValueError(f"d_clamp must be a finite number > 0 or None, got {d_clamp!r}")
        if grad_input not in GRAD_INPUTS:
            raise ValueError(f"grad_input must be one of {GRAD_INPUTS}, got {grad_input!r}")
        if friction_units not in FRICTION_UNITS:
            raise ValueError(
                f"friction_units must be one of {FRICTION_UNITS}, got {friction_units!r}"
            )
        if gamma not in GAMMA_MODES:
            raise ValueError(f"gamma must be one of {GAMMA_MODES}, got {gamma!r}")
        if d_output not in ("softplus", "abs"):
            raise ValueError(
                f"d_output must be 'softplus' or 'abs' (f_phiD >= 0), got {d_output!r}"
            )
        if momentum_init not in ("normal", "zeros"):
            raise ValueError(f"momentum_init must be 'normal' or 'zeros', got {momentum_init!r}")
        if gamma == "none":
            warnings.warn(
                "NNSGHMC(gamma='none') drops the Gamma correction: the chain no longer targets "
                "the posterior. Use it only as a diagnostic.",
                stacklevel=2,
            )
        self.f_q = CoordinateMLP(2, q_hidden, activation, "identity")
        self.f_d = CoordinateMLP(3, d_hidden, activation, d_output)
        if seed is not None:
            generator = torch.Generator().manual_seed(int(seed))
            self.f_q.reset_parameters(generator)
            self.f_d.reset_parameters(generator)
        self.beta_off = float(beta_off)
        self.alpha = float(alpha)
        self.c = float(c)
        self.q_clamp = float(q_clamp)
        self.d_output_scale = float(d_output_scale)
        self.energy_input_scale = float(energy_input_scale)
        self.grad_input_scale = float(grad_input_scale)
        self.d_clamp = None if d_clamp is None else float(d_clamp)
        self.grad_input = grad_input
        self.friction_units = friction_units
        self.gamma = gamma
        self.detach_inputs = bool(detach_inputs)
        self.momentum_init = momentum_init
        # Not `self.compile`: that would shadow nn.Module.compile.
        self.use_compile = bool(compile)
        # Input statistics (004 appendix E), measured by `calibrate`; part of the export.
        self.register_buffer("energy_loc", torch.tensor(0.0, dtype=torch.float64))
        self.register_buffer("energy_std", torch.tensor(1.0, dtype=torch.float64))
        self.register_buffer("momentum_std", torch.tensor(1.0, dtype=torch.float64))
        self.register_buffer("grad_std", torch.tensor(1.0, dtype=torch.float64))
        # Dimension of the meta-training target (0: unknown, then r = D_train / D_test = 1).
        self.register_buffer("train_dim", torch.tensor(0, dtype=torch.int64))

    # -- net inputs and coefficients --------------------------------------------------------
    def _net_dtype(self) -> torch.dtype:
        return self.f_q.head.weight.dtype

    def _energy_scales(self, target: Target) -> tuple[float, float]:
        """``(1 - r, s_U / (sigma_U N))``: the prior weight removed from the energy input and
        the energy input's scale."""
        train_dim = int(self.train_dim)
        ratio = train_dim / target.dim if train_dim > 0 else 1.0
        scale = self.energy_input_scale / (float(self.energy_std) * target.n_data)
        return 1.0 - ratio, scale

    def _energy_u(self, ev: Evaluation, target: Target) -> Tensor:
        """Standardised energy input ``u`` ``(K, 1)``."""
        prior_w, scale = self._energy_scales(target)
        energy = ev.energy
        if prior_w != 0.0:  # (with r = 1 the prior terms are multiplied by 0: skip them)
            energy = energy - prior_w * ev.prior_energy
        u = energy * scale
        u = u - self.energy_input_scale * float(self.energy_loc) / float(self.energy_std)
        return u.unsqueeze(-1)

    def _energy_input(self, ev: Evaluation, target: Target) -> tuple[Tensor, Tensor]:
        """Standardised energy input ``u`` ``(K, 1)`` and ``du/dtheta`` ``(K, D)``."""
        prior_w, scale = self._energy_scales(target)
        grad = ev.grad
        if prior_w != 0.0:
            grad = grad - prior_w * ev.prior_grad
        return self._energy_u(ev, target), grad * scale

    def _curl(
        self, u: Tensor, p_hat: Tensor, with_grads: bool, energy_grad: bool = True
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``Q_f`` and, if asked, ``dQ_f/du`` and ``dQ_f/dp_hat`` (clamp included).

        With ``energy_grad=False`` only ``dQ_f/dp_hat`` is computed (``dQ_f/du`` is 0).
        """
        dtype = self._net_dtype()
        derivatives = ((0, 1) if energy_grad else (1,)) if with_grads else ()
        raw, grads = self.f_q([u.to(dtype), p_hat.to(dtype)], derivatives)
        zero = raw.new_zeros(())
        if not torch.is_grad_enabled():
            # Sampling: the same values with fewer full-size temporaries.
            if with_grads:
                outside = raw.abs() >= self.q_clamp
                grads = [g.masked_fill_(outside, 0.0) for g in grads]
            q = raw.clamp_(-self.q_clamp, self.q_clamp).add_(self.beta_off).to(p_hat.dtype)
        else:
            clamped = raw.clamp(-self.q_clamp, self.q_clamp)
            q = (self.beta_off + clamped).to(p_hat.dtype)
            if with_grads:
                inside = (raw.abs() < self.q_clamp).to(raw.dtype)
                grads = [g * inside for g in grads]
        if not with_grads:
            return q, zero, zero
        grads = [g.to(p_hat.dtype) for g in grads]
        return q, grads[0] if energy_grad else zero, grads[-1]

    def _diffusion_net(self, u: Tensor, p_hat: Tensor, g_hat: Tensor, with_grad: bool):
        """``s_D * f_phiD`` and, if asked, its derivative with respect to ``p_hat``."""
        dtype = self._net_dtype()
        value, grads = self.f_d(
            [u.to(dtype), p_hat.to(dtype), g_hat.to(dtype)], (1,) if with_grad else ()
        )
        if not torch.is_grad_enabled():
            value = value.mul_(self.d_output_scale).to(p_hat.dtype)
            grad = grads[0].mul_(self.d_output_scale).to(p_hat.dtype) if with_grad else None
            return value, grad
        value = (self.d_output_scale * value).to(p_hat.dtype)
        grad = (self.d_output_scale * grads[0]).to(p_hat.dtype) if with_grad else None
        return value, grad

    def _grad_input_factor(self, target: Target) -> float:
        """``g_hat / grad Ũ``: ``s_g / sigma_g`` (standardised) or ``s_g / N`` (per datum)."""
        if self.grad_input == "per_datum":
            return self.grad_input_scale / target.n_data
        return self.grad_input_scale / float(self.grad_std)

    def _friction(self, q: Tensor, fd: Tensor, eta: float) -> tuple[Tensor, Tensor | float]:
        """``D_f`` from ``Q_f`` and ``s_D f_phiD``, and the factor ``dD_f / dD_raw`` with
        ``D_raw = alpha Q_f^2 + s_D f_phiD + c``: ``1 / eta`` in per-step units, 0 where the
        clamp at ``d_clamp`` binds (so Gamma is that of the clamped ``D_f``)."""
        d = self.alpha * q * q + fd + self.c
        factor: Tensor | float = 1.0
        if self.friction_units == "per_step":
            d = d / eta
            factor = 1.0 / eta
        if self.d_clamp is not None:
            inside = (d < self.d_clamp).to(d.dtype)
            d = d.clamp(max=self.d_clamp)
            factor = inside * factor
        return d, factor

    def _inputs(self, ev: Evaluation, momentum: Tensor, target: Target, detach: bool):
        u, du = self._energy_input(ev, target)
        p_hat = momentum / float(self.momentum_std)
        g_hat = ev.grad * self._grad_input_factor(target)
        if detach:
            u, p_hat, g_hat = u.detach(), p_hat.detach(), g_hat.detach()
        return u, du, p_hat, g_hat

    def drift_terms(
        self, theta: Tensor, momentum: Tensor, target: Target, eta: float | None = None
    ) -> DriftTerms:
        """``Q_f``, ``D_f`` and the exact ``Gamma`` at ``z = (theta, momentum)``.

        Inputs are not detached and the target is evaluated with ``create_graph`` when
        ``theta`` requires grad, so tests can differentiate these terms with respect to ``z``.
        ``eta`` (default: the sampler's base step) matters only with
        ``friction_units="per_step"``.
        """
        if eta is None:
            eta = resolve_eta(self.eta, self.lr, target.n_data, self.order)
        ev = target.evaluate(theta, None, create_graph=theta.requires_grad)
        u, du, p_hat, g_hat = self._inputs(ev, momentum, target, detach=False)
        inv_sp = 1.0 / float(self.momentum_std)
        q, dq_du, dq_dph = self._curl(u, p_hat, True)
        fd, dfd_dph = self._diffusion_net(u, p_hat, g_hat, True)
        d, factor = self._friction(q, fd, eta)
        dq_dp = dq_dph * inv_sp
        gamma_p = dq_du * du + factor * (dfd_dph * inv_sp + 2.0 * self.alpha * q * dq_dp)
        return DriftTerms(q, d, -dq_dp, gamma_p)

    # -- sampler protocol -------------------------------------------------------------------
    def _init_extras(
        self, state: SamplerState, target: Target, generator: torch.Generator | None
    ) -> SamplerState:
        device = self.f_q.head.weight.device
        if state.theta.device != device:
            raise ValueError(
                f"NNSGHMC nets are on {device} but the chains are on {state.theta.device}; "
                "move the sampler with .to(device)"
            )
        state.momentum = init_momentum(state.theta, self.momentum_init, self.temperature, generator)
        return state

    def _step(self, state, target, eta, temperature, generator):
        k = state.step + 1
        fast = not torch.is_grad_enabled()  # sampling: in-place updates of fresh tensors
        second_order = not self.detach_inputs and not fast
        ev = self.evaluate(target, state.theta, k, generator, create_graph=second_order)
        if fast and self.use_compile and self._compilable(state.momentum) and self._defaults():
            try:
                return self._compiled_step(state, target, ev, eta, temperature, generator, k)
            except NonFiniteError:
                raise
            except Exception as err:  # no compiler, unsupported backend, ...: stay correct
                warnings.warn(
                    f"NNSGHMC(compile=True): the compiled step failed ({type(err).__name__}: "
                    f"{err}); using the eager step from now on",
                    stacklevel=3,
                )
                self.use_compile = False
        detach = self.detach_inputs
        u, du, p_hat, g_hat = self._inputs(ev, state.momentum, target, detach)
        inv_sp = 1.0 / float(self.momentum_std)
        p = state.momentum
        extras: dict[str, Tensor] = {}
        exact = self.gamma == "exact"
        use_gamma = self.gamma != "none" and temperature > 0
        alpha = self.alpha

        q, dq_du, dq_dph = self._curl(u, p_hat, exact and use_gamma)
        fd, dfd_dph = self._diffusion_net(u, p_hat, g_hat, exact and use_gamma)
        factor: Tensor | float = 1.0
        if fast and self._defaults():
            d = torch.addcmul(fd, q, q, value=alpha) if alpha != 0 else fd.clone()
            if self.c != 0:
                d.add_(self.c)
        else:
            d, factor = self._friction(q, fd, eta)
        _check_coefficients(k, q, d)

        gamma_p = None
        if use_gamma and exact:
            if fast:
                gamma_p = torch.addcmul(dfd_dph, q, dq_dph, value=2.0 * alpha)
                gamma_p.mul_(factor * inv_sp).addcmul_(dq_du, du)
            else:
                gamma_p = dq_du * du + factor * (dfd_dph + 2.0 * alpha * q * dq_dph) * inv_sp
        elif use_gamma:
            gamma_p = self._fd_gamma_p(state.extras, u, du, p_hat, g_hat, q, fd, inv_sp, factor)

        if fast:
            new_p = torch.mul(d, -eta).add_(1.0).mul_(p)
            new_p.addcmul_(q, ev.grad, value=-eta)
            if gamma_p is not None:
                new_p.add_(gamma_p, alpha=eta * temperature)
            if temperature > 0:
                std = d.clamp_min(_TINY).mul_(2.0 * eta * temperature).sqrt_()
                noise = torch.randn(p.shape, generator=generator, dtype=p.dtype, device=p.device)
                new_p.addcmul_(noise, std)
        else:
            new_p = (1.0 - eta * d) * p - eta * q * ev.grad
            if gamma_p is not None:
                new_p = new_p + (eta * temperature) * gamma_p
            if temperature > 0:
                std = torch.sqrt((2.0 * eta * temperature) * d.clamp_min(_TINY))
                new_p = new_p + gaussian_like(p, generator) * std

        new_p_hat = new_p * inv_sp
        if detach:
            new_p_hat = new_p_hat.detach()
        q_tilde, _, dqt_dph = self._curl(u, new_p_hat, exact and use_gamma, energy_grad=False)
        if fast:
            new_theta = torch.addcmul(state.theta, q_tilde, new_p, value=eta)
        else:
            new_theta = state.theta + eta * q_tilde * new_p
        if use_gamma:
            if not exact:
                dqt_dph = _secant(q_tilde - q, new_p_hat - p_hat)
                # Cached for the next step's finite differences (004 appendix B).
                extras = {"u": u, "q_tilde": q_tilde, "p_hat": p_hat, "dq_dph": dqt_dph}
            if fast:
                new_theta.add_(dqt_dph, alpha=-(eta * temperature * inv_sp))
            else:
                new_theta = new_theta - (eta * temperature * inv_sp) * dqt_dph
        return SamplerState(new_theta, new_p, extras, state.step, state.eta, ev.energy, ev.grad)

    # -- compiled sampling step ---------------------------------------------------------------
    def _defaults(self) -> bool:
        """No ``d_clamp`` and absolute friction units (the compiled kernels support only these;
        otherwise the eager step runs)."""
        return self.d_clamp is None and self.friction_units == "absolute"

    def _compilable(self, momentum: Tensor) -> bool:
        nets = (self.f_q, self.f_d)
        return (
            momentum.dtype == torch.float32
            and all(net.head.weight.dtype == torch.float32 for net in nets)
            and all(len(net.layers) == 1 for net in nets)
            and self.f_q.activation == self.f_d.activation
        )

    def _compiled_step(self, state, target, ev, eta, temperature, generator, k):
        """The step of :meth:`_step` under ``no_grad`` through two compiled kernels."""
        p = state.momentum
        mode = self.gamma if self.gamma != "none" and temperature > 0 else "none"
        cache = None
        if mode == "finite_difference" and "q_tilde" in state.extras:
            extras = state.extras
            cache = (extras["u"], extras["q_tilde"], extras["p_hat"], extras["dq_dph"])
        prior_w, du_scale = self._energy_scales(target)
        u = self._energy_u(ev, target)
        sp = float(self.momentum_std)
        inv_sp = 1.0 / sp
        # The per-chain energy input goes into the kernels at full size: with every operand a
        # contiguous (K, D) tensor the compiler fuses each kernel into one flat loop (a (K, 1)
        # operand splits it in two, with every hidden unit's activation stored in between).
        u_full = u.expand(p.shape).contiguous()
        q_params = tuple(_net_params(self.f_q))
        d_params = tuple(_net_params(self.f_d))
        noise = None
        if temperature > 0:
            noise = torch.randn(p.shape, generator=generator, dtype=p.dtype, device=p.device)
        values = {
            "sp": sp,
            "g_scale": self._grad_input_factor(target),
            "du_scale": du_scale,
            "prior_w": prior_w,
            "eta": eta,
            "eta_t": eta * temperature,
            "two_eta_t": 2.0 * eta * temperature,
            "eta_t_inv_sp": eta * temperature * inv_sp,
            "alpha": self.alpha,
            "two_alpha": 2.0 * self.alpha,
            "c": self.c,
            "s_d": self.d_output_scale,
            "q_clamp": self.q_clamp,
            "beta_off": self.beta_off,
            "inv_sp": inv_sp,
        }
        scalars = torch.tensor([values[name] for name in _SCALARS], dtype=p.dtype, device=p.device)
        prior_grad = ev.prior_grad if prior_w != 0.0 else None
        activation, d_output = self.f_q.activation, self.f_d.output
        _mark_dynamic(p, ev.grad, noise, prior_grad, u, u_full, state.theta, *(cache or ()))
        config = (
            activation,
            d_output,
            mode,
            cache is not None,
            noise is not None,
            prior_grad is not None,
            self.f_q.hidden[0],
            self.f_d.hidden[0],
        )
        new_p, q, p_hat, check = _kernel("momentum", config)(
            p, ev.grad, noise, prior_grad, u, u_full, q_params, d_params, scalars, cache,
            activation, d_output, mode,
        )  # fmt: skip
        if not bool(torch.isfinite(check)):
            # Name the chain and quantity exactly as the eager step does (raises if needed).
            _, _, p_hat_e, g_hat = self._inputs(ev, p, target, True)
            q_e, _, _ = self._curl(u, p_hat_e, False)
            fd_e, _ = self._diffusion_net(u, p_hat_e, g_hat, False)
            d_e, _ = self._friction(q_e, fd_e, eta)
            check_finite(k, **{"f_Q output": q_e, "f_D output": d_e})
        new_theta, q_tilde, dqt_dph = _kernel("position", (activation, mode, config[-2]))(
            state.theta, new_p, u_full, q_params, scalars, q, p_hat, activation, mode
        )
        extras: dict[str, Tensor] = {}
        if mode == "finite_difference":
            extras = {"u": u, "q_tilde": q_tilde, "p_hat": p_hat, "dq_dph": dqt_dph}
        return SamplerState(new_theta, new_p, extras, state.step, state.eta, ev.energy, ev.grad)

    def _fd_gamma_p(self, cache, u, du, p_hat, g_hat, q, fd, inv_sp, factor) -> Tensor:
        """``Gamma_p`` by finite differences; zero for terms without history (first step)."""
        if "q_tilde" not in cache:
            return torch.zeros_like(q)
        # d f_Q/du ≈ (f_Q(u_t, p_t) - f_Q(u_{t-1}, p_t)) / (u_t - u_{t-1}); the second value
        # is the previous step's Q(z~).
        dq_du = _secant(q - cache["q_tilde"], u - cache["u"])
        # d f_D/dp ≈ (f_D(u_t, p_t, g_t) - f_D(u_t, p_{t-1}, g_t)) / (p_t - p_{t-1}).
        fd_prev, _ = self._diffusion_net(u, cache["p_hat"], g_hat, False)
        dfd_dph = _secant(fd - fd_prev, p_hat - cache["p_hat"])
        # d f_Q/dp at z_t: the previous step's secant (delayed estimate, 004 eq. 22).
        dq_dph = cache["dq_dph"]
        if not torch.is_grad_enabled():
            gamma_p = torch.addcmul(dfd_dph, q, dq_dph, value=2.0 * self.alpha)
            return gamma_p.mul_(factor * inv_sp).addcmul_(dq_du, du)
        return dq_du * du + factor * (dfd_dph + 2.0 * self.alpha * q * dq_dph) * inv_sp

    # -- input statistics -------------------------------------------------------------------
    @torch.no_grad()
    def calibrate(
        self,
        target: Target,
        n_chains: int = 20,
        n_steps: int = 100,
        init: Tensor | None = None,
        seed: int = 0,
        energy: bool = False,
    ) -> dict[str, float]:
        """Measure input statistics by running this (e.g. randomly initialised) sampler briefly.

        Sets ``momentum_std`` and ``grad_std`` (and, with ``energy=True``, ``energy_loc`` /
        ``energy_std``) to the statistics of ``p``, ``grad Ũ`` and the per-datum energy seen over
        the run (004 appendix E). Returns them.
        """
        from ..driver import make_generator, sample  # local: the driver imports samplers

        self.energy_loc.fill_(0.0)
        for buffer in (self.energy_std, self.momentum_std, self.grad_std):
            buffer.fill_(1.0)
        device = self.f_q.head.weight.device
        grad_generator = make_generator(seed + 1, device)
        sums = {"p": [], "g": [], "u": []}

        def record(state: SamplerState) -> None:
            # The gradient input is re-evaluated (with its noise) on a separate stream so the
            # run itself is the same as an uncalibrated one.
            grad = target.evaluate(state.theta, grad_generator).grad
            sums["p"].append(state.momentum.double().pow(2).mean())
            sums["g"].append(grad.double().pow(2).mean())
            sums["u"].append(state.energy.double() / target.n_data)

        sample(
            self,
            target,
            n_chains,
            n_steps,
            init=init,
            seed=seed,
            progress=False,
            callback=record,
            store=False,
            device=device,
        )
        p_std = float(torch.stack(sums["p"]).mean().sqrt())
        g_std = float(torch.stack(sums["g"]).mean().sqrt())
        self.momentum_std.fill_(max(p_std, 1e-8))
        self.grad_std.fill_(max(g_std, 1e-8))
        result = {"momentum_std": p_std, "grad_std": g_std}
        if energy:
            energies = torch.cat(sums["u"])
            self.energy_loc.fill_(float(energies.mean()))
            self.energy_std.fill_(max(float(energies.std()), 1e-8))
            result.update(energy_loc=float(self.energy_loc), energy_std=float(self.energy_std))
        return result

    def save(self, path: str, provenance: dict | None = None) -> None:
        """Export the (trained) sampler to a safetensors file; see :mod:`metasampler.export`."""
        from ..export import save_sampler  # local: export imports this module

        save_sampler(self, path, provenance=provenance)

    def extra_repr(self) -> str:
        step = f"eta={self.eta}" if self.eta is not None else f"lr={self.lr}"
        return (
            f"{step}, gamma={self.gamma}, beta_off={self.beta_off}, alpha={self.alpha}, "
            f"c={self.c}, q_clamp={self.q_clamp}, d_output_scale={self.d_output_scale}, "
            f"d_clamp={self.d_clamp}, grad_input={self.grad_input}, "
            f"friction_units={self.friction_units}"
        )

    __repr__ = nn.Module.__repr__


# -- compiled kernels ---------------------------------------------------------------------------
# Scalars enter the kernels as one tensor (a Python float would be specialised: a new compile
# for every new step size of a schedule).
_SCALARS = (
    "sp", "g_scale", "du_scale", "prior_w", "eta", "eta_t", "two_eta_t", "eta_t_inv_sp",
    "alpha", "two_alpha", "c", "s_d", "q_clamp", "beta_off", "inv_sp",
)  # fmt: skip
_KERNELS: dict[tuple, object] = {}


def _kernel(name: str, config: tuple):
    """The compiled kernel ``name`` (``"momentum"`` or ``"position"``) for one static
    configuration (everything the kernel branches on), created on first use.

    Each configuration gets its own copy of the function's code object: dynamo keeps compiled
    graphs, and counts recompiles against its limit (8), per code object, so samplers and
    modes used in one process do not evict each other or fall back to eager.
    """
    fn = _KERNELS.get((name, config))
    if fn is None:
        source = {"momentum": _momentum_kernel, "position": _position_kernel}[name]
        copy = types.FunctionType(source.__code__.replace(), source.__globals__, source.__name__)
        # Chain and coordinate dimensions are marked dynamic at each call; the nets' widths
        # stay static (the unrolled form loops over them).
        fn = torch.compile(copy, dynamic=None, fullgraph=True)
        _KERNELS[(name, config)] = fn
    return fn


def _mark_dynamic(*tensors: Tensor | None) -> None:
    """Compile the kernels for any number of chains and coordinates (not per shape)."""
    for tensor in tensors:
        if tensor is not None:
            for dim in range(tensor.ndim):
                torch._dynamo.maybe_mark_dynamic(tensor, dim)


def _scalars(scalars: Tensor) -> dict[str, Tensor]:
    return dict(zip(_SCALARS, scalars.unbind(0), strict=True))


def _net_params(net: CoordinateMLP) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(W, b, w_out, b_out)`` of a one-hidden-layer net, for :func:`elementwise_forward`."""
    first = net.layers[0]
    return first.weight, first.bias, net.head.weight[0], net.head.bias


def _kernel_secant(numerator: Tensor, denominator: Tensor) -> Tensor:
    return torch.where(denominator.abs() >= _FD_MIN_STEP, numerator / denominator, 0.0)


def _momentum_kernel(p, grad, noise, prior_grad, u, u_full, q_params, d_params, scalars, cache,
                     activation, d_output, mode):  # fmt: skip
    """``p_{t+1}`` of the modified Euler step (see :meth:`NNSGHMC._step`), element-wise.

    Returns ``(p_{t+1}, Q_f, p_hat, sum(Q_f) + sum(D_f))``; ``Q_f`` and ``p_hat`` only for
    finite differences (else ``None``), the sum for the finiteness check.
    """
    v = _scalars(scalars)
    exact = mode == "exact"
    p_hat = p / v["sp"]
    g_hat = grad * v["g_scale"]
    raw, dq = elementwise_forward(
        activation, "identity", [u_full, p_hat], *q_params, (0, 1) if exact else ()
    )
    q = raw.clamp(-v["q_clamp"], v["q_clamp"]) + v["beta_off"]
    fd, dfd = elementwise_forward(
        activation, d_output, [u_full, p_hat, g_hat], *d_params, (1,) if exact else ()
    )
    fd = v["s_d"] * fd
    d = v["alpha"] * q * q + fd + v["c"]
    new_p = (1.0 - v["eta"] * d) * p - v["eta"] * q * grad
    gamma_p = None
    if mode != "none" and (exact or cache is not None):
        du = grad if prior_grad is None else grad - v["prior_w"] * prior_grad
        du = du * v["du_scale"]
        if exact:
            inside = raw.abs() < v["q_clamp"]
            dq_du = torch.where(inside, dq[0], 0.0)
            dq_dph = torch.where(inside, dq[1], 0.0)
            dfd_dph = v["s_d"] * dfd[0]
        else:
            u_prev, q_prev, p_hat_prev, dq_dph = cache
            dq_du = _kernel_secant(q - q_prev, u - u_prev)
            fd_prev, _ = elementwise_forward(
                activation, d_output, [u_full, p_hat_prev, g_hat], *d_params
            )
            dfd_dph = _kernel_secant(fd - v["s_d"] * fd_prev, p_hat - p_hat_prev)
        gamma_p = dq_du * du + (dfd_dph + v["two_alpha"] * q * dq_dph) * v["inv_sp"]
        new_p = new_p + v["eta_t"] * gamma_p
    if noise is not None:
        new_p = new_p + noise * torch.sqrt(v["two_eta_t"] * d.clamp_min(_TINY))
    check = q.sum() + d.sum()
    if mode == "finite_difference":
        return new_p, q, p_hat, check
    return new_p, None, None, check


def _position_kernel(theta, new_p, u_full, q_params, scalars, q, p_hat, activation, mode):
    """``theta_{t+1}`` (and, for finite differences, ``Q_f(z~)`` and its secant)."""
    v = _scalars(scalars)
    new_p_hat = new_p * v["inv_sp"]
    raw, dq = elementwise_forward(
        activation, "identity", [u_full, new_p_hat], *q_params, (1,) if mode == "exact" else ()
    )
    q_tilde = raw.clamp(-v["q_clamp"], v["q_clamp"]) + v["beta_off"]
    new_theta = theta + v["eta"] * q_tilde * new_p
    if mode == "exact":
        dqt_dph = torch.where(raw.abs() < v["q_clamp"], dq[0], 0.0)
        return new_theta - v["eta_t_inv_sp"] * dqt_dph, None, None
    if mode == "finite_difference":
        dqt_dph = _kernel_secant(q_tilde - q, new_p_hat - p_hat)
        return new_theta - v["eta_t_inv_sp"] * dqt_dph, q_tilde, dqt_dph
    return new_theta, None, None


def _check_coefficients(step: int, q: Tensor, d: Tensor) -> None:
    """:func:`check_finite` on ``Q_f`` and ``D_f``, at the cost of two sums when all is finite
    (a non-finite entry makes its sum non-finite; an overflowing sum only costs the full
    check)."""
    if not bool(torch.isfinite(q.detach().sum() + d.detach().sum())):
        check_finite(step, **{"f_Q output": q, "f_D output": d})


def _secant(numerator: Tensor, denominator: Tensor) -> Tensor:
    """``numerator / denominator`` where ``|denominator| >= _FD_MIN_STEP``, else 0 (no NaN/Inf,
    also in the backward pass)."""
    if not torch.is_grad_enabled():
        # No backward pass: divide everywhere, then zero the guarded entries.
        return torch.where(denominator.abs() >= _FD_MIN_STEP, numerator / denominator, 0.0)
    ok = denominator.abs() >= _FD_MIN_STEP
    safe = torch.where(ok, denominator, torch.ones_like(denominator))
    return torch.where(ok, numerator / safe, torch.zeros_like(numerator))
