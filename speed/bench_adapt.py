"""Step-size adaptation (``ms.sample(..., adapt=True)``) against a step-size grid, on a
target with exact moments: the paper's toy test Gaussian, or a Bayesian linear regression.

For each sampler, on ``--target toy`` (default: ``tasks.toy.paper_test_gaussian``, 20-D, mean
3, condition number about 1,300; gradient noise ``N(0, 1)``; 50 chains started in
``U([0, 6]^20)``; 12,000 steps of which the first 2,000 are burn-in) or ``--target
regression`` (``tasks.linear_regression``: an ``nn.Linear(3, 1)`` through
``ms.BayesianModel``, 500 examples in minibatches of 50, posterior standard deviations 0.007
to 0.07; 16 chains from the module's initialisation; 3,000 steps of which 1,000 are burn-in):

* the grid: one run per step, ``ref * 2**(j/2)`` for ``j = -6 ... 4`` around a reference
  step, scored by the KL of the Gaussian fitted to the kept samples (steps 2,001-12,000) to
  the target (:func:`metasampler.diagnostics.gaussian_kl`); the grid-best step and its KL;
* the adapted run from the reference step (``adapt=True``: the chains alone, no target
  moments): the step it chose, the KL of its kept samples, its wall time against one plain
  run at the chosen step (same budget, same seed);
* the adapted runs from starts 100x too large and 100x too small: the steps they chose, and
  the largest ratio between the three choices. Wall times: the faster of two runs each.

SGLD, pSGLD, SGHMC (friction 1 on the toy, 30 on the regression), mSGNHT (splitting),
cSGHMC (4 cycles) and the shipped ``toy_gaussian`` NNSGHMC (and, on the regression, the
shipped ``feedforward`` one). One seed (``--seed``); ``--quick`` runs a quarter of the steps
and a five-point grid (a smoke run). Prints a markdown table (``--out FILE`` also writes it).

Usage, from the repository root::

    .venv/bin/python -m speed.bench_adapt                       # about 15 minutes on one core
    .venv/bin/python -m speed.bench_adapt --target regression   # about 10 minutes
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
from dataclasses import dataclass
from pathlib import Path

import torch

import metasampler as ms
from tasks.linear_regression import linear_regression
from tasks.toy import paper_test_gaussian

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

#: the same samplers on the regression, SGHMC and cSGHMC at a friction for its stiffness
REGRESSION_SAMPLERS: dict[str, tuple[Callable[[float, int], ms.samplers.Sampler], float]] = {
    "SGLD": (SAMPLERS["SGLD"][0], 1e-5),
    "pSGLD": (SAMPLERS["pSGLD"][0], 1e-5),
    "SGHMC": (lambda eta, n: ms.samplers.SGHMC(eta=eta, friction=30.0), 5e-4),
    "mSGNHT": (SAMPLERS["mSGNHT"][0], 4e-3),
    "cSGHMC": (
        lambda eta, n: ms.samplers.cyclical_sghmc(
            eta=eta, friction=30.0, total_steps=n, n_cycles=4
        ),
        1e-3,
    ),
    "NNSGHMC (toy_gaussian)": (SAMPLERS["NNSGHMC (toy_gaussian)"][0], 5e-4),
    "NNSGHMC (feedforward)": (
        lambda eta, n: _eager(ms.load_sampler("feedforward", eta=eta)),
        1e-3,
    ),
}


@dataclass(frozen=True)
class _Target:
    """A benchmark target: what runs, how long, and its exact moments."""

    description: str
    target: ms.targets.Target
    init: Callable[[torch.Generator], torch.Tensor] | None
    mean: torch.Tensor
    cov: torch.Tensor
    n_chains: int
    n_steps: int
    burn_in: int
    samplers: dict


def _toy(quick: bool) -> _Target:
    task = paper_test_gaussian(seed=0)
    n_chains = 50

    def init(generator: torch.Generator) -> torch.Tensor:
        return 6.0 * torch.rand((n_chains, task.dim), generator=generator)

    n_steps, burn_in = (3000, 500) if quick else (12_000, 2000)
    return _Target(
        f"Toy test Gaussian (20-D, gradient noise N(0, {GRAD_NOISE_STD:g}))",
        task.target(grad_noise_std=GRAD_NOISE_STD), init, task.mean, task.cov, n_chains,
        n_steps, burn_in, SAMPLERS,
    )  # fmt: skip


def _regression(quick: bool) -> _Target:
    task = linear_regression()
    n_steps, burn_in = (1500, 500) if quick else (3000, 1000)
    return _Target(
        "Bayesian linear regression (nn.Linear(3, 1), 500 examples, minibatch 50)",
        task.model, None, task.mean, task.cov, 16, n_steps, burn_in, REGRESSION_SAMPLERS,
    )  # fmt: skip


def _eager(sampler: ms.NNSGHMC) -> ms.NNSGHMC:
    """The loaded sampler with eager steps (no compiled step built in the background: its
    timing would depend on when the build lands)."""
    sampler.use_compile = False
    return sampler


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("toy", "regression"), default="toy")
    parser.add_argument("--quick", action="store_true", help="a quarter of the steps, 5-point grid")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, help="sampler names to run")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print (and optionally write) its markdown table."""
    args = _parse_args(argv)
    torch.set_num_threads(args.threads)
    bench = (_toy if args.target == "toy" else _regression)(args.quick)
    n_steps, burn_in, samplers = bench.n_steps, bench.burn_in, bench.samplers
    grid_exponents = range(-4, 3, 2) if args.quick else range(-6, 5)

    def run(name: str, eta: float, adapt: bool) -> tuple[ms.SampleResult | None, float]:
        make, _ = samplers[name]
        start = time.perf_counter()
        try:
            result = ms.sample(
                make(eta, n_steps), bench.target, bench.n_chains, n_steps, init=bench.init,
                burn_in=burn_in, seed=args.seed, progress=False, adapt=adapt,
            )  # fmt: skip
        except ms.NonFiniteError:
            return None, time.perf_counter() - start
        return result, time.perf_counter() - start

    def kl(result: ms.SampleResult | None) -> float:
        if result is None:
            return math.inf
        return ms.diagnostics.gaussian_kl(result.theta.double(), bench.mean, bench.cov)

    rows = []
    names = [n for n in samplers if args.only is None or n in args.only]
    for name in names:
        ref = samplers[name][1]
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
    table = _table(rows, bench, args, argv)
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


def _table(rows: list[dict], bench: _Target, args, argv) -> str:
    command = "python -m speed.bench_adapt " + shlex.join(
        argv if argv is not None else sys.argv[1:]
    )
    lines = [
        f"{bench.description}, {bench.n_chains} chains, {bench.n_steps} steps, "
        f"burn-in {bench.burn_in}; KL of the kept samples' Gaussian fit; seed {args.seed}; "
        f"{args.threads} thread(s); torch {torch.__version__}, {platform.processor() or '?'}, "
        f"{os.cpu_count()} cores; `{command.strip()}`.",
        "",
        _HEADER,
        *(_row(r) for r in rows),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
