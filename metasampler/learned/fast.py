"""How one NNSGHMC step is executed: transformations of :func:`nnsghmc_update`, no copies.

The step is one pure, element-wise function of the coordinates
(:func:`metasampler.learned.equations.nnsghmc_update`). This module only decides how to run it:

* **compiled** (sampling on CPU, the default where a C++ compiler exists): that function
  exported and compiled by AOTInductor into one fused loop over the coordinates
  (:mod:`metasampler.learned.aot`). The first use of a configuration builds it in a child
  process while the eager form runs, and uses it from the step after it is ready, so a
  user's first step never waits for the compiler; later processes load the cached build at
  once. Without a C++ compiler the eager form runs, after a one-line notice. The switch
  changes results at float-rounding level at a step that depends on the machine; for
  bit-reproducible runs pass ``compile=True`` (wait for it) or ``False``, or set the
  environment variable ``METASAMPLER_COMPILE`` to ``1`` or ``0``.
* **compiled in process** (``compile=True`` on a GPU, and meta-training's
  ``train.compile_steps``): ``torch.compile`` of the same function in this process; the
  first step waits for the compile. The ahead-of-time package crashed the process at its
  first call on CUDA (H200, torch 2.11, ``speed/device_check.py``), so on a GPU the default
  is eager steps while a child process compiles the same function on inputs of the same
  layout, which fills inductor's caches; then this process compiles it from those caches in
  a background thread (seconds, not the ~35 s of a cold compile, which holds Python's lock)
  while eager steps go on (:func:`run_thread_default`): short runs never pay for a compile,
  long ones switch.
* **blocks** (sampling, eager): the function on blocks of columns whose ``(H, K, cols)``
  hidden activations stay in cache; same values as one call.
* **recompute** (``step_path="recompute"``, grad enabled): a
  :class:`torch.autograd.Function` whose forward runs the blocks without recording anything
  and whose backward recomputes each block with autograd and back-propagates through it at
  once, so no ``(H, K, D)`` activation of any step is stored across an unroll. It saves
  memory, not time (measured in ``BENCHMARKS.md``), so meta-training uses **plain** by
  default.
* **compiled training** (grad enabled, ``compile=True``): a
  :class:`torch.autograd.Function` whose forward is the in-process compiled step run without
  recording (the nets' units unrolled into one loop, nothing stored) and whose backward is
  ``torch.func.vjp`` of the same function, compiled, over chunks of the coordinates that keep
  its intermediates in cache: it recomputes the step instead of storing the ``(H, K, D)``
  hidden units of every step. Where that does not pay (:func:`_recomputing_pays`: an
  energy-only curl, small problems, a GPU) or with undetached net inputs
  (``detach_inputs=False``) the step is compiled with autograd instead (inductor's joint
  forward and backward).
* **plain**: the function called directly, with autograd when it records (meta-training's
  default): the reference.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from . import aot
from .equations import StepArgs, nnsghmc_update

__all__ = [
    "StepArgs", "PATHS", "run", "compile_unavailable", "training_compile_pays", "wait_for_compiles",
]  # fmt: skip

PATHS = ("auto", "plain", "blocks", "recompute", "compiled")
# A block holds about this many coordinates (x hidden units per intermediate): ~0.6 MB of
# float32 per (H, K, cols) tensor for 10 hidden units, which stays in a core's L2 cache.
_BLOCK_COORDS = 1 << 14
# On a GPU every operation is a kernel launch and the activations fit in its memory, so a block
# is as large as memory allows: small blocks made the eager step on the MNIST MLP 17x an
# SGHMC step on an H200 (speed/device_check.py); 4M coordinates x 40 units is 0.7 GB a tensor.
_GPU_BLOCK_COORDS = 1 << 22
# The first entries of `_flatten`'s list: theta, p, grad, prior_grad, u, noise, cache x 4,
# stiffness, xi.
_N_COORDS = 12


def _column_blocks(args: StepArgs) -> list[slice]:
    rows, width = args.p.shape[0], args.p.shape[-1]
    per_block = _BLOCK_COORDS if args.p.device.type == "cpu" else _GPU_BLOCK_COORDS
    cols = max(1, per_block // max(rows, 1))
    return [slice(c, min(width, c + cols)) for c in range(0, width, cols)]


def _join(parts: list[tuple]) -> tuple:
    """Concatenate the per-block results of :func:`nnsghmc_update` along the columns."""
    theta = torch.cat([r[0] for r in parts], -1)
    p = torch.cat([r[1] for r in parts], -1)
    check = sum(r[2] for r in parts)
    cache = xi = None
    if parts[0][3] is not None:
        u = parts[0][3][0]
        cache = (u if u.shape[-1] == 1 else torch.cat([r[3][0] for r in parts], -1),)
        cache += tuple(torch.cat([r[3][i] for r in parts], -1) for i in (1, 2, 3))
    if parts[0][4] is not None:
        xi = torch.cat([r[4] for r in parts], -1)
    return theta, p, check, cache, xi


def run_blocks(args: StepArgs) -> tuple:
    """:func:`nnsghmc_update` block by block (for calls that record no autograd graph)."""
    blocks = _column_blocks(args)
    if len(blocks) == 1:
        return nnsghmc_update(*args)
    return _join([nnsghmc_update(*args.columns(cols)) for cols in blocks])


# -- recomputing backward ------------------------------------------------------------------------
def _flatten(args: StepArgs) -> tuple[list[Tensor | None], Callable[[list], StepArgs]]:
    """The tensors of ``args`` as one list, and how to put a list like it back."""
    (q_layers, q_head), (d_layers, d_head) = args.q_net, args.d_net
    cache = list(args.cache) if args.cache is not None else [None] * 4
    nets = [t for layer in (*q_layers, q_head, *d_layers, d_head) for t in layer]
    coords = [args.theta, args.p, args.grad, args.prior_grad, args.u, args.noise, *cache]
    coords += [args.stiffness, args.xi]

    def rebuild(tensors: list) -> StepArgs:
        it = iter(tensors[len(coords) :])

        def net(layers) -> tuple:
            hidden = tuple((next(it), next(it)) for _ in layers)
            return hidden, (next(it), next(it))

        q_net, d_net = net(q_layers), net(d_layers)
        c = tensors[6:10]
        return args._replace(
            theta=tensors[0], p=tensors[1], grad=tensors[2], prior_grad=tensors[3],
            u=tensors[4], noise=tensors[5], cache=None if c[0] is None else tuple(c),
            stiffness=tensors[10], xi=tensors[11], q_net=q_net,
            d_net=d_net,
        )  # fmt: skip

    return coords + nets, rebuild


class _Recomputed(torch.autograd.Function):
    """``nnsghmc_update`` whose backward recomputes it block by block (see module doc)."""

    @staticmethod
    def forward(ctx, args: StepArgs, *tensors: Tensor | None):
        _, rebuild = _flatten(args)
        ctx.rebuild, ctx.n = rebuild, len(tensors)
        ctx.save_for_backward(*tensors)
        with torch.no_grad():
            theta, p, check, cache, xi = run_blocks(rebuild(list(tensors)))
        ctx.mark_non_differentiable(check)
        return theta, p, check, *aot.carried(cache, xi)

    @staticmethod
    def backward(ctx, *grad_out: Tensor):
        tensors = list(ctx.saved_tensors)
        args = ctx.rebuild(tensors)
        wanted = [t is not None and t.requires_grad for t in tensors]
        grads: list[Tensor | None] = [
            torch.zeros_like(t) if w else None for t, w in zip(tensors, wanted, strict=True)
        ]
        for cols in _column_blocks(args):
            block = args.columns(cols)
            flat, rebuild = _flatten(block)
            leaves = [
                t.detach().requires_grad_(w) if t is not None else None
                for t, w in zip(flat, wanted, strict=True)
            ]
            with torch.enable_grad():
                theta, p, _, cache, xi = nnsghmc_update(*rebuild(leaves))
            outputs = [theta, p, *aot.carried(cache, xi)]
            upstream = grad_out[:2] + grad_out[3:]  # (check has none)
            pairs = [
                (out, g[..., cols])
                for out, g in zip(outputs, upstream, strict=True)
                if out.requires_grad
            ]
            inputs = [leaf for leaf, w in zip(leaves, wanted, strict=True) if w]
            if not pairs or not inputs:
                continue
            got = torch.autograd.grad(
                [o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True
            )
            it = iter(got)
            for i, w in enumerate(wanted):
                if not w:
                    continue
                g = next(it)
                if g is None:
                    continue
                if i < _N_COORDS and grads[i].shape[-1] != 1:
                    grads[i][..., cols] += g  # a coordinate tensor: this block's columns
                else:
                    grads[i] += g  # weights, per-chain energy: summed over blocks
        return (None, *grads)


def run_recompute(args: StepArgs) -> tuple:
    """:func:`nnsghmc_update` with the recomputing backward."""
    tensors, _ = _flatten(args)
    out = _Recomputed.apply(args, *tensors)
    u = args.u.detach() if args.cfg.detach else args.u
    return (*out[:3], *aot.uncarried(args.cfg, out[3:], u))


# -- compiled ----------------------------------------------------------------------------------
def compile_unavailable(device: torch.device) -> str | None:
    """Why the compiled step cannot run on ``device``; ``None`` if it can."""
    if sys.platform == "win32":
        return "torch.compile's inductor is not set up for Windows here"
    if device.type == "cpu":
        if not _compiler_on_path(os.environ.get("PATH"), shutil.which):
            return "no C++ compiler (g++/clang++) on PATH"
        return None
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "triton is not installed"
        return None
    return f"no torch.compile backend for device {device.type!r}"


@functools.lru_cache(maxsize=8)
def _compiler_on_path(path: str | None, which: Callable) -> bool:  # noqa: ARG001 (the key)
    """Whether ``which`` finds a C++ compiler on ``path`` (asked once per ``PATH``: every step
    asks, and a search of ``PATH`` took ~0.1 ms of a ~15 ms step)."""
    return any(which(cc) for cc in ("g++", "c++", "clang++"))  # (which reads PATH itself)


# Chains x coordinates from which meta-training compiles its steps by default (a CPU with a
# compiler). configs/mnist_mlp.yaml (784-20-10 MLP, 10 chains: 159,000) trained 8 epochs in
# 97 s eagerly and 57 s compiled with warm caches; cold, the compiles add ~65 s, repaid after
# ~2,700 steps, and its 24 epochs run 4,800 (research/BENCHMARKS_HISTORY.md). The saving per step
# shrinks with the problem and the compile does not, so smaller problems (the toys' 500-1,000,
# the tests') stay eager.
TRAINING_COMPILE_MIN_COORDINATES = 100_000


def training_compile_pays(n_coordinates: int, device: torch.device) -> bool:
    """Whether meta-training compiles its steps when not told (``train.compile_steps: null``):
    on a CPU with a C++ compiler, for ``n_chains * dim`` of at least
    ``TRAINING_COMPILE_MIN_COORDINATES``. Not on a GPU, where it was not measured."""
    big = n_coordinates >= TRAINING_COMPILE_MIN_COORDINATES
    return big and device.type == "cpu" and compile_unavailable(device) is None


_IN_PROCESS: dict[aot.KernelSpec, Callable] = {}


def run_compiled_in_process(args: StepArgs, spec: aot.KernelSpec | None = None) -> tuple:
    """:func:`nnsghmc_update` through ``torch.compile`` in this process: with autograd
    recording (meta-training where :func:`_recomputing_pays` says no) inductor fuses the
    forward and the backward of the step into loops over the coordinates; under
    ``torch.no_grad()`` (sampling on a GPU, where the ahead-of-time package is not used, and
    the forward of compiled training) the nets' units are unrolled into one fused kernel.
    Shapes are static (they do not change during a run); the first call waits for the
    compile (minutes: ``BENCHMARKS.md``). ``spec``: ``args``'s, where the caller has it."""
    spec = spec or aot.KernelSpec.of(args)
    compiled = _compiled(spec)
    if torch.is_grad_enabled():
        return aot.call_flat(compiled, args, spec)
    # Sampling: plain tensors, as a thread or a child process compiled it for (dynamo guards on
    # an input's type, and a net's `Parameter` compiled the step a second time, in this thread).
    return aot.call_flat(lambda *flat: compiled(*(x.detach() for x in flat)), args, spec)


# -- compiled training: the compiled step forward, a compiled vjp backward --------------------
# Coordinates per call of the compiled backward, whose (H, chunk) intermediates then stay in
# cache (a probe, 784-20-10 MLP, K = 20, 10-unit softsign nets: 18.3 ms per step in one call,
# 9.6 ms in chunks of ~32k coordinates, 11 ms of ~16k; research/BENCHMARKS_HISTORY.md).
_VJP_CHUNK = 1 << 15
_VJP: dict[tuple, Callable] = {}


def _differentiable_outputs(out: tuple) -> tuple:
    return (out[0], out[1], *out[3:])  # (the check sum has no gradient)


def _vjp_entry(spec: aot.KernelSpec, wanted: tuple[int, ...], n_flat: int) -> Callable:
    """``(*flat, *cotangents) -> gradients of the wanted inputs``: ``torch.func.vjp`` of
    :func:`aot.step_from_flat`, with a code object of its own (see :func:`_entry`)."""
    step = aot.step_from_flat

    def entry(*flat_and_cotangents: Tensor) -> tuple[Tensor, ...]:
        flat, cotangents = flat_and_cotangents[:n_flat], flat_and_cotangents[n_flat:]

        def of_wanted(*values: Tensor) -> tuple[Tensor, ...]:
            inputs = list(flat)
            for i, value in zip(wanted, values, strict=True):
                inputs[i] = value
            return _differentiable_outputs(step(spec, *inputs))

        _, pull = torch.func.vjp(of_wanted, *(flat[i] for i in wanted))
        return pull(tuple(cotangents))

    code = entry.__code__.replace()
    return types.FunctionType(code, entry.__globals__, entry.__name__, None, entry.__closure__)


def _chunked_vjp(
    spec: aot.KernelSpec, wanted: tuple[int, ...], flat: list[Tensor], cotangents: list[Tensor]
) -> list[Tensor]:
    """The compiled vjp over chunks of the flattened coordinates; coordinate gradients joined,
    weight gradients summed."""
    key = (spec, wanted, len(flat))
    fn = _VJP.get(key)
    if fn is None:
        fn = _VJP[key] = torch.compile(
            _vjp_entry(spec, wanted, len(flat)), dynamic=False, fullgraph=True
        )
    shape, n_coords = flat[0].shape, aot.n_coordinate_inputs(spec)
    # (a per-chain energy input (K, 1) is expanded: every coordinate input is then (K, D))
    flat = [x.expand(shape).reshape(-1) if i < n_coords else x for i, x in enumerate(flat)]
    cotangents = [c.reshape(-1) for c in cotangents]
    total = flat[0].numel()
    parts = []
    for start in range(0, total, _VJP_CHUNK):
        cut = slice(start, min(total, start + _VJP_CHUNK))
        inputs = [x[cut] if i < n_coords else x for i, x in enumerate(flat)]
        parts.append(fn(*inputs, *(c[cut] for c in cotangents)))
    grads = []
    for j, i in enumerate(wanted):
        if i < n_coords:
            grads.append(torch.cat([part[j] for part in parts]).view(shape))
        else:
            grads.append(sum((part[j] for part in parts[1:]), parts[0][j]))
    return grads


class _CompiledRecompute(torch.autograd.Function):
    """The compiled step, differentiable by a compiled recomputing backward (module doc)."""

    @staticmethod
    def forward(ctx, spec: aot.KernelSpec, *flat: Tensor):
        ctx.spec = spec
        ctx.save_for_backward(*flat)
        out = _compiled(spec)(*flat)  # (forward runs without recording: the unrolled kernel)
        ctx.mark_non_differentiable(out[2])
        return out

    @staticmethod
    def backward(ctx, *grad_out: Tensor):
        flat = list(ctx.saved_tensors)
        # The energy input only feeds the nets, whose inputs are detached: its gradient is 0.
        energy = aot.energy_index(ctx.spec)
        wanted = tuple(i for i, need in enumerate(ctx.needs_input_grad[1:]) if need and i != energy)
        grads: list[Tensor | None] = [None] * len(flat)
        if wanted:
            cotangents = list(_differentiable_outputs(grad_out))
            for i, g in zip(wanted, _chunked_vjp(ctx.spec, wanted, flat, cotangents), strict=True):
                per_chain = flat[i].shape != g.shape  # (K, 1), expanded in the chunks
                grads[i] = g.sum(-1, keepdim=True) if per_chain else g
        return (None, *grads)


def _recomputing_pays(args: StepArgs) -> bool:
    """Whether compiled training recomputes the step in its backward
    (:func:`run_compiled_training`) rather than compiling it with autograd, which stores the
    hidden units: measured faster on a CPU for per-coordinate nets over many coordinates
    (784-20-10 MLP, K = 20: 2.8x -> 2.0x an SGHMC step; BENCHMARKS.md). The stored form stays
    for an energy-only curl (its ``f_Q`` runs once per chain there), for small problems (the
    toy's 1,000 coordinates: two calls per step cost more than they save), for undetached net
    inputs, and on a GPU (not measured there)."""
    per_chain_curl = aot.curl_per_chain(args.cfg, args.stiffness is not None)
    big = args.p.numel() >= _VJP_CHUNK
    return args.cfg.detach and not per_chain_curl and big and args.p.device.type == "cpu"


def run_compiled_training(args: StepArgs) -> tuple:
    """:func:`nnsghmc_update` with autograd: the compiled step forward and the compiled
    recomputing backward (:class:`_CompiledRecompute`); needs detached net inputs."""
    spec = aot.KernelSpec.of(args)
    return aot.call_flat(lambda *flat: _CompiledRecompute.apply(spec, *flat), args, spec)


def _compiled(spec: aot.KernelSpec) -> Callable:
    fn = _IN_PROCESS.get(spec)
    if fn is None:
        fn = _IN_PROCESS[spec] = torch.compile(_entry(spec), dynamic=False, fullgraph=True)
    return fn


def _entry(spec: aot.KernelSpec) -> Callable:
    """``step_from_flat`` bound to ``spec`` as a plain function with a code object of its own:
    dynamo counts recompiles (limit 8) per code object, so configurations used in one process
    must not share one (a ``functools.partial`` would: torch.compile wraps it in one shared
    frame, and a process meta-training five configurations hit the limit)."""
    step = aot.step_from_flat

    def entry(*flat: Tensor) -> tuple[Tensor, ...]:
        return step(spec, *flat)

    code = entry.__code__.replace()
    return types.FunctionType(code, entry.__globals__, entry.__name__, None, entry.__closure__)


# -- compiled in a background thread (a GPU) ---------------------------------------------------
# A GPU cannot use the ahead-of-time package (it crashed the process at its first call on CUDA),
# so the step is compiled in this process and steps switch to it once it is ready. A compile
# holds the GIL most of the time: on an H200 with cold caches it took ~35 s, during which eager
# steps crawled (30 steps in 13 s), and the compiled step then saved ~2 ms a step on the
# 784-40-40-10 MLP (K = 20; speed/device_check.py, BENCHMARKS.md). So a child process, which
# holds no lock of this one, first compiles the same function on inputs of the same layout,
# which fills inductor's caches; then a daemon thread compiles it here from those caches (a few
# seconds; a daemon, so that a script that ends first does not wait for it). The thread starts
# once the child is done and the configuration's eager steps have taken
# `_THREAD_AFTER_SECONDS` (about what the compile from warm caches costs, so a run never loses
# more than about twice what the better choice in hindsight would have cost: ski rental).
_THREAD_DEVICES = frozenset({"cuda"})
_THREAD_AFTER_SECONDS = 10.0
# Keyed by configuration and chains' shape: the in-process compile specialises the shape
# (another K, e.g. a benchmark's tuning runs and its evaluation, is another compile).
_CHILDREN: dict[tuple, tuple[subprocess.Popen, Path]] = {}
_WARMING: dict[tuple, Future] = {}
_EAGER_SECONDS: dict[tuple, float] = {}


def _start_child(key: tuple, spec: aot.KernelSpec, args: StepArgs) -> None:
    flat = aot.flat_inputs(args, spec)
    layout = [(x.shape, x.stride(), str(x.dtype).removeprefix("torch.")) for x in flat]
    argv = [spec.to_json(), json.dumps(layout), str(args.p.device)]
    log = aot.cache_dir() / f"{spec.digest()}-{'x'.join(map(str, args.p.shape))}.warm.log"
    try:
        _CHILDREN[key] = aot.start_child("fast.warm_caches", argv, log), log
    except OSError as err:  # e.g. a read-only cache directory: stay eager
        _fail_compile(key, f"cannot start its compile in a child process: {err}")
        return
    print(
        "metasampler: compiling the NNSGHMC step in a child process (first use of this "
        "configuration; eager steps run meanwhile, and switch once it is done)",
        file=sys.stderr,
    )


def warm_caches(argv: list[str]) -> int:
    """What the child process runs, ``argv = [SPEC_JSON, LAYOUT_JSON, DEVICE]``: the
    in-process compile of the step for that spec on inputs of that layout (shape, strides,
    dtype), called once, so that inductor's caches hold what this process's compile needs."""
    spec, layout, device = aot.KernelSpec.from_json(argv[0]), json.loads(argv[1]), argv[2]
    torch.set_num_threads(spec.threads)  # (a CPU's kernels are generated for a thread count)
    flat = [
        torch.empty_strided(shape, stride, dtype=getattr(torch, dtype), device=device)
        for shape, stride, dtype in layout
    ]
    with torch.no_grad():
        for x in flat:
            x.uniform_(0.5, 1.5)  # (finite and positive, as the scalars must be)
        _compiled(spec)(*flat)
    return 0


def _fail_compile(key: tuple, why: str) -> None:
    """Mark ``key``'s compile failed (its steps stay eager, after a notice)."""
    done = _WARMING[key] = Future()
    done.set_exception(RuntimeError(why))


def _warm_up(spec: aot.KernelSpec, flat: list[Tensor], done: Future) -> None:
    try:
        with torch.no_grad():  # (the grad mode the steps call it in: no recompile then)
            _compiled(spec)(*flat)
        if flat[0].is_cuda:
            torch.cuda.synchronize(flat[0].device)
        done.set_result(None)
    except BaseException as exc:  # noqa: BLE001 (reported by the step that finds it)
        done.set_exception(exc)


def _start_thread(key: tuple, spec: aot.KernelSpec, args: StepArgs) -> None:
    done = _WARMING[key] = Future()
    flat = [x.detach().clone() for x in aot.flat_inputs(args, spec)]
    threading.Thread(target=_warm_up, args=(spec, flat, done), daemon=True).start()


def _child_done(key: tuple) -> bool:
    """Whether the child process of ``key`` has finished; one that failed fails the key."""
    child, log = _CHILDREN[key]
    if child.poll() is None:
        return False
    if child.returncode != 0:
        tail = log.read_text()[-300:].strip() if log.exists() else ""
        _fail_compile(key, f"in a child process, exit {child.returncode}; {log}: ...{tail}")
    return True


def run_thread_default(args: StepArgs) -> tuple:
    """The default step where a thread compiles (``_THREAD_DEVICES``): eager steps, timed per
    configuration and shape, while a child process fills the compile's caches; once it is
    done and they have taken ``_THREAD_AFTER_SECONDS``, a background thread compiles the step
    (on copies of this step's inputs) while eager steps go on, and the compiled step runs once
    it is ready. A failed compile gives a one-line notice."""
    spec = aot.KernelSpec.of(args)
    key = (spec, tuple(args.p.shape))
    if key not in _CHILDREN and key not in _WARMING:
        _start_child(key, spec, args)
    done = _WARMING.get(key)
    if done is None:
        warm = _EAGER_SECONDS.get(key, 0.0) >= _THREAD_AFTER_SECONDS
        if _child_done(key) and key not in _WARMING and warm:
            _start_thread(key, spec, args)
    elif done.done() and done.exception() is not None:
        _notice(f"its compile failed: {type(done.exception()).__name__}: {done.exception()}")
    elif not _warming_up():  # (this configuration's compile and every other one done)
        with torch.no_grad():
            return run_compiled_in_process(args, spec)
    start = time.perf_counter()
    out = run_blocks(args)
    _EAGER_SECONDS[key] = _EAGER_SECONDS.get(key, 0.0) + time.perf_counter() - start
    return out


def _warming_up() -> bool:
    """Whether a background thread is compiling: dynamo's tracing state is global, and a
    compiled function called meanwhile in another thread fails ("FX to symbolically trace a
    dynamo-optimized function": H200, torch 2.11), so none is called until it is done."""
    return not all(done.done() for done in _WARMING.values())


def wait_for_compiles(timeout: float | None = None) -> None:
    """Block until every background build of a compiled step has finished (benchmarks,
    tests): packages, child processes filling a compile's caches, compiling threads."""
    aot.wait_for_builds(timeout)
    for child, _ in list(_CHILDREN.values()):
        child.wait(timeout)
    futures_wait(list(_WARMING.values()), timeout)


_NOTICE_GIVEN = False


def _notice(reason: str) -> None:
    global _NOTICE_GIVEN
    if not _NOTICE_GIVEN:
        _NOTICE_GIVEN = True
        print(f"metasampler: NNSGHMC runs its eager step ({reason}).", file=sys.stderr)


# -- dispatch ----------------------------------------------------------------------------------
def run(args: StepArgs, sampler: Any) -> tuple:
    """One step by the fastest correct path for this call (``sampler.step_path`` forces one)."""
    path = sampler.step_path
    if path not in PATHS:
        raise ValueError(f"step_path must be one of {PATHS}, got {path!r}")
    if path == "plain":
        return nnsghmc_update(*args)
    tensors, _ = _flatten(args)
    recording = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    if path == "recompute":
        return run_recompute(args)
    use = sampler.use_compile
    if use is None and os.environ.get("METASAMPLER_COMPILE") in ("0", "1"):
        use = os.environ["METASAMPLER_COMPILE"] == "1"
    # (a forced "blocks" path never compiles; "auto" compiles when allowed, and waits for the
    # compile, or compiles in this process, when asked)
    asked = path == "compiled" or (path == "auto" and use is True)
    # The first finite-difference step (no history) is not worth a compile of its own.
    first_fd = args.cfg.gamma == "finite_difference" and args.cache is None
    reason = compile_unavailable(args.p.device)
    by_default = path == "auto" and use is None
    if by_default and not recording and reason is None and args.p.device.type in _THREAD_DEVICES:
        return run_blocks(args) if first_fd else run_thread_default(args)
    if recording or args.p.device.type != "cpu":
        # Compiled in this process, only when asked, as the compile takes minutes: for
        # meta-training (`compile=True`, train.compile_steps; measured in eager mode, the
        # recomputing backward costs more time than it saves memory traffic, so the
        # default is plain) and for sampling on a GPU, where the ahead-of-time package
        # crashed the process at its first call (H200, torch 2.11; speed/device_check.py).
        if asked and reason is None and not first_fd:
            futures_wait(list(_WARMING.values()))  # (no compiled call while one compiles)
            if recording and _recomputing_pays(args):
                return run_compiled_training(args)
            return run_compiled_in_process(args)
        if recording:
            return nnsghmc_update(*args)
    elif reason is None and (asked or by_default):
        out = aot.run(args, wait=asked)
        if out is not None:
            return out
    if reason and by_default:
        _notice(reason)
    with aot.leaving_a_core_to_builds():
        return run_blocks(args)
