"""Paired differences between two methods over the evaluation seeds they share.

    python research/scripts/paired_differences.py \
        --a runs/eval/run1:nnsghmc runs/eval/run1_seeds3to8:nnsghmc \
        --b runs/eval/baselines_seeds0to3:csghmc runs/eval/baselines_seeds4to8:csghmc

Each side is one or more ``DIRECTORY:METHOD`` parts (``results.json`` of ``evaluate.py``;
``METHOD`` is the key in its ``methods``, e.g. ``nnsghmc``, ``csghmc``). A side's parts are
merged as ``research/scripts/merge_eval_seeds.py`` merges them: one method, disjoint seeds, the same
tuned values. Seeds that both sides ran are paired, and the table gives each side's mean ±
standard error over those seeds and the mean ± standard error of the per-seed differences
``A - B`` (a metric a run does not have, e.g. after divergence, is left out of its cell). Two
methods run on the same seeds share the data split, the minibatch order's seed and the initial
weights' seed, so the paired standard error is usually well below the unpaired one; a run's
trajectory is chaotic, though, so pairing removes only that shared part (research/NOTEBOOK.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from metasampler.benchmark import format_mean_se, mean_se, merge_seed_results

#: Final metrics in the table: (key in a run's ``final``, column title, scale, digits).
METRICS = (
    ("average_error", "avg err %", 100.0, 2),
    ("average_nll", "avg NLL", 1.0, 4),
    ("ensemble_error", "ens err %", 100.0, 2),
    ("ensemble_nll", "ens NLL", 1.0, 4),
    ("temperature", "temp", 1.0, 2),
)


class PairingError(ValueError):
    """The two sides cannot be paired (a part is missing, parts that do not merge, no seed in
    common)."""


def _method_only(part: str) -> tuple[str, dict]:
    """``(method, the part's results.json with only that method)`` of ``DIRECTORY:METHOD``."""
    directory, sep, method = part.rpartition(":")
    if not sep or not directory or not method:
        raise PairingError(f"{part!r}: expected DIRECTORY:METHOD")
    path = Path(directory) / "results.json"
    if not path.is_file():
        raise PairingError(f"{path} not found (run evaluate.py first)")
    summary = json.loads(path.read_text())
    if method not in summary["methods"]:
        raise PairingError(f"{path} has no method {method!r}")
    return method, {**summary, "methods": {method: summary["methods"][method]}}


def load_side(parts: list[str]) -> tuple[str, dict[int, dict[str, float]]]:
    """``(label, {seed: final metrics})`` of one side's ``DIRECTORY:METHOD`` parts, merged by
    :func:`metasampler.benchmark.merge_seed_results` (one method, disjoint seeds, the same
    tuned values in every part)."""
    loaded = [_method_only(part) for part in parts]
    methods = {method for method, _ in loaded}
    if len(methods) != 1:
        raise PairingError(f"one side's parts name different methods: {sorted(methods)}")
    (method,) = methods
    summaries = [summary for _, summary in loaded]
    if len(summaries) > 1:
        try:
            summaries = [merge_seed_results(summaries).summary]
        except ValueError as err:
            raise PairingError(f"{' '.join(parts)}: {err}") from err
    entry = summaries[0]["methods"][method]
    return entry.get("label", method), {int(r["seed"]): r["final"] for r in entry["runs"]}


def _cell(values: list[float | None], scale: float, digits: int) -> str:
    return format_mean_se(mean_se(values), scale, digits)


def paired_table(a_parts: list[str], b_parts: list[str]) -> str:
    """The markdown table of both sides and their paired differences over the shared seeds."""
    a_label, a = load_side(a_parts)
    b_label, b = load_side(b_parts)
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise PairingError(f"no seed in common: A has {sorted(a)}, B has {sorted(b)}")
    lines = [
        f"Seeds {seeds} ({len(seeds)} paired).",
        "",
        "| | " + " | ".join(title for _, title, _, _ in METRICS) + " |",
        "|---|" + "---:|" * len(METRICS),
    ]
    rows = {
        f"A: {a_label}": [[a[s].get(k) for s in seeds] for k, *_ in METRICS],
        f"B: {b_label}": [[b[s].get(k) for s in seeds] for k, *_ in METRICS],
        "A - B (paired)": [
            [_difference(a[s].get(k), b[s].get(k)) for s in seeds] for k, *_ in METRICS
        ],
    }
    for name, columns in rows.items():
        cells = [
            _cell(v, scale, digits)
            for v, (_, _, scale, digits) in zip(columns, METRICS, strict=True)
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _difference(x: float | None, y: float | None) -> float | None:
    return None if x is None or y is None else x - y


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", nargs="+", required=True, metavar="DIRECTORY:METHOD")
    parser.add_argument("--b", nargs="+", required=True, metavar="DIRECTORY:METHOD")
    args = parser.parse_args(argv)
    try:
        print(paired_table(args.a, args.b))
    except (PairingError, KeyError, json.JSONDecodeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
