"""Meta-training of NNSGHMC by truncated back-propagation through time (004 §3.3, SPEC §4).

Loop structure (the decisions come from :class:`.schedule.TruncationSchedule`)::

    for epoch in epochs:                       # a (possibly new) training problem per epoch
        for sub_epoch in sub_epochs:           # chains restart (replay pool or fresh init),
                                               #   or continue within the epoch
            for window in segment's windows:   # truncated BPTT: unroll `unroll` steps (.unroll)
                per-window schedule: loss = w_cross * cross-chain + w_in * in-chain, step(s)
                accumulate: add the window's cross-chain gradient
                detach the state
            accumulate: in-chain loss over the segment's pool; step(s) (.outer)
            final (theta, p) states -> replay pool

Checkpoints are written atomically at epoch boundaries (every ``checkpoint_every`` epochs and
at the end; chains restart at each epoch, so no chain state is needed) and hold everything a
run depends on: net weights, optimiser, replay pool, the run's random generator and the
history, so ``resume`` continues bit-for-bit like an uninterrupted run. A non-finite loss,
meta-gradient or chain stops training with :class:`TrainingDivergedError`; the last good
checkpoint is kept untouched.

Under ``torchrun`` (a process group is initialised, world size ``W > 1``) the ``K`` chains
are sharded across ranks (see ``docs/DISTRIBUTED.md``): each rank unrolls its own chains with
its own random stream (:func:`metasampler.distributed.rank_seed`), the losses gather all
chains' positions for the Stein estimates (:mod:`.sharded`), and the parameter gradients
are summed across ranks before every Adam step, so all ranks keep identical nets. The
problem draws and the in-chain chain subset come from a stream shared by all ranks; the
replay pool is per rank (its capacity split across ranks). Rank 0 writes the checkpoint,
which holds every rank's pool and random stream; resume needs the same world size. Only the
default schedule (a combined step per window, chains restarting) is sharded. With ``W = 1``
nothing of this runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .. import distributed
from ..config import ConfigError, TrainConfig
from ..distributed import PeerFailureError
from ..learned.nnsghmc import NNSGHMC
from ..samplers.base import SamplerState
from ..sampling import make_generator
from ..targets import NonFiniteError
from .checkpoint import CheckpointMixin, History, save_checkpoint
from .losses import InChainCollector, combined_loss, cross_chain_loss
from .outer import (
    GradientAccumulator,
    Grads,
    MetaOptimizer,
    add_grads,
    scale_grads,
    sum_across_ranks,
)
from .replay import ReplayPool
from .schedule import TruncationSchedule
from .sharded import ShardedInChainCollector, gather_slices, sharded_cross_chain_loss
from .unroll import WindowSamples, unroll_window

__all__ = [
    "MetaTrainer",
    "TrainSettings",
    "TrainingDivergedError",
    "save_checkpoint",
    "settings_from_config",
]


class TrainingDivergedError(RuntimeError):
    """Meta-training produced a non-finite loss, gradient or chain state."""


# The loop settings are the config schema's ``train`` section (one definition of the fields).
TrainSettings = TrainConfig


def settings_from_config(cfg: Any) -> TrainSettings:
    """A :class:`TrainSettings` from an OmegaConf ``train`` node (or a plain mapping)."""
    values = {k: cfg[k] for k in TrainSettings.__dataclass_fields__ if k in cfg}
    if "adam_betas" in values:
        values["adam_betas"] = [float(b) for b in values["adam_betas"]]
    return TrainSettings(**values)


class MetaTrainer(CheckpointMixin):
    """Trains an :class:`NNSGHMC` on problems drawn from ``problems(epoch, generator)``.

    Args:
        sampler: the sampler to train (its ``eta``/``lr`` is the training step).
        problems: ``(epoch, generator) -> Problem`` (see ``tasks.registry``): a target and
            ``init(n_chains, generator)`` for fresh chains.
        settings: loop settings.
        run_dir: where checkpoints go (``None``: no checkpoints).
        seed: seeds the run's single generator (chains, noise, minibatches, replay). Under
            torchrun each rank also gets its own stream for its chains, derived from ``seed``.
        logger: optional object with ``scalar(tag, value, step)`` (e.g. a RunLogger).
        evaluate: optional ``(sampler, epoch) -> dict[str, float]`` run every ``eval_every``
            epochs (under ``no_grad``).
        progress: show a progress bar.
    """

    def __init__(
        self,
        sampler: NNSGHMC,
        problems: Callable[[int, torch.Generator], Any],
        settings: TrainSettings,
        *,
        run_dir: str | Path | None = None,
        seed: int = 0,
        logger: Any | None = None,
        evaluate: Callable[[NNSGHMC, int], dict[str, float]] | None = None,
        progress: bool = True,
        extra_checkpoint: dict[str, Any] | None = None,
    ) -> None:
        self.sampler = sampler
        self.problems = problems
        self.settings = settings
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.logger = logger
        self.evaluate = evaluate
        self.progress = progress
        self.extra_checkpoint = extra_checkpoint or {}
        self.device = sampler.f_q.head.weight.device
        self.generator = make_generator(seed, self.device)
        # This rank's chains (all of them in a single process). The shared generator above
        # drives what all ranks must agree on (problems, in-chain subset); each rank's chains
        # (initialisation, noise, minibatches, replay) use their own stream.
        self.shard = distributed.chain_shard(settings.n_chains)
        self.world = self.shard.world
        capacity = settings.replay_capacity
        if self.world == 1:
            self.chain_generator = self.generator
        else:
            self.chain_generator = make_generator(self.shard.seed(seed), self.device)
            # Each rank pools its own chains: split the capacity so that the pools together
            # span as many sub-epochs as one process's pool.
            capacity = max(1, distributed.shard_sizes(capacity, self.world)[self.shard.rank])
        self.schedule = TruncationSchedule.from_settings(settings)
        if self.world > 1 and not self.schedule.is_default:
            raise ConfigError(
                "under torchrun only the default truncation schedule is supported: set "
                "train.accumulate, train.step_per_loss and train.continue_chains to false and "
                "train.in_chain_span=window, or run in one process"
            )
        self.outer = MetaOptimizer(
            sampler.parameters(), settings.optimizer_lr, settings.adam_betas, settings.grad_clip
        )
        self.pool = ReplayPool(capacity, settings.replay_prob)
        self.history = History()
        self.epoch = 0  # epochs completed
        self._terms: dict[str, list[float]] = {"cross_chain": [], "in_chain": []}

    # -- training ---------------------------------------------------------------------------
    def train(self) -> History:
        """Run the remaining epochs; returns the history."""
        s = self.settings
        total = (s.epochs - self.epoch) * s.sub_epochs * len(self.schedule.windows())
        show = self.progress and distributed.is_main_process()
        bar = tqdm(total=total, desc="meta-train", disable=not show)
        with bar:
            while self.epoch < s.epochs:
                epoch = self.epoch + 1
                started = time.perf_counter()
                problem = self.problems(epoch, self.generator)
                losses: list[float] = []
                state = None
                for sub in range(s.sub_epochs):
                    if self.schedule.fresh_chains(sub):
                        with self._abort_on_peer_failure(), distributed.failure_guard("starting"):
                            state = self._initial_state(problem)
                    state = self._segment(problem, state, epoch, sub, bar, losses)
                self.epoch = epoch
                self.history.seconds += time.perf_counter() - started
                self._end_epoch(epoch, losses)
        return self.history

    def _end_epoch(self, epoch: int, losses: list[float]) -> None:
        """Log the epoch, evaluate and checkpoint when due."""
        s = self.settings
        mean_loss = sum(losses) / max(len(losses), 1)
        self.history.loss.append(mean_loss)
        self._log("loss/total", mean_loss, epoch)
        for name, values in self._terms.items():
            if values:
                self._log(f"loss/{name}", sum(values) / len(values), epoch)
        self._terms = {"cross_chain": [], "in_chain": []}
        if (
            self.evaluate is not None
            and distributed.is_main_process()  # (its chains are not sharded)
            and s.eval_every
            and (epoch % s.eval_every == 0 or epoch == s.epochs)
        ):
            with torch.no_grad():
                metrics = self.evaluate(self.sampler, epoch)
            self.history.evals.append({"epoch": epoch, **metrics})
            for key, value in metrics.items():
                self._log(f"eval/{key}", value, epoch)
        # Chains restart at every epoch, so an epoch-boundary checkpoint holds all the state.
        if epoch % s.checkpoint_every == 0 or epoch == s.epochs:
            self.save()

    def _initial_state(self, problem: Any) -> SamplerState:
        theta = problem.init(self.shard.size, self.chain_generator)
        state = self.sampler.init(theta, problem.target, self.chain_generator)
        if len(self.pool) > 0 and self.pool.dim == theta.shape[1]:
            theta, momentum, _ = self.pool.draw_initial(theta, state.momentum, self.chain_generator)
            state.theta, state.momentum = theta, momentum
        return state

    def _collector(self) -> InChainCollector | None:
        """The in-chain collector of a segment (a fresh random chain subset)."""
        s = self.settings
        if s.in_chain_weight <= 0:
            return None
        kind = ShardedInChainCollector if self.world > 1 else InChainCollector
        first = self.shard if self.world > 1 else s.n_chains
        return kind(
            first,
            burn_in=s.in_chain_burn_in,
            thinning=s.in_chain_thinning,
            n_select=s.in_chain_chains,
            generator=self.generator,  # shared: every rank draws the same subset
        )

    def _segment(
        self,
        problem: Any,
        state: SamplerState,
        epoch: int,
        sub: int,
        bar: tqdm,
        losses: list[float],
    ) -> SamplerState:
        """One sub-epoch: unroll the segment window by window and update as scheduled."""
        s, schedule = self.settings, self.schedule
        target = problem.target
        collector = self._collector()
        stein = {"bandwidth_factor": s.stein_bandwidth_factor, "ridge": s.stein_ridge}
        start = state.step
        accumulated = GradientAccumulator(self.outer)  # (used when schedule.accumulate)
        keep_graph = collector is not None and schedule.pool_spans_segment
        for length in schedule.windows():
            # (Under torchrun an error on one rank stops every rank at the end of the unroll.)
            with (
                self._abort_on_peer_failure(),
                distributed.failure_guard("unrolling the chains"),
            ):
                try:
                    state, window = unroll_window(
                        self.sampler,
                        state,
                        target,
                        self.chain_generator,
                        length=length,
                        segment_start=start,
                        cross_chain_every=s.cross_chain_every,
                        collector=collector,
                        pool_detached=schedule.pool_spans_segment,
                    )
                except NonFiniteError as err:
                    what = f"a chain diverged ({err}){self._on_rank()}"
                    raise self._diverged(what, epoch, sub) from None
            pooled = collector is not None and collector.n_samples >= 2
            if self.world > 1:
                value = self._sharded_update(window, collector, stein, epoch, sub)
                if value is not None:
                    losses.append(value)
            else:
                n = len(window.positions)
                cross = cross_chain_loss(window.positions, window.grads, **stein) if n else None
                in_chain = collector.loss(**stein) if pooled and schedule.clear_pool else None
                if not schedule.accumulate and (cross is not None or in_chain is not None):
                    terms = {"cross_chain": cross, "in_chain": in_chain}
                    losses.append(self._update(terms, epoch, sub))
                elif schedule.accumulate:
                    # The segment's cross-chain loss is the mean over all its slices: sum each
                    # window's slice surrogates now (freeing its graph unless the in-chain
                    # pool still needs it); the accumulator divides by the count at the end.
                    if cross is not None:
                        retain = keep_graph or in_chain is not None
                        accumulated.add("cross_chain", cross * n, n, retain_graph=retain)
                    if in_chain is not None:
                        accumulated.add("in_chain", in_chain, 1)
            if collector is not None and schedule.clear_pool:
                collector.clear()
            state = state.detach()
            bar.update(1)
            if losses:
                bar.set_postfix(epoch=epoch, loss=f"{losses[-1]:.3g}")
        if schedule.accumulate and self.world == 1:
            if keep_graph and collector.n_samples >= 2:
                accumulated.add("in_chain", collector.loss(**stein), 1)
            if accumulated.sums:
                losses.append(self._apply(*accumulated.means(), epoch, sub))
        if collector is not None:
            collector.clear()
        self.pool.add(state.theta, state.momentum)
        if self.logger is not None and sub == self.settings.sub_epochs - 1:
            self._log_chain_summaries(state, target, epoch)
        return state

    @torch.no_grad()
    def _log_chain_summaries(self, state: SamplerState, target: Any, epoch: int) -> None:
        """Energy of the chains and the learned Q_f / D_f at the final states."""
        self._log("train/energy_mean", float(state.energy.mean()), epoch)
        terms = self.sampler.drift_terms(state.theta, state.momentum, target)
        for name, values in (("Q_f", terms.q), ("D_f", terms.d)):
            self._log(f"nets/{name}_mean", float(values.mean()), epoch)
            self._log(f"nets/{name}_std", float(values.std()), epoch)
            if hasattr(self.logger, "histogram"):
                self.logger.histogram(f"nets/{name}", values, epoch)

    def _update(self, terms: dict[str, Tensor | None], epoch: int, sub: int) -> float:
        """Gradients of the given loss terms at the current parameters, then the step(s)."""
        s = self.settings
        present = {k: t for k, t in terms.items() if t is not None}
        values = {k: float(t.detach()) for k, t in present.items()}
        if self.schedule.step_per_loss:
            names = list(present)
            grads = {
                k: self.outer.gradients(present[k], retain_graph=k != names[-1]) for k in names
            }
        else:
            weights = (s.cross_chain_weight, s.in_chain_weight)
            loss = combined_loss(terms["cross_chain"], terms["in_chain"], weights)
            values = {"total": float(loss.detach()), **values}
            grads = {"total": self.outer.gradients(loss)}
        return self._apply(grads, values, epoch, sub)

    def _apply(
        self, grads: dict[str, Grads | None], values: dict[str, float | None], epoch: int, sub: int
    ) -> float:
        """Log the loss values and take the optimiser step(s) on ``grads``; returns the total.

        ``grads`` holds one entry per loss (``cross_chain``, ``in_chain``) or one ``total``
        (already weighted). Per-loss entries are weighted here and applied as one combined
        step, or as one step each (cross-chain first) when the schedule says so.
        """
        s = self.settings
        weights = {"cross_chain": s.cross_chain_weight, "in_chain": s.in_chain_weight}
        for name in ("cross_chain", "in_chain"):
            if values.get(name) is not None:
                self._terms[name].append(values[name])
        total = values.get("total")
        if total is None:
            total = sum(weights[k] * v for k, v in values.items() if v is not None)
        if not math.isfinite(total):
            raise self._diverged(f"non-finite meta-loss {total}", epoch, sub)
        steps: list[Grads] = []
        if "total" in grads:
            steps = [grads["total"]]
        else:
            weighted = [scale_grads(g, weights[k]) for k, g in grads.items() if g is not None]
            if self.schedule.step_per_loss:
                steps = weighted
            else:
                combined = None
                for g in weighted:
                    combined = add_grads(combined, g)
                steps = [combined]
        for g in steps:
            if not self.outer.step(g):
                raise self._diverged("non-finite meta-gradient", epoch, sub)
        return total

    # -- sharded chains (torchrun) ------------------------------------------------------------
    def _sharded_update(
        self,
        window: WindowSamples,
        collector: ShardedInChainCollector | None,
        stein: dict[str, float],
        epoch: int,
        sub: int,
    ) -> float | None:
        """One window's loss and Adam step with the chains sharded across ranks.

        Collectives first (gathering positions), then the local loss and backward pass in a
        failure guard, then one all-reduce of the gradients with the loss values. Every
        decision (whether a term exists, whether values are finite) is taken on data that is
        identical on all ranks, so the ranks never disagree on which collective comes next.
        The meta-gradient: each rank's loss is its share of the global surrogate and its
        backward pass reaches only its own chains, so the global gradient is the SUM of the
        ranks' gradients (an average would need every share scaled by W).
        """
        s = self.settings
        positions, grads = window.positions, window.grads
        everyone = gather_slices(positions, self.shard) if positions else None
        pool = None
        if collector is not None and collector.n_samples >= 2:
            pool = collector.gather()
        if everyone is None and pool is None:
            return None
        with (
            self._abort_on_peer_failure(),
            distributed.failure_guard("computing the meta-gradient"),
        ):
            cross = in_chain = None
            if everyone is not None:
                cross = sharded_cross_chain_loss(positions, grads, everyone, self.shard, **stein)
            if pool is not None:
                in_chain = collector.sharded_loss(pool, **stein)
            loss = combined_loss(cross, in_chain, (s.cross_chain_weight, s.in_chain_weight))
            local = self.outer.gradients(loss)
        params = self.outer.params
        summed, totals, bad_ranks = sum_across_ranks(
            params, local, [loss, cross, in_chain], self.world, self.shard.rank
        )
        total, cross_value, in_value = totals
        values = {
            "total": total,
            "cross_chain": cross_value if cross is not None else None,
            "in_chain": in_value if in_chain is not None else None,
        }
        if not math.isfinite(total):
            where = f" (from rank {', '.join(map(str, bad_ranks))})" if bad_ranks else ""
            raise self._diverged(f"non-finite meta-loss {total}{where}", epoch, sub)
        return self._apply({"total": summed}, values, epoch, sub)

    @contextmanager
    def _abort_on_peer_failure(self) -> Iterator[None]:
        """Another rank diverged: stop with :class:`TrainingDivergedError` here too."""
        try:
            yield
        except PeerFailureError as err:
            if err.kind in ("TrainingDivergedError", "NonFiniteError"):
                raise TrainingDivergedError(f"rank {err.rank}: {err.detail}") from None
            raise

    def _on_rank(self) -> str:
        return f" on rank {self.shard.rank}" if self.world > 1 else ""

    def _diverged(self, what: str, epoch: int, sub: int) -> TrainingDivergedError:
        where = self.checkpoint_path
        kept = (
            f"the last good checkpoint ({self.epoch} epochs) is kept at {where}"
            if where is not None and where.is_file()
            else "no checkpoint had been written yet"
        )
        return TrainingDivergedError(
            f"meta-training stopped in epoch {epoch}, sub-epoch {sub + 1}: {what}; {kept}. "
            "Lower sampler.eta or train.optimizer_lr, or raise train.grad_clip's strictness."
        )

    def _log(self, tag: str, value: float, step: int) -> None:
        if self.logger is not None:
            self.logger.scalar(tag, value, step)
