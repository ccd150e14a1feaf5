"""Meta-training of NNSGHMC by truncated back-propagation through time (004 §3.3, SPEC §4).

Loop structure::

    for epoch in epochs:                       # a (possibly new) training problem per epoch
        for sub_epoch in sub_epochs:           # chains restart: replay pool or fresh init
            for window in windows:             # truncated BPTT: unroll `unroll` steps,
                unroll the K chains              #   collect (theta_t, grad Ũ(theta_t)) pairs
                loss = w_cross * cross-chain + w_in * in-chain surrogate
                Adam step on the nets (global-norm clipping); detach the state
            final (theta, p) states -> replay pool

A step evaluates ``grad Ũ`` at the position it starts from, so the pair for position
``theta_t`` becomes available one step later (``state.grad``); the last position of a window is
paired in the next window, where it is detached and carries no meta-gradient.

Checkpoints are written atomically at epoch boundaries (every ``checkpoint_every`` epochs and
at the end) and hold everything a run depends on: net weights, optimiser, replay pool, the
run's random generator and the history, so ``resume`` continues bit-for-bit like an
uninterrupted run. A non-finite loss, meta-gradient or chain stops training with
:class:`TrainingDivergedError`; the last good checkpoint is kept untouched.

Under ``torchrun`` (a process group is initialised, world size ``W > 1``) the ``K`` chains
are sharded across ranks (see ``docs/DISTRIBUTED.md``): each rank unrolls its own chains with
its own random stream (:func:`metasampler.distributed.rank_seed`), the losses gather all
chains' positions for the Stein estimates (:mod:`.sharded`), and the parameter gradients
are summed across ranks before every Adam step, so all ranks keep identical nets. The
problem draws and the in-chain chain subset come from a stream shared by all ranks; the
replay pool is per rank (its capacity split across ranks). Rank 0 writes the checkpoint,
which holds every rank's pool and random stream; resume needs the same world size. With
``W = 1`` nothing of this runs: the single-process code path is unchanged.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .. import distributed
from ..config import TrainConfig
from ..distributed import PeerFailureError
from ..driver import make_generator
from ..learned.nnsghmc import NNSGHMC
from ..samplers.base import SamplerState
from ..targets import NonFiniteError
from .losses import InChainCollector, combined_loss, cross_chain_loss
from .replay import ReplayPool
from .sharded import ShardedInChainCollector, gather_slices, sharded_cross_chain_loss

__all__ = [
    "MetaTrainer",
    "TrainSettings",
    "TrainingDivergedError",
    "save_checkpoint",
    "settings_from_config",
]

CHECKPOINT_NAME = "checkpoint.pt"


class TrainingDivergedError(RuntimeError):
    """Meta-training produced a non-finite loss, gradient or chain state."""


# The loop settings are the config schema's ``train`` section (one definition of the fields).
TrainSettings = TrainConfig


def settings_from_config(cfg: Any) -> TrainSettings:
    """A :class:`TrainSettings` from an OmegaConf ``train`` node (or a plain mapping)."""
    return TrainSettings(**{k: cfg[k] for k in TrainSettings.__dataclass_fields__})


@dataclass
class History:
    """Per-epoch mean loss and evaluation metrics (kept in checkpoints)."""

    loss: list[float] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0  # training wall-clock over all epochs, across resumes


def _to_cpu(state: dict[str, Any]) -> dict[str, Any]:
    """Tensors of a flat state dict moved to the CPU (to send them to another rank)."""
    return {k: v.cpu() if isinstance(v, Tensor) else v for k, v in state.items()}


#: Config keys a resumed run may change: where and how it runs, how it reports, and
#: ``train.epochs`` (to extend a finished run). Everything else shapes the run itself.
RESUMABLE_KEYS = (
    "name",
    "out_dir",
    "device",
    "threads",
    "progress",
    "distributed.",
    "eval.",
    "train.epochs",
    "train.checkpoint_every",
    "train.eval_every",
)


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}{key}." if isinstance(value, dict) else prefix + key))
    return flat


def check_checkpoint_matches(
    state: dict[str, Any],
    sampler_state: dict[str, Tensor],
    epochs: int,
    current: dict[str, Any],
) -> None:
    """Refuse to resume from a checkpoint of another run, naming what differs.

    Args:
        state: the loaded checkpoint.
        sampler_state: this run's ``sampler.state_dict()`` (names and shapes to match).
        epochs: this run's ``train.epochs``; the checkpoint must not be past it.
        current: this run's ``extra_checkpoint``; when it and the checkpoint both hold a
            ``"config"`` (a plain dict), every key outside :data:`RESUMABLE_KEYS` must agree.

    Raises:
        ValueError: the message lists the differing config keys (saved -> now), the sampler
            tensors that differ, or the epoch overrun.
    """
    saved_cfg, now_cfg = state.get("config"), current.get("config")
    if isinstance(saved_cfg, dict) and isinstance(now_cfg, dict):
        old, new = _flatten(saved_cfg), _flatten(now_cfg)
        differing = [
            f"{key}: {old.get(key, '<absent>')!r} -> {new.get(key, '<absent>')!r}"
            for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key)
            and not any(key == k or (k.endswith(".") and key.startswith(k)) for k in RESUMABLE_KEYS)
        ]
        if differing:
            raise ValueError(
                "the checkpoint was written by a run with another config; differing keys "
                "(checkpoint -> now): " + "; ".join(differing)
            )
    saved_sampler = state.get("sampler", {})
    names = sorted(set(saved_sampler) ^ set(sampler_state))
    names += [
        f"{n} {tuple(saved_sampler[n].shape)} -> {tuple(sampler_state[n].shape)}"
        for n in sorted(set(saved_sampler) & set(sampler_state))
        if tuple(saved_sampler[n].shape) != tuple(sampler_state[n].shape)
    ]
    if names:
        raise ValueError(
            "the checkpoint holds a sampler of another architecture; differing tensors "
            "(checkpoint -> now): " + "; ".join(names)
        )
    done = int(state.get("epoch", 0))
    if done > epochs:
        raise ValueError(
            f"the checkpoint is after epoch {done} but train.epochs is {epochs}; "
            f"set train.epochs >= {done} to resume it"
        )


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """``torch.save`` to a temporary file, then an atomic rename: never a half-written file."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


class MetaTrainer:
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
        self.optimizer = torch.optim.Adam(sampler.parameters(), lr=settings.optimizer_lr)
        self.pool = ReplayPool(capacity, settings.replay_prob)
        self.history = History()
        self.epoch = 0  # epochs completed
        self._terms: dict[str, list[float]] = {"cross_chain": [], "in_chain": []}

    # -- checkpoints ------------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path | None:
        return None if self.run_dir is None else self.run_dir / CHECKPOINT_NAME

    def state_dict(self) -> dict[str, Any]:
        """Everything the run depends on. Under torchrun a collective (call it on every rank):
        ``world_size`` and ``ranks`` (every rank's replay pool and chain stream) replace
        ``replay``."""
        state = {
            "epoch": self.epoch,
            "sampler": self.sampler.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "replay": self.pool.state_dict(),
            "generator": self.generator.get_state(),
            "history": {
                "loss": self.history.loss,
                "evals": self.history.evals,
                "seconds": self.history.seconds,
            },
            **self.extra_checkpoint,
        }
        if self.world > 1:
            del state["replay"]
            local = {
                "replay": _to_cpu(self.pool.state_dict()),
                "generator": self.chain_generator.get_state().cpu(),
            }
            state["world_size"] = self.world
            state["ranks"] = distributed.gather_objects(local)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved_world = int(state.get("world_size", 1))
        if saved_world != self.world:
            raise ValueError(
                f"the checkpoint was written by {saved_world} process(es) but this run has "
                f"{self.world}: resume with the same number (torchrun --nproc_per_node="
                f"{saved_world} ..., or no torchrun for 1)"
            )
        check_checkpoint_matches(
            state, self.sampler.state_dict(), self.settings.epochs, self.extra_checkpoint
        )
        self.sampler.load_state_dict(state["sampler"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.world == 1:
            self.pool.load_state_dict(state["replay"])
        else:
            mine = state["ranks"][self.shard.rank]
            replay = dict(mine["replay"])
            for key in ("theta", "momentum"):
                replay[key] = replay[key].to(self.device)
            self.pool.load_state_dict(replay)
            self.chain_generator.set_state(mine["generator"].cpu())
        self.generator.set_state(state["generator"])
        saved = state["history"]
        self.history = History(
            list(saved["loss"]), list(saved["evals"]), float(saved.get("seconds", 0.0))
        )
        self.epoch = int(state["epoch"])

    def save(self) -> None:
        """Write the checkpoint (rank 0 only; under torchrun every rank must call it)."""
        if self.checkpoint_path is not None:
            state = self.state_dict()
            if distributed.is_main_process():
                self.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
                save_checkpoint(self.checkpoint_path, state)

    def resume(self, path: str | Path | None = None) -> int:
        """Load the checkpoint (default: ``run_dir/checkpoint.pt``); returns epochs done.

        Under torchrun rank 0 reads the file and sends it to the others (so only rank 0
        needs the run directory); every rank must call this.
        """
        path = Path(path) if path is not None else self.checkpoint_path
        outcome: dict[str, Any] | Exception | None = None
        if distributed.is_main_process():
            outcome = self._read_checkpoint(path)
        outcome = distributed.broadcast_object(outcome)
        if isinstance(outcome, Exception):
            raise outcome
        self.load_state_dict(outcome)
        return self.epoch

    def _read_checkpoint(self, path: Path | None) -> dict[str, Any] | Exception:
        if path is None or not path.is_file():
            return FileNotFoundError(f"no checkpoint to resume from at {path}")
        # (Other ranks get rank 0's copy: load it on the CPU, each maps it to its device.)
        device = self.device if self.world == 1 else "cpu"
        try:
            return torch.load(path, map_location=device, weights_only=True)
        except Exception as err:  # corrupted / truncated / not a checkpoint
            error = ValueError(f"{path} is not a readable metasampler checkpoint: {err}")
            error.__cause__ = err
            return error

    # -- training ---------------------------------------------------------------------------
    def train(self) -> History:
        """Run the remaining epochs; returns the history."""
        s = self.settings
        windows = math.ceil(s.steps_per_sub_epoch / s.unroll)
        total = (s.epochs - self.epoch) * s.sub_epochs * windows
        show = self.progress and distributed.is_main_process()
        bar = tqdm(total=total, desc="meta-train", disable=not show)
        with bar:
            while self.epoch < s.epochs:
                epoch = self.epoch + 1
                started = time.perf_counter()
                problem = self.problems(epoch, self.generator)
                losses = []
                for sub in range(s.sub_epochs):
                    losses.extend(self._sub_epoch(problem, epoch, sub, bar))
                self.epoch = epoch
                self.history.seconds += time.perf_counter() - started
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
                if epoch % s.checkpoint_every == 0 or epoch == s.epochs:
                    self.save()
        return self.history

    def _initial_state(self, problem: Any) -> SamplerState:
        theta = problem.init(self.shard.size, self.chain_generator)
        state = self.sampler.init(theta, problem.target, self.chain_generator)
        if len(self.pool) > 0 and self.pool.dim == theta.shape[1]:
            theta, momentum, _ = self.pool.draw_initial(theta, state.momentum, self.chain_generator)
            state.theta, state.momentum = theta, momentum
        return state

    def _sub_epoch(self, problem: Any, epoch: int, sub: int, bar: tqdm) -> list[float]:
        s = self.settings
        target = problem.target
        with self._abort_on_peer_failure(), distributed.failure_guard("starting chains"):
            state = self._initial_state(problem)
        collector = None
        if s.in_chain_weight > 0 and self.world > 1:
            collector = ShardedInChainCollector(
                self.shard,
                burn_in=s.in_chain_burn_in,
                thinning=s.in_chain_thinning,
                n_select=s.in_chain_chains,
                generator=self.generator,  # shared: every rank draws the same subset
            )
        elif s.in_chain_weight > 0:
            collector = InChainCollector(
                s.n_chains,
                burn_in=s.in_chain_burn_in,
                thinning=s.in_chain_thinning,
                n_select=s.in_chain_chains,
                generator=self.generator,
            )
        stein = {"bandwidth_factor": s.stein_bandwidth_factor, "ridge": s.stein_ridge}
        losses = []
        done = 0
        while done < s.steps_per_sub_epoch:
            length = min(s.unroll, s.steps_per_sub_epoch - done)
            positions: list[Tensor] = []
            grads: list[Tensor] = []
            # (Under torchrun an error on one rank stops every rank at the end of the unroll.)
            with (
                self._abort_on_peer_failure(),
                distributed.failure_guard("unrolling the chains"),
            ):
                for _ in range(length):
                    previous = state.theta
                    try:
                        state = self.sampler.step(state, target, self.chain_generator)
                    except NonFiniteError as err:
                        what = f"a chain diverged ({err}){self._on_rank()}"
                        raise self._diverged(what, epoch, sub) from None
                    t = state.step - 1  # ``previous`` is the position after step t
                    if t == done:  # the window's first position is detached: no meta-gradient
                        continue
                    if s.cross_chain_every and t % s.cross_chain_every == 0:
                        positions.append(previous)
                        grads.append(state.grad)
                    if collector is not None:
                        collector.collect(t, previous, state.grad)
            done += length
            if self.world > 1:
                value = self._sharded_update(positions, grads, collector, stein, epoch, sub)
                if value is not None:
                    losses.append(value)
            else:
                cross = cross_chain_loss(positions, grads, **stein) if positions else None
                in_chain = None
                if collector is not None and collector.n_samples >= 2:
                    in_chain = collector.loss(**stein)
                for name, term in (("cross_chain", cross), ("in_chain", in_chain)):
                    if term is not None:
                        self._terms[name].append(float(term.detach()))
                if cross is not None or in_chain is not None:
                    weights = (s.cross_chain_weight, s.in_chain_weight)
                    loss = combined_loss(cross, in_chain, weights)
                    losses.append(self._update(loss, epoch, sub))
            if collector is not None:
                collector.clear()
            state = state.detach()
            bar.update(1)
            if losses:
                bar.set_postfix(epoch=epoch, loss=f"{losses[-1]:.3g}")
        self.pool.add(state.theta, state.momentum)
        if self.logger is not None and sub == self.settings.sub_epochs - 1:
            self._log_chain_summaries(state, target, epoch)
        return losses

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

    def _update(self, loss: Tensor, epoch: int, sub: int) -> float:
        value = float(loss.detach())
        if not math.isfinite(value):
            raise self._diverged(f"non-finite meta-loss {value}", epoch, sub)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return self._step_optimizer(epoch, sub, value)

    def _step_optimizer(self, epoch: int, sub: int, value: float) -> float:
        """Clip, check and apply the gradients in ``.grad``; returns ``value``."""
        params = [p for p in self.sampler.parameters() if p.grad is not None]
        if self.settings.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.settings.grad_clip)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
        if not torch.isfinite(norm):
            raise self._diverged("non-finite meta-gradient", epoch, sub)
        self.optimizer.step()
        return value

    # -- sharded chains (torchrun) ------------------------------------------------------------
    def _sharded_update(
        self,
        positions: list[Tensor],
        grads: list[Tensor],
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
        """
        s = self.settings
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
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        # The meta-gradient: each rank's loss is its share of the global surrogate and its
        # backward pass reaches only its own chains, so the global gradient is the SUM of the
        # ranks' gradients (an average would need every share scaled by W). One explicit
        # all-reduce per window rather than DistributedDataParallel: DDP reduces after a
        # single forward/backward of a module, while here the "forward" is a whole unrolled
        # window of sampler steps plus collectives, and the loss values and a has-gradient
        # flag per parameter travel in the same buffer (all ranks then take the same
        # decisions). float64: a sum of a few float32 values is exact in float64, so the
        # result does not depend on the reduction order (identical and reproducible).
        params = list(self.sampler.parameters())
        f64 = {"dtype": torch.float64, "device": self.device}
        pieces = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(**f64)
            for p in params
        ]
        flags = torch.tensor([float(p.grad is not None) for p in params], **f64)
        scalars = [
            torch.zeros(1, **f64) if t is None else t.detach().reshape(1).to(**f64)
            for t in (loss, cross, in_chain)
        ]
        bad = torch.zeros(self.world, **f64)  # which ranks' shares are not finite
        bad[self.shard.rank] = float(not math.isfinite(float(scalars[0])))
        buffer = distributed.all_reduce_sum(torch.cat([*pieces, flags, bad, *scalars]))
        offset = 0
        for p in params:
            p.grad = buffer[offset : offset + p.numel()].view_as(p).to(p.dtype)
            offset += p.numel()
        for p, flag in zip(params, buffer[offset : offset + len(params)].tolist(), strict=True):
            if flag == 0:  # no rank's loss reached it: leave it out as one process would
                p.grad = None
        offset += len(params)
        bad_ranks = [r for r, b in enumerate(buffer[offset : offset + self.world].tolist()) if b]
        total, cross_value, in_value = buffer[-3:].tolist()
        for name, term, value in (
            ("cross_chain", cross, cross_value),
            ("in_chain", in_chain, in_value),
        ):
            if term is not None:
                self._terms[name].append(value)
        if not math.isfinite(total):
            where = f" (from rank {', '.join(map(str, bad_ranks))})" if bad_ranks else ""
            raise self._diverged(f"non-finite meta-loss {total}{where}", epoch, sub)
        return self._step_optimizer(epoch, sub, total)

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
