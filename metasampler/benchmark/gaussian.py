"""Sampler benchmarks on targets with known moments (toy Gaussians).

:func:`gaussian_benchmark` runs any sampler on a :class:`tasks.toy.GaussianTask`-like object
(with ``mean``, ``cov`` and ``target(grad_noise_std)``) and reports what Gong et al. 2019, §5.1
reports: the KL of the Gaussian fitted to all samples so far (at chosen steps) and the
BEAST-style ESS.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..diagnostics import cumulative_gaussian_kl, ess, ess_beast_paper
from ..samplers.base import Sampler
from ..sampling import sample

__all__ = ["gaussian_benchmark"]

#: The gradient noise of the paper's toy test (docs/METHOD.md §5): ``N(0, 1)`` added to every
#: coordinate.
TEST_GRAD_NOISE_STD = 1.0


def gaussian_benchmark(
    sampler: Sampler,
    task: Any,
    *,
    n_chains: int = 50,
    n_steps: int = 12_000,
    kl_at: Sequence[int] = (1000, 12_000),
    grad_noise_std: float = TEST_GRAD_NOISE_STD,
    init_low: float = 0.0,
    init_high: float = 6.0,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, float]:
    """Run ``sampler`` on the Gaussian ``task``; return ``kl@t`` for ``t`` in ``kl_at``,
    ``ess`` (BEAST-style, per chain, as the paper's toy code) and ``ess_min`` (Geyer, total).

    Chains start uniformly in ``[init_low, init_high]^D`` (Gong et al. 2019, appendix F.1) and no
    burn-in is dropped, matching the paper's curves.
    """
    kl_at = [int(t) for t in kl_at if int(t) <= n_steps]
    target = task.target(grad_noise_std)

    def init(generator: torch.Generator) -> torch.Tensor:
        u = torch.rand((n_chains, task.dim), generator=generator)
        return init_low + (init_high - init_low) * u

    result = sample(sampler, target, n_chains, n_steps, init=init, seed=seed, progress=progress)
    samples = result.theta.double()
    kls = cumulative_gaussian_kl(samples, task.mean, task.cov, at=kl_at)
    metrics = {f"kl@{t}": float(v) for t, v in zip(kl_at, kls, strict=True)}
    metrics["ess"] = float(ess_beast_paper(samples))
    metrics["ess_min"] = float(ess(samples).min())
    return metrics
