"""The variance a sampler gives a coordinate that only a ``N(0, 1)`` prior acts on.

A weight that no training example reaches (a first-layer weight on an input that is zero in
every training example) has the prior as its posterior, and its stochastic gradient is the
prior's, exactly. :func:`prior_only_variances` runs a sampler, at the step, friction and
schedule it was built with, on independent such coordinates (energy ``theta^2 / 2``, ``N``
data for the sampler's step conversions) from zero, so that the variance it samples there can
be read against the right answer, 1: a check of the sampler that no test score can give. A
cyclical schedule's temperature-0 exploration stages, for example, leave cSGHMC at about half
of it (research/NOTEBOOK.md).

The learned samplers' nets also see the chain's energy, which here is the Gaussian's, not a
network's: for them this is an approximation of what they do in a network.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..samplers.base import Sampler
from ..sampling import sample
from ..targets import EnergyTarget, NonFiniteError

__all__ = ["PriorStep", "prior_only_variances", "sampled_variance"]


@dataclass(frozen=True)
class PriorStep:
    """After ``step``: the chains' mean ``theta^2`` and whether the step samples (not an
    exploration stage of the schedule)."""

    step: int
    variance: float
    collects: bool


def prior_only_variances(
    make: Callable[[], Sampler],
    n_data: int,
    n_chains: int,
    n_steps: int,
    dim: int = 1000,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> list[PriorStep]:
    """Run ``make()`` for ``n_steps`` steps on ``n_chains`` chains of ``dim`` independent
    ``N(0, 1)`` coordinates on ``device`` (the sampler's); one :class:`PriorStep` per step,
    up to a divergence (a step too large for the Gaussian ends the list). A learned sampler
    runs eagerly (no compile for this small, one-off target)."""
    sampler = make()
    if hasattr(sampler, "use_compile"):
        sampler.use_compile = False
    target = EnergyTarget(
        lambda x: x.square().sum(-1) / 2, dim, grad_fn=lambda x: x, n_data=int(n_data)
    )
    rows: list[PriorStep] = []

    def record(state) -> None:
        variance = float(state.theta.square().mean())
        rows.append(PriorStep(state.step, variance, sampler.collects(state.step)))

    try:
        sample(
            sampler, target, n_chains, n_steps, seed=seed, progress=False, callback=record,
            store=False, device=device, init=lambda gen: torch.zeros(n_chains, dim),
        )  # fmt: skip
    except NonFiniteError:
        pass  # (the rows so far; sampled_variance says nan when none is kept)
    return rows


def sampled_variance(rows: list[PriorStep], burn_in: int, n_steps: int) -> float:
    """The mean variance over the sampling steps after ``burn_in``; ``nan`` when the run
    diverged before ``n_steps`` or kept nothing."""
    kept = [r.variance for r in rows if r.step > burn_in and r.collects]
    if not kept or len(rows) < n_steps or not all(math.isfinite(v) for v in kept):
        return math.nan
    return sum(kept) / len(kept)
