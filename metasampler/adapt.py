"""Step-size (and friction) adaptation during the burn-in: ``ms.sample(..., adapt=True)``.

The step passed to a sampler's constructor is only where the search starts. During the
burn-in, rounds of trial groups run side by side, step by step, each group at a different
step; a criterion ranks them and the search narrows on a log grid:

1. **Bracket** (an eighth of the burn-in): nine groups at ``start * 4**j``, ``j = -4 ... 4``
   (``Adapt.span = 256``), so that a start 100x too large or too small still has the right
   step inside. While the best group sits at an end of the bracket, or every group diverged,
   the bracket moves there and runs again, at most twice.
2. **Step** (a quarter of what is left): three groups at ``best / 2``, ``best``, ``2 best``.
3. **Friction** (a fifth; samplers with a ``friction``, SGHMC's ``C``, or a ``diffusion``,
   SGNHT's ``A``): three groups at the chosen step with 1/2, 1 and 2 times the friction, that
   is the friction per step ``eta C``. The sampler's friction stays unless another scores
   better by more than two standard errors (a friction is seldom far off), and a lower one
   is taken only where its momenta run no hotter: a trial sees at once the mixing a lower
   friction buys, but the heat the gradient's noise then brings reaches the positions' slow
   directions only over the kept run, while the momenta show it within ``1 / (eta C)``
   steps (their kinetic temperature, below). The friction is chosen at round 2's step, not
   the bracket's coarser one: a step too large would pull the friction up, and the step
   with it. Where the choice is an end of the round, alone (no other group within noise of
   it), the optimum may lie beyond: the next round tries that end and 2 and 4 times further
   out (a further one 4 and 16 times, ...), keeping the end unless another is clearly
   better (**Moves**, below). NNSGHMC's friction is its nets', as trained: a round over its
   level cannot tell half from twice it in a network's burn-in, and where the whole run is
   a transient it prefers a damping the kept run loses by.
4. **Step again** (3/10): three groups at ``best / f``, ``best``, ``best * f`` with
   ``f = sqrt(2)`` (2 where round 2's best was at its end or the friction moved); where
   round 2 chose an end alone, the groups go outward from it instead (``best * f**j``,
   ``j = 0, 1, 2``, or the same below), and the choice's ties reach only the best's next
   neighbours (a flat stretch of scores does not carry it away from the step round 2
   preferred). While the choice is the far end, alone, rounds move on further out in the
   same way, each with twice the factor of the one before.
5. **Settle** (the rest, at least an eighth of the burn-in): every chain at the chosen step
   and friction.

**Moves.** A search that starts far off (a step 100x too small, a cold start far from the
posterior, a friction ten times too low) spends its first rounds in the chains' transient,
where the largest stable step looks best; the rounds after it then find the optimum below
the end of their values. Rounds that move on from an end fetch it: each half the length of
the round it continues and reaching twice as far as the one before (an expanding search, as
a line search brackets its minimum), at most three per parameter, as long as the budget
(**Cost**) and the settle phase's eighth of the burn-in leave room for them.

Where the rounds' shares of the burn-in would cost more than ``Adapt.extra_cost`` (0.6) of a
plain run's chain-steps (short runs with a long burn-in and few chains), the bracket's groups
run four chains instead of eight and, where that is not enough, every round is shortened by
the same factor and the settle phase takes the rest (**Cost**, below).

The kept samples are then drawn with that fixed kernel: the step and the friction never change
again; a sampler's own warm-up statistics are fixed by its ``end_warmup`` as in a plain run,
and what it restarts in a plain warm-up (NNSGHMC's thermostat) restarts at the same steps here
(:func:`~metasampler.samplers.base.warmup_restarts`), in every group and chain: from a cold
start the first rounds' transient fills the thermostat, and without the restarts it would
overdamp the kept run. A sampler with a schedule (cSGHMC's cyclical one, a decay) is searched
with constant steps, and its base step is set so that the schedule's mean multiplier over the
kept run's sampling steps times it is the chosen constant step
(``AdaptResult.schedule_scale``), but no larger than the schedule's peak takes beyond the
largest step of the last round that scored as well as the best (a cycle's first steps run at
the full base step, and a step that merely did not diverge in a short trial can still heat the
chains over a run); the schedule then runs as it would.

**Groups.** Every group of a round runs a copy of the same trial chains (``max(8, K / G)`` of
the ``K`` chains, drawn afresh each round) with the same random numbers (noise and
minibatches): the groups differ only by their step, so their scores' difference is measured
far better than either score (common random numbers). A round's choice is the geometric mean
of its best group and the neighbours whose score is within noise of the best (``sqrt(2)``
jackknife standard errors of the paired difference, over blocks of chains), so that choosing
between steps the criterion cannot tell apart does not drift with its noise. After the round
the trial chains continue from their copies in the best group (after a bracket round, from
where they were: a step 16 times too large can leave them damaged without diverging, hotter
in slow directions than any later round cools, and the bracket only locates the scale); the
other chains meanwhile run at the best step so far (they wait during the first bracket), so
every chain keeps its own trajectory and the kept chains stay independent (R-hat and ESS
mean what they say). A group
that diverges (a :class:`~metasampler.NonFiniteError`, or positions that are not finite) is
dropped at once; where a whole round diverges, its trial chains restart from their start
positions. Only when every step tried, down to ``span**3`` below the start, diverges is it an
error.

**Momenta.** Where a sampler's momentum has the stationary law ``N(0, T I)`` (SGHMC and its
cyclical form, (m)SGNHT: ``Sampler.unit_gaussian_momentum``), each round's trial chains and,
after the last round, every chain start with momenta drawn afresh from that law. This is a
Gibbs step on the momenta (it leaves the joint target invariant); without it, the energy a
trial at a large step put into the momenta would outlast the burn-in at a low friction. For
these samplers, unless a thermostat holds their momenta at ``T`` (SGNHT:
``Sampler.thermostatted``, whose momenta show neither heat nor an unstable step), every group
also measures the heat of its momenta: with ``t_i`` the kinetic
temperature of coordinate ``i`` (its momentum's mean square over ``T``, 1 at the target),
``sum_i (t_i - 1)^2 / 4``, the KL of a Gaussian sampled at ``t_i`` times its variance, to
second order (``Trial.heat``; each square less its estimate's variance).

**Criteria.** A round's groups are compared on the last three quarters of the round (the
first quarter lets chains that changed step settle), on the steps the schedule collects.

* ``"stein"`` (default; from the chains alone, any target): the Stein estimate of the KL
  divergence of the chains' Gaussian fit from the target (:func:`stein_kl`). Integrating by
  parts, every density ``exp(-U / T)`` has ``E[(x - c) grad U^T] = T I`` for any constant
  ``c`` (the generalised equipartition theorem, of which the configurational temperature of
  :mod:`metasampler.benchmark.temperature` is the trace) and ``E[grad U] = 0``. With
  ``M = Cov(x, g) / T`` from the positions and the (stochastic) gradients ``g`` the sampler
  evaluated there, ``tr((M - I)^2) / 4 + gbar^T Cov(x) gbar / (2 T^2)`` is, for a Gaussian
  target, the KL to second order (a step too hot shows as ``M > I`` along the directions it
  overheats; chains short of the posterior as ``M < I`` or ``gbar != 0``), and for any target
  a Stein discrepancy with linear test functions: invariant under rescaling coordinates,
  unbiased under gradient noise independent of the position, ``O(K D^2)`` per step (its
  diagonal above :data:`FULL_STEIN_MAX_DIM` coordinates, ``O(K D)``), no kernel bandwidth.
  A group's score is projected to the kept run: the estimate's sampling part (what halves of
  the chains add, and the fraction of it that halves of the window show longer runs remove)
  is scaled to ``K`` chains and the kept run's length; the rest (the bias) is kept. So the
  step chosen is the one best for the whole run, not for a run as short as the trial (which
  would favour larger steps). The momenta's heat, where measured, is added to it (the kept
  run's positions reach it). Choosing SG-MCMC hyper-parameters by a Stein discrepancy with
  successive halving is MAMBA's (Coullon, South & Nemeth, 2021, "Efficient and generalizable
  tuning strategies for stochastic gradient MCMC"); Stein discrepancies measure sample
  quality after Gorham & Mackey (2015, "Measuring sample quality with Stein's method").
* ``"validation"`` (``Adapt(validation=(x, y))``, a :class:`~metasampler.BayesianModel`):
  the negative log posterior-predictive probability of held-out data under the average of the
  group's samples (as the benchmark's grid tuning scores a step), on at most
  ``Adapt.max_validation`` held-out examples, at four points of each round's window.

The burn-in sees only what its length shows: on a badly conditioned target a kept run much
longer than the burn-in mixes slow directions that no trial can, and the choice is as good as
the trial's noise allows (``speed/bench_adapt.py`` measures it against a grid). Nor does a
short window from chains that all start at one point far from the posterior (a network's
weights near zero) tell a step that descends from one that stays: chains that do not move
score about ``D / 4`` by the Stein criterion, and any that move score worse while they
descend, so the search ends at a step that does not move them. On networks, adapt by
held-out data, or start the chains from the module's initialisation.

**Cost.** Each group is its own call of the sampler's step, on ``max(8, K / G)`` chains, plus
one call for the other chains. Where the gradient's arithmetic dominates (networks), a step's
cost is its chains' count: a round of ``G`` groups adds ``(G - 1)`` times its trial chains to
each of its steps, and the rounds are kept within ``Adapt.extra_cost`` (0.6) of the whole
run's chain-steps. On the benchmark's MNIST network (8 chains, burn-in 150 of 400 steps,
where every group runs all eight chains) the adapted run takes 1.6 to 1.7 times a plain run
of the kernel it chose (``speed/bench_adapt_cost.py``); a tighter budget shortens the rounds
and makes the choice noisier. On targets
so small that a step costs its fixed overhead, a round costs about ``G + 1`` steps whatever
its chains: on the paper's 20-D toy Gaussian (50 chains, burn-in 2,000 of 12,000 steps) the
adapted run takes 1.3 to 1.6 times a plain run (``speed/bench_adapt.py``). Fewer chains per
group would cost less but rank the steps less reliably.

**Few chains.** With fewer than eight chains every group runs all of them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from numbers import Real
from typing import Any

import torch
from torch import Tensor

from .integrators import gaussian_like
from .samplers.base import Sampler, SamplerState, check_finite, warmup_restarts
from .samplers.hmc import HMC
from .schedules import Constant
from .targets import NonFiniteError, Target

__all__ = ["Adapt", "AdaptResult", "Trial", "FRICTION_ATTRIBUTES", "MIN_BURN_IN"]

#: Sampler attributes adapted as the friction, the first a sampler has as a number > 0
#: (SGHMC's ``friction`` ``C``, (m)SGNHT's ``diffusion`` ``A``, the value its thermostat
#: settles on without gradient noise).
FRICTION_ATTRIBUTES = ("friction", "diffusion")

#: After the bracket, a trial group of a sampler whose momenta measure their temperature is
#: chosen only where their mean kinetic temperature is at most this further from 1 than the
#: closest group's of its round (the benchmark's tolerance for "samples at the posterior's
#: temperature"): a step that will not hold over the kept run shows first in the momenta, far
#: hotter than ``T`` in a few coordinates, well before the positions or the criterion show it.
KINETIC_TOLERANCE = 0.1

#: The shortest burn-in ``adapt`` runs in (its bracket round is an eighth of it).
MIN_BURN_IN = 100

_BRACKET_RATIO = 4.0
_MAX_BRACKET_MOVES = 2
_MIN_TRIAL_CHAINS = 8
_MIN_BRACKET_CHAINS = 4
_VALIDATION_POINTS = 4
_MAX_MOVES = 3  # rounds beyond the friction round and the last step round, each


@dataclass(frozen=True)
class Adapt:
    """How :func:`metasampler.sample` adapts the step during the burn-in (``adapt=True`` is
    ``Adapt()``).

    Args:
        validation: held-out ``(x, y)`` of a :class:`~metasampler.BayesianModel`: rank steps
            by the negative log posterior-predictive probability of ``y`` (predictive NLL).
            ``None``: rank them by the chains alone (the Stein estimate of the KL of the
            chains' Gaussian fit, :func:`stein_kl`; see :mod:`metasampler.adapt`).
        friction: also choose the friction of samplers that have one (SGHMC's ``friction``,
            SGNHT's ``diffusion``): a round at the chosen step with 1/2, 1 and 2 times it, and
            rounds further out while an end of the last one is clearly best.
        span: the first round tries steps from ``start / span`` to ``start * span``
            (factor 4 apart; at least 16).
        max_validation: score on at most this many held-out examples (a fixed random subset).
        extra_cost: the trial rounds' work beyond a plain run, at most this fraction of a plain
            run's chain-steps (burn-in and kept steps): where the rounds' shares of the
            burn-in would cost more, the bracket runs fewer chains and the rounds are
            shortened (the settle phase takes the rest). A larger value buys longer trials
            (a less noisy choice) on short runs; a smaller one a cheaper, noisier choice.

    Raises:
        ValueError: a bad value (the message names it).
    """

    validation: tuple[Tensor, Tensor] | None = None
    friction: bool = True
    span: float = 256.0
    max_validation: int = 1000
    extra_cost: float = 0.6

    def __post_init__(self) -> None:
        if self.validation is not None:
            ok = (
                isinstance(self.validation, (tuple, list))
                and len(self.validation) == 2
                and all(isinstance(v, Tensor) for v in self.validation)
            )
            if not ok:
                raise ValueError("Adapt(validation=...) must be a pair (x, y) of tensors")
            x, y = self.validation
            if x.ndim == 0 or y.ndim == 0 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
                raise ValueError(
                    "Adapt(validation=(x, y)) needs x and y with the same first dimension > 0, "
                    f"got shapes {tuple(x.shape)} and {tuple(y.shape)}"
                )
        if not isinstance(self.friction, bool):
            raise ValueError(f"Adapt(friction=...) must be True or False, got {self.friction!r}")
        if isinstance(self.span, bool) or not isinstance(self.span, Real):
            raise ValueError(f"Adapt(span=...) must be a number >= 16, got {self.span!r}")
        if not (16 <= self.span < math.inf):
            raise ValueError(f"Adapt(span=...) must be a finite number >= 16, got {self.span!r}")
        if isinstance(self.max_validation, bool) or not isinstance(self.max_validation, int):
            raise ValueError(
                f"Adapt(max_validation=...) must be an integer >= 1, got {self.max_validation!r}"
            )
        if self.max_validation < 1:
            raise ValueError(
                f"Adapt(max_validation=...) must be an integer >= 1, got {self.max_validation!r}"
            )
        cost = self.extra_cost
        if isinstance(cost, bool) or not isinstance(cost, Real) or not 0 < cost < math.inf:
            raise ValueError(f"Adapt(extra_cost=...) must be a number > 0, got {cost!r}")

    @property
    def criterion(self) -> str:
        """``"validation"`` with held-out data, else ``"stein"``."""
        return "stein" if self.validation is None else "validation"


@dataclass(frozen=True)
class Trial:
    """One group of one round of the search.

    Attributes:
        round: 0-based round index.
        kind: ``"bracket"``, ``"step"`` or ``"friction"``.
        eta: the group's step.
        friction: the group's friction (``None`` for samplers without one).
        score: the criterion's value (lower is better); ``inf`` for a diverged group.
        se: its standard error (jackknife over blocks of chains; 0 with one chain).
        chains: the number of trial chains the group ran (every group of a round the same).
        error: why the group diverged (the :class:`~metasampler.NonFiniteError` message), or
            ``None``.
        heat: for a sampler whose momentum's stationary law is ``N(0, T I)``, the KL its
            momenta's heat brings (:class:`_HeatStats`; 0 at the target), else ``None``.
        kinetic_temperature: for such a sampler, its momenta's mean square over ``T``, over
            every coordinate and trial chain of the round's window (1 at the target), else
            ``None``.
    """

    round: int
    kind: str
    eta: float
    friction: float | None
    score: float
    se: float
    chains: int
    error: str | None = None
    heat: float | None = None
    kinetic_temperature: float | None = None


@dataclass
class AdaptResult:
    """What the burn-in chose (``SampleResult.adapted``).

    Attributes:
        eta: the chosen step; every kept sample was drawn with it.
        friction: the chosen friction (``None`` when the sampler has none or it was not
            adapted).
        friction_name: the sampler attribute that holds it (``"friction"``, ``"diffusion"``).
        criterion: ``"stein"`` or ``"validation"`` (see :mod:`metasampler.adapt`).
        start_eta: the step the search started from (the sampler's).
        start_friction: the sampler's friction.
        trials: every group of every round, in order (see :class:`Trial`).
        sampler: a copy of the sampler with ``eta`` (and the friction) set to the choice:
            the kernel of the kept samples, to run more of them.
        state: the chains at the end of the burn-in, where the kept run started.
        generator_state: the generator's state at that point (``torch.Generator.set_state``).
        settle_steps: burn-in steps all chains ran at the chosen kernel before the first kept
            sample.
        schedule_scale: for a sampler with a schedule, its mean multiplier over the kept
            run's sampling steps: the search tried constant steps (``Trial.eta``) and ``eta``
            is the chosen one divided by it, so that the schedule's mean step is the chosen
            one (at most the largest step of the last round that scored as well as the
            best, over the schedule's peak multiplier); 1 for a constant step.
    """

    eta: float
    friction: float | None
    friction_name: str | None
    criterion: str
    start_eta: float
    start_friction: float | None
    trials: list[Trial]
    sampler: Sampler
    state: SamplerState
    generator_state: Tensor
    settle_steps: int
    schedule_scale: float = 1.0

    @property
    def friction_per_step(self) -> float | None:
        """``eta * friction``: the fraction of the momentum the friction removes per step."""
        return None if self.friction is None else self.eta * self.friction

    def round_scores(self, round: int) -> list[tuple[float, float | None, float]]:
        """``[(eta, friction, score)]`` of one round's groups."""
        return [(t.eta, t.friction, t.score) for t in self.trials if t.round == round]

    def __str__(self) -> str:
        lines = [
            f"adapted eta={self.eta:.4g}"
            + ("" if self.friction is None else f", {self.friction_name}={self.friction:.4g}")
            + f" (start eta={self.start_eta:.4g}; criterion {self.criterion})"
        ]
        for t in self.trials:
            friction = "" if t.friction is None else f" {self.friction_name}={t.friction:.4g}"
            status = f"score {t.score:.4g} +- {t.se:.2g}" if t.error is None else "diverged"
            lines.append(f"  round {t.round} {t.kind:8s} eta={t.eta:.4g}{friction}: {status}")
        return "\n".join(lines)


def check_adapt(
    adapt: object, sampler: Sampler, target: Target, burn_in: int, n_chains: int
) -> Adapt | None:
    """``adapt`` as an :class:`Adapt` (``None`` when off), checked against the run; its
    held-out data checked as the model's own data are (:meth:`BayesianModel.check_data`).

    Raises:
        ValueError: ``adapt`` is not a bool or an :class:`Adapt`; the burn-in is shorter than
            :data:`MIN_BURN_IN`; the sampler runs at temperature 0 or adapts its own step
            (HMC); the chains-alone criterion with one chain; held-out data for a target that
            cannot score it, or that the model could not have been given as data.
    """
    if adapt is False or adapt is None:
        return None
    if adapt is True:
        adapt = Adapt()
    if not isinstance(adapt, Adapt):
        raise ValueError(f"adapt must be True, False or a metasampler.Adapt, got {adapt!r}")
    if burn_in < MIN_BURN_IN:
        raise ValueError(
            f"adapt needs burn_in >= {MIN_BURN_IN} steps to try steps in (got {burn_in}); "
            "the search runs during the burn-in"
        )
    if getattr(sampler, "temperature", 1.0) <= 0:
        raise ValueError(
            f"adapt needs a sampler at temperature > 0; {type(sampler).__name__} runs at "
            f"temperature {sampler.temperature} (an optimiser, not a sampler)"
        )
    if isinstance(sampler, HMC):
        raise ValueError(
            "adapt is for SG-MCMC samplers; HMC adapts its own step (its target_accept)"
        )
    if adapt.validation is None:
        if n_chains < 2:
            raise ValueError(
                "adapt=True ranks steps by the spread of several chains and needs n_chains >= 2 "
                "(got 1); run more chains, or rank by held-out data "
                "(adapt=metasampler.Adapt(validation=(x, y)))"
            )
        return adapt
    if not callable(getattr(target, "log_likelihood", None)):
        raise ValueError(
            "Adapt(validation=(x, y)) needs a target with log_likelihood(theta, x, y) (a "
            f"metasampler.BayesianModel), got {type(target).__name__}; use adapt=True to rank "
            "steps by the chains alone"
        )
    check_data = getattr(target, "check_data", None)
    if callable(check_data):  # as the model's own data: a mistake fails here, not mid-run
        adapt = replace(adapt, validation=check_data(*adapt.validation, name="Adapt(validation)"))
    return adapt


# -- state slicing ---------------------------------------------------------------------------
def _chain_keys(state: SamplerState) -> set[str]:
    """The extras that hold one row per chain."""
    k = state.theta.shape[0]
    return {
        name for name, v in state.extras.items() if isinstance(v, Tensor) and v.ndim and len(v) == k
    }


def _rows(x: Tensor | None, idx: Tensor) -> Tensor | None:
    return None if x is None else x[idx]


def _take(state: SamplerState, idx: Tensor, keys: set[str]) -> SamplerState:
    """The chains ``idx`` of ``state``."""
    extras = {n: (v[idx] if n in keys else v) for n, v in state.extras.items()}
    return replace(
        state,
        theta=state.theta[idx],
        momentum=_rows(state.momentum, idx),
        extras=extras,
        energy=_rows(state.energy, idx),
        grad=_rows(state.grad, idx),
    )


def _assemble(parts: Sequence[tuple[SamplerState, Tensor]], n_chains: int) -> SamplerState:
    """An ``n_chains``-chain state from ``(state, chains)`` parts: row ``j`` of ``state``
    becomes chain ``chains[j]``; the first part gives the rest (step, step size, shared
    extras). Per-chain fields that a part lacks (a running statistic its chains have not
    started, e.g. chains that waited while the others tried steps) take the first part's
    rows, cycled: its chains' statistics stand in until the part's own take over."""
    first = parts[0][0]
    per_chain = [_chain_keys(state) for state, _ in parts]
    keys = set().union(*per_chain)

    def gather(get: Callable[[SamplerState], Tensor | None]) -> Tensor | None:
        donor = next((get(state) for state, _ in parts if get(state) is not None), None)
        if donor is None:
            return None
        out = donor.new_empty((n_chains, *donor.shape[1:]))
        for state, chains in parts:
            value = get(state)
            if value is None or value.shape[1:] != donor.shape[1:]:
                value = donor[torch.arange(len(chains)) % len(donor)]
            out[chains] = value
        return out

    extras = {n: v for n, v in first.extras.items() if n not in keys}
    for name in keys:
        extras[name] = gather(lambda s, n=name: s.extras.get(n) if n in _chain_keys(s) else None)
    return replace(
        first,
        theta=gather(lambda s: s.theta),
        momentum=gather(lambda s: s.momentum),
        extras=extras,
        energy=gather(lambda s: s.energy),
        grad=gather(lambda s: s.grad),
    )


# -- recording the (position, gradient) pairs of each evaluation ------------------------------
class _Recorder:
    """Wraps a target's ``evaluate``, keeping the positions and gradient of its last call."""

    def __init__(self, evaluate: Callable[..., Any]) -> None:
        self.evaluate = evaluate
        self.last: tuple[Tensor, Tensor] | None = None

    def __call__(self, theta: Tensor, *args: Any, **kwargs: Any) -> Any:
        ev = self.evaluate(theta, *args, **kwargs)
        self.last = (theta.detach(), ev.grad.detach())
        return ev


class _Forward:
    """A target stand-in for targets whose ``evaluate`` cannot be replaced on a copy."""

    def __init__(self, target: Target, recorder: _Recorder) -> None:
        self._target = target
        self.evaluate = recorder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def _recording(target: Target) -> tuple[Target, _Recorder]:
    """A copy of ``target`` (same class, so samplers treat it alike) whose evaluations are
    recorded."""
    recorder = _Recorder(target.evaluate)
    try:
        proxy = copy.copy(target)
        proxy.evaluate = recorder
        return proxy, recorder
    except (AttributeError, TypeError):  # slots, frozen, uncopyable
        return _Forward(target, recorder), recorder  # type: ignore[return-value]


# -- criteria --------------------------------------------------------------------------------
#: Chains are scored in up to this many blocks (the jackknife's leave-one-out unit).
_BLOCKS = 8
#: The Stein sums take this many steps at a time (positions and gradients held meanwhile).
_BATCH = 16
#: Up to this dimension the Stein score uses every pair of coordinates, beyond it their
#: diagonal.
FULL_STEIN_MAX_DIM = 100


def _jackknife_se(leave_out: Sequence[float]) -> float:
    """The jackknife standard error from the leave-one-block-out values."""
    j = len(leave_out)
    if j < 2 or not all(math.isfinite(v) for v in leave_out):
        return 0.0
    mean = sum(leave_out) / j
    return math.sqrt((j - 1) / j * sum((v - mean) ** 2 for v in leave_out))


class _SteinStats:
    """Sums over a group's scored chains for the Stein score, per half of the window (in
    time) and per block of chains: ``sum x``, ``sum g``, ``sum x x^T`` and ``sum x g^T``
    (their diagonals above :data:`FULL_STEIN_MAX_DIM`), each ``(2, blocks, ...)``.

    Args:
        n_blocks, per_block: the scored chains, ``n_blocks * per_block`` of them.
        temperature: the sampler's.
        n_chains: ``K``, the chains of the kept run.
        window: the steps the window will count (the first half go to the first sums).
        kept_steps: the steps of the kept run.
    """

    def __init__(
        self,
        n_blocks: int,
        per_block: int,
        temperature: float,
        n_chains: int,
        window: int,
        kept_steps: int,
    ) -> None:
        self.n_blocks, self.per_block = n_blocks, per_block
        self.temperature = temperature
        self.n_chains, self.window, self.kept_steps = n_chains, window, kept_steps
        self.steps = [0, 0]  # per half
        self.sums: list[Tensor] | None = None
        self.pending: list[tuple[Tensor, Tensor]] = []  # steps not yet in the sums

    def update(self, x: Tensor, g: Tensor) -> None:
        """Add one step of the scored chains (the first ``n_blocks * per_block`` rows); the
        sums take the steps in batches (one product per batch, not per step)."""
        rows = self.n_blocks * self.per_block
        half = 0 if sum(self.steps) < self.window // 2 else 1
        if self.pending and half != self._half:
            self.flush()
        self._half = half
        self.pending.append((x[:rows], g[:rows]))
        self.steps[half] += 1
        if len(self.pending) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        """Add the pending steps to the sums of their half of the window."""
        if not self.pending:
            return
        n_b, per = self.n_blocks, self.per_block
        x = torch.stack([p[0] for p in self.pending]).double()  # (steps, rows, D)
        g = torch.stack([p[1] for p in self.pending]).double()
        self.pending = []
        x = x.reshape(-1, n_b, per, x.shape[-1]).transpose(0, 1).reshape(n_b, -1, x.shape[-1])
        g = g.reshape(-1, n_b, per, g.shape[-1]).transpose(0, 1).reshape(n_b, -1, g.shape[-1])
        d = x.shape[-1]
        if d <= FULL_STEIN_MAX_DIM:  # x^T x and x^T g in one product
            xx_xg = x.transpose(1, 2) @ torch.cat((x, g), dim=-1)
            xx, xg = xx_xg[..., :d], xx_xg[..., d:]
        else:
            xx, xg = (x * x).sum(1), (x * g).sum(1)
        terms = (x.sum(1), g.sum(1), xx, xg)
        if self.sums is None:
            self.sums = [torch.zeros((2, *t.shape), dtype=t.dtype, device=t.device) for t in terms]
        for s, t in zip(self.sums, terms, strict=True):
            s[self._half].add_(t)

    def score(self) -> tuple[float, list[float]]:
        """The score (:meth:`projected`) of all scored chains and its values leaving out
        each block in turn (the jackknife's)."""
        self.flush()
        if self.sums is None:
            return math.inf, []
        blocks = list(range(self.n_blocks))
        value = self.projected(blocks)
        leave_out = [self.projected(blocks[:j] + blocks[j + 1 :]) for j in blocks]
        return (value if math.isfinite(value) else math.inf), leave_out

    def projected(self, blocks: list[int]) -> float:
        """The Stein KL of the chains of ``blocks``, projected to the kept run.

        Its expectation is a bias (what more samples would not change) plus the estimate's
        own sampling part, which halves with twice the chains (chains are independent): the
        mean over the two halves of the blocks, less the value, estimates it. Twice the time
        halves it only where the chains decorrelate within the window: the fraction ``r``
        that the two halves of the window show (0 for chains that barely move, so that a
        step too small to mix is not excused). The projection keeps the bias (at least 0)
        and scales the sampling part to ``K`` chains and, for its fraction ``r``, to the
        kept run's length."""
        value = self.kl(blocks, (0, 1))
        if len(blocks) < 2 or not math.isfinite(value):
            return value
        by_chains = (self.kl(blocks[0::2], (0, 1)) + self.kl(blocks[1::2], (0, 1))) / 2.0
        sampling = max(by_chains - value, 0.0)
        r = 0.0
        if sampling > 0 and min(self.steps) > 0:
            by_time = (self.kl(blocks, (0,)) + self.kl(blocks, (1,))) / 2.0
            r = min(max(by_time - value, 0.0) / sampling, 1.0)
        chains = len(blocks) * self.per_block / self.n_chains
        time = sum(self.steps) / max(self.kept_steps, sum(self.steps))
        return max(value - sampling, 0.0) + sampling * chains * (1.0 - r + r * time)

    def kl(self, blocks: list[int], halves: tuple[int, ...]) -> float:
        """:func:`stein_kl` of the chains of ``blocks`` over the window's ``halves``."""
        assert self.sums is not None
        index = torch.tensor(blocks, dtype=torch.long)
        sums = [s[list(halves)][:, index].sum((0, 1)) for s in self.sums]
        n = sum(self.steps[h] for h in halves) * len(blocks) * self.per_block
        return stein_kl(*sums, n, self.temperature) if n else math.nan


def stein_kl(
    sum_x: Tensor, sum_g: Tensor, sum_xx: Tensor, sum_xg: Tensor, n: int, temperature: float
) -> float:
    """The Stein estimate of the KL divergence from the target of the Gaussian fitted to ``n``
    samples, from their sums (``sum_xx``, ``sum_xg``: ``(D, D)``, or ``(D,)`` diagonals).

    With ``M = Cov(x, grad U) / T`` and ``gbar = mean(grad U)``::

        KL ~ tr((M - I)^2) / 4 + gbar^T Cov(x) gbar / (2 T^2)

    For a Gaussian target ``M = Cov(x) P`` (``P`` the target's precision over ``T``) and
    ``gbar = P (mean(x) - m)``, so these are the covariance and mean terms of the Gaussian
    KL to second order, without the target's moments: the Stein identities
    ``E[(x - c) grad U^T] = T I`` and ``E[grad U] = 0`` at the target, whatever it is, are
    what the two terms test. Invariant under rescaling coordinates; unbiased in ``M`` and
    ``gbar`` under gradient noise independent of ``x``. With diagonals, the sum over the
    diagonal of each term."""
    mean_x, mean_g = sum_x / n, sum_g / n
    t = float(temperature)
    if sum_xx.ndim == 2:
        cov_x = sum_xx / n - torch.outer(mean_x, mean_x)
        a = (sum_xg / n - torch.outer(mean_x, mean_g)) / t
        a = a - torch.eye(a.shape[0], dtype=a.dtype, device=a.device)
        cov_term = (a * a.T).sum()
        mean_term = mean_g @ cov_x @ mean_g
    else:
        cov_x = sum_xx / n - mean_x * mean_x
        a = (sum_xg / n - mean_x * mean_g) / t - 1.0
        cov_term = (a * a).sum()
        mean_term = (mean_g * mean_g * cov_x).sum()
    return float(cov_term / 4.0 + mean_term / (2.0 * t * t))


class _ValidationStats:
    """Per block of scored chains, the running log of the summed predictive probabilities of
    held-out data."""

    def __init__(self, n_blocks: int, per_block: int, target: Any, x: Tensor, y: Tensor) -> None:
        self.n_blocks, self.per_block = n_blocks, per_block
        self.target, self.x, self.y = target, x, y
        self.log_sum: Tensor | None = None  # (blocks, B)
        self.count = 0  # samples per block

    def update(self, theta: Tensor) -> None:
        """Add the scored chains' current positions."""
        per_block = self.per_block
        theta = theta[: self.n_blocks * per_block]
        logp = self.target.log_likelihood(theta, self.x, self.y).double()  # (k, B)
        logp = torch.logsumexp(logp.reshape(self.n_blocks, per_block, -1), dim=1)
        self.log_sum = logp if self.log_sum is None else torch.logaddexp(self.log_sum, logp)
        self.count += per_block

    def score(self) -> tuple[float, list[float]]:
        """The NLL of the posterior average and its values leaving out each block in turn."""
        if self.log_sum is None:
            return math.inf, []

        def nll(rows: Tensor) -> float:
            total = torch.logsumexp(rows, dim=0) - math.log(rows.shape[0] * self.count)
            return float(-total.mean())

        value = nll(self.log_sum)
        keep = torch.ones(self.n_blocks, dtype=torch.bool)
        leave_out = []
        for j in range(self.n_blocks if self.n_blocks > 1 else 0):
            keep[j] = False
            leave_out.append(nll(self.log_sum[keep]))
            keep[j] = True
        return (value if math.isfinite(value) else math.inf), leave_out


class _HeatStats:
    """Per block of scored chains, the sums of each coordinate's squared momentum, for a
    sampler whose momentum's stationary law is ``N(0, T I)``
    (:attr:`~metasampler.samplers.Sampler.unit_gaussian_momentum`)."""

    def __init__(self, n_blocks: int, per_block: int, temperature: float) -> None:
        self.n_blocks, self.per_block, self.temperature = n_blocks, per_block, temperature
        self.sums: Tensor | None = None  # (blocks, D)
        self.steps = 0

    def update(self, p: Tensor) -> None:
        """Add one step of the scored chains' momenta."""
        p = p[: self.n_blocks * self.per_block]
        sq = p.square().reshape(self.n_blocks, self.per_block, -1).sum(1).double()
        self.sums = sq if self.sums is None else self.sums.add_(sq)
        self.steps += 1

    def mean_temperature(self) -> float | None:
        """The momenta's kinetic temperature over every coordinate and scored chain (``None``
        before the first step)."""
        if self.sums is None:
            return None
        n = self.steps * self.per_block * self.n_blocks * self.sums.shape[-1]
        return float(self.sums.sum() / (n * self.temperature))

    def score(self) -> tuple[float, list[float]]:
        """The heat (:meth:`value`) of all scored chains and its values leaving out each
        block in turn."""
        if self.sums is None or self.n_blocks < 3:
            return 0.0, []
        t = self.sums / (self.steps * self.per_block * self.temperature)  # (blocks, D)
        n = self.n_blocks
        total, squares = t.sum(0), t.square().sum(0)
        # every block left out in turn, at once: sums over the other n - 1 blocks
        rest, rest_squares = total - t, squares - t.square()
        leave_out = self._heat(rest, rest_squares, n - 1).tolist()
        return float(self._heat(total, squares, n)), leave_out

    @staticmethod
    def _heat(total: Tensor, squares: Tensor, n: int) -> Tensor:
        """``sum_i (t_i - 1)^2 / 4`` over coordinates (the last dimension), ``t_i`` the
        kinetic temperature of coordinate ``i`` (its momentum's mean square over ``T``; here
        the mean of ``n`` blocks' values, from their ``total`` and the total of their
        ``squares``): the KL of a Gaussian at ``t_i`` times the target's variance along each
        coordinate, to second order, the heat the positions reach where the momenta run at
        ``t_i``. Each square less its estimate's variance (from the spread over the blocks),
        so that the noisier estimate of slower momenta does not count as heat."""
        mean = total / n
        variance = (squares - n * mean.square()) / (n - 1)
        return ((mean - 1.0).square() - variance / n).sum(-1) / 4.0


# -- the search ------------------------------------------------------------------------------
@dataclass(eq=False)
class _Group:
    eta: float
    friction: float | None
    sampler: Sampler
    state: SamplerState
    generator: torch.Generator
    stats: Any
    error: str | None = None
    heat_stats: _HeatStats | None = None
    score: float = math.inf
    se: float = 0.0
    leave_out: list[float] = field(default_factory=list)
    heat: float = 0.0
    heat_leave_out: list[float] = field(default_factory=list)
    kinetic: float | None = None
    in_bracket: bool = False

    def trial(self, round: int, kind: str, chains: int) -> Trial:
        """The group's record in :attr:`AdaptResult.trials`."""
        heat = None if self.heat_stats is None or self.error is not None else self.heat
        return Trial(
            round, kind, self.eta, self.friction, self.score, self.se, chains, self.error,
            heat, self.kinetic,
        )  # fmt: skip


@dataclass
class _Search:
    sampler: Sampler
    target: Target
    config: Adapt
    generator: torch.Generator
    n_chains: int
    kept_steps: int
    advance: Callable[[int], object]
    start_theta: Tensor
    friction_name: str | None
    validation: tuple[Tensor, Tensor] | None
    bracket_minimum: int  # chains per bracket group, at least
    restarts: frozenset[int] = frozenset()  # the warm-up's restart steps (absolute)
    trials: list[Trial] = field(default_factory=list)
    rounds: int = 0
    extra: int = 0  # chain-steps beyond a plain run's so far

    def configured(self, friction: float | None) -> Sampler:
        """The sampler with ``friction`` set (a shallow copy), or the sampler itself."""
        if friction is None or self.friction_name is None:
            return self.sampler
        if friction == getattr(self.sampler, self.friction_name):
            return self.sampler
        other = copy.copy(self.sampler)
        setattr(other, self.friction_name, friction)
        return other

    def restarted(self, sampler: Sampler, state: SamplerState) -> SamplerState:
        """``state`` after its step, restarted where the warm-up restarts (as in a plain
        run's burn-in: a thermostat that took up a cold start's heat in the first rounds
        would otherwise overdamp the kept run)."""
        return sampler.restart_warmup(state) if state.step in self.restarts else state

    def trial_chains(self, n_groups: int, minimum: int) -> tuple[Tensor, Tensor]:
        """The chains every group of a round runs a copy of (``max(minimum, K / G)`` of
        them, at most ``K``; a fresh draw each round) and the others."""
        size = _trial_size(self.n_chains, n_groups, minimum)
        deal = torch.Generator().manual_seed(1_000_003 * (self.rounds + 1))
        order = torch.randperm(self.n_chains, generator=deal)
        return order[:size].sort().values, order[size:].sort().values

    def run_round(
        self,
        state: SamplerState,
        settings: Sequence[tuple[float, float | None]],
        length: int,
        kind: str,
        carry: tuple[float, float | None] | None,
    ) -> tuple[SamplerState, list[_Group]]:
        """Run one round: every group a copy of the same trial chains, with the same random
        numbers; the other chains at ``carry`` (``(eta, friction)``; ``None``: they wait).
        Returns the merged ``K``-chain state and the scored groups."""
        proxy, recorder = _recording(self.target)
        keys = _chain_keys(state)
        minimum = self.bracket_minimum if kind == "bracket" else _MIN_TRIAL_CHAINS
        trial, others = self.trial_chains(len(settings), minimum)
        window = max(1, (3 * length) // 4)
        every = max(1, window // _VALIDATION_POINTS)
        # the window's steps the schedule collects (all of them where it collects none,
        # e.g. within a cyclical schedule's exploration stage)
        steps = range(state.step + length - window + 1, state.step + length + 1)
        counted = {k for k in steps if self.sampler.collects(k)} or set(steps)
        device = self.generator.device
        seed = int(torch.randint(2**62, (1,), generator=self.generator, device=device))
        # fresh momenta from a seed other than the groups' (their first draws would repeat it)
        start = _refreshed(_take(state, trial, keys), self.sampler, seed + 1)
        groups = [
            self._group(start, eta, friction, seed, len(trial), len(counted), kind)
            for eta, friction in settings
        ]
        rest, rest_sampler = None, self.sampler
        if carry is not None and len(others):
            rest = replace(_take(state, others, keys), eta=carry[0])
            rest_sampler = self.configured(carry[1])
        for t in range(length):
            for g in groups:
                self._step_group(g, proxy, recorder, counted, (length - 1 - t) % every == 0)
            if rest is not None:
                rest = self._step_others(rest, rest_sampler, others, state.step + t + 1)
            self.advance(1)
        for g in groups:
            self._score(g)
            self.trials.append(g.trial(self.rounds, kind, len(trial)))
        self.rounds += 1
        self.extra += (len(settings) - 1) * len(trial) * length
        return self._merged(state, groups, trial, others, rest, kind, length), groups

    def _group(
        self,
        start: SamplerState,
        eta: float,
        friction: float | None,
        seed: int,
        scored: int,
        window: int,
        kind: str,
    ) -> _Group:
        """A group of a round: a copy of the trial chains at ``(eta, friction)``, with the
        round's random numbers (``seed``) and its statistics."""
        return _Group(
            eta,
            friction,
            self.configured(friction),
            replace(start, eta=eta),
            torch.Generator(device=self.generator.device).manual_seed(seed),
            self._stats(scored, window),
            heat_stats=self._heat_stats(scored),
            in_bracket=kind == "bracket",
        )

    def _step_group(
        self,
        g: _Group,
        proxy: Target,
        recorder: _Recorder,
        counted: set[int],
        validation_point: bool,
    ) -> None:
        """One step of a group that has not diverged, and its statistics where the window
        counts the step (the validation criterion at its points only); a divergence is
        recorded in ``g.error``, never raised."""
        if g.error is not None:
            return
        try:
            g.state = g.sampler.step(g.state, proxy, g.generator)
            if not math.isfinite(float(g.state.theta.sum())):
                raise NonFiniteError(
                    f"non-finite position at step {g.state.step}",
                    step=g.state.step,
                    quantity="position",
                )
        except NonFiniteError as err:
            g.error = str(err)
            return
        g.state = self.restarted(g.sampler, g.state)
        if g.state.step not in counted:
            return
        if g.heat_stats is not None:
            g.heat_stats.update(g.state.momentum)
        if self.validation is None:
            g.stats.update(*recorder.last)
        elif validation_point:
            g.stats.update(g.state.theta)

    def _step_others(
        self,
        rest: SamplerState,
        sampler: Sampler,
        others: Tensor,
        step: int,
    ) -> SamplerState:
        """One step of the chains outside the round (``sampler`` at the best step and
        friction so far); where they diverge (rare: the best step so far) they start again
        from their start positions."""
        try:
            rest = sampler.step(rest, self.target, self.generator)
            check_finite(rest.step, position=rest.theta)
            return self.restarted(sampler, rest)
        except NonFiniteError:
            fresh = self.sampler.init(self.start_theta[others], self.target, self.generator)
            return replace(fresh, step=step, eta=rest.eta)

    def _score(self, g: _Group) -> None:
        """A group's score, its standard error and its momenta's heat (added to the Stein
        score: the kept run's positions reach it)."""
        if g.error is not None:
            return
        g.score, g.leave_out = g.stats.score()
        if g.heat_stats is not None:
            g.heat, g.heat_leave_out = g.heat_stats.score()
            g.kinetic = g.heat_stats.mean_temperature()
            if self.validation is None:  # the heat is part of the kept run's KL
                g.score += g.heat
                g.leave_out = [a + b for a, b in zip(g.leave_out, g.heat_leave_out, strict=False)]
        g.se = _jackknife_se(g.leave_out)

    def _merged(
        self,
        state: SamplerState,
        groups: list[_Group],
        trial: Tensor,
        others: Tensor,
        rest: SamplerState | None,
        kind: str,
        length: int,
    ) -> SamplerState:
        """The ``K`` chains after a round: the trial chains from the best group (after a
        bracket, from where they were; where every group diverged, from their start
        positions), the others from where they ran (or waited)."""
        keys = _chain_keys(state)
        best = _best(groups)
        if kind == "bracket":  # a probe of the scale: steps far off can damage the chains
            parts = [(_take(state, trial, keys), trial)]
        elif best is not None:
            parts = [(best.state, trial)]
        else:  # every group diverged: the trial chains start again
            restart = self.sampler.init(self.start_theta[trial], self.target, self.generator)
            parts = [(replace(restart, step=state.step), trial)]
        if len(others):
            parts.append((rest if rest is not None else _take(state, others, keys), others))
        merged = _assemble(parts, self.n_chains)
        merged.step = state.step + length
        return merged

    def _heat_stats(self, scored: int) -> _HeatStats | None:
        """The momenta's heat, for samplers whose momentum's stationary law is known and
        not held by a thermostat."""
        temperature = float(self.sampler.temperature)
        known = self.sampler.unit_gaussian_momentum and not self.sampler.thermostatted
        if not known or temperature <= 0:
            return None
        n_blocks = min(scored, _BLOCKS)
        return _HeatStats(n_blocks, scored // n_blocks, temperature)

    def _stats(self, scored: int, window: int) -> Any:
        """The criterion's running statistics over the ``scored`` trial chains, in at most
        eight blocks of equal size (the jackknife's unit)."""
        n_blocks = min(scored, _BLOCKS)
        per_block = scored // n_blocks
        if self.validation is None:
            temperature = float(self.sampler.temperature)
            return _SteinStats(
                n_blocks, per_block, temperature, self.n_chains, window, self.kept_steps
            )
        return _ValidationStats(n_blocks, per_block, self.target, *self.validation)


def _refreshed(state: SamplerState, sampler: Sampler, seed: int) -> SamplerState:
    """``state`` with its momenta drawn afresh from their stationary law ``N(0, T I)``
    where the sampler's momentum has that law (a Gibbs step on the momenta: it leaves the
    joint target invariant), else ``state`` itself."""
    temperature = float(sampler.temperature)
    if not sampler.unit_gaussian_momentum or state.momentum is None or temperature <= 0:
        return state
    generator = torch.Generator(device=state.momentum.device).manual_seed(seed)
    momentum = gaussian_like(state.momentum, generator, math.sqrt(temperature))
    return replace(state, momentum=momentum)


def _schedule_scale(sampler: Sampler, start: int, kept_steps: int) -> float:
    """The mean multiplier the sampler's schedule puts on its step over the sampling steps
    of the kept run after step ``start`` (1 for a constant schedule)."""
    if isinstance(sampler.schedule, Constant) or kept_steps < 1:
        return 1.0
    stride = max(1, kept_steps // 4096)
    values = [sampler.schedule(k) for k in range(start + 1, start + kept_steps + 1, stride)]
    scales = [v.scale for v in values if not v.explore and v.scale > 0]
    return sum(scales) / len(scales) if scales else 1.0


def _schedule_peak(sampler: Sampler, steps: int) -> float:
    """The largest multiplier the sampler's schedule puts on its step over ``steps`` steps
    (a cycle's first step), at least 1e-12."""
    stride = max(1, steps // 4096)
    peak = max(sampler.schedule(k).scale for k in range(1, steps + 1, stride))
    return max(peak, 1e-12)


def _shares(friction: bool) -> tuple[float, float, float]:
    """The step, friction and second step rounds' shares of the burn-in after the bracket
    (the settle phase takes the rest)."""
    return (0.25, 0.2, 0.3) if friction else (0.35, 0.0, 0.4)


def _trial_size(n_chains: int, n_groups: int, minimum: int) -> int:
    """How many chains each group of a round runs: ``max(minimum, K / G)``, at most ``K``."""
    return min(n_chains, max(minimum, n_chains // n_groups))


def _length_scale(
    n_chains: int,
    burn_in: int,
    kept_steps: int,
    bracket_groups: int,
    bracket_minimum: int,
    friction: bool,
    extra_cost: float,
) -> float:
    """The factor (at most 1) on the rounds' shares of the burn-in that keeps their extra
    chain-steps (each group beyond the first adds its trial chains) within ``extra_cost``
    times the chain-steps of a plain run, where every round would run."""
    bracket = (bracket_groups - 1) * _trial_size(n_chains, bracket_groups, bracket_minimum)
    later = 2 * _trial_size(n_chains, 3, _MIN_TRIAL_CHAINS)  # three groups a round
    bracket_len, left = _bracket_share(burn_in), burn_in - int(_bracket_share(burn_in))
    extra = (bracket * bracket_len + later * sum(_shares(friction)) * left) / n_chains
    return min(1.0, extra_cost * (burn_in + kept_steps) / extra) if extra > 0 else 1.0


def _budget(
    n_chains: int,
    burn_in: int,
    kept_steps: int,
    bracket_groups: int,
    friction: bool,
    extra_cost: float,
) -> tuple[int, float]:
    """The bracket's chains per group (eight where the budget allows it, else four: it only
    locates the scale, and fewer chains there leave the later rounds more of the budget) and
    the rounds' length factor (:func:`_length_scale`)."""
    for minimum in (_MIN_TRIAL_CHAINS, _MIN_BRACKET_CHAINS):
        scale = _length_scale(
            n_chains, burn_in, kept_steps, bracket_groups, minimum, friction, extra_cost
        )
        if scale >= 1.0:
            break
    return minimum, scale


def _min_settle(burn_in: int) -> int:
    """The fewest burn-in steps every chain runs at the chosen kernel after the rounds that
    move (an eighth of the burn-in)."""
    return burn_in // 8


def _bracket_share(burn_in: int) -> float:
    """The bracket round's share of the burn-in, in steps, at full length (an eighth; the
    rounds after it share what its whole steps leave)."""
    return burn_in / 8


def _friction_of(sampler: Sampler) -> tuple[str | None, float | None]:
    for name in FRICTION_ATTRIBUTES:
        value = getattr(sampler, name, None)
        if isinstance(value, float) and math.isfinite(value) and value > 0:
            return name, value
    return None, None


def _candidates(groups: list[_Group]) -> list[_Group]:
    """The groups a round may choose: those that held (no divergence, a finite score) and,
    where the momenta measure their temperature (after the bracket, whose groups still
    carry the start's transient), whose momenta's kinetic temperature is at most
    :data:`KINETIC_TOLERANCE` further from 1 than the closest group's."""
    held = [g for g in groups if g.error is None and math.isfinite(g.score)]
    judged = [g for g in held if g.kinetic is not None and not g.in_bracket]
    if not judged:
        return held
    limit = min(abs(g.kinetic - 1.0) for g in judged) + KINETIC_TOLERANCE
    return [g for g in held if g not in judged or abs(g.kinetic - 1.0) <= limit]


def _best(groups: list[_Group]) -> _Group | None:
    candidates = _candidates(groups)
    return min(candidates, key=lambda g: g.score) if candidates else None


def _choose(groups: list[_Group], attr: str, reach: int | None = None) -> tuple[float, bool] | None:
    """A round's choice of ``attr`` (``"eta"`` or ``"friction"``): the geometric mean over
    the best group and its neighbours (in ``attr``; at most ``reach`` on each side) whose
    score is within noise of the best (the difference at most ``sqrt(2)`` of its jackknife
    standard error: the groups ran the same chains with the same random numbers, so the
    difference is measured better than either score), so that a choice between groups the
    criterion cannot tell apart does not drift with its noise; and whether the best group
    sits at an end of the round's values. ``None`` when every group diverged."""
    best = _best(groups)
    if best is None:
        return None
    ordered = sorted(groups, key=lambda g: getattr(g, attr))
    i = ordered.index(best)
    candidates = _candidates(groups)

    def tied(g: _Group) -> bool:
        if g not in candidates:
            return False
        paired = [a - b for a, b in zip(g.leave_out, best.leave_out, strict=False)]
        return g.score - best.score <= math.sqrt(2.0) * _jackknife_se(paired)

    reach = len(ordered) if reach is None else reach
    low = i
    while low > max(0, i - reach) and tied(ordered[low - 1]):
        low -= 1
    high = i
    while high < min(len(ordered) - 1, i + reach) and tied(ordered[high + 1]):
        high += 1
    values = [math.log(getattr(g, attr)) for g in ordered[low : high + 1]]
    return math.exp(sum(values) / len(values)), i in (0, len(ordered) - 1)


def _clearly_worse_than_best(group: _Group | None, groups: list[_Group]) -> bool:
    """Whether ``group`` diverged or scored worse than the round's best by more than two
    standard errors of the paired difference."""
    best = _best(groups)
    if group is None or best is None or group.error is not None:
        return True
    if not math.isfinite(group.score):
        return True
    paired = [a - b for a, b in zip(group.leave_out, best.leave_out, strict=False)]
    return group.score - best.score > 2.0 * _jackknife_se(paired)


def _hotter(group: _Group | None, than: _Group | None) -> bool:
    """Whether ``group``'s momenta run hotter than ``than``'s (``False`` where neither
    measures its heat). A trial sees at once the mixing a lower friction buys, but the heat
    it brings reaches the positions' slow directions only over the kept run; the momenta
    show it at once, so a lower friction is taken only where its momenta run no hotter."""
    if group is None or than is None or not group.heat_leave_out or not than.heat_leave_out:
        return False
    return group.heat > than.heat


def _direction(groups: list[_Group], attr: str, chosen: float, reference: float) -> int:
    """``+1`` (``-1``) where the round chose, alone (no neighbour tied with it), its largest
    (smallest) ``attr`` and it lies above (below) ``reference``: the optimum may lie further
    out; else ``0``."""
    best = _best(groups)
    if best is None or chosen == reference:
        return 0
    value = getattr(best, attr)
    if not math.isclose(value, chosen, rel_tol=1e-9):
        return 0  # the choice averages tied groups, or is not the best's
    if value not in (min(getattr(g, attr) for g in groups), max(getattr(g, attr) for g in groups)):
        return 0
    return 1 if chosen > reference else -1


def _outward(direction: int, factor: float) -> tuple[float, float, float]:
    """A round's factors from an end outward: the end and two steps beyond it."""
    return tuple(factor ** (direction * j) for j in range(3))


def _chosen_friction(groups: list[_Group], friction: float) -> float:
    """A friction round's choice: ``friction`` stays unless its group is clearly worse than
    the round's best (:func:`_clearly_worse_than_best`) or fails the kinetic rule
    (:func:`_candidates`), and a lower one must not bring more heat (:func:`_hotter`)."""
    kept = next((g for g in groups if g.friction == friction), None)
    chosen = _choose(groups, "friction")
    if chosen is None:
        return friction
    if kept in _candidates(groups) and not _clearly_worse_than_best(kept, groups):
        return friction
    if chosen[0] < friction and _hotter(_best(groups), kept):
        return friction
    return chosen[0]


def _friction_ok(sampler: Sampler, name: str, value: float) -> bool:
    """SGHMC needs ``noise_estimate <= friction``."""
    return not (name == "friction" and value < getattr(sampler, "noise_estimate", 0.0))


def _validation_subset(config: Adapt) -> tuple[Tensor, Tensor] | None:
    """The held-out data the validation criterion scores (at most ``max_validation``
    examples, a fixed random subset), or ``None`` for the Stein criterion."""
    if config.validation is None:
        return None
    x, y = config.validation
    if x.shape[0] > config.max_validation:
        pick = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
        pick = pick[: config.max_validation]
        x, y = x[pick.to(x.device)], y[pick.to(y.device)]
    return x, y


class _BurnIn:
    """The phases of one adapted burn-in (the module docstring's rounds 1-5), sharing the
    chains' state, the steps used so far and the current choice."""

    def __init__(
        self,
        sampler: Sampler,
        target: Target,
        state: SamplerState,
        burn_in: int,
        kept_steps: int,
        generator: torch.Generator,
        config: Adapt,
        advance: Callable[[int], object],
    ) -> None:
        self.sampler, self.target, self.state = sampler, target, state
        self.burn_in, self.generator, self.config = burn_in, generator, config
        self.n_chains = state.theta.shape[0]
        self.name, self.start_friction = _friction_of(sampler) if config.friction else (None, None)
        self.friction = self.start_friction
        self.adapt_friction = self.name is not None and self.start_friction is not None
        # a schedule: the search tries constant steps, the schedule's mean multiplier over
        # the kept run's sampling steps times the base step
        self.scale = _schedule_scale(sampler, state.step + burn_in, kept_steps)
        trial_sampler = sampler
        if not isinstance(sampler.schedule, Constant):
            trial_sampler = copy.copy(sampler)
            trial_sampler.schedule = Constant()
        self.half = int(round(math.log(config.span) / math.log(_BRACKET_RATIO)))
        bracket_minimum, self.scaled = _budget(
            self.n_chains, burn_in, kept_steps, 2 * self.half + 1, self.adapt_friction,
            config.extra_cost,
        )  # fmt: skip
        self.search = _Search(
            trial_sampler, target, config, generator, self.n_chains, max(1, kept_steps),
            advance, state.theta.detach().clone(), self.name, _validation_subset(config),
            bracket_minimum, frozenset(state.step + r for r in warmup_restarts(burn_in)),
        )  # fmt: skip
        self.start_eta = float(state.eta)
        self.used = 0  # burn-in steps the rounds ran
        self.budget = config.extra_cost * self.n_chains * (burn_in + max(1, kept_steps))
        self.last_groups: list[_Group] = []

    def bracket(self) -> float:
        """Round 1: the bracket around the start, moved while its best is at an end (or
        every group diverged), at most :data:`_MAX_BRACKET_MOVES` times. Returns its best
        step.

        Raises:
            NonFiniteError: every step tried diverged.
        """
        length = max(1, int(self.scaled * _bracket_share(self.burn_in)))
        centre, best, moves = self.start_eta * self.scale, None, 0
        tried: list[float] = []
        carry = None  # the other chains wait until a step is known
        while True:
            etas = [centre * _BRACKET_RATIO**j for j in range(-self.half, self.half + 1)]
            tried += etas
            settings = [(e, self.friction) for e in etas]
            self.state, groups = self.search.run_round(
                self.state, settings, length, "bracket", carry
            )
            self.used += length
            best = _best(groups)
            if best is not None:
                carry = (best.eta, self.friction)
            if moves >= _MAX_BRACKET_MOVES:
                break
            if best is None:
                centre = min(etas) / _BRACKET_RATIO**self.half
            elif best.eta in (max(etas), min(etas)):
                centre = best.eta
            else:
                break
            moves += 1
        if best is None:
            first = next((t.error for t in self.search.trials if t.error), "")
            raise NonFiniteError(
                f"adapt: every step tried diverged ({min(tried):.3g} to {max(tried):.3g}, "
                f"from the sampler's {self.start_eta * self.scale:.3g}); the target may not "
                f"be finite near the start positions. First error: {first}",
                quantity="adapted step",
            )
        return best.eta

    def round_lengths(self) -> tuple[int, int, int]:
        """The step, friction and last step rounds' lengths: their shares of what the
        bracket left."""
        bracket = int(_bracket_share(self.burn_in))
        left = min(self.burn_in - self.used, self.scaled * (self.burn_in - bracket))
        step_len, friction_len, last_len = (
            max(1, int(share * left)) for share in _shares(self.adapt_friction)
        )
        return step_len, friction_len, last_len

    def step_round(
        self, centre: float, factors: Sequence[float], length: int, outward: bool
    ) -> tuple[float, bool]:
        """A round at ``centre * factors``; its choice, the best and its ties
        (:func:`_choose`): where the round goes outward from an end an earlier round chose
        (``centre``), only the best's next neighbours, so that a flat stretch of scores
        does not carry the choice away from the step an earlier round preferred; and
        whether the best sits at an end of the round."""
        settings = [(centre * f, self.friction) for f in factors]
        carry = (centre, self.friction)
        self.state, self.last_groups = self.search.run_round(
            self.state, settings, length, "step", carry
        )
        self.used += length
        chosen = _choose(self.last_groups, "eta", reach=1 if outward else None)
        return (centre * min(factors), True) if chosen is None else chosen  # None: all diverged

    def room(self, length: int) -> int:
        """The length (at most ``length``) of one more three-group round that keeps the
        extra chain-steps within the budget and the settle phase at least
        :func:`_min_settle`; 0 where it would be shorter than a sixteenth of the burn-in."""
        steps_left = self.burn_in - self.used - _min_settle(self.burn_in)
        per_step = 2 * _trial_size(self.n_chains, 3, _MIN_TRIAL_CHAINS)
        cost_left = (self.budget - self.search.extra) // per_step
        length = min(length, steps_left, int(cost_left))
        return length if length >= max(1, self.burn_in // 16) else 0

    def friction_rounds(self, eta: float, length: int) -> bool:
        """Round 3 at ``friction * (1/2, 1, 2)``, then, while the choice is an end of its
        round, alone, and a move fits the budget, a round further out (``end * (1, 2, 4)``
        or ``end * (1/4, 1/2, 1)``, then ``end * (1, 4, 16)`` and so on; the end kept
        unless another is clearly better). Sets the friction; returns whether it moved."""
        assert self.friction is not None and self.name is not None
        factors, start, moves = (0.5, 1.0, 2.0), self.friction, 0
        while True:
            friction = self.friction
            settings = [(eta, friction * f) for f in factors]
            settings = [(e, f) for e, f in settings if _friction_ok(self.sampler, self.name, f)]
            self.state, groups = self.search.run_round(
                self.state, settings, length, "friction", (eta, friction)
            )
            self.used += length
            self.friction = _chosen_friction(groups, friction)
            length = self.room(length // 2)
            direction = _direction(groups, "friction", self.friction, friction)
            if direction == 0 or moves == _MAX_MOVES or length == 0:
                return self.friction != start
            moves += 1
            factors = _outward(direction, 2.0**moves)  # each move twice as far as the last

    def last_step_rounds(self, eta: float, direction: int, factor: float, length: int) -> float:
        """Round 4: outward from an end the step round chose alone (``direction``: the end
        and two steps beyond it), else around ``eta``; then, while the choice is the far
        end, alone, further out, budget permitting. Returns the step."""
        outward = direction != 0
        for _ in range(_MAX_MOVES + 1):
            factors = _outward(direction, factor) if outward else (1.0 / factor, 1.0, factor)
            centre = eta
            eta, _ = self.step_round(centre, factors, length, outward)
            direction = _direction(self.last_groups, "eta", eta, centre)
            length = self.room(length // 2)
            if direction == 0 or length == 0:
                break
            factor = factor * 2.0 if outward else factor  # each move twice as far as the last
            outward = True
        return eta

    def base_step(self, eta: float) -> float:
        """The sampler's step for the chosen constant ``eta``: for a schedule, its base
        step, whose peak is no larger than the largest step of the last round that scored
        as well as the best."""
        if self.scale == 1.0:
            return eta
        groups = self.last_groups
        good = [g for g in _candidates(groups) if not _clearly_worse_than_best(g, groups)]
        largest = max((g.eta for g in good), default=eta)
        peak = _schedule_peak(self.sampler, self.search.kept_steps)
        return min(eta / self.scale, largest / peak)

    def settle(
        self, eta: float, callback: Callable[[SamplerState], None] | None
    ) -> tuple[Sampler, int]:
        """Round 5: every chain at the chosen kernel for the rest of the burn-in, then the
        sampler's own warm-up ends. Returns the chosen kernel and the settle steps."""
        final = copy.copy(self.sampler)
        final.eta, final.lr = eta, None
        if self.name is not None and self.friction is not None:
            setattr(final, self.name, self.friction)
        device = self.generator.device
        seed = int(torch.randint(2**62, (1,), generator=self.generator, device=device))
        state = _refreshed(replace(self.state, eta=eta), final, seed)
        settle = self.burn_in - self.used
        for _ in range(settle):
            state = final.step(state, self.target, self.generator)
            check_finite(state.step, position=state.theta)
            state = self.search.restarted(final, state)
            if callback is not None:
                callback(state)
            self.search.advance(1)
        end_warmup = getattr(final, "end_warmup", None)  # what the sampler itself adapts
        self.state = end_warmup(state) if end_warmup is not None else state
        return final, settle


@torch.no_grad()  # as sampling: no graph through the chains (targets enable grad locally)
def adapt_burn_in(
    sampler: Sampler,
    target: Target,
    state: SamplerState,
    burn_in: int,
    kept_steps: int,
    generator: torch.Generator,
    config: Adapt,
    advance: Callable[[int], object],
    callback: Callable[[SamplerState], None] | None = None,
) -> tuple[SamplerState, Sampler, AdaptResult]:
    """Run the ``burn_in`` steps of ``state``'s chains, choosing the step (and friction) as
    the module docstring says. Returns the chains after the burn-in, the sampler configured
    with the choice (a copy) and the :class:`AdaptResult`. ``callback`` is called after each
    step once every chain runs at the chosen kernel (the settle phase).

    Raises:
        NonFiniteError: every step tried diverged (the message names the range and the
            first error).
    """
    run = _BurnIn(sampler, target, state, burn_in, kept_steps, generator, config, advance)
    centre = run.bracket()  # 1
    step_len, friction_len, last_len = run.round_lengths()
    eta, at_end = run.step_round(centre, (0.5, 1.0, 2.0), step_len, outward=False)  # 2
    direction = _direction(run.last_groups, "eta", eta, centre)
    moved = run.adapt_friction and run.friction_rounds(eta, friction_len)  # 3
    factor = 2.0 if at_end or moved else math.sqrt(2.0)
    eta = run.last_step_rounds(eta, 0 if moved else direction, factor, last_len)  # 4
    eta = run.base_step(eta)
    final, settle = run.settle(eta, callback)  # 5
    result = AdaptResult(
        eta=eta,
        friction=run.friction if run.name is not None else None,
        friction_name=run.name,
        criterion=config.criterion,
        start_eta=run.start_eta,
        start_friction=run.start_friction,
        trials=run.search.trials,
        sampler=final,
        state=run.state,
        generator_state=generator.get_state(),
        settle_steps=settle,
        schedule_scale=run.scale,
    )
    return run.state, final, result
