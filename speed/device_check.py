"""Device check: NNSGHMC's step paths, stationarity and speed on an accelerator.

CI and the test suite run on CPU only; this script is what runs on a machine with a CUDA GPU
(``device=cuda`` in every config). Each check prints ``PASS`` or ``FAIL``; the exit status is
1 if any failed.

1. ``paths``: 30 noise-free steps (temperature 0) of state-dependent nets on the device, by
   the eager step, the blocked step and the compiled step (ahead of time on a CPU, in
   process on a GPU), against the same steps in float64 on the CPU (one- and two-hidden-layer
   nets of the default softsign units and of quadsat units, exact and finite-difference Gamma,
   the momentum and stiffness curls); the options that only act with noise (the thermostat,
   leapfrog positions, the minibatch-noise estimate and its friction, the curl's
   preconditioner), 30 steps at temperature 1 on a target with gradient noise, by the three
   paths against each other on the device; and the meta-gradient of a 5-step unroll through
   the step compiled with autograd against plain autograd, both on the device in float64
   (with the thermostat too).
2. ``stationarity``: the test suite's check of state-dependent nets on its 5-D Gaussian, with
   20,000 chains on the device: the moments match with exact and finite-difference Gamma, and
   do not without Gamma; with gradient noise the sampler is not told, they match inside the
   thermostat and do not without it.
3. ``speed``: ms per step and ratio to SGHMC on the 784-40-40-10 MLP of
   ``bench_nnsghmc_overhead.py`` (batch 500; K = 20 and K = 200), interleaved rounds, each
   block ended by a device synchronisation.
4. ``first-use``: a fresh process with empty compile caches samples that MLP with the shipped
   floor sampler loaded with no flags (on a GPU: eager steps while a child process fills the
   compile's caches, then a compile in a background thread) and with SGHMC: seconds to the
   first step, to 30 steps and to all of them, and ms per step over the last 200
   (``--first-use-steps``: the run lengths, each at least 231). On a CPU a third row runs the
   floor sampler after ``python -m metasampler.prebuild`` filled the same empty cache (as
   ``scripts/setup.sh`` does), its build time not counted.

Usage (on the GPU machine, from the repository root)::

    python -m speed.device_check --device cuda            # every part
    python -m speed.device_check --device cpu --quick     # smoke run of the script itself
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from types import ModuleType

import torch

from metasampler.export import load_sampler
from metasampler.learned import NNSGHMC, fast
from metasampler.samplers import SGHMC
from speed.bench_nnsghmc_overhead import FLOOR, PRECONDITIONED, SHIPPED, mlp_target

ROOT = Path(__file__).resolve().parents[1]


def _test_harness() -> ModuleType:
    """The test suite's statistical harness, ``tests/statistical.py``, loaded from its file.

    ``tests/`` is not a package (an installed dependency ships a top-level ``tests``), so the
    module is loaded by path and registered as ``statistical``, as the test suite imports it.
    """
    path = ROOT / "tests" / "statistical.py"
    spec = importlib.util.spec_from_file_location("statistical", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the test harness {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("statistical", module)
    spec.loader.exec_module(module)
    return module


_harness = _test_harness()
check_moments, moments = _harness.check_moments, _harness.moments
random_gaussian, run_chains = _harness.random_gaussian, _harness.run_chains

FAILED: list[str] = []
GAMMAS = ("exact", "finite_difference", "none")

# (hidden widths, gamma, NNSGHMC keyword arguments) of the path check
PATH_CASES = [
    ((6,), "exact", dict(q_momentum_input=True)),
    ((6,), "finite_difference", dict(q_momentum_input=True)),
    ((5, 4), "exact", dict(q_momentum_input=True)),
    ((6,), "exact", dict(q_momentum_input=False, q_stiffness_input=True, activation="softsign")),
    ((6,), "finite_difference", dict(q_momentum_input=True, q_output="softplus", speed_limit=4.0)),
    ((5, 4), "finite_difference", dict(q_momentum_input=True, activation="quadsat")),
]


def report(name: str, ok: bool, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        FAILED.append(name)


def random_nets(hidden, gamma: str, scale: float = 2.0, **kwargs) -> NNSGHMC:
    """Random nets whose outputs vary strongly with their inputs (so Gamma matters)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = NNSGHMC(q_hidden=hidden, d_hidden=hidden, gamma=gamma, seed=1, **kwargs)
    with torch.no_grad():
        for p in sampler.parameters():
            p.mul_(scale)
    sampler.momentum_std.fill_(1.3)
    return sampler


def trajectory(sampler, path: str, target, init, n_steps: int, grad: bool = False):
    sampler.step_path = path
    gen = torch.Generator(device=init.device).manual_seed(2)
    with torch.set_grad_enabled(grad):
        state = sampler.init(init.clone(), target, gen)
        for _ in range(n_steps):
            state = sampler.step(state, target, gen)
    return state


PATH_BASE = dict(eta=0.03, beta_off=1.0, alpha=0.2, c=0.2, temperature=0.0)


# (hidden widths, gamma, NNSGHMC keyword arguments) of the noisy path check: the options whose
# state or arithmetic only shows with noise (the thermostat's xi stays 0 at T = 0), on a
# target with gradient noise
ESTIMATE = dict(q_momentum_input=True, grad_noise_estimate=True)
NOISY_PATH_CASES = [
    ((6,), "exact", dict(q_momentum_input=True, thermostat=True)),
    ((6,), "exact", dict(q_momentum_input=True, thermostat=True, leapfrog=True)),
    ((6,), "exact", ESTIMATE),
    ((6,), "finite_difference", dict(ESTIMATE, grad_noise_friction=True)),
    (
        (5, 4),
        "exact",
        dict(ESTIMATE, precondition_power=0.5, thermostat=True, activation="softsign"),
    ),
]
NOISY_BASE = dict(eta=0.03, beta_off=1.0, alpha=0.2, c=0.2, temperature=1.0)


def start_builds(device: torch.device, parts: list[str]) -> None:
    """On the CPU, two steps of every compiled configuration the parts use, by the default
    path: each starts its build in a child process, so all of them compile at once (a GPU
    compiles in process, when a step asks for it)."""
    if device.type != "cpu":
        return
    case = random_gaussian(dim=5)
    init = torch.randn(8, 5, generator=torch.Generator().manual_seed(1)).to(device)
    runs = []
    if "paths" in parts:
        runs += [random_nets(h, g, **PATH_BASE, **extra) for h, g, extra in PATH_CASES]
        runs += [random_nets(h, g, **NOISY_BASE, **extra) for h, g, extra in NOISY_PATH_CASES]
    if "stationarity" in parts:
        runs += [random_nets((16,), g, eta=0.03, beta_off=1.0, c=0.2) for g in GAMMAS]
    for sampler in runs:
        trajectory(sampler.to(device), "auto", case.target(), init, 2)
    if "speed" in parts:
        target, init = mlp_target((40, 40), 20, device=str(device))
        for sampler in speed_variants().values():
            if isinstance(sampler, NNSGHMC):
                sampler.use_compile = None  # (a background build; True would wait for it)
                trajectory(sampler.to(device), "auto", target, init, 2)


def check_paths(device: torch.device) -> None:
    case = random_gaussian(dim=5)
    target = case.target()
    init64 = torch.randn(8, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    init = init64.float().to(device)
    fast.wait_for_compiles()
    for hidden, gamma, extra in PATH_CASES:
        kwargs = {**PATH_BASE, **extra}
        name = f"paths {hidden} {gamma} {sorted(extra.items())}"
        ref = trajectory(random_nets(hidden, gamma, **kwargs).double(), "plain", target, init64, 30)
        for path in ("plain", "blocks", "compiled"):
            sampler = random_nets(hidden, gamma, compile=path == "compiled", **kwargs).to(device)
            try:
                got = trajectory(sampler, path, target, init, 30)
                err = float((got.theta.double().cpu() - ref.theta).abs().max())
                report(f"{name} {path}", err < 2e-3, f"max |theta - float64 CPU| = {err:.1e}")
            except Exception as exc:  # noqa: BLE001 (a check reports every failure)
                report(f"{name} {path}", False, f"{type(exc).__name__}: {exc}")
    check_noisy_paths(device, case)
    # meta-gradient: compiled with autograd against plain autograd, float64 on the device
    init = init64.to(device)
    for hidden, gamma, extra in [*PATH_CASES[:2], NOISY_PATH_CASES[0]]:
        kwargs = dict(eta=0.05, beta_off=0.5, alpha=0.2, c=0.1, **extra)
        sampler = random_nets(hidden, gamma, **kwargs).double().to(device)

        def meta_gradient(path: str, sampler=sampler):
            state = trajectory(sampler, path, target, init, 5, grad=True)
            loss = (state.theta**2).mean() + (state.momentum**3).mean()
            return torch.autograd.grad(loss, list(sampler.parameters()))

        name = f"meta-gradient {hidden} {gamma} {sorted(extra.items())}"
        try:
            expected, got = meta_gradient("plain"), meta_gradient("compiled")
            err = max(float((g - e).abs().max()) for g, e in zip(got, expected, strict=True))
            size = max(float(e.abs().max()) for e in expected)
            report(name, err <= 1e-9 * size + 1e-12, f"max error {err:.1e} (largest {size:.2e})")
        except Exception as exc:  # noqa: BLE001
            report(name, False, f"{type(exc).__name__}: {exc}")


def check_noisy_paths(device: torch.device, case) -> None:
    """With noise the float64 CPU reference draws other numbers than the device, so the eager,
    blocked and compiled steps are compared with each other on the device, from one seed."""
    target = case.target(2.0)
    init = torch.randn(8, 5, generator=torch.Generator().manual_seed(1)).to(device)
    for hidden, gamma, extra in NOISY_PATH_CASES:
        name = f"noisy paths {hidden} {gamma} {sorted(extra.items())}"
        kwargs = {**NOISY_BASE, **extra}
        states = {}
        for path in ("plain", "blocks", "compiled"):
            sampler = random_nets(hidden, gamma, compile=path == "compiled", **kwargs).to(device)
            try:
                states[path] = trajectory(sampler, path, target, init, 30)
            except Exception as exc:  # noqa: BLE001 (a check reports every failure)
                report(f"{name} {path}", False, f"{type(exc).__name__}: {exc}")
        if "plain" not in states:
            continue
        ref = states["plain"]
        for path in ("blocks", "compiled"):
            if path in states:
                err = float((states[path].theta - ref.theta).abs().max())
                ok = err < 2e-3 and bool(torch.isfinite(ref.theta).all())
                report(f"{name} {path}", ok, f"max |theta - plain step| = {err:.1e}")


def stationary_run(sampler, target, case, n_chains: int, var_rtol: float):
    """1,200 steps of ``n_chains`` chains on the device (300 burn-in, every 5th kept): their
    moments and whether they match the target's within the test suite's tolerances
    (tests/learned/test_nnsghmc.py)."""
    device = next(sampler.parameters()).device
    init = torch.randn(n_chains, 5, generator=torch.Generator().manual_seed(0)).to(device)
    kept = run_chains(sampler, target, n_chains, 1200, burn_in=300, thin=5, seed=0, init=init)
    try:
        check_moments(kept.theta, case.mean, case.cov, mean_atol=0.05, var_rtol=var_rtol)
        matched = True
    except AssertionError:
        matched = False
    return moments(kept.theta, case.mean, case.cov), matched


def check_stationarity(device: torch.device, n_chains: int) -> None:
    case = random_gaussian(dim=5)
    errors = {}
    for gamma in GAMMAS:
        sampler = random_nets((16,), gamma, scale=2.5, eta=0.03, beta_off=1.0, c=0.2).to(device)
        t0 = time.perf_counter()
        got, matched = stationary_run(sampler, case.target(), case, n_chains, var_rtol=0.07)
        errors[gamma] = got.max_var_error
        seconds = time.perf_counter() - t0
        if gamma == "none":  # the same nets without Gamma must fail the check
            report(f"stationarity without Gamma is biased ({device})", not matched, f"{got}")
        else:
            report(f"stationarity {gamma} ({device})", matched, f"{got} ({seconds:.0f} s)")
    # gradient noise N(0, 36) the sampler is not told: too hot without the thermostat, at the
    # target with it (a looser tolerance: the noise also reaches the nets' inputs)
    for thermostat in (False, True):
        sampler = random_nets(
            (16,), "exact", scale=2.5, eta=0.03, beta_off=1.0, c=0.2, thermostat=thermostat
        ).to(device)
        got, matched = stationary_run(sampler, case.target(6.0), case, n_chains, var_rtol=0.15)
        name = f"stationarity with unknown gradient noise, thermostat={thermostat} ({device})"
        report(name, matched == thermostat, f"{got}")
    print(f"largest variance errors: {errors}")


def speed_variants() -> dict:
    """SGHMC (also estimating the gradient noise's variance); the shipped MNIST samplers as
    loaded (no flags: the default path), the floor file also eager, with finite differences
    and with ``compile=True``, the preconditioned file estimating the noise; and untrained
    40-unit nets with ``compile=True``."""
    lr = 0.007
    eta = (lr / 5000) ** 0.5

    def nets(act: str, gamma: str) -> NNSGHMC:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return NNSGHMC(lr=lr, gamma=gamma, beta_off=1.0, c=1.0, activation=act,
                           q_hidden=(40,), d_hidden=(40,), compile=True)  # fmt: skip

    estimating = load_sampler(PRECONDITIONED)
    estimating.grad_noise_estimate = True
    variants = {
        "SGHMC": SGHMC(eta=eta, friction=1.0),
        "SGHMC, noise estimate": SGHMC(eta=eta, friction=1.0, grad_noise_estimate=True),
        "mnist_mlp (tanh), no flags": load_sampler(SHIPPED),
        "mnist_mlp_floor_softsign exact, no flags": load_sampler(FLOOR),
        "mnist_mlp_floor_softsign exact, eager": load_sampler(FLOOR),
        "mnist_mlp_floor_softsign exact, compile=True": load_sampler(FLOOR),
        "mnist_mlp_floor_softsign FD, compile=True": load_sampler(FLOOR, gamma="finite_difference"),
        "mnist_mlp_positive_preconditioned, noise estimate, no flags": estimating,
        "40-unit softsign exact, compile=True": nets("softsign", "exact"),
        "40-unit softsign FD, compile=True": nets("softsign", "finite_difference"),
    }
    variants["mnist_mlp_floor_softsign exact, eager"].use_compile = False
    variants["mnist_mlp_floor_softsign exact, compile=True"].use_compile = True
    variants["mnist_mlp_floor_softsign FD, compile=True"].use_compile = True
    return variants


def check_speed(
    device: torch.device, chains: list[int], rounds: int, steps: int, eager: bool = False
) -> None:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    samplers = speed_variants()
    if eager:  # no compile: the shipped sampler and the 40-unit softsign nets, eager
        samplers = {
            k.removesuffix(", compile=True"): v
            for k, v in samplers.items()
            if k.startswith(("SGHMC", "40-unit softsign")) or k.endswith(("eager", "no flags"))
        }
        for sampler in samplers.values():
            sampler.use_compile = False
    for s in samplers.values():
        if isinstance(s, NNSGHMC):
            s.to(device)
    for n_chains in chains:
        target, init = mlp_target((40, 40), n_chains, device=str(device))
        gens = {name: torch.Generator(device=device).manual_seed(1) for name in samplers}
        times: dict[str, list[float]] = {name: [] for name in samplers}
        with torch.no_grad():
            states = {n: s.init(init.clone(), target, gens[n]) for n, s in samplers.items()}
            for name, s in samplers.items():  # warm-up: the compiles
                for _ in range(3):
                    states[name] = s.step(states[name], target, gens[name])
            fast.wait_for_compiles()
            for rnd in range(rounds + 1):
                for name, s in samplers.items():
                    state = states[name]
                    sync()
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        state = s.step(state, target, gens[name])
                    sync()
                    if rnd > 0:  # round 0 runs each compiled step once after its load
                        times[name].append((time.perf_counter() - t0) / steps * 1e3)
                    states[name] = state
        ref = times["SGHMC"]
        print(f"\nspeed on {device}, 784-40-40-10 MLP, K = {n_chains}, batch 500 "
              f"({rounds} rounds x {steps} steps)")  # fmt: skip
        print("| variant | ms/step | ratio to SGHMC |\n|---|---:|---:|")
        for name, t in times.items():
            ratio = statistics.median(a / b for a, b in zip(t, ref, strict=True))
            print(f"| {name} | {statistics.median(t):.2f} | {ratio:.2f}x |")
        finite = all(torch.isfinite(st.theta).all() for st in states.values())
        report(f"speed run K = {n_chains} stayed finite", bool(finite), "")


FIRST_USE = """
import sys, time, torch
t0 = time.perf_counter()
from speed.bench_nnsghmc_overhead import mlp_target, FLOOR
from metasampler.export import load_sampler
from metasampler.samplers import SGHMC
device = torch.device({device!r})
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
target, init = mlp_target((40, 40), 20, device=str(device))
s = load_sampler(FLOOR).to(device) if sys.argv[1] == "nnsghmc" else SGHMC(lr=0.007, friction=1.0)
g = torch.Generator(device=device).manual_seed(0)
marks, switch = [], []
from metasampler.learned import fast
from torch._dynamo.utils import counters
compiled = fast.run_compiled_in_process
def spy(*a):  # (when the steps switched to the compiled step)
    if not switch:
        switch.append((i + 1, time.perf_counter() - t1))
    return compiled(*a)
fast.run_compiled_in_process = spy
from metasampler.learned import aot
loaded, load = [], aot._load
def load_spy(*a):  # (when the ahead-of-time package was loaded, on a CPU)
    loaded.append((i + 1, time.perf_counter() - t1))
    return load(*a)
aot._load = load_spy
with torch.no_grad():
    state = s.init(init, target, g)
    sync(); t1 = time.perf_counter()
    for i in range({steps}):
        state = s.step(state, target, g)
        if i + 1 in (1, 30, {steps} - 200, {steps}):
            sync(); marks.append(time.perf_counter())
aot.stop_builds()  # (a build still running would load the cores during the next measurement)
if sys.argv[1] == "nnsghmc":
    package = "step %d at %.1f s" % loaded[0] if loaded else "never"
    print(f"first-use: the ahead-of-time package was loaded before {{package}}", file=sys.stderr)
    where = "step %d at %.1f s" % switch[0] if switch else "never"
    print(f"first-use: the in-process compiled step ran from {{where}}; this process's "
          f"inductor cache hits {{counters['inductor']['fxgraph_cache_hit']}}, misses "
          f"{{counters['inductor']['fxgraph_cache_miss']}}", file=sys.stderr)
print(f"{{t1 - t0:.2f}} {{marks[0] - t1:.2f}} {{marks[1] - t1:.2f}} {{marks[3] - t1:.2f}} "
      f"{{(marks[3] - marks[2]) / 200 * 1e3:.2f}}")
"""


def check_first_use(device: torch.device, steps: int) -> None:
    """A fresh process with empty compile caches, the shipped floor sampler loaded with no
    flags against SGHMC: seconds to set up, to the first step, to 30 steps and to ``steps``,
    and ms per step over the last 200 (after any compile)."""
    import os
    import subprocess
    import tempfile

    print(f"\nfirst use on {device}, fresh process, empty caches, 784-40-40-10 MLP, K = 20")
    print("| sampler | setup s | first step s | 30 steps s | all steps s | last 200: ms/step |")
    print("|---|---:|---:|---:|---:|---:|")
    runs = [("sghmc", False), ("nnsghmc", False)]
    if device.type == "cpu":  # (prebuild builds CPU packages only)
        runs.append(("nnsghmc", True))
    for sampler, prebuilt in runs:
        kind = f"{sampler}, prebuilt" if prebuilt else sampler
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "METASAMPLER_CACHE_DIR": cache}
            env["TRITON_CACHE_DIR"] = cache
            env["TMPDIR"] = cache  # (inductor keeps its precompiled headers there)
            env.pop("METASAMPLER_COMPILE", None)
            if prebuilt:  # (what scripts/setup.sh does, in another process)
                command = [sys.executable, "-m", "metasampler.prebuild", str(FLOOR)]
                subprocess.run(command, env=env, capture_output=True, cwd=ROOT, check=True)
            code = FIRST_USE.format(device=str(device), steps=steps)
            done = subprocess.run(
                [sys.executable, "-c", code, sampler], env=env, capture_output=True, text=True,
                cwd=ROOT,
            )  # fmt: skip
            if done.returncode != 0:
                report(f"first use {kind}", False, done.stderr.strip().splitlines()[-1])
                continue
            figures = done.stdout.split()[-5:]
            print(f"| {kind} (all {steps} steps) | " + " | ".join(figures) + " |", flush=True)
            for line in done.stderr.splitlines():  # (the package's notices)
                if line.startswith(("metasampler:", "first-use:")):
                    print(f"  {kind} said: {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--parts", nargs="+", default=["paths", "stationarity", "speed", "first-use"]
    )
    parser.add_argument("--quick", action="store_true", help="few chains, rounds and steps")
    parser.add_argument("--eager", action="store_true", help="speed: no compiled variants")
    parser.add_argument("--chains", type=int, nargs="+", default=None, help="speed: the Ks")
    parser.add_argument(
        "--first-use-steps", type=int, nargs="+", default=None, help="first-use: run lengths"
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()
    print(f"torch {torch.__version__}, device {device} ({name})")
    reason = fast.compile_unavailable(device)
    print(f"compiled step: {'available' if reason is None else reason}", flush=True)
    start_builds(device, args.parts)
    if "paths" in args.parts:
        check_paths(device)
    if "stationarity" in args.parts:
        check_stationarity(device, 1000 if args.quick else 20_000)
    if "speed" in args.parts:
        chains = args.chains or ([20] if args.quick else [20, 200])
        check_speed(device, chains, 2 if args.quick else 5, 3 if args.quick else 20, args.eager)
    if "first-use" in args.parts:
        for steps in args.first_use_steps or [300 if args.quick else 2000]:
            check_first_use(device, steps)
    print(f"\n{len(FAILED)} check(s) failed: {FAILED}" if FAILED else "\nall checks passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
