"""Meta-training losses when the ``K`` chains are sharded across processes (torchrun).

Each rank unrolls its own shard of chains. The Stein estimate ``G_k`` of every chain depends
on *all* chains' positions (the kernel matrix couples them), so each loss first gathers the
detached positions of every rank (:func:`gather_slices`, :meth:`ShardedInChainCollector.gather`:
one ``all_gather`` per loss and window), then every rank computes the same Stein estimate and
keeps the rows of its own chains. The loss a rank returns is its **share** of the global
surrogate::

    share_r = (1 / n_total) sum_{k on rank r} stopgrad(grad Ũ_k / T + G_k) . theta_k

so the shares sum to the single-process surrogate (a mean over all ``n_total`` samples), and
the gradient of a share reaches only that rank's chains: the global meta-gradient is the
*sum* of the ranks' gradients (the trainer all-reduces them). The gather is split from the
computation so that the trainer can run every collective before the local work that may
fail (see :func:`metasampler.distributed.failure_guard`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..distributed import ChainShard, all_gather_rows
from .losses import InChainCollector, surrogate_share
from .stein import stein_score

__all__ = [
    "ShardedInChainCollector",
    "gather_slices",
    "sharded_cross_chain_loss",
]


def gather_slices(positions: Sequence[Tensor], shard: ChainShard) -> Tensor:
    """All ranks' positions at the window's loss times: ``(n_total, T, D)``, detached.

    ``positions`` holds ``T`` local ``(k, D)`` tensors; one ``all_gather`` for the window.
    """
    local = torch.stack([p.detach() for p in positions], dim=1)  # (k, T, D)
    return all_gather_rows(local, shard.sizes)


def sharded_cross_chain_loss(
    positions: Sequence[Tensor],
    grads: Sequence[Tensor],
    everyone: Tensor,
    shard: ChainShard,
    temperature: float = 1.0,
    **stein_kwargs: float | None,
) -> Tensor:
    """This rank's share of the cross-chain loss (eq. 10) of all ranks' chains.

    Args:
        positions, grads: ``T`` local ``(k, D)`` positions (attached) and ``grad Ũ`` there.
        everyone: :func:`gather_slices` of ``positions``.
        shard: this rank's chains.
        temperature, stein_kwargs: as :func:`~metasampler.meta.losses.cross_chain_loss`.
    """
    total = None
    for t, (theta, grad) in enumerate(zip(positions, grads, strict=True)):
        score = stein_score(everyone[:, t].contiguous(), **stein_kwargs)[shard.start : shard.stop]
        term = surrogate_share(theta, grad, score, shard.n_total, temperature)
        total = term if total is None else total + term
    return total / len(positions)


class ShardedInChainCollector(InChainCollector):
    """:class:`InChainCollector` for one rank's shard of chains.

    The random subset of ``n_select`` chains is drawn among *all* ``n_total`` chains with a
    generator that is identical on every rank (the run's shared stream), so every rank agrees
    on it; each rank keeps the selected chains that it holds (possibly none). :attr:`n_samples`
    counts the samples of all ranks, so every rank takes the same decision on whether the loss
    is computed. The pooled Stein estimate sees every rank's samples, in global chain order.
    """

    def __init__(
        self,
        shard: ChainShard,
        *,
        burn_in: int = 0,
        thinning: int = 1,
        n_select: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        n_select = shard.n_total if n_select is None else n_select
        if not (isinstance(n_select, int) and 1 <= n_select <= shard.n_total):
            raise ValueError(
                f"n_select must be None or an int in [1, n_total={shard.n_total}], got {n_select!r}"
            )
        self.shard = shard
        self.n_select_total = n_select
        self.counts = [0] * shard.world  # selected chains per rank
        # (n_select=1 only passes the base class's check; select_chains sets the real value.)
        super().__init__(
            shard.size, burn_in=burn_in, thinning=thinning, n_select=1, generator=generator
        )

    def select_chains(self, generator: torch.Generator | None = None) -> Tensor:
        """Draw the global subset; keep the local chains' indices (sorted). Clears the buffer."""
        device = generator.device if generator is not None else torch.device("cpu")
        perm = torch.randperm(self.shard.n_total, generator=generator, device=device)
        chosen = perm[: self.n_select_total].sort().values.cpu()
        bounds = [0]
        for size in self.shard.sizes:
            bounds.append(bounds[-1] + size)
        self.counts = [
            int(((chosen >= lo) & (chosen < hi)).sum())
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        local = (chosen >= self.shard.start) & (chosen < self.shard.stop)
        self.chains = chosen[local] - self.shard.start
        self.n_select = int(self.chains.numel())
        self.clear()
        return self.chains

    @property
    def n_samples(self) -> int:
        """Pooled samples held by all ranks together (kept steps × selected chains)."""
        return len(self._positions) * self.n_select_total

    def _flat(self) -> tuple[Tensor, Tensor]:
        theta, grad = self.samples()  # (n_local, m, D), chain-major
        flat = theta.reshape(-1, theta.shape[-1])
        return flat, grad.reshape(flat.shape)

    def gather(self) -> Tensor:
        """Every rank's pooled samples, ``(n_samples, D)`` detached, in global chain order."""
        flat, _ = self._flat()
        kept = len(self._positions)
        return all_gather_rows(flat.detach(), [c * kept for c in self.counts])

    def sharded_loss(
        self, everyone: Tensor, temperature: float = 1.0, **stein_kwargs: float | None
    ) -> Tensor:
        """This rank's share of the in-chain surrogate; ``everyone`` is :meth:`gather`'s."""
        flat, grad = self._flat()
        kept = len(self._positions)
        offset = sum(self.counts[: self.shard.rank]) * kept
        score = stein_score(everyone, **stein_kwargs)[offset : offset + flat.shape[0]]
        return surrogate_share(flat, grad, score, everyone.shape[0], temperature)
