"""The truncation schedule of meta-training: how a segment of steps is cut and when to step.

As in learned_optimization (``truncation_schedule`` apart from the unroll and the outer
step), this module only *decides*; :mod:`.unroll` runs the chains and :mod:`.outer` applies
the optimiser. The terms (docs/METHOD.md §4):

* **segment** — the ``steps_per_sub_epoch`` steps of one sub-epoch;
* **window** — the graph is cut (state detached) every ``unroll`` steps inside a segment
  (truncated back-propagation through time);
* **update point** — after every window (``accumulate=False``, the default),
  or once at the end of the segment with the gradients of all its windows summed
  (``accumulate=True``, the paper's toy code);
* **steps per update** — one optimiser step on ``w_cross * cross + w_in * in_chain``
  (``step_per_loss=False``) or one step per loss, cross-chain first (``True``); both
  gradients are taken at the same parameters before either step;
* **chains** — restart (replay pool or fresh init) every sub-epoch, or continue across the
  sub-epochs of an epoch and restart at each epoch (``continue_chains=True``, the paper);
* **in-chain pool** — cleared after every window, or spanning the whole segment
  (``in_chain_span="segment"``): burn-in, thinning and the chain subset are then counted
  within the segment and one Stein estimate covers all pooled samples; or spanning the epoch
  (``in_chain_span="epoch"``, with continuing chains): the chain subset is kept for the epoch
  and the Stein estimate of each segment's in-chain loss also covers the (detached) samples
  pooled in the epoch's earlier segments, so the loss sees the chains' mixing over hundreds
  of steps, not only within one segment.

The paper's toy schedule: 100-step segments, windows of 20, ``accumulate``,
``step_per_loss``, ``continue_chains``, ``in_chain_span=segment`` (2 Adam steps per
sub-epoch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TruncationSchedule"]


@dataclass(frozen=True)
class TruncationSchedule:
    """Decisions of the meta-training loop (see the module docstring)."""

    segment: int
    window: int
    accumulate: bool = False
    step_per_loss: bool = False
    continue_chains: bool = False
    pool_spans_segment: bool = False
    pool_spans_epoch: bool = False

    def __post_init__(self) -> None:
        if self.segment < 1 or self.window < 1:
            raise ValueError(
                f"segment and window must be >= 1, got {self.segment} and {self.window}"
            )
        if self.pool_spans_segment and not self.accumulate:
            raise ValueError(
                "an in-chain pool spanning the segment needs accumulate=True (its samples hold "
                "every window's graph, which an optimiser step inside the segment invalidates)"
            )
        if self.pool_spans_epoch and not (self.pool_spans_segment and self.continue_chains):
            raise ValueError(
                "an in-chain pool spanning the epoch needs pool_spans_segment and "
                "continue_chains (it follows the same chains across the epoch's segments)"
            )

    @classmethod
    def from_settings(cls, settings: Any) -> TruncationSchedule:
        """The schedule a ``TrainConfig`` describes."""
        span = getattr(settings.in_chain_span, "value", settings.in_chain_span)
        return cls(
            segment=settings.steps_per_sub_epoch,
            window=settings.unroll,
            accumulate=bool(settings.accumulate),
            step_per_loss=bool(settings.step_per_loss),
            continue_chains=bool(settings.continue_chains),
            pool_spans_segment=span in ("segment", "epoch"),
            pool_spans_epoch=span == "epoch",
        )

    @property
    def is_default(self) -> bool:
        """The default recipe: an update after every window (the only one sharding supports)."""
        return not (
            self.accumulate or self.step_per_loss or self.continue_chains or self.pool_spans_segment
        )

    def windows(self) -> list[int]:
        """Lengths of the segment's windows (the last may be shorter)."""
        full, rest = divmod(self.segment, self.window)
        return [self.window] * full + ([rest] if rest else [])

    def fresh_chains(self, sub_epoch: int) -> bool:
        """Whether sub-epoch ``sub_epoch`` (0-based) starts new chains."""
        return sub_epoch == 0 or not self.continue_chains

    def fresh_pool(self, sub_epoch: int) -> bool:
        """Whether sub-epoch ``sub_epoch`` starts a new in-chain pool (and chain subset)."""
        return sub_epoch == 0 or not self.pool_spans_epoch

    @property
    def clear_pool(self) -> bool:
        """Whether the in-chain pool is emptied (and its loss taken) after each window."""
        return not self.pool_spans_segment
