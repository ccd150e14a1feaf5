"""What a benchmark produces: :class:`BenchmarkResult`, the per-seed statistics of its final
metrics, and :func:`merge_seed_results` (one result from runs on disjoint seeds or methods)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .methods import FRICTION
from .metrics import mean_se
from .run import MethodRun

__all__ = ["FINAL_METRICS", "BenchmarkResult", "merge_seed_results", "seed_statistics"]

#: The final metrics aggregated over seeds (mean ± standard error) in the results.
FINAL_METRICS = (
    "average_error",
    "average_nll",
    "average_ece",
    "ensemble_error",
    "ensemble_nll",
    "ensemble_ece",
    "average_entropy",
    "ood_entropy",
    "temperature",
    "seconds_per_step",
)


@dataclass
class BenchmarkResult:
    """Everything :func:`~metasampler.benchmark.publish.write_results` writes.

    Attributes:
        summary: the JSON document (config, budget, chosen step sizes, per-seed and
            aggregated final metrics, learning curves).
        runs: ``{method: {seed: MethodRun}}``.
    """

    summary: dict[str, Any]
    runs: dict[str, dict[int, MethodRun]]


def seed_statistics(
    finals: Sequence[Mapping[str, float]], per_seed: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """A method entry's ``summary`` (mean ± standard error of :data:`FINAL_METRICS` over
    the seeds' ``finals``) and ``n_diverged`` (runs of ``per_seed`` with a ``diverged_at``)."""
    return {
        "summary": {m: mean_se(f.get(m, math.nan) for f in finals) for m in FINAL_METRICS},
        "n_diverged": sum(r["diverged_at"] is not None for r in per_seed),
    }


def _nan_for_none(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: math.nan if v is None else v for k, v in row.items()}


def merge_seed_results(summaries: Sequence[Mapping[str, Any]]) -> BenchmarkResult:
    """One result from ``results.json`` documents of the same benchmark run as parts, as if
    all had run in one process: parts on disjoint seeds (e.g. one process per seed on a shared
    CPU), parts on disjoint methods (one process per group of methods), or both.

    A method that several parts ran must have been tuned to the same value in each (tuning
    uses ``tune.seed``, not the evaluation seeds, so identical configs give identical
    choices) and on disjoint seeds; its per-seed runs are concatenated in seed order and the
    mean ± standard error recomputed. Every method must end up with the same seeds. The
    returned :class:`BenchmarkResult` carries the learning curves (no entropies or
    calibration bins, which ``results.json`` does not store).

    Raises:
        ValueError: fewer than two parts, a method run twice on a seed, a method tuned
            differently in two parts, or methods that end up with different seeds.
    """
    if len(summaries) < 2:
        raise ValueError("merging needs at least two results.json documents")
    merged = json.loads(json.dumps(summaries[0]))  # a deep copy
    merged["methods"], runs, seeds_of = {}, {}, {}
    for key in dict.fromkeys(k for part in summaries for k in part["methods"]):
        holders = [part for part in summaries if key in part["methods"]]
        parts = [part["methods"][key] for part in holders]
        chosen = {(p.get("lr"), p.get(FRICTION), p.get("error")) for p in parts}
        if len(chosen) != 1:
            raise ValueError(f"method {key!r} was tuned differently in the parts: {chosen}")
        seeds = [int(s) for part in holders for s in part["seeds"]]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"method {key!r}: the parts repeat seeds {sorted(seeds)}")
        seeds_of[key] = sorted(seeds)
        entry = json.loads(json.dumps(parts[0]))
        merged["methods"][key] = entry
        # (an adapted row, ``<method>_adapted`` with ``tune.mode: both``, has its method's section)
        section = key if key in holders[0]["config"]["methods"] else key.removesuffix("_adapted")
        merged["config"]["methods"][section] = holders[0]["config"]["methods"][section]
        if entry.get("error"):
            continue
        per_seed = sorted((r for p in parts for r in p["runs"]), key=lambda r: r["seed"])
        entry["runs"] = per_seed
        finals = [_nan_for_none(r["final"]) for r in per_seed]
        entry.update(seed_statistics(finals, per_seed))
        runs[key] = {
            int(r["seed"]): MethodRun(
                [_nan_for_none(row) for row in r["curves"]],
                finals[i],
                {},
                None,
                r["diverged_at"],
                r["message"],
            )
            for i, r in enumerate(per_seed)
        }
    if len({tuple(s) for s in seeds_of.values()}) != 1:
        raise ValueError(f"the methods end up with different seeds: {seeds_of}")
    merged["seeds"] = merged["config"]["seeds"] = next(iter(seeds_of.values()))
    return BenchmarkResult(merged, runs)
