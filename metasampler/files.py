"""Writing files so that an interruption leaves the old file or the new one, never half of one,
and converting results to strict JSON."""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["atomic_write_bytes", "atomic_write_text", "jsonable"]


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to a temporary sibling of ``path``, fsync, then ``os.replace`` it."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
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
