"""NNSGHMC speed against SGHMC: sampling steps, meta-training steps, first use.

All ratios are measured in one run, interleaved: timed blocks of each variant follow each
other round by round (SGHMC, variant A, variant B, SGHMC, ...), so load from other jobs on a
shared machine hits all alike; a ratio is the median over rounds of block time / the same
round's SGHMC block time.

* ``sampling``: the benchmark's quick setting (``configs/eval/quick.yaml``): a 784-40-40-10
  ReLU MLP :class:`~metasampler.BayesianModel` (D = 33,450), minibatch 500 of ``N = 3500``
  random MNIST-shaped inputs, K = 4 chains and again K = 20, steps under ``torch.no_grad()``
  after the warm-up has ended (``end_warmup``: the stiffness statistic ``V`` fixed), as
  ``metasampler.sample`` runs the kept steps. Rows: SGHMC; the shipped ``feedforward``
  sampler (5-unit softsign nets, stiffness curl, thermostat, exact Gamma) loaded with no
  flags (compiled step), the same with its stiffness input recomputed every step (what a
  warm-up step does), and forced eager (``use_compile=False``); untrained nets of the same
  design with the other width (10 units); the same file with ``thermostat=False`` (the
  thermostat's price); the sampler of Gong et al. (2019),
  ``NNSGHMC(curl_input="momentum", thermostat=False)`` with 10-unit nets, exact and
  finite-difference Gamma. The warm-up waits for the background
  builds, so the timed steps are the steady state.
* ``meta``: one unrolled meta-training window (W = 5 steps with autograd, then the backward
  of a loss on the final state) per block, divided by W, against an SGHMC sampling step, of
  the default design (stiffness curl, thermostat, softsign units): a 784-20-10 MLP
  (D = 15,910), K = 20, batch 500, 10-unit nets, the plain step (meta-training's default)
  and the compiled one (``train.compile_steps``; its compile falls in the untimed first
  round); the 20-D toy Gaussian, K = 50, 40-unit nets, compiled.
* ``first-use``: a fresh process with empty compile caches (``TORCHINDUCTOR_CACHE_DIR``,
  ``METASAMPLER_CACHE_DIR`` and ``TMPDIR`` pointing to a new directory) runs 30 steps of the
  shipped ``feedforward`` sampler on the MLP (K = 4), against 30 SGHMC steps in another
  fresh process.

Usage::

    .venv/bin/python -m speed.bench_nnsghmc_overhead             # all, writes BENCHMARKS.md
    .venv/bin/python -m speed.bench_nnsghmc_overhead --quick     # smoke run, prints only
    .venv/bin/python -m speed.bench_nnsghmc_overhead --parts sampling --chains 4 \
        --only feedforward 5-unit                                 # some rows

Every process runs one intra-op thread unless ``--threads`` says otherwise; a compiled step's
package is built for the thread count it runs with.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import nn

from metasampler.bayesian import BayesianModel
from metasampler.export import load_sampler
from metasampler.learned import NNSGHMC, fast
from metasampler.samplers import SGHMC
from speed._common import toy_gaussian, write_section

SECTION = "## NNSGHMC per-step overhead"
ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "pretrained" / "feedforward.safetensors"
N_DATA = 3500  # the quick benchmark's training digits
LR = 0.2  # a step of the quick benchmark's NNSGHMC grid (the step does not change the time)


def mlp_target(hidden: tuple[int, ...], n_chains: int = 4, device: str = "cpu"):
    """A seeded ReLU MLP ``BayesianModel`` on ``N_DATA`` random MNIST-shaped inputs, minibatch
    500, and ``n_chains`` start positions."""
    torch.manual_seed(0)
    widths = [784, *hidden, 10]
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    g = torch.Generator().manual_seed(0)
    x = torch.rand(N_DATA, 784, generator=g)
    y = torch.randint(0, 10, (N_DATA,), generator=g)
    module = nn.Sequential(*layers[:-1])
    target = BayesianModel(module, (x, y), "categorical", batch_size=500, device=device)
    return target, target.init_positions(n_chains, g).to(device)


class _PerStepStiffness:
    """Stands in for a sampler's cache of the fixed stiffness input: recomputed every step."""

    @staticmethod
    def of(grad_sq: torch.Tensor, eta: float) -> torch.Tensor:
        from metasampler.learned.stiffness import stiffness_input

        return stiffness_input(grad_sq, eta)


def _like_shipped(**changes) -> NNSGHMC:
    """An untrained sampler of the shipped file's design and constants with ``changes``."""
    shipped = load_sampler(SHIPPED, lr=LR)
    arguments = {**vars(shipped.arguments()), **changes}
    s = NNSGHMC(lr=LR, **arguments)
    for name in ("energy_loc", "energy_std", "momentum_std", "train_dim"):
        getattr(s, name).copy_(getattr(shipped, name))
    return s.requires_grad_(False)


def sampling_variants() -> dict:
    eager = load_sampler(SHIPPED, lr=LR)
    eager.use_compile = False
    per_step = load_sampler(SHIPPED, lr=LR)
    per_step._fixed_stiffness = _PerStepStiffness()
    no_thermostat = load_sampler(SHIPPED, lr=LR)
    no_thermostat.thermostat = False
    paper = dict(curl_input="momentum", thermostat=False, q_hidden=(10,), d_hidden=(10,))
    width = int(load_sampler(SHIPPED).f_q.hidden[0])
    other = 10 if width == 5 else 5  # the other width the design was measured at
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other_nets = _like_shipped(q_hidden=(other,), d_hidden=(other,))
        paper_exact = _like_shipped(gamma="exact", **paper)
        paper_fd = _like_shipped(gamma="finite_difference", **paper)
    return {
        "SGHMC": SGHMC(lr=LR, friction=1.0),
        f"feedforward ({width} units), compiled": load_sampler(SHIPPED, lr=LR),
        "feedforward, stiffness input recomputed each step (as in the warm-up)": per_step,
        "feedforward, eager": eager,
        f"{other}-unit nets, same design, compiled": other_nets,
        "feedforward, thermostat=False": no_thermostat,
        "paper's sampler (momentum curl, no thermostat, 10 units), exact": paper_exact,
        "paper's sampler, finite differences": paper_fd,
    }


def time_sampling(target, samplers: dict, init, steps: int, warmup: int, repeats: int):
    gens = {name: torch.Generator().manual_seed(1) for name in samplers}
    times: dict[str, list[float]] = {name: [] for name in samplers}
    with torch.no_grad():
        states = {name: s.init(init.clone(), target, gens[name]) for name, s in samplers.items()}
        for name, s in samplers.items():
            for _ in range(warmup):
                states[name] = s.step(states[name], target, gens[name])
        fast.wait_for_compiles()
        for name, s in samplers.items():  # (loads each package built meanwhile: not timed)
            states[name] = s.end_warmup(s.step(states[name], target, gens[name]))
            states[name] = s.step(states[name], target, gens[name])
        for _ in range(repeats):
            for name, s in samplers.items():
                state = states[name]
                t0 = time.perf_counter()
                for _ in range(steps):
                    state = s.step(state, target, gens[name])
                times[name].append((time.perf_counter() - t0) / steps * 1e3)
                states[name] = state
    return times


def time_meta(target, init, hidden: int, window: int, repeats: int, eta: float, paths):
    """ms per unrolled step (forward + backward / W) of each path, and SGHMC's sampling step."""
    samplers = {"SGHMC": SGHMC(eta=eta, friction=1.0)}
    for path in paths:
        s = NNSGHMC(eta=eta, q_hidden=(hidden,), d_hidden=(hidden,))
        s.step_path = path
        samplers[f"meta {'plain (default)' if path == 'auto' else path}"] = s
    times: dict[str, list[float]] = {name: [] for name in samplers}
    gen = torch.Generator().manual_seed(1)
    for rnd in range(repeats + 1):
        for name, s in samplers.items():
            t0 = time.perf_counter()
            if name == "SGHMC":
                with torch.no_grad():
                    state = s.init(init.clone(), target, gen)
                    for _ in range(window):
                        state = s.step(state, target, gen)
            else:
                state = s.init(init.clone(), target, gen)
                for _ in range(window):
                    state = s.step(state, target, gen)
                loss = (state.theta**2).mean() + state.momentum.pow(2).mean()
                loss.backward()
            if rnd > 0:  # round 0 is the warm-up
                times[name].append((time.perf_counter() - t0) / window * 1e3)
            elif name.startswith("meta compiled"):
                first = time.perf_counter() - t0
                print(f"{name}: first window (with the compile) {first:.0f} s", flush=True)
    return times


FIRST_USE = """
import os, sys, time, torch
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
t0 = time.perf_counter()
from speed.bench_nnsghmc_overhead import mlp_target, SHIPPED, LR
from metasampler.export import load_sampler
from metasampler.samplers import SGHMC
target, init = mlp_target((40, 40), 4)
s = load_sampler(SHIPPED, lr=LR) if sys.argv[1] == "nnsghmc" else SGHMC(lr=LR, friction=1.0)
g = torch.Generator().manual_seed(0)
t1 = time.perf_counter()
with torch.no_grad():
    state = s.init(init, target, g)
    state = s.step(state, target, g)
    t2 = time.perf_counter()
    for _ in range(29):
        state = s.step(state, target, g)
t3 = time.perf_counter()
from metasampler.learned import aot
aot.stop_builds()  # (a build still running would load the cores during the next measurement)
print(f"{t1 - t0:.2f} {t2 - t1:.2f} {t3 - t1:.2f}")
"""


def first_use(threads: int) -> dict[str, list[float]]:
    out = {}
    for kind in ("sghmc", "nnsghmc"):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "OMP_NUM_THREADS": str(threads),
                   "METASAMPLER_CACHE_DIR": cache, "TMPDIR": cache}  # fmt: skip
            env.pop("METASAMPLER_COMPILE", None)
            done = subprocess.run(
                [sys.executable, "-c", FIRST_USE, kind], env=env, capture_output=True, text=True,
                cwd=ROOT, check=True,
            )  # fmt: skip
            out[kind] = [float(x) for x in done.stdout.split()[-3:]]
    return out


def summary(times: dict[str, list[float]]) -> dict[str, tuple[float, float]]:
    ref = times["SGHMC"]
    return {
        name: (
            statistics.median(t),
            statistics.median(a / b for a, b in zip(t, ref, strict=True)),
        )
        for name, t in times.items()
    }


def _cpu_model() -> str:
    """The CPU's model name (Linux), else its architecture."""
    try:
        with open("/proc/cpuinfo") as info:
            line = next((x for x in info if x.startswith("model name")), "")
    except OSError:
        line = ""
    return line.split(":", 1)[-1].strip() or platform.machine()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few rounds, nothing written")
    parser.add_argument("--parts", nargs="+", default=["sampling", "meta", "first-use"])
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 9)")
    parser.add_argument("--chains", type=int, nargs="+", default=[4, 20], help="sampling K")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads of every process (default 1)"
    )
    parser.add_argument(
        "--only", nargs="+", default=None, metavar="TEXT",
        help="sampling rows whose name contains one of these (SGHMC is always timed)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    repeats = args.repeats or (2 if args.quick else 9)
    load_before = os.getloadavg()
    lines = []
    if "sampling" in args.parts:
        for k in args.chains:
            target, init = mlp_target((40, 40), k)
            variants = sampling_variants()
            if args.only:
                variants = {
                    name: s for name, s in variants.items()
                    if name == "SGHMC" or any(text in name for text in args.only)
                }  # fmt: skip
            steps = max(3, 40 // k)
            res = summary(time_sampling(target, variants, init, steps, 3, repeats))
            title = f"sampling, 784-40-40-10 MLP, K = {k}, batch 500"
            lines += [f"| {title} | ms/step | ratio to SGHMC |", "|---|---:|---:|"]
            lines += [f"| {n} | {ms:.1f} | {r:.2f}x |" for n, (ms, r) in res.items()]
            lines.append("")
            print("\n".join(lines[-len(res) - 3 :]), flush=True)
    if "meta" in args.parts:
        rows = ["| meta-training step (W = 5, fwd + bwd) | ms/step | ratio to SGHMC step |",
                "|---|---:|---:|"]  # fmt: skip
        target, init = mlp_target((20,), 20)
        times = time_meta(target, init, 10, 5, repeats, 0.00118, ("auto", "compiled"))
        for name, (ms, r) in summary(times).items():
            rows.append(f"| 784-20-10 MLP, K = 20, 10-unit nets: {name} | {ms:.1f} | {r:.2f}x |")
        toy, toy_init = toy_gaussian(50)
        times = time_meta(toy, toy_init, 40, 5, 3 * repeats, 0.025, ("compiled",))
        for name, (ms, r) in summary(times).items():
            rows.append(
                f"| toy 20-D Gaussian, K = 50, 40-unit nets: {name} | {ms:.2f} | {r:.2f}x |"
            )
        print("\n".join(rows), flush=True)
        lines += rows + [""]
    if "first-use" in args.parts:
        fu = first_use(args.threads)
        rows = [
            "| fresh process, empty compile cache, K = 4 | import + setup s | first step s "
            "| 30 steps s |",
            "|---|---:|---:|---:|",
            *(f"| {k} | {a:.1f} | {b:.1f} | {c:.1f} |" for k, (a, b, c) in fu.items()),
        ]
        print("\n".join(rows), flush=True)
        lines += rows + [""]
    load_after = os.getloadavg()
    command = ".venv/bin/python -m speed." + " ".join(
        [Path(__file__).stem, *map(shlex.quote, sys.argv[1:] if argv is None else argv)]
    )
    cpu = _cpu_model()
    described = __doc__.split("Usage::")[0].split("\n\n", 1)[1].strip()
    # (reStructuredText of the docstring -> Markdown)
    described = described.replace("``", "`").replace(":class:`~metasampler.", "`")
    body = f"""
{described}

Command: `{command}`

Machine: {cpu}, {os.cpu_count()} cores, {args.threads} torch thread(s), torch
{torch.__version__}, Python {platform.python_version()}; run {dt.date.today().isoformat()},
{repeats} rounds; load average {load_before[0]:.1f} before and {load_after[0]:.1f} after (other jobs
on the cores make absolute times noisy: ms/step is the median of a row's own blocks; the
interleaved ratios move less).

{chr(10).join(lines)}
"""
    if not args.quick:
        write_section(args.output, SECTION, body)
        print(f"wrote section to {args.output}")


if __name__ == "__main__":
    main()
