"""Reading a sampler file's bytes: layout, strict header schema and integrity, before anything
is built (the checks behind :func:`metasampler.load_sampler`).

A sampler file is a safetensors file: an 8-byte little-endian length ``n``, ``n`` bytes of
JSON (per-tensor ``dtype``/``shape``/``data_offsets`` and ``__metadata__``), then the tensor
data. :func:`read_sampler_file` parses it without safetensors or torch, so that nothing is
allocated from a field that has not been checked:

1. **Sizes** — the file, the JSON and every tensor are bounded (:data:`MAX_FILE_BYTES`,
   :data:`MAX_JSON_BYTES`, :data:`MAX_TENSOR_ELEMENTS`); JSON nesting is bounded
   (:data:`MAX_NESTING`) before it is parsed; duplicate keys, ``NaN``/``Infinity`` and
   non-finite numbers are errors.
2. **Layout** — known dtypes only; the tensors' byte ranges tile the data exactly.
3. **Schema** — the metasampler header has exactly the keys of its format version, each of
   its type and range (hidden widths at most :data:`MAX_WIDTH` in at most
   :data:`MAX_LAYERS` layers, constants within ``±``:data:`MAX_CONSTANT`); the net tensors
   are stored in the header's ``architecture.dtype`` and the statistics in float64, exactly.
4. **Integrity** — ``checksum.algorithm`` says what the SHA-256 covers:

   * ``"sha256-header+tensors"`` (written since format version 2): the canonical JSON of the
     whole header except ``checksum`` (sorted keys, no spaces), then every tensor's name,
     dtype, shape and bytes — so any change to what the file says is detected.
   * ``"sha256"`` (format version 1, e.g. the shipped ``pretrained/*.safetensors``): the
     tensors only. For such files integrity means: the tensors are as written, the header
     passes the strict schema and agrees with the tensors (statistics, ``train_dim``,
     dtypes, names and shapes); a header value changed to another valid value cannot be
     detected, so loading one warns (:class:`SamplerFileWarning`). Re-saving the loaded
     sampler (``save_sampler``) upgrades it.

Every failure is a :class:`SamplerFileError` naming the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import Field, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .nnsghmc_args import ARCHITECTURE, CONSTANTS, arg_fields

__all__ = [
    "CHECKSUM_FULL",
    "CHECKSUM_TENSORS",
    "FORMAT",
    "FORMAT_VERSION",
    "HEADER_KEY",
    "MAX_CONSTANT",
    "MAX_FILE_BYTES",
    "MAX_JSON_BYTES",
    "MAX_LAYERS",
    "MAX_NESTING",
    "MAX_TENSOR_ELEMENTS",
    "MAX_WIDTH",
    "READABLE_VERSIONS",
    "STATISTICS",
    "SamplerFile",
    "SamplerFileError",
    "SamplerFileWarning",
    "canonical_header_bytes",
    "header_checksum",
    "parse_json",
    "read_raw_header",
    "read_sampler_file",
    "tensor_checksum",
]

FORMAT = "metasampler.nnsghmc"
#: The format version written.
FORMAT_VERSION = 3
#: Format versions read (1: header not covered by the checksum).
READABLE_VERSIONS = (1, 2, 3)
#: The safetensors metadata key holding the JSON header.
HEADER_KEY = "metasampler"
CHECKSUM_TENSORS = "sha256"  # format version 1: tensors only
CHECKSUM_FULL = "sha256-header+tensors"  # format version 2: everything the file says

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
STATISTICS = ("energy_loc", "energy_std", "momentum_std", "grad_std")


class SamplerFileError(ValueError):
    """A sampler file is unreadable, of another format or version, or inconsistent."""


class SamplerFileWarning(UserWarning):
    """A sampler file loaded, but part of it could not be verified (format version 1)."""


@dataclass(frozen=True)
class SamplerFile:
    """A checked sampler file: its metasampler header and raw tensor bytes.

    Attributes:
        header: the metasampler JSON header (schema-checked).
        tensors: name -> (safetensors dtype code, shape, bytes).
        full_integrity: whether the checksum covers the header too.
    """

    header: dict
    tensors: dict[str, tuple[str, tuple[int, ...], bytes]]
    full_integrity: bool

    def tensor(self, name: str) -> Tensor:
        """A fresh tensor with the stored bytes of ``name``."""
        code, shape, data = self.tensors[name]
        dtype = DTYPES[code][0]
        if not data:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape).clone()


# --------------------------------------------------------------------------------------------
# Checksums (also used when saving)
# --------------------------------------------------------------------------------------------
def _tensor_stream(items: Iterable[tuple[str, str, tuple[int, ...], bytes]]) -> hashlib._Hash:
    digest = hashlib.sha256()
    for name, torch_dtype, shape, data in sorted(items):
        digest.update(f"{name}\0{torch_dtype}\0{','.join(str(s) for s in shape)}\0".encode())
        digest.update(data)
    return digest


def _tensor_items(tensors: dict[str, Tensor]) -> list[tuple[str, str, tuple[int, ...], bytes]]:
    items = []
    for name, value in tensors.items():
        value = value.detach().to("cpu").contiguous()
        data = value.reshape(-1).view(torch.uint8).numpy().tobytes()
        items.append((name, str(value.dtype), tuple(value.shape), data))
    return items


def tensor_checksum(tensors: dict[str, Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, sorted by name (v1)."""
    return _tensor_stream(_tensor_items(tensors)).hexdigest()


def canonical_header_bytes(header: dict) -> bytes:
    """The header without ``checksum`` as canonical JSON (sorted keys, no spaces, ASCII)."""
    body = {key: value for key, value in header.items() if key != "checksum"}
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


def header_checksum(header: dict, tensors: dict[str, Tensor]) -> str:
    """SHA-256 over the canonical header and then the tensors (:data:`CHECKSUM_FULL`)."""
    return _full_checksum(header, _tensor_items(tensors))


def _full_checksum(header: dict, items: list) -> str:
    body = canonical_header_bytes(header)
    tensors = _tensor_stream(items).digest()
    return hashlib.sha256(f"{FORMAT}\0".encode() + body + b"\0" + tensors).hexdigest()


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------
def read_sampler_file(path: Path, versions: Iterable[int], current: int) -> SamplerFile:
    """Read and check ``path`` (layout, schema of its ``format_version``, integrity).

    Args:
        path: the file.
        versions: the format versions this release reads.
        current: the version it writes (named in messages).

    Raises:
        FileNotFoundError: no file at ``path``.
        SamplerFileError: anything else; the message says what is wrong.
    """
    fail = _failer(path)
    if not path.exists():
        raise FileNotFoundError(f"no sampler file at {str(path)!r}")
    if not path.is_file():
        fail("not a regular file")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        fail(f"{size} bytes is larger than any sampler file ({MAX_FILE_BYTES} at most)")
    try:
        blob = path.read_bytes()
    except OSError as err:
        fail(f"cannot read it: {err}")
    outer, data = _split(blob, fail)
    metadata = outer.pop("__metadata__", None)
    if not isinstance(metadata, dict) or HEADER_KEY not in metadata:
        keys = sorted(metadata) if isinstance(metadata, dict) else "none"
        raise SamplerFileError(
            f"{path} is a safetensors file but not a metasampler sampler: its metadata has no "
            f"{HEADER_KEY!r} header (metadata keys: {keys or 'none'})"
        )
    if set(metadata) != {HEADER_KEY} or not isinstance(metadata[HEADER_KEY], str):
        fail(f"its safetensors metadata must hold exactly one string, {HEADER_KEY!r}")
    header = parse_json(metadata[HEADER_KEY].encode("utf-8", "surrogatepass"), "header", fail)
    if not isinstance(header, dict):
        fail(f"its header is a JSON {type(header).__name__}, not an object")
    if header.get("format") != FORMAT:
        raise SamplerFileError(
            f"{path} is a safetensors file but not a metasampler sampler: header format is "
            f"{header.get('format')!r}, expected {FORMAT!r}"
        )
    _check_version(path, header.get("format_version"), tuple(versions), current)
    check_header(header, fail)
    tensors = _layout(outer, data, fail)
    items = [(n, str(DTYPES[c][0]), shape, raw) for n, (c, shape, raw) in tensors.items()]
    algorithm, stored = header["checksum"]["algorithm"], header["checksum"]["value"]
    computed = (
        _full_checksum(header, items)
        if algorithm == CHECKSUM_FULL
        else _tensor_stream(items).hexdigest()
    )
    if computed != stored:
        covered = "header and tensors" if algorithm == CHECKSUM_FULL else "tensor data"
        fail(
            f"its {covered} do not match the checksum in its header (corrupted, or edited "
            "without re-saving through metasampler)"
        )
    return SamplerFile(header, tensors, algorithm == CHECKSUM_FULL)


def read_raw_header(path: Path) -> dict:
    """The metasampler header of ``path`` after the layout-free checks only (sizes, strict
    JSON, format name): for inspecting files of other versions or with errors further on."""
    fail = _failer(path)
    if not path.exists():
        raise FileNotFoundError(f"no sampler file at {str(path)!r}")
    if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
        fail("not a regular file of a sampler file's size")
    try:
        with open(path, "rb") as handle:
            head = handle.read(8 + MAX_JSON_BYTES)
    except OSError as err:
        fail(f"cannot read it: {err}")
    if len(head) >= 8:  # (the data section is not needed here)
        head = head[: 8 + int.from_bytes(head[:8], "little")]
    outer, _ = _split(head, fail)
    metadata = outer.get("__metadata__")
    if not isinstance(metadata, dict) or not isinstance(metadata.get(HEADER_KEY), str):
        raise SamplerFileError(
            f"{path} is a safetensors file but not a metasampler sampler: its metadata has no "
            f"{HEADER_KEY!r} header"
        )
    header = parse_json(metadata[HEADER_KEY].encode("utf-8", "surrogatepass"), "header", fail)
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise SamplerFileError(f"{path} is a safetensors file but not a metasampler sampler")
    return header


def _failer(path: Path) -> Callable[[str], Any]:
    def fail(what: str):
        raise SamplerFileError(f"{path} is not a valid sampler file: {what}")

    return fail


def _split(blob: bytes, fail) -> tuple[dict, bytes]:
    """The safetensors JSON (parsed) and the data section."""
    if len(blob) < 8:
        fail(f"{len(blob)} bytes is too short for a safetensors file (truncated?)")
    n = int.from_bytes(blob[:8], "little")
    if n > MAX_JSON_BYTES:
        fail(f"its safetensors header claims {n} bytes (at most {MAX_JSON_BYTES})")
    if 8 + n > len(blob):
        fail(f"its safetensors header claims {n} bytes but the file has {len(blob) - 8} more")
    outer = parse_json(blob[8 : 8 + n], "safetensors header", fail)
    if not isinstance(outer, dict):
        fail("its safetensors header is not a JSON object")
    return outer, blob[8 + n :]


def parse_json(raw: bytes, what: str, fail: Callable[[str], Any]) -> Any:
    """Strict JSON: UTF-8, bounded nesting, no duplicate keys, no NaN/Infinity; ``fail`` is
    called with what is wrong (and must raise)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        fail(f"its {what} is not UTF-8 ({err.reason} at byte {err.start})")
    if len(raw) > MAX_JSON_BYTES:
        fail(f"its {what} has {len(raw)} bytes (at most {MAX_JSON_BYTES})")
    depth = deepest = 0
    for token in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', text):
        char = token.group()
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
        if deepest > MAX_NESTING:
            fail(f"its {what} nests deeper than {MAX_NESTING} levels")

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
        result = dict(pairs)
        if len(result) != len(pairs):
            seen = [k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i])]
            fail(f"its {what} repeats the key {seen[0]!r}")
        return result

    def no_constant(name: str):
        fail(f"its {what} holds {name}, not a finite number")

    try:
        return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except SamplerFileError:
        raise
    except (ValueError, RecursionError) as err:  # JSONDecodeError; ints too long to convert
        fail(f"its {what} is not valid JSON ({str(err).splitlines()[0][:200]})")


def _check_version(path: Path, version: Any, versions: tuple[int, ...], current: int) -> None:
    if type(version) is int and version in versions:
        return
    if type(version) is int and version > current:
        hint = "; upgrade metasampler to load it"
    elif type(version) is int:
        hint = "; re-export it with a metasampler release that reads that version"
    else:
        hint = ""
    raise SamplerFileError(
        f"{path} was written by format version {version!r}; this metasampler reads versions "
        f"{' and '.join(str(v) for v in versions)}{hint}"
    )


def _layout(outer: dict, data: bytes, fail) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Tensor entries: known dtypes, sane shapes, byte ranges that tile ``data`` exactly."""
    entries = {}
    for name, entry in outer.items():
        if not re.fullmatch(r"[A-Za-z0-9_.]{1,200}", name):
            fail(f"tensor name {name[:80]!r} is not a module parameter name")
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            fail(f"tensor {name!r} must have exactly dtype, shape and data_offsets")
        code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if code not in DTYPES:
            fail(f"tensor {name!r} has dtype {code!r}; sampler files use {sorted(DTYPES)}")
        if not (isinstance(shape, list) and len(shape) <= 4 and all(_is_int(s, 0) for s in shape)):
            fail(f"tensor {name!r} has shape {shape!r}, not a list of at most 4 sizes")
        numel = math.prod(shape)
        if numel > MAX_TENSOR_ELEMENTS:
            fail(f"tensor {name!r} has {numel} elements (at most {MAX_TENSOR_ELEMENTS})")
        if not (isinstance(offsets, list) and len(offsets) == 2):
            fail(f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end]")
        begin, end = offsets
        if not (_is_int(begin, 0) and _is_int(end, 0) and begin <= end):
            fail(f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end]")
        if end - begin != numel * DTYPES[code][1]:
            fail(f"tensor {name!r} holds {end - begin} bytes but {code} {shape} needs more/less")
        entries[name] = (code, tuple(shape), begin, end)
    position = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda e: e[1][2:]):
        if begin != position:
            fail(f"tensor {name!r} starts at byte {begin} of the data, expected {position}")
        position = end
    if position != len(data):
        fail(f"the tensors cover {position} bytes of data, the file has {len(data)} (truncated?)")
    return {n: (c, s, data[b:e]) for n, (c, s, b, e) in entries.items()}


# --------------------------------------------------------------------------------------------
# The header schema
# --------------------------------------------------------------------------------------------
def _is_int(value: Any, low: int, high: float = math.inf) -> bool:
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
        and all(_is_int(w, 1, MAX_WIDTH) for w in value)
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
    "positive_or_none": _optional(_POSITIVE),
    "bool": _bool,
}


def _arg_check(f: Field) -> Check:
    check = f.metadata["check"]
    return _choice(*(m.value for m in check)) if isinstance(check, type) else _ARG_CHECKS[check]


def _schema(version: int) -> dict[str, Any]:
    """The header schema of format ``version``: the NNSGHMC arguments it holds, then the
    step, statistics, checksum and provenance."""
    checksums = (CHECKSUM_TENSORS,) if version == 1 else (CHECKSUM_FULL, CHECKSUM_TENSORS)
    return {
        "format": _choice(FORMAT),
        "format_version": lambda v: None if _is_int(v, 1) else "an integer",
        ARCHITECTURE: {
            **{f.name: _arg_check(f) for f in arg_fields(ARCHITECTURE, version)},
            "dtype": _choice(*NET_DTYPES),
        },
        CONSTANTS: {f.name: _arg_check(f) for f in arg_fields(CONSTANTS, version)},
        "training": {
            "eta": _optional(_real(0.0, 1e3, low_open=True)),
            "lr": _optional(_real(0.0, 1e6, low_open=True)),
            "temperature": _real(0.0, 1e6),
        },
        "statistics": {
            "energy_loc": _real(-MAX_STATISTIC, MAX_STATISTIC),
            "energy_std": _real(0.0, MAX_STATISTIC, low_open=True),
            "momentum_std": _real(0.0, MAX_STATISTIC, low_open=True),
            "grad_std": _real(0.0, MAX_STATISTIC, low_open=True),
        },
        "train_dim": lambda v: None if _is_int(v, 0, MAX_TRAIN_DIM) else "an integer >= 0",
        "checksum": {"algorithm": _choice(*checksums), "value": _hex64},
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
