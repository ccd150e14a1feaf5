"""Moving chains between a round's groups: taking some chains of a state, assembling a state
from parts, recording the (position, gradient) pairs a sampler evaluates, and drawing the
momenta afresh."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from ..integrators import gaussian_like
from ..samplers.base import Sampler, SamplerState
from ..targets import Target


def chain_keys(state: SamplerState) -> set[str]:
    """The extras that hold one row per chain."""
    k = state.theta.shape[0]
    return {
        name for name, v in state.extras.items() if isinstance(v, Tensor) and v.ndim and len(v) == k
    }


def _rows(x: Tensor | None, idx: Tensor) -> Tensor | None:
    return None if x is None else x[idx]


def take_chains(state: SamplerState, idx: Tensor, keys: set[str]) -> SamplerState:
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


def assemble(parts: Sequence[tuple[SamplerState, Tensor]], n_chains: int) -> SamplerState:
    """An ``n_chains``-chain state from ``(state, chains)`` parts: row ``j`` of ``state``
    becomes chain ``chains[j]``; the first part gives the rest (step, step size, shared
    extras). Per-chain fields that a part lacks (a running statistic its chains have not
    started, e.g. chains that waited while the others tried steps) take the first part's
    rows, cycled: its chains' statistics stand in until the part's own take over."""
    first = parts[0][0]
    per_chain = [chain_keys(state) for state, _ in parts]
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
        extras[name] = gather(lambda s, n=name: s.extras.get(n) if n in chain_keys(s) else None)
    return replace(
        first,
        theta=gather(lambda s: s.theta),
        momentum=gather(lambda s: s.momentum),
        extras=extras,
        energy=gather(lambda s: s.energy),
        grad=gather(lambda s: s.grad),
    )


# -- recording the (position, gradient) pairs of each evaluation ------------------------------
class Recorder:
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

    def __init__(self, target: Target, recorder: Recorder) -> None:
        self._target = target
        self.evaluate = recorder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def recording(target: Target) -> tuple[Target, Recorder]:
    """A copy of ``target`` (same class, so samplers treat it alike) whose evaluations are
    recorded."""
    recorder = Recorder(target.evaluate)
    try:
        proxy = copy.copy(target)
        proxy.evaluate = recorder
        return proxy, recorder
    except (AttributeError, TypeError):  # slots, frozen, uncopyable
        return _Forward(target, recorder), recorder  # type: ignore[return-value]


def refreshed(state: SamplerState, sampler: Sampler, seed: int) -> SamplerState:
    """``state`` with its momenta drawn afresh from their stationary law ``N(0, T I)``
    where the sampler's momentum has that law (a Gibbs step on the momenta: it leaves the
    joint target invariant), else ``state`` itself."""
    temperature = float(sampler.temperature)
    if not sampler.unit_gaussian_momentum or state.momentum is None or temperature <= 0:
        return state
    generator = torch.Generator(device=state.momentum.device).manual_seed(seed)
    momentum = gaussian_like(state.momentum, generator, math.sqrt(temperature))
    return replace(state, momentum=momentum)
