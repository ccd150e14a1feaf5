"""Write a preconditioned SGHMC as an NNSGHMC sampler file, to evaluate it like a learned one.

    python research/scripts/preconditioned_sghmc.py --power 0.5 --out psghmc_0.5.safetensors
    python evaluate.py --config configs/eval/fmnist_cnn_nt.yaml --sampler psghmc_0.5.safetensors

The file is NNSGHMC reduced to SGHMC (``f_phiQ = 0``, ``beta_off = 1``, no ``f_phiD``, a
constant friction per step) with the curl's preconditioner ``precondition_power`` on: SGHMC
whose coordinate ``i`` moves at ``P_i = (V_i / median V)^(-power / 2)`` times the step. It
separates what the preconditioner does from what the learned nets do (research/NOTEBOOK.md,
session 15).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--power", type=float, required=True, help="precondition_power (> 0)")
    parser.add_argument("--friction", type=float, default=0.01, help="friction per step")
    parser.add_argument("--out", type=Path, required=True, help="sampler file to write")
    args = parser.parse_args(argv)
    if args.power <= 0:
        parser.error(f"--power must be > 0, got {args.power}")
    from metasampler.learned import NNSGHMC

    sampler = NNSGHMC(
        lr=0.05, q_hidden=(2,), d_hidden=(2,), q_momentum_input=False, beta_off=1.0,
        alpha=0.0, c=args.friction, d_output_scale=0.0, friction_units="per_step",
        precondition_power=args.power, compile=False,
    )  # fmt: skip
    with torch.no_grad():  # f_phiQ = 0: Q_f = beta_off = 1 before the preconditioner
        sampler.f_q.head.weight.zero_()
        sampler.f_q.head.bias.zero_()
    sampler.save(str(args.out), provenance={"script": "research/scripts/preconditioned_sghmc.py"})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
