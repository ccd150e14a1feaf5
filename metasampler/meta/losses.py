"""Meta-training losses: pathwise surrogates of the negative ELBO of a chain's marginal.

Gong et al. (ICLR 2019, §3.3, appendix D; docs/METHOD.md §4) train the sampler parameters ``phi`` by
minimising the negative ELBO (``KL(q || pi)`` up to a constant) of the distribution ``q`` of
the sampler's positions::

    F(phi) = E_q[U(theta) / T] + E_q[log q(theta)],    theta = theta(phi, noise).

Its pathwise gradient is ``E[(grad U(theta) / T + grad log q(theta)) . d theta / d phi]``
(the score-function part ``E_q[d log q / d phi]`` vanishes), so with ``n`` samples and the
Stein estimate ``G_k ≈ grad log q(theta_k)`` (:func:`~metasampler.meta.stein.stein_score`)
the **surrogate**::

    S = mean_k ( stopgrad(grad Ũ(theta_k) / T + G_k) . theta_k )

has ``d S / d phi`` equal to a Monte Carlo estimate of ``d F / d phi`` (the value of ``S``
itself is meaningless; use :func:`neg_elbo_estimate` to monitor). ``grad Ũ`` may be a noisy
minibatch gradient (unbiased for ``grad U``); it must be evaluated at the same positions.
A step evaluates the gradient at its *incoming* position, so pair each position with the
gradient computed there (the one the next step evaluates), not with the gradient of the
step that produced it.

* **Cross-chain loss** (eq. 10): the ``K`` chains' positions at one time ``t`` are samples of
  the marginal ``q_t``; :func:`cross_chain_loss` averages the surrogate over the chosen times
  (every ``s``-th step of the unrolled window), with one Stein estimate per time slice.
* **In-chain loss** (eq. 11): after burn-in, the positions of a random subset of chains,
  thinned every ``tau`` steps, are samples of the time-averaged ``q``;
  :class:`InChainCollector` gathers them during the window and pools them for one Stein
  estimate (as the public reference code does; ``per_chain=True`` gives eq. 11 literally,
  one estimate per chain).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .stein import stein_score

__all__ = [
    "InChainCollector",
    "combined_loss",
    "cross_chain_loss",
    "neg_elbo_estimate",
    "surrogate_loss",
    "surrogate_share",
]


def _check_temperature(temperature: float) -> None:
    if not (
        isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0
    ):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")


def surrogate_loss(
    theta: Tensor, grad_energy: Tensor, score: Tensor, temperature: float = 1.0
) -> Tensor:
    """``mean_k( stopgrad(grad_energy_k / T + score_k) . theta_k )`` — a scalar.

    Args:
        theta: ``(n, D)`` samples, attached to the graph of the sampler parameters.
        grad_energy: ``(n, D)`` ``grad Ũ`` at ``theta`` (detached inside).
        score: ``(n, D)`` estimate of ``grad log q`` at ``theta`` (detached inside).
        temperature: ``T`` of the target ``pi ∝ exp(-U / T)``.

    The gradient of the result with respect to anything ``theta`` depends on is the
    pathwise Monte Carlo gradient of ``E_q[U] / T + E_q[log q]``.
    """
    _check_temperature(temperature)
    if theta.ndim != 2:
        raise ValueError(f"theta must have shape (n, D), got {tuple(theta.shape)}")
    if grad_energy.shape != theta.shape:
        raise ValueError(
            f"grad_energy must have the shape of theta {tuple(theta.shape)}, "
            f"got {tuple(grad_energy.shape)}"
        )
    if score.shape != theta.shape:
        raise ValueError(
            f"score must have the shape of theta {tuple(theta.shape)}, got {tuple(score.shape)}"
        )
    return surrogate_share(theta, grad_energy, score, theta.shape[0], temperature)


def surrogate_share(
    theta: Tensor, grad_energy: Tensor, score: Tensor, n_total: int, temperature: float = 1.0
) -> Tensor:
    """``(1 / n_total) sum_k stopgrad(grad_energy_k / T + score_k) . theta_k`` over the rows
    given: :func:`surrogate_loss` when the rows are all ``n_total`` samples, one rank's share of
    it when the samples are sharded across processes (the shares sum to the whole)."""
    _check_temperature(temperature)
    direction = (grad_energy / temperature + score).detach()
    return (direction * theta).sum() / n_total


def cross_chain_loss(
    positions: Sequence[Tensor],
    grads: Sequence[Tensor],
    temperature: float = 1.0,
    **stein_kwargs: float | None,
) -> Tensor:
    """Cross-chain loss (eq. 10): the mean over time slices of the surrogate.

    Args:
        positions: ``T`` tensors of shape ``(K, D)``: all chains' positions at the chosen
            times, attached to the graph.
        grads: ``T`` tensors of shape ``(K, D)``: ``grad Ũ`` at those positions.
        temperature: ``T`` of the target.
        **stein_kwargs: ``bandwidth_factor``, ``ridge``, ``bandwidth`` for
            :func:`~metasampler.meta.stein.stein_score`, applied per slice (on detached
            positions: the estimate is used under stop-gradient).
    """
    if len(positions) == 0:
        raise ValueError("positions must hold at least one time slice")
    if len(grads) != len(positions):
        raise ValueError(
            f"grads must have one entry per time slice ({len(positions)}), got {len(grads)}"
        )
    total = None
    for theta, grad in zip(positions, grads, strict=True):
        if theta.ndim != 2:
            raise ValueError(f"each position must have shape (K, D), got {tuple(theta.shape)}")
        score = stein_score(theta.detach(), **stein_kwargs)
        term = surrogate_loss(theta, grad, score, temperature)
        total = term if total is None else total + term
    return total / len(positions)


def combined_loss(
    cross: Tensor | None,
    in_chain: Tensor | None,
    weights: tuple[float, float] = (1.0, 1.0),
) -> Tensor:
    """``w_cross * cross + w_in * in_chain``; a ``None`` term (not computed) is left out."""
    if len(weights) != 2:
        raise ValueError(f"weights must be a pair (w_cross, w_in), got {weights!r}")
    for name, w in zip(("w_cross", "w_in"), weights, strict=True):
        if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0):
            raise ValueError(f"weights: {name} must be a finite number >= 0, got {w!r}")
    if cross is None and in_chain is None:
        raise ValueError("combined_loss needs at least one of cross, in_chain")
    terms = [w * t for w, t in zip(weights, (cross, in_chain), strict=True) if t is not None]
    return terms[0] if len(terms) == 1 else terms[0] + terms[1]


class InChainCollector:
    """Collects thinned positions of a random subset of chains for the in-chain loss (eq. 11).

    Feed it every step of an unrolled window with :meth:`collect`; it keeps the positions
    after step ``s`` (the chains' 1-based step count since their initialisation, as
    ``SamplerState.step``) when ``s > burn_in`` and ``(s - burn_in) % thinning == 0``, for
    the selected chains only. :meth:`loss` pools them (``n_kept_steps * n_select`` samples)
    and returns the surrogate with one Stein estimate on the pool. Call :meth:`clear` after
    each window's backward pass (the stored tensors hold that window's graph) and
    :meth:`select_chains` to draw a new subset (e.g. at each sub-epoch). :meth:`retire`
    instead keeps the samples, detached, as *earlier* samples: later losses include them in
    the Stein estimate (the density of the pooled law) but take no gradient through them.

    Args:
        n_chains: ``K``, the number of chains fed to :meth:`collect`.
        burn_in: steps discarded at the start (paper toy task: 50).
        thinning: ``tau >= 1``, keep every ``tau``-th step after burn-in (toy task: 3).
        n_select: how many chains to use (toy task: 5); ``None`` uses all ``K``.
        generator: drives the random chain subset.
        per_chain: if True, one Stein estimate per chain on its own thinned samples (eq. 11
            literally) instead of one on the pooled samples.
    """

    def __init__(
        self,
        n_chains: int,
        *,
        burn_in: int = 0,
        thinning: int = 1,
        n_select: int | None = None,
        generator: torch.Generator | None = None,
        per_chain: bool = False,
    ) -> None:
        if not (isinstance(n_chains, int) and n_chains >= 1):
            raise ValueError(f"n_chains must be an int >= 1, got {n_chains!r}")
        if not (isinstance(burn_in, int) and burn_in >= 0):
            raise ValueError(f"burn_in must be an int >= 0, got {burn_in!r}")
        if not (isinstance(thinning, int) and thinning >= 1):
            raise ValueError(f"thinning must be an int >= 1, got {thinning!r}")
        if n_select is None:
            n_select = n_chains
        if not (isinstance(n_select, int) and 1 <= n_select <= n_chains):
            raise ValueError(
                f"n_select must be None or an int in [1, n_chains={n_chains}], got {n_select!r}"
            )
        self.n_chains = n_chains
        self.burn_in = burn_in
        self.thinning = thinning
        self.n_select = n_select
        self.per_chain = bool(per_chain)
        self._positions: list[Tensor] = []
        self._grads: list[Tensor] = []
        self._steps: list[int] = []
        self._earlier: list[Tensor] = []  # (n_select, n_kept, D) blocks, detached
        self.chains = torch.arange(n_select)
        self.select_chains(generator)

    def select_chains(self, generator: torch.Generator | None = None) -> Tensor:
        """Draw a new random subset of ``n_select`` chains (sorted indices); clears the buffer
        and the earlier samples."""
        device = generator.device if generator is not None else torch.device("cpu")
        perm = torch.randperm(self.n_chains, generator=generator, device=device)
        self.chains = perm[: self.n_select].sort().values.cpu()
        self.clear()
        self._earlier.clear()
        return self.chains

    def wants(self, step: int) -> bool:
        """Whether the positions after step ``step`` (1-based) are kept."""
        return step > self.burn_in and (step - self.burn_in) % self.thinning == 0

    def collect(self, step: int, theta: Tensor, grad: Tensor) -> bool:
        """Offer all chains' ``(K, D)`` positions and ``grad Ũ`` there after step ``step``.

        Returns whether they were kept.
        """
        if theta.ndim != 2 or theta.shape[0] != self.n_chains:
            raise ValueError(
                f"theta must have shape (n_chains={self.n_chains}, D), got {tuple(theta.shape)}"
            )
        if grad.shape != theta.shape:
            raise ValueError(
                f"grad must have the shape of theta {tuple(theta.shape)}, got {tuple(grad.shape)}"
            )
        if self._positions and theta.shape[1] != self._positions[0].shape[1]:
            raise ValueError(
                f"theta has dimension {theta.shape[1]}, earlier steps had "
                f"{self._positions[0].shape[1]}"
            )
        if not self.wants(step):
            return False
        idx = self.chains.to(theta.device)
        self._positions.append(theta.index_select(0, idx))
        self._grads.append(grad.detach().index_select(0, idx))
        self._steps.append(int(step))
        return True

    def clear(self) -> None:
        """Drop the collected samples (keeps the chain subset and the earlier samples)."""
        self._positions.clear()
        self._grads.clear()
        self._steps.clear()

    def retire(self) -> None:
        """Keep the collected samples, detached, as earlier samples; then :meth:`clear`."""
        if self._positions:
            self._earlier.append(torch.stack(self._positions, dim=1).detach())
        self.clear()

    @property
    def n_earlier(self) -> int:
        """Number of earlier (retired) samples held."""
        return sum(block.shape[0] * block.shape[1] for block in self._earlier)

    @property
    def steps(self) -> list[int]:
        """The steps whose positions are held, in order."""
        return list(self._steps)

    @property
    def n_samples(self) -> int:
        """Number of pooled samples held (kept steps × selected chains)."""
        return len(self._positions) * self.n_select

    def samples(self) -> tuple[Tensor, Tensor]:
        """``(positions, grads)`` of shape ``(n_select, n_kept_steps, D)``, chain-major."""
        if not self._positions:
            raise ValueError("no samples collected yet (check burn_in and thinning)")
        return torch.stack(self._positions, dim=1), torch.stack(self._grads, dim=1)

    def loss(self, temperature: float = 1.0, **stein_kwargs: float | None) -> Tensor:
        """The in-chain surrogate on the collected samples (see the class docstring); the
        Stein estimate also covers the earlier samples, the surrogate only the collected."""
        theta, grad = self.samples()  # (S, m, D)
        pooled = torch.cat([*self._earlier, theta.detach()], dim=1)  # earlier steps first
        if self.per_chain:
            score = stein_score(pooled, **stein_kwargs)  # one set per chain
        else:
            score = stein_score(pooled.reshape(-1, pooled.shape[-1]), **stein_kwargs)
        score = score.reshape(pooled.shape)[:, -theta.shape[1] :]
        flat = theta.reshape(-1, theta.shape[-1])
        score = score.reshape(flat.shape)
        return surrogate_loss(flat, grad.reshape(flat.shape), score, temperature)


def neg_elbo_estimate(energy: Tensor, samples: Tensor, temperature: float = 1.0) -> Tensor:
    """Cheap monitoring value of the loss ``E_q[U] / T - H[q]`` (not for gradients).

    ``E_q[U]`` is the sample mean of ``energy`` (``(n,)``) and ``H[q]`` is replaced by the
    entropy of the diagonal Gaussian with the samples' per-coordinate variances,
    ``sum_d 0.5 log(2 pi e var_d)``. That Gaussian has the largest entropy among laws with
    those marginal variances, so the value is a *lower* bound of the true negative ELBO
    (optimistic, most for correlated or multi-modal ``q``) — useful for trends only.
    Cost ``O(n D)``; needs ``n >= 2`` samples of shape ``(n, D)``.
    """
    _check_temperature(temperature)
    if samples.ndim != 2 or samples.shape[0] < 2:
        raise ValueError(f"samples must have shape (n >= 2, D), got {tuple(samples.shape)}")
    if energy.shape != samples.shape[:1]:
        raise ValueError(f"energy must have shape ({samples.shape[0]},), got {tuple(energy.shape)}")
    with torch.no_grad():
        var = samples.var(dim=0).clamp_min(torch.finfo(samples.dtype).tiny)
        entropy = 0.5 * (math.log(2.0 * math.pi * math.e) + var.log()).sum()
        return energy.mean() / temperature - entropy
