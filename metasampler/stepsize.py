"""The one place where an optimiser-style learning rate becomes an SDE step (docs/METHOD.md §1).

A per-batch learning rate ``lr`` of an optimiser on the *mean* loss corresponds to
``eta = lr / N`` for first-order samplers (SGLD, pSGLD: the drift is ``-eta * grad Ũ``) and
to ``eta = sqrt(lr / N)`` for momentum samplers (SGHMC, NNSGHMC, thermostats: the position
moves by ``eta**2 * grad Ũ`` per step from rest).
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Literal

__all__ = ["eta_from_lr", "resolve_eta", "check_step_args"]

Order = Literal["first", "second"]


def eta_from_lr(lr: float, n_data: int, order: Order) -> float:
    """Convert a per-batch learning rate into the discretisation step ``eta``."""
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr!r}")
    if n_data < 1:
        raise ValueError(f"n_data must be >= 1, got {n_data!r}")
    if order == "first":
        return lr / n_data
    if order == "second":
        return math.sqrt(lr / n_data)
    raise ValueError(f"order must be 'first' or 'second', got {order!r}")


def resolve_eta(eta: float | None, lr: float | None, n_data: int, order: Order) -> float:
    """Return ``eta`` given exactly one of ``eta`` (SDE step) or ``lr`` (per-batch rate)."""
    check_step_args(eta, lr)
    if eta is not None:
        return float(eta)
    return eta_from_lr(float(lr), n_data, order)


def check_step_args(eta: float | None, lr: float | None) -> None:
    """Validate step arguments at construction time (before the target's ``N`` is known)."""
    if (eta is None) == (lr is None):
        raise ValueError("give exactly one of eta (SDE step) or lr (per-batch learning rate)")
    for name, value in (("eta", eta), ("lr", lr)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, Real)):
            raise ValueError(f"{name} must be a number, got {type(value).__name__} {value!r}")
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
