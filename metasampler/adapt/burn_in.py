"""The adapted burn-in: the bracket, the step and friction rounds and their moves, the settle
phase, within the cost budget (docs/METHOD.md §7)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import Tensor

from ..samplers.base import Sampler, SamplerState, check_finite, warmup_restarts
from ..schedules import Constant
from ..targets import NonFiniteError, Target
from .chains import refreshed
from .choice import (
    best_group,
    choose,
    chosen_friction,
    clearly_worse_than_best,
    eligible,
    end_direction,
    outward_factors,
)
from .config import FRICTION_ATTRIBUTES, Adapt, AdaptResult
from .groups import Group
from .rounds import MIN_BRACKET_CHAINS, MIN_TRIAL_CHAINS, Search, trial_size

_BRACKET_RATIO = 4.0  # the bracket's groups are this factor apart
_MAX_BRACKET_MOVES = 2  # times the bracket moves to an end that scored best
_MAX_MOVES = 3  # rounds beyond the friction round and the last step round, each
_BRACKET_MEMORY = 4.0  # bracket windows per SGHMC momentum memory, at least (chains alone)


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
    bracket = (bracket_groups - 1) * trial_size(n_chains, bracket_groups, bracket_minimum)
    later = 2 * trial_size(n_chains, 3, MIN_TRIAL_CHAINS)  # three groups a round
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
    for minimum in (MIN_TRIAL_CHAINS, MIN_BRACKET_CHAINS):
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
    """The phases of one adapted burn-in (docs/METHOD.md §7, rounds 1-5), sharing the
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
        self.search = Search(
            trial_sampler, target, config, generator, self.n_chains, max(1, kept_steps),
            advance, state.theta.detach().clone(), self.name, _validation_subset(config),
            bracket_minimum, frozenset(state.step + r for r in warmup_restarts(burn_in)),
        )  # fmt: skip
        self.start_eta = float(state.eta)
        self.used = 0  # burn-in steps the rounds ran
        self.budget = config.extra_cost * self.n_chains * (burn_in + max(1, kept_steps))
        self.last_groups: list[Group] = []

    def bracket(self) -> float:
        """Round 1: the bracket around the start, moved while its best is at an end (or
        every group diverged), at most :data:`_MAX_BRACKET_MOVES` times. Returns its best
        step; the friction becomes its group's (:meth:`bracket_friction`).

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
            settings = [(e, self.bracket_friction(e, length)) for e in etas]
            self.state, groups = self.search.run_round(
                self.state, settings, length, "bracket", carry
            )
            self.used += length
            best = best_group(groups)
            if best is not None:
                carry = (best.eta, best.friction)
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
        self.friction = best.friction  # the start's, or as the bracket raised it
        return best.eta

    def bracket_friction(self, eta: float, length: int) -> float | None:
        """The friction of the bracket's group at ``eta``: from the chains alone, SGHMC's
        raised where needed so that its momenta forget within a quarter of the group's
        window (docs/METHOD.md §7, round 1)."""
        if self.name != "friction" or self.friction is None or self.config.validation is not None:
            return self.friction
        window = max(1, (3 * length) // 4)
        return max(self.friction, min(_BRACKET_MEMORY / window, 1.0) / eta)

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
        (:func:`choose`): where the round goes outward from an end an earlier round chose
        (``centre``), only the best's next neighbours, so that a flat stretch of scores
        does not carry the choice away from the step an earlier round preferred; and
        whether the best sits at an end of the round."""
        settings = [(centre * f, self.friction) for f in factors]
        carry = (centre, self.friction)
        self.state, self.last_groups = self.search.run_round(
            self.state, settings, length, "step", carry
        )
        self.used += length
        chosen = choose(self.last_groups, "eta", reach=1 if outward else None)
        return (centre * min(factors), True) if chosen is None else chosen  # None: all diverged

    def room(self, length: int) -> int:
        """The length (at most ``length``) of one more three-group round that keeps the
        extra chain-steps within the budget and the settle phase at least
        :func:`_min_settle`; 0 where it would be shorter than a sixteenth of the burn-in."""
        steps_left = self.burn_in - self.used - _min_settle(self.burn_in)
        per_step = 2 * trial_size(self.n_chains, 3, MIN_TRIAL_CHAINS)
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
            self.friction = chosen_friction(groups, friction)
            length = self.room(length // 2)
            direction = end_direction(groups, "friction", self.friction, friction)
            if direction == 0 or moves == _MAX_MOVES or length == 0:
                return self.friction != start
            moves += 1
            factors = outward_factors(direction, 2.0**moves)  # each move twice as far as the last

    def last_step_rounds(self, eta: float, direction: int, factor: float, length: int) -> float:
        """Round 4: outward from an end the step round chose alone (``direction``: the end
        and two steps beyond it), else around ``eta``; then, while the choice is the far
        end, alone, further out, budget permitting. Returns the step."""
        outward = direction != 0
        for _ in range(_MAX_MOVES + 1):
            factors = outward_factors(direction, factor) if outward else (1.0 / factor, 1.0, factor)
            centre = eta
            eta, _ = self.step_round(centre, factors, length, outward)
            direction = end_direction(self.last_groups, "eta", eta, centre)
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
        good = [g for g in eligible(groups) if not clearly_worse_than_best(g, groups)]
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
        state = refreshed(replace(self.state, eta=eta), final, seed)
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
    docs/METHOD.md §7 says. Returns the chains after the burn-in, the sampler configured
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
    direction = end_direction(run.last_groups, "eta", eta, centre)
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
