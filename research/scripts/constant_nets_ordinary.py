"""Do the learned nets beat their constant means on ordinary models? The shipped NNSGHMC
samplers (``feedforward``, ``toy_gaussian``) against the same samplers with constant nets
(``with_constant_nets``, the suite's ablation) on two models with a known posterior:

* ``tasks.logistic_regression`` (reference: full-data HMC), 8 chains x 1,500 steps, burn-in
  500;
* ``tasks.linear_regression`` (exact posterior), 16 chains x 3,000 steps, burn-in 1,000.

For each: adapted from the chains alone (``adapt=True``) at seeds 0-2 (the chosen step and
the KL of the kept samples' Gaussian fit), and the best KL of a factor-2 step grid at each of
seeds 0-2.

Usage, from the repository root::

    PYTHONPATH=. .venv/bin/python research/scripts/constant_nets_ordinary.py [logistic|linear]
"""

from __future__ import annotations

import sys
import warnings

import torch

import metasampler as ms
from metasampler.learned.ablation import stored_net_means, with_constant_nets
from tasks.linear_regression import linear_regression
from tasks.logistic_regression import logistic_regression

GRID = [2.0**j for j in range(-14, -1)]


def _kl(
    problem: tuple, sampler: ms.samplers.Sampler, seed: int, adapt: bool
) -> tuple[float, float]:
    """The step and the KL of the kept samples' Gaussian fit (``inf`` where it diverged)."""
    _, model, mean, cov, chains, steps, burn_in = problem
    try:
        result = ms.sample(
            sampler, model, chains, steps, burn_in=burn_in, seed=seed, progress=False,
            adapt=adapt,
        )  # fmt: skip
    except ms.NonFiniteError:
        return float("nan"), float("inf")
    eta = result.adapted.eta if adapt else sampler.eta
    return eta, ms.diagnostics.gaussian_kl(result.theta.double(), mean, cov)


def _by_kl(run: tuple[float, float]) -> float:
    return run[1]


def main(which: list[str]) -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    logistic = logistic_regression()
    linear = linear_regression()
    problems = [
        ("logistic", logistic.model, *logistic.moments(logistic.reference()), 8, 1500, 500),
        ("linear", linear.model, linear.mean, linear.cov, 16, 3000, 1000),
    ]
    problems = [p for p in problems if not which or p[0] in which]
    kinds = {
        "learned": lambda name, **kw: ms.load_sampler(name, **kw),
        "constant": lambda name, **kw: with_constant_nets(
            ms.load_sampler(name, **kw), stored_net_means(name)
        ),
    }
    print(
        "| model | sampler | nets | adapted eta / KL (seeds 0-2) | grid's best eta / KL (seeds 0-2) |"
    )
    print("|---|---|---|---|---|")
    for problem in problems:
        for name in ("feedforward", "toy_gaussian"):
            for kind, make in kinds.items():
                adapted = [_kl(problem, make(name), seed, True) for seed in range(3)]
                best = [
                    min((_kl(problem, make(name, eta=e), s, False) for e in GRID), key=_by_kl)
                    for s in range(3)
                ]
                cells = ", ".join(f"{e:.3g} / {k:.3f}" for e, k in adapted)
                grid = ", ".join(f"{e:.3g} / {k:.3f}" for e, k in best)
                print(f"| {problem[0]} | {name} | {kind} | {cells} | {grid} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
