"""What variance a method of an ``evaluate.py`` config gives a coordinate that only the prior sees.

    python research/scripts/prior_only_variance.py --config configs/eval/mnist_nt_af.yaml \
        --method csghmc --lr 0.1 methods.csghmc.momentum_decay=0.00333333 [key=value ...]

A weight that no training example reaches (a first-layer weight on a pixel that is blank in
every training digit) has the prior as its posterior, ``N(0, s^2)``: its energy is
``theta^2 / (2 s^2)`` and its stochastic gradient is exact. This runs the method (its options,
warm-up and schedule as the protocol builds them for the config's ``N``) on ``--dim``
independent such coordinates with ``s = 1`` in each of the config's chains (so that a
preconditioner pooled over the chains, as NNSGHMC's is, averages what it would in the network),
from zero, and prints the mean of ``theta^2`` (the variance it samples; 1 is right) over the
sampling stages after the first ``--skip`` steps and at the end of each of ``--segments`` equal
segments of the run (the cycles of a cyclical schedule).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from one_method import load_from_args, method_parser  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = method_parser(__doc__)
    parser.add_argument("--steps", type=int, default=None, help="default: the config's")
    parser.add_argument("--dim", type=int, default=5000, help="coordinates per chain")
    parser.add_argument("--chains", type=int, default=None, help="default: the config's")
    parser.add_argument("--skip", type=int, default=None, help="default: the first segment")
    parser.add_argument("--segments", type=int, default=None, help="default: n_cycles or 4")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    return parser.parse_intermixed_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from metasampler.benchmark.prior_check import prior_only_variances, sampled_variance

    run = load_from_args(args)
    if run is None:
        return 2
    cfg, n_data = run.cfg, run.problem.target.n_data
    steps = args.steps or cfg.budget.n_steps
    chains = args.chains or cfg.budget.n_chains
    segments = args.segments or int(run.factory.options.get("n_cycles", 4))
    length = max(1, steps // segments)
    skip = length if args.skip is None else args.skip
    rows = prior_only_variances(
        lambda: run.factory(args.lr, steps), n_data, chains, steps, args.dim, args.seed
    )
    ends = [r.variance for r in rows if r.step % length == 0]
    print(f"{args.method} at lr {args.lr} ({' '.join(args.overrides) or 'config options'}), "
          f"N = {n_data}, {chains} chains x {args.dim}, {steps} steps: variance over the "
          f"sampling stages after step {skip} {sampled_variance(rows, skip, steps):.3f} "
          f"(target 1); at the end of each of {segments} segments "
          + ", ".join(f"{v:.3f}" for v in ends))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
