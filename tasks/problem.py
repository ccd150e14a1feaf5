"""What the task modules share: the :class:`Problem` they build, the seeded data split and the
Bayesian-network problem on a training split.

Every task module (``tasks.registry``, ``tasks.bnn``, ``tasks.chorales``) imports from here and
nothing here imports them back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from metasampler.bayesian import BayesianModel
from metasampler.splits import ClassificationSplits
from metasampler.targets import Target

from .gaussian import GaussianTask

__all__ = ["Problem", "enum_value", "problem_from_splits", "split_indices"]


@dataclass
class Problem:
    """A target plus how its chains start.

    Attributes:
        target: the K-chain target.
        init: ``(n_chains, generator) -> (K, D)`` initial positions.
        exact: the toy task with exact moments (``None`` for Bayesian models).
        name: a short label for logs.
        data: for Bayesian models, the data splits and model (see ``tasks.bnn``).
    """

    target: Target
    init: Callable[[int, torch.Generator], Tensor]
    exact: GaussianTask | None
    name: str
    data: Any = None


def enum_value(x: Any) -> Any:
    """``x.value`` for an enum member (a config field), else ``x`` itself."""
    return getattr(x, "value", x)


def split_indices(
    n: int, n_val: int, n_test: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Disjoint sorted index sets ``(train, val, test)`` covering ``range(n)``: a permutation
    from ``numpy.random.default_rng(seed)``; its first ``n_test`` entries are the test set,
    the next ``n_val`` the validation set, the rest the training set."""
    if seed < 0:
        raise ValueError(f"the data split seed must be >= 0, got {seed}")
    if min(n_val, n_test) < 0 or n_val + n_test >= n:
        raise ValueError(f"cannot split {n} examples into {n_val} val + {n_test} test + train")
    perm = np.random.default_rng(int(seed)).permutation(int(n))
    test = np.sort(perm[:n_test])
    val = np.sort(perm[n_test : n_test + n_val])
    train = np.sort(perm[n_test + n_val :])
    return train, val, test


def problem_from_splits(
    data: ClassificationSplits,
    cfg: Any,
    likelihood: str,
    *,
    unit: str = "examples",
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Problem:
    """A :class:`Problem` of a Bayesian network on the training split of ``data``.

    ``target``: :class:`metasampler.BayesianModel` of ``data.model`` on
    ``(data.x_train, data.y_train)`` with ``likelihood``, ``prior_std = cfg.prior_std`` and
    ``batch_size = cfg.batch_size``; ``init(n_chains, generator)``:
    ``target.init_positions(..., scheme="module")``; ``exact``: ``None``; ``name``:
    ``data.name``; ``data``: ``data``.

    Args:
        data: the splits and architecture (:class:`ClassificationData`,
            ``tasks.chorales.SequenceData``).
        cfg: the task config (reads ``batch_size`` and ``prior_std``).
        likelihood: a :class:`metasampler.BayesianModel` likelihood name.
        unit: what one training item is called in the batch-size error message.

    Raises:
        ValueError: ``cfg.batch_size`` exceeds the number of training items.
    """
    n_train = len(data.y_train)
    if int(cfg.batch_size) > n_train:
        raise ValueError(
            f"task.batch_size={cfg.batch_size} exceeds the {n_train} training {unit} of {data.name}"
        )
    target = BayesianModel(
        data.model,
        (data.x_train, data.y_train),
        likelihood=likelihood,
        prior_std=float(cfg.prior_std),
        batch_size=int(cfg.batch_size),
        dtype=dtype,
        device=device,
    )

    def init(n_chains: int, generator: torch.Generator) -> Tensor:
        return target.init_positions(n_chains, generator, scheme="module")

    return Problem(target=target, init=init, exact=None, name=data.name, data=data)
