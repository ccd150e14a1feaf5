"""Where an ``evaluate.py`` method's chains sit: per-chain train and test NLL and weight norm.

    python scripts/chain_fit.py --config configs/eval/mnist_nt_af.yaml --method cnnsghmc \
        --lr 4.2 --sampler pretrained/mnist_mlp_positive_preconditioned.safetensors \
        [--steps 1 100 500 1000 1500 1600 1700 1800 2000] [key=value ...]

Runs one method of the config (its options from the config and the ``key=value``
overrides, its warm-up and schedule as the protocol builds them) at the per-batch learning rate
``--lr`` for the config's chains and steps, and prints at each step of ``--steps`` the chains'
mean NLL on the training and test splits, their mean energy and half squared weight norm
``|theta|^2 / 2``. Under a Gaussian prior ``N(0, s^2 I)`` a chain that has reached the prior's
typical set in the directions the data leave free has a half squared norm near ``D s^2 / 2``
(printed first), so the norm tells how far the chains have mixed in those directions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

# The application packages (tasks, experiments) live in the repository, not in the wheel.
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True)
    parser.add_argument("--method", required=True, help="a key of the config's methods")
    parser.add_argument("--lr", type=float, required=True, help="per-batch learning rate")
    parser.add_argument("--sampler", default=None, help="NNSGHMC file (nnsghmc, cnnsghmc)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--steps", type=int, nargs="+", default=[1, 100, 500, 1000, 1500, 1600, 1700, 1800, 2000]
    )
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    return parser.parse_intermixed_args(argv)


def mean_nll(target, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    """The chains' mean NLL per example on ``(x, y)``."""
    from metasampler.benchmark.metrics import predict_log_probs

    log_probs = predict_log_probs(target, theta, x, 1000)
    labels = y.view(1, -1, 1).expand(log_probs.shape[0], -1, 1)
    return float(-log_probs.gather(-1, labels).mean())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from omegaconf import OmegaConf

    import evaluate
    from experiments.benchmark_config import load_benchmark_config
    from metasampler import sample
    from metasampler.benchmark.protocol import MethodFactory

    cfg = load_benchmark_config(args.config, args.overrides)
    torch.set_num_threads(cfg.threads)
    problem = evaluate._build_problem(cfg, torch.device(cfg.device))
    data, target = problem.data, problem.target
    options = OmegaConf.to_container(cfg.methods[args.method], resolve=True)
    options.pop("momentum_decay_grid", None)  # (the config's constant friction, not a grid)
    budget = cfg.budget
    factory = MethodFactory(
        args.method, options, target.n_data, budget.warmup_steps, budget.warmup_lr_factor,
        args.sampler, cfg.device,
    )  # fmt: skip
    sampler = factory(args.lr, budget.n_steps)
    print(f"{problem.name}: D = {target.dim}; prior typical set: |theta|^2 / 2 ~ "
          f"{target.dim * cfg.task.prior_std**2 / 2:.0f}")  # fmt: skip
    print("| step | train NLL | test NLL | energy | abs(theta)^2 / 2 |\n|---:|---:|---:|---:|---:|")

    def report(state) -> None:
        if state.step in args.steps:
            train = mean_nll(target, state.theta, data.x_train, data.y_train)
            test = mean_nll(target, state.theta, data.x_test, data.y_test)
            norm = float(state.theta.pow(2).sum(-1).mean()) / 2
            energy = float(state.energy.mean())
            print(f"| {state.step} | {train:.4f} | {test:.4f} | {energy:.1f} | {norm:.1f} |",
                  flush=True)  # fmt: skip

    sample(
        sampler, target, budget.n_chains, budget.n_steps,
        init=lambda gen: problem.init(budget.n_chains, gen), seed=args.seed, progress=False,
        callback=report, store=False,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
