"""The held-out predictive loss: what the chains' samples predict for data they never saw.

The ELBO losses (:mod:`.losses`) ask the chains' law to approach the posterior. A user of a
Bayesian network judges the samples by the predictive they give on new data, after a finite
run that is far from stationarity: the posterior average of ``p(y | x, theta)`` over the
samples. This loss asks for that directly. Over a window's cross-chain slices (``T`` times,
``K`` chains each, ``n = T K`` samples attached to the graph of the sampler's nets) and a
minibatch of ``B`` held-out examples::

    L = -(1 / B) sum_b log( (1 / n) sum_s p(y_b | x_b, theta_s) ),

the negative log-likelihood of the samples' pooled predictive, per example: exactly what the
evaluation's posterior-average NLL is on the test data, for the samples of one window. Its
gradient flows through every position back through the unroll to the nets. The sampler stays a
valid sampler whatever its nets learn (the complete recipe fixes the stationary law): this
loss can only choose how the chains get there and move there, which is what a finite run sees.

The held-out examples are the training problem's validation split, never its test split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..benchmark.metrics import ensemble_log_probs_from_lp

__all__ = ["HeldOutPredictive", "heldout_predictive_loss"]

#: ``(theta (K, D), x (B, ...), y (B, ...)) -> (K, B)`` per-chain, per-example log-likelihoods
#: (:meth:`metasampler.BayesianModel.log_likelihood`), differentiable in ``theta``.
LogLikelihood = Callable[[Tensor, Tensor, Tensor], Tensor]


def heldout_predictive_loss(
    positions: Sequence[Tensor], log_likelihood: LogLikelihood, x: Tensor, y: Tensor
) -> Tensor:
    """``L`` of the module docstring for the ``(K, D)`` slices ``positions`` on ``(x, y)``."""
    if len(positions) == 0:
        raise ValueError("positions must hold at least one time slice")
    per_sample = torch.cat([log_likelihood(theta, x, y) for theta in positions])  # (n, B)
    return -ensemble_log_probs_from_lp(per_sample).mean()


class HeldOutPredictive:
    """:func:`heldout_predictive_loss` on a fresh minibatch of a held-out set per call.

    Args:
        log_likelihood: the model's per-chain log-likelihood (see ``LogLikelihood``).
        x, y: the held-out examples (the training problem's validation split).
        batch_size: examples per call (all of them when it is larger than the set).
        generator: draws the minibatches (the run's generator: resume stays bit-exact).
    """

    burn_in = 0  # (every slice; see metasampler.meta.update.SliceLoss)

    def __init__(
        self,
        log_likelihood: LogLikelihood,
        x: Tensor,
        y: Tensor,
        batch_size: int,
        generator: torch.Generator,
    ) -> None:
        if x.shape[0] != y.shape[0] or x.shape[0] == 0:
            raise ValueError(
                f"the held-out set needs as many labels as inputs, at least one: got "
                f"{x.shape[0]} inputs and {y.shape[0]} labels"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        self.log_likelihood = log_likelihood
        self.x, self.y = x, y
        self.batch_size = min(int(batch_size), x.shape[0])
        self.generator = generator

    def loss(self, positions: Sequence[Tensor]) -> Tensor:
        """The loss of the slices ``positions`` on a minibatch drawn without replacement."""
        n = self.x.shape[0]
        device = self.generator.device
        rows = torch.randperm(n, generator=self.generator, device=device)[: self.batch_size]
        rows = rows.to(self.x.device)
        return heldout_predictive_loss(positions, self.log_likelihood, self.x[rows], self.y[rows])
