"""Where each integrator leaves a stiff Gaussian's positions, with and without gradient noise.

    python research/scripts/thermostat_probe.py [--sigma 0 3 10] [--friction 0.1] [--eta 0.1] \\
        [--chains 400] [--steps 4000] [--burn-in 1000]

The target is ``U = sum_i k_i theta_i^2 / 2`` with curvatures ``k = 1, 30, 100, 200`` (at
``eta = 0.1``: ``eta^2 k = 0.01 ... 2``, the stiff end of the modified Euler step's range), its
gradient noised with ``N(0, sigma^2)`` per coordinate, which no sampler is told. For each
``sigma`` the script prints ``k_i Var(theta_i)`` per coordinate (1 at the target) for:

* SGHMC written as NNSGHMC (``Q_f = 1``, constant friction per step ``--friction``), Euler
  positions, without and with the thermostat (``thermostat = True``: its thermometer is the
  step's mean momentum ``p_bar``), and with the thermostat and leapfrog positions;
* mSGNHT with the splitting integrator (mSGNHT-S) at the same step, its diffusion giving the
  same friction per step; its thermometer is the momentum that moves the positions.

research/NOTEBOOK.md (session 56) reads the table: what each thermometer leaves in the positions of
stiff, noisy coordinates, as a NT+AF output layer's are.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import metasampler as ms  # noqa: E402
from metasampler.cli import positive_float, positive_int  # noqa: E402
from metasampler.learned import NNSGHMC  # noqa: E402
from metasampler.samplers import SGNHT  # noqa: E402

CURVATURES = (1.0, 30.0, 100.0, 200.0)


def sghmc_as_nnsghmc(eta: float, friction: float, **options: bool) -> NNSGHMC:
    """``Q_f = 1`` and the constant friction ``friction`` per step: SGHMC as NNSGHMC."""
    sampler = NNSGHMC(
        eta=eta, beta_off=1.0, alpha=0.0, d_output_scale=0.0, c=friction / eta, compile=False,
        **options,
    )  # fmt: skip
    with torch.no_grad():
        sampler.f_q.head.weight.zero_()
        sampler.f_q.head.bias.zero_()
    return sampler


def samplers(eta: float, friction: float) -> dict[str, ms.samplers.Sampler]:
    return {
        "Euler": sghmc_as_nnsghmc(eta, friction),
        "Euler + thermostat": sghmc_as_nnsghmc(eta, friction, thermostat=True),
        "leapfrog + thermostat": sghmc_as_nnsghmc(eta, friction, thermostat=True, leapfrog=True),
        "mSGNHT-S": SGNHT(eta=eta, diffusion=friction / eta, multivariate=True),
    }


def position_ratios(sampler, sigma: float, args: argparse.Namespace) -> list[float] | None:
    """``k_i Var(theta_i)`` over the kept states of every chain; ``None`` if it diverged."""
    k = torch.tensor(CURVATURES)
    target = ms.EnergyTarget(lambda x: 0.5 * (k * x**2).sum(-1), dim=len(k), grad_noise_std=sigma)
    try:
        kept = ms.sample(
            sampler, target, args.chains, args.steps, burn_in=args.burn_in, thin=10, seed=0,
            progress=False, init=torch.zeros(args.chains, len(k)),
        ).theta  # fmt: skip
    except ms.targets.NonFiniteError:
        return None
    return (kept.reshape(-1, len(k)).var(0) * k).tolist()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sigma", type=float, nargs="+", default=[0.0, 3.0, 10.0])
    parser.add_argument("--friction", type=positive_float, default=0.1, help="per step")
    parser.add_argument("--eta", type=positive_float, default=0.1)
    parser.add_argument("--chains", type=positive_int, default=400)
    parser.add_argument("--steps", type=positive_int, default=4000)
    parser.add_argument("--burn-in", type=positive_int, default=1000)
    args = parser.parse_args(argv)
    if args.burn_in >= args.steps:
        parser.error("--burn-in must be smaller than --steps")
    torch.set_num_threads(1)
    header = " | ".join(f"k = {k:g}" for k in CURVATURES)
    print(f"| gradient noise sigma | sampler | {header} |")
    print("|---:|---|" + "---:|" * len(CURVATURES))
    for sigma in args.sigma:
        for name, sampler in samplers(args.eta, args.friction).items():
            ratios = position_ratios(sampler, sigma, args)
            cells = ["diverged"] * len(CURVATURES) if ratios is None else ratios
            text = " | ".join(c if isinstance(c, str) else f"{c:.3f}" for c in cells)
            print(f"| {sigma:g} | {name} | {text} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
