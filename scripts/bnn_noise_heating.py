"""How much the minibatch gradient noise heats a learned sampler on a Bayesian network.

    python scripts/bnn_noise_heating.py [--config configs/eval/mnist_nt.yaml] \\
        [--sampler mnist_mlp_stiffness_softsign] [--lr 0.072] [--steps 600] [--batches 40]

Runs ``--steps`` steps of the sampler (4 chains) on the evaluation config's task, then at the
final state draws ``--batches`` minibatch gradients to estimate each coordinate's noise
variance ``V_i`` of ``grad Ũ``, and prints the per-coordinate heating
``eta Q_f^2 V / (2 D_f)`` (the relative excess temperature the noise brings,
docs/METHOD.md §3): what ``NNSGHMC(grad_noise_var=...)`` would remove if ``V`` were known.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(ROOT / "configs" / "eval" / "mnist_nt.yaml"))
    parser.add_argument("--sampler", default="mnist_mlp_stiffness_softsign")
    parser.add_argument("--lr", type=float, default=0.072, help="per-batch learning rate")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from omegaconf import OmegaConf

    import metasampler as ms
    from tasks.bnn import build_bnn_problem
    from tasks.config import TaskConfig

    task = OmegaConf.merge(OmegaConf.structured(TaskConfig), OmegaConf.load(args.config).task)
    problem = build_bnn_problem(task, seed=0)
    target = problem.target
    sampler = ms.load_sampler(args.sampler, lr=args.lr)
    eta = math.sqrt(args.lr / target.n_data)
    init = problem.init(4, torch.Generator().manual_seed(0))
    state = ms.sample(
        sampler, target, 4, args.steps, init=init, seed=1, store=False, progress=False
    ).final_state
    grads = torch.stack(
        [
            target.evaluate(state.theta, torch.Generator().manual_seed(100 + i)).grad
            for i in range(args.batches)
        ]
    )
    noise_var = grads.var(0)
    terms = sampler.drift_terms(
        state.theta, state.momentum, target, eta=eta, grad_sq=state.extras.get("grad_sq")
    )
    q, d = terms.q.detach(), terms.d.detach()
    heating = (eta * q.square() * noise_var / (2 * d)).flatten()
    quantiles = heating.quantile(torch.tensor([0.5, 0.9, 0.99])).tolist()
    print(
        f"eta {eta:.4g}; median per-step friction eta D_f {float((eta * d).median()):.4g}; "
        f"median |Q_f| {float(q.abs().median()):.3g}"
    )
    print(
        f"heating eta Q_f^2 V / (2 D_f): mean {float(heating.mean()):.4f}; median / 90 % / 99 % "
        f"{quantiles[0]:.4f} / {quantiles[1]:.4f} / {quantiles[2]:.4f}; share above 0.1: "
        f"{float((heating > 0.1).float().mean()):.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
