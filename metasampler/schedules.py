"""Step-size schedules shared by every sampler (docs/METHOD.md §2).

A schedule maps the 1-based step index ``k`` to a :class:`ScheduleValue`: a multiplier on the
sampler's base step ``eta`` and whether step ``k`` belongs to an exploration stage
(temperature 0, no injected noise, no samples collected).

* :class:`Constant` — ``eta_k = eta``.
* :class:`PolynomialDecay` — ``eta_k = eta * (b + k) ** -gamma`` (``a = eta``), as in SGLD.
* :class:`CyclicalCosine` — Zhang et al. (ICLR 2020, eq. 1): with ``L = ceil(K_total / M)``
  steps per cycle, ``eta_k = eta / 2 * (cos(pi * ((k - 1) mod L) / L) + 1)``; the step is
  in the exploration stage while ``r(k) = ((k - 1) mod L) / L < beta``.
* :class:`HoldThenDecay` — constant for ``hold`` steps, then ``(k - hold) ** -gamma``
  (Zhang et al. 2020 BLR and 25-Gaussian SGLD).
* :class:`DecayThenHold` — ``k ** -gamma`` up to ``until``, then held (Pal et al., §5.1).
* :class:`WarmUp` — another schedule times ``scale`` for the first ``steps`` steps (the
  evaluation warm-up of Gong et al.'s MNIST code: one data epoch at a smaller rate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Protocol

__all__ = [
    "ScheduleValue",
    "Schedule",
    "Constant",
    "PolynomialDecay",
    "CyclicalCosine",
    "HoldThenDecay",
    "DecayThenHold",
    "WarmUp",
]


class ScheduleValue(NamedTuple):
    scale: float
    explore: bool


class Schedule(Protocol):
    def __call__(self, k: int) -> ScheduleValue: ...


@dataclass(frozen=True)
class Constant:
    """A constant step: the multiplier is always 1 and every step samples."""

    def __call__(self, k: int) -> ScheduleValue:
        return ScheduleValue(1.0, False)


@dataclass(frozen=True)
class PolynomialDecay:
    """``eta_k = eta * (b + k) ** -gamma``; ``k`` counts from 1."""

    b: float = 0.0
    gamma: float = 0.55

    def __post_init__(self) -> None:
        if not self.gamma >= 0:
            raise ValueError(f"gamma must be >= 0, got {self.gamma!r}")
        if not self.b + 1 > 0:
            raise ValueError(f"b must be > -1 so that b + k > 0, got {self.b!r}")

    def __call__(self, k: int) -> ScheduleValue:
        return ScheduleValue((self.b + k) ** -self.gamma, False)


@dataclass(frozen=True)
class CyclicalCosine:
    """Cyclical cosine step with an exploration stage (cSGLD / cSGHMC).

    Args:
        total_steps: the run length ``K_total``.
        n_cycles: the number of cycles ``M``.
        explore_fraction: ``beta``; the first ``beta`` of each cycle explores (T = 0).
    """

    total_steps: int
    n_cycles: int
    explore_fraction: float = 0.25

    def __post_init__(self) -> None:
        if self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {self.total_steps!r}")
        if not 1 <= self.n_cycles <= self.total_steps:
            raise ValueError(f"n_cycles must be in [1, total_steps], got {self.n_cycles!r}")
        if not 0 <= self.explore_fraction < 1:
            raise ValueError(f"explore_fraction must be in [0, 1), got {self.explore_fraction!r}")

    @property
    def cycle_length(self) -> int:
        return math.ceil(self.total_steps / self.n_cycles)

    def __call__(self, k: int) -> ScheduleValue:
        # Past K_total eq. 1 would start another cycle (a fresh exploration stage in what the
        # caller planned as the end of its run): an error, not a silent restart or clamp.
        if not 1 <= k <= self.total_steps:
            raise ValueError(
                f"step {k} is outside this cyclical schedule's run of total_steps="
                f"{self.total_steps} steps; build the sampler with total_steps >= the steps run"
            )
        length = self.cycle_length
        r = ((k - 1) % length) / length
        return ScheduleValue(0.5 * (math.cos(math.pi * r) + 1.0), r < self.explore_fraction)


@dataclass(frozen=True)
class HoldThenDecay:
    """Constant for the first ``hold`` steps, then ``(k - hold) ** -gamma`` (``k`` 1-based).

    Zhang et al. 2020, appendix K.1 (BLR): "the stepsize is a for the first 5000 iterations and then
    switch to the decay schedule (2) with b = 0, gamma = 0.55"; the public 25-Gaussian code
    (``sgld.m``) does the same with ``hold = 500``. The decay counts from the switch, so the
    step is continuous there.
    """

    hold: int
    gamma: float = 0.55

    def __call__(self, k: int) -> ScheduleValue:
        scale = 1.0 if k <= self.hold else float(k - self.hold) ** -self.gamma
        return ScheduleValue(scale, False)


@dataclass(frozen=True)
class DecayThenHold:
    """``k ** -gamma`` for ``k <= until``, then held at ``until ** -gamma`` (``k`` 1-based).

    Pal et al., §5.1: ``eta_t = eta_0 (t + 1)^-0.55`` for ``t < 200``, else
    ``eta_0 * 200^-0.55`` (``t`` 0-based, so ``k = t + 1``).
    """

    until: int
    gamma: float = 0.55

    def __call__(self, k: int) -> ScheduleValue:
        return ScheduleValue(float(min(k, self.until)) ** -self.gamma, False)


@dataclass(frozen=True)
class WarmUp:
    """``then``'s value with its multiplier times ``scale`` for ``k <= steps``, unchanged after.

    The paper's MNIST evaluation (Gong et al. 2019, ``NetworkTopologyGeneralization.py``) runs the
    first data epoch at a smaller per-batch rate (0.0085, then 0.018); :func:`WarmUp` expresses that
    phase for any sampler, on top of its own schedule (the exploration flags of a cyclical
    schedule pass through). ``scale`` multiplies the SDE step ``eta``, so a learning-rate
    factor ``f`` is ``scale = f`` for first-order and ``sqrt(f)`` for second-order samplers
    (:func:`metasampler.stepsize.resolve_eta` does that conversion).
    """

    steps: int
    scale: float
    then: Schedule = Constant()

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps!r}")
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ValueError(f"scale must be a finite number > 0, got {self.scale!r}")

    def __call__(self, k: int) -> ScheduleValue:
        value = self.then(k)
        if k <= self.steps:
            return ScheduleValue(value.scale * self.scale, value.explore)
        return value
