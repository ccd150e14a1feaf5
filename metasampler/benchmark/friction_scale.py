"""The learned friction inside a thermostat, scaled on the task the sampler was trained on.

A sampler meta-trained without a thermostat learns a friction ``D_f`` that also dissipates the
gradient noise's heat. Inside NNSGHMC's thermostat (``thermostat = True``), which takes that
heat out itself, the same friction only slows the chains: on the toy a quarter of it mixes
twice as fast at a lower KL (research/NOTEBOOK.md). :func:`choose_friction_scale`
picks the factor ``s`` of ``D_f = s s_D f_D`` (``d_output_scale``, which Gamma differentiates
with the rest) on a Gaussian the caller names, which should be the meta-training task, never
the test: the scales are tried from 1 down, and the one chosen is the last before the first
whose mean KL at the run's end rises above the unscaled friction's by more than ``tolerance``
of it and by more than the seeds' scatter (a smaller friction only helps while the chains stay
as accurate). The task decides: the same toy files keep their full friction when the choice runs
on the training Gaussian with its coordinates rotated, and a scaled friction costs KL on
correlated Gaussians of moderate conditioning while it helps on stiff ones
(research/NOTEBOOK.md), so choose on a Gaussian like the targets to be sampled.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from ..learned import NNSGHMC
from ..targets import NonFiniteError
from .gaussian import gaussian_benchmark

__all__ = [
    "DEFAULT_FRICTION_SCALES",
    "FrictionScaleChoice",
    "ScaleRun",
    "choose_friction_scale",
    "pick_friction_scale",
]

#: 1, 1/2, ..., 1/32 (the shipped toy files' choices were 1/16 to 1/2).
DEFAULT_FRICTION_SCALES: tuple[float, ...] = tuple(2.0**-k for k in range(6))


@dataclass(frozen=True)
class ScaleRun:
    """One chain seed at one friction scale on task number ``task`` (``kl_final`` is ``inf``
    where it diverged)."""

    scale: float
    seed: int
    kl_early: float
    kl_final: float
    ess: float
    task: int = 0


@dataclass(frozen=True)
class FrictionScaleChoice:
    """Each task's own choice (the smallest scale it accepts), every run behind them, and the
    rule's settings; :attr:`scale` is the choice."""

    task_scales: tuple[float, ...]
    runs: tuple[ScaleRun, ...]
    tolerance: float
    kl_steps: tuple[int, int]
    z: float = 2.0

    @property
    def scale(self) -> float:
        """The smallest scale every task accepts (each accepts the scales down to its own)."""
        return max(self.task_scales)

    def table(self) -> str:
        """Each task and scale run, mean ± standard error over the seeds, as a markdown table
        (a scale is "rejected" on the tasks that stopped the search)."""
        early, final = self.kl_steps
        lines = [
            f"| task | friction scale | seeds | KL @ {early:,} | KL @ {final:,} | ESS | |",
            "|---:|---:|---:|---:|---:|---:|---|",
        ]
        keys = sorted({(run.task, run.scale) for run in self.runs}, key=lambda k: (k[0], -k[1]))
        for task, scale in keys:
            runs = [run for run in self.runs if (run.task, run.scale) == (task, scale)]
            cells = [str(task), f"{scale:g}", str(len(runs))]
            for values in ([r.kl_early for r in runs], [r.kl_final for r in runs]):
                mean, se = _mean_and_se(values)
                cells.append(f"{mean:.3g} ± {se:.2g}")
            cells.append(f"{_mean_and_se([r.ess for r in runs])[0]:.1f}")
            verdict = "rejected" if scale < self.task_scales[task] else ""
            cells.append("chosen" if scale == self.scale else verdict)
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)


def _mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (0 for one value). Unlike
    :func:`~metasampler.benchmark.metrics.mean_se` it keeps infinite values: a diverged seed must
    make its scale's mean infinite, which rejects the scale."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


def pick_friction_scale(
    kl_by_scale: Sequence[tuple[float, Sequence[float]]], tolerance: float, z: float = 2.0
) -> float:
    """The rule on ``(scale, final KL of each seed)`` pairs in decreasing scale, the first the
    reference: the last scale before the first whose mean KL exceeds the reference's by more
    than ``tolerance`` times the reference's mean *and* by more than ``z`` standard errors of
    the difference (at a few seeds a KL near its finite-sample floor scatters by more than a
    15 % tolerance, so the rise must also be one the seeds resolve).
    """
    if not kl_by_scale:
        raise ValueError("pick_friction_scale needs at least the reference scale's KL")
    ref_mean, ref_se = _mean_and_se(kl_by_scale[0][1])
    chosen = kl_by_scale[0][0]
    for scale, kls in kl_by_scale[1:]:
        mean, se = _mean_and_se(kls)
        rise = mean - ref_mean
        margin = max(tolerance * ref_mean, z * math.hypot(se, ref_se))
        if not rise <= margin:  # NaN and inf (a divergence) end the search too
            break
        chosen = scale
    return chosen


def _check_arguments(
    sampler: Any, scales: Sequence[float], seeds: Sequence[int], tolerance: float, z: float
) -> None:
    if not isinstance(sampler, NNSGHMC):
        raise TypeError(f"choose_friction_scale needs an NNSGHMC, got {type(sampler).__name__}")
    if not scales or scales[0] != 1.0:
        raise ValueError(f"friction scales must start at 1 (the reference), got {list(scales)}")
    if any(not (0.0 < b < a) for a, b in zip(scales, scales[1:], strict=False)):
        raise ValueError(f"friction scales must be positive and decreasing, got {list(scales)}")
    if not seeds:
        raise ValueError("choose_friction_scale needs at least one chain seed")
    for name, value in (("tolerance", tolerance), ("z", z)):
        if not (math.isfinite(value) and value >= 0.0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")


def _inside_thermostat(sampler: NNSGHMC, scale: float) -> NNSGHMC:
    """A copy of ``sampler`` in its thermostat with its friction times ``scale``, eager (a
    one-off toy run: a compile would take longer than the run)."""
    scaled = copy.deepcopy(sampler)
    scaled.thermostat = True
    scaled.d_output_scale = sampler.d_output_scale * scale
    scaled.use_compile = False
    try:
        scaled.arguments()  # the constants' one rule, e.g. a thermostat needs exact Gamma
    except ValueError as err:
        raise ValueError(f"the sampler cannot run inside a thermostat: {err}") from None
    return scaled


def _run_scale(
    sampler: NNSGHMC, tasks: list[Any], index: int, scale: float, seed: int, settings: dict
) -> ScaleRun:
    early, final = settings["kl_at"]
    scaled = _inside_thermostat(sampler, scale)
    try:
        result = gaussian_benchmark(scaled, tasks[index], seed=seed, **settings)
    except NonFiniteError:
        return ScaleRun(scale, seed, math.inf, math.inf, math.nan, index)
    kls = result[f"kl@{early}"], result[f"kl@{final}"]
    return ScaleRun(scale, seed, *kls, result["ess"], index)


def choose_friction_scale(
    sampler: NNSGHMC,
    task: Any | Sequence[Any],
    *,
    scales: Sequence[float] = DEFAULT_FRICTION_SCALES,
    seeds: Sequence[int] = (100, 101, 102),
    tolerance: float = 0.15,
    z: float = 2.0,
    n_chains: int = 50,
    n_steps: int = 12_000,
    grad_noise_std: float = 1.0,
    progress: bool = True,
) -> FrictionScaleChoice:
    """Choose the friction scale of ``sampler`` inside its thermostat on the Gaussian ``task``
    (or on each of a list of them: the scale chosen is then the smallest that every task
    accepts, e.g. the training Gaussian and the same in a rotated basis,
    :meth:`tasks.gaussian.GaussianTask.rotated`).

    Each scale runs ``n_chains`` chains for ``n_steps`` steps from every seed in ``seeds``
    (:func:`~metasampler.benchmark.gaussian.gaussian_benchmark`, gradient noise
    ``N(0, grad_noise_std^2)``) at the sampler's own step, with its other settings (e.g.
    ``grad_noise_estimate``) as given; scales after the first rejected one are not run.
    The rule is :func:`pick_friction_scale`'s. ``sampler`` is not changed: to use the choice,
    set ``thermostat = True`` and multiply ``d_output_scale`` by the returned ``scale``.

    Raises:
        TypeError: ``sampler`` is not an :class:`NNSGHMC`.
        ValueError: ``scales`` do not start at 1 and decrease, no seeds, a negative
            ``tolerance`` or ``z``, a sampler that cannot run inside a thermostat (finite-difference
            Gamma), or a reference run (scale 1) that diverged.
    """
    _check_arguments(sampler, scales, seeds, tolerance, z)
    _inside_thermostat(sampler, 1.0)  # fail before any run
    kl_steps = (min(1000, n_steps), n_steps)
    settings = {
        "n_chains": n_chains,
        "n_steps": n_steps,
        "kl_at": list(kl_steps),
        "grad_noise_std": grad_noise_std,
    }
    tasks = list(task) if isinstance(task, list | tuple) else [task]
    runs: list[ScaleRun] = []
    kl_by_scale: list[list[tuple[float, list[float]]]] = [[] for _ in tasks]
    total = len(scales) * len(seeds) * len(tasks)
    bar = tqdm(total=total, desc="friction scales", disable=not progress)
    for scale in scales:
        for index, history in enumerate(kl_by_scale):
            scale_runs = [_run_scale(sampler, tasks, index, scale, s, settings) for s in seeds]
            bar.update(len(seeds))
            runs.extend(scale_runs)
            history.append((scale, [run.kl_final for run in scale_runs]))
            if not all(math.isfinite(kl) for kl in history[0][1]):
                raise ValueError("the sampler diverged inside its thermostat at its own friction")
        picks = [pick_friction_scale(history, tolerance, z) for history in kl_by_scale]
        if max(picks) != scale:  # (each task accepts the scales down to its own pick)
            break  # this scale was rejected on a task: smaller ones are not run
    bar.total = bar.n  # (the scales not run)
    bar.close()
    return FrictionScaleChoice(tuple(picks), tuple(runs), tolerance, kl_steps, z)
