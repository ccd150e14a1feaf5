"""A small synthetic classification problem (Gaussian blobs through a tiny MLP) for tests and
smoke runs of the benchmark: it needs no data files."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..bayesian import BayesianModel
from ..splits import ClassificationSplits

__all__ = ["SyntheticProblem", "synthetic_classification_problem"]


@dataclass
class SyntheticProblem:
    """Same fields as ``tasks.registry.Problem``: ``target``, ``init``, ``exact``, ``name``,
    ``data``."""

    target: BayesianModel
    init: Callable[[int, torch.Generator], Tensor]
    exact: None
    name: str
    data: ClassificationSplits


def synthetic_classification_problem(
    n_train: int = 400,
    n_val: int = 200,
    n_test: int = 200,
    n_ood: int = 200,
    n_features: int = 8,
    n_classes: int = 3,
    hidden: Sequence[int] = (16,),
    activation: str = "relu",
    separation: float = 2.0,
    batch_size: int = 50,
    prior_std: float = 1.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> SyntheticProblem:
    """Gaussian class blobs (means ``separation * N(0, I)``, unit noise) classified by a small
    MLP; OOD inputs are broad noise ``N(0, (3 * separation)^2 I)``. For tests and smoke runs."""
    g = torch.Generator().manual_seed(int(seed))
    means = separation * torch.randn(n_classes, n_features, generator=g)

    def draw(n: int) -> tuple[Tensor, Tensor]:
        y = torch.randint(0, n_classes, (n,), generator=g)
        return means[y] + torch.randn(n, n_features, generator=g), y

    (x_tr, y_tr), (x_va, y_va), (x_te, y_te) = draw(n_train), draw(n_val), draw(n_test)
    ood = 3.0 * separation * torch.randn(n_ood, n_features, generator=g) if n_ood else None
    acts = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "softplus": nn.Softplus}
    layers: list[nn.Module] = []
    width = n_features
    for h in hidden:
        layers += [nn.Linear(width, h), acts[activation]()]
        width = h
    module = nn.Sequential(*layers, nn.Linear(width, n_classes))
    target = BayesianModel(
        module, (x_tr, y_tr), prior_std=prior_std, batch_size=batch_size, dtype=dtype, device=device
    )

    def init(n_chains: int, generator: torch.Generator) -> Tensor:
        return target.init_positions(n_chains, generator)

    data = ClassificationSplits(
        *(t.to(device) for t in (x_tr, y_tr, x_va, y_va, x_te, y_te)),
        n_classes=n_classes,
        ood_x=None if ood is None else ood.to(device),
        name=f"synthetic({n_classes} classes, {n_features} features)",
        model=module,
        input_shape=(n_features,),
    )
    return SyntheticProblem(target, init, None, f"synthetic(D={target.dim})", data)
