"""Constant-coefficient complete-recipe samplers on the 20-D toy test protocol (SPEC §5).

    python research/scripts/toy_constant_sweep.py --q 1.5 2 2.5 3 3.5 4 5 --d 0.5 1 1.5 2 3 4

A complete-recipe step with constant ``Q_f = Q`` and ``D_f = D`` at step ``eta`` is SGHMC with
step ``eta * Q`` and friction ``D / Q`` (substitute into the modified Euler update), so this
maps the KL / ESS that state-independent coefficients reach: what learned nets must beat
(research/NOTEBOOK.md, issue #11). Prints one line per ``(Q, D)``: KL@1k, KL@12k, ESS.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from metasampler.cli import positive_int  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--q", type=float, nargs="+", default=[2.0, 3.0, 4.0])
    parser.add_argument("--d", type=float, nargs="+", default=[1.0, 2.0, 3.0])
    parser.add_argument("--eta", type=float, default=0.025)
    parser.add_argument("--n-steps", type=positive_int, default=12_000)
    parser.add_argument("--seed", type=int, default=0, help="seed of the test chains")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from metasampler.benchmark import gaussian_benchmark
    from metasampler.samplers import SGHMC
    from tasks.toy import paper_test_gaussian

    task = paper_test_gaussian()
    kl_at = sorted({min(1000, args.n_steps), args.n_steps})
    print(f"| Q | D | kl@{kl_at[0]} | kl@{kl_at[-1]} | ess |\n|---|---|---|---|---|")
    for q, d in itertools.product(args.q, args.d):
        sampler = SGHMC(eta=args.eta * q, friction=d / q)
        r = gaussian_benchmark(
            sampler, task, n_chains=50, n_steps=args.n_steps, kl_at=kl_at, seed=args.seed
        )
        kls = [r[f"kl@{t}"] for t in kl_at]
        print(f"| {q} | {d} | {kls[0]:.4f} | {kls[-1]:.4f} | {r['ess']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
