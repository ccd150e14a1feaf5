"""Merge ``evaluate.py`` results of one benchmark run on disjoint seeds or methods into one.

    python research/scripts/merge_eval_seeds.py runs/eval/mnist_nt_seed0 runs/eval/mnist_nt_seed1 \
        runs/eval/mnist_nt_seed2 --out runs/eval/mnist_nt [--name mnist_nt]

On a shared CPU one process per seed (``seeds=[s] name=<name>_seed<s>``) or per group of
methods (``methods.<m>.enabled=false`` for the others) finishes sooner than one process for
everything; the tuning is identical in every part (it uses ``tune.seed``), and
this script checks that, concatenates the per-seed runs and writes ``results.json``,
``summary.csv``, ``curves.csv``, ``tuning.csv``, ``table.md``, the learning-curve plots and
``config.yaml`` into ``--out`` as ``evaluate.py`` would have (entropy-CDF and calibration plots
stay empty: ``results.json`` does not store per-example entropies).

Exit status: 0 on success, 2 on missing files or parts that do not belong together.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from metasampler.benchmark import merge_seed_results, write_results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("parts", nargs="+", type=Path, help="evaluate.py result directories")
    parser.add_argument("--out", required=True, type=Path, help="directory of the merged result")
    parser.add_argument("--name", default=None, help="benchmark name (default: the first part's)")
    args = parser.parse_args(argv)
    try:
        summaries = [json.loads((p / "results.json").read_text()) for p in args.parts]
        result = merge_seed_results(summaries)
    except FileNotFoundError as err:
        print(f"error: {err} (run evaluate.py first)", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.name:
        result.summary["name"] = result.summary["config"]["name"] = args.name
    import yaml

    write_results(result, args.out, yaml.safe_dump(result.summary["config"], sort_keys=False))
    print((args.out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
