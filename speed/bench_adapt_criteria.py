"""The two adaptation criteria on an ordinary model: a Bayesian logistic regression adapted by
the chains alone (``adapt=True``) and by held-out NLL (``adapt=ms.Adapt(validation=...)``).

The model (``tasks.logistic_regression``, the README's): ``nn.Linear(3, 1)`` with a Bernoulli
likelihood, prior ``N(0, 1)``, 300 training examples in minibatches of 100, 100 held-out
examples for the validation criterion and 2,000 test examples. The reference posterior is
Metropolis-corrected HMC on the full data (8 chains, 2,500 trajectories of 20 leapfrog
steps after 500). Each sampler (SGLD, pSGLD, SGHMC, mSGNHT, the shipped
``feedforward`` NNSGHMC) starts from the step a user might first try (``lr`` 0.01, pSGLD's
0.001) and runs 8 chains x 1,500 steps, burn-in 500, adapted by each criterion, at seeds
0-2. Reported: the chosen step, the KL of the kept samples' Gaussian fit to the reference's
(:func:`metasampler.diagnostics.gaussian_kl`) and the test NLL of the posterior average.

Usage, from the repository root::

    .venv/bin/python -m speed.bench_adapt_criteria        # about 3 minutes on one core
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings

import torch

import metasampler as ms
from speed._common import markdown_table, provenance
from tasks.logistic_regression import logistic_regression

#: name -> the sampler at a user's first step (``lr``, the per-batch learning rate)
SAMPLERS = {
    "SGLD": lambda: ms.samplers.SGLD(lr=0.01),
    "pSGLD": lambda: ms.samplers.PSGLD(lr=0.001),
    "SGHMC": lambda: ms.samplers.SGHMC(lr=0.01, friction=1.0),
    "mSGNHT": lambda: ms.samplers.SGNHT(lr=0.01, multivariate=True),
    "NNSGHMC (feedforward)": lambda: ms.load_sampler("feedforward"),
}
N_CHAINS, N_STEPS, BURN_IN = 8, 1500, 500


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print its markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", ms.ConvergenceWarning)
    task = logistic_regression()
    model, (x_test, y_test) = task.model, task.test
    reference = task.reference()
    mean, cov = task.moments(reference)

    def test_nll(result: ms.SampleResult) -> float:
        return float(model.predict(result.theta, x_test).nll(y_test))

    rows = [f"| HMC (the reference) | – | – | – | {test_nll(reference):.4f} |"]
    criteria = {"chains alone": True, "held-out NLL": ms.Adapt(validation=task.held_out)}
    for name, make in SAMPLERS.items():
        for criterion, adapt in criteria.items():
            runs = [
                ms.sample(
                    make(),
                    model,
                    N_CHAINS,
                    N_STEPS,
                    burn_in=BURN_IN,
                    seed=seed,
                    progress=False,
                    adapt=adapt,
                )  # fmt: skip
                for seed in args.seeds
            ]
            etas = ", ".join(f"{r.adapted.eta:.3g}" for r in runs)
            kls = [ms.diagnostics.gaussian_kl(r.theta.double(), mean, cov) for r in runs]
            nll = statistics.mean(test_nll(r) for r in runs)
            row = (
                f"| {name} | {criterion} | {etas} | {', '.join(f'{k:.3f}' for k in kls)} | "
                f"{nll:.4f} |"
            )
            print(row, flush=True)
            rows.append(row)
    print(
        f"\nBayesian logistic regression (3 inputs, 300 examples, minibatch 100), "
        f"{N_CHAINS} chains x {N_STEPS} steps, burn-in {BURN_IN}; seeds {args.seeds}; "
        f"{provenance('speed.bench_adapt_criteria', argv, args.threads)}\n\n"
        + markdown_table(
            ["sampler", "criterion", "adapted eta (per seed)", "KL to HMC (per seed)", "test NLL"],
            rows,
            numeric_from=4,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
