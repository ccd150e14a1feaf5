"""The meta-loss path: a window's loss terms, their meta-gradients and the optimiser step(s).

One path serves one process and chains sharded across ranks (torchrun): the loss terms are
computed from this process's chains (sharded: from every rank's positions, gathered first,
each rank computing its share of the global surrogate), combined with their weights,
differentiated, summed across ranks (sharded: the global gradient is the sum of the shares)
and applied as the truncation schedule says (:mod:`.schedule`): one combined step, one step
per loss, or — accumulating — once per segment. The held-out predictive loss
(:mod:`.heldout`) and the temperature loss (:mod:`.virial`), one process only, are further
terms on the same slices.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from torch import Tensor

from .. import distributed
from ..distributed import ChainShard
from .divergence import NonFiniteLoss, abort_on_peer_failure
from .losses import InChainCollector, cross_chain_loss
from .outer import (
    GradientAccumulator,
    Grads,
    MetaOptimizer,
    add_grads,
    scale_grads,
    sum_across_ranks,
)
from .schedule import TruncationSchedule
from .sharded import gather_slices, sharded_cross_chain_loss
from .unroll import WindowSamples

__all__ = ["MetaUpdate"]

TERMS = ("cross_chain", "in_chain", "heldout", "temperature")


class SliceLoss(Protocol):
    """A loss of a window's cross-chain slices (``(K, D)`` positions attached to the graph),
    of those at least ``burn_in`` steps after the chains' initialisation."""

    burn_in: int

    def loss(self, positions: Sequence[Tensor]) -> Tensor: ...


class MetaUpdate:
    """Turns unrolled windows into optimiser steps on ``outer``.

    Args:
        outer: the optimiser of the sampler's nets.
        settings: the ``train`` settings (loss weights, Stein estimator).
        schedule: the truncation schedule (when to step, one step per loss or combined).
        shard: this process's chains (``world == 1``: all of them).

    Raises :class:`~.divergence.NonFiniteLoss` for a non-finite loss or meta-gradient.
    ``terms`` collects each loss term's values until :meth:`take_terms`.
    """

    def __init__(
        self,
        outer: MetaOptimizer,
        settings: Any,
        schedule: TruncationSchedule,
        shard: ChainShard,
    ) -> None:
        self.outer = outer
        self.schedule = schedule
        self.shard = shard
        self.weights = {
            "cross_chain": settings.cross_chain_weight,
            "in_chain": settings.in_chain_weight,
            "heldout": settings.heldout_weight,
            "temperature": settings.temperature_weight,
        }
        self.stein = {
            "bandwidth_factor": settings.stein_bandwidth_factor,
            "ridge": settings.stein_ridge,
        }
        self.terms: dict[str, list[float]] = {name: [] for name in TERMS}

    def take_terms(self) -> dict[str, list[float]]:
        """The loss terms' values since the last call."""
        terms, self.terms = self.terms, {name: [] for name in TERMS}
        return terms

    # -- one window -----------------------------------------------------------------------
    def window(
        self,
        window: WindowSamples,
        collector: InChainCollector | None,
        accumulated: GradientAccumulator | None = None,
        keep_graph: bool = False,
        slice_losses: Mapping[str, SliceLoss] | None = None,
    ) -> float | None:
        """The window's loss terms — cross-chain over its slices (unless its weight is 0),
        in-chain over the collector's pool when the schedule clears it after each window,
        each of ``slice_losses`` (by term name: ``heldout``, ``temperature``) over the slices
        — and the update: an optimiser step now (returns the total loss), or with
        ``accumulated`` their gradients added to it (``keep_graph``: the segment's in-chain
        pool still needs the window's graph). ``None`` when the window has no loss term."""
        positions = window.positions
        pooled = collector is not None and collector.n_samples >= 2 and self.schedule.clear_pool
        if not positions and not pooled:
            return None
        crossing = bool(positions) and self.weights["cross_chain"] > 0
        sharded = self.shard.world > 1
        # Collectives first: a failure guard must not contain any.
        everyone = gather_slices(positions, self.shard) if sharded and crossing else None
        pool = collector.gather() if sharded and pooled else None
        with abort_on_peer_failure(), distributed.failure_guard("computing the meta-gradient"):
            if sharded:
                cross = None if everyone is None else sharded_cross_chain_loss(
                    positions, window.grads, everyone, self.shard, **self.stein
                )  # fmt: skip
                in_chain = None if pool is None else collector.sharded_loss(pool, **self.stein)
            else:
                cross = (
                    cross_chain_loss(positions, window.grads, **self.stein) if crossing else None
                )
                in_chain = collector.loss(**self.stein) if pooled else None
            extra = self._slice_terms(window, slice_losses or {})
            if cross is None and in_chain is None and not extra:
                return None
            if accumulated is not None:
                self._accumulate(accumulated, cross, in_chain, extra, len(positions), keep_graph)
                return None
            terms = {"cross_chain": cross, "in_chain": in_chain, **extra}
            grads, values = self._gradients(terms)
        return self.apply(*self._reduce(grads, values))

    @staticmethod
    def _slice_terms(window: WindowSamples, slice_losses: Mapping[str, SliceLoss]) -> dict:
        """Each slice loss on the window's slices past its burn-in (none there: no term)."""
        terms = {}
        for name, term in slice_losses.items():
            kept = [
                theta
                for theta, step in zip(window.positions, window.steps, strict=True)
                if step >= term.burn_in
            ]
            if kept:
                terms[name] = term.loss(kept)
        return terms

    def _accumulate(
        self,
        accumulated: GradientAccumulator,
        cross: Tensor | None,
        in_chain: Tensor | None,
        extra: dict[str, Tensor],
        n: int,
        keep_graph: bool,
    ) -> None:
        # The segment's cross-chain loss is the mean over all its slices: sum each window's
        # slice surrogates now (freeing its graph unless a later term or the in-chain pool
        # still needs it); the accumulator divides by the count at the end. Each slice loss
        # (held-out, temperature) is the mean of its windows' values.
        later = [*extra.values(), in_chain]
        if cross is not None:
            retain = keep_graph or any(t is not None for t in later)
            accumulated.add("cross_chain", cross * n, n, retain_graph=retain)
        for i, (name, value) in enumerate(extra.items()):
            retain = keep_graph or any(t is not None for t in later[i + 1 :])
            accumulated.add(name, value, 1, retain_graph=retain)
        if in_chain is not None:
            accumulated.add("in_chain", in_chain, 1)

    def end_segment(
        self,
        accumulated: GradientAccumulator,
        collector: InChainCollector | None,
        keep_graph: bool,
    ) -> float | None:
        """Accumulating: add the segment's in-chain loss (``keep_graph``: its pool spans the
        segment) and take the step(s) on the mean gradients; returns the total loss."""
        if keep_graph and collector.n_samples >= 2:
            accumulated.add("in_chain", collector.loss(**self.stein), 1)
        if not accumulated.sums:
            return None
        return self.apply(*accumulated.means())

    # -- gradients and steps --------------------------------------------------------------
    def _gradients(self, terms: dict[str, Tensor | None]) -> tuple[dict[str, Grads], dict]:
        """Meta-gradients of the terms: one per loss when each gets its own step, else of the
        weighted sum (``total``); with the loss values (tensors)."""
        present = {k: t for k, t in terms.items() if t is not None}
        if self.schedule.step_per_loss:
            names = list(present)
            grads = {
                k: self.outer.gradients(present[k], retain_graph=k != names[-1]) for k in names
            }
            return grads, present
        loss = self._weighted_total(present)
        return {"total": self.outer.gradients(loss)}, {"total": loss, **present}

    def _weighted_total(self, values: dict):
        """``sum_k w_k * value_k`` over the terms present (tensors or floats): the combined
        loss that is differentiated and the total that is reported are this one sum."""
        return sum(self.weights[k] * v for k, v in values.items() if v is not None)

    def _reduce(
        self, grads: dict[str, Grads], values: dict[str, Tensor]
    ) -> tuple[dict[str, Grads], dict[str, float | None]]:
        """The global gradients and loss values: this process's, or (sharded) the sums of
        every rank's shares in one all-reduce."""
        if self.shard.world == 1:
            return grads, {k: float(v.detach()) for k, v in values.items()}
        summed, totals, bad_ranks = sum_across_ranks(
            self.outer.params,
            grads["total"],
            [values["total"], *(values.get(name) for name in TERMS)],
            self.shard.world,
            self.shard.rank,
        )
        total, *term_values = totals
        if not math.isfinite(total):
            where = f" (from rank {', '.join(map(str, bad_ranks))})" if bad_ranks else ""
            raise NonFiniteLoss(f"non-finite meta-loss {total}{where}")
        floats = {n: v if n in values else None for n, v in zip(TERMS, term_values, strict=True)}
        return {"total": summed}, {"total": total, **floats}

    def apply(self, grads: dict[str, Grads | None], values: dict[str, float | None]) -> float:
        """Record the loss values and take the optimiser step(s) on ``grads``; returns the
        total.

        ``grads`` holds one entry per loss (``cross_chain``, ``in_chain``) or one ``total``
        (already weighted). Per-loss entries are weighted here and applied as one combined
        step, or as one step each (cross-chain first) when the schedule says so.
        """
        for name in TERMS:
            if values.get(name) is not None:
                self.terms[name].append(values[name])
        total = values.get("total")
        if total is None:
            total = self._weighted_total(values)
        if not math.isfinite(total):
            raise NonFiniteLoss(f"non-finite meta-loss {total}")
        if "total" in grads:
            steps = [grads["total"]]
        else:
            weighted = [scale_grads(g, self.weights[k]) for k, g in grads.items() if g is not None]
            if self.schedule.step_per_loss:
                steps = weighted
            else:
                combined = None
                for g in weighted:
                    combined = add_grads(combined, g)
                steps = [combined]
        for g in steps:
            if not self.outer.step(g):
                raise NonFiniteLoss("non-finite meta-gradient")
        return total
