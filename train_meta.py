"""Meta-train an NNSGHMC sampler.

    python train_meta.py --config configs/toy_gaussian.yaml [key=value ...] [--resume]

Writes to ``<out_dir>/<name>/``: ``config.yaml``, TensorBoard logs (``tb/``), ``scalars.csv``,
``checkpoint.pt`` (atomic and checksummed, every ``train.checkpoint_every`` epochs) and the
trained sampler ``sampler.safetensors`` (load with ``metasampler.load_sampler``). ``--resume``
continues an interrupted run from its last checkpoint; a fixed seed gives a reproducible run.

    torchrun --nproc_per_node=2 train_meta.py --config configs/toy_gaussian.yaml

shards the ``train.n_chains`` chains across the processes (``distributed.backend``: gloo on
CPU, NCCL on GPU); rank 0 writes everything; see docs/DISTRIBUTED.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from experiments.run_config import load_config, to_yaml
from metasampler import distributed
from metasampler.benchmark import gaussian_benchmark
from metasampler.config import ConfigError
from metasampler.learned import NNSGHMC
from metasampler.learned.ablation import net_means
from metasampler.learned.fast import training_compile_pays
from metasampler.logs import RunLogger, plot_sampler_nets
from metasampler.meta.build import build_sampler, settings_from_config, with_step
from metasampler.meta.checkpoint import History
from metasampler.meta.trainer import MetaTrainer, TrainingDivergedError
from tasks.registry import ProblemFamily, build_problem


def main(argv: list[str] | None = None) -> int:
    """Meta-train as the command line says; returns the exit code (2: bad config or run
    directory, 1: training diverged)."""
    args = _parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2

    # Threads; under torchrun also join the process group (one GPU per process for CUDA).
    device = distributed.init_from_config(cfg)
    main_process = distributed.is_main_process()  # rank 0 writes logs, checkpoints, sampler
    run_dir = Path(args.run_dir or Path(cfg.out_dir) / cfg.name)
    error = distributed.broadcast_object(_run_dir_error(run_dir, args.resume))
    if error is not None:  # rank 0's run directory decides for all
        if main_process:
            print(f"error: {error}", file=sys.stderr)
        return 2
    if main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not args.resume:  # a resumed run's config.yaml changes only once resume succeeds
            (run_dir / "config.yaml").write_text(to_yaml(cfg))

    sampler, problems = _prepare_sampler(cfg, device, calibrate=not args.resume)
    logger = RunLogger(run_dir, enabled=main_process)
    logger.text("config", "```\n" + to_yaml(cfg) + "\n```")
    try:
        trainer = MetaTrainer(
            sampler,
            problems,
            settings_from_config(cfg.train),
            run_dir=run_dir,
            seed=cfg.seed,
            logger=logger,
            evaluate=_evaluation(cfg, logger, device, main_process),
            progress=cfg.progress,
            # Resume compares this with the checkpoint's copy and refuses a different run.
            extra_checkpoint={
                "config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
            },
        )
    except ConfigError as err:  # e.g. a truncation schedule that torchrun does not shard
        if main_process:
            print(f"config error: {err}", file=sys.stderr)
        logger.close()
        return 2
    if args.resume and not _resume(trainer, cfg, run_dir, logger, main_process):
        return 2
    start = time.time()
    try:
        history = trainer.train()
    except TrainingDivergedError as err:
        if main_process:
            print(f"error: {err}", file=sys.stderr)
        logger.close()
        return 1
    finally:
        logger.close()
    elapsed = time.time() - start
    if main_process:
        trained = trainer.final_sampler()
        _save(trained, cfg, run_dir, history, elapsed, _net_means(trained, problems, cfg, device))
    return 0


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="YAML config (see configs/)")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    parser.add_argument("--run-dir", default=None, help="default: <out_dir>/<name>")
    return parser.parse_intermixed_args(argv)


def _run_dir_error(run_dir: Path, resume: bool) -> str | None:
    """Why ``run_dir`` cannot take this run (``None`` if it can)."""
    checkpoint = run_dir / "checkpoint.pt"
    if run_dir.exists() and not run_dir.is_dir():
        return f"run directory {run_dir} exists but is not a directory"
    if checkpoint.exists() and not resume:
        return (
            f"{run_dir} already holds a checkpoint; pass --resume to continue it or "
            "choose another name=... / --run-dir"
        )
    if resume and not checkpoint.exists():
        return f"--resume given but there is no checkpoint at {checkpoint}"
    return None


def _prepare_sampler(
    cfg: DictConfig, device: torch.device, *, calibrate: bool
) -> tuple[NNSGHMC, ProblemFamily]:
    """The sampler to train (input statistics calibrated on the first problem unless
    resuming, identical on every rank) and the family of training problems."""
    main_process = distributed.is_main_process()
    sampler = build_sampler(cfg.sampler, seed=cfg.seed).to(device)
    problems = ProblemFamily(cfg.task, device=device)
    first = problems(0, torch.Generator(device=device).manual_seed(cfg.seed))
    if _compiles_steps(cfg, first.target.dim, device, main_process):
        sampler.use_compile = True
    if cfg.sampler.calibrate_steps and calibrate:
        # Calibrate from the problem's own initialisation (as the training chains start),
        # not the driver's default N(0, I) positions (far off for network weights).
        calibration_init = first.init(
            cfg.train.n_chains, torch.Generator(device=device).manual_seed(cfg.seed)
        )
        stats = sampler.calibrate(
            first.target,
            n_chains=cfg.train.n_chains,
            n_steps=cfg.sampler.calibrate_steps,
            init=calibration_init,
            seed=cfg.seed,
        )
        if main_process:
            print("input statistics:", {k: round(v, 4) for k, v in stats.items()})
    sampler.train_dim.fill_(first.target.dim)
    distributed.broadcast_module(sampler)  # every rank starts from rank 0's nets
    return sampler, problems


def _compiles_steps(cfg: DictConfig, dim: int, device: torch.device, main_process: bool) -> bool:
    """``train.compile_steps``, or where it is ``null`` whether compiling pays for this problem
    (:func:`~metasampler.learned.fast.training_compile_pays`; then said once)."""
    if cfg.train.compile_steps is not None:
        return bool(cfg.train.compile_steps)
    pays = training_compile_pays(cfg.train.n_chains * dim, device)
    if pays and main_process:
        print(
            "compiling the meta-training step (the first window waits about a minute; "
            "train.compile_steps=false keeps it eager)",
            file=sys.stderr,
        )
    return pays


def _evaluation(
    cfg: DictConfig, logger: RunLogger, device: torch.device, main_process: bool
) -> Callable[[NNSGHMC, int], dict[str, float]]:
    """The trainer's periodic evaluation: net plots and parameter histograms, and the
    Gaussian benchmark on ``cfg.eval.task`` when it has an exact answer."""
    evaluating = cfg.train.eval_every and main_process  # (the trainer evaluates on rank 0)
    eval_problem = build_problem(cfg.eval.task, device=device) if evaluating else None

    def evaluate(trained: NNSGHMC, epoch: int) -> dict[str, float]:
        logger.figure("nets/contours", plot_sampler_nets(trained), epoch)
        for name, param in trained.named_parameters():
            logger.histogram(f"params/{name}", param, epoch)
        if eval_problem is None or eval_problem.exact is None:
            return {}
        test_sampler = with_step(trained, cfg.eval.eta, cfg.eval.lr)
        return gaussian_benchmark(
            test_sampler,
            eval_problem.exact,
            n_chains=cfg.eval.n_chains,
            n_steps=cfg.eval.n_steps,
            kl_at=list(cfg.eval.kl_at),
            grad_noise_std=cfg.eval.task.grad_noise_std,
            init_low=cfg.eval.task.init_low,
            init_high=cfg.eval.task.init_high,
            seed=cfg.seed,
        )

    return evaluate


def _resume(
    trainer: MetaTrainer, cfg: DictConfig, run_dir: Path, logger: RunLogger, main_process: bool
) -> bool:
    """Load the last checkpoint; on failure print why, close the logger and return False."""
    try:
        done = trainer.resume()
    except (FileNotFoundError, ValueError) as err:  # unreadable, or another world size
        if main_process:
            print(f"error: {err}", file=sys.stderr)
        logger.close()
        return False
    if main_process:
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        print(f"resuming {run_dir} after epoch {done}")
    return True


def _net_means(
    sampler: NNSGHMC, problems: ProblemFamily, cfg: DictConfig, device: torch.device
) -> dict[str, float]:
    """The nets' mean outputs over one segment of chains on the first training problem, for
    the constant-net ablation (:mod:`metasampler.learned.ablation`)."""
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    problem = problems(0, generator)
    init = problem.init(cfg.train.n_chains, generator)
    means = net_means(sampler, problem.target, init, cfg.train.steps_per_sub_epoch, seed=cfg.seed)
    return {name: float(f"{value:.6g}") for name, value in means.items()}


def _save(
    sampler: NNSGHMC,
    cfg: DictConfig,
    run_dir: Path,
    history: History,
    elapsed: float,
    means: dict[str, float],
) -> None:
    """Write the trained sampler with its provenance and print the closing lines."""
    out = run_dir / "sampler.safetensors"
    sampler.save(
        str(out),
        provenance={
            "config": to_yaml(cfg),
            "seed": cfg.seed,
            # all epochs, including those before a --resume
            "train_seconds": round(history.seconds, 1),
            "net_means": means,
        },
    )
    print(f"trained {cfg.train.epochs} epochs in {elapsed:.0f} s; sampler saved to {out}")
    if history.evals:
        print("last evaluation:", {k: round(v, 4) for k, v in history.evals[-1].items()})


if __name__ == "__main__":
    sys.exit(main())
