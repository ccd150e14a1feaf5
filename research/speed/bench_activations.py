"""Per-step cost of the NNSGHMC step by the nets' hidden activation and width, against SGHMC.

Untrained nets (10 units, or the widths ``--hidden`` gives) of the shipped floor sampler's
layout (curl ``Q_f(U, p_i)``, friction floor ``c = 0.08``), compiled (the default path on a
CPU), exact and finite-difference Gamma, on the 784-40-40-10 MLP of
``bench_nnsghmc_overhead.py`` (K = 20, batch 500, one thread); ratios are medians of
per-round ratios to SGHMC in the same interleaved rounds.

``--kernel`` times the compiled step function alone as well: the inputs of one step of each
sampler are captured and the compiled step is replayed on them in interleaved rounds, without
the MLP's gradient, the noise draw or the rest of a step, which every activation shares.

Usage::

    python research/speed/bench_activations.py --activations relu softsign tanh --repeats 6 [--kernel]
    python research/speed/bench_activations.py --activations softsign --hidden 1 5 10 20 --kernel
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from metasampler.learned import NNSGHMC, aot  # noqa: E402
from metasampler.learned import nnsghmc as nnsghmc_module  # noqa: E402
from metasampler.learned.nets import ACTIVATIONS  # noqa: E402
from metasampler.samplers import SGHMC  # noqa: E402
from speed.bench_nnsghmc_overhead import mlp_target, time_sampling  # noqa: E402


def variants(activations: list[str], widths: list[int], lr: float = 0.007) -> dict:
    samplers = {"SGHMC": SGHMC(lr=lr, friction=1.0)}
    for act in activations:
        for width in widths:
            for gamma in ("exact", "finite_difference"):
                name = f"{act} {gamma}" if widths == [10] else f"{width}-unit {act} {gamma}"
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    samplers[name] = NNSGHMC(
                        lr=lr, gamma=gamma, beta_off=1.0, c=0.08, activation=act,
                        q_hidden=(width,), d_hidden=(width,), q_momentum_input=True,
                    )  # fmt: skip
    return samplers


def kernel_times(target, samplers: dict, init, calls: int, repeats: int) -> dict:
    """ms per call of each NNSGHMC sampler's compiled step, replayed on captured inputs."""
    captured = {}
    run_step = nnsghmc_module.run_step

    def capture(args, sampler):  # the step's inputs, as NNSGHMC passes them
        captured[id(sampler)] = args
        return run_step(args, sampler)

    nnsghmc_module.run_step = capture
    try:
        time_sampling(target, samplers, init, 2, 2, 1)  # (FD needs a history: two steps)
    finally:
        nnsghmc_module.run_step = run_step
    inputs = {name: captured[id(s)] for name, s in samplers.items() if id(s) in captured}
    times: dict[str, list[float]] = {name: [] for name in inputs}
    with torch.no_grad():
        for _ in range(repeats):
            for name, args in inputs.items():
                aot.run(args, wait=True)
                t0 = time.perf_counter()
                for _ in range(calls):
                    aot.run(args, wait=True)
                times[name].append((time.perf_counter() - t0) / calls * 1e3)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--activations", nargs="+", default=["relu", "softsign", "tanh"],
                        choices=ACTIVATIONS)  # fmt: skip
    parser.add_argument("--hidden", nargs="+", type=int, default=[10],
                        help="hidden units of both nets (one variant per width)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--kernel", action="store_true", help="also time the compiled step alone")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    target, init = mlp_target((40, 40), 20)
    samplers = variants(args.activations, args.hidden)
    times = time_sampling(target, samplers, init, 10, 3, args.repeats)
    ref = times["SGHMC"]
    print("| variant | ms/step | ratio to SGHMC |\n|---|---:|---:|")
    for name, t in times.items():
        ratio = statistics.median(a / b for a, b in zip(t, ref, strict=True))
        print(f"| {name} | {statistics.median(t):.2f} | {ratio:.2f}x |")
    if args.kernel:
        print("\n| compiled step alone | ms/call |\n|---|---:|")
        for name, t in kernel_times(target, samplers, init, 10, args.repeats).items():
            print(f"| {name} | {statistics.median(t):.2f} |")


if __name__ == "__main__":
    main()
