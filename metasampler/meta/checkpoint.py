"""Checkpoints of meta-training: what a run depends on, written atomically, read back.

A checkpoint carries its SHA-256 (:func:`metasampler.files.save_checksummed`): an altered or
truncated file is refused on resume (:class:`CheckpointError`), never loaded. Files written
before the checksum existed load with a warning that they cannot be checked.

Checkpoints are written at epoch boundaries. Chains restart at every epoch (also with
``continue_chains``, which continues them only across an epoch's sub-epochs), so the nets,
the optimiser, the replay pool, the random streams and the history are everything a run
depends on: ``resume`` continues bit-for-bit like an uninterrupted run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .. import distributed
from ..files import CorruptFileError, load_checksummed, save_checksummed

__all__ = [
    "CHECKPOINT_NAME",
    "CheckpointError",
    "RESUMABLE_KEYS",
    "CheckpointMixin",
    "History",
    "check_checkpoint_matches",
    "read_checkpoint",
    "save_checkpoint",
]

CHECKPOINT_NAME = "checkpoint.pt"


@dataclass
class History:
    """Per-epoch mean loss and evaluation metrics (kept in checkpoints)."""

    loss: list[float] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0  # training wall-clock over all epochs, across resumes


def _to_cpu(state: dict[str, Any]) -> dict[str, Any]:
    """Tensors of a flat state dict moved to the CPU (to send them to another rank)."""
    return {k: v.cpu() if isinstance(v, Tensor) else v for k, v in state.items()}


class CheckpointError(CorruptFileError):
    """A checkpoint file that cannot be resumed from: unreadable, altered or truncated."""


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` with its SHA-256, atomically: never a half-written file."""
    save_checksummed(path, payload)


def read_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The payload of the checkpoint at ``path``, after checking its SHA-256.

    Raises:
        CheckpointError: the file is not a checkpoint, or its bytes differ from those written.
    """
    try:
        return load_checksummed(path, map_location)
    except CorruptFileError as err:
        raise CheckpointError(
            f"{err}: not resumed; start the run again or restore the file"
        ) from err


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


class CheckpointMixin:
    """Checkpoint methods of :class:`~metasampler.meta.trainer.MetaTrainer` (which holds
    ``sampler``, ``settings``, ``outer``, ``average``, ``pool``, ``generator``,
    ``chain_generator``, ``history``, ``epoch``, ``world``, ``shard``, ``run_dir``, ``device``
    and ``extra_checkpoint``)."""

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
            "optimizer": self.outer.state_dict(),
            "average": self.average.state_dict(),
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
        self.outer.load_state_dict(state["optimizer"])
        self.average.load_state_dict(state.get("average"), self.sampler)
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
            return read_checkpoint(path, device)
        except CheckpointError as err:
            return err
