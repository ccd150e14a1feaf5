"""Probe: what the fast float division (:mod:`metasampler.learned.vector_division`) saves here.

For each sampler below, on the 784-40-40-10 MLP of ``bench_nnsghmc_overhead.py`` (K = 20,
one thread), the inputs of one step are captured and its compiled package is built twice in
child processes, into a temporary folder: as the package is built by default (the reciprocal
estimate and one Newton step, where the CPU's vector width has one) and without the build's
shortcuts (exact division). ``--estimate-only`` adds a third build whose divisions use the
14-bit estimate alone, without the Newton step (what dropping it would save; not how packages
are built). The packages are then replayed on the same inputs in interleaved rounds; the script
prints ms per call, the medians of per-round ratios to exact division, and the largest
difference of each fast package's outputs from exact division's, relative to the state's scale.

    .venv/bin/python research/speed/probe_fast_division.py [--rounds 8] [--calls 10] [--widths 40 5]
        [--estimate-only]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from metasampler.learned import NNSGHMC, aot  # noqa: E402
from metasampler.learned import nnsghmc as nnsghmc_module  # noqa: E402
from speed.bench_nnsghmc_overhead import mlp_target, time_sampling  # noqa: E402

# The variants' builds: exact division (no shortcuts), the default, the estimate alone.
EXACT, DEFAULT, ESTIMATE_ONLY = VARIANTS = ("exact division", "estimate + Newton", "estimate only")
# Run in the build's child process: vector_division's own C++ cut before its Newton step (an
# error if that step is no longer there), and inductor's cache off so that the default build's
# code is not reused.
_ESTIMATE_ONLY_BUILD = (
    "import sys, torch; from metasampler.learned import aot, vector_division as v; "
    "torch._inductor.config.fx_graph_cache = False; "
    "v._NEWTON = v._NEWTON[: v._NEWTON.index('r_ = _mm512_fmadd_ps')]; "
    "sys.exit(aot.main(sys.argv[1:]))"
)


def samplers(widths: list[int]) -> dict[str, NNSGHMC]:
    """Untrained nets of the shipped floor layout, eager (the probe builds its own packages)."""
    out = {}
    for width in widths:
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


def build(spec: aot.KernelSpec, package: Path, variant: str) -> None:
    flag = [aot.NO_SHORTCUTS] if variant == EXACT else []
    module = ["-c", _ESTIMATE_ONLY_BUILD] if variant == ESTIMATE_ONLY else ["-m", aot.__name__]
    command = [sys.executable, *module, spec.to_json(), str(package)]
    subprocess.run(command + flag, check=True, stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--widths", type=int, nargs="+", default=[40, 5])
    parser.add_argument("--estimate-only", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"CPU vector ISA: {torch.backends.cpu.get_cpu_capability()}")
    inputs = captured_inputs(samplers(args.widths))
    variants = VARIANTS if args.estimate_only else (EXACT, DEFAULT)
    runners = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, step_args in inputs.items():
            spec = aot.KernelSpec.of(step_args)
            for i, variant in enumerate(variants):
                package = Path(tmp) / f"{spec.digest()}-{i}.pt2"
                build(spec, package, variant)
                runner = torch._inductor.aoti_load_package(str(package))
                runners[name, variant] = (runner, aot.flat_inputs(step_args, spec))
    times: dict[tuple[str, str], list[float]] = {key: [] for key in runners}
    with torch.no_grad():
        for _ in range(args.rounds):
            for key, (runner, flat) in runners.items():
                runner(*flat)
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    runner(*flat)
                times[key].append((time.perf_counter() - t0) / args.calls * 1e3)
        fast = variants[1:]
        print("\n| compiled step | " + " | ".join(f"{v} (ms)" for v in variants)
              + "".join(f" | {v}: ratio, max diff" for v in fast) + " |")  # fmt: skip
        print("|---|" + "---:|" * (len(variants) + len(fast)))
        for name in inputs:
            exact_run, flat = runners[name, EXACT]
            exact_out, exact_t = exact_run(*flat)[:2], times[name, EXACT]
            cells = [f"{statistics.median(times[name, v]):.2f}" for v in variants]
            for variant in fast:
                out = runners[name, variant][0](*flat)[:2]
                diff = max(
                    ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
                    for a, b in zip(out, exact_out, strict=True)
                )
                ratio = statistics.median(
                    f / e for f, e in zip(times[name, variant], exact_t, strict=True)
                )
                cells.append(f"{ratio:.2f}, {diff:.1e}")
            print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
