"""The transfer protocol of Gong et al.'s MNIST code, for every method alike.

:func:`apply_warmup` puts a warm-up phase in front of a sampler's schedule (the first steps at
a fraction of the learning rate). :class:`MethodFactory` builds a method at any learning rate
with it applied, identically in tuning and evaluation runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..samplers import Sampler
from ..schedules import WarmUp
from ..stepsize import resolve_eta
from .methods import METHODS, MethodSpec, build_method

__all__ = ["MethodFactory", "apply_warmup"]


def apply_warmup(sampler: Sampler, steps: int, lr_factor: float, n_data: int) -> float:
    """Put a warm-up phase in front of ``sampler``'s schedule; return the warm-up SDE step.

    The first ``steps`` steps run at ``lr_factor`` times the per-batch learning rate, i.e. the
    SDE step times ``eta(lr_factor) / eta(1)`` of the sampler's order (``lr_factor`` for
    first-order, ``sqrt(lr_factor)`` for second-order samplers), on top of the sampler's own
    schedule (:class:`~metasampler.schedules.WarmUp`). ``steps = 0`` leaves the sampler as it
    is and returns its base step.
    """
    eta = resolve_eta(sampler.eta, sampler.lr, n_data, sampler.order)
    if steps <= 0:
        return eta
    scale = resolve_eta(None, lr_factor, 1, sampler.order) / resolve_eta(
        None, 1.0, 1, sampler.order
    )
    sampler.schedule = WarmUp(steps, scale, sampler.schedule)
    return eta * scale


@dataclass(frozen=True)
class MethodFactory:
    """Method ``key`` at any learning rate, with the protocol's warm-up phase.

    Attributes:
        key: a key of :data:`~metasampler.benchmark.methods.METHODS`.
        options: the method's config section, as a plain mapping.
        n_data: ``N`` of the training set.
        warmup_steps, warmup_lr_factor: the warm-up phase (``budget.warmup_*``).
        sampler_path: the NNSGHMC file.
        device: where the chains run (the config's ``device``).
    """

    key: str
    options: Mapping[str, Any]
    n_data: int
    warmup_steps: int = 0
    warmup_lr_factor: float = 1.0
    sampler_path: str | os.PathLike | None = None
    device: str = "cpu"

    @property
    def spec(self) -> MethodSpec:
        """The registry entry of the method."""
        return METHODS[self.key]

    def __call__(self, lr: float | None, n_steps: int) -> Sampler:
        """The method at per-batch learning rate ``lr`` (``None``: a stored step) for a run of
        ``n_steps`` steps."""
        sampler = build_method(
            self.key,
            self.options,
            lr,
            n_data=self.n_data,
            n_steps=n_steps,
            sampler_path=self.sampler_path,
            device=self.device,
        )
        warmup = min(self.warmup_steps, n_steps)
        apply_warmup(sampler, warmup, self.warmup_lr_factor, self.n_data)
        return sampler

    def eta(self, lr: float | None, n_steps: int) -> float:
        """The SDE step ``eta`` of the method at ``lr`` (after the warm-up phase)."""
        sampler = self(lr, n_steps)
        return resolve_eta(sampler.eta, sampler.lr, self.n_data, sampler.order)
