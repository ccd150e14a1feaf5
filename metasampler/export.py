"""Export and load trained samplers: one ``.safetensors`` file per :class:`NNSGHMC`.

A sampler file is a plain `safetensors <https://github.com/huggingface/safetensors>`_ file —
nothing in it is pickled, so loading a file from an untrusted source cannot run code:

* **Tensors**: the module's ``state_dict`` — the weights of ``f_q`` / ``f_d`` (e.g.
  ``f_q.layers.0.weight``, ``f_q.head.bias``) and the buffers ``energy_loc``, ``energy_std``,
  ``momentum_std``, ``grad_std`` (input statistics, float64) and ``train_dim`` (int64).
  Every floating tensor is finite.
* **Metadata**: one key, ``"metasampler"``, holding a JSON header::

    {
      "format": "metasampler.nnsghmc",
      "format_version": 2,
      "architecture": {"q_hidden": [40], "d_hidden": [40], "activation": "tanh",
                       "d_output": "softplus", "dtype": "float32"},
      "constants": {"beta_off": 0.0, "alpha": 0.0, "c": 0.0, "q_clamp": 5.0,
                    "d_output_scale": 1.0, "energy_input_scale": 1.0,
                    "grad_input_scale": 1.0, "gamma": "exact",
                    "momentum_init": "normal", "detach_inputs": true,
                    "d_clamp": null, "grad_input": "standardised",
                    "friction_units": "absolute"},
      "training": {"eta": 0.01, "lr": null, "temperature": 1.0},
      "statistics": {"energy_loc": 0.0, "energy_std": 1.0, "momentum_std": 1.3,
                     "grad_std": 2.1},
      "train_dim": 10,
      "checksum": {"algorithm": "sha256", "value": "<64 hex digits>"},
      "provenance": {"commit": "<git HEAD or 'unknown'>", "created": "<ISO 8601 UTC>",
                     "torch": "2.13.0", "metasampler": "0.1.0", "...": "user-supplied"}
    }

  The architecture and constants are the :class:`NNSGHMC` constructor arguments (SPEC §3),
  so the file alone rebuilds the sampler. ``statistics`` and ``train_dim`` repeat the buffers
  for inspection (the tensors are authoritative; a disagreement is an error). ``training``
  records the step the sampler was meta-trained with: :func:`load_sampler` uses it unless
  ``eta`` or ``lr`` is given. Version 1 files (written before ``d_clamp``, ``grad_input``
  and ``friction_units`` existed) still load, with those constants at their defaults
  (``null``, ``"standardised"``, ``"absolute"``: the behaviour they were trained with).
  ``checksum`` is a SHA-256 over every tensor's name, dtype,
  shape and bytes (sorted by name), so corrupted tensor data is detected.

:func:`save_sampler` writes through a temporary file in the target directory and
``os.replace``, so an interrupted save leaves either the old file or none, never half a file.
:func:`load_sampler` validates the file before building anything and says what is wrong.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
from torch import Tensor

from .learned.nnsghmc import GAMMA_MODES, NNSGHMC
from .schedules import Schedule
from .stepsize import check_step_args

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "HEADER_KEY",
    "SamplerFileError",
    "load_sampler",
    "read_header",
    "save_sampler",
]

FORMAT = "metasampler.nnsghmc"
FORMAT_VERSION = 2
#: Older versions this metasampler still reads; the constants they lack take these values.
_READABLE_VERSIONS = (1, FORMAT_VERSION)
_V2_CONSTANTS = {"d_clamp": None, "grad_input": "standardised", "friction_units": "absolute"}
#: The safetensors metadata key holding the JSON header.
HEADER_KEY = "metasampler"

_STATISTICS = ("energy_loc", "energy_std", "momentum_std", "grad_std")
_POSITIVE_STATISTICS = ("energy_std", "momentum_std", "grad_std")
_FLOAT_CONSTANTS = (
    "beta_off",
    "alpha",
    "c",
    "q_clamp",
    "d_output_scale",
    "energy_input_scale",
    "grad_input_scale",
)

PathLike = str | os.PathLike


class SamplerFileError(ValueError):
    """A sampler file is unreadable, of another format or version, or inconsistent."""


# --------------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------------
def save_sampler(sampler: NNSGHMC, path: PathLike, provenance: dict | None = None) -> None:
    """Write ``sampler`` (weights, buffers, architecture, constants) to a safetensors file.

    Args:
        sampler: the (trained) :class:`NNSGHMC`.
        path: the file to write (conventionally ``*.safetensors``); replaced atomically if
            it exists.
        provenance: JSON-able facts about how it was made (config, seed, ...). Stored with
            ``commit`` (``git rev-parse HEAD`` of the metasampler checkout, else
            ``"unknown"``), ``created`` (UTC), ``torch`` and ``metasampler`` versions; keys
            given here take precedence over those. Values JSON cannot hold are stored as
            their ``str``.

    Raises:
        TypeError: ``sampler`` is not an :class:`NNSGHMC`.
        SamplerFileError: a parameter or buffer is not finite (nothing is written).
    """
    if not isinstance(sampler, NNSGHMC):
        raise TypeError(f"save_sampler expects an NNSGHMC, got {type(sampler).__name__}")
    if provenance is not None and not isinstance(provenance, Mapping):
        raise TypeError(f"provenance must be a dict or None, got {type(provenance).__name__}")
    if sampler.f_q.activation != sampler.f_d.activation:
        raise ValueError(
            "cannot export an NNSGHMC whose nets use different activations "
            f"(f_q: {sampler.f_q.activation}, f_d: {sampler.f_d.activation}); the constructor "
            "takes one activation for both"
        )
    tensors: dict[str, Tensor] = {}
    for name, value in sampler.state_dict().items():
        value = value.detach().to("cpu").clone().contiguous()
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).sum())
            raise SamplerFileError(
                f"refusing to save: tensor {name!r} has {bad} non-finite value(s) "
                f"of {value.numel()}"
            )
        tensors[name] = value
    header = _build_header(sampler, tensors, dict(provenance or {}))
    metadata = {HEADER_KEY: json.dumps(header, allow_nan=False)}
    _atomic_save(tensors, Path(path), metadata)


def _build_header(sampler: NNSGHMC, tensors: dict[str, Tensor], provenance: dict) -> dict:
    auto = {
        "commit": _git_commit(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "metasampler": _metasampler_version(),
    }
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "architecture": {
            "q_hidden": [int(h) for h in sampler.f_q.hidden],
            "d_hidden": [int(h) for h in sampler.f_d.hidden],
            "activation": sampler.f_q.activation,
            "d_output": sampler.f_d.output,
            "dtype": str(sampler.f_q.head.weight.dtype).removeprefix("torch."),
        },
        "constants": {
            **{name: float(getattr(sampler, name)) for name in _FLOAT_CONSTANTS},
            "gamma": sampler.gamma,
            "momentum_init": sampler.momentum_init,
            "detach_inputs": bool(sampler.detach_inputs),
            "d_clamp": sampler.d_clamp,
            "grad_input": sampler.grad_input,
            "friction_units": sampler.friction_units,
        },
        "training": {
            "eta": None if sampler.eta is None else float(sampler.eta),
            "lr": None if sampler.lr is None else float(sampler.lr),
            "temperature": float(sampler.temperature),
        },
        "statistics": {name: float(tensors[name]) for name in _STATISTICS},
        "train_dim": int(tensors["train_dim"]),
        "checksum": {"algorithm": "sha256", "value": _checksum(tensors)},
        "provenance": _jsonable({**auto, **provenance}),
    }


def _atomic_save(tensors: dict[str, Tensor], path: Path, metadata: dict[str, str]) -> None:
    """``save_file`` into a temporary sibling, then ``os.replace`` it onto ``path``."""
    directory = path.parent
    if not directory.is_dir():
        raise FileNotFoundError(f"directory {str(directory)!r} for {str(path)!r} does not exist")
    tmp = directory / f".{path.name}.{uuid.uuid4().hex}.tmp"
    # safetensors itself may write through a private (0o600) temporary file: give the result
    # the mode of the file it replaces, else the ordinary 0o666 minus the umask.
    mode = path.stat().st_mode & 0o777 if path.is_file() else 0o666 & ~_umask()
    try:
        safetensors.torch.save_file(tensors, tmp, metadata=metadata)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
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


def _checksum(tensors: Mapping[str, Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        value = tensors[name].detach().to("cpu").contiguous()
        shape = ",".join(str(s) for s in value.shape)
        digest.update(f"{name}\0{value.dtype}\0{shape}\0".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


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


def _metasampler_version() -> str:
    import metasampler  # local: the package may import this module while initialising

    return str(getattr(metasampler, "__version__", "unknown"))


def _jsonable(value: Any) -> Any:
    """A JSON-safe copy: dicts, lists, strings, finite numbers; anything else as ``str``."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Tensor) and value.numel() == 1:
        return _jsonable(value.item())
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy scalars
        return _jsonable(value.item())
    return str(value)


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------
def read_header(path: PathLike) -> dict:
    """The JSON header of a sampler file, for inspection.

    Checks that ``path`` is a safetensors file with a metasampler header of format
    ``"metasampler.nnsghmc"``; does not check ``format_version`` (so it can describe files of
    other versions) nor the tensors — :func:`load_sampler` does.

    Raises:
        FileNotFoundError: no file at ``path``.
        SamplerFileError: not a safetensors file, or not a metasampler sampler.
    """
    return _open(Path(path))


def load_sampler(
    path: PathLike,
    *,
    eta: float | None = None,
    lr: float | None = None,
    gamma: str | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    temperature: float = 1.0,
    schedule: Schedule | None = None,
) -> NNSGHMC:
    """Load a sampler written by :func:`save_sampler`, validated and frozen for evaluation.

    Args:
        path: the ``.safetensors`` file.
        eta, lr: evaluation step (at most one); default: the step stored from training.
        gamma: override the stored ``gamma`` mode (e.g. ``"finite_difference"``).
        device: where the nets and buffers go.
        dtype: floating dtype of the nets' weights (default: as stored); the input statistics
            stay float64.
        temperature, schedule: as for every sampler.

    Returns:
        An :class:`NNSGHMC` in ``eval()`` mode with ``requires_grad=False`` everywhere.

    Raises:
        FileNotFoundError: no file at ``path``.
        SamplerFileError: the file is not a valid sampler file of format version 1 or
            ``FORMAT_VERSION`` (the message says what is wrong).
        ValueError: bad arguments, or no ``eta`` / ``lr`` given and none stored.
    """
    # Arguments first, so that any error the constructor raises below is the file's.
    if eta is not None and lr is not None:
        raise ValueError("give at most one of eta (SDE step) or lr (per-batch learning rate)")
    if eta is not None or lr is not None:
        check_step_args(eta, lr)
    if gamma is not None and gamma not in GAMMA_MODES:
        raise ValueError(f"gamma must be one of {GAMMA_MODES}, got {gamma!r}")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating torch dtype or None, got {dtype!r}")
    device = torch.device(device)

    path = Path(path)
    header = _open(path)
    _check_version(path, header)
    _check_header(path, header)
    arch, training = header["architecture"], header["training"]
    consts = {**_V2_CONSTANTS, **header["constants"]}
    if eta is None and lr is None:
        eta, lr = training["eta"], training["lr"]
    step_known = eta is not None or lr is not None
    try:
        # seed=None: no random draws, the weights come from the file. Without a known step a
        # placeholder lets the file be validated before that is reported.
        sampler = NNSGHMC(
            eta=eta if step_known else 1.0,
            lr=lr,
            q_hidden=arch["q_hidden"],
            d_hidden=arch["d_hidden"],
            activation=arch["activation"],
            d_output=arch["d_output"],
            **{name: float(consts[name]) for name in _FLOAT_CONSTANTS},
            gamma=consts["gamma"] if gamma is None else gamma,
            detach_inputs=consts["detach_inputs"],
            momentum_init=consts["momentum_init"],
            d_clamp=consts["d_clamp"],
            grad_input=consts["grad_input"],
            friction_units=consts["friction_units"],
            temperature=temperature,
            schedule=schedule,
            seed=None,
        )
    except ValueError as err:
        raise SamplerFileError(f"{path} holds an invalid sampler description: {err}") from None
    net_dtype = _torch_dtype(path, arch["dtype"])
    sampler.f_q.to(dtype=net_dtype)
    sampler.f_d.to(dtype=net_dtype)

    tensors = _read_tensors(path, sampler.state_dict())
    _check_values(path, header, tensors)
    if not step_known:
        raise ValueError(
            f"{path} stores no training step (eta or lr); pass eta= or lr= to load_sampler"
        )
    with torch.no_grad():
        sampler.load_state_dict(tensors, strict=True)
    sampler.requires_grad_(False)
    sampler.eval()
    sampler.to(device=device)
    if dtype is not None:
        sampler.f_q.to(dtype=dtype)
        sampler.f_d.to(dtype=dtype)
    return sampler


def _open(path: Path) -> dict:
    """Read and parse the JSON header of ``path``; checks it is ours (format name only)."""
    if not path.exists():
        raise FileNotFoundError(f"no sampler file at {str(path)!r}")
    if not path.is_file():
        raise SamplerFileError(f"{path} is not a valid sampler file: not a regular file")
    try:
        with safetensors.safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
    except Exception as err:  # SafetensorError, OSError, ...: all mean "cannot be read"
        raise SamplerFileError(
            f"{path} is not a valid sampler file: {type(err).__name__}: {err} "
            "(truncated, corrupted or not a safetensors file)"
        ) from None
    if HEADER_KEY not in metadata:
        raise SamplerFileError(
            f"{path} is a safetensors file but not a metasampler sampler: its metadata has no "
            f"{HEADER_KEY!r} header (metadata keys: {sorted(metadata) or 'none'})"
        )
    try:
        header = json.loads(metadata[HEADER_KEY])
    except json.JSONDecodeError as err:
        raise SamplerFileError(
            f"{path} is not a valid sampler file: its {HEADER_KEY!r} header is not JSON ({err})"
        ) from None
    if not isinstance(header, dict):
        raise SamplerFileError(
            f"{path} is not a valid sampler file: its header is a JSON "
            f"{type(header).__name__}, not an object"
        )
    if header.get("format") != FORMAT:
        raise SamplerFileError(
            f"{path} is a safetensors file but not a metasampler sampler: header format is "
            f"{header.get('format')!r}, expected {FORMAT!r}"
        )
    return header


def _check_version(path: Path, header: dict) -> None:
    version = header.get("format_version")
    if version in _READABLE_VERSIONS and type(version) is int:
        return
    if type(version) is int and version > FORMAT_VERSION:
        hint = "; upgrade metasampler to load it"
    elif type(version) is int:
        hint = "; re-export it with a metasampler release that reads that version"
    else:
        hint = ""
    raise SamplerFileError(
        f"{path} was written by format version {version!r}; this metasampler reads versions "
        f"{' and '.join(map(str, _READABLE_VERSIONS))}{hint}"
    )


def _check_header(path: Path, header: dict) -> None:
    """Types of every header field the loader uses (values are checked by the constructor)."""

    def field(dotted: str, kinds: tuple[type, ...], what: str) -> Any:
        node: Any = header
        for key in dotted.split("."):
            if not isinstance(node, dict) or key not in node:
                raise SamplerFileError(
                    f"{path} is not a valid sampler file: header field {dotted!r} is missing"
                )
            node = node[key]
        ok = isinstance(node, kinds) and not (isinstance(node, bool) and bool not in kinds)
        if not ok:
            raise SamplerFileError(
                f"{path} is not a valid sampler file: header field {dotted!r} must be {what}, "
                f"got {node!r}"
            )
        return node

    number, optional = (int, float), (int, float, type(None))
    for name in ("q_hidden", "d_hidden"):
        widths = field(f"architecture.{name}", (list,), "a list of positive ints")
        if not widths or not all(type(h) is int and h > 0 for h in widths):
            raise SamplerFileError(
                f"{path} is not a valid sampler file: header field 'architecture.{name}' must "
                f"be a non-empty list of positive ints, got {widths!r}"
            )
    for name in ("activation", "d_output", "dtype"):
        field(f"architecture.{name}", (str,), "a string")
    for name in _FLOAT_CONSTANTS:
        field(f"constants.{name}", number, "a number")
    field("constants.gamma", (str,), "a string")
    field("constants.momentum_init", (str,), "a string")
    field("constants.detach_inputs", (bool,), "true or false")
    if header["format_version"] >= 2:
        field("constants.d_clamp", optional, "a number or null")
        field("constants.grad_input", (str,), "a string")
        field("constants.friction_units", (str,), "a string")
    eta = field("training.eta", optional, "a number or null")
    lr = field("training.lr", optional, "a number or null")
    if eta is not None and lr is not None:
        raise SamplerFileError(
            f"{path} is not a valid sampler file: header 'training' gives both eta and lr"
        )
    for name in _STATISTICS:
        field(f"statistics.{name}", number, "a number")
    field("train_dim", (int,), "an integer")
    field("checksum.algorithm", (str,), "a string")
    field("checksum.value", (str,), "a string")
    if header["checksum"]["algorithm"] != "sha256":
        raise SamplerFileError(
            f"{path} is not a valid sampler file: unknown checksum algorithm "
            f"{header['checksum']['algorithm']!r} (expected 'sha256')"
        )


def _torch_dtype(path: Path, name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise SamplerFileError(
            f"{path} is not a valid sampler file: header 'architecture.dtype' is {name!r}, "
            "not a floating torch dtype"
        )
    return dtype


def _read_tensors(path: Path, expected: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The file's tensors, checked against the names, shapes and dtype kinds of ``expected``
    (the state dict of a sampler built from the header)."""
    invalid = f"{path} is not a valid sampler file"
    try:
        with safetensors.safe_open(str(path), framework="pt", device="cpu") as handle:
            names = set(handle.keys())
            missing = sorted(set(expected) - names)
            extra = sorted(names - set(expected))
            if missing or extra:
                raise SamplerFileError(
                    f"{invalid}: its tensors do not match the architecture in its header; "
                    f"missing: {missing or 'none'}; unexpected: {extra or 'none'}"
                )
            mismatches = []
            for name in sorted(names):
                got = tuple(handle.get_slice(name).get_shape())
                want = tuple(expected[name].shape)
                if got != want:
                    mismatches.append(f"{name}: expected {want}, got {got}")
            if mismatches:
                raise SamplerFileError(
                    f"{invalid}: tensor shapes do not match the architecture in its header: "
                    + "; ".join(mismatches)
                )
            tensors = {name: handle.get_tensor(name) for name in sorted(names)}
    except SamplerFileError:
        raise
    except Exception as err:
        raise SamplerFileError(f"{invalid}: {type(err).__name__}: {err}") from None

    wrong = []
    for name, value in tensors.items():
        if expected[name].is_floating_point() and not value.is_floating_point():
            wrong.append(f"{name} is {value.dtype}, expected a floating dtype")
        elif not expected[name].is_floating_point() and (
            value.is_floating_point() or value.is_complex() or value.dtype == torch.bool
        ):
            wrong.append(f"{name} is {value.dtype}, expected an integer dtype")
    if wrong:
        raise SamplerFileError(f"{invalid}: wrong tensor dtypes: " + "; ".join(wrong))
    return tensors


def _check_values(path: Path, header: dict, tensors: Mapping[str, Tensor]) -> None:
    """Finite values, positive statistics, agreement with the header, then the checksum."""
    invalid = f"{path} is not a valid sampler file"
    for name, value in tensors.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).sum())
            raise SamplerFileError(
                f"{invalid}: tensor {name!r} has {bad} non-finite value(s) of {value.numel()}"
            )
    for name in _POSITIVE_STATISTICS:
        if not float(tensors[name]) > 0:
            raise SamplerFileError(
                f"{invalid}: input statistic {name!r} must be > 0, got {float(tensors[name])}"
            )
    if int(tensors["train_dim"]) < 0:
        raise SamplerFileError(
            f"{invalid}: train_dim must be >= 0, got {int(tensors['train_dim'])}"
        )
    stored = {**header["statistics"], "train_dim": header["train_dim"]}
    for name, value in stored.items():
        actual = tensors[name].item()
        if not math.isclose(actual, value, rel_tol=1e-9, abs_tol=0.0):
            raise SamplerFileError(
                f"{invalid}: header says {name} = {value!r} but the tensor holds {actual!r}"
            )
    if _checksum(tensors) != header["checksum"]["value"]:
        raise SamplerFileError(
            f"{invalid}: the tensor data does not match the checksum in its header "
            "(corrupted, or edited without re-saving through metasampler)"
        )
