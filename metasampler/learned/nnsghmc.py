"""NNSGHMC: the learnable complete-recipe sampler (Gong, Li & Hernández-Lobato, ICLR 2019).

State ``z = (theta, p)``, Hamiltonian ``H = U(theta) + p.p / 2``, target ``exp(-H / T)``.
Diagonal curl and diffusion from per-coordinate nets with shared weights (``docs/METHOD.md``
§3)::

    Q_f,i = clamp(f_phiQ(u, x_i), -5, 5)     x_i = s_i (curl_input="stiffness") or p_hat_i
    eta D_f,i = alpha Q_f,i^2 + s_D f_phiD(u, p_hat_i, g_i)          (f_phiD >= 0: softplus)

    Q = [[0, -Q_f], [Q_f, 0]],   D = [[0, 0], [0, D_f]]
    dz = -(D + Q) grad H dt + T Gamma dt + sqrt(2 T D) dW,   Gamma_i = sum_j d_j (D + Q)_ij

The friction is written per step (``eta D_f``), so a sampler trained at one step and data size
gives the same friction per step at another. This leaves ``pi`` invariant for any nets (Ma,
Chen & Fox 2015). For this design::

    Gamma_theta,i = -d Q_f,i / d p_i
    Gamma_p,i     =  d Q_f,i / d theta_i + d D_f,i / d p_i

Net inputs (Gong et al. 2019 appendix E): the standardised energy ``u = (U / n - mu_U) /
sigma_U`` (``n`` the number of data ``N``, or the dimension for an energy with no data:
:mod:`metasampler.learned.inputs`), the standardised momentum ``p_hat_i = p_i / sigma_p``, the
per-datum gradient ``g_i = s_g d_i Ũ / N`` and, for the curl, the stiffness
``s_i = log(eta sqrt(V_i))``, ``V_i`` a running mean of the chain's earlier ``(d_i Ũ)^2``
(:mod:`metasampler.learned.stiffness`): a constant of ``z`` within a step, so Gamma has no
term for it, adapted during the warm-up and fixed after it. The curl of Gong et al. (2019)
sees the momentum instead (``curl_input="momentum"``). Every transformation enters the chain
rule, e.g. ``d Q_f,i / d theta_i = (d f_phiQ / d u) / (sigma_U n) * d_i Ũ``.

Discretisation (modified Euler, Gong et al. 2019 eq. 7), ``z~_t = (theta_t, p_{t+1})``, used
identically in meta-training and sampling::

    p_{t+1}     = (1 - eta D_f(z_t)) p_t - eta Q_f(z_t) grad Ũ(theta_t) + eta T Gamma_p(z_t)
                  + N(0, 2 eta T D_f(z_t))
    theta_{t+1} = theta_t + eta Q_f(z~_t) p_{t+1} + eta T Gamma_theta(z~_t)

With ``thermostat`` (the default) each coordinate also carries a Nosé-Hoover thermostat ``xi``
(Ding et al. 2014; in the complete recipe, the curl ``Q_(p_i, xi_i) = p_i`` with
``H += xi.xi / 2``): ``p *= exp(-eta xi / 2)``, the step, ``p *= exp(-eta xi / 2)``,
``xi += eta (p_bar^2 - T)``, ``p_bar`` the mean of the momenta entering and leaving the step.
Its friction rises where the momentum runs hotter than ``T``, so it takes out the heat the
minibatch gradient's noise brings without knowing that noise.

``gamma`` chooses how the derivatives are obtained:

* ``"exact"``: the nets' own forward-mode chain rule (no Hessian of ``U``), differentiable;
* ``"finite_difference"``: Gong et al. (2019) appendix B, with cached net outputs (secants in
  ``p`` at fixed ``U``, in ``U`` at fixed ``p``, one extra ``f_D`` pass at the previous
  momentum); tiny denominators give a zero derivative, so no NaN or Inf can appear. Only for the
  momentum curl without a thermostat: the paper's sampler;
* ``"none"``: drops Gamma. A diagnostic only: it breaks stationarity.

Code: these equations are written once, in :mod:`metasampler.learned.equations` (pure
functions); :mod:`metasampler.learned.inputs` computes their inputs and scalars from the
sampler's constants and the target; :mod:`metasampler.learned.fast` chooses how a step runs
them (compiled in the background, in cache-sized blocks, with autograd);
:mod:`metasampler.learned.drift` evaluates them at a given point (diagnostics); this module
holds the sampler's constants, its chain statistics and the sampler protocol.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..integrators import gaussian_like
from ..nnsghmc_args import (
    CONSTANTS,
    CURL_INPUTS,
    GAMMA_MODES,
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

__all__ = ["NNSGHMC", "DriftTerms", "GAMMA_MODES", "CURL_INPUTS"]


#: The constants ``repr`` shows after the step.
_REPR_FIELDS = ("curl_input", "gamma", "alpha", "friction_scale", "grad_input_scale", "thermostat")


class NNSGHMC(nn.Module, Sampler):
    """The learnable SG-MCMC sampler. Same protocol as every baseline: ``init`` / ``step``.

    ``NNSGHMC()`` is the design this package meta-trains and ships: a curl fed each
    coordinate's stiffness, inside a thermostat. ``NNSGHMC(curl_input="momentum",
    thermostat=False, gamma="exact" or "finite_difference")`` is the sampler of Gong et al.
    (2019). Trained samplers are loaded with :func:`~metasampler.load_sampler`.

        Args:
            seed: seeds the nets' initial weights.
            compile: how sampling steps (under ``torch.no_grad()``) run
                (:mod:`metasampler.learned.fast`). ``None`` (default): compiled in the
                background while eager steps run (a CPU with a C++ compiler: one fused loop
                built ahead of time and cached on disk, :mod:`metasampler.learned.aot`; a GPU:
                ``torch.compile`` from caches a child process fills), else eager after a
                one-line notice. ``True``: wait for the compiled step. ``False``: eager. Not
                exported: the ``use_compile`` attribute of a loaded one.
            eta / lr: step (``lr`` converts as ``eta = sqrt(lr / N)``); sampling may use a
                different step from training.
            temperature, schedule: as for every sampler.
            **arguments: the architecture and constants, the fields of
                :class:`~metasampler.nnsghmc_args.NNSGHMCArgs` (listed below); each becomes an
                attribute of the same name.

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
        **arguments: Any,
    ) -> None:
        nn.Module.__init__(self)
        Sampler.__init__(self, eta=eta, lr=lr, temperature=temperature, schedule=schedule)
        unknown = sorted(set(arguments) - {f.name for f in arg_fields()})
        if unknown:
            raise TypeError(
                f"NNSGHMC got unknown argument(s) {unknown}; it takes seed, compile, eta, lr, "
                f"temperature, schedule and {[f.name for f in arg_fields()]}"
            )
        args = NNSGHMCArgs(**arguments)
        if args.gamma == "none":
            warnings.warn(
                "NNSGHMC(gamma='none') drops the Gamma correction: the chain no longer targets "
                "the posterior. Use it only as a diagnostic.",
                stacklevel=2,
            )
        self.curl_input = args.curl_input
        self.f_q = CoordinateMLP(2, args.q_hidden, args.activation, "identity")
        self.f_d = CoordinateMLP(3, args.d_hidden, args.activation, "softplus")
        if seed is not None:
            generator = torch.Generator().manual_seed(int(seed))
            self.f_q.reset_parameters(generator)
            self.f_d.reset_parameters(generator)
        for f in arg_fields(CONSTANTS):
            setattr(self, f.name, getattr(args, f.name))
        # Not `self.compile`: that would shadow nn.Module.compile.
        self.use_compile = compile
        self.step_path = "auto"  # see `fast.PATHS`
        self._fixed_stiffness = stats.FixedStiffness()
        # Input statistics (Gong et al. 2019 appendix E), measured by `calibrate`; exported.
        self.register_buffer("energy_loc", torch.tensor(0.0, dtype=torch.float64))
        self.register_buffer("energy_std", torch.tensor(1.0, dtype=torch.float64))
        self.register_buffer("momentum_std", torch.tensor(1.0, dtype=torch.float64))
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
            curl_input=self.curl_input,
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
    def uses_stiffness(self) -> bool:
        """Whether the curl sees the stiffness, so that a chain carries the running mean
        ``V`` of its squared gradients."""
        return self.curl_input == "stiffness"

    def _stiffness_given(self, stiffness: Tensor | None, like: Tensor) -> Tensor | None:
        """``stiffness`` at the shape of ``like``; a clear error when it is needed but
        missing."""
        if not self.uses_stiffness:
            return None
        if stiffness is None:
            raise ValueError(
                "this sampler's curl sees the stiffness (curl_input='stiffness'): pass "
                "stiffness= (metasampler.learned.stiffness.stiffness_input) or grad_sq="
            )
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
        state.momentum = init_momentum(state.theta, "normal", self.temperature, generator)
        return state

    def _step(self, state, target, eta, temperature, generator):
        # (constants set on a loaded sampler are checked here; the constructor checks its own)
        conflict = gamma_conflict(self.gamma, self.curl_input, self.thermostat)
        if conflict:
            raise ValueError(f"NNSGHMC: {conflict}")
        k = state.step + 1
        extras = state.extras
        # (one thread fewer while a build runs: the gradient's threads spinning against the
        # build slowed it)
        with aot.leaving_a_core_to_builds():
            ev = self.evaluate(target, state.theta, k, generator)
        u, prior_grad = self._energy_input(ev, target)
        p = state.momentum
        gamma = self.gamma if temperature > 0 else "none"
        cache = None
        if gamma == "finite_difference" and "q_tilde" in extras:
            cache = (extras["u"], extras["q_tilde"], extras["p_hat"], extras["dq_dph"])
        noise = gaussian_like(p, generator) if temperature > 0 else None
        v = self._scalars(target, eta, temperature)
        chain_stats, stiffness = {}, None
        if self.uses_stiffness:  # V of the earlier steps (the first step: its own gradient's)
            chain_stats = stats.update_chain_statistics(extras, ev, k)
            past = extras.get("grad_sq", chain_stats["grad_sq"])
            fixed = stats.FROZEN in extras  # (V fixed: its input computed once, not per step)
            s = self._fixed_stiffness.of(past, eta) if fixed else stats.stiffness_input(past, eta)
            stiffness = self._stiffness_given(s, p)
        args = StepArgs(
            state.theta, p, ev.grad, prior_grad, u, noise, cache, *self._nets(p.dtype), v,
            self._config(gamma, True), stiffness, self._thermostat_state(p, extras),
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
        return SamplerState(new_theta, new_p, extras, state.step, state.eta, ev.energy, ev.grad)

    def end_warmup(self, state: SamplerState) -> SamplerState:
        """Fix the stiffness statistic ``V`` from now on (the curl's input then depends on
        ``z`` alone, so the chain is one time-homogeneous kernel that Gamma makes exact)."""
        if not self.uses_stiffness:
            return state
        return SamplerState(
            state.theta, state.momentum, stats.freeze(state.extras), state.step, state.eta,
            state.energy, state.grad,
        )  # fmt: skip

    def restart_warmup(self, state: SamplerState) -> SamplerState:
        """The thermostat ``xi`` back at 0, its start. From a start far from the posterior the
        thermostat takes up the transient's heat and drains it by at most ``eta T`` per step,
        overdamping the chains meanwhile; a restart in the warm-up lets them reach the
        posterior at the friction it needs there (as Stan's warm-up restarts its metric's
        estimate in doubling windows)."""
        if not self.thermostat or "xi" not in state.extras:
            return state
        extras = {**state.extras, "xi": torch.zeros_like(state.extras["xi"])}
        return SamplerState(
            state.theta, state.momentum, extras, state.step, state.eta, state.energy, state.grad
        )

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
