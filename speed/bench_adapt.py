"""Step-size adaptation (``ms.sample(..., adapt=True)``) against a step-size grid, on the
paper's toy test Gaussian.

For each sampler, on ``tasks.toy.paper_test_gaussian`` (20-D, mean 3, condition number
about 1,300; gradient noise ``N(0, 1)``; 50 chains started in ``U([0, 6]^20)``; 12,000 steps
of which the first 2,000 are burn-in):

* the grid: one run per step, ``ref * 2**(j/2)`` for ``j = -6 ... 4`` around a reference
  step (NNSGHMC, whose eager steps cost ten times more: ``ref * 2**j``, ``j = -2 ... 2``),
  scored by the KL of the Gaussian fitted to the kept samples (steps 2,001-12,000) to
  the target (:func:`metasampler.diagnostics.gaussian_kl`); the grid-best step and its KL;
* the adapted run from the reference step (``adapt=True``: the chains alone, no target
  moments): the step it chose, the KL of its kept samples, its wall time against one plain
  run at the chosen step (same budget, same seed);
* the adapted runs from starts 100x too large and 100x too small: the steps they chose, and
  the largest ratio between the three choices. Wall times: the faster of two runs each.

SGLD, pSGLD, SGHMC (friction 1), mSGNHT (splitting), cSGHMC (4 cycles) and the shipped
``toy_gaussian`` NNSGHMC. One seed (``--seed``); ``--quick`` runs 3,000 steps and a
five-point grid (a smoke run). Prints a markdown table (``--out FILE`` also writes it).

Usage, from the repository root::

    .venv/bin/python -m speed.bench_adapt            # about 7 minutes on one core
    .venv/bin/python -m speed.bench_adapt --quick
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import metasampler as ms
from tasks.toy import paper_test_gaussian

K = 50
GRAD_NOISE_STD = 1.0

#: name -> (sampler at step eta, reference step): the references are near each sampler's
#: good step, so that the grid around them brackets its optimum.
SAMPLERS: dict[str, tuple[Callable[[float, int], ms.samplers.Sampler], float]] = {
    "SGLD": (lambda eta, n: ms.samplers.SGLD(eta=eta), 0.01),
    "pSGLD": (lambda eta, n: ms.samplers.PSGLD(eta=eta), 0.04),
    "SGHMC": (lambda eta, n: ms.samplers.SGHMC(eta=eta, friction=1.0), 0.07),
    "mSGNHT": (lambda eta, n: ms.samplers.SGNHT(eta=eta, multivariate=True), 0.1),
    "cSGHMC": (
        lambda eta, n: ms.samplers.cyclical_sghmc(eta=eta, total_steps=n, n_cycles=4),
        0.1,
    ),
    "NNSGHMC (toy_gaussian)": (
        lambda eta, n: _eager(ms.load_sampler("toy_gaussian", eta=eta)),
        0.0175,
    ),
}


def _eager(sampler: ms.NNSGHMC) -> ms.NNSGHMC:
    """The loaded sampler with eager steps (no compiled step built in the background: its
    timing would depend on when the build lands)."""
    sampler.use_compile = False
    return sampler


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3,000 steps, a 5-point grid")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, help="sampler names to run")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print (and optionally write) its markdown table."""
    args = _parse_args(argv)
    torch.set_num_threads(args.threads)
    n_steps, burn_in = (3000, 500) if args.quick else (12_000, 2000)
    grid_exponents = range(-4, 3, 2) if args.quick else range(-6, 5)
    task = paper_test_gaussian(seed=0)
    target = task.target(grad_noise_std=GRAD_NOISE_STD)

    def init(generator: torch.Generator) -> torch.Tensor:
        return 6.0 * torch.rand((K, task.dim), generator=generator)

    def run(name: str, eta: float, adapt: bool) -> tuple[ms.SampleResult | None, float]:
        make, _ = SAMPLERS[name]
        start = time.perf_counter()
        try:
            result = ms.sample(
                make(eta, n_steps), target, K, n_steps, init=init, burn_in=burn_in,
                seed=args.seed, progress=False, adapt=adapt,
            )  # fmt: skip
        except ms.NonFiniteError:
            return None, time.perf_counter() - start
        return result, time.perf_counter() - start

    def kl(result: ms.SampleResult | None) -> float:
        if result is None:
            return math.inf
        return ms.diagnostics.gaussian_kl(result.theta.double(), task.mean, task.cov)

    rows = []
    names = [n for n in SAMPLERS if args.only is None or n in args.only]
    for name in names:
        ref = SAMPLERS[name][1]
        grid = {
            ref * 2 ** (j / 2): kl(run(name, ref * 2 ** (j / 2), False)[0]) for j in grid_exponents
        }
        best = min(grid, key=grid.get)
        adapted, adapted_seconds = run(name, ref, True)
        if adapted is None:  # the kept run diverged at the chosen step
            print(f"| {name} | {best:.4g} | {grid[best]:.4f} | diverged |", flush=True)
            continue
        chosen = adapted.adapted
        plain, plain_seconds = run(name, chosen.eta, False)
        # timed twice each, alternating, the faster kept (the machine may be shared)
        adapted_seconds = min(adapted_seconds, run(name, ref, True)[1])
        plain_seconds = min(plain_seconds, run(name, chosen.eta, False)[1])
        large = _chosen(run(name, ref * 100, True)[0])
        small = _chosen(run(name, ref / 100, True)[0])
        choices = [chosen.eta, large, small]
        row = {
            "sampler": name,
            "grid_best": best,
            "grid_kl": grid[best],
            "grid_edge": best in (min(grid), max(grid)),
            "adapted": chosen.eta,
            "friction": chosen.friction,
            "adapted_kl": kl(adapted),
            "plain_kl": kl(plain),
            "adapted_s": adapted_seconds,
            "plain_s": plain_seconds,
            "large": large,
            "small": small,
            "spread": max(choices) / min(choices),
        }
        rows.append(row)
        print(_row(row), flush=True)
    table = _table(rows, n_steps, burn_in, args, argv)
    print(table)
    if args.out is not None:
        args.out.write_text(table)
    return 0


def _chosen(result: ms.SampleResult | None) -> float:
    """The adapted step (``nan`` where the kept run diverged)."""
    return math.nan if result is None else result.adapted.eta


_HEADER = (
    "| sampler | grid-best eta | KL (grid-best) | adapted eta (friction) | KL (adapted) | "
    "adapted / grid-best eta | wall adapted / plain | eta from 100x start | "
    "eta from 1/100x start | max ratio of the 3 choices |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def _row(r: dict) -> str:
    friction = "" if r["friction"] is None else f" ({r['friction']:.3g})"
    edge = " (grid edge)" if r["grid_edge"] else ""
    return (
        f"| {r['sampler']} | {r['grid_best']:.4g}{edge} | {r['grid_kl']:.4f} | "
        f"{r['adapted']:.4g}{friction} | {r['adapted_kl']:.4f} | "
        f"{r['adapted'] / r['grid_best']:.2f} | "
        f"{r['adapted_s']:.1f} s / {r['plain_s']:.1f} s = {r['adapted_s'] / r['plain_s']:.2f} | "
        f"{r['large']:.4g} | {r['small']:.4g} | {r['spread']:.2f} |"
    )


def _table(rows: list[dict], n_steps: int, burn_in: int, args, argv) -> str:
    command = "python -m speed.bench_adapt " + shlex.join(
        argv if argv is not None else sys.argv[1:]
    )
    lines = [
        f"Toy test Gaussian (20-D, gradient noise N(0, 1)), {K} chains, {n_steps} steps, "
        f"burn-in {burn_in}; KL of the kept samples' Gaussian fit; seed {args.seed}; "
        f"{args.threads} thread(s); torch {torch.__version__}, {platform.processor() or '?'}, "
        f"{os.cpu_count()} cores; `{command.strip()}`.",
        "",
        _HEADER,
        *(_row(r) for r in rows),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
