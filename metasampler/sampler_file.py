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
4. **Integrity** — ``checksum`` (``"sha256-header+tensors"``) is a SHA-256 over the canonical
   JSON of the whole header except ``checksum`` (sorted keys, no spaces), then every tensor's
   name, dtype, shape and bytes — so any change to what the file says is detected.

Every failure is a :class:`SamplerFileError` naming the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .sampler_format import (
    DTYPES,
    FORMAT,
    HEADER_KEY,
    MAX_FILE_BYTES,
    MAX_JSON_BYTES,
    MAX_NESTING,
    MAX_TENSOR_ELEMENTS,
    check_header,
    int_in,
)

__all__ = [
    "SamplerFile",
    "SamplerFileError",
    "canonical_header_bytes",
    "header_checksum",
    "parse_json",
    "read_raw_header",
    "read_sampler_file",
    "tensor_checksum",
]


class SamplerFileError(ValueError):
    """A sampler file is unreadable, of another format or version, or inconsistent."""


@dataclass(frozen=True)
class SamplerFile:
    """A checked sampler file: its metasampler header and raw tensor bytes.

    Attributes:
        header: the metasampler JSON header (schema-checked).
        tensors: name -> (safetensors dtype code, shape, bytes).
    """

    header: dict
    tensors: dict[str, tuple[str, tuple[int, ...], bytes]]

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
    if _full_checksum(header, items) != header["checksum"]["value"]:
        fail(
            "its header and tensors do not match the checksum in its header (corrupted, or "
            "edited without re-saving through metasampler)"
        )
    return SamplerFile(header, tensors)


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
        fail(
            f"its safetensors header is {n} bytes long but only {len(blob) - 8} bytes follow "
            "its length field (truncated?)"
        )
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
        hint = (
            ": it holds a sampler of an earlier NNSGHMC design that this release does not "
            "build. Re-train it with train_meta.py (configs/ holds the shipped samplers' "
            "recipes), load a shipped sampler by name (metasampler.pretrained_samplers()), or "
            "keep using the release that wrote it (CHANGELOG.md, 0.2.0)"
        )
    else:
        hint = ""
    raise SamplerFileError(
        f"{path} was written by format version {version!r}; this metasampler reads versions "
        f"{_spoken_list(versions)}{hint}"
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
        if not (isinstance(shape, list) and len(shape) <= 4 and all(int_in(s, 0) for s in shape)):
            fail(f"tensor {name!r} has shape {shape!r}, not a list of at most 4 sizes")
        numel = math.prod(shape)
        if numel > MAX_TENSOR_ELEMENTS:
            fail(f"tensor {name!r} has {numel} elements (at most {MAX_TENSOR_ELEMENTS})")
        if not (isinstance(offsets, list) and len(offsets) == 2):
            fail(f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end]")
        begin, end = offsets
        if not (int_in(begin, 0) and int_in(end, 0) and begin <= end):
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
        cause = "truncated?" if position > len(data) else "bytes appended?"
        fail(f"the tensors cover {position} bytes of data, the file has {len(data)} ({cause})")
    return {n: (c, s, data[b:e]) for n, (c, s, b, e) in entries.items()}


def _spoken_list(items: Iterable[Any]) -> str:
    """``1``, ``1 and 2``, ``1, 2 and 3``."""
    words = [str(item) for item in items]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
