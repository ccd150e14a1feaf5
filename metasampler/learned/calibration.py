"""Input statistics of NNSGHMC's nets, measured by running the sampler briefly (Gong et al.
2019 appendix E)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..samplers.base import Sampler, SamplerState
from ..sampling import sample
from ..targets import Target

__all__ = ["calibrate_inputs"]


@torch.no_grad()
def calibrate_inputs(
    sampler: Sampler,  # an NNSGHMC (not imported here: it imports this module)
    target: Target,
    n_chains: int = 20,
    n_steps: int = 100,
    init: Tensor | None = None,
    seed: int = 0,
    energy: bool = False,
) -> dict[str, float]:
    """Measure input statistics by running ``sampler`` (e.g. randomly initialised) briefly;
    also ``sampler.calibrate(target, ...)``.

    Sets ``momentum_std`` (and, with ``energy=True``, ``energy_loc`` / ``energy_std``) to the
    statistics of ``p`` and the energy input seen over ``n_chains`` x ``n_steps`` steps from
    ``init`` (Gong et al. 2019 appendix E). Returns them.
    """
    sampler.energy_loc.fill_(0.0)
    for buffer in (sampler.energy_std, sampler.momentum_std):
        buffer.fill_(1.0)
    device = sampler.f_q.head.weight.device
    sums = {"p": [], "u": []}

    def record(state: SamplerState) -> None:
        sums["p"].append(state.momentum.double().pow(2).mean())
        sums["u"].append(state.energy.double() / sampler._energy_divisor(target))

    run = {"init": init, "seed": seed, "callback": record, "device": device}
    sample(sampler, target, n_chains, n_steps, progress=False, store=False, **run)
    p_std = float(torch.stack(sums["p"]).mean().sqrt())
    sampler.momentum_std.fill_(max(p_std, 1e-8))
    result = {"momentum_std": p_std}
    if energy:
        energies = torch.cat(sums["u"])
        sampler.energy_loc.fill_(float(energies.mean()))
        sampler.energy_std.fill_(max(float(energies.std()), 1e-8))
        result.update(energy_loc=float(sampler.energy_loc), energy_std=float(sampler.energy_std))
    return result
