"""Sharding chains across processes with ``torch.distributed`` (launched by ``torchrun``).

Meta-training and evaluation run ``K`` chains; under ``torchrun --nproc_per_node=N`` each
rank holds a contiguous shard of them (:func:`chain_shard`: rank ``r`` gets chains
``[start, stop)``, the first ``K mod N`` ranks one more). Everything here degrades to the
single-process behaviour when no process group is initialised (or its world size is 1):
helpers return their input, guards do nothing, and no collective is ever called.

* :func:`init_from_env` starts the process group from torchrun's environment variables
  (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), with the
  backend chosen by :func:`choose_backend` (NCCL for CUDA devices, gloo otherwise) and a
  timeout on every collective, so a rank that stops answering ends the job instead of
  hanging it.
* :func:`rank_seed` derives one independent random stream per rank from the run's seed: a
  run is reproducible for a fixed world size (not across world sizes).
* :func:`all_gather_rows` concatenates the ranks' row blocks (shards of possibly different
  sizes); the local block keeps its autograd graph. ``torch.distributed.all_gather`` itself
  does not propagate gradients (and ``torch.distributed.nn.functional.all_gather``, which
  does, is deprecated and sums the gradients of *every* rank's loss into each input); here
  each rank differentiates only through its own rows, and the trainer sums the parameter
  gradients across ranks.
* :func:`failure_guard` turns an exception on one rank (a diverged chain, a NaN, any error)
  into a clean abort on all ranks: at the end of a guarded section every rank all-reduces a
  status flag; if any rank failed, the failing rank re-raises its error and the others raise
  :class:`PeerFailureError` naming the rank and its message — no rank is left waiting in a
  collective the failed rank will never join.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "BACKENDS",
    "ChainShard",
    "PeerFailure",
    "PeerFailureError",
    "all_gather_rows",
    "all_reduce_sum",
    "barrier",
    "broadcast_module",
    "broadcast_object",
    "chain_shard",
    "choose_backend",
    "comm_device",
    "failure_guard",
    "gather_objects",
    "init_from_config",
    "init_from_env",
    "is_main_process",
    "launched_by_torchrun",
    "logsumexp_over_ranks",
    "peer_status",
    "rank",
    "rank_seed",
    "shard_bounds",
    "shard_sizes",
    "shutdown",
    "world_size",
]

BACKENDS = ("auto", "gloo", "nccl")


class PeerFailureError(RuntimeError):
    """Another rank failed inside a guarded section; this rank stops too.

    Attributes:
        rank: the first rank that failed.
        kind: the class name of its exception (e.g. ``"TrainingDivergedError"``).
        detail: its message.
    """

    def __init__(self, rank: int, kind: str, detail: str, what: str) -> None:
        super().__init__(f"rank {rank} failed while {what}: {kind}: {detail}")
        self.rank = rank
        self.kind = kind
        self.detail = detail


# -- process group --------------------------------------------------------------------------
def _dist() -> Any:
    """``torch.distributed`` if a process group is up, else ``None``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def launched_by_torchrun() -> bool:
    """Whether torchrun (or another launcher with its variables) started this process."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def world_size() -> int:
    """Number of processes sharing the chains (1 without a process group)."""
    dist = _dist()
    return dist.get_world_size() if dist is not None else 1


def rank() -> int:
    """This process's rank (0 without a process group)."""
    dist = _dist()
    return dist.get_rank() if dist is not None else 0


def is_main_process() -> bool:
    """Rank 0: the one that writes logs, checkpoints and results."""
    return rank() == 0


def choose_backend(backend: str, device: torch.device | str) -> str:
    """``"auto"`` -> ``"nccl"`` for a CUDA device when NCCL is available, else ``"gloo"``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        return backend
    import torch.distributed as dist

    cuda = torch.device(device).type == "cuda"
    return "nccl" if cuda and dist.is_nccl_available() else "gloo"


def init_from_env(
    backend: str = "auto", device: torch.device | str = "cpu", timeout_s: float = 1800.0
) -> torch.device:
    """Join the process group torchrun describes; returns this rank's device.

    Without torchrun's variables (a plain ``python script.py``) nothing happens and
    ``device`` is returned unchanged: single-process runs never touch ``torch.distributed``.
    A CUDA device becomes ``cuda:<LOCAL_RANK>`` (one GPU per process). ``timeout_s`` bounds
    every collective: a rank that stops answering (killed, stuck) makes the others fail
    after this long instead of hanging; it must exceed the longest phase that only rank 0
    runs (evaluation during training, writing a checkpoint). The group is destroyed at exit.
    """
    device = torch.device(device)
    if not launched_by_torchrun():
        return device
    import torch.distributed as dist

    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(
            choose_backend(backend, device), timeout=timedelta(seconds=float(timeout_s))
        )
        atexit.register(shutdown)
    return device


def init_from_config(cfg: Any) -> torch.device:
    """What ``train_meta.py`` and ``evaluate.py`` do first: ``cfg.threads`` torch threads (0
    keeps the default), then :func:`init_from_env` with ``cfg.distributed`` and
    ``cfg.device``; returns this rank's device."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    backend = getattr(cfg.distributed.backend, "value", cfg.distributed.backend)
    return init_from_env(backend, cfg.device, cfg.distributed.timeout_s)


# How long :func:`shutdown` releases the GIL before and after destroying the group.
GLOO_DRAIN_S = 0.25


def shutdown() -> None:
    """Destroy the process group if one is up (safe to call twice; registered at exit).

    A gloo worker thread frees the tensors of the collective it has just finished, and with
    torch 2.13 that takes the GIL (a tensor's Python object is released with it). If the
    interpreter is already finalising, the thread cannot get it and the process aborts
    ("terminate called without an active exception"; seen in core dumps of ranks that had
    just finished an all-gather). Sleeping releases the GIL, so any such thread finishes
    while the interpreter is alive.
    """
    dist = _dist()
    if dist is not None:
        time.sleep(GLOO_DRAIN_S)
        dist.destroy_process_group()
        time.sleep(GLOO_DRAIN_S)  # the group can outlive destroy (held elsewhere) with work pending


def comm_device() -> torch.device:
    """Where collective buffers live: the current CUDA device for NCCL, else the CPU."""
    dist = _dist()
    if dist is not None and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def barrier() -> None:
    """Wait for every rank (no-op in a single process)."""
    dist = _dist()
    if dist is not None and dist.get_world_size() > 1:
        dist.barrier()


# -- sharding and seeds ---------------------------------------------------------------------
def shard_sizes(n: int, world: int) -> list[int]:
    """Sizes of ``world`` contiguous shards of ``n`` items (the first ``n mod world`` get one
    more), e.g. ``shard_sizes(5, 2) == [3, 2]``."""
    if world < 1 or n < 0:
        raise ValueError(f"need n >= 0 and world >= 1, got n={n}, world={world}")
    base, extra = divmod(n, world)
    return [base + (1 if r < extra else 0) for r in range(world)]


def shard_bounds(n: int, world: int, rank: int) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s shard of ``n`` items."""
    sizes = shard_sizes(n, world)
    start = sum(sizes[:rank])
    return start, start + sizes[rank]


@dataclass(frozen=True)
class ChainShard:
    """This rank's chains ``[start, stop)`` of ``n_total``."""

    n_total: int
    start: int
    stop: int
    rank: int = 0
    world: int = 1

    @property
    def size(self) -> int:
        """Number of local chains."""
        return self.stop - self.start

    @property
    def sizes(self) -> list[int]:
        """Every rank's number of chains."""
        return shard_sizes(self.n_total, self.world)

    def seed(self, seed: int | None) -> int | None:
        """The local random stream's seed: ``seed`` itself in a single process."""
        return seed if self.world == 1 or seed is None else rank_seed(seed, self.rank)


def chain_shard(n_total: int) -> ChainShard:
    """This rank's shard of ``n_total`` chains (all of them in a single process).

    Raises:
        ValueError: fewer chains than ranks (a rank without chains cannot run a sampler).
    """
    world, here = world_size(), rank()
    if world == 1:  # (no checks: the caller's own validation of n_total applies unchanged)
        return ChainShard(n_total, 0, n_total)
    if n_total < world:
        raise ValueError(
            f"{n_total} chains cannot be sharded across {world} processes: use at least one "
            "chain per process (or fewer processes)"
        )
    start, stop = shard_bounds(n_total, world, here)
    return ChainShard(n_total, start, stop, here, world)


def rank_seed(seed: int, rank: int) -> int:
    """An independent seed for rank ``rank``'s random stream, derived from the run's ``seed``.

    Uses numpy's ``SeedSequence`` (entropy ``[seed, rank]``), so the streams of different
    ranks are statistically independent and each is fixed by ``(seed, rank)``: a run is
    reproducible for a fixed world size.
    """
    if seed < 0 or rank < 0:
        raise ValueError(f"seed and rank must be >= 0, got seed={seed}, rank={rank}")
    state = np.random.SeedSequence([int(seed), int(rank)]).generate_state(1, dtype=np.uint64)
    return int(state[0] >> np.uint64(1))  # < 2**63: a valid manual_seed everywhere


# -- collectives ----------------------------------------------------------------------------
def all_gather_rows(x: Tensor, counts: Sequence[int] | None = None) -> Tensor:
    """Concatenate every rank's ``(n_r, ...)`` block along dimension 0, in rank order.

    Blocks may differ in length (``counts``: every rank's ``n_r``; gathered first when not
    given). The local block enters the result as itself, so gradients flow back to it;
    the other ranks' blocks are constants. In a single process returns ``x``.
    """
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return x
    world, here = dist.get_world_size(), dist.get_rank()
    dev = comm_device()
    if counts is None:
        sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(world)]
        dist.all_gather(sizes, torch.tensor([x.shape[0]], dtype=torch.int64, device=dev))
        counts = [int(s) for s in sizes]
    counts = [int(c) for c in counts]
    if counts[here] != x.shape[0]:
        raise ValueError(f"counts[{here}] = {counts[here]} but the local block has {x.shape[0]}")
    longest = max(counts)
    # all_gather needs equal shapes: pad every block to the longest one.
    block = x.detach().to(dev)
    if block.shape[0] < longest:
        pad = block.new_zeros((longest - block.shape[0], *block.shape[1:]))
        block = torch.cat([block, pad])
    buffers = [torch.empty_like(block) for _ in range(world)]
    dist.all_gather(buffers, block.contiguous())
    pieces = [x if r == here else buffers[r][: counts[r]].to(x.device) for r in range(world)]
    return torch.cat(pieces)


def all_reduce_sum(x: Tensor) -> Tensor:
    """Sum ``x`` over ranks (in place; returns it). A no-op in a single process."""
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return x
    buffer = x if x.device == comm_device() else x.to(comm_device())
    dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
    if buffer is not x:
        x.copy_(buffer)
    return x


def logsumexp_over_ranks(x: Tensor) -> Tensor:
    """``log sum_r exp(x_r)`` of the ranks' equally shaped tensors (``x`` alone if single)."""
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return x
    dev = comm_device()
    block = x.detach().to(dev).contiguous()
    buffers = [torch.empty_like(block) for _ in range(dist.get_world_size())]
    dist.all_gather(buffers, block)
    return torch.logsumexp(torch.stack(buffers), dim=0).to(x.device)


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s picklable ``obj`` on every rank (``obj`` itself in a single process)."""
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return obj
    box = [obj if dist.get_rank() == src else None]
    dist.broadcast_object_list(box, src=src, device=comm_device())
    return box[0]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's picklable ``obj``, in rank order, on every rank (``[obj]`` if single).

    Tensors should be on the CPU: they are unpickled on the receiving rank's devices.
    """
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


@torch.no_grad()
def broadcast_module(module: torch.nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank (a no-op if single)."""
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return
    dev = comm_device()
    for tensor in [*module.parameters(), *module.buffers()]:
        buffer = tensor.detach().to(dev).contiguous()
        dist.broadcast(buffer, src=src)
        tensor.copy_(buffer)


# -- failure guard --------------------------------------------------------------------------
@dataclass(frozen=True)
class PeerFailure:
    """The first failed rank of a status exchange, with its exception's class name and text
    and, for a :class:`~metasampler.NonFiniteError`, the step at which it happened."""

    rank: int
    kind: str
    detail: str
    step: int | None = None


def peer_status(error: BaseException | None) -> PeerFailure | None:
    """Exchange every rank's status; ``None`` if no rank failed, else the first failure.

    Every rank must call it at the same point (one all-reduce of ``world_size`` ints; the
    messages are exchanged only after a failure). ``None`` in a single process.
    """
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return None
    world, here = dist.get_world_size(), dist.get_rank()
    flags = torch.zeros(world, dtype=torch.int32, device=comm_device())
    flags[here] = 0 if error is None else 1
    dist.all_reduce(flags, op=dist.ReduceOp.SUM)
    failed = [r for r in range(world) if int(flags[r]) != 0]
    if not failed:
        return None
    report = None
    if error is not None:
        report = (type(error).__name__, str(error), getattr(error, "step", None))
    kind, detail, step = gather_objects(report)[failed[0]] or ("Error", "unknown", None)
    return PeerFailure(failed[0], kind, detail, step)


@contextmanager
def failure_guard(what: str) -> Iterator[None]:
    """Run a section that must end on all ranks together, or fail on all ranks together.

    An exception inside the section on any rank makes every rank leave the section with an
    exception: the failing rank's own, :class:`PeerFailureError` naming the failed rank and
    its message on the others. Costs one all-reduce of ``world_size`` ints per section; does
    nothing in a single process. The section must not contain collectives (a failed rank
    would skip them and leave the others waiting).

    Args:
        what: what the section does, for the error message (``"unrolling the chains"``).
    """
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        yield
        return
    error: BaseException | None = None
    try:
        yield
    except Exception as err:  # KeyboardInterrupt and the like end the process as usual
        error = err
    failure = peer_status(error)
    if error is not None:
        raise error
    if failure is not None:
        raise PeerFailureError(failure.rank, failure.kind, failure.detail, what)
