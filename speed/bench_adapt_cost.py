"""What adaptation costs on a network: the adapted run's wall time against one plain run at
the step (and friction) it chose, for every sampler of a benchmark task.

For each sampler of the task's ``evaluate.py`` config (default: MNIST NT at the benchmark
suite's budget, 8 chains x 400 steps with a 150-step burn-in), from the middle of its step
grid as ``tune.mode: adapt`` starts: ``ms.sample(..., adapt=ms.Adapt(validation=...))`` on
the validation split, then a plain run of the chosen kernel at the same budget and seed. The
two are timed alternately, twice each, and the faster of each kept (the machine may be
shared). A grid costs one tuning run per value (4 to 17 per method in the benchmark) before
its final run.

Usage, from the repository root::

    .venv/bin/python -m speed.bench_adapt_cost            # about 5 minutes on one core
    .venv/bin/python -m speed.bench_adapt_cost --methods sgld sghmc
    .venv/bin/python -m speed.bench_adapt_cost --extra-cost 0.4   # a tighter budget
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch
from omegaconf import OmegaConf

import metasampler as ms
from experiments.benchmark_config import load_benchmark_config
from metasampler.benchmark.methods import METHODS
from metasampler.benchmark.protocol import MethodFactory
from speed._common import markdown_table, provenance
from tasks.registry import build_problem

#: The benchmark suite's budget for the MNIST tasks (configs/suite.yaml).
SUITE_BUDGET = [
    "budget.n_chains=8",
    "budget.n_steps=400",
    "budget.burn_in=150",
    "tune.max_val=1000",
]


def network_bench(
    argv: list[str] | None, doc: str
) -> tuple[argparse.Namespace, Any, Any, tuple, list[str]]:
    """What the adaptation benchmarks on a benchmark network share: their options (``doc``:
    the script's docstring, whose first paragraph describes it), the task's config at the
    suite's budget, its problem, the held-out data the criterion scores and the sampler keys
    to run."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--config", default="configs/eval/mnist_nt.yaml")
    parser.add_argument("--methods", nargs="*", default=None, help="method keys (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--extra-cost", type=float, default=ms.Adapt.extra_cost, help="Adapt(extra_cost=...)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = load_benchmark_config(args.config, SUITE_BUDGET)
    problem = build_problem(cfg.task, seed=cfg.task.seed, device="cpu")
    data = problem.data
    validation = (data.x_val[: cfg.tune.max_val], data.y_val[: cfg.tune.max_val])
    keys = [k for k in METHODS if METHODS[k].is_sampler and cfg.methods[k].enabled]
    keys = [k for k in keys if args.methods is None or k in args.methods]
    return args, cfg, problem, validation, keys


def _factory(cfg, key: str, problem) -> tuple[MethodFactory, float | None]:
    """The method as ``tune.mode: adapt`` starts it, and its start step (``lr``)."""
    section = OmegaConf.to_container(cfg.methods[key], resolve=True)
    start, options = METHODS[key].adapt_start(section)
    for option, value in options.items():
        section[option], section[f"{option}_grid"] = value, []
    make = MethodFactory(
        key, section, problem.target.n_data, cfg.budget.warmup_steps,
        cfg.budget.warmup_lr_factor, cfg.sampler_path, "cpu",
    )  # fmt: skip
    return make, start


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its markdown table."""
    args, cfg, problem, validation, keys = network_bench(argv, __doc__)
    budget = cfg.budget
    rows = []
    for key in keys:
        make, start = _factory(cfg, key, problem)

        def run(sampler: ms.samplers.Sampler, adapt: ms.Adapt | bool) -> tuple[float, object]:
            begin = time.perf_counter()
            result = ms.sample(
                sampler, problem.target, budget.n_chains, budget.n_steps,
                burn_in=budget.burn_in, init=lambda g: problem.init(budget.n_chains, g),
                seed=args.seed, progress=False, adapt=adapt,
            )  # fmt: skip
            return time.perf_counter() - begin, result

        adapt = ms.Adapt(validation=validation, extra_cost=args.extra_cost)
        adapted_s, result = run(make(start, budget.n_steps), adapt)
        chosen = result.adapted.sampler
        plain_s, _ = run(chosen, False)
        adapted_s = min(adapted_s, run(make(start, budget.n_steps), adapt)[0])
        plain_s = min(plain_s, run(chosen, False)[0])
        row = (
            f"| {METHODS[key].label} | {result.adapted.eta:.4g} | {adapted_s:.1f} s | "
            f"{plain_s:.1f} s | {adapted_s / plain_s:.2f} |"
        )
        print(row, flush=True)
        rows.append(row)
    print(
        f"\n{problem.name}; {budget.n_chains} chains x {budget.n_steps} steps, burn-in "
        f"{budget.burn_in}; extra_cost {args.extra_cost}; seed {args.seed}; "
        f"{provenance('speed.bench_adapt_cost', argv, args.threads)}\n\n"
        + markdown_table(
            ["sampler", "adapted eta", "adapted run", "plain run at that kernel", "ratio"], rows
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
