"""The methods of an evaluation that finished, kept so that an interrupted run can resume.

An evaluation on a CPU runs for an hour or more, one method after another. ``evaluate.py``
stores each method as soon as it finishes (its part of ``results.json``, its seeds' runs and
its TensorBoard logs) in ``<out_dir>/.<name>.finished/``, one checksummed file per method
(:func:`metasampler.files.save_checksummed`), under the run's key: the config, the sampler
file's bytes and the versions of torch and metasampler. ``evaluate.py --resume`` takes back
the methods stored under the same key and runs the others, so the published result is the
one an uninterrupted run gives (the same seeds, the same numbers); publishing it removes the
directory. Resuming under another key, or from an altered file, is refused with a
:class:`ResumeError` (a result never mixes two configurations), and so is a run without
``--resume`` while finished methods are stored (they are never removed unasked).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._version import __version__
from ..files import CorruptFileError, atomic_write_text, load_checksummed, save_checksummed
from .run import MethodRun

__all__ = ["RUN_KEY_FILE", "FinishedMethods", "ResumeError", "published_under", "run_key"]

_KEY_FILE = "key.json"

#: The run key a published result directory holds beside its ``results.json``.
RUN_KEY_FILE = "run_key.json"


class ResumeError(ValueError):
    """An evaluation cannot resume: nothing stored, another configuration, or an altered file."""


def run_key(config: dict[str, Any], sampler_path: str | os.PathLike | None) -> str:
    """What a stored method's numbers depend on: the resolved ``config`` (its ``progress``
    switch left out), the sampler file's SHA-256 and the versions of torch and metasampler."""
    config = {k: v for k, v in config.items() if k != "progress"}
    sampler = None
    if sampler_path is not None and Path(sampler_path).is_file():
        sampler = hashlib.sha256(Path(sampler_path).read_bytes()).hexdigest()
    key = {"config": config, "sampler_sha256": sampler, "torch": torch.__version__,
           "metasampler": __version__}  # fmt: skip
    return json.dumps(key, sort_keys=True, indent=1, default=str)


def published_under(directory: str | os.PathLike, key: str) -> dict[str, Any] | None:
    """The ``results.json`` a published evaluation in ``directory`` holds, where it was
    published under ``key`` (:data:`RUN_KEY_FILE`) and reads whole; else ``None``."""
    directory = Path(directory)
    try:
        if (directory / RUN_KEY_FILE).read_text() != key:
            return None
        summary = json.loads((directory / "results.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return summary if isinstance(summary, dict) and "methods" in summary else None


class FinishedMethods:
    """The finished methods of one evaluation, in ``directory`` under ``key`` (:func:`run_key`).

    Args:
        directory: where they are kept (``<out_dir>/.<name>.finished``).
        key: the run's key.
        resume: take back what an earlier run with this key stored.

    Raises:
        ResumeError: ``resume`` and nothing stored, or stored under another key; or not
            ``resume`` and methods stored (they are never removed unasked).
    """

    def __init__(self, directory: Path, key: str, resume: bool) -> None:
        self.directory = Path(directory)
        key_file = self.directory / _KEY_FILE
        if resume:
            if not key_file.is_file():
                raise ResumeError(f"--resume: no finished methods of an earlier run in {directory}")
            if key_file.read_text() != key:
                try:
                    differ = _differences(json.loads(key_file.read_text()), json.loads(key))
                    why = f"come from another run (its {differ} differ)"
                except json.JSONDecodeError:
                    why = f"have an unreadable {_KEY_FILE}"
                raise ResumeError(
                    f"--resume: the methods in {directory} {why}; remove the directory to "
                    "start afresh"
                )
        elif list(self.directory.glob("*.pt")):  # (as train_meta.py with a checkpoint)
            raise ResumeError(
                f"{directory} holds methods an interrupted run finished: pass --resume to "
                "continue that run, or remove the directory to start afresh"
            )
        else:
            shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(key_file, key)

    def stored(self) -> list[str]:
        """The methods stored so far."""
        return sorted(path.stem for path in self.directory.glob("*.pt"))

    def store(
        self, method: str, entry: dict[str, Any], runs: dict[int, MethodRun], tb_root: Path
    ) -> None:
        """Keep a finished method: its ``results.json`` entry, its runs, and its TensorBoard
        logs under ``tb_root / method`` (copied first: the method's file marks it finished)."""
        logs, kept = tb_root / method, self.directory / f"{method}.tb"
        shutil.rmtree(kept, ignore_errors=True)
        if logs.is_dir():
            shutil.copytree(logs, kept)
        payload = {
            "entry": _to_json(entry),
            "runs": {str(seed): _run_payload(run) for seed, run in runs.items()},
        }
        save_checksummed(self.directory / f"{method}.pt", payload)

    def restore(
        self, method: str, tb_root: Path
    ) -> tuple[dict[str, Any], dict[int, MethodRun]] | None:
        """A stored method's entry and runs (its logs copied back under ``tb_root``), or
        ``None`` when it did not finish.

        Raises:
            ResumeError: its file was altered or cut short.
        """
        path = self.directory / f"{method}.pt"
        if not path.is_file():
            return None
        try:
            payload = load_checksummed(path)
        except CorruptFileError as err:
            raise ResumeError(f"{err}; remove {self.directory} to start afresh") from err
        logs = self.directory / f"{method}.tb"
        if logs.is_dir():
            shutil.copytree(logs, tb_root / method, dirs_exist_ok=True)
        runs = {int(seed): _run_from(data) for seed, data in payload["runs"].items()}
        return json.loads(payload["entry"]), runs

    def discard(self) -> None:
        """Remove the directory (the result was published)."""
        shutil.rmtree(self.directory, ignore_errors=True)


def _differences(stored: dict[str, Any], wanted: dict[str, Any]) -> str:
    """The parts of two run keys that differ, the config's keys named."""
    differ = [name for name in sorted(wanted) if stored.get(name) != wanted[name]]
    if "config" in differ:
        old, new = stored.get("config", {}), wanted["config"]
        keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        differ[differ.index("config")] = "config (" + ", ".join(keys) + ")"
    return ", ".join(differ).replace("sampler_sha256", "sampler file")


def _to_json(value: Any) -> str:
    """``value`` as JSON text that keeps NaN and infinities (read back by ``json.loads``)."""

    def plain(x: Any) -> Any:
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, np.ndarray):
            return x.tolist()
        raise TypeError(f"cannot store a {type(x).__name__} of an evaluation's result")

    return json.dumps(value, default=plain)


def _run_payload(run: MethodRun) -> dict[str, Any]:
    """A :class:`MethodRun` as values ``torch.load(weights_only=True)`` reads back."""
    numbers = {"curves": run.curves, "final": run.final, "diverged_at": run.diverged_at,
               "message": run.message}  # fmt: skip
    return {
        "numbers": _to_json(numbers),
        "entropies": {name: torch.from_numpy(np.asarray(v)) for name, v in run.entropies.items()},
        "calibration": None
        if run.calibration is None
        else [torch.from_numpy(np.asarray(v)) for v in run.calibration],
    }


def _run_from(payload: dict[str, Any]) -> MethodRun:
    numbers = json.loads(payload["numbers"])
    calibration = payload["calibration"]
    return MethodRun(
        curves=numbers["curves"],
        final=numbers["final"],
        entropies={name: t.numpy() for name, t in payload["entropies"].items()},
        calibration=None if calibration is None else tuple(t.numpy() for t in calibration),
        diverged_at=numbers["diverged_at"],
        message=numbers["message"],
    )
