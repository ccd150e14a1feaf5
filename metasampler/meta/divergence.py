"""How meta-training stops when something is no longer finite.

A non-finite loss or meta-gradient is reported by the update (:class:`NonFiniteLoss`) and
turned by the trainer into :class:`TrainingDivergedError`, which says where training stopped
and which checkpoint is kept. Under torchrun a rank whose peer diverged stops with the same
error (:func:`abort_on_peer_failure`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..distributed import PeerFailureError

__all__ = ["NonFiniteLoss", "TrainingDivergedError", "abort_on_peer_failure", "diverged"]


class TrainingDivergedError(RuntimeError):
    """Meta-training produced a non-finite loss, gradient or chain state."""


class NonFiniteLoss(ArithmeticError):
    """A meta-loss or meta-gradient is not finite; the message says which."""


@contextmanager
def abort_on_peer_failure() -> Iterator[None]:
    """Another rank diverged: stop with :class:`TrainingDivergedError` here too."""
    try:
        yield
    except PeerFailureError as err:
        if err.kind in ("TrainingDivergedError", "NonFiniteError"):
            raise TrainingDivergedError(f"rank {err.rank}: {err.detail}") from None
        raise


def diverged(
    what: str, epoch: int, sub: int, epochs_done: int, checkpoint: Path | None
) -> TrainingDivergedError:
    """The error for ``what`` going wrong in ``epoch``, sub-epoch ``sub`` (0-based), naming
    the last good checkpoint (``epochs_done`` epochs) if one was written."""
    kept = (
        f"the last good checkpoint ({epochs_done} epochs) is kept at {checkpoint}"
        if checkpoint is not None and checkpoint.is_file()
        else "no checkpoint had been written yet"
    )
    return TrainingDivergedError(
        f"meta-training stopped in epoch {epoch}, sub-epoch {sub + 1}: {what}; {kept}. "
        "Lower sampler.eta or train.optimizer_lr, or raise train.grad_clip's strictness."
    )
