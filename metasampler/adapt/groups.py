"""A trial group: a copy of a round's trial chains at one step (and friction), its running
statistics and its scores."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..samplers.base import Sampler, SamplerState
from .config import Trial
from .criteria import HeatStats


@dataclass(eq=False)
class Group:
    """One group of a round (its record is :class:`~metasampler.adapt.Trial`)."""

    eta: float
    friction: float | None
    sampler: Sampler
    state: SamplerState
    generator: torch.Generator
    stats: Any
    error: str | None = None
    heat_stats: HeatStats | None = None
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
