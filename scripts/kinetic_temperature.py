"""How hot a sampler's chains run on an ``evaluate.py`` task: the momentum's mean square.

    python scripts/kinetic_temperature.py --sampler runs/ss_c08/sampler.safetensors --lr 0.144
    python scripts/kinetic_temperature.py --sampler sghmc --lr 0.16 --friction-per-step 0.1

Runs ``--chains`` chains of an NNSGHMC file (or SGHMC with friction ``a = eta C`` per step) for
``--steps`` steps at the per-batch learning rate ``--lr`` on the config's task (no warm-up) and
prints the mean of ``p_i^2`` over coordinates and chains, averaged over the last 500 steps
(every 10th): ``T = 1`` at the target, ``H = U + p.p / 2``; above it the chains run hot, e.g.
from minibatch noise the friction does not balance (docs/RESULTS.md, session 18). Also the
50 / 90 / 99 % quantiles of the final ``p_i^2`` (a chi-square with one degree of freedom:
0.455 / 2.71 / 6.63).
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--sampler", required=True, help="an NNSGHMC file, or 'sghmc'")
    parser.add_argument("--lr", type=float, required=True, help="per-batch learning rate")
    parser.add_argument("--friction-per-step", type=float, default=0.1, help="SGHMC's a")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--chains", type=int, default=5)
    args = parser.parse_args(argv)
    if args.steps < 500:
        parser.error("--steps must be >= 500 (the average covers the last 500)")
    torch.set_num_threads(1)

    from experiments.benchmark_config import load_benchmark_config
    from metasampler.export import load_sampler
    from metasampler.samplers import SGHMC
    from tasks.registry import build_problem

    cfg = load_benchmark_config(args.config, [])
    target = build_problem(cfg.task, seed=cfg.task.seed, device="cpu").target
    eta = (args.lr / target.n_data) ** 0.5
    if args.sampler == "sghmc":
        sampler = SGHMC(eta=eta, friction=args.friction_per_step / eta)
    else:
        sampler = load_sampler(args.sampler, lr=args.lr)
    gen = torch.Generator().manual_seed(0)
    kept = []
    with torch.no_grad():
        state = sampler.init(target.init_positions(args.chains, gen), target, gen)
        for t in range(args.steps):
            state = sampler.step(state, target, gen)
            if t >= args.steps - 500 and t % 10 == 0:
                kept.append(state.momentum.pow(2).mean())
    final = state.momentum.pow(2).flatten()[:1_000_000]
    quantiles = [float(torch.quantile(final, q)) for q in (0.5, 0.9, 0.99)]
    print(f"mean p^2 over the last 500 steps: {float(torch.stack(kept).mean()):.3f}")
    print("final p^2 quantiles 50 / 90 / 99 %: " + " / ".join(f"{q:.3f}" for q in quantiles))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
