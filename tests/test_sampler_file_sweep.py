"""A seeded sweep of altered sampler files: every variant either loads
to a sampler identical to the original or raises :class:`SamplerFileError` — never another
exception, never a different sampler."""

from __future__ import annotations

import json
import random
import warnings
from collections import Counter
from pathlib import Path

import pytest
import safetensors.torch
import torch

from metasampler.export import (
    FORMAT_VERSION,
    HEADER_KEY,
    SamplerFileError,
    load_sampler,
    read_header,
    save_sampler,
)
from metasampler.learned import NNSGHMC
from metasampler.sampler_file import header_checksum
from metasampler.sampler_format import CHECKSUM_FULL

SEED = 20261123


def original_sampler() -> NNSGHMC:
    sampler = NNSGHMC(
        eta=0.01, q_hidden=(4, 3), d_hidden=(3,), alpha=0.1, friction_scale=0.2,
        curl_input="momentum", thermostat=False, gamma="finite_difference", seed=3,
    )  # fmt: skip
    for name, value in dict(energy_loc=0.3, energy_std=2.0, momentum_std=0.8).items():
        getattr(sampler, name).fill_(value)
    sampler.train_dim.fill_(4)
    return sampler


def signature(sampler: NNSGHMC) -> tuple:
    """Everything that makes a loaded sampler behave as it does."""
    constants = (
        sampler.eta, sampler.lr, sampler.temperature, sampler.arguments(),
        sampler.f_q.activation, sampler.f_d.activation, sampler.f_d.output,
    )  # fmt: skip
    tensors = tuple(
        (name, value.dtype, tuple(value.shape), value.reshape(-1).tolist())
        for name, value in sorted(sampler.state_dict().items())
    )
    return constants, tensors


def split(blob: bytes) -> tuple[dict, bytes]:
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def join(outer: dict, data: bytes, pad: bool = True) -> bytes:
    text = dumps(outer).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data


def with_header(blob: bytes, edit, resign: bool = False) -> bytes:
    """The file with its metasampler header edited (optionally re-signed: the edit must then
    be caught by the schema, not the checksum)."""
    outer, data = split(blob)
    header = json.loads(outer["__metadata__"][HEADER_KEY])
    edit(header)
    if resign:
        tensors = safetensors.torch.load(blob)
        header["checksum"] = {"algorithm": CHECKSUM_FULL, "value": header_checksum(header, tensors)}
    outer["__metadata__"][HEADER_KEY] = dumps(header)
    return join(outer, data)


def with_outer(blob: bytes, edit) -> bytes:
    outer, data = split(blob)
    edit(outer)
    return join(outer, data)


def setter(section: str | None, key: str, value):
    def edit(header: dict) -> None:
        (header[section] if section else header)[key] = value

    return edit


def deleter(section: str | None, key: str):
    def edit(header: dict) -> None:
        del (header[section] if section else header)[key]

    return edit


DEEP = "@@deep@@"


def nested(depth: int) -> str:
    """A placeholder that :func:`dumps` turns into ``depth`` nested JSON lists (too deep for
    Python's own encoder)."""
    return f"{DEEP}{depth}"


def dumps(value) -> str:
    text = json.dumps(value, separators=(",", ":"))
    while DEEP in text:
        start = text.index(f'"{DEEP}')
        end = text.index('"', start + 1)
        depth = int(text[start + 1 + len(DEEP) : end])
        text = text[:start] + "[" * depth + "]" * depth + text[end + 1 :]
    return text


# Hand edits of the right type (each gives another sampler if it loads) and of the wrong type.
VALID_EDITS = [
    ("architecture", "activation", "relu"),
    ("architecture", "q_hidden", [4, 4]),
    ("architecture", "dtype", "float64"),
    ("constants", "gamma", "exact"),
    ("constants", "friction_scale", 0.0),
    ("constants", "grad_input_scale", 70.0),
    ("constants", "alpha", 0.2),
    ("training", "eta", 0.41),
    ("training", "temperature", 2.0),
    ("statistics", "momentum_std", 0.8000000000000002),
    (None, "train_dim", 5),
]
INVALID_EDITS = [
    ("architecture", "q_hidden", [10**8]),
    ("architecture", "q_hidden", [10**12]),
    ("architecture", "d_hidden", [4] * 50),
    ("architecture", "q_hidden", [0]),
    ("architecture", "q_hidden", [3.0]),
    ("architecture", "dtype", "float8_e4m3fn"),
    ("architecture", "dtype", "int64"),
    ("architecture", "activation", "gelu"),
    ("architecture", "curl_input", "energy"),
    ("constants", "friction_scale", 1e308),
    ("constants", "alpha", -1.0),
    ("constants", "grad_input_scale", 0.0),
    ("constants", "friction_scale", "0.2"),
    ("constants", "thermostat", 1),
    ("constants", "gamma", None),
    ("constants", "c", 0.2),  # (a constant of an earlier design)
    # (each needs exact Gamma: this file's is finite differences)
    ("architecture", "curl_input", "stiffness"),
    ("constants", "thermostat", True),
    ("training", "eta", True),
    ("training", "eta", 1e300),
    ("training", "lr", 0.1),  # both eta and lr
    ("training", "temperature", -1.0),
    ("statistics", "energy_std", 0.0),
    ("statistics", "bogus", 1.0),
    ("checksum", "algorithm", "md5"),
    ("checksum", "value", "zz"),
    (None, "train_dim", -1),
    (None, "train_dim", 2**80),
    (None, "format_version", 9),
    (None, "format_version", "2"),
    (None, "extra", {}),
    (None, "provenance", nested(5000)),
    (None, "provenance", "text"),
]
MISSING = [
    ("architecture", "dtype"), ("architecture", "curl_input"), ("constants", "alpha"),
    ("constants", "thermostat"), ("training", "temperature"), ("statistics", "momentum_std"),
    (None, "train_dim"),
    (None, "checksum"), (None, "provenance"),
]  # fmt: skip
DTYPE_CODES = ["F16", "BF16", "F64", "I64", "I32", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "C64"]


def variants(blob: bytes, rng: random.Random):
    """``(kind, bytes)`` pairs: at least 500 altered files."""
    outer, data = split(blob)
    header_end = 8 + int.from_bytes(blob[:8], "little")
    for cut in sorted(rng.sample(range(len(blob)), 80)):
        yield "truncation", blob[:cut]
    for region, (low, high), count in (
        ("header", (0, header_end), 220),
        ("data", (header_end, len(blob)), 120),
    ):
        for _ in range(count):
            position, bit = rng.randrange(low, high), rng.randrange(8)
            flipped = bytearray(blob)
            flipped[position] ^= 1 << bit
            yield f"bit flip ({region})", bytes(flipped)
    for _ in range(30):
        position = rng.randrange(len(blob) - 4)
        garbled = bytearray(blob)
        garbled[position : position + 4] = rng.randbytes(4)
        yield "garbled bytes", bytes(garbled)
    for section, key, value in VALID_EDITS:
        yield "edited field", with_header(blob, setter(section, key, value))
    for section, key, value in INVALID_EDITS:
        for resign in (False, True):
            yield "invalid field", with_header(blob, setter(section, key, value), resign)
    for section, key in MISSING:
        for resign in (False, True):
            yield "missing field", with_header(blob, deleter(section, key), resign)
    yield "nested header", with_outer(blob, lambda o: o.update(deep=nested(100_000)))
    yield "nested header", join({"__metadata__": {HEADER_KEY: "[" * 10**5}}, data)
    yield "huge header", (2**63).to_bytes(8, "little") + blob[8:]
    yield "huge header", with_outer(blob, lambda o: o["__metadata__"].update(pad="x" * 2**21))
    yield "extra metadata", with_outer(blob, lambda o: o["__metadata__"].update(note="hi"))
    yield "duplicate key", blob[:8] + blob[8:header_end].replace(b'{"', b'{"x":1,"', 1) + data
    names = [name for name in outer if name != "__metadata__"]
    for name in names:
        for code in DTYPE_CODES:
            entry = outer[name]
            if code == entry["dtype"]:
                continue

            def retype(o, name=name, code=code):
                o[name]["dtype"] = code

            yield "dtype change", with_outer(blob, retype)
    for name in names:

        def reshape(o, name=name):
            o[name]["shape"] = [10**12, 10**12]

        yield "huge shape", with_outer(blob, reshape)
    for cast in (torch.float16, torch.bfloat16, torch.float64, torch.float8_e4m3fn):
        for resign in (False, True):

            def recast(tensors, cast=cast):
                tensors["f_q.head.weight"] = tensors["f_q.head.weight"].to(cast)

            yield "dtype change (re-saved)", resave(blob, recast, resign)


def resave(blob: bytes, edit, resign: bool) -> bytes:
    tensors = safetensors.torch.load(blob)
    outer, _ = split(blob)
    header = json.loads(outer["__metadata__"][HEADER_KEY])
    edit(tensors)
    if resign:
        header["checksum"]["value"] = header_checksum(header, tensors)
    return safetensors.torch.save(tensors, metadata={HEADER_KEY: json.dumps(header)})


def test_altered_sampler_files_load_identically_or_raise_sampler_file_error(tmp_path):
    original = tmp_path / "original.safetensors"
    save_sampler(original_sampler(), original, provenance={"config": {"seed": 1}, "note": "é"})
    blob = original.read_bytes()
    reference = signature(load_sampler(original))
    outcomes: Counter = Counter()
    failures = []
    path = tmp_path / "altered.safetensors"
    for i, (kind, altered) in enumerate(variants(blob, random.Random(SEED))):
        path.write_bytes(altered)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loaded = load_sampler(path)
        except SamplerFileError:
            outcomes[kind, "rejected"] += 1
            continue
        except Exception as err:  # a traceback the user would see
            failures.append(f"#{i} {kind}: {type(err).__name__}: {str(err)[:200]}")
            continue
        if signature(loaded) != reference:
            failures.append(f"#{i} {kind}: loaded silently as another sampler")
        else:
            outcomes[kind, "identical"] += 1
    total = sum(outcomes.values()) + len(failures)
    assert total >= 500, total
    assert not failures, f"{len(failures)} of {total} variants:\n" + "\n".join(failures[:20])
    # Every kind of alteration was produced and judged.
    kinds = {kind for kind, _ in outcomes}
    assert len(kinds) >= 12, outcomes


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (setter("architecture", "q_hidden", [10**8]), r"widths in \[1, 1024\]"),
        (setter("statistics", "bogus", 1.0), r"unknown header field\(s\) \['statistics.bogus'\]"),
        (setter("constants", "friction_scale", 1e308), "'constants.friction_scale' must be"),
        (setter(None, "provenance", nested(5000)), "nests deeper than"),
        (setter("architecture", "dtype", "float8_e4m3fn"), "'architecture.dtype' must be one of"),
    ],
)
def test_crashes_of_the_old_loader_are_named_errors(tmp_path, edit, message):
    """Each of these once gave a raw traceback (or a 3.6 GiB allocation), even with a
    consistent checksum."""
    original = tmp_path / "original.safetensors"
    save_sampler(original_sampler(), original)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(with_header(original.read_bytes(), edit, resign=True))
    with pytest.raises(SamplerFileError, match=message):
        load_sampler(bad)


def test_header_edits_are_caught_by_the_whole_file_checksum(tmp_path):
    original = tmp_path / "original.safetensors"
    save_sampler(original_sampler(), original)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(with_header(original.read_bytes(), setter("training", "eta", 0.41)))
    with pytest.raises(SamplerFileError, match="header and tensors do not match the checksum"):
        load_sampler(bad)


def test_dtype_disagreement_is_not_cast(tmp_path):
    original = tmp_path / "original.safetensors"
    save_sampler(original_sampler(), original)
    bad = tmp_path / "bad.safetensors"

    def to_double(tensors):
        tensors["f_q.head.weight"] = tensors["f_q.head.weight"].double()

    bad.write_bytes(resave(original.read_bytes(), to_double, resign=True))
    with pytest.raises(SamplerFileError, match=r"f_q.head.weight is torch.float64, expected"):
        load_sampler(bad)


@pytest.mark.parametrize("path", sorted(Path(__file__).parents[1].glob("pretrained/*.safetensors")))
def test_shipped_files_are_current_format_and_load_without_a_warning(path):
    # The shipped samplers are of the current format: their checksum covers the header too,
    # so loading them verifies everything and warns about nothing.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler = load_sampler(path, lr=0.01)
    assert isinstance(sampler, NNSGHMC)
    assert read_header(path)["format_version"] == FORMAT_VERSION
