"""Running one round: every group a copy of the same trial chains with the same random
numbers, the other chains at the best kernel so far, then the scores and the merged chains."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from ..samplers.base import Sampler, SamplerState, check_finite
from ..targets import NonFiniteError, Target
from .chains import Recorder, assemble, chain_keys, recording, refreshed, take_chains
from .choice import best_group
from .config import Adapt, Trial
from .criteria import BLOCKS, HeatStats, SteinStats, ValidationStats, jackknife_se
from .groups import Group

#: Chains each group of a round runs at least (all ``K`` where there are fewer): fewer rank
#: the steps by noise.
MIN_TRIAL_CHAINS = 8
#: The bracket's groups run this many where the cost budget binds (it only locates the scale).
MIN_BRACKET_CHAINS = 4
#: The validation criterion scores a group at this many points of its window.
_VALIDATION_POINTS = 4


def trial_size(n_chains: int, n_groups: int, minimum: int) -> int:
    """How many chains each group of a round runs: ``max(minimum, K / G)``, at most ``K``."""
    return min(n_chains, max(minimum, n_chains // n_groups))


@dataclass
class Search:
    """The rounds of one adapted burn-in: runs each round (:meth:`run_round`) on the
    chains' state and keeps every group's record (:attr:`trials`) and the extra chain-steps
    so far (:attr:`extra`)."""

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
        size = trial_size(self.n_chains, n_groups, minimum)
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
    ) -> tuple[SamplerState, list[Group]]:
        """Run one round: every group a copy of the same trial chains, with the same random
        numbers; the other chains at ``carry`` (``(eta, friction)``; ``None``: they wait).
        Returns the merged ``K``-chain state and the scored groups."""
        proxy, recorder = recording(self.target)
        keys = chain_keys(state)
        minimum = self.bracket_minimum if kind == "bracket" else MIN_TRIAL_CHAINS
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
        start = refreshed(take_chains(state, trial, keys), self.sampler, seed + 1)
        groups = [
            self._group(start, eta, friction, seed, len(trial), len(counted), kind)
            for eta, friction in settings
        ]
        rest, rest_sampler = None, self.sampler
        if carry is not None and len(others):
            rest = replace(take_chains(state, others, keys), eta=carry[0])
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
    ) -> Group:
        """A group of a round: a copy of the trial chains at ``(eta, friction)``, with the
        round's random numbers (``seed``) and its statistics."""
        return Group(
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
        g: Group,
        proxy: Target,
        recorder: Recorder,
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

    def _score(self, g: Group) -> None:
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
        g.se = jackknife_se(g.leave_out)

    def _merged(
        self,
        state: SamplerState,
        groups: list[Group],
        trial: Tensor,
        others: Tensor,
        rest: SamplerState | None,
        kind: str,
        length: int,
    ) -> SamplerState:
        """The ``K`` chains after a round: the trial chains from the best group (after a
        bracket, from where they were; where every group diverged, from their start
        positions), the others from where they ran (or waited)."""
        keys = chain_keys(state)
        best = best_group(groups)
        if kind == "bracket":  # a probe of the scale: steps far off can damage the chains
            parts = [(take_chains(state, trial, keys), trial)]
        elif best is not None:
            parts = [(best.state, trial)]
        else:  # every group diverged: the trial chains start again
            restart = self.sampler.init(self.start_theta[trial], self.target, self.generator)
            parts = [(replace(restart, step=state.step), trial)]
        if len(others):
            parts.append((rest if rest is not None else take_chains(state, others, keys), others))
        merged = assemble(parts, self.n_chains)
        merged.step = state.step + length
        return merged

    def _heat_stats(self, scored: int) -> HeatStats | None:
        """The momenta's heat, for samplers whose momentum's stationary law is known and
        not held by a thermostat."""
        temperature = float(self.sampler.temperature)
        known = self.sampler.unit_gaussian_momentum and not self.sampler.thermostatted
        if not known or temperature <= 0:
            return None
        n_blocks = min(scored, BLOCKS)
        return HeatStats(n_blocks, scored // n_blocks, temperature)

    def _stats(self, scored: int, window: int) -> Any:
        """The criterion's running statistics over the ``scored`` trial chains, in at most
        eight blocks of equal size (the jackknife's unit)."""
        n_blocks = min(scored, BLOCKS)
        per_block = scored // n_blocks
        if self.validation is None:
            temperature = float(self.sampler.temperature)
            return SteinStats(
                n_blocks, per_block, temperature, self.n_chains, window, self.kept_steps
            )
        return ValidationStats(n_blocks, per_block, self.target, *self.validation)
