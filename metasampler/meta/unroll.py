"""Unrolling the chains for one BPTT window and collecting the loss samples.

A step evaluates ``grad Ũ`` at the position it starts from, so the pair for position
``theta_t`` becomes available one step later (``state.grad``). ``t`` counts steps within the
segment (``t = 0`` is the segment's starting position), so burn-in, thinning and the
cross-chain times mean the same whether chains restart each segment or continue. The first
position of a window is detached (the graph was cut there): it carries no meta-gradient and
is not a cross-chain slice; it still counts as an in-chain sample when the pool spans the
segment (``pool_detached=True``), where it is a genuine sample of the chains' law.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..samplers.base import SamplerState
from .losses import InChainCollector

__all__ = ["WindowSamples", "unroll_window"]


@dataclass
class WindowSamples:
    """Cross-chain slices of one window: positions ``(K, D)``, ``grad Ũ`` there and the chains'
    step count at each (steps since their initialisation)."""

    positions: list[Tensor] = field(default_factory=list)
    grads: list[Tensor] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)


def unroll_window(
    sampler: torch.nn.Module,
    state: SamplerState,
    target: object,
    generator: torch.Generator,
    *,
    length: int,
    segment_start: int,
    cross_chain_every: int,
    collector: InChainCollector | None = None,
    pool_detached: bool = False,
) -> tuple[SamplerState, WindowSamples]:
    """Run ``length`` sampler steps from ``state`` (attached to the graph of the nets).

    Args:
        segment_start: ``state.step`` at the start of the segment (``t`` is counted from it).
        cross_chain_every: keep positions with ``t % cross_chain_every == 0`` as cross-chain
            slices (0: none).
        collector: offered every position (it keeps what its burn-in/thinning/subset want).
        pool_detached: offer the window's (detached) first position to the collector too.

    Raises :class:`~metasampler.targets.NonFiniteError` from the sampler when a chain diverges.
    """
    samples = WindowSamples()
    first = state.step - segment_start
    for _ in range(length):
        previous = state.theta
        state = sampler.step(state, target, generator)
        t = state.step - 1 - segment_start  # ``previous`` is the position after step t
        if t == first:
            if collector is not None and pool_detached:
                collector.collect(t, previous, state.grad)
            continue
        if cross_chain_every and t % cross_chain_every == 0:
            samples.positions.append(previous)
            samples.grads.append(state.grad)
            samples.steps.append(state.step - 1)
        if collector is not None:
            collector.collect(t, previous, state.grad)
    return state, samples
