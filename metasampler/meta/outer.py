"""The outer step of meta-training: meta-gradients per loss and the optimiser update.

Gradients are taken with :func:`torch.autograd.grad` into explicit lists (one entry per
parameter, ``None`` where a loss does not reach it), so the gradients of several losses, or
of several windows of a segment, can be kept apart, summed and applied in any order the
truncation schedule asks for (:mod:`.schedule`). Under torchrun each rank's gradients are its
share of the global ones and :func:`sum_across_ranks` adds them up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from .. import distributed

__all__ = [
    "GradientAccumulator",
    "Grads",
    "MetaOptimizer",
    "add_grads",
    "scale_grads",
    "sum_across_ranks",
]

Grads = list[Tensor | None]


def add_grads(a: Grads | None, b: Grads) -> Grads:
    """``a + b`` entry by entry (``None`` counts as zero; ``a=None`` returns ``b``)."""
    if a is None:
        return list(b)
    return [x if y is None else y if x is None else x + y for x, y in zip(a, b, strict=True)]


def scale_grads(grads: Grads, factor: float) -> Grads:
    """``factor * grads`` entry by entry."""
    return [None if g is None else g * factor for g in grads]


class MetaOptimizer:
    """Adam on the sampler's nets with configurable betas and optional global-norm clipping.

    Args:
        params: the trainable parameters.
        lr: Adam learning rate (paper toy: 5e-4).
        betas: Adam's ``(beta1, beta2)`` (paper toy: ``(0.5, 0.99)``).
        grad_clip: max global norm of a meta-gradient before a step; 0 disables (paper).
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float,
        betas: Sequence[float] = (0.9, 0.999),
        grad_clip: float = 0.0,
    ) -> None:
        self.params = list(params)
        self.grad_clip = float(grad_clip)
        self.adam = torch.optim.Adam(self.params, lr=lr, betas=(float(betas[0]), float(betas[1])))

    def gradients(self, loss: Tensor, retain_graph: bool = False) -> Grads:
        """``d loss / d params`` (``None`` for parameters the loss does not reach)."""
        return list(
            torch.autograd.grad(loss, self.params, retain_graph=retain_graph, allow_unused=True)
        )

    def step(self, grads: Grads) -> bool:
        """Clip and apply ``grads`` (left in ``.grad``); returns False, without a step, if they
        are not finite."""
        for p, g in zip(self.params, grads, strict=True):
            p.grad = g
        present = [p for p in self.params if p.grad is not None]
        if not present:
            return True
        if self.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(present, self.grad_clip)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in present]))
        if not torch.isfinite(norm):
            return False
        self.adam.step()
        return True

    def state_dict(self) -> dict:
        """The Adam state, for a checkpoint."""
        return self.adam.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore the Adam state from :meth:`state_dict`."""
        self.adam.load_state_dict(state)


class GradientAccumulator:
    """Sums the gradients of each loss over the windows of a segment (truncated BPTT with
    gradient accumulation); :meth:`means` divides each sum by its count, so a loss that is a
    mean over ``n`` terms spread over several windows gets exactly the gradient of that mean.
    """

    def __init__(self, optimizer: MetaOptimizer) -> None:
        self.optimizer = optimizer
        self.sums: dict[str, Grads] = {}
        self.values: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, name: str, loss_sum: Tensor, count: int, retain_graph: bool = False) -> None:
        """Add ``d loss_sum / d params`` (``loss_sum``: a sum of ``count`` loss terms)."""
        grads = self.optimizer.gradients(loss_sum, retain_graph=retain_graph)
        self.sums[name] = add_grads(self.sums.get(name), grads)
        self.values[name] = self.values.get(name, 0.0) + float(loss_sum.detach())
        self.counts[name] = self.counts.get(name, 0) + count

    def means(self) -> tuple[dict[str, Grads], dict[str, float]]:
        """Per loss: the mean gradient and the mean value over everything added."""
        grads = {k: scale_grads(g, 1.0 / self.counts[k]) for k, g in self.sums.items()}
        values = {k: v / self.counts[k] for k, v in self.values.items()}
        return grads, values


def sum_across_ranks(
    params: Sequence[Tensor],
    grads: Grads,
    values: Sequence[Tensor | None],
    world: int,
    rank: int,
) -> tuple[Grads, list[float], list[int]]:
    """Sum every rank's gradient shares and loss values in one all-reduce.

    Returns the summed gradients (``None`` where no rank's loss reached a parameter, as one
    process would leave it), the summed ``values`` (``None`` counts as 0) and the ranks whose
    ``values[0]`` was not finite. One explicit all-reduce rather than DistributedDataParallel:
    the "forward" is a whole unrolled window of sampler steps plus collectives, and the values
    and a has-gradient flag per parameter travel in the same buffer, so all ranks take the same
    decisions. float64: a sum of a few float32 values is exact in float64, so the result does
    not depend on the reduction order (identical and reproducible).
    """
    f64 = {"dtype": torch.float64, "device": params[0].device}
    pieces = [
        (g if g is not None else torch.zeros_like(p)).reshape(-1).to(**f64)
        for p, g in zip(params, grads, strict=True)
    ]
    flags = torch.tensor([float(g is not None) for g in grads], **f64)
    scalars = [
        torch.zeros(1, **f64) if v is None else v.detach().reshape(1).to(**f64) for v in values
    ]
    bad = torch.zeros(world, **f64)  # which ranks' shares are not finite
    first = float(scalars[0]) if scalars else 0.0
    bad[rank] = float(not math.isfinite(first))
    buffer = distributed.all_reduce_sum(torch.cat([*pieces, flags, bad, *scalars]))
    summed: Grads = []
    offset = 0
    for p in params:
        summed.append(buffer[offset : offset + p.numel()].view_as(p).to(p.dtype))
        offset += p.numel()
    for i, flag in enumerate(buffer[offset : offset + len(params)].tolist()):
        if flag == 0:
            summed[i] = None
    offset += len(params)
    bad_ranks = [r for r, b in enumerate(buffer[offset : offset + world].tolist()) if b]
    totals = buffer[offset + world :].tolist()
    return summed, totals, bad_ranks
