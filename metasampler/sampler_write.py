"""Writing a sampler file: the header (format :data:`~metasampler.sampler_format.FORMAT_VERSION`)
and the tensors, replaced atomically (the format is described in :mod:`metasampler.export`).

:func:`write_sampler` takes what the file holds — the sampler's
:class:`~metasampler.nnsghmc_args.NNSGHMCArgs`, its training step and its state dict — so that
it needs nothing of the sampler class (``NNSGHMC.save`` calls it).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import Tensor

from ._version import __version__
from .files import jsonable
from .nnsghmc_args import ARCHITECTURE, CONSTANTS, NNSGHMCArgs
from .sampler_file import SamplerFileError, header_checksum, parse_json
from .sampler_format import (
    CHECKSUM_FULL,
    FORMAT,
    FORMAT_VERSION,
    HEADER_KEY,
    MAX_JSON_BYTES,
    STATISTICS,
)
from .staging import owner_tag, remove_stale_files

__all__ = ["build_header", "write_sampler"]


def write_sampler(
    path: str | os.PathLike,
    args: NNSGHMCArgs,
    training: Mapping[str, float | None],
    state_dict: Mapping[str, Tensor],
    provenance: Mapping[str, Any],
) -> None:
    """Write a sampler file: ``state_dict``'s tensors and the header describing them.

    Args:
        path: the file to write; replaced atomically if it exists.
        args: the sampler's architecture and constants.
        training: the step it was trained with: ``eta``, ``lr`` (either may be ``None``)
            and ``temperature``.
        state_dict: the sampler's weights and buffers.
        provenance: JSON-able facts about how it was made (see ``save_sampler``).

    Raises:
        SamplerFileError: a tensor is not finite (nothing is written).
        ValueError: the header would be too large or too deep to load.
    """
    tensors: dict[str, Tensor] = {}
    for name, value in state_dict.items():
        value = value.detach().to("cpu").clone().contiguous()
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).sum())
            raise SamplerFileError(
                f"refusing to save: tensor {name!r} has {bad} non-finite value(s) "
                f"of {value.numel()}"
            )
        tensors[name] = value
    header = build_header(args, training, tensors, dict(provenance))
    metadata = {HEADER_KEY: json.dumps(header, allow_nan=False)}
    _check_header_loads(metadata[HEADER_KEY])
    _atomic_save(tensors, Path(path), metadata)


def build_header(
    args: NNSGHMCArgs,
    training: Mapping[str, float | None],
    tensors: Mapping[str, Tensor],
    provenance: dict,
) -> dict:
    """The JSON header of a sampler file (with its ``checksum`` over header and tensors)."""
    auto = {
        "commit": _git_commit(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "metasampler": __version__,
    }
    eta, lr = training["eta"], training["lr"]
    net_dtype = str(tensors["f_q.head.weight"].dtype).removeprefix("torch.")
    header = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "architecture": {**args.header_section(ARCHITECTURE), "dtype": net_dtype},
        "constants": args.header_section(CONSTANTS),
        "training": {
            "eta": None if eta is None else float(eta),
            "lr": None if lr is None else float(lr),
            "temperature": float(training["temperature"]),
        },
        "statistics": {name: float(tensors[name]) for name in STATISTICS},
        "train_dim": int(tensors["train_dim"]),
        "provenance": jsonable({**auto, **provenance}, as_text=True),
    }
    header["checksum"] = {"algorithm": CHECKSUM_FULL, "value": header_checksum(header, tensors)}
    return header


def _check_header_loads(text: str) -> None:
    """Refuse (before writing) a header that ``load_sampler`` would refuse: too large or
    nested too deep (a big or deep ``provenance``)."""
    if len(text) > MAX_JSON_BYTES // 2:
        raise ValueError(
            f"refusing to save: the header would take {len(text)} bytes; sampler files hold "
            f"at most {MAX_JSON_BYTES // 2} (make the provenance smaller)"
        )

    def refuse(what: str) -> None:
        raise ValueError(f"refusing to save: {what} (make the provenance simpler)")

    parse_json(text.encode(), "header", refuse)


def _atomic_save(tensors: dict[str, Tensor], path: Path, metadata: dict[str, str]) -> None:
    """``save_file`` into a temporary sibling, then ``os.replace`` it onto ``path``."""
    directory = path.parent
    if not directory.is_dir():
        raise FileNotFoundError(f"directory {str(directory)!r} for {str(path)!r} does not exist")
    # Temporary files of saves that were killed are removed here, at the next save; the
    # owner tag (host, pid) says which are stale (metasampler/staging.py).
    remove_stale_files(directory, f".{path.name}.", ".tmp")
    tmp = directory / f".{path.name}.{owner_tag()}.tmp"
    # safetensors itself may write through a private (0o600) temporary file: give the result
    # the mode of the file it replaces, else the ordinary 0o666 minus the umask.
    mode = path.stat().st_mode & 0o777 if path.is_file() else 0o666 & ~_umask()
    try:
        safetensors.torch.save_file(tensors, tmp, metadata=metadata)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except safetensors.SafetensorError as err:  # (its I/O errors name only the temporary file)
        tmp.unlink(missing_ok=True)
        raise OSError(f"cannot write the sampler file {str(path)!r}: {err}") from err
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process umask, read without changing it (Linux); 0o022 where unknown."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _git_commit() -> str:
    """``git rev-parse HEAD`` of the checkout holding this package, else ``"unknown"``."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = result.stdout.strip()
    return commit if result.returncode == 0 and commit else "unknown"
