"""What meta-training logs: the epoch's losses, evaluations and the chains' final state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..samplers.base import SamplerState

__all__ = ["TrainingReport"]


class TrainingReport:
    """Writes meta-training scalars to ``logger`` (anything with ``scalar(tag, value, step)``
    and optionally ``histogram(tag, values, step)``, e.g. a RunLogger; ``None``: nothing)."""

    def __init__(self, logger: Any | None) -> None:
        self.logger = logger

    def scalar(self, tag: str, value: float, step: int) -> None:
        """One scalar (nothing without a logger)."""
        if self.logger is not None:
            self.logger.scalar(tag, value, step)

    def epoch_losses(
        self, epoch: int, losses: Sequence[float], terms: Mapping[str, Sequence[float]]
    ) -> float:
        """Log the epoch's mean total loss and the mean of each term; returns the former."""
        mean_loss = sum(losses) / max(len(losses), 1)
        self.scalar("loss/total", mean_loss, epoch)
        for name, values in terms.items():
            if values:
                self.scalar(f"loss/{name}", sum(values) / len(values), epoch)
        return mean_loss

    def evaluation(self, metrics: Mapping[str, float], epoch: int) -> None:
        """Log evaluation metrics under ``eval/``."""
        for key, value in metrics.items():
            self.scalar(f"eval/{key}", value, epoch)

    @torch.no_grad()
    def chain_summaries(self, sampler: Any, state: SamplerState, target: Any, epoch: int) -> None:
        """Energy of the chains and the learned Q_f / D_f at the final states (only with a
        logger: the drift terms cost a pass of the nets)."""
        if self.logger is None:
            return
        self.scalar("train/energy_mean", float(state.energy.mean()), epoch)
        grad_sq = state.extras.get("grad_sq")  # (with the stiffness input)
        terms = sampler.drift_terms(state.theta, state.momentum, target, grad_sq=grad_sq)
        for name, values in (("Q_f", terms.q), ("D_f", terms.d)):
            self.scalar(f"nets/{name}_mean", float(values.mean()), epoch)
            self.scalar(f"nets/{name}_std", float(values.std()), epoch)
            if hasattr(self.logger, "histogram"):
                self.logger.histogram(f"nets/{name}", values, epoch)
