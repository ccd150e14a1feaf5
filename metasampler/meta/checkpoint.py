"""Checkpoints of meta-training: what a run depends on, written atomically, read back.

A checkpoint carries its SHA-256 (:func:`metasampler.files.save_checksummed`): an altered or
truncated file is refused on resume (:class:`CheckpointError`), never loaded. Files written
before the checksum existed load with a warning that they cannot be checked. Whatever its
checksum says, a checkpoint's contents are checked before anything is restored
(:func:`check_checkpoint_contents`): the entries and their types, ``epoch`` in
``[0, train.epochs]`` and consistent with the history, and every tensor finite. A write
killed before its rename leaves a temporary file, which the next run removes.

Checkpoints are written at epoch boundaries. Chains restart at every epoch (also with
``continue_chains``, which continues them only across an epoch's sub-epochs), so the nets,
the optimiser, the replay pool, the random streams and the history are everything a run
depends on: ``resume`` continues bit-for-bit like an uninterrupted run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .. import distributed
from ..files import CorruptFileError, load_checksummed, save_checksummed
from ..staging import remove_stale_files

__all__ = [
    "CHECKPOINT_NAME",
    "CheckpointError",
    "RESUMABLE_KEYS",
    "CheckpointMixin",
    "History",
    "check_checkpoint_contents",
    "check_checkpoint_matches",
    "read_checkpoint",
    "remove_interrupted_writes",
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
    """A checkpoint file that cannot be resumed from: unreadable, altered or truncated, contents
    that are not a checkpoint's (wrong entries or types, an epoch out of range, non-finite
    values), or a checkpoint of another run. The message names the file and what is wrong."""


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` with its SHA-256, atomically: never a half-written file."""
    save_checksummed(path, payload)


def read_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The payload of the checkpoint at ``path``, after checking its SHA-256 (its contents are
    checked by :func:`check_checkpoint_contents` when a trainer resumes from it).

    Raises:
        FileNotFoundError: there is no file at ``path``.
        CheckpointError: the file is not a checkpoint, or its bytes differ from those written.
    """
    try:
        return load_checksummed(path, map_location)
    except CorruptFileError as err:
        raise CheckpointError(
            f"{err}: not resumed; start the run again or restore the file"
        ) from None


def remove_interrupted_writes(path: Path) -> list[Path]:
    """Remove the temporary files that checkpoint writes to ``path`` killed before their rename
    left beside it (only those whose process has ended); returns them."""
    return remove_stale_files(path.parent, f".{path.name}.", ".tmp")


def _is_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _check_tensor_dict(value: object, name: str) -> None:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in value.items()
    ):
        raise ValueError(f"{name!r} must map names to tensors, got {_kind(value)}")


def _kind(value: object) -> str:
    return f"a {type(value).__name__}"


def _check_replay(replay: object, name: str) -> None:
    if not isinstance(replay, dict):
        raise ValueError(f"{name!r} must be a dict, got {_kind(replay)}")
    missing = sorted({"capacity", "size", "replay_prob", "theta", "momentum"} - set(replay))
    if missing:
        raise ValueError(f"{name!r} lacks the entries {missing}")
    capacity, size = replay["capacity"], replay["size"]
    if not _is_int(capacity) or capacity < 1:
        raise ValueError(f"{name}['capacity'] must be an integer >= 1, got {capacity!r}")
    if not _is_int(size) or not 0 <= size <= capacity:
        raise ValueError(f"{name}['size'] must be an integer in [0, {capacity}], got {size!r}")
    prob = replay["replay_prob"]
    prob = float(prob) if isinstance(prob, Tensor) and prob.numel() == 1 else prob
    if not _is_real(prob) or not 0.0 <= prob <= 1.0:
        raise ValueError(f"{name}['replay_prob'] must be a number in [0, 1], got {prob!r}")
    theta, momentum = replay["theta"], replay["momentum"]
    if not isinstance(theta, Tensor) or not isinstance(momentum, Tensor):
        raise ValueError(f"{name}['theta'] and {name}['momentum'] must be tensors")
    if theta.ndim != 2 or momentum.shape != theta.shape or theta.shape[0] != size:
        raise ValueError(
            f"{name}['theta'] and ['momentum'] must both have shape (size={size}, D), got "
            f"{tuple(theta.shape)} and {tuple(momentum.shape)}"
        )


def _check_generator(state: object, name: str) -> None:
    if not isinstance(state, Tensor) or state.dtype != torch.uint8 or state.ndim != 1:
        raise ValueError(f"{name!r} must be a random generator's state (a uint8 tensor)")


def _check_history(history: object, epoch: int) -> None:
    if not isinstance(history, dict):
        raise ValueError(f"'history' must be a dict, got {_kind(history)}")
    loss, evals = history.get("loss"), history.get("evals")
    seconds = history.get("seconds", 0.0)
    if not isinstance(loss, list) or not all(_is_real(v) and math.isfinite(v) for v in loss):
        raise ValueError("history['loss'] must be a list of finite numbers (one per epoch)")
    if len(loss) != epoch:
        raise ValueError(
            f"'epoch' is {epoch} but the history holds the losses of {len(loss)} epoch(s)"
        )
    if not isinstance(evals, list) or not all(
        isinstance(e, dict)
        and _is_int(e.get("epoch"))
        and 1 <= e["epoch"] <= epoch
        and all(isinstance(k, str) and _is_real(v) for k, v in e.items())
        for e in evals
    ):
        raise ValueError(
            f"history['evals'] must be a list of dicts of numbers, each with an 'epoch' in "
            f"[1, {epoch}]"
        )
    if not _is_real(seconds) or not 0.0 <= seconds < math.inf:
        raise ValueError(f"history['seconds'] must be a finite number >= 0, got {seconds!r}")


def _check_optimizer(optimizer: object) -> None:
    if (
        not isinstance(optimizer, dict)
        or not isinstance(optimizer.get("state"), dict)
        or not isinstance(optimizer.get("param_groups"), list)
        or not all(isinstance(g, dict) for g in optimizer["param_groups"])
    ):
        raise ValueError(
            "'optimizer' must be an optimiser's state dict ('state' and 'param_groups')"
        )
    for group in optimizer["param_groups"]:
        for key, value in group.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"the optimiser's {key!r} is {value}")


def _non_finite(value: object, name: str) -> str | None:
    """The first tensor under ``value`` (dicts, lists and tuples are searched) holding a NaN or
    an infinity, described; ``None`` if there is none."""
    if isinstance(value, Tensor):
        if (value.is_floating_point() or value.is_complex()) and value.numel():
            bad = int((~torch.isfinite(value)).sum())
            if bad:
                return f"{name} holds {bad} NaN or infinite value(s) of {value.numel()}"
        return None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _non_finite(item, f"{name}[{key!r}]")
        if found is not None:
            return found
    return None


def check_checkpoint_contents(state: Any, epochs: int) -> None:
    """Refuse a payload that is not a complete, finite checkpoint of a run of ``epochs``
    epochs, before anything of it is restored.

    Checked: ``state`` is a dict with every entry a run writes (``epoch``, ``sampler``,
    ``optimizer``, ``average``, ``generator``, ``history`` and ``replay``, or ``world_size``
    and ``ranks`` under torchrun), each of its type; ``epoch`` is an integer in
    ``[0, epochs]`` and the history holds one loss per epoch done; the replay pools' sizes
    fit their capacity; and every floating tensor (nets, optimiser moments, averaged nets,
    replay states) and the losses are finite.

    Raises:
        ValueError: the message says which entry is wrong and how (callers add the file).
    """
    if not isinstance(state, dict):
        raise ValueError(f"it holds {_kind(state)}, not a checkpoint (a dict of the run's state)")
    world = state.get("world_size", 1)
    if not _is_int(world) or world < 1:
        raise ValueError(f"'world_size' must be an integer >= 1, got {world!r}")
    required = ["epoch", "sampler", "optimizer", "average", "generator", "history"]
    required += ["ranks"] if world > 1 else ["replay"]
    missing = [key for key in required if key not in state]
    if missing:
        raise ValueError(f"it lacks the entries {missing}: not a complete checkpoint")
    epoch = state["epoch"]
    if not _is_int(epoch):
        raise ValueError(f"'epoch' must be an integer, got {_kind(epoch)} ({epoch!r})")
    if epoch < 0:
        raise ValueError(f"'epoch' is {epoch}: the epochs done cannot be negative")
    if epoch > epochs:
        raise ValueError(
            f"the checkpoint is after epoch {epoch} but train.epochs is {epochs}; "
            f"set train.epochs >= {epoch} to resume it"
        )
    _check_tensor_dict(state["sampler"], "sampler")
    _check_optimizer(state["optimizer"])
    average = state["average"]
    if average is not None:
        if not isinstance(average, dict) or not _is_int(average.get("started_at")):
            raise ValueError("'average' must be None or a dict with 'started_at' and 'mean'")
        _check_tensor_dict(average.get("mean"), "average.mean")
    _check_generator(state["generator"], "generator")
    if world == 1:
        _check_replay(state["replay"], "replay")
    else:
        ranks = state["ranks"]
        if not isinstance(ranks, list) or len(ranks) != world:
            raise ValueError(f"'ranks' must be a list of {world} per-rank states")
        for rank, entry in enumerate(ranks):
            if not isinstance(entry, dict):
                raise ValueError(f"ranks[{rank}] must be a dict, got {_kind(entry)}")
            _check_replay(entry.get("replay"), f"ranks[{rank}].replay")
            _check_generator(entry.get("generator"), f"ranks[{rank}].generator")
    _check_history(state["history"], epoch)
    for key in ("sampler", "optimizer", "average", "replay", "ranks"):
        found = _non_finite(state.get(key), key)
        if found is not None:
            raise ValueError(
                f"{found}: the run had diverged when it was written, or the file was altered"
            )


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
        current: this run's ``extra_checkpoint``: the checkpoint must hold each of its
            entries; when both hold a ``"config"`` (a plain dict), every key outside
            :data:`RESUMABLE_KEYS` must agree.

    Raises:
        ValueError: the message names the entries of ``current`` the checkpoint lacks, lists
            the differing config keys (saved -> now), the sampler tensors that differ, or
            the epoch overrun.
    """
    lacking = [key for key in current if key not in state]
    if lacking:
        raise ValueError(
            f"it lacks the entries {lacking} that this run records: written by another kind of run"
        )
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
    saved_sampler = state["sampler"]
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

    def load_state_dict(self, state: dict[str, Any], path: str | Path | None = None) -> None:
        """Restore the run from a checkpoint's payload ``state`` (read from ``path``, which
        messages name), after checking it (:func:`check_checkpoint_contents`,
        :func:`check_checkpoint_matches`).

        Raises:
            CheckpointError: the payload is not a checkpoint of this run (the message names
                the file and what is wrong).
        """
        where = path if path is not None else "the checkpoint"
        try:
            check_checkpoint_contents(state, self.settings.epochs)
            saved_world = state.get("world_size", 1)
            if saved_world != self.world:
                raise ValueError(
                    f"the checkpoint was written by {saved_world} process(es) but this run has "
                    f"{self.world}: resume with the same number (torchrun --nproc_per_node="
                    f"{saved_world} ..., or no torchrun for 1)"
                )
            check_checkpoint_matches(
                state, self.sampler.state_dict(), self.settings.epochs, self.extra_checkpoint
            )
        except CheckpointError:
            raise
        except ValueError as err:
            raise CheckpointError(f"cannot resume from {where}: {err}") from None
        part = "sampler"
        try:
            self.sampler.load_state_dict(state["sampler"])
            part = "optimizer"
            self.outer.load_state_dict(state["optimizer"])
            self._check_optimizer_shapes()
            part = "average"
            self.average.load_state_dict(state["average"], self.sampler)
            part = "replay"
            if self.world == 1:
                self.pool.load_state_dict(state["replay"])
            else:
                mine = state["ranks"][self.shard.rank]
                replay = dict(mine["replay"])
                for key in ("theta", "momentum"):
                    replay[key] = replay[key].to(self.device)
                self.pool.load_state_dict(replay)
                part = "ranks"
                self.chain_generator.set_state(mine["generator"].cpu())
            part = "generator"
            self.generator.set_state(state["generator"])
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as err:
            raise CheckpointError(
                f"cannot resume from {where}: its {part!r} entry does not fit this run "
                f"({type(err).__name__}: {str(err).strip()[:300]})"
            ) from None
        saved = state["history"]
        self.history = History(
            list(saved["loss"]), list(saved["evals"]), float(saved.get("seconds", 0.0))
        )
        self.epoch = int(state["epoch"])

    def _check_optimizer_shapes(self) -> None:
        """The optimiser's per-parameter moments have their parameter's shape (Adam does not
        check them when loading; a wrong shape would fail in the first update)."""
        for group in self.outer.adam.param_groups:
            for param in group["params"]:
                for name, value in self.outer.adam.state.get(param, {}).items():
                    if isinstance(value, Tensor) and value.ndim and value.shape != param.shape:
                        raise ValueError(
                            f"moment {name!r} has shape {tuple(value.shape)}, its parameter "
                            f"{tuple(param.shape)}"
                        )

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
        needs the run directory); every rank must call this. Temporary files of checkpoint
        writes that were killed are removed first.

        Raises:
            FileNotFoundError: there is no checkpoint at ``path``.
            CheckpointError: the file is unreadable, altered, truncated, not a checkpoint,
                has contents out of range or non-finite, or belongs to another run (another
                config, architecture or world size); the message names the file and what
                is wrong. Then start a new trainer: one refused while its tensors were being
                restored may hold part of them.
        """
        path = Path(path) if path is not None else self.checkpoint_path
        outcome: dict[str, Any] | Exception | None = None
        if distributed.is_main_process():
            if path is not None:
                remove_interrupted_writes(path)
            outcome = self._read_checkpoint(path)
        outcome = distributed.broadcast_object(outcome)
        if isinstance(outcome, Exception):
            raise outcome
        self.load_state_dict(outcome, path)
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
