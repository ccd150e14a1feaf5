"""NNSGHMC speed against SGHMC: sampling steps, meta-training steps, first use.

All ratios are measured in one run, interleaved: timed blocks of each variant follow each
other round by round (SGHMC, variant A, variant B, SGHMC, ...), so load from other jobs on a
shared machine hits all alike; a ratio is the median over rounds of block time / the same
round's SGHMC block time.

* ``sampling``: a 784-40-40-10 ReLU MLP :class:`~metasampler.BayesianModel` (D = 33,450),
  minibatch 500 of ``N = 5000`` random MNIST-shaped inputs, K = 20 chains, steps under
  ``torch.no_grad()`` as ``metasampler.sample`` runs them. Variants: the shipped MNIST
  sampler (``pretrained/mnist_mlp.safetensors``, 10-unit nets) loaded with no flags (exact
  Gamma, and ``gamma="finite_difference"``), the same forced eager (``use_compile=False``),
  the shipped sampler of the new MNIST recipe (``mnist_mlp_transfer``: a curl ``Q_f(U)``
  without the momentum input, so one net per coordinate instead of three), the 0-4 sampler
  with the stiffness input (``mnist_mlp_0to4_stiffness``: ``Q_f(U, s_i)``, two nets per
  coordinate), ``mnist_mlp_stiffness_softsign`` (the same layout, trained on all digits with
  ``softsign`` units), ``mnist_mlp_floor_softsign`` (the shipped file's layout, ``f_Q(U, p)``
  and ``f_D(U, p, g)`` of 10 units, with ``softsign`` units, exact and FD),
  ``mnist_mlp_floor_5units`` (the same recipe with 5-unit nets, exact and FD),
  ``mnist_mlp_floor_positive`` (the same layout with a softplus curl output and the curl's
  speed limit, exact and FD; and exact with ``thermostat``, mSGNHT's thermostat around the
  learned step, and with ``leapfrog``, its positions the midpoints of the gradient points),
  ``mnist_mlp_positive_preconditioned`` (that file with the
  curl's stiffness preconditioner, exact Gamma only; and with ``grad_noise_estimate``: the
  gradient noise's variance estimated from the minibatch's halves, as SGHMC's next to it;
  and with its gradient statistic fixed, ``stiffness_freeze_after``),
  and untrained
  nets of 10 and 40 units (``NNSGHMC(q_hidden=(40,), d_hidden=(40,))`` is the default)
  with the ``softsign`` activation ``a / (1 + |a|)`` (one division per unit; the default
  activation) and 40 units with ``tanh`` (its rational form of eleven
  coefficients; the default before). The warm-up waits for the background compiles, so the
  timed steps are the steady state.
* ``meta``: one unrolled meta-training window (W = 5 steps with autograd, then the backward
  of a loss on the final state) per block, divided by W, against an SGHMC sampling step:
  784-20-10 MLP (D = 15,910), K = 20, batch 500, 10-unit nets; and the 20-D toy Gaussian,
  K = 50, 40-unit nets; tanh units unless the row says softsign. Variants: the default
  (autograd through the step function), the recomputing backward
  (``step_path="recompute"``) and the compiled step (``step_path="compiled"``, what
  ``train.compile_steps`` selects: the step compiled without recording and its compiled
  ``torch.func.vjp`` over chunks of coordinates on the MLP rows with per-coordinate nets,
  ``torch.compile`` with autograd on the others; its compile falls in the untimed warm-up
  round); the last two again with the energy-only curl ``Q_f(U)``
  (``q_momentum_input=False``, as ``configs/mnist_mlp_transfer.yaml`` trains), and the
  compiled one with the stiffness input ``Q_f(U, s_i)`` (``q_stiffness_input=True``), and
  compiled with ``softsign`` units (default curl, and the stiffness input).
* ``first-use``: a fresh process with empty compile caches (``TORCHINDUCTOR_CACHE_DIR``,
  ``METASAMPLER_CACHE_DIR`` and ``TMPDIR``, where inductor keeps precompiled headers,
  pointing to a new directory) runs 30 steps of the shipped sampler
  on the MLP, against 30 SGHMC steps in another fresh process.

Usage::

    .venv/bin/python -m speed.bench_nnsghmc_overhead             # all, writes BENCHMARKS.md
    .venv/bin/python -m speed.bench_nnsghmc_overhead --quick     # smoke run, prints only
    .venv/bin/python -m speed.bench_nnsghmc_overhead --quick --parts sampling --threads 2 \
        --only floor_5units floor_softsign "40-unit softsign"   # some rows, two threads

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
SHIPPED = ROOT / "pretrained" / "mnist_mlp.safetensors"
TRANSFER = ROOT / "pretrained" / "mnist_mlp_transfer.safetensors"  # energy-only curl
STIFFNESS = ROOT / "pretrained" / "mnist_mlp_0to4_stiffness.safetensors"  # Q_f(U, s_i)
SOFTSIGN = ROOT / "pretrained" / "mnist_mlp_stiffness_softsign.safetensors"  # the same, softsign
FLOOR = ROOT / "pretrained" / "mnist_mlp_floor_softsign.safetensors"  # Q_f(U, p_i), softsign
FLOOR5 = ROOT / "pretrained" / "mnist_mlp_floor_5units.safetensors"  # the same with 5-unit nets
POSITIVE = ROOT / "pretrained" / "mnist_mlp_floor_positive.safetensors"  # Q_f >= 0, speed limit
# the same with the curl's stiffness preconditioner (exact Gamma only)
PRECONDITIONED = ROOT / "pretrained" / "mnist_mlp_positive_preconditioned.safetensors"


def mlp_target(hidden: tuple[int, ...], n_chains: int = 20, device: str = "cpu"):
    torch.manual_seed(0)
    widths = [784, *hidden, 10]
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    g = torch.Generator().manual_seed(0)
    x = torch.rand(5000, 784, generator=g)
    y = torch.randint(0, 10, (5000,), generator=g)
    module = nn.Sequential(*layers[:-1])
    target = BayesianModel(module, (x, y), "categorical", batch_size=500, device=device)
    return target, target.init_positions(n_chains, g).to(device)


def sampling_variants() -> dict:
    lr = 0.007
    eta = (lr / 5000) ** 0.5
    eager = load_sampler(SHIPPED)
    eager.use_compile = False
    nets = {  # (hidden units, activation): untrained nets of the shipped file's layout
        (h, act, g): dict(lr=lr, gamma=g, beta_off=1.0, c=1.0, activation=act, q_hidden=(h,),
                          d_hidden=(h,))
        for h in (10, 40) for act in ("tanh", "softsign") for g in ("exact", "finite_difference")
    }  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = {key: NNSGHMC(**kwargs) for key, kwargs in nets.items()}
    estimating = load_sampler(PRECONDITIONED)
    estimating.grad_noise_estimate = True
    frozen = load_sampler(PRECONDITIONED)
    frozen.stiffness_freeze_after = 1  # the statistic fixed from the second step on
    thermostat = load_sampler(POSITIVE)
    thermostat.thermostat = True  # mSGNHT's thermostat around the learned step
    leapfrog = load_sampler(POSITIVE)
    leapfrog.leapfrog = True  # the midpoints of the gradient points
    return {
        "SGHMC": SGHMC(eta=eta, friction=1.0),
        "SGHMC, noise estimate": SGHMC(eta=eta, friction=1.0, grad_noise_estimate=True),
        "shipped exact": load_sampler(SHIPPED),
        "shipped FD": load_sampler(SHIPPED, gamma="finite_difference"),
        "shipped exact, eager": eager,
        "mnist_mlp_transfer exact": load_sampler(TRANSFER),
        "mnist_mlp_transfer FD": load_sampler(TRANSFER, gamma="finite_difference"),
        "stiffness input exact": load_sampler(STIFFNESS),
        "mnist_mlp_stiffness_softsign exact": load_sampler(SOFTSIGN),
        "mnist_mlp_floor_softsign exact": load_sampler(FLOOR),
        "mnist_mlp_floor_softsign FD": load_sampler(FLOOR, gamma="finite_difference"),
        "mnist_mlp_floor_5units exact": load_sampler(FLOOR5),
        "mnist_mlp_floor_5units FD": load_sampler(FLOOR5, gamma="finite_difference"),
        "mnist_mlp_floor_positive exact": load_sampler(POSITIVE),
        "mnist_mlp_floor_positive FD": load_sampler(POSITIVE, gamma="finite_difference"),
        "mnist_mlp_floor_positive exact, thermostat": thermostat,
        "mnist_mlp_floor_positive exact, leapfrog": leapfrog,
        "mnist_mlp_positive_preconditioned exact": load_sampler(PRECONDITIONED),
        "mnist_mlp_positive_preconditioned exact, noise estimate": estimating,
        "mnist_mlp_positive_preconditioned exact, V fixed": frozen,
        "10-unit softsign exact": built[10, "softsign", "exact"],
        "10-unit softsign FD": built[10, "softsign", "finite_difference"],
        "40-unit tanh exact": built[40, "tanh", "exact"],
        "40-unit tanh FD": built[40, "tanh", "finite_difference"],
        "40-unit softsign (default) exact": built[40, "softsign", "exact"],
        "40-unit softsign (default) FD": built[40, "softsign", "finite_difference"],
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


def time_meta(target, init, hidden: int, window: int, repeats: int, eta: float):
    """ms per unrolled step (forward + backward / W) of each path, and SGHMC's sampling step."""
    samplers = {"SGHMC": SGHMC(eta=eta, friction=1.0)}
    # (path, momentum input, stiffness input, activation)
    variants = [("auto", True, False, "tanh"), ("recompute", True, False, "tanh")]
    variants += [("compiled", True, False, "tanh"), ("auto", False, False, "tanh")]
    variants += [("compiled", False, False, "tanh")]  # the curl Q_f(U)
    variants += [("compiled", False, True, "tanh")]  # Q_f(U, s_i): the stiffness input
    variants += [("compiled", True, False, "softsign"), ("compiled", False, True, "softsign")]
    names = {(True, False): "", (False, False): ", curl Q_f(U)", (False, True): ", curl Q_f(U, s)"}
    for path, momentum_input, stiffness_input, activation in variants:
        s = NNSGHMC(
            eta=eta, q_hidden=(hidden,), d_hidden=(hidden,), beta_off=1.0, c=1.0,
            q_momentum_input=momentum_input, q_stiffness_input=stiffness_input,
            activation=activation,
        )  # fmt: skip
        s.step_path = path
        suffix = "" if activation == "tanh" else f", {activation} units"
        samplers[f"meta {path}" + names[momentum_input, stiffness_input] + suffix] = s
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
from speed.bench_nnsghmc_overhead import mlp_target, SHIPPED
from metasampler.export import load_sampler
from metasampler.samplers import SGHMC
target, init = mlp_target((40, 40))
s = load_sampler(SHIPPED) if sys.argv[1] == "nnsghmc" else SGHMC(lr=0.007, friction=1.0)
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
print(f"{{t1 - t0:.2f}} {{t2 - t1:.2f}} {{t3 - t1:.2f}}")
"""


def first_use(threads: int) -> dict[str, list[float]]:
    out = {}
    for kind in ("sghmc", "nnsghmc"):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "OMP_NUM_THREADS": str(threads),
                   "METASAMPLER_CACHE_DIR": cache, "TMPDIR": cache}  # fmt: skip
            env.pop("METASAMPLER_COMPILE", None)
            code = FIRST_USE.format()  # (run from the repository root: cwd=ROOT)
            done = subprocess.run(
                [sys.executable, "-c", code, kind], env=env, capture_output=True, text=True,
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few rounds, nothing written")
    parser.add_argument("--parts", nargs="+", default=["sampling", "meta", "first-use"])
    parser.add_argument("--repeats", type=int, default=None)
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
    repeats = args.repeats or (2 if args.quick else 7)
    load_before = os.getloadavg()
    lines = []
    if "sampling" in args.parts:
        target, init = mlp_target((40, 40))
        variants = sampling_variants()
        if args.only:
            variants = {
                name: s for name, s in variants.items()
                if name == "SGHMC" or any(text in name for text in args.only)
            }  # fmt: skip
        res = summary(time_sampling(target, variants, init, 5, 3, repeats))
        title = f"sampling, 784-40-40-10 MLP, K = 20, batch 500, {args.threads} thread(s)"
        lines += [f"| {title} | ms/step | ratio to SGHMC |",
                  "|---|---:|---:|"]  # fmt: skip
        lines += [f"| {n} | {ms:.1f} | {r:.2f}x |" for n, (ms, r) in res.items()]
        lines.append("")
        print("\n".join(lines), flush=True)
    if "meta" in args.parts:
        rows = ["| meta-training step (W = 5, fwd + bwd) | ms/step | ratio to SGHMC step |",
                "|---|---:|---:|"]  # fmt: skip
        target, init = mlp_target((20,))
        for name, (ms, r) in summary(time_meta(target, init, 10, 5, repeats, 0.00118)).items():
            rows.append(f"| 784-20-10 MLP, K = 20, 10-unit nets: {name} | {ms:.1f} | {r:.2f}x |")
        toy, toy_init = toy_gaussian(50)
        for name, (ms, r) in summary(time_meta(toy, toy_init, 40, 5, 3 * repeats, 0.025)).items():
            rows.append(
                f"| toy 20-D Gaussian, K = 50, 40-unit nets: {name} | {ms:.2f} | {r:.2f}x |"
            )
        print("\n".join(rows), flush=True)
        lines += rows + [""]
    if "first-use" in args.parts:
        fu = first_use(args.threads)
        rows = [
            "| fresh process, empty compile cache | import + setup s | first step s | 30 steps s |",
            "|---|---:|---:|---:|",
            *(f"| {k} | {a:.1f} | {b:.1f} | {c:.1f} |" for k, (a, b, c) in fu.items()),
        ]
        print("\n".join(rows), flush=True)
        lines += rows + [""]
    load_after = os.getloadavg()
    command = ".venv/bin/python -m speed." + " ".join(
        [Path(__file__).stem, *map(shlex.quote, sys.argv[1:] if argv is None else argv)]
    )
    body = f"""
{__doc__.split("Usage::")[0].strip()}

Command: `{command}`

Machine: {os.cpu_count()} CPU cores ({platform.machine()}), one torch thread, torch
{torch.__version__}, Python {platform.python_version()}; run {dt.date.today().isoformat()},
{repeats} rounds; load average {load_before[0]:.1f} before and {load_after[0]:.1f} after (other jobs
on the cores make absolute times noisy; the interleaved ratios less so).

{chr(10).join(lines)}
"""
    if not args.quick:
        write_section(args.output, SECTION, body)
        print(f"wrote section to {args.output}")


if __name__ == "__main__":
    main()
