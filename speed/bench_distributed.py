"""Chains sharded across processes: meta-training and sampling with 1 and 2 processes.

The 2-process runs are what ``torchrun --nproc_per_node=2`` does: two processes on this
machine, a gloo process group on localhost (started here with ``torch.multiprocessing`` so
one script times everything), ``torch.set_num_threads(1)`` in each. The 1-process rows are
the plain single-process code path (no process group) with 1 and with 2 torch threads, so
the 2-process rows use the same cores as the "1 process x 2 threads" row.

* meta-training: ``MetaTrainer.train`` (truncated BPTT, Adam), reported as meta-updates per
  second (one update = one unrolled window) and chain-steps per second;
* sampling: ``metasampler.sample`` of an NNSGHMC sampler (``no_grad``, ``store=False``),
  each rank running its shard of the ``K`` chains; chain-steps per second
  ``K * n_steps / wall`` with the wall time of the slowest rank (barriers around the run).

Each configuration is timed ``--repeats`` times after a warm-up; the fastest run is kept (the
machine is shared with other jobs).

Usage::

    .venv/bin/python -m speed.bench_distributed            # full run, writes BENCHMARKS.md
    .venv/bin/python -m speed.bench_distributed --quick    # smoke run, prints only
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shlex
import socket
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn

from experiments.run_config import load_config
from metasampler import distributed
from metasampler.bayesian import BayesianModel
from metasampler.config import TrainConfig
from metasampler.learned import NNSGHMC
from metasampler.meta.trainer import MetaTrainer
from metasampler.sampling import sample
from speed._common import write_section
from tasks.registry import Problem, ProblemFamily

SECTION = "## Chains sharded across processes"
ROOT = Path(__file__).resolve().parents[1]


# -- workloads ------------------------------------------------------------------------------
def toy_problem() -> Problem:
    """The paper's meta-training task (Gong et al. 2019, appendix F.1): 10-D Gaussian, mean 3,
    random diagonal covariance, gradient noise N(0, 1), starts in U([0, 6]^10)."""
    return ProblemFamily(load_config(None, []).task)(0, torch.Generator())


def mlp_problem() -> Problem:
    """784-20-10 ReLU MLP (D = 15,910; the paper's MNIST training net, Gong et al. 2019,
    appendix F.2), categorical likelihood, minibatch 500 of N = 5000 random inputs of MNIST
    shape."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(784, 20), nn.ReLU(), nn.Linear(20, 10))
    g = torch.Generator().manual_seed(0)
    x = torch.rand(5000, 784, generator=g)
    y = torch.randint(0, 10, (5000,), generator=g)
    model = BayesianModel(net, (x, y), "categorical", batch_size=500)
    return Problem(model, model.init_positions, None, "mlp")


def toy_sampler() -> NNSGHMC:
    return NNSGHMC(eta=0.01, q_hidden=(40,), d_hidden=(40,), seed=0)


def mlp_sampler() -> NNSGHMC:
    return NNSGHMC(lr=0.007, q_hidden=(10,), d_hidden=(10,), beta_off=1.0, seed=0)


# (label, problem, sampler, settings for meta-training, chains and steps for sampling)
def workloads(quick: bool) -> dict[str, dict]:
    toy_train = TrainConfig(
        epochs=1 if quick else 2,
        sub_epochs=1,
        steps_per_sub_epoch=100,
        n_chains=50,
        unroll=20,
        cross_chain_every=2,
        in_chain_burn_in=50,
        in_chain_thinning=3,
        in_chain_chains=5,
        replay_prob=0.15,
        eval_every=0,
        checkpoint_every=1000,
    )
    mlp_train = TrainConfig(
        epochs=1,
        sub_epochs=1,
        steps_per_sub_epoch=20 if quick else 40,
        n_chains=20,
        unroll=20,
        cross_chain_every=4,
        in_chain_weight=0.0,  # cross-chain only, as the paper's MNIST training (F.2)
        replay_prob=0.0,
        eval_every=0,
        checkpoint_every=1000,
    )
    return {
        "toy": {
            "label": "toy 10-D Gaussian (the paper's training task), K = 50",
            "problem": toy_problem,
            "sampler": toy_sampler,
            "train": toy_train,
            "sample": (50, 200 if quick else 500),
        },
        "mlp": {
            "label": "784-20-10 MLP BNN (D = 15,910), K = 20",
            "problem": mlp_problem,
            "sampler": mlp_sampler,
            "train": mlp_train,
            "sample": (20, 10 if quick else 40),
        },
    }


# -- timing (every rank runs the same code; world size 1 = no process group) -----------------
def time_training(work: dict, repeats: int) -> tuple[float, int, int]:
    """Best wall time of ``MetaTrainer.train``; returns (seconds, windows, chain-steps)."""
    s = work["train"]
    problem = work["problem"]()
    windows = s.epochs * s.sub_epochs * -(-s.steps_per_sub_epoch // s.unroll)

    def run(settings: TrainConfig) -> None:
        trainer = MetaTrainer(
            work["sampler"](), lambda e, g: problem, settings, seed=0, progress=False
        )
        trainer.train()

    run(TrainConfig(**{**s.__dict__, "epochs": 1, "steps_per_sub_epoch": s.unroll}))  # warm-up
    best = float("inf")
    for _ in range(repeats):
        distributed.barrier()
        start = time.perf_counter()
        run(s)
        distributed.barrier()  # the slowest rank decides
        best = min(best, time.perf_counter() - start)
    return best, windows, s.n_chains * s.epochs * s.sub_epochs * s.steps_per_sub_epoch


def time_sampling(work: dict, repeats: int) -> tuple[float, int]:
    """Best wall time of sampling this rank's shard; returns (seconds, chain-steps)."""
    n_chains, n_steps = work["sample"]
    problem, sampler = work["problem"](), work["sampler"]()
    shard = distributed.chain_shard(n_chains)
    init = problem.init(shard.size, torch.Generator().manual_seed(shard.rank))

    def run(steps: int) -> None:
        sample(
            sampler,
            problem.target,
            shard.size,
            steps,
            init=init,
            seed=shard.seed(0),
            progress=False,
            store=False,
        )

    run(2)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        distributed.barrier()
        start = time.perf_counter()
        run(n_steps)
        distributed.barrier()
        best = min(best, time.perf_counter() - start)
    return best, n_chains * n_steps


def measure(quick: bool, repeats: int) -> dict[str, tuple]:
    out = {}
    for key, work in workloads(quick).items():
        out[f"train/{key}"] = time_training(work, repeats)
        out[f"sample/{key}"] = time_sampling(work, repeats)
    return out


def _rank_main(rank: int, world: int, port: int, quick: bool, repeats: int, path: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=600),
    )
    try:
        results = measure(quick, repeats)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        torch.save(results, path)


def measure_processes(world: int, quick: bool, repeats: int) -> dict[str, tuple]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "results.pt")
        mp.spawn(_rank_main, args=(world, port, quick, repeats, path), nprocs=world, join=True)
        return torch.load(path, weights_only=False)


def slices(s: TrainConfig) -> int:
    """Cross-chain loss times per window (the window's first position carries no gradient)."""
    return len([t for t in range(1, s.unroll) if t % s.cross_chain_every == 0])


def gather_megabytes(work: dict) -> float:
    """Size of the cross-chain gather of one meta-update, all ranks' positions (MB, float32)."""
    s = work["train"]
    return slices(s) * s.n_chains * work["problem"]().target.dim * 4 / 1e6


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs, no file written")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1],
        help="torch threads of the 1-process rows (add 2 for the same cores as 2 processes)",
    )
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    return parser.parse_args(argv)


def measure_setups(
    threads: list[int], quick: bool, repeats: int
) -> tuple[dict[str, dict], tuple[float, float]]:
    """Results per setup (1 process with each thread count, then 2 processes) and the load
    average (1 min) before and after."""
    load_before = os.getloadavg()
    runs = {}
    for n in sorted(set([1, *threads])):
        torch.set_num_threads(n)
        runs[f"1 process x {n} thread{'s' if n > 1 else ''}"] = measure(quick, repeats)
        print(f"measured 1 process, {n} thread(s)", flush=True)
    torch.set_num_threads(1)
    runs["2 processes x 1 thread (gloo)"] = measure_processes(2, quick, repeats)
    print("measured 2 processes", flush=True)
    return runs, (load_before[0], os.getloadavg()[0])


def result_tables(runs: dict[str, dict], works: dict[str, dict]) -> tuple[list[str], list[str]]:
    """The rows of the meta-training and of the sampling table, speeds relative to 1 x 1."""
    base = "1 process x 1 thread"
    train_rows = [
        "| workload | setup | meta-updates/s | chain-steps/s | vs 1 x 1 |",
        "|---|---|---:|---:|---:|",
    ]
    sample_rows = ["| workload | setup | chain-steps/s | vs 1 x 1 |", "|---|---|---:|---:|"]
    for key, work in works.items():
        for setup, result in runs.items():
            seconds, windows, chain_steps = result[f"train/{key}"]
            speed = runs[base][f"train/{key}"][0] / seconds
            train_rows.append(
                f"| {work['label']} | {setup} | {windows / seconds:.2f} | "
                f"{chain_steps / seconds:,.0f} | {speed:.2f}x |"
            )
            seconds, chain_steps = result[f"sample/{key}"]
            speed = runs[base][f"sample/{key}"][0] / seconds
            sample_rows.append(
                f"| {work['label']} | {setup} | {chain_steps / seconds:,.0f} | {speed:.2f}x |"
            )
    return train_rows, sample_rows


def command_line(argv: list[str] | None) -> str:
    """The command that reproduces this run, as the section quotes it."""
    return ".venv/bin/python -m speed." + " ".join(
        [Path(__file__).stem, *map(shlex.quote, sys.argv[1:] if argv is None else argv)]
    )


def busy(load: tuple[float, float]) -> bool:
    """Other jobs kept the 2 cores busy: a load average (before or after) above 1.5."""
    return max(load) > 1.5


def setup_text(
    works: dict[str, dict],
    tables: tuple[list[str], list[str]],
    repeats: int,
    command: str,
    load: tuple[float, float],
) -> str:
    """The section up to the tables: what was run, on which machine, and the two tables."""
    toy, mlp = works["toy"], works["mlp"]
    ts, ms = toy["train"], mlp["train"]
    train_rows, sample_rows = tables
    load_before, load_after = load
    cpu = platform.processor() or platform.machine()
    load_remark = (
        " (other jobs were running on the same cores, so the rows are noisy)" if busy(load) else ""
    )
    return f"""
Throughput of meta-training (`MetaTrainer.train`) and sampling (`metasampler.sample` of an
NNSGHMC sampler, `store=False`) with the chains in one process and sharded across two
processes, as `torchrun --nproc_per_node=2` runs them (gloo process group on localhost,
`torch.set_num_threads(1)` per process; started by `torch.multiprocessing` so one script
times everything). The 1-process rows are the unchanged single-process path ("1 process x
2 threads", when measured, uses the same two cores as "2 processes x 1 thread"). Warm-up
first, then the fastest of {repeats} runs; for 2 processes the wall time spans barriers on
both sides (the slower rank decides).

- toy: the paper's meta-training task (Gong et al. 2019, appendix F.1: 10-D Gaussian,
  gradient noise N(0, 1)),
  K = {ts.n_chains} chains, windows of {ts.unroll} steps, cross-chain loss every
  {ts.cross_chain_every} steps, in-chain loss on {ts.in_chain_chains} chains, nets of 40 units;
  {ts.epochs} epochs x {ts.steps_per_sub_epoch} steps. Sampling: {toy["sample"][0]} chains x
  {toy["sample"][1]} steps.
- MLP: a 784-20-10 ReLU BNN (D = 15,910) on 5,000 random MNIST-shaped inputs, minibatch 500,
  K = {ms.n_chains}, windows of {ms.unroll} steps, cross-chain loss every
  {ms.cross_chain_every} steps (no in-chain loss, as in Gong et al. 2019, appendix F.2), nets
  of 10 units;
  {ms.epochs * ms.steps_per_sub_epoch} steps. Sampling: {mlp["sample"][0]} chains x
  {mlp["sample"][1]} steps.

Command: `{command}`

Machine: {os.cpu_count()} CPU cores ({cpu}), torch {torch.__version__}, Python
{platform.python_version()}; run {dt.date.today().isoformat()}, load average
{load_before:.1f} before and {load_after:.1f} after{load_remark}.

Meta-training:

{chr(10).join(train_rows)}

Sampling:

{chr(10).join(sample_rows)}
"""


def notes_text(works: dict[str, dict], load: tuple[float, float]) -> str:
    """The section after the tables: what is communicated and how it is expected to scale."""
    toy, mlp = works["toy"], works["mlp"]
    ts, ms = toy["train"], mlp["train"]
    busy_remark = (
        "; during this run other jobs kept the cores busy (load average above), so a second "
        "process mostly competed for the same CPU time and the rows measure overhead more than "
        "scaling"
        if busy(load)
        else ""
    )
    return f"""
What is communicated (docs/DISTRIBUTED.md has the details). Sampling: nothing per step; an
evaluation (`run_method`) exchanges one `(B, C)` log-sum of the chains' predictive
probabilities per rank at each scoring step plus a status flag, independent of K and D.
Meta-training, per window (meta-update): one `all_gather` of the positions at the
cross-chain times, `T_c x K x D` floats in total (T_c = {slices(ts)} and {slices(ms)} slices
here: {gather_megabytes(toy):.3f} MB for the toy task, {gather_megabytes(mlp):.1f} MB for the
MLP), one `all_gather` of the in-chain
samples (`n_selected x kept steps x D`), one `all_reduce` of the meta-gradient with the loss
values (`P + #params + W + 3` float64, P = number of net weights: ~3,500 for 40-unit nets,
~200 for 10-unit nets; independent of K and D) and two or three status all-reduces of W ints.
Communication therefore grows as O(K D) per window, computation per rank as
O(unroll x K/W x cost of one chain step) plus the Stein estimates, O(T_c (K^2 D + K^3)),
which every rank computes on the gathered positions (replicated, not sharded).

Expected scaling. Two processes can at best double the 1 x 1 rate on two idle
cores{busy_remark}. The toy rows are dominated by per-op overhead (tiny tensors), to which
sharding adds fixed costs per window (the gloo collectives, each a round trip between
processes that the scheduler may not run at the same time); the MLP rows are compute-bound
and gain from sharding only when a free core exists. On multi-GPU nodes (NCCL, one process
per GPU) sampling needs no communication and scales with the number of GPUs as long as each
GPU still gets enough chains x parameters to be busy (K/W x D large: with the paper's
K = 20 and a small MLP one GPU is not saturated, so a few GPUs with more chains each are
better). In meta-training the per-window gather (e.g. K = 50, D = 1e6, T_c = 10: 2 GB of
float32 per window) is a few ms over NVLink (hundreds of GB/s) and ~0.2 s over a
100 Gb/s network; the unrolled steps it follows cost the forward/backward passes of K/W
networks x unroll steps, so within a node communication stays small next to compute, and
across nodes it matters once D is large — raise `cross_chain_every` (fewer gathered
slices) or shard fewer, bigger GPUs. The replicated Stein step limits scaling only for
K in the thousands (K^2 D); the meta-gradient all-reduce is negligible at any size.
"""


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 2)
    runs, load = measure_setups(args.threads, args.quick, repeats)
    works = workloads(args.quick)
    tables = result_tables(runs, works)
    print("\n".join(tables[0]), "\n", "\n".join(tables[1]), sep="\n")
    command = command_line(argv)
    body = setup_text(works, tables, repeats, command, load) + notes_text(works, load)
    print(f"\nload average {load[0]:.1f} -> {load[1]:.1f}")
    if not (args.quick or args.no_write):
        write_section(args.output, SECTION, body)
        print(f"wrote section to {args.output}")


if __name__ == "__main__":
    main()
