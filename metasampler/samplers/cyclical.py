"""cSGLD and cSGHMC — cyclical SG-MCMC (Zhang, Li, Zhang, Chen & Wilson, ICLR 2020).

Not new samplers: SGLD / SGHMC driven by the cyclical cosine schedule of Zhang et al. 2020, eq. 1
(:class:`~metasampler.schedules.CyclicalCosine`). With ``L = ceil(K_total / M)`` steps per
cycle and ``r(k) = ((k - 1) mod L) / L``::

    eta_k = eta_0 / 2 * (cos(pi r(k)) + 1)

Steps with ``r(k) < beta`` form the exploration stage: temperature 0, so no noise is injected
(a plain stochastic-gradient step for cSGLD, momentum SGD for cSGHMC) and no sample is
collected. The remaining steps of each cycle sample at the sampler's temperature, and only they
are kept by :func:`metasampler.sample`.

The schedule multiplies the SDE step ``eta`` (as every schedule does). For cSGLD that is the
per-batch learning rate of eq. 1 (``eta = lr / N``); for cSGHMC ``eta = sqrt(lr / N)``, so the
equivalent per-batch learning rate follows the *square* of the cosine curve.
"""

from __future__ import annotations

from ..schedules import CyclicalCosine
from .sghmc import SGHMC
from .sgld import SGLD

__all__ = ["cyclical_sgld", "cyclical_sghmc"]


def cyclical_sgld(
    *,
    eta: float | None = None,
    lr: float | None = None,
    total_steps: int,
    n_cycles: int,
    explore_fraction: float = 0.25,
    temperature: float = 1.0,
) -> SGLD:
    """cSGLD: :class:`SGLD` with a :class:`CyclicalCosine` schedule.

    Args:
        eta / lr: the initial step ``alpha_0`` of every cycle (``eta = lr / N``).
        total_steps: ``K_total``, the planned run length (pass the same ``n_steps`` to
            :func:`metasampler.sample`).
        n_cycles: ``M``.
        explore_fraction: ``beta`` in ``[0, 1)``; paper default 1/4.
        temperature: temperature of the sampling stages.
    """
    schedule = CyclicalCosine(total_steps, n_cycles, explore_fraction)
    return SGLD(eta=eta, lr=lr, temperature=temperature, schedule=schedule)


def cyclical_sghmc(
    *,
    eta: float | None = None,
    lr: float | None = None,
    total_steps: int,
    n_cycles: int,
    explore_fraction: float = 0.25,
    friction: float = 1.0,
    noise_estimate: float = 0.0,
    temperature: float = 1.0,
    momentum_init: str = "normal",
) -> SGHMC:
    """cSGHMC: :class:`SGHMC` with a :class:`CyclicalCosine` schedule.

    Args:
        eta / lr: the initial step ``alpha_0`` of every cycle (``eta = sqrt(lr / N)``).
        total_steps, n_cycles, explore_fraction: as for :func:`cyclical_sgld`.
        friction, noise_estimate, momentum_init: as for :class:`SGHMC`.
        temperature: temperature of the sampling stages.
    """
    schedule = CyclicalCosine(total_steps, n_cycles, explore_fraction)
    return SGHMC(
        eta=eta,
        lr=lr,
        friction=friction,
        noise_estimate=noise_estimate,
        temperature=temperature,
        schedule=schedule,
        momentum_init=momentum_init,
    )
