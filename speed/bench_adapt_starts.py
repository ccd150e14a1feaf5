"""Adaptation from starts 100x off, on a benchmark network: the step each sampler chooses in
its burn-in from its usual start (the middle of its step grid, as ``tune.mode: adapt``
starts) and from steps 100 times larger and 100 times smaller.

For each sampler of the task's ``evaluate.py`` config (default: MNIST NT at the benchmark
suite's budget, 8 chains x 400 steps with a 150-step burn-in), ranked by the validation NLL
as the benchmark ranks it: the three chosen steps, the largest ratio between them ("spread")
and the test NLL of the posterior average of each run. The search's first round spans 256
times either side of the start, so a start 100x off still has the usual choice inside it.

Usage, from the repository root::

    .venv/bin/python -m speed.bench_adapt_starts        # about 10 minutes on one core
    .venv/bin/python -m speed.bench_adapt_starts --config configs/eval/mnist_nt_af.yaml
    .venv/bin/python -m speed.bench_adapt_starts --extra-cost 0.5   # another budget
"""

from __future__ import annotations

import copy
import sys

import metasampler as ms
from metasampler.benchmark.methods import METHODS
from speed._common import markdown_table, provenance
from speed.bench_adapt_cost import _factory, network_bench

#: the start factors: the usual start, 100x too large, 100x too small
FACTORS = (1.0, 100.0, 0.01)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its markdown table."""
    args, cfg, problem, validation, keys = network_bench(argv, __doc__)
    data, budget = problem.data, cfg.budget
    adapt = ms.Adapt(validation=validation, extra_cost=args.extra_cost)
    rows = []
    for key in keys:
        make, start = _factory(cfg, key, problem)
        usual = make(start, budget.n_steps)
        chosen, nlls, start_eta = [], [], None
        for factor in FACTORS:
            sampler = copy.copy(usual)
            if start_eta is not None:  # the usual start's eta (after lr's conversion), scaled
                sampler.eta, sampler.lr = start_eta * factor, None
            result = ms.sample(
                sampler, problem.target, budget.n_chains, budget.n_steps,
                burn_in=budget.burn_in, init=lambda g: problem.init(budget.n_chains, g),
                seed=args.seed, progress=False, adapt=adapt,
            )  # fmt: skip
            start_eta = start_eta or result.adapted.start_eta
            chosen.append(result.adapted.eta)
            predictive = problem.target.predict(result.theta, data.x_test)
            nlls.append(float(predictive.nll(data.y_test)))
        spread = max(chosen) / min(chosen)
        row = (
            f"| {METHODS[key].label} | {start_eta:.4g} | "
            + " | ".join(f"{eta:.4g} ({nll:.4f})" for eta, nll in zip(chosen, nlls, strict=True))
            + f" | {spread:.2f} |"
        )
        print(row, flush=True)
        rows.append(row)
    print(
        f"\n{problem.name}; {budget.n_chains} chains x {budget.n_steps} steps, burn-in "
        f"{budget.burn_in}; validation NLL; extra_cost {args.extra_cost}; seed {args.seed}; "
        f"{provenance('speed.bench_adapt_starts', argv, args.threads)}\n\n"
        + markdown_table(
            [
                "sampler",
                "usual start eta",
                "chosen eta (test NLL) from it",
                "from 100x",
                "from 1/100x",
                "spread",
            ],
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
