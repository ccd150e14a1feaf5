"""The minibatch gradient noise's variance, estimated per chain and coordinate.

A stochastic gradient ``grad Ũ = grad U + eps`` brings ``eta^2 V`` of momentum variance per
step (times ``Q^2`` through a curl), which the friction does not balance: the chains run hot.
Where ``V`` is known the samplers leave that share out of the injected noise (SGHMC's ``B``
correction, Chen et al. 2014). Where it is not, a target that can
(:class:`~metasampler.BayesianModel`: from the two halves of each minibatch;
:class:`~metasampler.EnergyTarget`: from the two halves it draws its injected noise from) returns a
one-draw unbiased estimate with each evaluation, ``Evaluation.grad_noise_var``; a chain keeps
its running mean, :func:`update_noise_var`.
"""

from __future__ import annotations

from torch import Tensor

from .targets import Evaluation

__all__ = ["NOISE_DECAY", "running_mean", "update_noise_var"]

#: Decay of the running mean of the estimated variance: one step's estimate is about a
#: ``chi^2_1`` draw, so it is averaged over about 20 steps, short against the chain's drift on
#: a Bayesian network.
NOISE_DECAY = 0.95


def running_mean(past: Tensor | None, value: Tensor, step: int, decay: float) -> Tensor:
    """A chain statistic's running mean after its ``step``-th value (1-based): a plain mean
    while ``1 / step > 1 - decay``, then an exponential average."""
    if past is None:
        return value
    return past.lerp(value, max(1.0 / step, 1.0 - decay))  # past + w (value - past)


def update_noise_var(past: Tensor | None, ev: Evaluation, step: int) -> Tensor | None:
    """The running mean of the estimated variance after the chain's ``step``-th evaluation
    ``ev`` (``None`` when ``ev`` carries no estimate)."""
    if ev.grad_noise_var is None:
        return None
    return running_mean(past, ev.grad_noise_var, step, NOISE_DECAY)
