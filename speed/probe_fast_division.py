"""Probe: what the fast float division (:mod:`metasampler.learned.vector_division`) saves here.

For each sampler below, on the 784-40-40-10 MLP of ``bench_nnsghmc_overhead.py`` (K = 20,
one thread), the inputs of one step are captured and its compiled package is built twice in
child processes, into a temporary folder: as the package is built by default (the reciprocal
estimate and one Newton step, where the CPU's vector width has one) and without the build's
shortcuts (exact division). Both packages are then replayed on the same inputs in interleaved
rounds; the script prints ms per call, the median of per-round ratios, and the largest
difference between the two packages' outputs relative to the state's scale.

    .venv/bin/python speed/probe_fast_division.py [--rounds 8] [--calls 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_nnsghmc_overhead import mlp_target, time_sampling  # noqa: E402

from metasampler.learned import NNSGHMC, aot  # noqa: E402
from metasampler.learned import nnsghmc as nnsghmc_module  # noqa: E402


def samplers() -> dict[str, NNSGHMC]:
    """Untrained nets of the shipped floor layout, eager (the probe builds its own packages)."""
    out = {}
    for width in (40, 5):
        for gamma in ("exact", "finite_difference"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out[f"{width}-unit softsign {gamma}"] = NNSGHMC(
                    lr=0.007, gamma=gamma, beta_off=1.0, c=0.08, activation="softsign",
                    q_hidden=(width,), d_hidden=(width,), q_momentum_input=True, compile=False,
                )  # fmt: skip
    return out


def captured_inputs(named: dict[str, NNSGHMC]) -> dict:
    """The arguments of each sampler's second step (finite differences need a history)."""
    target, init = mlp_target((40, 40), 20)
    captured, run_step = {}, nnsghmc_module.run_step

    def capture(args, sampler):
        captured[id(sampler)] = args
        return run_step(args, sampler)

    nnsghmc_module.run_step = capture
    try:
        time_sampling(target, named, init, 2, 2, 1)
    finally:
        nnsghmc_module.run_step = run_step
    return {name: captured[id(s)] for name, s in named.items()}


def build(spec: aot.KernelSpec, package: Path, fast: bool) -> None:
    flag = [] if fast else [aot.NO_SHORTCUTS]
    command = [sys.executable, "-m", "metasampler.learned.aot", spec.to_json(), str(package)]
    subprocess.run(command + flag, check=True, stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"CPU vector ISA: {torch.backends.cpu.get_cpu_capability()}")
    inputs = captured_inputs(samplers())
    runners = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, step_args in inputs.items():
            spec = aot.KernelSpec.of(step_args)
            for fast in (True, False):
                package = Path(tmp) / f"{spec.digest()}-{fast}.pt2"
                build(spec, package, fast)
                runner = torch._inductor.aoti_load_package(str(package))
                runners[name, fast] = (runner, aot.flat_inputs(step_args, spec))
    times: dict[tuple[str, bool], list[float]] = {key: [] for key in runners}
    with torch.no_grad():
        for _ in range(args.rounds):
            for key, (runner, flat) in runners.items():
                runner(*flat)
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    runner(*flat)
                times[key].append((time.perf_counter() - t0) / args.calls * 1e3)
        print("\n| compiled step | exact division (ms) | fast division (ms) | ratio | max diff |")
        print("|---|---:|---:|---:|---:|")
        for name in inputs:
            (fast_run, flat), (exact_run, _) = runners[name, True], runners[name, False]
            diff = max(
                ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
                for a, b in zip(fast_run(*flat)[:2], exact_run(*flat)[:2], strict=True)
            )
            fast_t, exact_t = times[name, True], times[name, False]
            ratio = statistics.median(f / e for f, e in zip(fast_t, exact_t, strict=True))
            print(f"| {name} | {statistics.median(exact_t):.2f} | {statistics.median(fast_t):.2f}"
                  f" | {ratio:.2f} | {diff:.1e} |")  # fmt: skip


if __name__ == "__main__":
    main()
