"""What meta-learning adds: the same sampler with constant nets.

:func:`net_means` runs a trained :class:`~metasampler.NNSGHMC` on its training problem and
averages what its nets output there: the curl ``Q_f`` and the diffusion net's ``f_phiD``
(``eta D_f = alpha Q_f^2 + s_D f_phiD``). ``train_meta.py`` stores them in the sampler file's
provenance (``net_means``). :func:`with_constant_nets` replaces each net by that mean: the same
design (stiffness statistic, thermostat, friction per step, step tuning), but ``Q_f`` and
``f_phiD`` no longer depend on the chain's state, so Gamma is zero and the sampler is an
SGHMC inside the thermostat with the learned average curl and friction. Beside the learned
sampler it measures what the learned state dependence contributes.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import torch

from ..samplers.base import SamplerState
from ..sampling import sample
from ..targets import Target
from .nnsghmc import NNSGHMC

__all__ = ["net_means", "stored_net_means", "with_constant_nets"]


@torch.no_grad()
def net_means(
    sampler: NNSGHMC,
    target: Target,
    init: torch.Tensor,
    n_steps: int = 100,
    every: int = 5,
    seed: int = 0,
) -> dict[str, float]:
    """``{"q": mean Q_f, "f_d": mean f_phiD}`` over the chains, coordinates and every
    ``every``-th of ``n_steps`` steps of ``sampler`` on ``target`` from ``init`` ``(K, D)``."""
    sums = {"q": 0.0, "f_d": 0.0, "n": 0}

    def record(state: SamplerState) -> None:
        if state.step % every:
            return
        with torch.enable_grad():
            terms = sampler.drift_terms(
                state.theta, state.momentum, target, grad_sq=state.extras.get("grad_sq")
            )
        q, d = terms.q.double(), terms.d.double()
        f_d = (state.eta * d - sampler.alpha * q * q) / max(sampler.friction_scale, 1e-30)
        sums["q"] += float(q.mean())
        sums["f_d"] += float(f_d.mean())
        sums["n"] += 1

    sample(sampler, target, init.shape[0], n_steps, init=init, seed=seed, progress=False,
           callback=record, store=False)  # fmt: skip
    n = max(sums["n"], 1)
    return {"q": sums["q"] / n, "f_d": max(sums["f_d"] / n, 0.0)}


def with_constant_nets(sampler: NNSGHMC, means: dict[str, float]) -> NNSGHMC:
    """A copy of ``sampler`` whose curl net outputs ``means["q"]`` and whose diffusion net
    outputs ``means["f_d"]`` everywhere (each head's weights zero, its bias the value).

    Raises:
        ValueError: ``means`` lacks a finite ``q`` or a finite ``f_d >= 0``.
    """
    q, f_d = means.get("q"), means.get("f_d")
    ok = isinstance(q, (int, float)) and isinstance(f_d, (int, float))
    if not ok or not (math.isfinite(q) and math.isfinite(f_d) and f_d >= 0):
        raise ValueError(f"net means must hold finite 'q' and 'f_d' >= 0, got {means!r}")
    constant = copy.deepcopy(sampler)
    f_d = max(f_d, 1e-12)  # softplus^-1 of 0 is -inf
    with torch.no_grad():
        for net, bias in ((constant.f_q, q), (constant.f_d, f_d + math.log(-math.expm1(-f_d)))):
            net.head.weight.zero_()
            net.head.bias.fill_(bias)
    return constant


def stored_net_means(path: str | Path) -> dict[str, float]:
    """The ``net_means`` a sampler file's provenance holds (written by ``train_meta.py``);
    ``path`` may name a shipped sampler.

    Raises:
        TypeError, FileNotFoundError, SamplerFileError: as :func:`metasampler.read_header`.
        ValueError: the file stores none.
    """
    from ..export import _sampler_file, read_header  # (export imports this package)

    means = read_header(_sampler_file(path, "stored_net_means"))["provenance"].get("net_means")
    if not isinstance(means, dict):
        raise ValueError(
            f"{path} stores no net means (train_meta.py writes them into the files it trains)"
        )
    return means
