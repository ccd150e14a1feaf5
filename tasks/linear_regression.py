"""A Bayesian linear regression with its exact Gaussian posterior: an ordinary model (any
``nn.Module`` through :class:`metasampler.BayesianModel`) whose samples can be checked
against the truth.

``y = x w + b + noise``, ``noise ~ N(0, noise_std^2)``, prior ``N(0, prior_std^2 I)`` on
``(w, b)``. With the design ``X = [x, 1]`` the posterior is Gaussian with precision
``X^T X / noise_std^2 + I / prior_std^2`` and mean ``Sigma X^T y / noise_std^2`` (Bishop 2006,
section 3.3). The default inputs have scales 1, 3 and 0.3, so the posterior's standard deviations
span a factor of ten and its stiffest direction is stiff for a minibatch sampler.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

import metasampler as ms

__all__ = ["LinearRegressionTask", "linear_regression"]


@dataclass(frozen=True)
class LinearRegressionTask:
    """The model (parameters ordered as ``nn.Linear``'s: weights, then the bias) and its
    exact posterior moments (float64)."""

    model: ms.BayesianModel
    mean: Tensor
    cov: Tensor


def linear_regression(
    n: int = 500,
    scales: tuple[float, ...] = (1.0, 3.0, 0.3),
    noise_std: float = 0.5,
    prior_std: float = 2.0,
    batch_size: int = 50,
    seed: int = 0,
) -> LinearRegressionTask:
    """``n`` examples with inputs ``N(0, scales^2)``, weights ``(1, -0.5, 2, ...)`` (cycled),
    bias 0.7, as a :class:`LinearRegressionTask` with minibatches of ``batch_size``."""
    g = torch.Generator().manual_seed(seed)
    dim = len(scales)
    x = torch.randn(n, dim, generator=g) * torch.tensor(scales)
    weights = torch.tensor([(1.0, -0.5, 2.0)[i % 3] for i in range(dim)]).unsqueeze(-1)
    y = x @ weights + 0.7 + noise_std * torch.randn(n, 1, generator=g)
    model = ms.BayesianModel(
        torch.nn.Linear(dim, 1), (x, y), likelihood="gaussian", noise_std=noise_std,
        prior_std=prior_std, batch_size=batch_size,
    )  # fmt: skip
    design = torch.cat([x, torch.ones(n, 1)], 1).double()
    precision = design.T @ design / noise_std**2
    precision += torch.eye(dim + 1, dtype=torch.float64) / prior_std**2
    cov = torch.linalg.inv(precision)
    mean = cov @ (design.T @ y.double()).squeeze(-1) / noise_std**2
    return LinearRegressionTask(model, mean, cov)
