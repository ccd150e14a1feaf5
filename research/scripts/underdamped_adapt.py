"""SGHMC and cSGHMC at their default friction (1), adapted from the chains alone
(``adapt=True``) on two Bayesian linear regressions from the module's initialisation, where
that friction leaves the chains underdamped: the step and friction each seed chooses and the
KL of the kept samples to the exact posterior.

* ``stiff``: ``tasks.linear_regression`` with 300 examples of unit-scale inputs, prior std 10
  and minibatches of 100; 8 chains x 1,500 steps, burn-in 500; seeds 0-4;
* ``linear``: ``tasks.linear_regression`` (as ``speed.bench_adapt --target regression``);
  16 chains x 3,000 steps, burn-in 1,000; seeds 0-2.

Usage, from the repository root (about 3 minutes on one core)::

    PYTHONPATH=. .venv/bin/python research/scripts/underdamped_adapt.py
"""

from __future__ import annotations

from functools import partial

import torch

import metasampler as ms
from tasks.linear_regression import linear_regression


def main() -> None:
    torch.set_num_threads(1)
    stiff = linear_regression(n=300, scales=(1.0, 1.0, 1.0), prior_std=10.0, batch_size=100)
    task = linear_regression()
    setups = {
        "stiff": (stiff.model, stiff.mean, stiff.cov, 8, 1500, 500, 0.01, range(5)),
        "linear": (task.model, task.mean, task.cov, 16, 3000, 1000, None, range(3)),
    }
    for name, (model, mean, cov, chains, steps, burn_in, lr, seeds) in setups.items():
        step = {"lr": lr} if lr is not None else {"eta": 5e-4}
        makers = {
            "SGHMC": partial(ms.samplers.SGHMC, **step),
            "cSGHMC": partial(ms.samplers.cyclical_sghmc, **step, total_steps=steps, n_cycles=4),
        }
        for label, make in makers.items():
            for seed in seeds:
                result = ms.sample(
                    make(), model, chains, steps, burn_in=burn_in, seed=seed, progress=False,
                    adapt=True,
                )  # fmt: skip
                kl = ms.diagnostics.gaussian_kl(result.theta.double(), mean.double(), cov.double())
                chosen = result.adapted
                print(
                    f"{name} {label} seed {seed}: eta {chosen.eta:.3g}, friction "
                    f"{chosen.friction:.3g}, KL {float(kl):.3g}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
