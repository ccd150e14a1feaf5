"""The per-coordinate stiffness input of NNSGHMC's curl (``q_stiffness_input``; #11).

``Q_f`` from the energy (and momentum) alone cannot tell a stiff coordinate from a broad one,
so a learned curl trades the stiffest direction's bias against the broad ones' mixing for a
whole target at once (docs/RESULTS.md). At equilibrium ``E[(d_i U)^2] = E[d_i^2 U]``
(integration by parts), so a running mean ``V_i`` of the squared stochastic gradient measures
coordinate ``i``'s curvature (plus the gradient noise, which errs on the careful side), as
pSGLD's preconditioner does. The net input is

    s_i = log(eta sqrt(V_i)),

the step over the coordinate's length scale: dimensionless, so the same number whatever ``N``
and ``eta`` are at test time. ``V`` holds earlier steps' gradients only, so within a step it
is a constant of ``z`` and Gamma needs no derivative of it; like pSGLD's, it adapts as the
chain moves (a plain mean over the first ``1 / (1 - decay)`` steps, then exponential).

With ``stiffness_freeze_after`` ``V`` stops adapting after that many steps of the chain,
as an adaptive MCMC's warm-up fixes its metric: from then on the preconditioner is a constant
and the chain a time-homogeneous sampler that Gamma makes exact. While it adapts, ``P``
follows where the chains have just been, a dependence Gamma has no term for.

The same statistic gives the curl's optional preconditioner (``precondition_power``)
``P_i = exp(-gamma_P (s_i - s_ref))``, clamped, with ``s_ref`` the median of ``s`` over all
chains and coordinates: ``eta`` stays the step of a median coordinate, and the others move
faster or slower by their RMS gradient's ratio to it, as pSGLD's do.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from ..gradient_noise import running_mean, update_noise_var
from ..targets import Evaluation

__all__ = [
    "chain_stiffness",
    "preconditioner_reference",
    "stiffness_input",
    "update_chain_statistics",
    "update_grad_sq",
]


def update_grad_sq(past: Tensor | None, grad: Tensor, step: int, decay: float) -> Tensor:
    """The running mean ``V`` of ``grad^2`` after a chain's ``step``-th gradient (1-based);
    detached, as it is a statistic of the chain's past, not a function of its current state."""
    return running_mean(past, grad.detach().square(), step, decay)


def update_chain_statistics(
    past: Mapping[str, Tensor],
    ev: Evaluation,
    step: int,
    grad_sq_decay: float | None,
    freeze_after: int | None = None,
) -> dict[str, Tensor]:
    """The running means a chain carries after its ``step``-th evaluation ``ev``:
    ``grad_sq``, of its squared gradients (when ``grad_sq_decay`` is given; held at its
    value after step ``freeze_after``), and ``noise_var``, of the estimated gradient-noise
    variance (when ``ev`` has one)."""
    out = {}
    if grad_sq_decay is not None:
        frozen = freeze_after is not None and step > freeze_after and "grad_sq" in past
        out["grad_sq"] = (
            past["grad_sq"]
            if frozen
            else update_grad_sq(past.get("grad_sq"), ev.grad, step, grad_sq_decay)
        )
    noise_var = update_noise_var(past.get("noise_var"), ev, step)
    if noise_var is not None:
        out["noise_var"] = noise_var
    return out


def stiffness_input(grad_sq: Tensor, eta: float) -> Tensor:
    """``s_i = log(eta sqrt(V_i))`` from the running mean ``V`` of ``(d_i Ũ)^2``."""
    return 0.5 * (grad_sq.clamp_min(1e-30) * (eta * eta)).log()


def chain_stiffness(grad_sq: Tensor, eta: float, pooled: bool) -> Tensor:
    """The stiffness of the chains' running means ``V`` (``(K, D)``); ``pooled`` (with the
    preconditioner): of their mean over the chains, ``(1, D)``, since the chains share the
    target and one chain's ``V`` over its first steps is a mean of a few ``chi^2_1`` draws,
    often far below its expectation, which would speed its coordinate up by
    ``e^precondition_range``."""
    return stiffness_input(grad_sq.mean(0, keepdim=True) if pooled else grad_sq, eta)


#: :func:`preconditioner_reference` takes the median of at most about this many entries.
MEDIAN_SAMPLE = 1 << 15


def preconditioner_reference(stiffness: Tensor) -> float:
    """``s_ref``, the median of the stiffness input over all chains and coordinates: of an
    evenly strided subset of at most ``2 * MEDIAN_SAMPLE`` entries, since a full median costs
    ~20 % of a step on a 784-40-40-10 MLP with 20 chains."""
    flat = stiffness.detach().flatten()
    return float(flat[:: max(1, flat.numel() // MEDIAN_SAMPLE)].median())
