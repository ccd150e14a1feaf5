"""A Bayesian logistic regression with a reference posterior: an ordinary model whose
parameters are identifiable, as a user would write it (the README's), with held-out and test
data from the same law.

``p(y = 1 | x) = sigmoid(x w + b)`` with a Bernoulli likelihood and prior ``N(0, I)`` on
``(w, b)``; the labels are drawn as ``1[x (1.5, -2, 0.5) + 0.3 N(0, 1) > 0]``. Its posterior
has no closed form: :meth:`LogisticRegressionTask.reference` samples it by
Metropolis-corrected HMC on the full data (exact up to Monte Carlo error).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

import metasampler as ms

__all__ = ["LogisticRegressionTask", "logistic_regression"]

_WEIGHTS = (1.5, -2.0, 0.5)


@dataclass(frozen=True)
class LogisticRegressionTask:
    """The model (minibatches; parameters ordered as ``nn.Linear``'s), its full-data twin, and
    held-out and test data ``(x, y)`` (``y`` of shape ``(n, 1)``)."""

    model: ms.BayesianModel
    full_data: ms.BayesianModel
    held_out: tuple[Tensor, Tensor]
    test: tuple[Tensor, Tensor]

    def reference(self, n_chains: int = 8, trajectories: int = 2500) -> ms.SampleResult:
        """Samples of the posterior by HMC on the full data: ``n_chains`` chains of
        ``trajectories`` trajectories of 20 leapfrog steps (one draw each), after a fifth as
        many."""
        hmc = ms.samplers.HMC(eta=0.05, n_leapfrog=20)
        steps = 20 * trajectories
        return ms.sample(
            hmc, self.full_data, n_chains, steps + steps // 5, burn_in=steps // 5, seed=0,
            progress=False,
        )  # fmt: skip

    def moments(self, result: ms.SampleResult) -> tuple[Tensor, Tensor]:
        """The mean and covariance (float64) of ``result``'s draws, all chains pooled."""
        draws = result.theta.flatten(0, 1).double()
        return draws.mean(0), torch.cov(draws.T)


def _draw(n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    x = torch.randn(n, len(_WEIGHTS), generator=generator)
    logits = x @ torch.tensor(_WEIGHTS) + 0.3 * torch.randn(n, generator=generator)
    return x, (logits > 0).float()[:, None]


def logistic_regression(
    n: int = 300, n_held_out: int = 100, n_test: int = 2000, batch_size: int = 100, seed: int = 0
) -> LogisticRegressionTask:
    """``n`` training, ``n_held_out`` held-out and ``n_test`` test examples, as a
    :class:`LogisticRegressionTask` with minibatches of ``batch_size``."""
    g = torch.Generator().manual_seed(seed)
    (x, y), held_out, test = _draw(n, g), _draw(n_held_out, g), _draw(n_test, g)

    def model(batch: int) -> ms.BayesianModel:
        return ms.BayesianModel(
            torch.nn.Linear(len(_WEIGHTS), 1), (x, y), likelihood="bernoulli", prior_std=1.0,
            batch_size=batch,
        )  # fmt: skip

    return LogisticRegressionTask(model(batch_size), model(n), held_out, test)
