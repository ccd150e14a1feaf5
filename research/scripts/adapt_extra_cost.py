"""The suite's adapted rows on an MNIST task at another ``Adapt(extra_cost=...)``: the
benchmark builds ``Adapt(validation=...)`` with the default, so this patches that default and
runs ``evaluate.py`` at the suite's MNIST budget with ``tune.mode=adapt`` (every sampler, three
seeds; the optimisers off).

Usage, from the repository root (about 3-4 minutes a task on one core)::

    PYTHONPATH=. .venv/bin/python research/scripts/adapt_extra_cost.py 0.5 mnist_nt [OUT_DIR]
"""

import functools
import sys

import metasampler.benchmark.transfer as transfer

extra, task = float(sys.argv[1]), sys.argv[2]
out_dir = sys.argv[3] if len(sys.argv) > 3 else "runs/extra_cost"
transfer.Adapt = functools.partial(transfer.Adapt, extra_cost=extra)

import evaluate  # noqa: E402  (after the patch)

BUDGET = [
    "budget.n_chains=8", "budget.n_steps=400", "budget.burn_in=150", "budget.thin=10",
    "budget.eval_every=100", "tune.n_chains=4", "tune.n_steps=200", "tune.burn_in=75",
    "tune.thin=10", "ood_max=1000", "tune.mode=adapt", "seeds=[0,1,2]", "threads=1",
]  # fmt: skip
sys.exit(
    evaluate.main(
        [
            "--config",
            f"configs/eval/{task}.yaml",
            *BUDGET,
            f"name=extra_cost{extra}_{task}",
            f"out_dir={out_dir}",
            "methods.sgdm.enabled=false",
            "methods.adam.enabled=false",
        ]
    )  # fmt: skip
)
