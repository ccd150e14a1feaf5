"""How much the minibatch gradient noise heats a learned sampler on a Bayesian network.

    python research/scripts/bnn_noise_heating.py [--config configs/eval/mnist_nt.yaml] \\
        [--sampler mnist_mlp_stiffness_softsign] [--lr 0.072] [--steps 600] [--batches 40]

Runs ``--steps`` steps of the sampler (4 chains) on the evaluation config's task, then at the
final state estimates each coordinate's noise variance ``V_i`` of ``grad Ũ`` from ``--batches``
minibatches (each split in halves, ``estimate_noise=True``), and prints the per-coordinate
heating ``eta Q_f^2 V / (2 D_f)``, the relative excess temperature the noise brings
(:func:`metasampler.benchmark.temperature.noise_heat`; docs/METHOD.md §3): what
``NNSGHMC(grad_noise_var=...)`` would remove if ``V`` were known.

    python research/scripts/bnn_noise_heating.py --temperature --sampler runs/ss_c08/sampler.safetensors \
        --lr 0.144 [--steps 1500] [--chains 5]
    python research/scripts/bnn_noise_heating.py --temperature --sampler sghmc --lr 0.16 \
        [--friction-per-step 0.1]

``--noise-estimate`` (with ``--temperature``): the sampler estimates the gradient noise's
variance and leaves it out of the injected noise (``grad_noise_estimate``; session 22).

``--temperature`` measures the heat instead: ``--chains`` chains of the sampler (or SGHMC with
friction ``a = eta C`` per step) run ``--steps`` steps (no warm-up), and the mean of ``p_i^2``
over coordinates and chains, averaged over the last 500 steps (every 10th), is printed:
``T = 1`` at the target (``H = U + p.p / 2``); above it the chains run hot. Also the 50 / 90 /
99 % quantiles of the final ``p_i^2`` (chi-square with one degree of freedom: 0.455 / 2.71 /
6.63). research/NOTEBOOK.md, session 18.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from metasampler.cli import positive_int  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(ROOT / "configs" / "eval" / "mnist_nt.yaml"))
    parser.add_argument("--sampler", default="mnist_mlp_stiffness_softsign")
    parser.add_argument("--lr", type=float, default=0.072, help="per-batch learning rate")
    parser.add_argument("--steps", type=positive_int, default=600)
    parser.add_argument("--batches", type=positive_int, default=40)
    parser.add_argument("--temperature", action="store_true", help="measure mean p^2 instead")
    parser.add_argument("--chains", type=positive_int, default=5, help="--temperature: chains")
    parser.add_argument("--friction-per-step", type=float, default=0.1, help="SGHMC's a")
    parser.add_argument(
        "--noise-estimate",
        action="store_true",
        help="--temperature: the sampler estimates the gradient noise (grad_noise_estimate)",
    )
    args = parser.parse_args(argv)
    if args.temperature and args.steps < 500:
        parser.error("--temperature needs --steps >= 500 (the average covers the last 500)")
    torch.set_num_threads(1)

    from omegaconf import OmegaConf

    import metasampler as ms
    from metasampler.benchmark.temperature import noise_heat
    from tasks.bnn import build_bnn_problem
    from tasks.config import TaskConfig

    task = OmegaConf.merge(OmegaConf.structured(TaskConfig), OmegaConf.load(args.config).task)
    problem = build_bnn_problem(task, seed=0)
    target = problem.target
    eta = math.sqrt(args.lr / target.n_data)
    if args.temperature:
        if args.sampler == "sghmc":
            sampler = ms.samplers.SGHMC(eta=eta, friction=args.friction_per_step / eta)
        else:
            sampler = ms.load_sampler(args.sampler, lr=args.lr)
        sampler.grad_noise_estimate = args.noise_estimate
        init = problem.init(args.chains, torch.Generator().manual_seed(0))
        return kinetic_temperature(sampler, target, init, args.steps)
    sampler = ms.load_sampler(args.sampler, lr=args.lr)
    init = problem.init(4, torch.Generator().manual_seed(0))
    state = ms.sample(
        sampler, target, 4, args.steps, init=init, seed=1, store=False, progress=False
    ).final_state
    terms = sampler.drift_terms(
        state.theta, state.momentum, target, eta=eta, grad_sq=state.extras.get("grad_sq")
    )
    q, d = terms.q.detach(), terms.d.detach()
    gen = torch.Generator().manual_seed(100)
    heating = noise_heat(target, state.theta, q, d, eta, args.batches, gen).float().flatten()
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


def kinetic_temperature(sampler, target, init: torch.Tensor, steps: int) -> int:
    """Print the chains' mean ``p^2`` over the last 500 steps and the final quantiles."""
    gen = torch.Generator().manual_seed(1)
    kept = []
    with torch.no_grad():
        state = sampler.init(init, target, gen)
        for t in range(steps):
            state = sampler.step(state, target, gen)
            if t >= steps - 500 and t % 10 == 0:
                kept.append(state.momentum.pow(2).mean())
    final = state.momentum.pow(2).flatten()[:1_000_000]
    quantiles = [float(torch.quantile(final, q)) for q in (0.5, 0.9, 0.99)]
    print(f"mean p^2 over the last 500 steps: {float(torch.stack(kept).mean()):.3f}")
    print("final p^2 quantiles 50 / 90 / 99 %: " + " / ".join(f"{q:.3f}" for q in quantiles))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
