"""Replay pool of chain states for meta-training (Gong et al. ICLR 2019, appendix F.3.1).

Inspired by experience replay: at the start of each meta-epoch every chain restarts, with
probability ``replay_prob`` (paper: 0.15), from a state drawn from a pool of earlier final
states ``(theta, p)``, and otherwise from a fresh random initialisation. The pool is a FIFO
queue of constant size, updated after each sub-epoch, so the sampler sees both burn-in from
scratch and roughly converged behaviour (docs/METHOD.md §4).

The pool stores one row per chain (capacity counts chain states, not batches) as detached
clones in a ring buffer; :meth:`ReplayPool.draw_initial` is vectorised over chains.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

__all__ = ["ReplayPool"]


def _check_prob(replay_prob: float) -> float:
    if not (
        isinstance(replay_prob, (int, float))
        and math.isfinite(replay_prob)
        and 0.0 <= replay_prob <= 1.0
    ):
        raise ValueError(f"replay_prob must be a number in [0, 1], got {replay_prob!r}")
    return float(replay_prob)


def _check_capacity(capacity: int) -> int:
    if isinstance(capacity, bool) or not (isinstance(capacity, int) and capacity >= 1):
        raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
    return capacity


class ReplayPool:
    """FIFO pool of final chain states ``(theta, p)``.

    Args:
        capacity: maximum number of stored chain states (rows); the oldest are evicted.
        replay_prob: probability that a chain restarts from a pool state.
        generator: default generator for :meth:`draw_initial` (its state is not part of
            :meth:`state_dict`; checkpoint it with the rest of the run's RNG).
    """

    def __init__(
        self, capacity: int, replay_prob: float, generator: torch.Generator | None = None
    ) -> None:
        self.capacity = _check_capacity(capacity)
        self.replay_prob = _check_prob(replay_prob)
        self.generator = generator
        self._theta: Tensor | None = None  # (capacity, D) ring buffer, allocated lazily
        self._momentum: Tensor | None = None
        self._next = 0  # ring slot the next row goes to
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def dim(self) -> int | None:
        """``D`` of the stored states, ``None`` while the pool has never been filled."""
        return None if self._theta is None else int(self._theta.shape[1])

    def _check_pair(self, theta: Tensor, p: Tensor, what: str) -> None:
        if theta.ndim != 2:
            raise ValueError(f"{what} theta must have shape (K, D), got {tuple(theta.shape)}")
        if p.shape != theta.shape:
            raise ValueError(
                f"{what} p must have the shape of theta {tuple(theta.shape)}, got {tuple(p.shape)}"
            )
        if self._theta is not None and theta.shape[1] != self._theta.shape[1]:
            raise ValueError(
                f"{what} theta has dimension {theta.shape[1]} but the pool stores states of "
                f"dimension {self._theta.shape[1]}"
            )

    def add(self, theta: Tensor, p: Tensor) -> None:
        """Append ``K`` chain states (rows of ``(K, D)`` tensors), evicting the oldest."""
        self._check_pair(theta, p, "add:")
        theta = theta.detach()
        p = p.detach()
        if self._theta is None:
            d = theta.shape[1]
            self._theta = torch.empty(self.capacity, d, dtype=theta.dtype, device=theta.device)
            self._momentum = torch.empty(self.capacity, d, dtype=p.dtype, device=p.device)
        k = theta.shape[0]
        if k == 0:
            return
        if k > self.capacity:  # only the newest rows survive
            theta, p = theta[-self.capacity :], p[-self.capacity :]
            self._next = (self._next + k - self.capacity) % self.capacity
            k = self.capacity
        slots = (self._next + torch.arange(k, device=self._theta.device)) % self.capacity
        # index_copy_ copies, so the pool never aliases the caller's tensors.
        self._theta.index_copy_(0, slots, theta.to(self._theta))
        self._momentum.index_copy_(0, slots, p.to(self._momentum))
        self._next = (self._next + k) % self.capacity
        self._size = min(self._size + k, self.capacity)

    def _order(self) -> Tensor:
        """Ring slots of the stored rows, oldest first."""
        start = (self._next - self._size) % self.capacity
        device = self._theta.device if self._theta is not None else None
        return (start + torch.arange(self._size, device=device)) % self.capacity

    def states(self) -> tuple[Tensor, Tensor]:
        """Copies of the stored ``(theta, p)``, shape ``(len(self), D)``, oldest first."""
        if self._theta is None:
            raise ValueError("the replay pool is empty")
        order = self._order()
        return self._theta[order].clone(), self._momentum[order].clone()

    def draw_initial(
        self, fresh_theta: Tensor, fresh_p: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Initial states for ``K`` chains.

        Each chain independently takes a pool state with probability ``replay_prob`` (never
        while the pool is empty), otherwise its row of ``fresh_theta`` / ``fresh_p``.
        Replayed chains get distinct pool states whenever the pool holds at least ``K``
        states (a random permutation of the pool, cycled if it is smaller).

        Returns:
            ``(theta, p, mask)``: new ``(K, D)`` tensors (never views of the pool or of the
            inputs) and the ``(K,)`` bool mask of replayed chains.
        """
        self._check_pair(fresh_theta, fresh_p, "draw_initial:")
        gen = generator if generator is not None else self.generator
        gdev = gen.device if gen is not None else torch.device("cpu")
        k = fresh_theta.shape[0]
        dev = fresh_theta.device
        u = torch.rand(k, generator=gen, device=gdev)
        if self._size == 0:
            mask = torch.zeros(k, dtype=torch.bool, device=dev)
            return fresh_theta.detach().clone(), fresh_p.detach().clone(), mask
        mask = (u < self.replay_prob).to(dev)
        perm = torch.randperm(self._size, generator=gen, device=gdev)
        pick = perm[torch.arange(k, device=gdev) % self._size].to(self._theta.device)
        slots = self._order()[pick]
        pool_theta = self._theta[slots].to(device=dev, dtype=fresh_theta.dtype)
        pool_p = self._momentum[slots].to(device=dev, dtype=fresh_p.dtype)
        m = mask[:, None]
        theta = torch.where(m, pool_theta, fresh_theta.detach())
        p = torch.where(m, pool_p, fresh_p.detach())
        return theta, p, mask

    # -- checkpoints --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Tensors and ints only: ``capacity``, ``size``, ``replay_prob`` (0-d float64
        tensor) and ``theta`` / ``momentum`` of shape ``(size, D)``, oldest first (``(0, 0)``
        for a never-filled pool)."""
        if self._theta is None:
            theta = torch.zeros(0, 0)
            momentum = torch.zeros(0, 0)
        else:
            theta, momentum = (t.clone() for t in (self._theta, self._momentum))
            order = self._order()
            theta, momentum = theta[order], momentum[order]
        return {
            "capacity": self.capacity,
            "size": self._size,
            "replay_prob": torch.tensor(self.replay_prob, dtype=torch.float64),
            "theta": theta,
            "momentum": momentum,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore capacity, replay probability and stored states from :meth:`state_dict`."""
        missing = {"capacity", "size", "replay_prob", "theta", "momentum"} - set(state)
        if missing:
            raise ValueError(f"state is missing keys {sorted(missing)}")
        capacity = _check_capacity(int(state["capacity"]))
        prob = _check_prob(float(state["replay_prob"]))
        size = int(state["size"])
        theta, momentum = state["theta"], state["momentum"]
        if not 0 <= size <= capacity:
            raise ValueError(f"state: size must be in [0, capacity={capacity}], got {size}")
        if theta.ndim != 2 or momentum.shape != theta.shape or theta.shape[0] != size:
            raise ValueError(
                f"state: theta and momentum must both have shape (size={size}, D), got "
                f"{tuple(theta.shape)} and {tuple(momentum.shape)}"
            )
        self.capacity, self.replay_prob = capacity, prob
        self._next, self._size = 0, 0
        if size == 0 and theta.shape[1] == 0:
            self._theta = self._momentum = None
            return
        self._theta = torch.empty(capacity, theta.shape[1], dtype=theta.dtype, device=theta.device)
        self._momentum = torch.empty(
            capacity, theta.shape[1], dtype=momentum.dtype, device=momentum.device
        )
        self.add(theta, momentum)
