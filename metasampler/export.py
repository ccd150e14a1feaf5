"""Export and load trained samplers: one ``.safetensors`` file per :class:`NNSGHMC`.

A sampler file is a plain `safetensors <https://github.com/huggingface/safetensors>`_ file —
nothing in it is pickled, so loading a file from an untrusted source cannot run code:

* **Tensors**: the module's ``state_dict`` — the weights of ``f_q`` / ``f_d`` (e.g.
  ``f_q.layers.0.weight``, ``f_q.head.bias``) and the buffers ``energy_loc``, ``energy_std``,
  ``momentum_std`` (input statistics, float64) and ``train_dim`` (int64). Every floating
  tensor is finite.
* **Metadata**: one key, ``"metasampler"``, holding a JSON header::

    {
      "format": "metasampler.nnsghmc",
      "format_version": 10,
      "architecture": {"q_hidden": [10], "d_hidden": [10], "activation": "softsign",
                       "curl_input": "stiffness", "dtype": "float32"},
      "constants": {"gamma": "exact", "alpha": 0.0, "friction_scale": 0.017,
                    "grad_input_scale": 70.0, "thermostat": true},
      "training": {"eta": null, "lr": 0.007, "temperature": 1.0},
      "statistics": {"energy_loc": 0.3, "energy_std": 0.1, "momentum_std": 1.3},
      "train_dim": 15910,
      "checksum": {"algorithm": "sha256-header+tensors", "value": "<64 hex digits>"},
      "provenance": {"commit": "<git HEAD or 'unknown'>", "created": "<ISO 8601 UTC>",
                     "torch": "2.13.0", "metasampler": "0.2.0", "config": {...},
                     "seed": 0, "...": "user-supplied"}
    }

  The architecture and constants are the :class:`NNSGHMC` constructor arguments
  (``docs/METHOD.md`` §3, described once by :class:`~metasampler.nnsghmc_args.NNSGHMCArgs`,
  in that order), so the file alone rebuilds the sampler. ``statistics`` and ``train_dim``
  repeat the buffers for inspection (the tensors are authoritative; a disagreement is an
  error). ``training`` records the step the sampler was meta-trained with:
  :func:`load_sampler` uses it unless ``eta`` or ``lr`` is given. ``checksum`` is a SHA-256
  over the canonical JSON of the rest of the header and every tensor's name, dtype, shape and
  bytes, so any change to the file is detected (``metasampler/sampler_file.py`` defines it
  and every check). Files of earlier format versions hold samplers of an earlier design and
  are refused with a :class:`SamplerFileError` that says how to replace them
  (the changelog of 0.2.0).

:func:`save_sampler` (:mod:`metasampler.sampler_write`) writes through a temporary file in the
target directory and ``os.replace``, so an interrupted save leaves either the old file or
none, never half a file (temporary files of killed saves are removed by the next save into
that directory).
:func:`load_sampler` checks the whole file (sizes, layout, strict header schema, checksum)
before building anything; every failure is a :class:`SamplerFileError` saying what is wrong.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .devices import check_device
from .learned.nnsghmc import NNSGHMC
from .nnsghmc_args import GAMMA_MODES, NNSGHMCArgs
from .sampler_file import (
    SamplerFile,
    SamplerFileError,
    read_raw_header,
    read_sampler_file,
)
from .sampler_format import (
    DTYPES,
    FORMAT,
    FORMAT_VERSION,
    HEADER_KEY,
    NET_DTYPES,
    READABLE_VERSIONS,
)
from .schedules import Schedule
from .stepsize import check_step_args

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "HEADER_KEY",
    "SamplerFileError",
    "load_sampler",
    "pretrained_samplers",
    "read_header",
    "save_sampler",
]

_POSITIVE_STATISTICS = ("energy_std", "momentum_std")

PathLike = str | os.PathLike

#: The samplers shipped with the package (``<name>.safetensors`` + ``index.json``). In a
#: checkout this is a link to the top-level ``pretrained/`` folder; a wheel holds a copy.
PRETRAINED_DIR = Path(__file__).parent / "pretrained"


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
    sampler.save(path, provenance=provenance)


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------
def read_header(path: PathLike) -> dict:
    """The JSON header of a sampler file, for inspection.

    Checks that ``path`` is a safetensors file of bounded size with a strict-JSON metasampler
    header of format ``"metasampler.nnsghmc"``; does not check ``format_version`` (so it can
    describe files of other versions), the schema, the tensors nor the checksum —
    :func:`load_sampler` does.

    Raises:
        TypeError: ``path`` is not a path (e.g. a loaded sampler or ``None``).
        FileNotFoundError: no file at ``path``.
        SamplerFileError: not a safetensors file, or not a metasampler sampler.
    """
    return read_raw_header(_checked_path(path, "read_header"))


def training_config(path_or_name: PathLike) -> DictConfig:
    """The resolved config of the run that wrote a sampler file (a path or a shipped name), as
    stored in its header's provenance; an empty config for a file that stores none.

    Raises:
        TypeError, FileNotFoundError, SamplerFileError: as :func:`read_header`.
    """
    from omegaconf import OmegaConf

    text = (
        read_header(_sampler_file(path_or_name, "training_config"))
        .get("provenance", {})
        .get("config")
    )
    return OmegaConf.create(text or "{}")  # the run's config, as YAML text


def pretrained_samplers() -> dict[str, str]:
    """The shipped samplers that :func:`load_sampler` accepts by name, with what each was
    meta-trained on (``{name: description}``, sorted by name)."""
    index_file = PRETRAINED_DIR / "index.json"
    index = json.loads(index_file.read_text()) if index_file.is_file() else {}
    names = sorted(p.stem for p in PRETRAINED_DIR.glob("*.safetensors"))
    return {name: index.get(name, "(no description)") for name in names}


def _checked_path(value: object, caller: str) -> Path:
    """``value`` as a path; a ``TypeError`` naming ``caller`` for anything else (a loaded
    sampler, ``None``), not one from deep inside ``pathlib``."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(
            f"{caller}: expected a sampler file's path or a shipped sampler's name (str or "
            f"os.PathLike), got {type(value).__name__} {value!r:.80}"
        )
    return Path(value)


def _sampler_file(path_or_name: PathLike, caller: str) -> Path:
    """``path_or_name`` itself if it is a path; a bare name (no suffix, no folder) that is not
    an existing file means the shipped sampler of that name."""
    path = _checked_path(path_or_name, caller)
    if path.exists():
        return path
    if path.suffix or len(path.parts) != 1:
        raise FileNotFoundError(
            f"no sampler file at {str(path)!r}; shipped samplers load by name: "
            f"{', '.join(pretrained_samplers())}"
        )
    shipped = PRETRAINED_DIR / f"{path.name}.safetensors"
    if shipped.is_file():
        return shipped
    raise FileNotFoundError(
        f"no sampler file at {str(path)!r} and no shipped sampler of that name; shipped "
        f"samplers: {', '.join(pretrained_samplers()) or 'none'}"
    )


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

    The whole file is checked before anything is built (``metasampler/sampler_file.py``):
    layout and sizes, the strict header schema of its format version, and its checksum over
    header and tensors.

    Args:
        path: the ``.safetensors`` file, or the name of a shipped sampler (e.g.
            ``"feedforward"``; :func:`pretrained_samplers` lists them).
        eta, lr: evaluation step (at most one); default: the step stored from training.
        gamma: override the stored ``gamma`` mode (e.g. ``"finite_difference"``); a
            ``ValueError`` where the file's design needs the other (a thermostat or a curl fed
            the stiffness needs ``"exact"``).
        device: where the nets and buffers go.
        dtype: floating dtype of the nets' weights (default: as stored); the input statistics
            stay float64.
        temperature, schedule: as for every sampler.

    Returns:
        An :class:`NNSGHMC` in ``eval()`` mode with ``requires_grad=False`` everywhere.

    Raises:
        TypeError: ``path`` is not a path or a name (e.g. ``None``).
        FileNotFoundError: no file at ``path`` and no shipped sampler of that name.
        SamplerFileError: the file is not a valid sampler file of a version in
            ``READABLE_VERSIONS`` (the message says what is wrong).
        DeviceError: ``device`` is not a device name or not available here (a ``ValueError``).
        ValueError: bad arguments, or no ``eta`` / ``lr`` given and none stored.
    """
    _checked_path(path, "load_sampler")
    # Arguments first, so that any error the constructor raises below is the file's.
    device = check_device(device) or torch.device("cpu")
    _check_load_args(eta, lr, gamma, temperature, dtype)

    path = _sampler_file(path, "load_sampler")
    file = read_sampler_file(path, READABLE_VERSIONS, FORMAT_VERSION)
    header = file.header
    training = header["training"]
    if eta is None and lr is None:
        eta, lr = training["eta"], training["lr"]
    step_known = eta is not None or lr is not None
    # Without a known step a placeholder lets the file be validated before that is reported.
    step = {"eta": eta if step_known else 1.0, "lr": lr}
    sampler = _build(path, header, gamma, temperature=temperature, schedule=schedule, **step)
    tensors = _read_tensors(path, file, sampler.state_dict())
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


def _check_load_args(
    eta: float | None,
    lr: float | None,
    gamma: str | None,
    temperature: float,
    dtype: torch.dtype | None,
) -> None:
    """:func:`load_sampler`'s own arguments (``ValueError`` for a bad one)."""
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


def _build(path: Path, header: dict, gamma: str | None, **sampler_args: Any) -> NNSGHMC:
    """The sampler the header describes (``gamma``: overrides the stored mode), its nets in
    the stored dtype; ``sampler_args``: the step, temperature and schedule."""
    try:
        args = NNSGHMCArgs.from_header(header["architecture"], header["constants"])
    except ValueError as err:
        raise SamplerFileError(f"{path} holds an invalid sampler description: {err}") from None
    if gamma is not None:  # (a conflict with the file's options is the argument's, not the file's)
        try:
            args = dataclasses.replace(args, gamma=gamma)
        except ValueError as err:
            raise ValueError(f"gamma={gamma!r} cannot run {path}: {err}") from None
    # seed=None: no random draws, the weights come from the file. The schema bounds every
    # size, so building allocates little.
    sampler = NNSGHMC(seed=None, **sampler_args, **args.as_kwargs())
    net_dtype = DTYPES[NET_DTYPES[header["architecture"]["dtype"]]][0]
    sampler.f_q.to(dtype=net_dtype)
    sampler.f_d.to(dtype=net_dtype)
    return sampler


def _read_tensors(
    path: Path, file: SamplerFile, expected: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """The file's tensors, checked against the names, shapes and exact dtypes of
    ``expected`` (the state dict of a sampler built from the header): nothing is cast."""
    invalid = f"{path} is not a valid sampler file"
    names = set(file.tensors)
    missing, extra = sorted(set(expected) - names), sorted(names - set(expected))
    if missing or extra:
        raise SamplerFileError(
            f"{invalid}: its tensors do not match the architecture in its header; "
            f"missing: {missing or 'none'}; unexpected: {extra or 'none'}"
        )
    mismatches = [
        f"{name}: expected {tuple(expected[name].shape)}, got {file.tensors[name][1]}"
        for name in sorted(names)
        if file.tensors[name][1] != tuple(expected[name].shape)
    ]
    if mismatches:
        raise SamplerFileError(
            f"{invalid}: tensor shapes do not match the architecture in its header: "
            + "; ".join(mismatches)
        )
    wrong = [
        f"{name} is {DTYPES[file.tensors[name][0]][0]}, expected {expected[name].dtype}"
        for name in sorted(names)
        if DTYPES[file.tensors[name][0]][0] != expected[name].dtype
    ]
    if wrong:
        raise SamplerFileError(
            f"{invalid}: tensor dtypes disagree with the header (nets in "
            "'architecture.dtype', statistics float64, train_dim int64): " + "; ".join(wrong)
        )
    return {name: file.tensor(name) for name in sorted(names)}


def _check_values(path: Path, header: dict, tensors: Mapping[str, Tensor]) -> None:
    """Finite values, positive statistics and agreement with the header."""
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
