"""The sampler file format's facts: its name and versions, the size bounds, the dtypes, and
the strict header schema of each readable version (:func:`check_header`).

:mod:`metasampler.sampler_file` reads a file's bytes against these; the writer
(:mod:`metasampler.sampler_write`) and the loader (:mod:`metasampler.export`) use the same
constants.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import Field
from typing import Any

import torch

from .nnsghmc_args import ARCHITECTURE, CONSTANTS, arg_fields

__all__ = [
    "CHECKSUM_FULL",
    "DTYPES",
    "FORMAT",
    "FORMAT_VERSION",
    "HEADER_KEY",
    "MAX_CONSTANT",
    "MAX_FILE_BYTES",
    "MAX_JSON_BYTES",
    "MAX_LAYERS",
    "MAX_NESTING",
    "MAX_STATISTIC",
    "MAX_TENSOR_ELEMENTS",
    "MAX_TRAIN_DIM",
    "MAX_WIDTH",
    "NET_DTYPES",
    "READABLE_VERSIONS",
    "SCHEMAS",
    "STATISTICS",
    "check_header",
    "int_in",
]

FORMAT = "metasampler.nnsghmc"
#: The format version written.
FORMAT_VERSION = 10
#: Format versions read: only the current one (older files hold samplers of an earlier design;
#: the changelog of 0.2.0 says how to replace them).
READABLE_VERSIONS = (10,)
#: The safetensors metadata key holding the JSON header.
HEADER_KEY = "metasampler"
CHECKSUM_FULL = "sha256-header+tensors"  # everything the file says

MAX_FILE_BYTES = 128 * 2**20
MAX_JSON_BYTES = 2**20
MAX_NESTING = 12
MAX_WIDTH = 1024
MAX_LAYERS = 6
MAX_TENSOR_ELEMENTS = 8 * 2**20
MAX_CONSTANT = 1e8
MAX_STATISTIC = 1e30
MAX_TRAIN_DIM = 2**40

#: safetensors dtype codes a sampler file may use: torch dtype and bytes per element.
DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8),
}
#: ``architecture.dtype`` names and their safetensors codes.
NET_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}
STATISTICS = ("energy_loc", "energy_std", "momentum_std")


def int_in(value: Any, low: int, high: float = math.inf) -> bool:
    """``value`` is an ``int`` (not a ``bool``) in ``[low, high]``."""
    return type(value) is int and low <= value <= high


Check = Callable[[Any], str | None]  # returns what is wrong, or None


def _real(low: float, high: float, *, low_open: bool = False) -> Check:
    def check(value: Any) -> str | None:
        if type(value) not in (int, float) or not math.isfinite(value):
            return "a finite number"
        if value < low or value > high or (low_open and value == low):
            return f"a number in {'(' if low_open else '['}{low:g}, {high:g}]"
        return None

    return check


def _optional(check: Check) -> Check:
    def optional(value: Any) -> str | None:
        return None if value is None else (lambda why: why and f"null or {why}")(check(value))

    return optional


def _choice(*options: str) -> Check:
    return lambda value: None if value in options and type(value) is str else f"one of {options}"


def _widths(value: Any) -> str | None:
    ok = (
        type(value) is list
        and 1 <= len(value) <= MAX_LAYERS
        and all(int_in(w, 1, MAX_WIDTH) for w in value)
    )
    return None if ok else f"a list of 1 to {MAX_LAYERS} widths in [1, {MAX_WIDTH}]"


def _bool(value: Any) -> str | None:
    return None if type(value) is bool else "true or false"


def _hex64(value: Any) -> str | None:
    ok = type(value) is str and re.fullmatch(r"[0-9a-f]{64}", value)
    return None if ok else "64 lowercase hex digits"


def _any_json(value: Any) -> str | None:
    return None if isinstance(value, dict) else "an object"


_POSITIVE = _real(0.0, MAX_CONSTANT, low_open=True)


#: The file's check for each kind of NNSGHMC argument (``metasampler.nnsghmc_args``).
_ARG_CHECKS: dict[str, Check] = {
    "widths": _widths,
    "finite": _real(-MAX_CONSTANT, MAX_CONSTANT),
    "non_negative": _real(0.0, MAX_CONSTANT),
    "positive": _POSITIVE,
    "bool": _bool,
}


def _arg_check(f: Field) -> Check:
    check = f.metadata["check"]
    return _choice(*(m.value for m in check)) if isinstance(check, type) else _ARG_CHECKS[check]


def _schema(version: int) -> dict[str, Any]:
    """The header schema of format ``version``: the NNSGHMC arguments it holds, then the
    step, statistics, checksum and provenance."""
    return {
        "format": _choice(FORMAT),
        "format_version": lambda v: None if int_in(v, 1) else "an integer",
        ARCHITECTURE: {
            **{f.name: _arg_check(f) for f in arg_fields(ARCHITECTURE)},
            "dtype": _choice(*NET_DTYPES),
        },
        CONSTANTS: {f.name: _arg_check(f) for f in arg_fields(CONSTANTS)},
        "training": {
            "eta": _optional(_real(0.0, 1e3, low_open=True)),
            "lr": _optional(_real(0.0, 1e6, low_open=True)),
            "temperature": _real(0.0, 1e6),
        },
        "statistics": {
            "energy_loc": _real(-MAX_STATISTIC, MAX_STATISTIC),
            "energy_std": _real(0.0, MAX_STATISTIC, low_open=True),
            "momentum_std": _real(0.0, MAX_STATISTIC, low_open=True),
        },
        "train_dim": lambda v: None if int_in(v, 0, MAX_TRAIN_DIM) else "an integer >= 0",
        "checksum": {"algorithm": _choice(CHECKSUM_FULL), "value": _hex64},
        "provenance": _any_json,
    }


SCHEMAS = {version: _schema(version) for version in READABLE_VERSIONS}


def check_header(header: dict, fail: Callable[[str], Any]) -> None:
    """Exactly the keys of the header's format version, each of its type and range."""

    def walk(node: Any, schema: dict, prefix: str) -> None:
        if not isinstance(node, dict):
            fail(f"header field {prefix.rstrip('.') or 'header'!r} must be an object")
        unknown, missing = sorted(set(node) - set(schema)), sorted(set(schema) - set(node))
        if unknown:
            fail(f"unknown header field(s) {[prefix + k for k in unknown]}")
        if missing:
            fail(f"header field(s) {[prefix + k for k in missing]} missing")
        for key, rule in schema.items():
            if isinstance(rule, dict):
                walk(node[key], rule, f"{prefix}{key}.")
            else:
                why = rule(node[key])
                if why:
                    fail(f"header field {prefix + key!r} must be {why}, got {node[key]!r:.80}")

    walk(header, SCHEMAS[header["format_version"]], "")
    training = header["training"]
    if training["eta"] is not None and training["lr"] is not None:
        fail("header 'training' gives both eta and lr")
