"""NNSGHMC — the learnable complete-recipe sampler (Gong, Li & Hernández-Lobato, ICLR 2019 §3).

State ``z = (theta, p)``, Hamiltonian ``H = U(theta) + p.p / 2``, target ``exp(-H / T)``.
Diagonal curl and diffusion from per-coordinate nets with shared weights (SPEC §3)::

    Q_f,i = (beta_off + clamp(f_phiQ(u, p_i), -q_clamp, q_clamp)) r_i   (f_phiQ >= 0: q_output)
    r_i   = (1 + (p_hat_i / m)^2)^(-1/2)   (m = speed_limit; r_i = 1 without one)
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
``r = D_train / D_test``), ``p_hat_i = p_i / sigma_p`` (the nets see it clamped to
``[-c_p, c_p]`` with ``momentum_input_clamp = c_p``: Gamma differentiates the clamp; ``r_i``
takes it unclamped) and the gradient input
``g_i = s_g * d_i Ũ / sigma_g`` (``grad_input="standardised"``) or ``g_i = s_g * d_i Ũ / N``
(``grad_input="per_datum"``, the paper's; no calibrated statistic). Options not in the SPEC
(#11): ``f_phiQ`` without ``p_i`` (``q_momentum_input=False``), and with the stiffness
``s_i = log(eta sqrt(V_i))``, ``V_i`` a running mean of the chain's earlier ``(d_i Ũ)^2``
(``q_stiffness_input``; :mod:`metasampler.learned.stiffness`): a constant of ``z`` within a
step, so Gamma has no term for it. The same statistic can precondition the curl
(``precondition_power`` ``gamma_P > 0``): ``Q_f,i`` above is multiplied by
``P_i = exp(clamp(-gamma_P (s_i - median s), -L, L))`` (``s`` from ``V`` averaged over the
chains), so every derivative of ``Q_f`` in Gamma is multiplied by ``P_i`` too. With
``stiffness_freeze_after`` ``V`` stops adapting after that step, as an adaptive MCMC's warm-up
fixes its metric, and the chain is time-homogeneous from then on.
Every transformation enters the chain rule, e.g.
``d Q_f,i / d theta_i = (d f_phiQ / d u) * s_U / (sigma_U N) * (d_i Ũ - (1 - r) d_i prior)``.

Discretisation (modified Euler, 004 eq. 7), ``z~_t = (theta_t, p_{t+1})``, used identically
in meta-training and evaluation::

    p_{t+1}     = (1 - eta D_f(z_t)) p_t - eta Q_f(z_t) grad Ũ(theta_t) + eta T Gamma_p(z_t)
                  + N(0, 2 eta T D_f(z_t))
    theta_{t+1} = theta_t + eta Q_f(z~_t) p_{t+1} + eta T Gamma_theta(z~_t)

Not in the SPEC: with a known gradient-noise variance ``V`` (``grad_noise_var``, default 0)
the injected noise is ``N(0, 2 eta T D_f - eta^2 Q_f^2 V)``, because ``- eta Q_f grad Ũ``
already carries ``eta^2 Q_f^2 V`` (SGHMC's ``B_hat``; docs/METHOD.md §3); with
``grad_noise_estimate`` ``V`` is each chain's running estimate per coordinate instead
(:mod:`metasampler.gradient_noise`). With ``grad_noise_friction`` the noise's diffusion
``B = eta Q_f^2 V / 2`` joins the friction instead, ``D_f + B / T`` (and Gamma), and the injected
noise stays ``N(0, 2 eta T D_f)``. With ``thermostat`` each coordinate also carries mSGNHT's
thermostat ``xi`` (the complete recipe's curl ``Q_(p_i, xi_i) = p_i``, ``H += xi.xi / 2``):
``p *= exp(-eta xi / 2)``, the step, ``p *= exp(-eta xi / 2)``, ``xi += eta (p_bar^2 - T)``,
``p_bar`` the mean of the momenta entering and leaving the step (whose second moment the Euler
friction leaves at ``T``; ``p`` itself runs hot by ``1 / (1 - eta D_f / 2)`` while the positions
do not: docs/RESULTS.md, session 54). With ``leapfrog`` the update above moves the chain's
gradient points ``theta^g`` and the reported position is the midpoint of two,
``theta_t = (theta^g_t + theta^g_{t+1}) / 2``: the leapfrog (ABA) splitting of the position flow
around the momentum step, each half with the drift of the step it belongs to. For a Gaussian
with constant coefficients these positions are exact at any stiffness, where the Euler positions
run hot by at least ``1 / (1 - eta^2 Q_f^2 k / 4)`` (curvature ``k``); the state carries
``half_step = (theta^g_{t+1} - theta^g_t) / 2``, and ``state.energy`` and ``state.grad`` are
those at the gradient point ``theta + half_step``. All off, the update is the SPEC's.

``gamma`` chooses how the derivatives are obtained:

* ``"exact"`` — the nets' own forward-mode chain rule (no Hessian of ``U``), differentiable;
* ``"finite_difference"`` — 004 appendix B with cached net outputs (secants in ``p`` at fixed
  ``U``, in ``U`` at fixed ``p``, one extra ``f_D`` pass at the previous momentum); tiny
  denominators fall back to a zero derivative, so no NaN or Inf can appear;
* ``"none"`` — drops Gamma. A diagnostic only: it breaks stationarity (the stationarity tests
  show the bias).

Reduction: ``f_phiQ ≡ 0, beta_off = 1, alpha = 0, s_D = 0, c = C`` is exactly SGHMC with
friction ``C``.

Code: these equations are written once, in :mod:`metasampler.learned.equations` (pure
functions); :mod:`metasampler.learned.inputs` computes their inputs and scalars from the
sampler's constants and the target; :mod:`metasampler.learned.fast` chooses how a step runs
them (compiled in the background, in cache-sized blocks, with autograd);
:mod:`metasampler.learned.drift` evaluates them at a given point (diagnostics); this module
holds the sampler's constants, its chain statistics and the sampler protocol.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..integrators import gaussian_like
from ..nnsghmc_args import (
    CONSTANTS,
    FRICTION_UNITS,
    GAMMA_MODES,
    GRAD_INPUTS,
    NNSGHMCArgs,
    arg_fields,
    describe_args,
    gamma_conflict,
    signature_with_args,
)
from ..sampler_write import write_sampler
from ..samplers.base import Sampler, SamplerState, check_finite
from ..samplers.sghmc import init_momentum
from ..schedules import Schedule
from ..targets import Target
from . import aot, drift, inputs
from . import stiffness as stats
from .calibration import calibrate_inputs
from .drift import DriftTerms
from .equations import StepArgs, nnsghmc_coefficients
from .fast import run as run_step
from .nets import CoordinateMLP, NetParams

__all__ = [
    "NNSGHMC",
    "DriftTerms",
    "GAMMA_MODES",
    "GRAD_INPUTS",
    "FRICTION_UNITS",
]


#: The constants ``repr`` shows after the step.
_REPR_FIELDS = (
    "gamma", "beta_off", "alpha", "c", "q_clamp", "d_output_scale", "d_clamp",
    "momentum_input_clamp", "speed_limit", "grad_input", "friction_units", "thermostat",
    "leapfrog",
)  # fmt: skip


class NNSGHMC(nn.Module, Sampler):
    """The learnable SG-MCMC sampler. Same protocol as every baseline: ``init`` / ``step``.

        Args:
            eta / lr: step (``lr`` converts as ``eta = sqrt(lr / N)``); evaluation may use a
                different step from training.
            temperature, schedule: as for every sampler.
            seed: seeds the nets' initial weights.
            compile: how sampling steps (under ``torch.no_grad()``) run
                (:mod:`metasampler.learned.fast`). ``None`` (default): compiled in the
                background while eager steps run (a CPU with a C++ compiler: one fused loop
                built ahead of time and cached on disk, :mod:`metasampler.learned.aot`; a GPU:
                ``torch.compile`` from caches a child process fills), else eager after a
                one-line notice. ``True``: wait for the compiled step. ``False``: eager. Not
                exported: the ``use_compile`` attribute of a loaded one. Meta-training steps
                run with autograd (``True``: through ``torch.compile``); the ``step_path``
                attribute ("auto", "plain", "blocks", "recompute", "compiled") forces one way.
            grad_noise_var: the variance ``V`` of the gradient's noise per coordinate, where it
                is known (e.g. the toy targets' injected ``N(0, sigma^2)``: ``V = sigma^2``).
                ``0`` (default): none assumed. With ``V > 0`` the injected noise gives
                ``2 eta T D_f - eta^2 Q_f^2 V`` instead of ``2 eta T D_f`` (SGHMC's ``B_hat``
                correction with a learned curl), so the noise of ``eta Q_f grad Ũ`` no longer
                heats the chains. A property of the problem, like ``temperature``: not part of
                the exported sampler; settable on a loaded one as an attribute.
            grad_noise_estimate: estimate ``V`` instead, per chain and coordinate, where the
                target can (:class:`~metasampler.BayesianModel`: from the two halves of each
                minibatch, at about the cost of one gradient; :class:`~metasampler.EnergyTarget`:
                from the two halves of its injected noise), its running mean over about 20
                steps (:mod:`metasampler.gradient_noise`); replaces ``grad_noise_var``. Not
                exported; settable as an attribute.
            grad_noise_friction: where ``V`` is known or estimated, dissipate the gradient
                noise's diffusion ``B = eta Q_f^2 V / 2`` as friction instead, ``D_f + B / T``,
                so the injected noise stays ``2 eta T D_f`` however large ``B`` is (the
                subtraction above injects nothing where ``B > T D_f`` and leaves those
                coordinates hot; a thermostat raises its friction there). The modified Euler
                step multiplies the momentum by ``1 - eta D_f``, so where ``eta B / T`` nears 2
                per step (a large ``V`` at a large step) it overshoots and the chain diverges
                (docs/RESULTS.md, session 53). Not exported; settable as an attribute.
            **arguments: the architecture and constants, the fields of
                :class:`~metasampler.nnsghmc_args.NNSGHMCArgs` (listed below); each becomes an
                attribute of the same name (the architecture is that of ``f_q`` / ``f_d``).

        Architecture and constants (:class:`~metasampler.nnsghmc_args.NNSGHMCArgs`):
    {arguments}
    """

    order = "second"

    def __init__(
        self,
        *,
        seed: int | None = 0,
        compile: bool | None = None,
        eta: float | None = None,
        lr: float | None = None,
        temperature: float = 1.0,
        schedule: Schedule | None = None,
        grad_noise_var: float = 0.0,
        grad_noise_estimate: bool = False,
        grad_noise_friction: bool = False,
        **arguments: Any,
    ) -> None:
        nn.Module.__init__(self)
        Sampler.__init__(self, eta=eta, lr=lr, temperature=temperature, schedule=schedule)
        args = NNSGHMCArgs(**arguments)
        if args.gamma == "none":
            warnings.warn(
                "NNSGHMC(gamma='none') drops the Gamma correction: the chain no longer targets "
                "the posterior. Use it only as a diagnostic.",
                stacklevel=2,
            )
        # (U, p_i) or U alone, and the stiffness s_i
        q_inputs = 1 + args.q_momentum_input + args.q_stiffness_input
        self.q_momentum_input = args.q_momentum_input
        self.q_stiffness_input = args.q_stiffness_input
        self.f_q = CoordinateMLP(q_inputs, args.q_hidden, args.activation, args.q_output)
        self.f_d = CoordinateMLP(3, args.d_hidden, args.activation, args.d_output)
        if seed is not None:
            generator = torch.Generator().manual_seed(int(seed))
            self.f_q.reset_parameters(generator)
            self.f_d.reset_parameters(generator)
        for f in arg_fields(CONSTANTS):
            setattr(self, f.name, getattr(args, f.name))
        if not (math.isfinite(grad_noise_var) and grad_noise_var >= 0):
            raise ValueError(f"grad_noise_var must be a finite number >= 0, got {grad_noise_var!r}")
        self.grad_noise_var = float(grad_noise_var)
        self.grad_noise_estimate = bool(grad_noise_estimate)
        self.grad_noise_friction = bool(grad_noise_friction)
        # Not `self.compile`: that would shadow nn.Module.compile.
        self.use_compile = compile
        self.step_path = "auto"  # see `fast.PATHS`
        # Input statistics (004 appendix E), measured by `calibrate`; part of the export.
        self.register_buffer("energy_loc", torch.tensor(0.0, dtype=torch.float64))
        self.register_buffer("energy_std", torch.tensor(1.0, dtype=torch.float64))
        self.register_buffer("momentum_std", torch.tensor(1.0, dtype=torch.float64))
        self.register_buffer("grad_std", torch.tensor(1.0, dtype=torch.float64))
        # Dimension of the meta-training target (0: unknown, then r = D_train / D_test = 1).
        self.register_buffer("train_dim", torch.tensor(0, dtype=torch.int64))

    def arguments(self) -> NNSGHMCArgs:
        """The sampler's architecture and current constants (what its file stores).

        Raises:
            ValueError: the nets use different activations (the constructor takes one), or
                a constant was set to an invalid value.
        """
        if self.f_q.activation != self.f_d.activation:
            raise ValueError(
                "cannot export an NNSGHMC whose nets use different activations "
                f"(f_q: {self.f_q.activation}, f_d: {self.f_d.activation}); the constructor "
                "takes one activation for both"
            )
        return NNSGHMCArgs(
            q_hidden=tuple(self.f_q.hidden),
            d_hidden=tuple(self.f_d.hidden),
            activation=self.f_q.activation,
            d_output=self.f_d.output,
            q_output=self.f_q.output,
            q_momentum_input=self.q_momentum_input,
            q_stiffness_input=self.q_stiffness_input,
            **{f.name: getattr(self, f.name) for f in arg_fields(CONSTANTS)},
        )

    # -- net inputs and the step's scalars (:mod:`metasampler.learned.inputs`) ------------------
    _energy_divisor = inputs.energy_divisor
    _energy_input = inputs.energy_input
    _scalars = inputs.step_scalars
    _config = inputs.step_config

    # -- the coefficients at a given point (:mod:`metasampler.learned.drift`) -----------------
    coefficients = drift.coefficients
    drift_terms = drift.drift_terms

    def _nets(self, dtype: torch.dtype | None = None) -> tuple[NetParams, NetParams]:
        """The nets' weights, in ``dtype`` (the chains'; a no-op when they agree)."""
        return self.f_q.params(dtype), self.f_d.params(dtype)

    @property
    def preconditioned(self) -> bool:
        """Whether the curl is scaled by the stiffness preconditioner (``precondition_power``)."""
        return self.precondition_power > 0

    @property
    def uses_stiffness(self) -> bool:
        """Whether the curl needs the stiffness (its input or its preconditioner), so that a
        chain carries the running mean ``V`` of its squared gradients."""
        return self.q_stiffness_input or self.preconditioned

    def _stiffness_given(self, stiffness: Tensor | None, like: Tensor, v: dict) -> Tensor | None:
        """``stiffness`` at the shape of ``like``, with its median in ``v`` for the
        preconditioner; a clear error when it is needed but missing."""
        if not self.uses_stiffness:
            return None
        if stiffness is None:
            raise ValueError(
                "this sampler's curl uses the stiffness (q_stiffness_input or "
                "precondition_power): pass stiffness= "
                "(metasampler.learned.stiffness.stiffness_input) or grad_sq="
            )
        if self.preconditioned:
            v["precond_ref"] = stats.preconditioner_reference(stiffness)
        return stiffness.expand_as(like)

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
        # (constants set on a loaded sampler are checked here; the constructor checks its own)
        conflict = gamma_conflict(
            self.precondition_power, self.thermostat, self.gamma, self.q_stiffness_input
        )
        if conflict:
            raise ValueError(f"NNSGHMC: {conflict}")
        k = state.step + 1
        second_order = not self.detach_inputs and torch.is_grad_enabled()
        estimate = self.grad_noise_estimate
        extras = state.extras
        theta = state.theta  # where grad U is taken: half a step ahead with `leapfrog`
        if self.leapfrog and "half_step" in extras:
            theta = theta + extras["half_step"]
        # (one thread fewer while a build runs, as for the eager update: the gradient's
        # threads spinning against the build slowed it; BENCHMARKS.md, session 33)
        with aot.leaving_a_core_to_builds():
            ev = self.evaluate(target, theta, k, generator, second_order, estimate)
        u, prior_grad = self._energy_input(ev, target)
        p = state.momentum
        gamma = self.gamma if temperature > 0 else "none"
        cache = None
        if gamma == "finite_difference" and "q_tilde" in extras:
            cache = (extras["u"], extras["q_tilde"], extras["p_hat"], extras["dq_dph"])
        noise = gaussian_like(p, generator) if temperature > 0 else None
        v = self._scalars(target, eta, temperature)
        decay = self.stiffness_decay if self.uses_stiffness else None
        chain_stats = stats.update_chain_statistics(
            extras, ev, k, decay, self.stiffness_freeze_after
        )
        stiffness = None
        if self.uses_stiffness:  # V of the earlier steps (the first step: its own gradient's)
            past = extras.get("grad_sq", chain_stats["grad_sq"])
            stiffness = stats.chain_stiffness(past, eta, self.preconditioned)
            stiffness = self._stiffness_given(stiffness, p, v)
        args = StepArgs(
            theta, p, ev.grad, prior_grad, u, noise, cache, *self._nets(p.dtype), v,
            self._config(gamma, self.detach_inputs), stiffness, chain_stats.get("noise_var"),
            self._thermostat_state(p, extras),
        )  # fmt: skip
        new_theta, new_p, check, new_cache, xi = run_step(args, self)
        if not bool(torch.isfinite(check)):
            # Name the chain and quantity (recomputed only in this rare case).
            q, d, _, _ = nnsghmc_coefficients(
                args.u, args.p * args.v["inv_sp"], args.grad * args.v["g_scale"], args.grad,
                args.q_net, args.d_net, args.v, self._config("none", True), None, stiffness,
            )  # fmt: skip
            check_finite(k, **{"f_Q output": q, "f_D output": d})
        extras = {}
        if new_cache is not None:
            extras = dict(zip(("u", "q_tilde", "p_hat", "dq_dph"), new_cache, strict=True))
        extras.update(chain_stats)
        if xi is not None:
            extras["xi"] = xi
        if self.leapfrog:  # report the midpoint of two gradient points (module docstring)
            extras["half_step"] = 0.5 * (new_theta - theta)
            new_theta = new_theta - extras["half_step"]
        return SamplerState(new_theta, new_p, extras, state.step, state.eta, ev.energy, ev.grad)

    def _thermostat_state(self, p: Tensor, extras: Mapping[str, Tensor]) -> Tensor | None:
        """The chains' thermostat ``xi`` (0 at first); ``None`` without a thermostat."""
        if not self.thermostat:
            return None
        xi = extras.get("xi")
        return torch.zeros_like(p) if xi is None else xi

    # -- input statistics -------------------------------------------------------------------
    #: Measure input statistics by running this (e.g. untrained) sampler briefly
    #: (:func:`~metasampler.learned.calibration.calibrate_inputs`).
    calibrate = calibrate_inputs

    def save(self, path: str, provenance: dict | None = None) -> None:
        """Export the (trained) sampler to a safetensors file; see :mod:`metasampler.export`."""
        if provenance is not None and not isinstance(provenance, Mapping):
            raise TypeError(f"provenance must be a dict or None, got {type(provenance).__name__}")
        training = {"eta": self.eta, "lr": self.lr, "temperature": self.temperature}
        write_sampler(path, self.arguments(), training, self.state_dict(), dict(provenance or {}))

    def extra_repr(self) -> str:
        step = f"eta={self.eta}" if self.eta is not None else f"lr={self.lr}"
        return ", ".join([step, *(f"{name}={getattr(self, name)}" for name in _REPR_FIELDS)])

    __repr__ = nn.Module.__repr__


NNSGHMC.__doc__ = NNSGHMC.__doc__.replace("{arguments}", describe_args())

NNSGHMC.__signature__ = signature_with_args(NNSGHMC.__init__)
