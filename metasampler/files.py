"""Writing files so that an interruption leaves the old file or the new one, never half of one;
``torch.save`` files that carry their SHA-256 (checkpoints, an evaluation's finished methods);
converting results to strict JSON."""

from __future__ import annotations

import hashlib
import io
import math
import os
import pickle
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .staging import owner_tag, remove_stale_files

__all__ = [
    "CorruptFileError",
    "atomic_write_bytes",
    "atomic_write_text",
    "jsonable",
    "load_checksummed",
    "save_checksummed",
]

# A checksummed file: this prefix, the hex SHA-256 of the rest after the line, a newline, then
# the ``torch.save`` bytes (``torch.load`` itself checks no tensor data: one flipped bit loads).
_MAGIC = b"metasampler-checkpoint sha256 "
_ZIP = b"PK\x03\x04"  # how a ``torch.save`` file (a zip archive) begins


class CorruptFileError(ValueError):
    """A file written by :func:`save_checksummed` that is unreadable, altered or truncated."""


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to a temporary sibling of ``path``, fsync, then ``os.replace`` it.

    The temporary file is ``.<name>.<host>-<pid>-<8 hex>.tmp``. A process killed while
    writing leaves it behind; the next write to ``path`` removes such files first, those
    whose process has ended (:func:`metasampler.staging.remove_stale_files`)."""
    path = Path(path)
    remove_stale_files(path.parent, f".{path.name}.", ".tmp")
    tmp = path.parent / f".{path.name}.{owner_tag()}.tmp"
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def save_checksummed(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    """``torch.save`` ``payload`` behind its SHA-256 line, written atomically."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    body = buffer.getvalue()
    digest = hashlib.sha256(body).hexdigest().encode()
    atomic_write_bytes(path, _MAGIC + digest + b"\n" + body)


def load_checksummed(
    path: str | os.PathLike, map_location: str | torch.device = "cpu"
) -> dict[str, Any]:
    """What :func:`save_checksummed` wrote to ``path``, after checking its SHA-256 (tensors,
    containers and plain values only: ``weights_only``). A file without the line (a
    checkpoint written before it existed) loads with a warning that it cannot be checked.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        CorruptFileError: the file cannot be read, is empty, is not such a file, or its bytes
            differ from those written; the message names the file and says which.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise
    except OSError as err:
        raise CorruptFileError(f"{path} cannot be read: {err.strerror or err}") from None
    if not data:
        raise CorruptFileError(f"{path} is empty (0 bytes)")
    if data.startswith(_MAGIC):
        header, _, body = data.partition(b"\n")
        if hashlib.sha256(body).hexdigest().encode() != header[len(_MAGIC) :]:
            raise CorruptFileError(f"{path} does not match its SHA-256 (altered or truncated)")
    elif data.startswith(_ZIP):
        body = data
        warnings.warn(
            f"{path} has no checksum line (written before metasampler checked its files): "
            "loaded unchecked",
            stacklevel=2,
        )
    else:
        raise CorruptFileError(
            f"{path} is not a checkpoint: it begins with neither metasampler's checksum line "
            "nor a torch.save archive"
        )
    try:
        return torch.load(io.BytesIO(body), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        # (torch's own message suggests weights_only=False: never for a file that may be
        # altered, since unpickling arbitrary objects runs code)
        raise CorruptFileError(
            f"{path} holds objects other than tensors, containers and plain values "
            "(metasampler never writes such files)"
        ) from None
    except Exception as err:  # truncated / not such a file
        raise CorruptFileError(f"{path} is not readable: {_reason(err)}") from None


def _reason(err: Exception) -> str:
    """The first line of ``err``'s message with its type, never empty."""
    lines = str(err).strip().splitlines()
    first = lines[0][:200] if lines else "the data ends early"
    return f"{type(err).__name__}: {first}"


def jsonable(value: Any, *, as_text: bool = False) -> Any:
    """A strict-JSON copy of ``value``: mappings (keys as strings), lists and tuples are
    converted recursively, numpy scalars become Python numbers.

    Args:
        value: what to convert.
        as_text: what becomes of values JSON cannot hold. ``False`` (results): non-finite
            floats become ``null``, numpy arrays lists, anything else is returned unchanged.
            ``True`` (a sampler file's provenance, which must keep what it was given):
            non-finite floats become their ``str`` (``"nan"``, ``"inf"``, ``"-inf"``),
            one-element tensors and 0-d arrays their Python value, and anything else that
            is not ``None``, a bool, an int or a string its ``str``.
    """
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, as_text=as_text) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, as_text=as_text) for v in value]
    if isinstance(value, (np.floating, float)):
        if math.isfinite(value):
            return float(value)
        return str(value) if as_text else None
    if isinstance(value, np.integer):
        return int(value)
    if not as_text:
        return jsonable(value.tolist()) if isinstance(value, np.ndarray) else value
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if getattr(value, "ndim", None) == 0 or (hasattr(value, "numel") and value.numel() == 1):
        return jsonable(value.item(), as_text=True)
    return str(value)
