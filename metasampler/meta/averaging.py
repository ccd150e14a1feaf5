"""Averaging the nets over the last epochs of meta-training (stochastic weight averaging).

With a constant Adam step the nets never settle: the sampler exported at the last epoch is
one draw from a fluctuating trajectory, and samplers five epochs apart differ at test as much
as samplers of different training seeds (toy transfer: ESS 52-60 and KL@12k 0.024-0.028
within ten epochs of one run, docs/RESULTS.md). The mean of the nets at the ends of the last
``n`` epochs (Izmailov et al. 2018) is a steadier sampler. The running mean is kept by
:class:`torch.optim.swa_utils.AveragedModel`; this module adds the epoch window and the
checkpoint state. Buffers (the input statistics, fixed after calibration) are not averaged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel

__all__ = ["NetAverage"]


class NetAverage:
    """The mean of a sampler's nets at the ends of epochs ``epochs - last + 1 .. epochs``.

    Args:
        last: how many final epochs to average (0: none; :meth:`result` is the sampler).
        epochs: the run's ``train.epochs`` (a resumed run that extends it starts a new window).
    """

    def __init__(self, last: int, epochs: int) -> None:
        if not (isinstance(last, int) and 0 <= last <= epochs):
            raise ValueError(f"average_last must be an int in [0, epochs={epochs}], got {last!r}")
        self.first = epochs - last + 1 if last else None  # first epoch of the window
        self.averaged: AveragedModel | None = None
        self.started_at: int | None = None  # the window the running mean belongs to

    def end_epoch(self, sampler: torch.nn.Module, epoch: int) -> None:
        """Fold the nets into the mean when ``epoch`` lies in the window."""
        if self.first is None or epoch < self.first:
            return
        if self.averaged is None or self.started_at != self.first:
            self.averaged = AveragedModel(sampler, use_buffers=False)
            self.started_at = self.first
        self.averaged.update_parameters(sampler)

    def result(self, sampler: torch.nn.Module) -> torch.nn.Module:
        """The averaged sampler once the window's mean is under way, else ``sampler``."""
        if self.averaged is None or self.started_at != self.first:
            return sampler
        return self.averaged.module

    def state_dict(self) -> dict[str, Any] | None:
        """The running mean and its start epoch, for a checkpoint (``None`` before it starts)."""
        if self.averaged is None:
            return None
        return {"started_at": self.started_at, "mean": self.averaged.state_dict()}

    def load_state_dict(self, state: dict[str, Any] | None, sampler: torch.nn.Module) -> None:
        """Restore the running mean (``state`` from :meth:`state_dict`; ``None``: none yet)."""
        self.averaged = self.started_at = None
        if state is not None:
            self.averaged = AveragedModel(sampler, use_buffers=False)
            self.averaged.load_state_dict(state["mean"])
            self.started_at = int(state["started_at"])
