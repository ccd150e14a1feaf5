"""One markdown table across several ``evaluate.py`` result directories.

    python research/scripts/summarize_evals.py runs/eval/mnist_nt runs/eval/mnist_nt_af ... \
        [--metric average_error] [--step 50 | --from-step 1000]

Rows are methods, columns are tasks; each cell is mean ± standard error over seeds of the chosen
final metric (``average_error`` / ``average_nll`` / ``ensemble_error`` / ``ensemble_nll`` /
``average_ece`` / ``ood_entropy`` / ``seconds_per_step``), read from each ``results.json``;
with ``--step N`` the learning-curve value at step ``N`` instead (curve metrics only:
``ensemble_*`` / ``average_*`` error and NLL, ``member_nll``); with ``--from-step N`` each seed's
mean of the curve's values from step ``N`` on. The final ensemble's NLL at the last step is one
snapshot of 20 chains, which jumps between evaluations by more than samplers differ;
``--metric ensemble_nll --from-step 1000`` averages it over a run's second half, the
stationary quality of the final ensemble (standard errors about half as large on MNIST NT,
research/NOTEBOOK.md session 38). The best sampler (not optimiser) per column is in bold.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from metasampler.benchmark import format_mean_se, mean_se

PERCENT = {"average_error", "ensemble_error"}


def _cell(stat: dict | None, metric: str) -> tuple[str, float]:
    """The formatted cell and its scaled mean (``inf`` when missing, for ranking)."""
    if not stat or stat.get("mean") is None or not math.isfinite(stat["mean"]):
        return "–", math.inf
    scale = 100.0 if metric in PERCENT else (1000.0 if metric == "seconds_per_step" else 1.0)
    digits = 2 if scale != 1.0 else 3
    return format_mean_se(stat, scale, digits), stat["mean"] * scale


def _curve_stat(entry: dict, metric: str, step: int, from_step: bool = False) -> dict | None:
    """Mean ± standard error over seeds of a learning-curve value at ``step``, or
    (``from_step``) of each seed's mean of the values at ``step`` and after."""
    values = []
    for run in entry.get("runs", []):
        points = [
            float(r[metric])
            for r in run.get("curves", [])
            if (r["step"] >= step if from_step else r["step"] == step) and r.get(metric) is not None
        ]
        if points:
            values.append(sum(points) / len(points))
    return mean_se(values) if values else None


def summarize(
    directories: list[Path], metric: str, step: int | None = None, from_step: bool = False
) -> str:
    """The markdown table of ``metric`` for every method (rows) and result directory (columns),
    final values or (``step``) learning-curve values, at ``step`` or (``from_step``) averaged
    over the steps from ``step`` on."""
    results = []
    for directory in directories:
        path = directory / "results.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found (run evaluate.py first)")
        results.append(json.loads(path.read_text()))
    methods: dict[str, tuple[str, bool]] = {}
    for result in results:
        for key, entry in result["methods"].items():
            methods.setdefault(key, (entry["label"], bool(entry["is_sampler"])))
    higher_is_better = metric == "ood_entropy"
    cells: dict[str, list[str]] = {key: [] for key in methods}
    for result in results:
        column = {}
        for key in methods:
            entry = result["methods"].get(key)
            if entry is None:
                stat = None
            elif step is None:
                stat = entry["summary"].get(metric)
            else:
                stat = _curve_stat(entry, metric, step, from_step)
            column[key] = _cell(stat, metric)
        samplers = [k for k in methods if methods[k][1] and math.isfinite(column[k][1])]
        best = None
        if samplers and metric != "seconds_per_step":
            pick = max if higher_is_better else min
            best = pick(samplers, key=lambda k: column[k][1])
        for key in methods:
            text = column[key][0]
            cells[key].append(f"**{text}**" if key == best else text)
    header = "| method | " + " | ".join(r["name"] for r in results) + " |"
    lines = [header, "|---|" + "---|" * len(results)]
    for key, (label, is_sampler) in methods.items():
        name = label if is_sampler else f"{label} (optimiser)"
        lines.append(f"| {name} | " + " | ".join(cells[key]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="+", type=Path)
    parser.add_argument("--metric", default="average_error")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--step", type=int, default=None, help="learning-curve value at a step")
    where.add_argument(
        "--from-step", type=int, default=None, help="learning-curve mean from a step on, per seed"
    )
    args = parser.parse_args(argv)
    step = args.step if args.from_step is None else args.from_step
    try:
        print(summarize(args.directories, args.metric, step, from_step=args.from_step is not None))
    except (FileNotFoundError, KeyError, json.JSONDecodeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
