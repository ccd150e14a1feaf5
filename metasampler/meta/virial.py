"""The temperature loss: every layer's configurational temperature asked to be 1.

Integrating by parts, ``E[theta_i dU/dtheta_i] = 1`` at the posterior ``exp(-U)``, for every
coordinate ``i`` (the virial theorem; :mod:`metasampler.benchmark.temperature`). Averaged over
a group ``g`` of coordinates (a layer of a network: its weights and bias) it is the group's
temperature, read off the chains alone. Measured per layer
(research/NOTEBOOK.md), the shipped MNIST sampler's deeper layers warm slowly and then run hot at
the tuned step, where mSGNHT-S's thermostat holds every layer at 1. This loss asks the
sampler's nets for that directly. Over a window's cross-chain slices (``S`` times, ``K``
chains each, attached to the graph of the nets)::

    T_g = (1 / (S K |g|)) sum_{s,k} sum_{i in g} theta_ski dŨ_s/dtheta_i (theta_sk),
    L   = (1 / G) sum_g (T_g^a - 1) (T_g^b - 1),

with ``Ũ_s`` the energy on a fresh minibatch per slice (``theta . grad Ũ`` is unbiased for
``theta . grad U``) and ``T_g^a``, ``T_g^b`` the temperatures of the two halves of the chains,
each on its own minibatches: independent estimates (up to the minibatches the chains shared
while unrolled), so ``L`` and its gradient are unbiased for
``(T_g - 1)^2`` and its gradient, where the square of one estimate adds its variance and a
covariance of the estimate with its own gradient. ``L`` may be negative. It is differentiated
through both factors of the virial (the Hessian-vector product ``H theta`` by double backward)
and back through the unroll. Only slices ``burn_in`` steps or more after the chains' start
count (``train.temperature_burn_in``): chains still converging are far from the posterior's
temperature whatever the sampler, and on the toy the loss without a burn-in bought faster
convergence with heat at equilibrium (research/NOTEBOOK.md). The sampler stays a valid
sampler whatever its nets learn (the complete recipe fixes the stationary law), so the loss can
only change how fast each group reaches the posterior's temperature and how much the
discretisation and the minibatch noise heat it there.
A necessary condition of sampling the posterior, not a sufficient one: the ELBO losses stay
the objective; this one is a term beside them (``train.temperature_weight``).

Measured (research/NOTEBOOK.md), off by default for that reason: no reliable gain on
the toy (five training seeds, KL@12k 0.026 with it, 0.021 without), and on MNIST the training
chains do not reach the posterior's temperature within an epoch at the training step, so the
counted slices measure how fast chains spread, not their heat at equilibrium.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..benchmark.temperature import layer_slices

__all__ = ["TemperatureLoss", "group_temperatures"]


def group_temperatures(
    positions: Sequence[Tensor],
    target,
    groups: Sequence[slice],
    generator: torch.Generator | None = None,
    halves: bool = False,
) -> Tensor:
    """``T_g`` of the module docstring, shape ``(G,)``, differentiable in ``positions``; with
    ``halves``, shape ``(2, G)``: ``T_g`` of the first and of the second half of the chains,
    each half with its own minibatches (independent estimates, up to the minibatches the
    chains shared while they were unrolled).

    Args:
        positions: ``(K, D)`` slices (attached to a graph, or requiring grad; ``K >= 2`` with
            ``halves``).
        target: anything with ``evaluate(theta, generator, create_graph=True)`` returning the
            minibatch gradient ``grad`` (a :class:`~metasampler.BayesianModel`, a toy target).
        groups: slices of the ``D`` coordinates, one per group.
        generator: draws each slice's minibatch (and a toy target's gradient noise).
    """
    if len(positions) == 0:
        raise ValueError("positions must hold at least one time slice")
    if len(groups) == 0:
        raise ValueError("groups must hold at least one slice of the coordinates")
    sums = None
    for theta in positions:
        if theta.ndim != 2 or (halves and theta.shape[0] < 2):
            need = "(K >= 2, D)" if halves else "(K, D)"
            raise ValueError(f"each position must have shape {need}, got {tuple(theta.shape)}")
        with torch.enable_grad():  # (also under no_grad: the virial needs the gradient)
            parts = theta.tensor_split(2) if halves else (theta,)
            per_group = torch.stack([_virials(part, target, groups, generator) for part in parts])
        sums = per_group if sums is None else sums + per_group
    means = sums / len(positions)
    return means if halves else means[0]


def _virials(theta: Tensor, target, groups: Sequence[slice], generator) -> Tensor:
    """The mean of ``theta_i dŨ/dtheta_i`` over the chains and each group's coordinates."""
    virial = theta * target.evaluate(theta, generator, create_graph=True).grad
    return torch.stack([virial[:, g].mean() for g in groups])


class TemperatureLoss:
    """``L`` of the module docstring on a target, its groups the target's layers.

    Args:
        target: the training problem's target; a :class:`~metasampler.BayesianModel` gives
            one group per layer (its weight and bias together: a bias alone has too few
            coordinates for a steady virial, e.g. the 10 output biases of an MNIST MLP), any
            other target one group of all coordinates.
        generator: draws the minibatches (the run's generator: resume stays bit-exact).
        burn_in: only slices at least this many steps after the chains' initialisation count
            (a chain still converging from its start is far from the posterior's temperature
            whatever the sampler; on the toy the loss without a burn-in rewarded converging
            faster at the price of heat at equilibrium: research/NOTEBOOK.md).
    """

    def __init__(self, target, generator: torch.Generator, burn_in: int = 0) -> None:
        if not (isinstance(burn_in, int) and burn_in >= 0):
            raise ValueError(f"burn_in must be an int >= 0, got {burn_in!r}")
        if not callable(getattr(target, "evaluate", None)):
            raise ValueError(f"the temperature loss needs a target with evaluate(), got {target!r}")
        self.target = target
        self.groups = [part for _, part in layer_slices(target)]
        self.generator = generator
        self.burn_in = burn_in

    def loss(self, positions: Sequence[Tensor]) -> Tensor:
        """The loss of the slices ``positions``: ``mean_g (T_g^a - 1)(T_g^b - 1)`` from the two
        halves of the chains (see the module docstring)."""
        first, second = group_temperatures(
            positions, self.target, self.groups, self.generator, halves=True
        ) - 1.0  # fmt: skip
        return (first * second).mean()
