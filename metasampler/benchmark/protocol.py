"""The transfer protocol of Gong et al.'s MNIST code, for every method alike.

:func:`apply_warmup` puts a warm-up phase in front of a sampler's schedule (the first steps at
a fraction of the learning rate); for a loaded NNSGHMC with absolute friction units,
:func:`set_alpha_from_warmup` sets ``alpha = alpha_per_step / eta_warmup``.
:class:`MethodFactory` builds a method at any learning rate with both applied, identically in
tuning and evaluation runs.
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

__all__ = ["MethodFactory", "apply_warmup", "set_alpha_from_warmup"]


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


def set_alpha_from_warmup(sampler: Any, alpha_per_step: float | None, eta_warmup: float) -> str:
    """The paper's test-time ``alpha`` (Gong et al. 2019, appendix F.2):
    ``alpha = alpha_per_step / eta_warmup``.

    Applies to a loaded NNSGHMC whose ``friction_units`` is ``"absolute"`` (every sampler file
    before format 2): its ``D_f = alpha Q_f^2 + ...`` is a friction per unit time, so the
    paper re-derives ``alpha`` from the first (warm-up) step of the test run and keeps it, the
    friction per step ``eta alpha Q_f^2`` being ``alpha_per_step Q_f^2`` during the warm-up. A
    ``"per_step"`` sampler's constants are already per step and are left alone, and so is any
    sampler when ``alpha_per_step`` is ``None``.

    Returns:
        A short description of what was done (for the result files).
    """
    units = getattr(sampler, "friction_units", "absolute")
    if alpha_per_step is None:
        return f"file ({sampler.alpha:.4g})"
    if units != "absolute":
        return f"file ({sampler.alpha:.4g}, {units} units)"
    sampler.alpha = float(alpha_per_step) / eta_warmup
    return f"{alpha_per_step:g} / eta_warmup = {sampler.alpha:.4g}"


@dataclass(frozen=True)
class MethodFactory:
    """Method ``key`` at any learning rate, with the protocol's warm-up phase and, where the
    registry says so (``MethodSpec.warmup_alpha``), the paper's ``alpha``.

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
        eta_warmup = apply_warmup(sampler, warmup, self.warmup_lr_factor, self.n_data)
        if self.spec.warmup_alpha:
            alpha_per_step = self.options.get("alpha_per_step")
            sampler.alpha_note = set_alpha_from_warmup(sampler, alpha_per_step, eta_warmup)
        return sampler

    def eta(self, lr: float | None, n_steps: int) -> float:
        """The SDE step ``eta`` of the method at ``lr`` (after the warm-up phase)."""
        sampler = self(lr, n_steps)
        return resolve_eta(sampler.eta, sampler.lr, self.n_data, sampler.order)
