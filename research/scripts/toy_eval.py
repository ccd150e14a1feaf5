"""Evaluate trained toy samplers on the 20-D test protocol (SPEC §5).

    python research/scripts/toy_eval.py runs/toy_gaussian/sampler.safetensors [more files] \\
        [--n-steps 12000] [--n-chains 50] [--eta 0.025] [--seed 0] \\
        [--noise-correction | --noise-estimate] [--[no-]leapfrog] [--[no-]thermostat] \\
        [--json out.json]

For each sampler file: 50 chains x 12,000 steps on the 20-D correlated test Gaussian with
gradient noise N(0, 1), ``eta = 0.025``, chains from ``U([0, 6]^D)``; prints KL@1k, KL@12k
(Gaussian fitted to all samples so far vs the target) and the paper's per-chain ESS
(:func:`metasampler.benchmark.gaussian_benchmark`). If the sampler was trained with
``task.energy_log_normaliser`` (read from the provenance in the file's header), the test
energy gets the same constant (``--normalised-energy``
overrides: ``yes``/``no``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from metasampler.cli import positive_float, positive_int  # noqa: E402


def trained_with_normalised_energy(path: Path) -> bool:
    """``task.energy_log_normaliser`` of the run that wrote ``path`` (from the provenance in
    the file's header; False for files written before the option existed)."""
    from omegaconf import OmegaConf

    from metasampler.export import training_config

    config = training_config(path)
    return bool(OmegaConf.select(config, "task.energy_log_normaliser", default=False))


def _invalid_arguments(sampler) -> str | None:
    """Why the sampler's constants, as set, are not a valid sampler (``None``: they are)."""
    try:
        sampler.arguments()
    except ValueError as err:
        return str(err)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("samplers", nargs="+", type=Path)
    parser.add_argument("--n-steps", type=positive_int, default=12_000)
    parser.add_argument("--n-chains", type=positive_int, default=50)
    parser.add_argument("--eta", type=positive_float, default=0.025)
    parser.add_argument("--seed", type=int, default=0, help="seed of the test chains")
    parser.add_argument("--normalised-energy", choices=("auto", "yes", "no"), default="auto")
    parser.add_argument(
        "--noise-correction",
        action="store_true",
        help="give the sampler the test's known gradient-noise variance (grad_noise_var = 1)",
    )
    parser.add_argument(
        "--noise-estimate",
        action="store_true",
        help="the sampler estimates the gradient noise's variance from the two halves the "
        "target draws it from (grad_noise_estimate), not told it",
    )
    parser.add_argument(
        "--leapfrog",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="report the midpoints of the chain's gradient points (NNSGHMC's leapfrog; "
        "default: the file's)",
    )
    parser.add_argument(
        "--thermostat",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a thermostat per coordinate around the learned step (needs exact Gamma; "
        "default: the file's)",
    )
    parser.add_argument("--json", type=Path, default=None, help="append results as JSON lines")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    import metasampler as ms
    from metasampler.benchmark.gaussian import TEST_GRAD_NOISE_STD, gaussian_benchmark
    from metasampler.targets import NonFiniteError
    from tasks.toy import paper_test_gaussian

    kl_at = sorted({min(1000, args.n_steps), args.n_steps})
    print(f"| sampler | normalised energy | kl@{kl_at[0]} | kl@{kl_at[-1]} | ess | seconds |")
    print("|---|---|---|---|---|---|")
    for path in args.samplers:
        try:
            sampler = ms.load_sampler(path, eta=args.eta)
            # Eager steps: the default background compile switches paths at a run-dependent
            # step, which makes two evaluations of one file differ in the last digits.
            sampler.use_compile = False
            if args.noise_correction:
                sampler.grad_noise_var = TEST_GRAD_NOISE_STD**2
            sampler.grad_noise_estimate = args.noise_estimate
            if args.leapfrog is not None:
                sampler.leapfrog = args.leapfrog
            if args.thermostat is not None:
                sampler.thermostat = args.thermostat
            # the options set above, checked by the arguments' one rule
            conflict = _invalid_arguments(sampler)
            if conflict:
                raise ValueError(f"{path}: {conflict}")
        except (FileNotFoundError, ValueError, ms.SamplerFileError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        normalised = (
            trained_with_normalised_energy(path)
            if args.normalised_energy == "auto"
            else args.normalised_energy == "yes"
        )
        task = paper_test_gaussian()
        if normalised:
            task = task.with_normalised_energy()
        start = time.time()
        try:
            result = gaussian_benchmark(
                sampler,
                task,
                n_chains=args.n_chains,
                n_steps=args.n_steps,
                kl_at=kl_at,
                seed=args.seed,
                grad_noise_std=TEST_GRAD_NOISE_STD,
            )
        except NonFiniteError as err:  # a sampler that blows up is a result, not a crash
            print(f"| {path} | {normalised} | diverged: {err} | | | |", flush=True)
            continue
        seconds = time.time() - start
        print(
            f"| {path} | {normalised} | {result[f'kl@{kl_at[0]}']:.4g} | "
            f"{result[f'kl@{kl_at[-1]}']:.4g} | {result['ess']:.1f} | {seconds:.0f} |",
            flush=True,
        )
        if args.json is not None:
            record = {"sampler": str(path), "normalised_energy": normalised, **result}
            record["grad_noise_var"] = sampler.grad_noise_var
            record["grad_noise_estimate"] = sampler.grad_noise_estimate
            record["leapfrog"], record["thermostat"] = sampler.leapfrog, sampler.thermostat
            record["test_seed"] = args.seed
            with args.json.open("a") as fh:
                fh.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
