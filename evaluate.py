"""Transfer-generalisation benchmark: a meta-trained NNSGHMC against the SG-MCMC baselines.

    python evaluate.py --config configs/eval/quick.yaml [--sampler PATH] [key=value ...] [--resume]

Runs the NNSGHMC sampler file (``--sampler``, else the config's ``sampler_path``) and the
baselines SGLD, pSGLD, SGHMC, mSGNHT (splitting), cSGLD, cSGHMC and the optimisers SGD-M and
Adam on one Bayesian neural network, every method with the same budget (chains, steps,
minibatch size). Each method's per-batch learning rate is first chosen from a small grid by
the validation NLL of short runs, the grid extended beyond an end while the best value sits
there (``tune.max_extensions``) or, with ``tune.edge_tolerance > 0``, while an end scores
within that fraction of the best (a near-tie: each value's score is one noisy run, or the
mean of ``tune.n_seeds`` runs; ``tune.metric`` scores the posterior average, the default, or
the final ensemble). The momentum methods (SGHMC, mSGNHT, cSGHMC) with a
``momentum_decay_grid`` have their friction per step tuned too: the step is tuned at every
friction and the pair with the lowest validation NLL kept, the friction grid extended the same
way. NNSGHMC's friction is its own (learned nets and thermostat): only its step is tuned.
``nnsghmc_constant`` runs the same file with each net replaced by its mean output on the
training run (stored in the file): the ablation of meta-learning. Every method gets the same
warm-up phase (``budget.warmup_steps`` at ``budget.warmup_lr_factor`` x the chosen rate), as
the paper's MNIST code.

    python evaluate.py --suite configs/suite.yaml

runs the whole benchmark suite (the toy Gaussian and every task the suite config lists, each
at its stated budget) and writes one table and its figures (:mod:`metasampler.benchmark.suite`).
The suite runs for hours on a CPU; ``--suite configs/suite.yaml --resume`` continues an
interrupted one: each task already published in the suite's ``out_dir`` under the same run
key (its ``run_key.json``: the resolved config, the sampler file's SHA-256 and the versions of
torch and metasampler) is kept, a task interrupted part way takes back its finished methods
(``--resume`` below), and the rest run; the toy is kept the same way (``toy.json``).

Writes into ``<out_dir>/<name>/``, built in a staging directory and swapped in as a whole at
the end (one atomic rename; an interrupted or failed run leaves earlier results as they
were, and the next run removes the staging directories killed runs left behind):

* ``results.json`` — config, budget, chosen step sizes (and frictions) with the tuning scores
  (initial grid, extensions, interior or not), NNSGHMC's ``alpha``, per-seed final metrics of
  the final K-chain ensemble and of the posterior average, mean ± standard error, learning
  curves, and each sampler's ``prior_variance``: the variance it samples at the chosen
  setting on ``N(0, 1)`` coordinates, the posterior of a weight no training example reaches
  (1 is right; :mod:`metasampler.benchmark.prior_check`), and per seed the final chains'
  ``temperature`` ``theta . grad U(theta) / D`` (1 in expectation over the posterior;
  :mod:`metasampler.benchmark.temperature`);
* ``summary.csv``, ``curves.csv``, ``tuning.csv``; ``table.md`` (markdown table);
* ``learning_curves.png`` (posterior average) and ``learning_curves_ensemble.png`` (K-chain
  ensemble): test error / NLL against epochs and sampling wall-clock (Gong et al. 2019, Fig. 3);
* ``entropy_cdf.png`` (predictive entropy on test and OOD inputs, Zhang et al. 2020, Fig. 4),
  ``calibration.png`` (reliability diagram); ``config.yaml``;
* ``tb/<method>/seed<seed>/`` TensorBoard logs (``tensorboard --logdir <out_dir>``).

Each method is kept in ``<out_dir>/.<name>.finished/`` as soon as it finishes (its entry, its
runs and its TensorBoard logs, checksummed), until the result is published: after an
interruption (Ctrl-C, a killed job, a crash), the same command with ``--resume`` takes those
methods back and runs the others, and publishes what an uninterrupted run would have. It
refuses (exit 2) when the config, the sampler file or the versions differ from the stored
run's, or a stored file was altered; without ``--resume`` a run refuses to start while
finished methods are stored (remove the directory to start afresh;
:mod:`metasampler.benchmark.resume`).

Under ``torchrun --nproc_per_node=N evaluate.py ...`` every method's ``budget.n_chains``
chains are sharded across the processes; ensemble and posterior-average predictions are
combined over all ranks before any metric is computed, and rank 0 writes the results (see
docs/DISTRIBUTED.md).

Exit status: 0 on success; 2 for a bad config, a missing or invalid sampler file, a refused
``--resume``, or missing data (the message says how to install it); 1 when every method
failed; 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path


def _fail(message: str, code: int = 2) -> int:
    if os.environ.get("RANK", "0") == "0":  # under torchrun every rank fails alike: rank 0 says
        print(f"error: {message}", file=sys.stderr)
    return code


class _Stop(Exception):
    """Ends the run with ``message`` and exit status ``code`` (see :func:`_fail`)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.message, self.code = message, code


def _sampler_path(cfg, option: str | None) -> str | None:
    """The NNSGHMC file, validated before any work (``None`` when no enabled method uses one)."""
    from metasampler.benchmark.methods import uses_sampler_file
    from metasampler.export import SamplerFileError, load_sampler

    learned = [k for k in cfg.methods if uses_sampler_file(k) and cfg.methods[k].enabled]
    if not learned:
        return None
    sampler_path = option or cfg.sampler_path
    if not sampler_path:
        raise _Stop(
            f"methods.{learned[0]} is enabled but no sampler file is given: pass --sampler "
            f"PATH or set sampler_path (or methods.{learned[0]}.enabled=false)"
        )
    grid = list(cfg.methods[learned[0]].lr_grid)
    try:
        sampler = load_sampler(sampler_path, lr=grid[0] if grid else None)
    except FileNotFoundError:
        raise _Stop(
            f"sampler file not found: {sampler_path} (pass --sampler PATH, e.g. the "
            "sampler.safetensors that train_meta.py writes into <out_dir>/<name>/, or run "
            f"the baselines only with methods.{learned[0]}.enabled=false)"
        ) from None
    except SamplerFileError as err:
        raise _Stop(str(err)) from None
    except ValueError as err:  # e.g. no step given and none stored in the file
        raise _Stop(f"{sampler_path}: {err}") from None
    for key in learned:  # a section's Gamma override, on the file's design, as its builder loads it
        gamma = getattr(cfg.methods[key].gamma, "value", cfg.methods[key].gamma)
        if cfg.methods[key].enabled and gamma is not None:
            try:
                load_sampler(sampler_path, lr=grid[0] if grid else None, gamma=gamma)
            except ValueError as err:
                raise _Stop(f"methods.{key}.gamma: {err}") from None
    if any(k == "nnsghmc_constant" and cfg.methods[k].enabled for k in learned):
        from metasampler.learned.ablation import stored_net_means

        try:
            stored_net_means(sampler_path)
        except ValueError as err:
            raise _Stop(f"methods.nnsghmc_constant: {err} (or set its enabled=false)") from None
    del sampler
    return sampler_path


def _build_problem(cfg, device):
    """The data and the model: the synthetic problem, else the task's."""
    from omegaconf import OmegaConf

    from metasampler.benchmark import synthetic_classification_problem
    from tasks.data import DataUnavailableError

    try:
        if cfg.synthetic is not None:
            settings = OmegaConf.to_container(cfg.synthetic, resolve=True)
            settings["activation"] = cfg.synthetic.activation.value
            problem = synthetic_classification_problem(**settings, device=device)
        else:
            from tasks.registry import build_problem

            problem = build_problem(cfg.task, seed=cfg.task.seed, device=device)
    except DataUnavailableError as err:
        raise _Stop(f"data unavailable: {err}") from None
    except ImportError as err:
        raise _Stop(f"cannot build task {cfg.task.kind.value!r}: {err}") from None
    except ValueError as err:  # bad classes, batch size larger than the data, ...
        raise _Stop(f"task: {err}") from None
    if not hasattr(problem.data, "x_val") or not hasattr(problem.target, "forward"):
        raise _Stop(
            f"task {problem.name!r} is not a classification problem (evaluate.py needs "
            "Problem.data with train/val/test splits)"
        )
    return problem


def _run_and_publish(cfg, problem, sampler_path: str | None, main_process: bool, resume: bool):
    """Run into a staging directory; publish only a complete result, swapped in as a whole
    (the previous results stay until then). Stale staging left by killed runs goes first.
    In one process each finished method is kept until the result is published, for
    ``--resume``. ``None`` when interrupted (nothing published)."""
    from omegaconf import OmegaConf

    from experiments.run_config import to_yaml
    from metasampler import distributed
    from metasampler.benchmark import run_benchmark, write_results
    from metasampler.benchmark.resume import RUN_KEY_FILE, FinishedMethods, run_key
    from metasampler.files import atomic_write_text
    from metasampler.staging import clean_stale, new_staging_dir, publish_directory

    out_root = Path(cfg.out_dir)
    staging = out_root / f".{cfg.name}.partial-unused"  # (ranks > 0 write nothing)
    finished = None
    key = run_key(OmegaConf.to_container(cfg, resolve=True), sampler_path)
    if main_process:
        out_root.mkdir(parents=True, exist_ok=True)
        clean_stale(out_root, cfg.name)
        if distributed.world_size() == 1:
            finished = FinishedMethods(out_root / f".{cfg.name}.finished", key, resume)
        staging = new_staging_dir(out_root, cfg.name)
    try:
        result = run_benchmark(
            cfg,
            problem,
            sampler_path=sampler_path,
            out_dir=staging,
            progress=cfg.progress,
            finished=finished,
        )
        if main_process:
            write_results(result, staging, to_yaml(cfg))
            atomic_write_text(staging / RUN_KEY_FILE, key)  # what ``--suite --resume`` checks
            publish_directory(staging, out_root / cfg.name)
            if finished is not None:
                finished.discard()
    except KeyboardInterrupt:
        kept = [] if finished is None else finished.stored()
        note = f"; finished methods kept for --resume: {', '.join(kept)}" if kept else ""
        print(f"interrupted; nothing published{note}", file=sys.stderr)
        return None
    finally:
        if main_process:  # a failed run's staging, or the previous results after the swap
            shutil.rmtree(staging, ignore_errors=True)
    return result


def _load_suite(path: str) -> dict:
    """The suite config (``configs/suite.yaml``): checked before any run."""
    from omegaconf import OmegaConf

    try:
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except FileNotFoundError:
        raise _Stop(f"suite config not found: {path}") from None
    except Exception as err:  # YAML syntax
        raise _Stop(f"suite config {path} is not valid YAML: {err}") from None
    if not isinstance(raw, dict) or set(raw) - {"out_dir", "publish_dir", "seeds", "toy", "tasks"}:
        raise _Stop(
            f"suite config {path} must be a mapping of out_dir, publish_dir, seeds, toy and tasks"
        )
    seeds, tasks = raw.get("seeds"), raw.get("tasks") or {}
    if not (isinstance(seeds, list) and seeds and all(type(s) is int for s in seeds)):
        raise _Stop(f"{path}: seeds must be a non-empty list of integers, got {seeds!r}")
    if not isinstance(tasks, dict):
        raise _Stop(f"{path}: tasks must map a task name to its config and overrides")
    for name, task in tasks.items():
        ok = isinstance(task, dict) and isinstance(task.get("config"), str)
        if not ok or not isinstance(task.get("overrides", []), list):
            raise _Stop(f"{path}: tasks.{name} needs config (a path) and overrides (a list)")
    from experiments.benchmark_config import load_benchmark_config
    from metasampler.config import ConfigError

    for name, task in tasks.items():  # every task's config as it will run, before any run
        try:
            load_benchmark_config(task["config"], [str(o) for o in task.get("overrides", [])])
        except (ConfigError, FileNotFoundError) as err:
            raise _Stop(f"{path}: tasks.{name}: {err}") from None
    toy = raw.get("toy")
    if toy is not None and not (isinstance(toy, dict) and {"sampler", "eta"} <= set(toy)):
        raise _Stop(f"{path}: toy needs sampler and eta (and n_chains, n_steps)")
    return {
        "out_dir": raw.get("out_dir", "runs/suite"),
        "publish_dir": raw.get("publish_dir"),
        "seeds": seeds,
        "toy": toy,
        "tasks": tasks,
    }


def _run_suite(path: str, resume: bool = False) -> int:
    """``--suite``: the toy Gaussian and every task of the suite config, then one table and its
    figures in the suite's ``out_dir``; with ``resume``, what an earlier run of the same
    config published is kept."""
    import json
    import time

    from metasampler.benchmark.suite import plot_suite, suite_table

    try:
        suite = _load_suite(path)
    except _Stop as stop:
        return _fail(stop.message, stop.code)
    out = Path(suite["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    toy = _suite_toy(suite, out, resume) if suite["toy"] else None
    summaries = {}
    for name, task in suite["tasks"].items():
        slug = "suite_" + "".join(c if c.isalnum() else "_" for c in name.lower())
        seeds = "seeds=[" + ",".join(str(s) for s in suite["seeds"]) + "]"
        overrides = [*task.get("overrides", []), seeds, f"name={slug}", f"out_dir={out}"]
        kept = _published_task(task["config"], overrides, out / slug) if resume else None
        if kept is not None:
            print(f"\n== {name}: kept from an earlier run of the same config ({out / slug}/)")
            summaries[name] = kept
            continue
        print(f"\n== {name}: {task['config']} {' '.join(overrides)}", flush=True)
        again = resume and (out / f".{slug}.finished").is_dir()  # interrupted part way
        code = main(["--config", task["config"], *overrides, *(["--resume"] if again else [])])
        if code == 0:
            summaries[name] = json.loads((out / slug / "results.json").read_text())
        else:
            print(f"{name}: evaluate.py exited with {code}; left out of the table", flush=True)
    if summaries:
        plot_suite(summaries, out / "suite.png")
    table = suite_table(toy, summaries, time.time() - start)
    (out / "table.md").write_text(table + "\n")
    print("\n" + table)
    print(f"written to {out}/ (table.md, suite.png, toy_kl.png)")
    if suite["publish_dir"]:
        _publish_suite(out, Path(suite["publish_dir"]))
    return 0 if len(summaries) == len(suite["tasks"]) else 1


def _published_task(config: str, overrides: list[str], directory: Path) -> dict | None:
    """The ``results.json`` of a task an earlier suite run published under the key this run
    would have (``None``: run it)."""
    from omegaconf import OmegaConf

    from experiments.benchmark_config import load_benchmark_config
    from metasampler.benchmark.resume import published_under, run_key

    try:
        cfg = load_benchmark_config(config, overrides)
        key = run_key(OmegaConf.to_container(cfg, resolve=True), _sampler_path(cfg, None))
    except _Stop:
        return None  # the task's own run reports what is wrong
    return published_under(directory, key)


def _suite_toy(suite: dict, out: Path, resume: bool) -> dict:
    """The toy Gaussian's rows (:func:`metasampler.benchmark.suite.toy_rows`) and its KL
    figure; with ``resume``, those an earlier run stored under the same key."""
    import json

    import torch

    import metasampler as ms
    from metasampler.benchmark.resume import run_key
    from metasampler.benchmark.suite import plot_toy_kl, toy_rows
    from metasampler.export import PRETRAINED_DIR
    from metasampler.learned.ablation import stored_net_means, with_constant_nets
    from tasks.toy import paper_test_gaussian

    toy = suite["toy"]
    named = PRETRAINED_DIR / f"{toy['sampler']}.safetensors"
    key = run_key(
        {"toy": toy, "seeds": suite["seeds"]}, named if named.is_file() else toy["sampler"]
    )
    stored = out / "toy.json"
    if resume and stored.is_file():
        try:
            kept = json.loads(stored.read_text())
        except (OSError, json.JSONDecodeError):
            kept = None
        if isinstance(kept, dict) and kept.get("run_key") == key:
            print("toy Gaussian: kept from an earlier run of the same config", flush=True)
            return kept["rows"]
    torch.set_num_threads(1)
    eta = float(toy["eta"])

    def learned() -> ms.samplers.Sampler:
        return ms.load_sampler(toy["sampler"], eta=eta)

    def constant() -> ms.samplers.Sampler:
        return with_constant_nets(learned(), stored_net_means(toy["sampler"]))

    samplers = {
        "NNSGHMC (meta-trained)": learned,
        "NNSGHMC, constant nets": constant,
        "SGHMC (C = 1)": lambda: ms.samplers.SGHMC(eta=eta, friction=1.0),
        "mSGNHT-S": lambda: ms.samplers.SGNHT(eta=eta, multivariate=True),
    }
    print(f"toy Gaussian: {len(samplers)} samplers x seeds {suite['seeds']}", flush=True)
    n_chains, n_steps = int(toy.get("n_chains", 50)), int(toy.get("n_steps", 12_000))
    rows = toy_rows(samplers, paper_test_gaussian(), suite["seeds"], n_chains, n_steps)
    plot_toy_kl(rows, out / "toy_kl.png")
    stored.write_text(json.dumps({"run_key": key, "rows": rows}, indent=1))
    return rows


def _publish_suite(out: Path, publish: Path) -> None:
    """Copy the table and figures the documentation shows into ``publish``."""
    publish.mkdir(parents=True, exist_ok=True)
    published = {"table.md": "suite_table.md", "suite.png": "suite.png", "toy_kl.png": "toy_kl.png"}
    for name, copy_name in published.items():
        if (out / name).exists():
            shutil.copyfile(out / name, publish / copy_name)
    print(f"published to {publish}/ ({', '.join(published.values())})")


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--suite"]:
        if len(argv) not in (2, 3) or (len(argv) == 3 and argv[2] != "--resume"):
            return _fail("usage: evaluate.py --suite SUITE.yaml [--resume]")
        return _run_suite(argv[1], resume=len(argv) == 3)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="YAML config (see configs/eval/)")
    parser.add_argument("--sampler", default=None, help="NNSGHMC .safetensors file")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="take back the methods an interrupted run of the same config finished",
    )
    args = parser.parse_intermixed_args(argv)

    from experiments.benchmark_config import load_benchmark_config
    from metasampler.config import ConfigError

    try:
        cfg = load_benchmark_config(args.config, args.overrides)
    except ConfigError as err:
        return _fail(f"config: {err}")

    from metasampler import distributed

    # Threads; under torchrun also join the process group (one GPU per process for CUDA).
    device = distributed.init_from_config(cfg)
    main_process = distributed.is_main_process()  # rank 0 prints and writes the results
    try:
        sampler_path = _sampler_path(cfg, args.sampler)  # 1. the sampler file
        problem = _build_problem(cfg, device)  # 2. the data and the model
    except _Stop as stop:
        return _fail(stop.message, stop.code)
    world = distributed.world_size()
    if main_process:
        shards = f" over {world} processes" if world > 1 else ""
        print(
            f"{problem.name}: D = {problem.target.dim}, N = {problem.target.n_data}; "
            f"{cfg.budget.n_chains} chains x {cfg.budget.n_steps} steps{shards}, "
            f"seeds {list(cfg.seeds)}"
        )
    if args.resume and world > 1:
        return _fail("--resume runs in one process (not under torchrun)")
    from metasampler.benchmark.resume import ResumeError

    try:  # 3. run, publish
        result = _run_and_publish(cfg, problem, sampler_path, main_process, args.resume)
    except ResumeError as err:
        return _fail(str(err))
    if result is None:
        return 130
    if main_process:
        final_dir = Path(cfg.out_dir) / cfg.name
        print()
        print((final_dir / "table.md").read_text())
        print(f"results written to {final_dir}/")
    methods = result.summary["methods"].values()
    if all(m.get("error") or m.get("n_diverged", 0) == len(m.get("runs", [])) for m in methods):
        return _fail("every method failed (diverged or untunable); see the table", code=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
