"""The criteria that rank a round's groups, each a running statistic over the group's scored
chains in blocks (the jackknife's unit): the Stein estimate of the KL (:func:`stein_kl`, from
the chains alone), the held-out predictive NLL, and the heat of the momenta."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

#: Chains are scored in up to this many blocks (the jackknife's leave-one-out unit).
BLOCKS = 8
#: The Stein sums take this many steps at a time (positions and gradients held meanwhile).
_BATCH = 16
#: Up to this dimension the Stein score uses every pair of coordinates, beyond it their
#: diagonal.
FULL_STEIN_MAX_DIM = 100


def jackknife_se(leave_out: Sequence[float]) -> float:
    """The jackknife standard error from the leave-one-block-out values."""
    j = len(leave_out)
    if j < 2 or not all(math.isfinite(v) for v in leave_out):
        return 0.0
    mean = sum(leave_out) / j
    return math.sqrt((j - 1) / j * sum((v - mean) ** 2 for v in leave_out))


class SteinStats:
    """Sums over a group's scored chains for the Stein score, per half of the window (in
    time) and per block of chains: ``sum x``, ``sum g``, ``sum x x^T`` and ``sum x g^T``
    (their diagonals above :data:`FULL_STEIN_MAX_DIM`), each ``(2, blocks, ...)``.

    Args:
        n_blocks, per_block: the scored chains, ``n_blocks * per_block`` of them.
        temperature: the sampler's.
        n_chains: ``K``, the chains of the kept run.
        window: the steps the window will count (the first half go to the first sums).
        kept_steps: the steps of the kept run.
    """

    def __init__(
        self,
        n_blocks: int,
        per_block: int,
        temperature: float,
        n_chains: int,
        window: int,
        kept_steps: int,
    ) -> None:
        self.n_blocks, self.per_block = n_blocks, per_block
        self.temperature = temperature
        self.n_chains, self.window, self.kept_steps = n_chains, window, kept_steps
        self.steps = [0, 0]  # per half
        self.sums: list[Tensor] | None = None
        self.pending: list[tuple[Tensor, Tensor]] = []  # steps not yet in the sums

    def update(self, x: Tensor, g: Tensor) -> None:
        """Add one step of the scored chains (the first ``n_blocks * per_block`` rows); the
        sums take the steps in batches (one product per batch, not per step)."""
        rows = self.n_blocks * self.per_block
        half = 0 if sum(self.steps) < self.window // 2 else 1
        if self.pending and half != self._half:
            self.flush()
        self._half = half
        self.pending.append((x[:rows], g[:rows]))
        self.steps[half] += 1
        if len(self.pending) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        """Add the pending steps to the sums of their half of the window."""
        if not self.pending:
            return
        n_b, per = self.n_blocks, self.per_block
        x = torch.stack([p[0] for p in self.pending]).double()  # (steps, rows, D)
        g = torch.stack([p[1] for p in self.pending]).double()
        self.pending = []
        x = x.reshape(-1, n_b, per, x.shape[-1]).transpose(0, 1).reshape(n_b, -1, x.shape[-1])
        g = g.reshape(-1, n_b, per, g.shape[-1]).transpose(0, 1).reshape(n_b, -1, g.shape[-1])
        d = x.shape[-1]
        if d <= FULL_STEIN_MAX_DIM:  # x^T x and x^T g in one product
            xx_xg = x.transpose(1, 2) @ torch.cat((x, g), dim=-1)
            xx, xg = xx_xg[..., :d], xx_xg[..., d:]
        else:
            xx, xg = (x * x).sum(1), (x * g).sum(1)
        terms = (x.sum(1), g.sum(1), xx, xg)
        if self.sums is None:
            self.sums = [torch.zeros((2, *t.shape), dtype=t.dtype, device=t.device) for t in terms]
        for s, t in zip(self.sums, terms, strict=True):
            s[self._half].add_(t)

    def score(self) -> tuple[float, list[float]]:
        """The score (:meth:`projected`) of all scored chains and its values leaving out
        each block in turn (the jackknife's)."""
        self.flush()
        if self.sums is None:
            return math.inf, []
        blocks = list(range(self.n_blocks))
        value = self.projected(blocks)
        leave_out = [self.projected(blocks[:j] + blocks[j + 1 :]) for j in blocks]
        return (value if math.isfinite(value) else math.inf), leave_out

    def projected(self, blocks: list[int]) -> float:
        """The Stein KL of the chains of ``blocks``, projected to the kept run.

        Its expectation is a bias (what more samples would not change) plus the estimate's
        own sampling part, which halves with twice the chains (chains are independent): the
        mean over the two halves of the blocks, less the value, estimates it. Twice the time
        halves it only where the chains decorrelate within the window: the fraction ``r``
        that the two halves of the window show (0 for chains that barely move, so that a
        step too small to mix is not excused). The projection keeps the bias (at least 0)
        and scales the sampling part to ``K`` chains and, for its fraction ``r``, to the
        kept run's length."""
        value = self.kl(blocks, (0, 1))
        if len(blocks) < 2 or not math.isfinite(value):
            return value
        by_chains = (self.kl(blocks[0::2], (0, 1)) + self.kl(blocks[1::2], (0, 1))) / 2.0
        sampling = max(by_chains - value, 0.0)
        r = 0.0
        if sampling > 0 and min(self.steps) > 0:
            by_time = (self.kl(blocks, (0,)) + self.kl(blocks, (1,))) / 2.0
            r = min(max(by_time - value, 0.0) / sampling, 1.0)
        chains = len(blocks) * self.per_block / self.n_chains
        time = sum(self.steps) / max(self.kept_steps, sum(self.steps))
        return max(value - sampling, 0.0) + sampling * chains * (1.0 - r + r * time)

    def kl(self, blocks: list[int], halves: tuple[int, ...]) -> float:
        """:func:`stein_kl` of the chains of ``blocks`` over the window's ``halves``."""
        assert self.sums is not None
        index = torch.tensor(blocks, dtype=torch.long)
        sums = [s[list(halves)][:, index].sum((0, 1)) for s in self.sums]
        n = sum(self.steps[h] for h in halves) * len(blocks) * self.per_block
        return stein_kl(*sums, n, self.temperature) if n else math.nan


def stein_kl(
    sum_x: Tensor, sum_g: Tensor, sum_xx: Tensor, sum_xg: Tensor, n: int, temperature: float
) -> float:
    """The Stein estimate of the KL divergence from the target of the Gaussian fitted to ``n``
    samples, from their sums (``sum_xx``, ``sum_xg``: ``(D, D)``, or ``(D,)`` diagonals).

    With ``M = Cov(x, grad U) / T`` and ``gbar = mean(grad U)``::

        KL ~ tr((M - I)^2) / 4 + gbar^T Cov(x) gbar / (2 T^2)

    For a Gaussian target ``M = Cov(x) P`` (``P`` the target's precision over ``T``) and
    ``gbar = P (mean(x) - m)``, so these are the covariance and mean terms of the Gaussian
    KL to second order, without the target's moments: the Stein identities
    ``E[(x - c) grad U^T] = T I`` and ``E[grad U] = 0`` at the target, whatever it is, are
    what the two terms test. Invariant under rescaling coordinates; unbiased in ``M`` and
    ``gbar`` under gradient noise independent of ``x``. With diagonals, the sum over the
    diagonal of each term."""
    mean_x, mean_g = sum_x / n, sum_g / n
    t = float(temperature)
    if sum_xx.ndim == 2:
        cov_x = sum_xx / n - torch.outer(mean_x, mean_x)
        a = (sum_xg / n - torch.outer(mean_x, mean_g)) / t
        a = a - torch.eye(a.shape[0], dtype=a.dtype, device=a.device)
        cov_term = (a * a.T).sum()
        mean_term = mean_g @ cov_x @ mean_g
    else:
        cov_x = sum_xx / n - mean_x * mean_x
        a = (sum_xg / n - mean_x * mean_g) / t - 1.0
        cov_term = (a * a).sum()
        mean_term = (mean_g * mean_g * cov_x).sum()
    return float(cov_term / 4.0 + mean_term / (2.0 * t * t))


class ValidationStats:
    """Per block of scored chains, the running log of the summed predictive probabilities of
    held-out data."""

    def __init__(self, n_blocks: int, per_block: int, target: Any, x: Tensor, y: Tensor) -> None:
        self.n_blocks, self.per_block = n_blocks, per_block
        self.target, self.x, self.y = target, x, y
        self.log_sum: Tensor | None = None  # (blocks, B)
        self.count = 0  # samples per block

    def update(self, theta: Tensor) -> None:
        """Add the scored chains' current positions."""
        per_block = self.per_block
        theta = theta[: self.n_blocks * per_block]
        logp = self.target.log_likelihood(theta, self.x, self.y).double()  # (k, B)
        logp = torch.logsumexp(logp.reshape(self.n_blocks, per_block, -1), dim=1)
        self.log_sum = logp if self.log_sum is None else torch.logaddexp(self.log_sum, logp)
        self.count += per_block

    def score(self) -> tuple[float, list[float]]:
        """The NLL of the posterior average and its values leaving out each block in turn."""
        if self.log_sum is None:
            return math.inf, []

        def nll(rows: Tensor) -> float:
            total = torch.logsumexp(rows, dim=0) - math.log(rows.shape[0] * self.count)
            return float(-total.mean())

        value = nll(self.log_sum)
        keep = torch.ones(self.n_blocks, dtype=torch.bool)
        leave_out = []
        for j in range(self.n_blocks if self.n_blocks > 1 else 0):
            keep[j] = False
            leave_out.append(nll(self.log_sum[keep]))
            keep[j] = True
        return (value if math.isfinite(value) else math.inf), leave_out


class HeatStats:
    """Per block of scored chains, the sums of each coordinate's squared momentum, for a
    sampler whose momentum's stationary law is ``N(0, T I)``
    (:attr:`~metasampler.samplers.Sampler.unit_gaussian_momentum`)."""

    def __init__(self, n_blocks: int, per_block: int, temperature: float) -> None:
        self.n_blocks, self.per_block, self.temperature = n_blocks, per_block, temperature
        self.sums: Tensor | None = None  # (blocks, D)
        self.steps = 0

    def update(self, p: Tensor) -> None:
        """Add one step of the scored chains' momenta."""
        p = p[: self.n_blocks * self.per_block]
        sq = p.square().reshape(self.n_blocks, self.per_block, -1).sum(1).double()
        self.sums = sq if self.sums is None else self.sums.add_(sq)
        self.steps += 1

    def mean_temperature(self) -> float | None:
        """The momenta's kinetic temperature over every coordinate and scored chain (``None``
        before the first step)."""
        if self.sums is None:
            return None
        n = self.steps * self.per_block * self.n_blocks * self.sums.shape[-1]
        return float(self.sums.sum() / (n * self.temperature))

    def score(self) -> tuple[float, list[float]]:
        """The heat (:meth:`value`) of all scored chains and its values leaving out each
        block in turn."""
        if self.sums is None or self.n_blocks < 3:
            return 0.0, []
        t = self.sums / (self.steps * self.per_block * self.temperature)  # (blocks, D)
        n = self.n_blocks
        total, squares = t.sum(0), t.square().sum(0)
        # every block left out in turn, at once: sums over the other n - 1 blocks
        rest, rest_squares = total - t, squares - t.square()
        leave_out = self._heat(rest, rest_squares, n - 1).tolist()
        return float(self._heat(total, squares, n)), leave_out

    @staticmethod
    def _heat(total: Tensor, squares: Tensor, n: int) -> Tensor:
        """``sum_i (t_i - 1)^2 / 4`` over coordinates (the last dimension), ``t_i`` the
        kinetic temperature of coordinate ``i`` (its momentum's mean square over ``T``; here
        the mean of ``n`` blocks' values, from their ``total`` and the total of their
        ``squares``): the KL of a Gaussian at ``t_i`` times the target's variance along each
        coordinate, to second order, the heat the positions reach where the momenta run at
        ``t_i``. Each square less its estimate's variance (from the spread over the blocks),
        so that the noisier estimate of slower momenta does not count as heat."""
        mean = total / n
        variance = (squares - n * mean.square()) / (n - 1)
        return ((mean - 1.0).square() - variance / n).sum(-1) / 4.0
