"""Put a toy sampler file inside its thermostat with its friction scaled on its training task.

    python research/scripts/thermostat_friction_scale.py runs/toy/sampler.safetensors --out OUT \\
        [--scales 1 0.5 0.25 ...] [--seeds 100 101 102] [--tolerance 0.15] [--z 2] \\
        [--n-steps 12000] [--n-chains 50] [--rotated]

A sampler meta-trained without a thermostat learns a friction that also dissipates the
gradient noise's heat; inside the thermostat that friction only slows the chains
(research/NOTEBOOK.md, session 56). This runs the file inside its thermostat on the Gaussian it was
meta-trained on (read from the run's config in the file's header: the task, its gradient
noise, and whether the sampler was told or estimated the noise), at its training step, for each
friction scale from 1 down, and chooses by
:func:`metasampler.benchmark.friction_scale.pick_friction_scale`. It prints the table and writes
``OUT``: the same nets with ``thermostat = True`` and ``d_output_scale`` times the chosen scale,
the rule and its table in the header's provenance. Only toy files (a Gaussian training task).
``--rotated`` also runs the training Gaussian in a random orthonormal basis and keeps the
smallest scale both accept: the shipped toy files keep their full friction that way.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from metasampler.cli import positive_float, positive_int  # noqa: E402

GAUSSIAN_KINDS = ("gaussian", "paper_train_gaussian", "paper_test_gaussian", "random_gaussians")
ROTATION_SEED = (
    7  # --rotated: the basis of research/scripts/toy_unseen_targets.py's train10_rotated
)


def training_run(path: Path):
    """The run config in ``path``'s header (omegaconf), or a ValueError saying why not."""
    from omegaconf import OmegaConf

    from metasampler.export import training_config

    config = training_config(path)
    if not config:
        raise ValueError(f"{path}: its header holds no training config to read the task from")
    kind = OmegaConf.select(config, "task.kind", default=None)
    if kind not in GAUSSIAN_KINDS:
        raise ValueError(f"{path}: trained on task.kind={kind!r}, not a toy Gaussian")
    return config


def training_task(path: Path, config):
    """The exact Gaussian the run trained on (with its energy constant, as trained)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from tasks.config import TaskConfig
    from tasks.registry import build_problem

    try:
        task_cfg = OmegaConf.merge(OmegaConf.structured(TaskConfig), config.task)
    except OmegaConfBaseException as err:  # a config this version does not know
        raise ValueError(f"{path}: its training task cannot be rebuilt: {err}") from None
    return build_problem(task_cfg).exact


def main(argv: list[str] | None = None) -> int:
    from metasampler.benchmark.friction_scale import DEFAULT_FRICTION_SCALES

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("sampler", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="the file to write")
    parser.add_argument("--scales", type=positive_float, nargs="+", default=DEFAULT_FRICTION_SCALES)
    parser.add_argument("--seeds", type=int, nargs="+", default=[100, 101, 102])
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--z", type=float, default=2.0, help="standard errors a rise must pass")
    parser.add_argument("--n-steps", type=positive_int, default=12_000)
    parser.add_argument("--n-chains", type=positive_int, default=50)
    parser.add_argument(
        "--rotated",
        action="store_true",
        help="also run the training Gaussian in a random orthonormal basis and choose the "
        "smallest scale both accept (correlated targets of moderate conditioning are where a "
        "scaled friction costs accuracy: research/NOTEBOOK.md, session 57)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from metasampler.benchmark.friction_scale import choose_friction_scale
    from omegaconf import OmegaConf

    import metasampler as ms
    from metasampler.export import read_header, save_sampler

    if not args.out.parent.is_dir():  # before minutes of runs, not after
        print(
            f"error: --out {args.out}: directory {args.out.parent} does not exist", file=sys.stderr
        )
        return 2
    try:
        config = training_run(args.sampler)
        sampler = ms.load_sampler(args.sampler)  # at its training step
        if sampler.thermostat:  # its friction may be scaled already: start from the trained file
            raise ValueError(f"{args.sampler} already runs inside its thermostat")
        # the noise as the sampler met it in training: told (grad_noise_var) or estimated
        told = OmegaConf.select(config, "sampler.grad_noise_var", default=None)
        sampler.grad_noise_var = float(told or 0.0)
        estimate = OmegaConf.select(config, "sampler.grad_noise_estimate", default=False)
        sampler.grad_noise_estimate = bool(estimate)
        task = training_task(args.sampler, config)
        choice = choose_friction_scale(
            sampler,
            [task, task.rotated(ROTATION_SEED)] if args.rotated else task,
            scales=args.scales,
            seeds=args.seeds,
            tolerance=args.tolerance,
            z=args.z,
            n_chains=args.n_chains,
            n_steps=args.n_steps,
            grad_noise_std=float(config.task.grad_noise_std),
        )
    except (FileNotFoundError, ValueError, ms.SamplerFileError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(choice.table())
    print(f"chosen friction scale: {choice.scale:g}")
    sampler.thermostat = True
    sampler.d_output_scale *= choice.scale
    provenance = dict(read_header(args.sampler)["provenance"])
    provenance["set_after_training"] = (
        f"thermostat=True and d_output_scale x {choice.scale:g} set after training by "
        f"research/scripts/thermostat_friction_scale.py (tolerance {choice.tolerance:g}, z {choice.z:g}, "
        f"chain seeds {list(args.seeds)}) on the training task"
        + (
            f" (task 0) and it in a rotated basis (task 1, seed {ROTATION_SEED})"
            if args.rotated
            else ""
        )
        + f":\n{choice.table()}"
    )
    save_sampler(sampler, args.out, provenance=provenance)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
