"""The compiled NNSGHMC step, built ahead of time in a child process (AOTInductor).

The compiled step is :func:`~metasampler.learned.equations.nnsghmc_update` itself, exported
with :func:`torch.export.export` and compiled by AOTInductor into a package file: one fused
loop over the coordinates. It is built in a **child process**, not a thread of the user's
process: tracing holds the interpreter lock, and a compile thread starved the user's eager
steps (a 36-46 s first step, ``BENCHMARKS.md``). While the child builds, the user's steps run
eagerly at full speed; the package is loaded (milliseconds) as soon as it is there, and the next
process with the same configuration loads it at once.

A package is keyed by everything it bakes in: the step's switches, the nets' widths, which
optional inputs are present, dtype, device, thread count, the CPU, the torch and Python
versions and a hash of the source files whose code it contains, so an upgrade never loads a
stale kernel.
Packages live in ``$METASAMPLER_CACHE_DIR`` (default ``~/.cache/metasampler/compiled``). The
SHA-256 written beside each one is checked before loading: a truncated or altered file is
deleted and rebuilt, never loaded.

One build per configuration per machine: a build holds an exclusive lock on ``<key>.lock`` in
the cache directory (``fcntl.flock``; the system releases it when the build ends or is
killed). A process that finds the lock held says that another process is compiling, runs
eager steps meanwhile and loads the package once the lock is released (``compile=True``
waits for it); it never starts a second build. If that build ended without a package
(killed), the next process to look takes the lock and builds; if it failed (it leaves
``<key>.failed``), the step stays eager with the reason from its log. A process forked while
its parent builds treats that build as another process's. A build outlives the process that
started it: when the user's script ends first, the build finishes its package, which the
next process loads (:func:`stop_builds` ends this process's builds instead).

:func:`main` builds one package from ``SPEC_JSON PACKAGE`` (what the child runs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
from torch import Tensor

from ..files import atomic_write_text
from .equations import SCALARS, StepArgs, StepConfig, nnsghmc_update
from .vector_division import fast_float_division

try:
    import fcntl
except ImportError:  # (not POSIX: builds are not coordinated across processes)
    fcntl = None

__all__ = [
    "KernelSpec", "cache_dir", "call_flat", "flat_inputs", "run", "step_from_flat", "stop_builds",
    "wait_for_builds",
]  # fmt: skip

CACHE_ENV = "METASAMPLER_CACHE_DIR"
# The files whose code a package contains: a change to any of them gives new keys.
_SOURCES = ("equations.py", "nets.py", "aot.py", "vector_division.py", "../integrators.py")
# Example sizes for export: K != D and both > 1, so neither is specialised to a constant, and
# as large as a real problem: inductor sizes the loop's threads from them. With 3 x 7 a step
# for 2 threads compiled to a loop on one (10-unit floor step, 784-40-40-10 MLP, K = 20:
# 6.9-8.0 ms per call against 3.9-4.4 ms with these sizes; research/BENCHMARKS_HISTORY.md).
_EXAMPLE_K, _EXAMPLE_D = 20, 4099


@dataclass(frozen=True)
class KernelSpec:
    """What one compiled package bakes in (its inputs are tensors of any ``(K, D)``)."""

    cfg: StepConfig
    # The shape of every weight and bias, as `_net_tensors` lists them: export bakes them in,
    # and the compiled package does not check them when called.
    q_shapes: tuple[tuple[int, ...], ...]
    d_shapes: tuple[tuple[int, ...], ...]
    dtype: str
    device: str
    prior: bool
    noise: bool
    cache: bool
    threads: int
    stiffness: bool = False

    @classmethod
    def of(cls, args: StepArgs) -> KernelSpec:
        """The package a step with these arguments needs."""
        return cls(
            cfg=args.cfg,
            q_shapes=tuple(tuple(t.shape) for t in _net_tensors(args.q_net)),
            d_shapes=tuple(tuple(t.shape) for t in _net_tensors(args.d_net)),
            dtype=str(args.p.dtype).removeprefix("torch."),
            device=args.p.device.type,
            prior=args.prior_grad is not None,
            noise=args.noise is not None,
            cache=args.cache is not None,
            threads=torch.get_num_threads(),
            stiffness=args.stiffness is not None,
        )

    def to_json(self) -> str:
        """These fields as canonical JSON (sorted keys): the child build's argument."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> KernelSpec:
        raw = json.loads(text)
        raw["cfg"] = StepConfig(**raw["cfg"])
        for name in ("q_shapes", "d_shapes"):
            raw[name] = tuple(tuple(shape) for shape in raw[name])
        return cls(**raw)

    @functools.cache  # noqa: B019 (few specs per process; reads the source files once)
    def digest(self) -> str:
        """The package's cache key."""
        h = hashlib.sha256(self.to_json().encode())
        h.update(f"{torch.__version__} {sys.version} {_cpu_identity()}".encode())
        here = Path(__file__).parent
        for name in _SOURCES:
            h.update((here / name).read_bytes())
        return h.hexdigest()[:32]


@functools.cache
def _cpu_identity() -> str:
    """The CPU a package's kernel is compiled for (``-march=native``): architecture, torch's
    vector capability and, on Linux, the model name, so that a cache directory shared by
    machines with different CPUs never hands one a kernel built for another."""
    model = ""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as info:
            model = next((line for line in info if line.startswith("model name")), "").strip()
    return f"{platform.machine()} {torch.backends.cpu.get_cpu_capability()} {model}"


# -- the flat calling convention of a package ----------------------------------------------
def _net_tensors(net) -> list[Tensor]:
    layers, head = net
    return [t for pair in (*layers, head) for t in pair]


def _n_layers(shapes: tuple[tuple[int, ...], ...]) -> int:
    return (len(shapes) - 2) // 2  # (weight, bias) per hidden layer, then the head's pair


def _net_from(it: Iterator[Tensor], n_layers: int):
    layers = tuple((next(it), next(it)) for _ in range(n_layers))
    return layers, (next(it), next(it))


def _energy_per_chain(spec: KernelSpec) -> bool:
    """Whether the energy input enters as ``(K, 1)`` rather than expanded to ``(K, D)``.

    With an energy-only curl ``Q_f(U)`` a ``(K, 1)`` energy lets ``f_Q`` run once per chain
    instead of once per coordinate (784-40-40-10 MLP, K = 20, 10-unit nets: 21 -> 14 ms per
    compiled step). When the curl also takes the momentum, the energy feeds per-coordinate
    units anyway and a ``(K, 1)`` operand splits the fused loop, storing every hidden unit
    (26 -> 66 ms), so it is expanded; so it is when the curl takes the stiffness."""
    return curl_per_chain(spec.cfg, spec.stiffness)


def curl_per_chain(cfg: StepConfig, stiffness: bool) -> bool:
    """Whether ``Q_f`` is one number per chain: it sees neither ``p`` nor a per-coordinate
    stiffness (as an input or through the preconditioner, ``stiffness``)."""
    return not (cfg.curl_momentum or stiffness)


def energy_index(spec: KernelSpec) -> int:
    """Where the energy input sits in :func:`flat_inputs` (after theta, p, grad, prior_grad)."""
    return 3 + spec.prior


def n_coordinate_inputs(spec: KernelSpec) -> int:
    """How many leading entries of :func:`flat_inputs` are coordinate (or per-chain energy)
    tensors; the scalars and the nets' weights follow them."""
    coords = spec.noise + 4 * spec.cache + spec.stiffness + spec.cfg.thermostat
    return energy_index(spec) + 1 + coords


def carried(cache: tuple | None, xi: Tensor | None) -> tuple[Tensor, ...]:
    """What a step hands the next one besides ``theta`` and ``p``, as flat outputs: the
    finite-difference cache's last three entries (its first is the energy input, which the
    caller has) and the thermostat."""
    return (() if cache is None else tuple(cache[1:])) + (() if xi is None else (xi,))


def uncarried(cfg: StepConfig, flat: tuple, energy: Tensor) -> tuple:
    """The inverse of :func:`carried`: ``(cache, xi)`` in :func:`nnsghmc_update`'s form
    (``energy``: the cache's first entry, the energy input as passed)."""
    cache = (energy, *flat[:3]) if cfg.gamma == "finite_difference" else None
    return cache, (flat[-1] if cfg.thermostat else None)


def flat_inputs(args: StepArgs, spec: KernelSpec) -> list[Tensor]:
    """The package's inputs: coordinate tensors ``(K, D)``, the energy input ``(K, 1)`` or
    expanded (:func:`_energy_per_chain`), the scalars as one tensor (a float would be baked
    in), then the nets' weights."""
    p = args.p

    def energy(x: Tensor) -> Tensor:  # (constant along the coordinates)
        if _energy_per_chain(spec):
            return x[..., :1]
        return x.expand(p.shape).contiguous() if x.shape != p.shape else x

    flat = [args.theta, p, args.grad]
    flat += [args.prior_grad] if spec.prior else []
    flat += [energy(args.u)]
    flat += [args.noise] if spec.noise else []
    flat += [energy(args.cache[0]), *args.cache[1:]] if spec.cache else []
    flat += [args.stiffness] if spec.stiffness else []
    flat += [args.xi] if spec.cfg.thermostat else []
    # The package assumes dense row-major inputs and does not check: an expanded view (e.g.
    # the cached Q_f of an energy-only curl) would be read as the wrong numbers.
    flat = [x.contiguous() for x in flat]
    flat.append(torch.tensor([float(args.v[k]) for k in SCALARS], dtype=p.dtype, device=p.device))
    return flat + [t.contiguous() for t in (*_net_tensors(args.q_net), *_net_tensors(args.d_net))]


def step_from_flat(spec: KernelSpec, *flat: Tensor) -> tuple[Tensor, ...]:
    """:func:`nnsghmc_update` on :func:`flat_inputs`; returns ``(theta, p, check)`` and what
    the step carries to the next (:func:`carried`)."""
    it = iter(flat)
    theta, p, grad = next(it), next(it), next(it)
    prior_grad = next(it) if spec.prior else None
    u = next(it)
    noise = next(it) if spec.noise else None
    cache = tuple(next(it) for _ in range(4)) if spec.cache else None
    stiffness = next(it) if spec.stiffness else None
    xi = next(it) if spec.cfg.thermostat else None
    v = dict(zip(SCALARS, next(it).unbind(0), strict=True))
    q_net = _net_from(it, _n_layers(spec.q_shapes))
    d_net = _net_from(it, _n_layers(spec.d_shapes))
    out = nnsghmc_update(
        theta, p, grad, prior_grad, u, noise, cache, q_net, d_net, v, spec.cfg, stiffness, xi,
    )  # fmt: skip
    return out[:3] + carried(out[3], out[4])


class _Step(torch.nn.Module):
    def __init__(self, spec: KernelSpec) -> None:
        super().__init__()
        self.spec = spec

    def forward(self, *flat: Tensor) -> tuple[Tensor, ...]:
        return step_from_flat(self.spec, *flat)


def _example_inputs(spec: KernelSpec) -> tuple[list[Tensor], list[dict | None]]:
    """Inputs of the right structure for export, and their dynamic dimensions: ``K`` and
    ``D`` of every coordinate tensor (``K`` alone for a per-chain energy input)."""
    dtype, device = getattr(torch, spec.dtype), torch.device(spec.device)
    gen = torch.Generator().manual_seed(0)
    k, d = torch.export.Dim("K", min=2), torch.export.Dim("D", min=2)
    flat, dims = [], []

    def add(shape: tuple[int, ...], dynamic: dict | None = None) -> None:
        flat.append(torch.randn(shape, generator=gen, dtype=dtype).to(device))
        dims.append(dynamic)

    def coords(n: int) -> None:
        for _ in range(n):
            add((_EXAMPLE_K, _EXAMPLE_D), {0: k, 1: d})

    def energy() -> None:
        if _energy_per_chain(spec):
            add((_EXAMPLE_K, 1), {0: k})
        else:
            coords(1)

    coords(energy_index(spec))  # theta, p, grad (, prior_grad)
    energy()
    coords(spec.noise)
    if spec.cache:
        energy()
        coords(3)
    coords(spec.stiffness)
    coords(spec.cfg.thermostat)
    add((len(SCALARS),))
    flat[-1] = flat[-1].abs() + 0.5  # (positive scalars, e.g. eta)
    for shape in (*spec.q_shapes, *spec.d_shapes):
        add(shape)
    return flat, dims


# Inductor settings for the step's loop (784-40-40-10 MLP, K = 20, one thread, compiled
# step alone). Multiply-adds contracted to FMAs (off by default, for bitwise agreement with
# eager; the step's tests compare paths to float tolerance): 40-unit softsign nets 14.7 -> 12.2
# ms exact, 11.9 -> 11.1 ms FD; shipped `mnist_mlp` 8.8 -> 7.2 / 10.7 -> 9.4 ms. An exact step
# with 40-unit nets inlines ~2,700 operations per coordinate, past inductor's `max_fusion_size`
# (64 nodes): the loop split in three that recomputed or stored the units shared by a net's
# value and its derivatives; one loop: 12.2 -> 10.9 ms. Finite differences' four net
# evaluations share no units, and one loop was slower there (13.3 ms: register spills), so
# only exact steps lift the limit. Keys a torch version lacks are skipped.
_CONTRACT = {"cpp.enable_floating_point_contract_flag": "fast"}
_ONE_LOOP = {"max_fusion_size": 1 << 16}
# Inductor's first build on a machine checks that the compiler can target the vector ISA the
# CPU reports by compiling its vector headers once per candidate ISA (four builds, ~10 s of a
# ~37 s package build on 2 cores, research/BENCHMARKS_HISTORY.md). The CPU's flags already say
# which ISA it has; a compiler that cannot target it fails the build, which is then retried with
# the probes (:func:`main`). Loading a package asks for the ISA too (for a warning): with the
# probes, the first load in a process with a fresh inductor cache stalled the sampling loop
# ~15 s, so loading skips that question (:func:`_without_device_comparison`).
_NO_ISA_PROBES = {"cpp.vec_isa_ok": True}
# AOTInductor precompiles the torch headers a package's C++ includes (~140 MB per header and
# compiler-flag set, kept in the system's temporary directory for later builds): a machine's
# first build took 31.5 s with it and 25.3-26.1 s without (10-unit floor sampler, 2 cores;
# a later build 20.3 s with the headers already there). The first build is the one a user
# waits for, so packages compile their headers each time.
_NO_HEADER_PRECOMPILE = {"aot_inductor.precompile_headers": False}
# The package's C++ wrapper (tensor bookkeeping around one kernel call per step) at -O0
# compiles in 6.5 s rather than 9.1 s (g++ on the 10-unit floor sampler's wrapper).
_FAST_WRAPPER_BUILD = {"aot_inductor.compile_wrapper_opt_level": "O0"}


def _without_isa_extension_probes() -> contextlib.AbstractContextManager:
    """Within the block, inductor's probes of the CPU's bf16, VNNI and AMX instructions (six
    small compiles, ~3 s of a first build) report them missing: the float32 step uses none of
    them, and the kernel is compiled with ``-march=native`` either way."""
    from torch._inductor import cpu_vec_isa

    return mock.patch.object(cpu_vec_isa.VecISA, "check_build", lambda self, code: False)


def _known(options: dict[str, object]) -> dict[str, object]:
    """The inductor settings among ``options`` that this torch has."""
    known = torch._inductor.config.get_config_copy()
    return {k: v for k, v in options.items() if k in known}


def inductor_options(cfg: StepConfig) -> dict[str, object]:
    """The inductor settings a step with switches ``cfg`` is compiled with."""
    one_loop = _ONE_LOOP if cfg.gamma == "exact" else {}
    build = {**_NO_ISA_PROBES, **_NO_HEADER_PRECOMPILE, **_FAST_WRAPPER_BUILD}
    return _known({**_CONTRACT, **one_loop, **build})


RETRY_NOTICE = "metasampler: the build failed with its shortcuts; building again without them"


def _compile_package(program, path: Path, options: dict[str, object], shortcuts: bool) -> None:
    """AOTInductor's build; with ``shortcuts``, without the probes of the CPU's ISA and its
    extensions and with fast float division (:mod:`.vector_division`)."""
    if not shortcuts:
        probed = {k: v for k, v in options.items() if k not in _NO_ISA_PROBES}
        torch._inductor.aoti_compile_and_package(
            program, package_path=str(path), inductor_configs=probed
        )
        return
    with fast_float_division(), _without_isa_extension_probes():
        torch._inductor.aoti_compile_and_package(
            program, package_path=str(path), inductor_configs=options
        )


def build(spec: KernelSpec, package: Path, shortcuts: bool = True) -> None:
    """Export and compile the step for ``spec`` into ``package`` (with its checksum)."""
    torch.set_num_threads(spec.threads)
    flat, dims = _example_inputs(spec)
    tmp = package.with_name(f"{package.stem}.{os.getpid()}.tmp.pt2")
    try:
        with torch.no_grad():
            program = torch.export.export(_Step(spec), tuple(flat), dynamic_shapes=(tuple(dims),))
            _compile_package(program, tmp, inductor_options(spec.cfg), shortcuts)
        digest = _sha256(tmp)
        os.replace(tmp, package)
        atomic_write_text(_checksum_path(package), digest + "\n")
    finally:
        tmp.unlink(missing_ok=True)  # (what a failed attempt left)


# -- the parent's side: build in the background, load when ready -------------------------
_RUNNERS: dict[str, Callable] = {}
_BUILDS: dict[str, subprocess.Popen] = {}
_FAILED: set[str] = set()
# Configurations whose package another process is building: key -> (when to look again, the
# package's path).
_WAITING: dict[str, tuple[float, Path]] = {}
_POLL_SECONDS = 0.25
# The lock handle held while a build is being started (see `_claim`): the build inherits it.
_STARTING_LOCK: dict[Path, int] = {}


def cache_dir() -> Path:
    """Where packages are kept (``$METASAMPLER_CACHE_DIR`` or ``~/.cache/metasampler/compiled``)."""
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path.home() / ".cache" / "metasampler" / "compiled"


def _checksum_path(package: Path) -> Path:
    return package.with_suffix(".sha256")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _intact(package: Path) -> bool:
    """Whether ``package`` exists and matches its checksum; a mismatch deletes it (rebuilt)."""
    checksum = _checksum_path(package)
    if not package.exists() or not checksum.exists():
        return False
    if _sha256(package) == checksum.read_text().strip():
        return True
    warnings.warn(
        f"NNSGHMC: the compiled step {package} does not match its checksum (altered or "
        "truncated); it is deleted and rebuilt",
        stacklevel=3,
    )
    package.unlink(missing_ok=True)
    checksum.unlink(missing_ok=True)
    return False


def _child_command(
    entry: str, argv: list[str], skip_teardown: bool = False
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a fresh interpreter running ``function(argv)`` for
    ``entry = "module.function"`` of ``metasampler.learned`` (this copy of the package), with
    one compile thread; the process exits with the function's return value. With
    ``skip_teardown`` it exits without the interpreter's teardown: after a package build that
    took ~2 s, which the user's eager steps waited for."""
    root = str(Path(__file__).resolve().parents[2])  # so the child imports this metasampler
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    # (`-c`, not `-m`: the package imports this module before runpy would run it)
    module, function = entry.split(".")
    code = f"import os, sys; from metasampler.learned.{module} import {function} as f; "
    code += "rc = f(sys.argv[1:]); "
    if skip_teardown:
        code += "sys.stdout.flush(); sys.stderr.flush(); os._exit(rc)"
    else:
        code += "sys.exit(rc)"
    return [sys.executable, "-c", code, *argv], env


def start_child(
    entry: str,
    argv: list[str],
    log: Path,
    skip_teardown: bool = False,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen:
    """:func:`_child_command`'s process, started in the background, its output written to
    ``log``; ``pass_fds`` stay open in it (a build's lock)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    command, env = _child_command(entry, argv, skip_teardown)
    with log.open("w") as out:  # (the child keeps its own handle)
        return subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, pass_fds=pass_fds
        )


def _start(spec: KernelSpec, package: Path) -> subprocess.Popen:
    print(
        "metasampler: compiling the NNSGHMC step in the background (first use of this "
        f"configuration; eager steps run meanwhile; cached in {package.parent}; "
        "`python -m metasampler.prebuild NAME_OR_FILE` builds a saved sampler's ahead of a run)",
        file=sys.stderr,
    )
    log = package.with_suffix(".log")
    lock = _STARTING_LOCK.get(package)  # (held by the build until it exits)
    return start_child(
        "aot.main", [spec.to_json(), str(package)], log, skip_teardown=True,
        pass_fds=() if lock is None else (lock,),
    )  # fmt: skip


def _lock_path(package: Path) -> Path:
    return package.with_suffix(".lock")


def _failed_path(package: Path) -> Path:
    return package.with_suffix(".failed")


def _take_lock(package: Path, block: bool):
    """An open handle holding ``package``'s build lock; ``None`` while another process holds
    it (``block=False``). Where the file system cannot lock, the handle holds nothing."""
    handle = open(_lock_path(package), "a+b")  # noqa: SIM115 (closed by the caller)
    if fcntl is None:
        return handle
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
    except BlockingIOError:
        handle.close()
        return None
    except OSError:  # (e.g. a file system without locks: uncoordinated, as without fcntl)
        pass
    return handle


def _build_failure(package: Path) -> str:
    """Why the last build of ``package`` failed, from its log."""
    log = package.with_suffix(".log")
    tail = log.read_text(errors="replace")[-400:].strip() if log.exists() else ""
    return f"{log}: ...{tail}"


def _claim(spec: KernelSpec, key: str, package: Path, wait: bool) -> Callable | None:
    """Take the configuration's build lock and start its build (``None``; the build inherits
    the lock); or, while another process holds the lock, return ``None`` (``wait=False``:
    eager steps meanwhile) or wait for it (``wait=True``). Once the lock is free, the package
    that build left is loaded, or its failure reported."""
    if not wait and key in _WAITING and time.monotonic() < _WAITING[key][0]:
        return None  # (looked a moment ago)
    try:
        package.parent.mkdir(parents=True, exist_ok=True)
        handle = _take_lock(package, block=False)
        if handle is None:
            if key not in _WAITING:
                print(
                    "metasampler: another process is compiling the NNSGHMC step for this "
                    f"configuration ({_lock_path(package)} is locked); "
                    + ("waiting for it" if wait else "eager steps run meanwhile, and its "
                       "package is loaded when it is ready"),
                    file=sys.stderr,
                )  # fmt: skip
            _WAITING[key] = (time.monotonic() + _POLL_SECONDS, package)
            if not wait:
                return None
            handle = _take_lock(package, block=True)
    except OSError as err:  # e.g. a read-only cache directory: stay eager
        _fail(key, f"cannot start the build in {package.parent}: {err}", depth=5)
        return None
    with handle:  # (closing it releases the lock, unless a build started below inherited it)
        waited = _WAITING.pop(key, None) is not None
        if _intact(package):
            return _load(key, package)
        if waited and _failed_path(package).exists():
            _fail(key, f"the build by another process failed; {_build_failure(package)}", 5)
            return None
        _failed_path(package).unlink(missing_ok=True)
        _STARTING_LOCK[package] = handle.fileno()
        try:
            _BUILDS[key] = _start(spec, package)
        except OSError as err:
            _fail(key, f"cannot start the build in {package.parent}: {err}", depth=5)
        finally:
            _STARTING_LOCK.pop(package, None)
    return None


def _forget_parent_builds() -> None:
    """In a forked child: the parent's builds are not this process's children (it cannot wait
    for them), so their packages are looked for as another process's."""
    for key in list(_BUILDS):
        _WAITING[key] = (0.0, cache_dir() / f"{key}.pt2")
    _BUILDS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_builds)


#: The start of the warning a step gives when its compiled step cannot be used.
UNAVAILABLE = "NNSGHMC: the compiled step is unavailable"


def _fail(key: str, why: str, depth: int = 4) -> None:
    _FAILED.add(key)
    warnings.warn(f"{UNAVAILABLE} ({why}); using the eager step", stacklevel=depth)


def _without_device_comparison() -> contextlib.AbstractContextManager:
    """Loading a package compares its CPU's vector ISA with this one's, only to log a
    warning, and finding this CPU's ISA compiles inductor's probes in the user's process: a
    stall of the sampling loop (~15 s with a fresh inductor cache for the ISA, ~3 s more for
    bf16 / VNNI / AMX). The package's key holds the CPU (:func:`_cpu_identity`), so a package
    built on another CPU (a shared cache directory) is never loaded: the comparison is
    skipped."""
    from torch._inductor import codecache

    return mock.patch.object(codecache, "get_device_information", lambda device_type: {})


def _load(key: str, package: Path) -> Callable | None:
    try:
        with _without_device_comparison():
            runner = torch._inductor.aoti_load_package(str(package))
    except Exception as err:  # an incompatible or broken package: stay eager
        _fail(key, f"{type(err).__name__} loading {package}: {err}")
        return None
    _RUNNERS[key] = runner
    return runner


def _runner(spec: KernelSpec, wait: bool) -> Callable | None:
    """The loaded package for ``spec``; ``None`` while it builds (``wait=False``) or failed."""
    key = spec.digest()
    if key in _RUNNERS or key in _FAILED:
        return _RUNNERS.get(key)
    package = cache_dir() / f"{key}.pt2"
    if key not in _BUILDS:
        if key not in _WAITING and _intact(package):
            return _load(key, package)
        runner = _claim(spec, key, package, wait)  # (one build per configuration per machine)
        if key not in _BUILDS:
            return runner
    build_proc = _BUILDS[key]
    if wait:
        build_proc.wait()
    if build_proc.poll() is None:
        return None
    del _BUILDS[key]
    if build_proc.returncode != 0 or not _intact(package):
        log = package.with_suffix(".log")
        tail = log.read_text()[-400:].strip() if log.exists() else ""
        _fail(key, f"the build exited with {build_proc.returncode}; {log}: ...{tail}")
        return None
    return _load(key, package)


def run(args: StepArgs, wait: bool) -> tuple | None:
    """The compiled step, or ``None`` where it does not run this call: still building
    (``wait=False``), failed, a ``(K, D)`` with a dimension of 1 (export specialises it), or
    the first finite-difference step."""
    spec = KernelSpec.of(args)
    if min(args.p.shape) < 2 or (spec.cfg.gamma == "finite_difference" and not spec.cache):
        return None  # (finite differences' first step, without history, is not worth a build)
    runner = _runner(spec, wait)
    return None if runner is None else call_flat(runner, args, spec)


def call_flat(runner: Callable, args: StepArgs, spec: KernelSpec) -> tuple:
    """``runner`` (a function of :func:`flat_inputs`, like :func:`step_from_flat`) on
    ``args``, with the result in :func:`nnsghmc_update`'s form."""
    flat = flat_inputs(args, spec)
    out = runner(*flat)
    return (*out[:3], *uncarried(spec.cfg, out[3:], flat[energy_index(spec)]))


@contextlib.contextmanager
def leaving_a_core_to_builds() -> Iterator[None]:
    """While a build runs in the background, this process's intra-op threads are one fewer
    (the build compiles on one core): OpenMP threads spinning against it on a busy core made an
    eager step 3x slower (2 cores, 784-40-40-10 MLP: 450-560 ms against 150-200 ms)."""
    threads = torch.get_num_threads()
    building = _WAITING or any(build_proc.poll() is None for build_proc in _BUILDS.values())
    if threads < 2 or not building:
        yield
        return
    torch.set_num_threads(threads - 1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def wait_for_builds(timeout: float | None = None) -> None:
    """Block until every background build this process started, or waits for in another
    process, has finished (``timeout``: seconds for each).

    Raises:
        subprocess.TimeoutExpired: a build still runs after ``timeout`` seconds.
    """
    for build_proc in list(_BUILDS.values()):
        build_proc.wait(timeout)
    for key, (_, package) in list(_WAITING.items()):
        deadline = None if timeout is None else time.monotonic() + timeout
        while (handle := _take_lock(package, block=deadline is None)) is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"the build of {package}", timeout)
            time.sleep(_POLL_SECONDS)
        handle.close()
        _WAITING[key] = (0.0, package)  # (the next step loads it)


def stop_builds() -> None:
    """Terminate the background builds (their packages are not written)."""
    for build_proc in list(_BUILDS.values()):
        build_proc.terminate()
        build_proc.wait()
    _BUILDS.clear()


NO_SHORTCUTS = "--no-shortcuts"


def main(argv: list[str]) -> int:
    """Build one package: ``argv = [SPEC_JSON, PACKAGE]`` (what the child process runs), then
    ``NO_SHORTCUTS`` for a build without the shortcuts. A build that fails with them is
    retried without them in a fresh interpreter: inductor keeps its choice of the CPU's ISA
    for the life of a process, so a retry in the same one would not probe it."""
    shortcuts = argv[-1:] != [NO_SHORTCUTS]
    args = argv if shortcuts else argv[:-1]
    if len(args) != 2:
        print(f"usage: python -m metasampler.learned.aot SPEC_JSON PACKAGE [{NO_SHORTCUTS}]",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        build(KernelSpec.from_json(args[0]), Path(args[1]), shortcuts)
    except Exception as err:
        if not shortcuts:
            raise
        print(f"{RETRY_NOTICE}: {type(err).__name__}: {str(err)[:400]}", flush=True)
        command, env = _child_command("aot.main", [*args, NO_SHORTCUTS])
        returncode = subprocess.run(command, env=env).returncode  # (into this child's log)
        if returncode != 0:  # (processes waiting for this build report it, not rebuild)
            _failed_path(Path(args[1])).write_text(f"exit status {returncode}\n")
        return returncode
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
