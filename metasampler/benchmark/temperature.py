"""The configurational temperature of chain states: ``theta . grad U(theta) / D``.

Integrating by parts, every density ``exp(-U / T)`` on ``R^D`` whose tails vanish fast enough
has ``E[theta_i dU/dtheta_i] = T`` for every coordinate ``i`` (the virial theorem), so
``E[theta . grad U(theta)] = T D``. The mean of :func:`configurational_temperature` over
chains that sample the posterior ``exp(-U)`` is 1, whatever the network, and it is read off the
chains alone, with the full-data gradient: no reference run is needed. Chains still spreading
from a small initialisation sit below 1 (their weights are short of the prior's scale), chains
that sample a colder distribution below it too, hotter ones above. Over all ``D`` coordinates
the prior's ``|theta|^2`` dominates it; :func:`coordinate_virials` averaged over a group of
coordinates (a layer's weights, say) gives the group's own temperature, also 1 at the
posterior, which shows where chains run hot or cold. Necessary conditions, not a proof that
the chains sample the posterior (research/NOTEBOOK.md).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "configurational_temperature", "coordinate_virials", "layer_slices", "noise_heat",
    "parameter_slices",
]  # fmt: skip


def configurational_temperature(target, theta: Tensor) -> Tensor:
    """``theta . grad U(theta) / D`` per chain, shape ``(K,)`` (see :func:`coordinate_virials`)."""
    return coordinate_virials(target, theta).mean(-1)


def coordinate_virials(target, theta: Tensor) -> Tensor:
    """``theta_i dU/dtheta_i`` per chain and coordinate, shape ``(K, D)``, with the full-data
    gradient: the target's ``full_grad(theta)`` where it has one (a
    :class:`~metasampler.BayesianModel`: chunked over the data, bounded memory), else autograd
    through its ``energy(theta)`` (shape ``(K,)``, e.g. an
    :class:`~metasampler.targets.EnergyTarget`)."""
    if theta.ndim != 2:
        raise ValueError(f"theta must be (chains, dim), got shape {tuple(theta.shape)}")
    theta = theta.detach()
    if hasattr(target, "full_grad"):
        grad = target.full_grad(theta)
    else:
        with torch.enable_grad():
            position = theta.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(target.energy(position).sum(), position)
    return theta * grad


def noise_heat(
    target,
    theta: Tensor,
    curl: Tensor,
    friction: Tensor,
    eta: float,
    draws: int = 16,
    generator: torch.Generator | None = None,
) -> Tensor:
    """``h_i = eta Q_i^2 V_i / (2 D_i)`` per chain and coordinate ``(K, D)``: the temperature
    the minibatch gradient's noise adds to a complete-recipe sampler (curl ``Q``, friction
    ``D``) that does not correct for it (docs/METHOD.md §3; SGHMC's ``B_hat / C``, Chen et al.
    2014). The noise enters the momentum as ``eta^2 Q^2 V`` per step and the friction ``eta D``
    dissipates it, so a coordinate's momentum runs at ``T + h_i``. Where ``h_i > T`` even a
    correction that knows ``V`` cannot cancel it (it would inject negative variance).

    ``V_i`` is the mean of ``draws`` one-minibatch estimates at ``theta``
    (``target.evaluate(..., estimate_noise=True)``, unbiased), so ``h`` is unbiased per
    coordinate and spread by the estimate's noise (relative SD ``sqrt(2 / draws)`` for a
    Gaussian noise).
    """
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws!r}")
    with torch.no_grad():
        var = (
            sum(
                target.evaluate(theta, generator, estimate_noise=True).grad_noise_var.double()
                for _ in range(draws)
            )
            / draws
        )
    return eta * curl.double().square() * var / (2.0 * friction.double())


def parameter_slices(target) -> list[tuple[str, slice]]:
    """Each parameter tensor's name and its slice of the flat ``theta`` (a target with a
    :class:`~metasampler.flat_params.ParamSpec`, as a :class:`~metasampler.BayesianModel`),
    or one group ``("theta", all coordinates)`` for a target without one."""
    spec = getattr(target, "spec", None)
    if spec is None:
        return [("theta", slice(0, int(target.dim)))]
    return [
        (name, slice(offset, offset + n))
        for name, n, offset in zip(spec.names, spec.numels, spec.offsets, strict=True)
    ]


def layer_slices(target) -> list[tuple[str, slice]]:
    """:func:`parameter_slices` with each module's adjacent tensors (a layer's weight and
    bias) joined into one slice, named by the module (``"0"``, ``"2"``; ``"theta"``)."""
    layers: list[tuple[str, slice]] = []
    for name, part in parameter_slices(target):
        module = name.rpartition(".")[0] or name
        if layers and layers[-1][0] == module and layers[-1][1].stop == part.start:
            layers[-1] = (module, slice(layers[-1][1].start, part.stop))
        else:
            layers.append((module, part))
    return layers
