"""``metasampler.sample``: run any sampler on any target for ``K`` chains at once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .samplers.base import Sampler, SamplerState, check_finite
from .targets import Target, check_positions

__all__ = ["SampleResult", "sample", "make_generator"]


@dataclass
class SampleResult:
    """Kept samples of a run.

    Attributes:
        theta: ``(S, K, D)`` kept positions.
        energy: ``(S, K)`` energy from the target evaluation made in the step that produced
            each kept position (a minibatch energy for Bayesian models; for Euler-type samplers
            it is evaluated at the position the step started from).
        steps: ``(S,)`` 1-based step index of each kept sample.
        final_state: the sampler state after the last step (to continue a run).
        target: the target that was sampled (for predictions, parameter names and
            :func:`~metasampler.summary`).
    """

    theta: Tensor
    energy: Tensor
    steps: Tensor
    final_state: SamplerState
    target: Target | None = None

    def to_inference_data(self) -> Any:
        """The samples as an ArviZ ``InferenceData`` (needs ``pip install metasampler[arviz]``).

        Dimensions follow ArviZ's ``(chain, draw, ...)`` convention (``theta`` is
        ``(draw, chain, D)``). For a :class:`~metasampler.BayesianModel` each of the module's
        parameters is its own variable with its own shape (``"0.weight"``, ...); otherwise one
        variable ``theta`` of shape ``(chain, draw, D)``. ``sample_stats.energy`` holds the
        (minibatch) energy of each kept sample.
        """
        from .posterior import to_inference_data  # imports ArviZ, an optional extra

        return to_inference_data(self)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device``, seeded with ``seed`` (or nondeterministically if ``None``)."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))
    return generator


def sample(
    sampler: Sampler,
    target: Target,
    n_chains: int,
    n_steps: int,
    *,
    init: Tensor | Callable[[torch.Generator], Tensor] | SamplerState | None = None,
    burn_in: int = 0,
    thin: int = 1,
    seed: int | None = None,
    progress: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    callback: Callable[[SamplerState], None] | None = None,
    store: bool = True,
) -> SampleResult:
    """Run ``n_chains`` chains of ``sampler`` on ``target`` for ``n_steps`` steps.

    Args:
        sampler: any sampler (baselines or a loaded :class:`~metasampler.NNSGHMC`).
        target: an :class:`~metasampler.EnergyTarget`, :class:`~metasampler.BayesianModel`
            or anything with ``dim``, ``n_data`` and ``evaluate``.
        n_chains: ``K``.
        n_steps: number of steps per chain.
        init: ``(K, D)`` start positions, a function ``generator -> (K, D)``, a state from an
            earlier run (to continue it), or ``None`` for ``N(0, I)`` starts.
        burn_in: steps discarded before the first kept sample.
        thin: keep every ``thin``-th step after burn-in.
        seed: seeds the one generator that drives initialisation, noise and minibatches.
        progress: show a progress bar.
        device, dtype: where the chains live (default: ``init``'s device, else CPU).
        callback: called with the state after every step (e.g. streaming evaluation).
        store: keep samples in memory (turn off when a callback consumes them).

    Returns:
        A :class:`SampleResult`. Samples of schedules' exploration stages are never kept.

    Raises:
        ValueError: bad arguments or shapes.
        NonFiniteError: a chain diverged; the message names the chain and the step.
    """
    for name, value, low in (
        ("n_chains", n_chains, 1),
        ("n_steps", n_steps, 1),
        ("thin", thin, 1),
        ("burn_in", burn_in, 0),
    ):
        if int(value) != value or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if isinstance(init, SamplerState):
        device = init.theta.device
    elif isinstance(init, Tensor):
        device = device or init.device
    device = torch.device(device or "cpu")
    generator = make_generator(seed, device)

    if isinstance(init, SamplerState):
        state = init
        check_positions(state.theta, target.dim, "init.theta")
    else:
        if init is None:
            theta = torch.randn(
                (n_chains, target.dim), generator=generator, device=device, dtype=dtype
            )
        elif callable(init) and not isinstance(init, Tensor):
            theta = init(generator)
        else:
            theta = init
        theta = theta.to(device=device, dtype=theta.dtype if theta.is_floating_point() else dtype)
        check_positions(theta, target.dim, "init")
        if theta.shape[0] != n_chains:
            raise ValueError(f"init has {theta.shape[0]} chains but n_chains={n_chains}")
        state = sampler.init(theta, target, generator)

    start = state.step
    kept_steps = [
        k
        for k in range(start + 1, start + n_steps + 1)
        if k - start > burn_in and (k - start - burn_in) % thin == 0 and sampler.collects(k)
    ]
    n_kept = len(kept_steps) if store else 0
    K, D = state.theta.shape
    thetas = torch.empty((n_kept, K, D), dtype=state.theta.dtype, device=device)
    energies = torch.empty((n_kept, K), dtype=state.theta.dtype, device=device)
    kept = set(kept_steps)
    slot = 0
    bar = tqdm(total=n_steps, desc=type(sampler).__name__, disable=not progress, leave=False)
    # Sampling never builds a graph through the chain, even for a sampler with trainable nets
    # (meta-training unrolls its own windows); targets enable grad locally for grad U.
    with torch.no_grad(), bar:
        for _ in range(n_steps):
            state = sampler.step(state, target, generator)
            check_finite(state.step, position=state.theta)
            if store and state.step in kept:
                thetas[slot] = state.theta.detach()
                energies[slot] = state.energy.detach()
                slot += 1
            if callback is not None:
                callback(state)
            bar.update(1)
    return SampleResult(thetas, energies, torch.tensor(kept_steps[:n_kept]), state, target)
