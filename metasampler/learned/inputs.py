"""NNSGHMC's net inputs and the scalars and switches of one step, from the sampler's
constants and the target (``docs/METHOD.md`` §3; Gong et al. 2019 appendix E; the equations
they feed are in :mod:`metasampler.learned.equations`). :class:`~metasampler.learned.NNSGHMC`
uses these as its methods (``sampler`` is an ``NNSGHMC``; not imported here: it imports this
module)."""

from __future__ import annotations

from torch import Tensor

from ..samplers.base import Sampler
from ..targets import EnergyTarget, Evaluation, Target
from .equations import StepConfig

__all__ = ["energy_divisor", "energy_input", "step_config", "step_scalars"]


def energy_divisor(sampler: Sampler, target: Target) -> float:
    """What the energy is divided by before it enters the nets: the number of data ``N`` for
    a model of data (the per-datum energy, whatever ``N`` is), or the dimension ``D`` for an
    energy with no data (:class:`~metasampler.EnergyTarget`: a Gaussian's energy at
    equilibrium is about ``D / 2``, so the input has one scale whatever ``D`` is). Gamma's
    chain rule uses the same divisor (``du_scale``)."""
    if isinstance(target, EnergyTarget):
        return float(target.n_data * target.dim)
    return float(target.n_data)


def energy_input(sampler: Sampler, ev: Evaluation, target: Target) -> tuple[Tensor, Tensor | None]:
    """Standardised energy input ``u`` ``(K, 1)``, and the prior gradient when the prior
    enters it (``r != 1``)."""
    train_dim = int(sampler.train_dim)
    prior_w = 1.0 - (train_dim / target.dim if train_dim > 0 else 1.0)
    energy = ev.energy
    if prior_w != 0.0:  # (with r = 1 the prior terms are multiplied by 0: skip them)
        energy = energy - prior_w * ev.prior_energy
    scale = 1.0 / float(sampler.energy_std)
    u = (energy / energy_divisor(sampler, target) - float(sampler.energy_loc)) * scale
    return u.unsqueeze(-1), ev.prior_grad if prior_w != 0.0 else None


def step_scalars(
    sampler: Sampler, target: Target, eta: float, temperature: float
) -> dict[str, float]:
    """The values of ``SCALARS`` for one step."""
    train_dim = int(sampler.train_dim)
    return {
        "eta": eta,
        "temperature": temperature,
        "inv_sp": 1.0 / float(sampler.momentum_std),
        "g_scale": sampler.grad_input_scale / target.n_data,
        "du_scale": 1.0 / (float(sampler.energy_std) * energy_divisor(sampler, target)),
        "prior_w": 1.0 - (train_dim / target.dim if train_dim > 0 else 1.0),
        "alpha": sampler.alpha,
        "s_d": sampler.friction_scale,
    }


def step_config(sampler: Sampler, gamma: str, detach: bool) -> StepConfig:
    """The step's switches (``gamma``: the sampler's, or ``"none"`` at ``T = 0``; ``detach``:
    stop-gradient net inputs)."""
    return StepConfig(
        activation=sampler.f_q.activation,
        gamma=gamma,
        detach=detach,
        curl_momentum=sampler.curl_input == "momentum",
        thermostat=sampler.thermostat,
    )
