"""Meta-training of NNSGHMC by truncated back-propagation through time (Gong et al. 2019,
§3.3; docs/METHOD.md §4).

Loop structure (the decisions come from :class:`.schedule.TruncationSchedule`)::

    for epoch in epochs:                       # a (possibly new) training problem per epoch,
                                               #   optionally a step drawn from a range
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from .. import distributed
from ..config import ConfigError, TrainConfig, check_step_scale_range
from ..learned.nnsghmc import NNSGHMC
from ..samplers.base import SamplerState
from ..sampling import make_generator
from ..targets import NonFiniteError
from .averaging import NetAverage
from .checkpoint import CheckpointMixin, History, remove_interrupted_writes, save_checkpoint
from .divergence import NonFiniteLoss, TrainingDivergedError, abort_on_peer_failure, diverged
from .heldout import HeldOutPredictive
from .losses import InChainCollector
from .outer import GradientAccumulator, MetaOptimizer
from .replay import ReplayPool
from .report import TrainingReport
from .schedule import TruncationSchedule
from .sharded import ShardedInChainCollector
from .unroll import unroll_window
from .update import MetaUpdate
from .virial import TemperatureLoss

__all__ = [
    "MetaTrainer",
    "TrainingDivergedError",
    "save_checkpoint",
]


class MetaTrainer(CheckpointMixin):
    """Trains an :class:`NNSGHMC` on problems drawn from ``problems(epoch, generator)``.

    The parts: :func:`.unroll.unroll_window` runs the chains, :class:`.update.MetaUpdate`
    turns windows into optimiser steps, :class:`.checkpoint.CheckpointMixin` saves and
    resumes, :class:`.report.TrainingReport` logs; this class wires them along the schedule.

    Args:
        sampler: the sampler to train (its ``eta``/``lr`` is the training step).
        problems: ``(epoch, generator) -> Problem`` (see ``tasks.registry``): a target and
            ``init(n_chains, generator)`` for fresh chains.
        settings: loop settings (the config's ``train`` section).
        run_dir: where checkpoints go (``None``: no checkpoints).
        seed: seeds the run's single generator (chains, noise, minibatches, replay). Under
            torchrun each rank also gets its own stream for its chains, derived from ``seed``.
        logger: optional object with ``scalar(tag, value, step)`` (e.g. a RunLogger).
        evaluate: optional ``(sampler, epoch) -> dict[str, float]`` run every ``eval_every``
            epochs (under ``no_grad``).
        progress: show a progress bar.
        extra_checkpoint: more entries for the checkpoint (checked to match on resume).
    """

    def __init__(
        self,
        sampler: NNSGHMC,
        problems: Callable[[int, torch.Generator], Any],
        settings: TrainConfig,
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
        self.report = TrainingReport(logger)
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
        check_step_scale_range(settings.step_scale_range)
        self.schedule = TruncationSchedule.from_settings(settings)
        if self.world > 1 and not self.schedule.is_default:
            raise ConfigError(
                "under torchrun only the default truncation schedule is supported: set "
                "train.accumulate, train.step_per_loss and train.continue_chains to false and "
                "train.in_chain_span=window, or run in one process"
            )
        for name in ("heldout_weight", "temperature_weight"):
            if self.world > 1 and getattr(settings, name) > 0:
                raise ConfigError(f"train.{name} > 0 is not sharded: run in one process")
        self.outer = MetaOptimizer(
            sampler.parameters(), settings.optimizer_lr, settings.adam_betas, settings.grad_clip
        )
        self.update = MetaUpdate(self.outer, settings, self.schedule, self.shard)
        self.pool = ReplayPool(capacity, settings.replay_prob)
        self.average = NetAverage(settings.average_last, settings.epochs)
        self.history = History()
        self.epoch = 0  # epochs completed
        self.step_scale = 1.0  # this epoch's multiplier on the step (train.step_scale_range)
        self.slice_losses: dict[str, Any] = {}  # this epoch's held-out and temperature losses

    # -- training ---------------------------------------------------------------------------
    def train(self) -> History:
        """Run the remaining epochs; returns the history. Temporary files that killed
        checkpoint writes left in the run directory are removed first."""
        s = self.settings
        if self.checkpoint_path is not None and distributed.is_main_process():
            remove_interrupted_writes(self.checkpoint_path)
        total = (s.epochs - self.epoch) * s.sub_epochs * len(self.schedule.windows())
        show = self.progress and distributed.is_main_process()
        bar = tqdm(total=total, desc="meta-train", disable=not show)
        with bar:
            while self.epoch < s.epochs:
                epoch = self.epoch + 1
                started = time.perf_counter()
                problem = self.problems(epoch, self.generator)
                self.step_scale = self._draw_step_scale(epoch)
                self.slice_losses = self._slice_losses(problem)
                losses: list[float] = []
                state = collector = None
                for sub in range(s.sub_epochs):
                    if self.schedule.fresh_chains(sub):
                        with abort_on_peer_failure(), distributed.failure_guard("starting"):
                            state = self._initial_state(problem)
                    if self.schedule.fresh_pool(sub):
                        collector = self._collector()
                    try:
                        state = self._segment(problem, state, collector, (epoch, sub), bar, losses)
                    except NonFiniteLoss as err:
                        raise self._diverged(str(err), epoch, sub) from None
                self.epoch = epoch
                self.history.seconds += time.perf_counter() - started
                self._end_epoch(epoch, losses)
        return self.history

    def _end_epoch(self, epoch: int, losses: list[float]) -> None:
        """Log the epoch, evaluate and checkpoint when due."""
        s = self.settings
        self.history.loss.append(self.report.epoch_losses(epoch, losses, self.update.take_terms()))
        if (
            self.evaluate is not None
            and distributed.is_main_process()  # (its chains are not sharded)
            and s.eval_every
            and (epoch % s.eval_every == 0 or epoch == s.epochs)
        ):
            with torch.no_grad():
                metrics = self.evaluate(self.sampler, epoch)
            self.history.evals.append({"epoch": epoch, **metrics})
            self.report.evaluation(metrics, epoch)
        self.average.end_epoch(self.sampler, epoch)
        # Chains restart at every epoch, so an epoch-boundary checkpoint holds all the state.
        if epoch % s.checkpoint_every == 0 or epoch == s.epochs:
            self.save()

    def final_sampler(self) -> NNSGHMC:
        """The sampler to export: the nets averaged over the last ``train.average_last``
        epochs (:mod:`.averaging`), or the live sampler when that is 0."""
        return self.average.result(self.sampler)

    def _draw_step_scale(self, epoch: int) -> float:
        """The epoch's multiplier on the step ``eta``, log-uniform in ``train.step_scale_range``.

        A sampler trained at one step learns the trade-off of that step, and its step-dependent
        inputs (the stiffness ``log(eta sqrt(V))``) see only that step's values; users tune the
        step at test over a factor of several. Without a range nothing is drawn, so runs
        without it keep their random stream."""
        span = self.settings.step_scale_range
        if not span:
            return 1.0
        low, high = math.log(span[0]), math.log(span[1])
        draw = torch.rand((), generator=self.generator, device=self.generator.device)
        scale = math.exp(low + (high - low) * float(draw))
        self.report.scalar("train/step_scale", scale, epoch)
        return scale

    def _initial_state(self, problem: Any) -> SamplerState:
        theta = problem.init(self.shard.size, self.chain_generator)
        state = self.sampler.init(theta, problem.target, self.chain_generator)
        state.eta = state.eta * self.step_scale  # (the chains carry their step)
        if len(self.pool) > 0 and self.pool.dim == theta.shape[1]:
            theta, momentum, _ = self.pool.draw_initial(theta, state.momentum, self.chain_generator)
            state.theta, state.momentum = theta, momentum
        return state

    def _slice_losses(self, problem: Any) -> dict[str, Any]:
        """The losses of the cross-chain slices beside the ELBO's, by term name: those whose
        weight is above 0."""
        losses: dict[str, Any] = {}
        if self.settings.heldout_weight > 0:
            losses["heldout"] = self._heldout(problem)
        if self.settings.temperature_weight > 0:
            losses["temperature"] = TemperatureLoss(
                problem.target, self.generator, self.settings.temperature_burn_in
            )
        return losses

    def _heldout(self, problem: Any) -> HeldOutPredictive:
        """The held-out predictive loss on ``problem``'s validation split."""
        data = getattr(problem, "data", None)
        log_likelihood = getattr(problem.target, "log_likelihood", None)
        if data is None or log_likelihood is None or len(getattr(data, "y_val", ())) == 0:
            raise ConfigError(
                f"train.heldout_weight > 0 needs a Bayesian task with a validation split; "
                f"{problem.name} has none: set train.heldout_weight=0"
            )
        return HeldOutPredictive(
            log_likelihood, data.x_val, data.y_val, self.settings.heldout_batch, self.generator
        )

    def _collector(self) -> InChainCollector | None:
        """A fresh in-chain collector (a new random chain subset), for a segment or an epoch."""
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
        collector: InChainCollector | None,
        when: tuple[int, int],
        bar: tqdm,
        losses: list[float],
    ) -> SamplerState:
        """One sub-epoch ``when = (epoch, sub)``: unroll the segment window by window and
        update as scheduled."""
        schedule = self.schedule
        epoch, sub = when
        start = state.step
        accumulating = schedule.accumulate and self.world == 1
        accumulated = GradientAccumulator(self.outer) if accumulating else None
        keep_graph = collector is not None and schedule.pool_spans_segment
        for length in schedule.windows():
            # (Under torchrun an error on one rank stops every rank at the end of the unroll.)
            with abort_on_peer_failure(), distributed.failure_guard("unrolling the chains"):
                try:
                    state, window = unroll_window(
                        self.sampler,
                        state,
                        problem.target,
                        self.chain_generator,
                        length=length,
                        segment_start=start,
                        cross_chain_every=self.settings.cross_chain_every,
                        collector=collector,
                        pool_detached=schedule.pool_spans_segment,
                    )
                except NonFiniteError as err:
                    what = f"a chain diverged ({err}){self._on_rank()}"
                    raise self._diverged(what, epoch, sub) from None
            value = self.update.window(
                window, collector, accumulated, keep_graph, self.slice_losses
            )
            if value is not None:
                losses.append(value)
            if collector is not None and schedule.clear_pool:
                collector.clear()
            state = state.detach()
            bar.update(1)
            if losses:
                bar.set_postfix(epoch=epoch, loss=f"{losses[-1]:.3g}")
        if accumulated is not None:
            value = self.update.end_segment(accumulated, collector, keep_graph)
            if value is not None:
                losses.append(value)
        if collector is not None and schedule.pool_spans_epoch:
            collector.retire()  # the epoch's later segments still see its samples
        elif collector is not None:
            collector.clear()
        self.pool.add(state.theta, state.momentum)
        if sub == self.settings.sub_epochs - 1:
            self.report.chain_summaries(self.sampler, state, problem.target, epoch)
        return state

    def _on_rank(self) -> str:
        return f" on rank {self.shard.rank}" if self.world > 1 else ""

    def _diverged(self, what: str, epoch: int, sub: int) -> TrainingDivergedError:
        return diverged(what, epoch, sub, self.epoch, self.checkpoint_path)
