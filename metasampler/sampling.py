"""``metasampler.sample``: run any sampler on any target for ``K`` chains at once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from numbers import Integral
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .adapt import Adapt, AdaptResult, adapt_burn_in, check_adapt
from .devices import check_device
from .posterior import to_inference_data
from .samplers.base import Sampler, SamplerState, check_finite, warmup_restarts
from .targets import Target, check_positions

__all__ = ["SampleResult", "sample", "make_generator", "warmup_restarts"]


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
        adapted: with ``adapt``, what the burn-in chose: the step (and friction) of every kept
            sample and the criterion's values (:class:`~metasampler.adapt.AdaptResult`).
    """

    theta: Tensor
    energy: Tensor
    steps: Tensor
    final_state: SamplerState
    target: Target | None = None
    adapted: AdaptResult | None = None

    def __repr__(self) -> str:
        # the shapes and the choice, not every tensor
        samples, chains, dim = self.theta.shape
        adapted = "" if self.adapted is None else ", " + str(self.adapted).splitlines()[0]
        steps = f" (steps {int(self.steps[0])}..{int(self.steps[-1])})" if samples else ""
        return (
            f"SampleResult({samples} samples x {chains} chains x {dim} parameters{steps}{adapted})"
        )

    def to_inference_data(self) -> Any:
        """The samples as an ArviZ ``InferenceData`` (needs ``pip install metasampler[arviz]``).

        Dimensions follow ArviZ's ``(chain, draw, ...)`` convention (``theta`` is
        ``(draw, chain, D)``). For a :class:`~metasampler.BayesianModel` each of the module's
        parameters is its own variable with its own shape (``"0.weight"``, ...); otherwise one
        variable ``theta`` of shape ``(chain, draw, D)``. ``sample_stats.energy`` holds the
        (minibatch) energy of each kept sample.
        """
        return to_inference_data(self)  # imports ArviZ, an optional extra


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device``, seeded with ``seed`` (or nondeterministically if ``None``)."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))
    return generator


_SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts


def _is_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _check_arguments(
    sampler: object,
    target: object,
    n_chains: object,
    n_steps: object,
    burn_in: object,
    thin: object,
    seed: object,
    dtype: object,
    callback: object,
) -> None:
    """:func:`sample`'s argument checks: a :class:`ValueError` naming the argument."""
    if not isinstance(sampler, Sampler):
        raise ValueError(
            f"sampler must be a metasampler sampler (SGLD, SGHMC, NNSGHMC, ...), got "
            f"{type(sampler).__name__}"
        )
    if not isinstance(target, Target):
        raise ValueError(
            "target must have dim, n_data and evaluate (an EnergyTarget, BayesianModel, ...), "
            f"got {type(target).__name__}"
        )
    for name, value in (("target.dim", target.dim), ("target.n_data", target.n_data)):
        if not _is_int(value) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for name, value, low in (
        ("n_chains", n_chains, 1),
        ("n_steps", n_steps, 1),
        ("thin", thin, 1),
        ("burn_in", burn_in, 0),
    ):
        if not _is_int(value) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if burn_in >= n_steps:
        raise ValueError(f"burn_in ({burn_in}) must be < n_steps ({n_steps}), else no sample")
    if seed is not None and not (_is_int(seed) and _SEED_RANGE[0] <= seed <= _SEED_RANGE[1]):
        raise ValueError(f"seed must be None or an integer in [-2**63, 2**64 - 1], got {seed!r}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be None or a floating torch dtype, got {dtype!r}")
    if callback is not None and not callable(callback):
        raise ValueError(f"callback must be callable or None, got {type(callback).__name__}")


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
    dtype: torch.dtype | None = None,
    callback: Callable[[SamplerState], None] | None = None,
    store: bool = True,
    adapt: bool | Adapt = False,
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
        burn_in: steps discarded before the first kept sample: the warm-up, which restarts
            what the sampler accumulates from the start at steps 50, 100, 200, ... up to half
            of it (e.g.
            NNSGHMC's thermostat: :func:`warmup_restarts`) and after which the sampler fixes
            what it adapts (e.g. NNSGHMC's stiffness statistic).
        thin: keep every ``thin``-th step after burn-in.
        seed: seeds the one generator that drives initialisation, noise and minibatches.
        progress: show a progress bar.
        device, dtype: where the chains live (default: ``init``'s device, else CPU) and their
            floating type (default: the target's, e.g. a ``BayesianModel``'s, else float32).
        callback: called with the state after every step (e.g. streaming evaluation).
        store: keep samples in memory (turn off when a callback consumes them).
        adapt: choose the step (and, for momentum samplers, the friction) during the burn-in,
            starting from the sampler's, then keep it fixed for the kept samples
            (:mod:`metasampler.adapt`). ``True``: ranked by the chains alone, which aims at
            the posterior (a model whose parameters are read, such as a regression);
            ``metasampler.Adapt(validation=(x, y))``: by held-out data of a
            :class:`~metasampler.BayesianModel`, which aims at prediction (networks). Needs
            ``burn_in >= 100``. ``callback`` is called once every chain runs the chosen
            kernel (not while the chains run in trial groups); ``result.adapted`` reports
            the choice.

    Returns:
        A :class:`SampleResult`. Samples of schedules' exploration stages are never kept.

    Raises:
        ValueError: bad arguments (the message names it): wrong types (``bool`` is not a
            number here), counts out of range, ``burn_in >= n_steps`` or a ``thin`` that keeps
            no sample, a seed torch cannot take, an object that is not a sampler or target;
            or bad shapes. A ``device`` that is not a device name or not available here
            raises :class:`~metasampler.devices.DeviceError` (a ``ValueError``). With
            ``adapt``: a burn-in shorter than 100 steps, a sampler at temperature 0 or HMC,
            held-out data for a target without ``log_likelihood``.
        NonFiniteError: a chain diverged; the message names the chain and the step. With
            ``adapt``, diverging trial steps are dropped, and only a kept-run divergence or
            every step tried diverging raises it.
    """
    device = check_device(device)
    _check_arguments(sampler, target, n_chains, n_steps, burn_in, thin, seed, dtype, callback)
    config = check_adapt(adapt, sampler, target, burn_in, n_chains)
    device = _chain_device(init, device)
    generator = make_generator(seed, device)
    dtype = dtype or _target_dtype(target)
    state = _initial_state(sampler, target, n_chains, init, generator, device, dtype)
    kept_steps = _kept_steps(sampler, state.step, n_steps, burn_in, thin)
    if store and not kept_steps:
        raise ValueError(
            f"no sample would be kept: n_steps={n_steps} with burn_in={burn_in} and thin={thin}"
            + (" (and the schedule's exploration stages)" if n_steps > burn_in else "")
            + "; run more steps or lower burn_in / thin"
        )
    n_kept = len(kept_steps) if store else 0
    bar = tqdm(total=n_steps, desc=type(sampler).__name__, disable=not progress, leave=False)
    with bar:
        adapted, steps_left = None, n_steps
        if config is not None:  # the burn-in chooses the kernel; the kept run is fixed
            state, sampler, adapted = adapt_burn_in(
                sampler, target, state, burn_in, n_steps - burn_in, generator, config,
                bar.update, callback,
            )  # fmt: skip
            steps_left, burn_in = n_steps - burn_in, 0
        warmup_end = state.step + burn_in if burn_in > 0 else None
        state, thetas, energies = _run_chains(
            sampler,
            target,
            state,
            steps_left,
            generator,
            kept_steps[:n_kept],
            callback,
            bar.update,
            warmup_end,
        )
    steps = torch.tensor(kept_steps[:n_kept])
    return SampleResult(thetas, energies, steps, state, target, adapted)


def _chain_device(
    init: Tensor | Callable[[torch.Generator], Tensor] | SamplerState | None,
    device: torch.device | str | None,
) -> torch.device:
    """Where the chains live: a continued state's device, else ``device``, else ``init``'s
    device, else CPU."""
    if isinstance(init, SamplerState):
        device = init.theta.device
    elif isinstance(init, Tensor):
        device = device or init.device
    return torch.device(device or "cpu")


def _target_dtype(target: Target) -> torch.dtype:
    """The target's floating type where it has one (a ``BayesianModel``'s), else float32."""
    dtype = getattr(target, "dtype", None)
    ok = isinstance(dtype, torch.dtype) and dtype.is_floating_point
    return dtype if ok else torch.float32


def _initial_state(
    sampler: Sampler,
    target: Target,
    n_chains: int,
    init: Tensor | Callable[[torch.Generator], Tensor] | SamplerState | None,
    generator: torch.Generator,
    device: torch.device,
    dtype: torch.dtype,
) -> SamplerState:
    """The state the run starts from: ``init`` itself when it is a state (a continued run),
    else the sampler's initial state at the checked start positions."""
    if isinstance(init, SamplerState):
        check_positions(init.theta, target.dim, "init.theta")
        if init.theta.shape[0] != n_chains:
            raise ValueError(
                f"init (a state) has {init.theta.shape[0]} chains but n_chains={n_chains}"
            )
        return init
    if init is None:
        theta = torch.randn((n_chains, target.dim), generator=generator, device=device, dtype=dtype)
    elif callable(init) and not isinstance(init, Tensor):
        theta = init(generator)
    else:
        theta = init
    theta = theta.to(device=device, dtype=theta.dtype if theta.is_floating_point() else dtype)
    check_positions(theta, target.dim, "init")
    if theta.shape[0] != n_chains:
        raise ValueError(f"init has {theta.shape[0]} chains but n_chains={n_chains}")
    return sampler.init(theta, target, generator)


def _kept_steps(sampler: Sampler, start: int, n_steps: int, burn_in: int, thin: int) -> list[int]:
    """The (absolute, 1-based) steps after ``start`` whose samples are kept: after burn-in,
    every ``thin``-th, and only where the sampler's schedule collects."""
    return [
        k
        for k in range(start + 1, start + n_steps + 1)
        if k - start > burn_in and (k - start - burn_in) % thin == 0 and sampler.collects(k)
    ]


def _run_chains(
    sampler: Sampler,
    target: Target,
    state: SamplerState,
    n_steps: int,
    generator: torch.Generator,
    kept_steps: list[int],
    callback: Callable[[SamplerState], None] | None,
    advance: Callable[[int], object],
    warmup_end: int | None = None,
) -> tuple[SamplerState, Tensor, Tensor]:
    """Take ``n_steps`` steps from ``state``, stopping on a non-finite position; returns the
    final state and the ``(S, K, D)`` positions and ``(S, K)`` energies at ``kept_steps``.
    ``advance(1)`` is called after each step (the progress bar); the warm-up before step
    ``warmup_end`` restarts at :func:`warmup_restarts`
    (:meth:`~metasampler.samplers.base.Sampler.restart_warmup`), and after it the sampler
    fixes what it adapted (:meth:`~metasampler.samplers.base.Sampler.end_warmup`)."""
    K, D = state.theta.shape
    thetas = torch.empty(
        (len(kept_steps), K, D), dtype=state.theta.dtype, device=state.theta.device
    )
    energies = torch.empty((len(kept_steps), K), dtype=state.theta.dtype, device=state.theta.device)
    kept = set(kept_steps)
    restarts = set()
    if warmup_end is not None:
        restarts = {state.step + r for r in warmup_restarts(warmup_end - state.step)}
    slot = 0
    # Sampling never builds a graph through the chain, even for a sampler with trainable nets
    # (meta-training unrolls its own windows); targets enable grad locally for grad U.
    with torch.no_grad():
        for _ in range(n_steps):
            state = sampler.step(state, target, generator)
            check_finite(state.step, position=state.theta)
            if state.step == warmup_end:
                state = sampler.end_warmup(state)
            elif state.step in restarts:
                state = sampler.restart_warmup(state)
            if state.step in kept:
                thetas[slot] = state.theta.detach()
                energies[slot] = state.energy.detach()
                slot += 1
            if callback is not None:
                callback(state)
            advance(1)
    return state, thetas, energies
