"""The data-side interface of a classification problem: what the transfer benchmark reads and
what the application's tasks (``tasks.bnn``, ``tasks.chorales``) provide."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

__all__ = ["ClassificationSplits"]


@dataclass
class ClassificationSplits:
    """The data-side interface the benchmark needs (``tasks.bnn.ClassificationData`` has the
    same attributes): train / validation / test splits, class count, optional OOD inputs."""

    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    x_test: Tensor
    y_test: Tensor
    n_classes: int
    ood_x: Tensor | None
    name: str
    model: nn.Module
    input_shape: tuple[int, ...]
