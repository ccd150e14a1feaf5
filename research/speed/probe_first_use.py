"""Where the first steps of a fresh process go while the background compile runs (issue #12).

    D=$(mktemp -d); TORCHINDUCTOR_CACHE_DIR=$D METASAMPLER_CACHE_DIR=$D TMPDIR=$D \\
        OMP_NUM_THREADS=1 \\
        .venv/bin/python research/speed/probe_first_use.py [--steps 20] [--switch-interval 0.005]

Loads the shipped MNIST sampler with no flags (``compile=None``: background compile), samples
the 784-40-40-10 MLP of ``bench_nnsghmc_overhead.py`` and prints the wall time of every step,
so a stall shows where it happens. ``--switch-interval`` sets ``sys.setswitchinterval`` (to
test whether the interpreter lock's hand-over is what starves the eager steps).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--switch-interval", type=float, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    start = time.perf_counter()
    from metasampler.export import load_sampler
    from speed.bench_nnsghmc_overhead import SHIPPED, mlp_target

    target, init = mlp_target((40, 40))
    sampler = load_sampler(SHIPPED)
    generator = torch.Generator().manual_seed(0)
    print(f"import + setup: {time.perf_counter() - start:.2f} s", flush=True)
    with torch.no_grad():
        state = sampler.init(init, target, generator)
        last = time.perf_counter()
        for i in range(args.steps):
            state = sampler.step(state, target, generator)
            now = time.perf_counter()
            print(f"step {i}: {now - last:.2f} s", flush=True)
            last = now
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
