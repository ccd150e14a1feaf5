"""NNSGHMC's net inputs and the scalars and switches of one step, from the sampler's
constants and the target (SPEC §3, 004 appendix E; the equations they feed are in
:mod:`metasampler.learned.equations`). :class:`~metasampler.learned.NNSGHMC` uses these as
its methods (``sampler`` is an ``NNSGHMC``; not imported here: it imports this module)."""

from __future__ import annotations

import math

from torch import Tensor

from ..samplers.base import Sampler
from ..targets import Evaluation, Target
from .equations import StepConfig

__all__ = ["energy_divisor", "energy_input", "step_config", "step_scalars"]


def energy_divisor(sampler: Sampler, target: Target) -> float:
    """What the energy is divided by before it enters the nets: ``N`` or ``N D``.

    SPEC §3 (004 appendix E) feeds the per-datum energy ``U / N``, the default. The
    per-coordinate option (not in the SPEC) also divides by ``D`` so that a sampler trained
    on one dimension sees inputs of the same scale on another (docs/RESULTS.md, #11); the
    chain rule in Gamma uses the same divisor (``du_scale``)."""
    if sampler.energy_input == "per_coordinate":
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
    scale = sampler.energy_input_scale / float(sampler.energy_std)
    u = (energy / energy_divisor(sampler, target) - float(sampler.energy_loc)) * scale
    return u.unsqueeze(-1), ev.prior_grad if prior_w != 0.0 else None


def step_scalars(
    sampler: Sampler, target: Target, eta: float, temperature: float
) -> dict[str, float]:
    """The values of ``SCALARS`` for one step."""
    train_dim = int(sampler.train_dim)
    if sampler.grad_input == "per_datum":
        g_scale = sampler.grad_input_scale / target.n_data
    else:
        g_scale = sampler.grad_input_scale / float(sampler.grad_std)
    return {
        "eta": eta,
        "temperature": temperature,
        "inv_sp": 1.0 / float(sampler.momentum_std),
        "g_scale": g_scale,
        "du_scale": sampler.energy_input_scale
        / (float(sampler.energy_std) * energy_divisor(sampler, target)),
        "prior_w": 1.0 - (train_dim / target.dim if train_dim > 0 else 1.0),
        "alpha": sampler.alpha,
        "c": sampler.c,
        "s_d": sampler.d_output_scale,
        "q_clamp": sampler.q_clamp,
        "beta_off": sampler.beta_off,
        "d_clamp": _or_inf(sampler.d_clamp),
        "grad_noise_var": sampler.grad_noise_var,
        "precond_power": sampler.precondition_power,
        "precond_ref": 0.0,  # the median stiffness of the step (`_stiffness_given`)
        "precond_range": sampler.precondition_range,
        "p_clamp": _or_inf(sampler.momentum_input_clamp),
        "speed_limit": _or_inf(sampler.speed_limit),
    }


def _or_inf(bound: float | None) -> float:
    """An optional upper bound as a number (``None``: none, ``inf``)."""
    return math.inf if bound is None else bound


def step_config(sampler: Sampler, gamma: str, detach: bool) -> StepConfig:
    """The step's switches (``gamma``: the sampler's, or ``"none"`` at ``T = 0``; ``detach``:
    stop-gradient net inputs)."""
    noise_correction = sampler.grad_noise_var > 0 or sampler.grad_noise_estimate
    return StepConfig(
        activation=sampler.f_q.activation,
        d_output=sampler.f_d.output,
        q_output=sampler.f_q.output,
        gamma=gamma,
        per_step=sampler.friction_units == "per_step",
        clamp_d=sampler.d_clamp is not None,
        clamp_p=sampler.momentum_input_clamp is not None,
        limit_speed=sampler.speed_limit is not None,
        detach=detach,
        q_momentum=sampler.q_momentum_input,
        q_stiffness=sampler.q_stiffness_input,
        noise_correction=noise_correction,
        noise_friction=noise_correction and sampler.grad_noise_friction,
        precondition=sampler.preconditioned,
        thermostat=sampler.thermostat,
    )
