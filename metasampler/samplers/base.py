"""The protocol every sampler follows, hand-designed or learned.

A sampler is a small object holding hyper-parameters. It never holds chain state: that lives
in a :class:`SamplerState` that ``init`` creates from ``(K, D)`` positions and ``step``
advances, returning a new state. Each step makes exactly one target evaluation, on all ``K``
chains at once.

Subclasses implement ``_init_extras`` (momentum, thermostats, preconditioners) and
``_step(state, target, eta, temperature, generator)`` given the scheduled step ``eta`` and
temperature for that step (0 during a cyclical schedule's exploration stage).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from numbers import Real
from typing import ClassVar

import torch
from torch import Tensor

from ..schedules import Constant, Schedule
from ..stepsize import Order, check_step_args, resolve_eta
from ..targets import Evaluation, NonFiniteError, Target, check_positions

__all__ = [
    "FIRST_RESTART",
    "SamplerState",
    "Sampler",
    "check_finite",
    "check_step_scalars",
    "warmup_restarts",
]


@dataclass
class SamplerState:
    """The state of ``K`` chains.

    Attributes:
        theta: ``(K, D)`` positions.
        momentum: ``(K, D)`` momenta for second-order samplers, else ``None``.
        extras: sampler-specific tensors (thermostats, preconditioner, caches).
        step: number of steps taken so far.
        eta: the base step size, resolved from ``eta`` or ``lr`` at ``init``.
        energy: ``(K,)`` energy from the last target evaluation (``None`` before the first).
        grad: ``(K, D)`` gradient from the last target evaluation, where a sampler records it
            (NNSGHMC does, for meta-training losses); it belongs to the position the step
            started from.
    """

    theta: Tensor
    momentum: Tensor | None = None
    extras: dict[str, Tensor] = field(default_factory=dict)
    step: int = 0
    eta: float = 0.0
    energy: Tensor | None = None
    grad: Tensor | None = None

    def detach(self) -> SamplerState:
        """A copy cut from the autograd graph (truncated backprop between windows)."""

        def cut(x: Tensor | None) -> Tensor | None:
            return None if x is None else x.detach()

        return replace(
            self,
            theta=self.theta.detach(),
            momentum=cut(self.momentum),
            extras={k: v.detach() for k, v in self.extras.items()},
            energy=cut(self.energy),
            grad=cut(self.grad),
        )


#: Hints of :func:`check_finite` by cause; the default fits a chain that diverged.
STEP_TOO_LARGE = "the step size is probably too large for this target"
BAD_START = (
    "the target is not finite at the start positions: check the data, the model and init "
    "(the step size has not acted yet)"
)


def check_finite(step: int, hint: str = STEP_TOO_LARGE, **tensors: Tensor) -> None:
    """Raise :class:`NonFiniteError` naming the first chain and quantity that is not finite.

    Every tensor's first dimension indexes chains. ``hint`` is the likely cause, appended to
    the message (default: :data:`STEP_TOO_LARGE`).
    """
    for name, value in tensors.items():
        value = value.detach()
        # One reduction first (a sum is finite only if every entry is): the per-chain search
        # below runs only when it is not, or when finite entries overflow the sum.
        if bool(torch.isfinite(value.sum())):
            continue
        flags = torch.isfinite(value)
        if value.ndim > 1:
            flags = flags.flatten(1).all(dim=1)
        if not bool(flags.all()):
            chain = int((~flags).nonzero()[0, 0])
            raise NonFiniteError(
                f"non-finite {name} in chain {chain} at step {step} "
                f"({int((~flags).sum())} of {flags.numel()} chains affected); {hint}",
                step=step,
                chain=chain,
                quantity=name,
            )


def check_step_scalars(step: int, eta: float, temperature: float, dtype: torch.dtype) -> None:
    """Raise :class:`NonFiniteError` if the step's ``eta`` or ``2 eta T`` (hence ``eta T``) is
    not a finite number of the chains' ``dtype`` (samplers multiply tensors by them: an
    overflow would otherwise surface as torch's "cannot be converted ... without overflow")."""
    largest = torch.finfo(dtype).max
    for name, value in (("step size eta", eta), ("2 * eta * temperature", 2.0 * eta * temperature)):
        if not (math.isfinite(value) and abs(value) <= largest):
            raise NonFiniteError(
                f"non-finite {name} = {value!r} at step {step} for all chains ({dtype} holds "
                f"at most {largest:.3g}); the step size or the temperature is too large",
                step=step,
                chain=None,
                quantity=name,
            )


class Sampler:
    """Base class: step-size resolution, schedule, temperature and the step protocol.

    Args:
        eta: discretisation step of the SDE. Give this or ``lr``.
        lr: optimiser-style per-batch learning rate, converted with
            :func:`metasampler.stepsize.eta_from_lr` using the target's ``n_data``.
        temperature: ``T`` in ``pi ∝ exp(-U / T)``.
        schedule: a step-size schedule (default constant).
    """

    #: "first" (Langevin-type) or "second" (momentum-type) — decides the ``lr`` conversion.
    order: ClassVar[Order] = "second"
    #: Whether the momentum's stationary law is ``N(0, T I)`` where the chains sample ``T``:
    #: then its mean square per coordinate over ``T`` (the kinetic temperature) is 1 there,
    #: and above 1 where unaccounted gradient noise heats the chains.
    unit_gaussian_momentum: ClassVar[bool] = False
    #: Whether a thermostat holds the momenta's kinetic temperature at ``T``: then it shows
    #: neither the heat of gradient noise nor an unstable step.
    thermostatted: ClassVar[bool] = False

    def __init__(
        self,
        *,
        eta: float | None = None,
        lr: float | None = None,
        temperature: float = 1.0,
        schedule: Schedule | None = None,
    ) -> None:
        check_step_args(eta, lr)
        if isinstance(temperature, bool) or not isinstance(temperature, Real):
            raise ValueError(f"temperature must be a number, got {temperature!r}")
        if not (temperature >= 0 and math.isfinite(temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        self.eta = eta
        self.lr = lr
        self.temperature = float(temperature)
        self.schedule: Schedule = schedule if schedule is not None else Constant()

    # -- protocol -------------------------------------------------------------------------
    def init(
        self, theta: Tensor, target: Target, generator: torch.Generator | None = None
    ) -> SamplerState:
        """Create the state of ``K`` chains started at ``theta`` of shape ``(K, D)``."""
        check_positions(theta, target.dim)
        check_finite(0, "the start positions (init) are not finite", **{"start position": theta})
        eta = resolve_eta(self.eta, self.lr, target.n_data, self.order)
        state = SamplerState(theta=theta, eta=eta)
        return self._init_extras(state, target, generator)

    def step(
        self, state: SamplerState, target: Target, generator: torch.Generator | None = None
    ) -> SamplerState:
        """Advance every chain by one step; returns a new state."""
        k = state.step + 1
        scale, explore = self.schedule(k)
        temperature = 0.0 if explore else self.temperature
        eta = state.eta * scale
        check_step_scalars(k, eta, temperature, state.theta.dtype)
        try:
            new_state = self._step(state, target, eta, temperature, generator)
        except RuntimeError as err:
            # A product of step scalars a subclass forms (e.g. eta * T / s) overflowing.
            if isinstance(err, NonFiniteError) or "without overflow" not in str(err):
                raise
            raise NonFiniteError(
                f"a step scalar overflows {state.theta.dtype} at step {k} for all chains "
                f"(eta = {eta!r}, temperature = {temperature!r}); the step size or the "
                "temperature is too large",
                step=k,
                quantity="step scalar",
            ) from None
        new_state.step = k
        return new_state

    def end_warmup(self, state: SamplerState) -> SamplerState:
        """The state with what the sampler adapted during the warm-up fixed from now on, so
        that the kept samples come from one time-homogeneous kernel (:func:`~metasampler.sample`
        calls it after ``burn_in`` steps). The base class adapts nothing: ``state`` as is."""
        return state

    def restart_warmup(self, state: SamplerState) -> SamplerState:
        """The state at a restart of the warm-up (:func:`~metasampler.sample` calls it at the
        warm-up's restart steps, :func:`warmup_restarts`): what the
        sampler accumulates from the chains' start and forgets only slowly, set back to its
        initial value. The burn-in's samples are discarded, so a restart changes no kept
        sample's kernel. The base class accumulates nothing: ``state`` as is."""
        return state

    def collects(self, k: int) -> bool:
        """Whether the sample after step ``k`` (1-based) belongs to a sampling stage."""
        return not self.schedule(k).explore

    # -- helpers for subclasses -----------------------------------------------------------
    def evaluate(
        self,
        target: Target,
        theta: Tensor,
        step: int,
        generator: torch.Generator | None,
        create_graph: bool = False,
        estimate_noise: bool = False,
    ) -> Evaluation:
        """Evaluate the target and stop with a clear message on a non-finite result;
        ``estimate_noise``: also its gradient noise's variance (targets with
        ``estimates_grad_noise``, e.g. :class:`~metasampler.BayesianModel`)."""
        if not estimate_noise:
            ev = target.evaluate(theta, generator, create_graph=create_graph)
        elif getattr(target, "estimates_grad_noise", False):
            ev = target.evaluate(theta, generator, create_graph=create_graph, estimate_noise=True)
        else:
            raise ValueError(
                f"{type(target).__name__} cannot estimate its gradient noise "
                "(grad_noise_estimate needs a target with estimates_grad_noise, e.g. "
                "metasampler.BayesianModel); where the variance is known, pass grad_noise_var"
            )
        # At the first step the positions are the (finite) start: the step size is not the cause.
        hint = BAD_START if step <= 1 else STEP_TOO_LARGE
        check_finite(step, hint, energy=ev.energy, gradient=ev.grad)
        return ev

    def _init_extras(
        self, state: SamplerState, target: Target, generator: torch.Generator | None
    ) -> SamplerState:
        return state

    def _step(
        self,
        state: SamplerState,
        target: Target,
        eta: float,
        temperature: float,
        generator: torch.Generator | None,
    ) -> SamplerState:
        raise NotImplementedError

    def __repr__(self) -> str:
        step = f"eta={self.eta}" if self.eta is not None else f"lr={self.lr}"
        return f"{type(self).__name__}({step}, temperature={self.temperature})"


#: The first warm-up restart's step; later ones double it.
FIRST_RESTART = 50


def warmup_restarts(burn_in: int) -> list[int]:
    """The warm-up's restart steps, counted from its start: 50, 100, 200, ... up to half the
    warm-up (:meth:`Sampler.restart_warmup`). Doubling windows, as Stan's warm-up: the
    chains' transient is forgotten early, and the last window, at least as long as all before
    it, settles the state the kept run starts from."""
    restarts, step = [], FIRST_RESTART
    while 2 * step <= burn_in:
        restarts.append(step)
        step *= 2
    return restarts
