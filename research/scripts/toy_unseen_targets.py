"""Toy samplers on targets that neither their meta-training nor any setting's choice saw.

    python research/scripts/toy_unseen_targets.py [--targets NAME ...] [--samplers SPEC ...] \\
        [--seed 0] [--n-steps 12000] [--json out.jsonl]

Each sampler runs 50 chains at ``eta = 0.025`` with gradient noise ``N(0, 1)`` on each target
(:func:`metasampler.benchmark.gaussian.gaussian_benchmark`: KL of a Gaussian fitted to all
samples so far against one with the target's exact moments, and the per-chain ESS). Targets:
the 10-D meta-training Gaussian's spectrum in a random orthonormal basis (``train10_rotated``),
the 20-D test construction at covariance seeds 1 and 2 (``test20_seed1``, ``test20_seed2``), a
50-D correlated Gaussian of condition number 100 (``corr50``), the banana of Haario et al.
(``banana``, and ``banana_stiff`` with half its conditional width) and four close Gaussians
(``mixture4``). A sampler is ``sghmc`` (friction 1, estimating the noise), ``msgnht`` (the
splitting mSGNHT) or ``FILE:THERMOSTAT:SCALE:ESTIMATE[:LEAPFROG]``: a shipped name or path with
its thermostat on or off (1/0), its ``d_output_scale`` set to ``SCALE`` and the noise estimate
and leapfrog positions on or off; ``FILE`` alone runs the file as loaded, estimating the noise
if it was meta-trained estimating it (``toy_gaussian_noise_estimate``). A chain that
diverges is reported, not raised.
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

from metasampler.cli import positive_int  # noqa: E402


def targets() -> dict:
    """Name -> (task factory, the interval chains start uniformly in, per coordinate)."""
    from tasks.banana import BananaTask
    from tasks.gaussian import gaussian, paper_test_gaussian, paper_train_gaussian
    from tasks.mixture import mixture_4

    return {
        "train10_rotated": (lambda: paper_train_gaussian().rotated(seed=7), (0.0, 6.0)),
        "test20_seed1": (lambda: paper_test_gaussian(seed=1), (0.0, 6.0)),
        "test20_seed2": (lambda: paper_test_gaussian(seed=2), (0.0, 6.0)),
        "corr50": (lambda: gaussian(50, mean=3.0, cov="correlated", seed=0), (0.0, 6.0)),
        "banana": (lambda: BananaTask(1.0, 1.0, 1.0), (-2.0, 2.0)),
        "banana_stiff": (lambda: BananaTask(1.0, 1.0, 0.5), (-2.0, 2.0)),
        "mixture4": (mixture_4, (-1.0, 1.0)),
    }


def build(spec: str, eta: float):
    """The sampler a ``--samplers`` entry names (see the module docstring)."""
    import metasampler as ms

    if spec == "sghmc":
        return ms.samplers.SGHMC(eta=eta, friction=1.0, grad_noise_estimate=True)
    if spec == "msgnht":
        return ms.samplers.SGNHT(eta=eta, multivariate=True, integrator="splitting")
    from omegaconf import OmegaConf

    from metasampler.export import training_config

    name, *settings = spec.split(":")
    sampler = ms.load_sampler(name, eta=eta)
    sampler.use_compile = False  # eager: the same digits from run to run
    # as loaded: estimating the noise if it was trained estimating (the file does not store it)
    trained = OmegaConf.select(training_config(name), "sampler.grad_noise_estimate", default=False)
    sampler.grad_noise_estimate = bool(trained)
    if settings:
        if len(settings) not in (3, 4) or any(v not in ("0", "1") for v in settings[::2]):
            raise ValueError(f"{spec!r}: expected FILE:THERMOSTAT:SCALE:ESTIMATE[:LEAPFROG]")
        sampler.thermostat = settings[0] == "1"
        sampler.d_output_scale = float(settings[1])
        sampler.grad_noise_estimate = settings[2] == "1"
        sampler.leapfrog = len(settings) == 4 and settings[3] == "1"
    sampler.arguments()  # the constants' one rule (ValueError)
    return sampler


def main(argv: list[str] | None = None) -> int:
    known = targets()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--targets", nargs="+", choices=sorted(known), default=sorted(known))
    parser.add_argument("--samplers", nargs="+", default=["sghmc", "msgnht"])
    parser.add_argument("--seed", type=int, default=0, help="seed of the chains")
    parser.add_argument("--n-steps", type=positive_int, default=12_000)
    parser.add_argument("--json", type=Path, default=None, help="append results as JSON lines")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    import metasampler as ms
    from metasampler.benchmark.gaussian import gaussian_benchmark
    from metasampler.targets import NonFiniteError

    eta, kl_at = 0.025, sorted({min(1000, args.n_steps), args.n_steps})
    try:
        samplers = {spec: build(spec, eta) for spec in args.samplers}
    except (FileNotFoundError, ValueError, ms.SamplerFileError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"| target | sampler | kl@{kl_at[0]} | kl@{kl_at[-1]} | ess | seconds |")
    print("|---|---|---|---|---|---|")
    for target in args.targets:
        make, (low, high) = known[target]
        for spec, sampler in samplers.items():
            start = time.time()
            try:
                result = gaussian_benchmark(
                    sampler, make(), n_chains=50, n_steps=args.n_steps, kl_at=kl_at,
                    seed=args.seed, grad_noise_std=1.0, init_low=low, init_high=high,
                )  # fmt: skip
            except NonFiniteError as err:
                print(f"| {target} | {spec} | diverged: {err} | | | |", flush=True)
                result = {"diverged": str(err)}
            else:
                kls = [result[f"kl@{t}"] for t in kl_at]
                print(
                    f"| {target} | {spec} | {kls[0]:.4g} | {kls[-1]:.4g} | {result['ess']:.1f} "
                    f"| {time.time() - start:.0f} |",
                    flush=True,
                )
            if args.json is not None:
                record = {"target": target, "sampler": spec, "seed": args.seed, **result}
                with args.json.open("a") as fh:
                    fh.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
