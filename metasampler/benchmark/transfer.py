"""The transfer-generalisation benchmark (Gong et al. 2019, §5.2, Table 1, Fig. 3): every enabled
method is tuned on the validation split, then runs every seed with the chosen step
(:func:`run_benchmark`; one method's tuning and seeds: :class:`MethodBenchmark`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from ..adapt import Adapt
from ..distributed import is_main_process, world_size
from ..samplers import Sampler
from ..schedules import WarmUp
from ..targets import NonFiniteError
from .methods import FRICTION, METHODS, method_label
from .metrics import frame_targets, is_sequence_model
from .prior_check import prior_only_variances, sampled_variance
from .protocol import MethodFactory
from .results import BenchmarkResult, seed_statistics
from .resume import FinishedMethods
from .run import EvalSet, MethodRun, run_method
from .tuning import TuneResult, TuningError, tune_step_size

__all__ = ["MethodBenchmark", "run_benchmark"]


class _Progress:
    """One tqdm bar over all steps of a benchmark (tuning and evaluation)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = tqdm(total=total, disable=not enabled, unit="step", dynamic_ncols=True)

    def tick(self, _step: int) -> None:
        self.bar.update(1)

    def skip(self, steps: int) -> None:
        self.bar.update(steps)

    def extend(self, steps: int) -> None:
        self.bar.total += steps
        self.bar.refresh()

    def describe(self, text: str) -> None:
        self.bar.set_description(text)


class _CurveLogger:
    """Streams a seed's learning-curve rows to TensorBoard (nothing without a writer)."""

    def __init__(self, writer: Any) -> None:
        self.writer, self.start = writer, time.time()

    def __call__(self, row: dict[str, float]) -> None:
        if self.writer is None:
            return
        step, wall = int(row["step"]), self.start + row["seconds"]
        for name in ("ensemble_error", "ensemble_nll", "average_error", "average_nll"):
            value = row[name]
            if math.isfinite(value):
                prefix, metric = name.split("_", 1)
                self.writer.add_scalar(f"{prefix}/test_{metric}", value, step, walltime=wall)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


@dataclass
class _Setting:
    """What every tuning and evaluation run of one benchmark shares."""

    cfg: Any
    problem: Any
    sampler_path: str | os.PathLike | None
    test: EvalSet
    extra: dict[str, EvalSet]
    val: EvalSet
    progress: _Progress
    log: Callable[[str], None]
    tb_root: Path
    main_process: bool

    def run(self, sampler: Sampler, phase: Any, **budget: Any) -> MethodRun:
        """:func:`run_method` on the problem's target, with the shared scoring settings and
        the run length, burn-in and thinning of ``phase`` (``cfg.budget`` or ``cfg.tune``)."""
        return run_method(
            sampler,
            self.problem.target,
            self.problem.init,
            n_steps=phase.n_steps,
            burn_in=phase.burn_in,
            thin=phase.thin,
            eval_batch_size=self.cfg.budget.eval_batch_size,
            ece_bins=self.cfg.ece_bins,
            on_step=self.progress.tick,
            **budget,
        )

    def writer(self, *parts: str) -> Any:
        """A TensorBoard writer under ``<out_dir>/tb/<parts>``; ``None`` when off or rank > 0."""
        if not self.cfg.tensorboard or not self.main_process:
            return None
        from torch.utils.tensorboard import SummaryWriter  # optional dependency

        return SummaryWriter(log_dir=str(self.tb_root.joinpath(*parts)))


class MethodBenchmark:
    """One method of a benchmark: step-size tuning on the validation split (with each option
    whose grid its section sets, e.g. the friction's ``momentum_decay_grid``, one option after
    the other), then every seed with the chosen values. :meth:`run` fills :attr:`entry` (the
    method's part of ``results.json``) and :attr:`runs`."""

    def __init__(self, key: str, setting: _Setting, adapted: bool = False) -> None:
        cfg = setting.cfg
        self.spec, self.setting = METHODS[key], setting
        # (tune.mode adapt or both: the step is chosen in every seed's burn-in instead)
        self.adapted = adapted
        self.key = f"{key}_adapted" if adapted and cfg.tune.mode == "both" else key
        self.section = OmegaConf.to_container(cfg.methods[key], resolve=True)
        self.make = MethodFactory(
            key,
            self.section,
            setting.problem.target.n_data,
            cfg.budget.warmup_steps,
            cfg.budget.warmup_lr_factor,
            setting.sampler_path,
            str(setting.problem.target.device),
        )
        grid = self.spec.grid(self.section)
        self.base_grid: list[float | None] = grid if grid else [None]  # None: the stored step
        self.grid = self.base_grid  # the step grid at the current option value
        self.stages = self.spec.tuning_stages(self.section)  # options tuned with it, in order
        self.option = self.spec.tuned_option(self.section)  # the stage's option (or None)
        self.entry: dict[str, Any] = {
            "label": method_label(key, self.section) + (", adapted" if adapted else ""),
            "is_sampler": self.spec.is_sampler,
        }
        self.tuning_rows: list[dict[str, Any]] = []
        self.lr_tunings: dict[float, TuneResult] = {}  # option value -> its step tuning
        self.runs: dict[int, MethodRun] = {}

    @property
    def tuned(self) -> bool:
        """Whether anything is tuned (tuning on and more than one value in a grid)."""
        sizes = self.spec.stage_grid_sizes(self.section)
        tuning = self.setting.cfg.tune.enabled and not self.adapted
        return tuning and max(len(self.base_grid), *sizes, 0) > 1

    @property
    def option_grid(self) -> list[float]:
        """The grid of the current stage's option (empty: its fixed value, or none)."""
        return self.spec.option_grid(self.section, self.option)

    @property
    def option_value(self) -> float | None:
        """The current value of the current stage's option (``None`` for a method without; a
        whole number for a step)."""
        return self._value_of(self.option)

    def _value_of(self, option: str | None) -> float | None:
        value = None if option is None else self.make.options.get(option)
        if value is None:
            return None
        return float(value)

    @property
    def reported_options(self) -> list[str]:
        """The options tuned with the step, in order (or the first option, whose fixed value
        is reported), then every other option whose value the section fixes, so that a part
        run on other seeds with the values fixed records what the tuned part chose (empty for
        a method without any)."""
        first = self.stages or ([self.option] if self.option else [])
        fixed = [
            o for o in self.spec.tuned_options if o not in first and self._value_of(o) is not None
        ]
        return first + fixed

    def option_values(self) -> dict[str, float | None]:
        """The current value of every option in :attr:`reported_options`."""
        return {option: self._value_of(option) for option in self.reported_options}

    def run(self) -> bool:
        """Tune and run every seed; ``False`` when tuning failed and the method was skipped."""
        if self.adapted:
            return self._run_adapted()
        if self.tuned:
            try:
                chosen = self._tune()
            except TuningError as err:
                self._skip(err)
                return False
        else:  # the first value of each grid, as for the step
            chosen = self.base_grid[0]
            for option in self.stages:
                self._use_option(self.spec.option_grid(self.section, option)[0], option)
        self._record_choice(chosen)
        per_seed = [self._run_seed(chosen, int(seed)) for seed in self.setting.cfg.seeds]
        self.entry["runs"] = per_seed
        self.entry.update(seed_statistics([r["final"] for r in per_seed], per_seed))
        return True

    def _run_adapted(self) -> bool:
        """Every seed chooses its step (and friction) in its own burn-in
        (:mod:`metasampler.adapt`), from the middle of the step grid (the stored step without
        one), ranked by the validation NLL; the other options at their grids' first values.
        The entry reports the median choice over seeds and each seed's."""
        start_lr, options = self.spec.adapt_start(self.section)
        for option, value in options.items():
            self._use_option(value, option)
        per_seed = [self._run_seed(start_lr, int(seed)) for seed in self.setting.cfg.seeds]
        n_data, order = self.setting.problem.target.n_data, self.spec.sampler_class.order
        choices = []
        for seed in self.setting.cfg.seeds:
            adapted = self.runs[int(seed)].adapted
            if adapted is not None:
                lr = adapted.eta * n_data if order == "first" else adapted.eta**2 * n_data
                choices.append(
                    {"seed": int(seed), "lr": lr, "eta": adapted.eta,
                     FRICTION: adapted.friction_per_step, "criterion": adapted.criterion}
                )  # fmt: skip

        def median(name: str) -> float | None:
            values = sorted(c[name] for c in choices if c[name] is not None)
            return values[len(values) // 2] if values else None

        budget = self.setting.cfg.budget
        self.entry.update(
            lr=median("lr"),
            eta=median("eta"),
            start_lr=start_lr,
            start_eta=self.make.eta(start_lr, budget.n_steps),
            adapted=choices,
            tuning=[],
            tuning_grid=[],
            tuning_extensions=[],
            tuning_interior=None,
            warmup_eta=None,
            error=None,
        )
        if self.spec.tuned_options:
            self.entry[FRICTION] = median(FRICTION)
        self.entry["runs"] = per_seed
        self.entry.update(seed_statistics([r["final"] for r in per_seed], per_seed))
        lrs = ", ".join(f"{c['lr']:.3g}" for c in choices)
        self.setting.log(f"{self.entry['label']}: adapted from lr={start_lr} to lr {lrs}")
        return True

    def _adapt(self) -> Adapt | None:
        """What the evaluation runs adapt (``None``: nothing)."""
        if not self.adapted:
            return None
        val, tune = self.setting.val, self.setting.cfg.tune
        return Adapt(validation=(val.x, val.y), max_validation=tune.max_val or 1000)

    # -- tuning ------------------------------------------------------------------------------
    def _tune(self) -> float:
        """The chosen step (and, with option grids, the options' chosen values left in
        :attr:`make`): the step alone, or one stage per option of :attr:`stages`."""
        self.setting.progress.describe(f"tune {self.spec.label}")
        for i, option in enumerate(self.stages or [self.option]):
            if i:  # the next option's stage, from the step chosen so far
                self._begin_stage(option, self.lr_tunings[self.option_value].best)
            if len(self.option_grid) > 1:
                self._tune_option()
            else:  # no grid, or a grid of one value: the step alone
                if self.option_grid:
                    self._use_option(self.option_grid[0])
                self.lr_tunings[self.option_value] = self._tune_step()
        tuned = self.lr_tunings[self.option_value]
        self.entry.update(
            tuning_grid=tuned.grid,
            tuning_extensions=tuned.extensions,
            tuning_interior=tuned.interior,
        )
        return tuned.best

    def _tune_step(self) -> TuneResult:
        """The step tuned at the current option value."""
        tune = self.setting.cfg.tune
        return tune_step_size(self._objective, self.grid, tune.max_extensions, tune.edge_tolerance)

    def _tune_option(self) -> None:
        """Tune the step at every value of the option's grid (extended like the step's) and
        keep the value whose best step scored lowest."""
        option = self.option

        def best_score(value: float) -> float:
            self._use_option(value)
            self.grid = self._step_grid_near(value)
            if len(self.grid) == 1:  # only the option is tuned: one run scores it (a
                score = self._objective(self.grid[0])  # NonFiniteError scores inf, outside)
                self.lr_tunings[value] = TuneResult(
                    self.grid[0], [(self.grid[0], score)], grid=self.grid
                )
                return score
            try:
                tuned = self._tune_step()
            except TuningError:
                return math.inf
            self.lr_tunings[value] = tuned
            return min(score for _, score in tuned.scores)

        tune = self.setting.cfg.tune
        outer = tune_step_size(
            best_score,
            self.option_grid,
            tune.max_extensions,
            tune.edge_tolerance,
        )
        self._use_option(outer.best)
        self.grid = self.lr_tunings[outer.best].grid
        self.entry.update(
            {
                f"{option}_grid": outer.grid,
                f"{option}_extensions": outer.extensions,
                f"{option}_interior": outer.interior,
            }
        )

    def _begin_stage(self, option: str, chosen_step: float) -> None:
        """Tune ``option`` next, the options before it fixed at their chosen values, from a
        step grid centred on the step chosen so far."""
        self.base_grid = self.grid = self._grid_centred_on(chosen_step)
        self.option = option
        self.lr_tunings = {}

    def _step_grid_near(self, value: float) -> list[float | None]:
        """The step grid at option value ``value``: the configured grid, moved geometrically so
        that its middle value is the best step of the nearest value tuned so far (the best step
        moves with the friction; a grid that stayed put would spend its extensions catching
        up)."""
        if not self.lr_tunings:
            return self.base_grid
        nearest = min(self.lr_tunings, key=lambda v: abs(math.log(v / value)))
        return self._grid_centred_on(self.lr_tunings[nearest].best)

    def _grid_centred_on(self, step: float) -> list[float | None]:
        """:attr:`base_grid` moved geometrically so that its middle value is ``step``."""
        if len(self.base_grid) < 2:
            return self.base_grid
        scale = step / sorted(self.base_grid)[len(self.base_grid) // 2]
        return [float(f"{lr * scale:.6g}") for lr in self.base_grid]

    def _use_option(self, value: float, option: str | None = None) -> None:
        """Build the method with ``option`` (default: the current stage's) at ``value`` from
        now on."""
        option = option or self.option
        options = {**self.make.options, option: value}
        self.make = dataclasses.replace(self.make, options=options)

    def _planned(self, lr: float) -> bool:
        """Whether a tuning run at ``lr`` and the current option value is one of the initial
        grids' runs (counted in the progress bar's total) rather than an extension."""
        return lr in self.grid and (not self.option_grid or self.option_value in self.option_grid)

    def _objective(self, lr: float) -> float:
        """Validation NLL (``tune.metric``: of the posterior average or of the final
        ensemble) of a short run at ``lr``, the mean over ``tune.n_seeds`` runs (seeds
        ``tune.seed``, ``tune.seed + 1``, ...)."""
        tune, progress = self.setting.cfg.tune, self.setting.progress
        if not self._planned(lr):  # an extension of a grid: more tuning runs
            progress.extend(tune.n_steps * tune.n_seeds)
        kind = tune.metric.removesuffix("_nll")  # the "average" or the "ensemble" metrics
        nlls, errors = [], []
        for i in range(tune.n_seeds):
            result = self.setting.run(
                self.make(lr, tune.n_steps),
                tune,
                main=self.setting.val,
                n_chains=tune.n_chains or self.setting.cfg.budget.n_chains,
                eval_every=tune.n_steps,
                seed=tune.seed + i,
            )
            if result.diverged_at is not None:
                progress.skip(tune.n_steps * (tune.n_seeds - i) - result.diverged_at)
                break
            nlls.append(result.final[f"{kind}_nll"])
            errors.append(result.final[f"{kind}_error"])
        diverged = result.diverged_at is not None
        row = {
            "lr": lr,
            "val_nll": math.inf if diverged else statistics.fmean(nlls),
            "val_error": math.nan if diverged else statistics.fmean(errors),
            "diverged_at": result.diverged_at,
        }
        if tune.n_seeds > 1:
            row["val_nll_per_seed"] = nlls
        for option, value in self.option_values().items():
            if value is not None:  # (None: the file's value is kept)
                row[option] = value
        if len(self.stages) > 1:
            row["stage"] = self.option  # the option whose stage the run belongs to
        row["extension"] = lr not in self.grid
        self.tuning_rows.append(row)
        if diverged:
            raise NonFiniteError(result.message or "diverged", step=result.diverged_at)
        return row["val_nll"]

    def _skip(self, err: TuningError) -> None:
        rows = self.tuning_rows
        self.entry.update(
            lr=None,
            eta=None,
            tuning=rows,
            tuning_grid=self.grid,
            tuning_extensions=[r["lr"] for r in rows if r["lr"] not in self.grid],
            tuning_interior=None,
            runs=[],
            summary={},
            error=str(err),
        )
        cfg = self.setting.cfg
        self.setting.log(f"{self.spec.label}: {err}; skipped")
        self.setting.progress.skip(len(cfg.seeds) * cfg.budget.n_steps)

    def _record_choice(self, chosen: float | None) -> None:
        """The chosen step, the tuning scores and the protocol's values, in :attr:`entry`."""
        n_steps = self.setting.cfg.budget.n_steps
        eta = self.make.eta(chosen, n_steps)
        lr_used = self.make(None, n_steps).lr if chosen is None else chosen  # None: file's step
        values = self.option_values()
        for row in self.tuning_rows:
            row["eta"] = self.make.eta(row["lr"], n_steps)
            row["chosen"] = row["lr"] == chosen and all(row.get(o) == v for o, v in values.items())
        entry = self.entry
        entry.update(lr=lr_used, eta=eta, tuning=self.tuning_rows, error=None)
        entry.update(values)
        if self.option is not None:
            entry["tuned_option"] = self.option
        if len(self.stages) > 1:
            entry["tuned_options"] = self.stages
        entry.setdefault("tuning_grid", [v for v in self.grid if v is not None])
        entry.setdefault("tuning_extensions", [])
        entry.setdefault("tuning_interior", None)
        evaluated = self.make(chosen, n_steps)
        schedule = evaluated.schedule
        entry["warmup_eta"] = schedule.scale * eta if isinstance(schedule, WarmUp) else None
        if self.spec.is_sampler:
            entry["prior_variance"] = self._prior_variance(chosen)
        self._log_tuning(chosen, lr_used, eta)

    def _prior_variance(self, chosen: float | None) -> float:
        """The variance the method samples, at the chosen setting, where only the prior acts
        (:mod:`~metasampler.benchmark.prior_check`; 1 is right)."""
        budget = self.setting.cfg.budget
        rows = prior_only_variances(
            lambda: self.make(chosen, budget.n_steps),
            self.setting.problem.target.n_data,
            budget.n_chains,
            budget.n_steps,
            device=self.setting.cfg.device,
        )
        return sampled_variance(rows, budget.burn_in, budget.n_steps)

    def _log_tuning(self, chosen: float | None, lr_used: float, eta: float) -> None:
        rows, values = self.tuning_rows, self.option_values()
        if rows:
            scores = ", ".join(_scored_run(r, list(values)) for r in rows)
            choice = f"lr={chosen:g} ({_WHERE[self.entry['tuning_interior']]})"
            for option in self.stages:
                if len(self.spec.option_grid(self.section, option)) > 1:
                    where = _WHERE[self.entry[f"{option}_interior"]]
                    choice += f", {option}={values[option]:g} ({where})"
            self.setting.log(f"{self.spec.label}: tuning (val NLL) {scores} -> {choice}")
        writer = self.setting.writer(self.spec.key, "tune")
        if writer is not None:
            for i, row in enumerate(rows):
                nll = row["val_nll"]
                writer.add_scalar("tune/val_nll", nll if math.isfinite(nll) else math.inf, i)
                writer.add_scalar("tune/lr", row["lr"], i)
                for option in values:
                    if row.get(option) is not None:
                        writer.add_scalar(f"tune/{option}", row[option], i)
            chosen_text = f"lr={lr_used}, eta={eta:.6g}"
            for option, value in values.items():
                if value is not None:
                    chosen_text += f", {option}={value:g}"
            writer.add_text("tune/chosen", chosen_text)
            writer.close()

    # -- evaluation --------------------------------------------------------------------------
    def _run_seed(self, chosen: float | None, seed: int) -> dict[str, Any]:
        setting, budget = self.setting, self.setting.cfg.budget
        setting.progress.describe(f"{self.spec.label} seed {seed}")
        curve_log = _CurveLogger(setting.writer(self.key, f"seed{seed}"))
        result = setting.run(
            self.make(chosen, budget.n_steps),
            budget,
            main=setting.test,
            extra=setting.extra,
            n_chains=budget.n_chains,
            eval_every=budget.eval_every,
            seed=seed,
            on_eval=curve_log,
            adapt=self._adapt(),
        )
        curve_log.close()
        if result.diverged_at is not None:
            setting.progress.skip(budget.n_steps - result.diverged_at)
            setting.log(f"{self.spec.label} seed {seed}: diverged: {result.message}")
        self.runs[seed] = result
        return {
            "seed": seed,
            "final": dict(result.final),
            "diverged_at": result.diverged_at,
            "message": result.message,
            "curves": result.curves,
        }


#: How the log names an interior or edge choice.
_WHERE = {True: "interior", False: "grid edge", None: ""}


def _scored_run(row: dict[str, Any], options: list[str]) -> str:
    """``lr: val NLL`` of a tuning row, after the options' values where the row has them."""
    values = [f"{o}={row[o]:g}" for o in options if row.get(o) is not None]
    return " ".join([*values, f"{row['lr']:g}: {row['val_nll']:.4f}"])


def _eval_sets(cfg: Any, data: Any, device: torch.device) -> tuple[EvalSet, dict, EvalSet]:
    """The test set, the unlabeled sets (``ood``) and the validation set, cut to the config's
    limits and moved to ``device``."""
    x_test, y_test = data.x_test, data.y_test
    if cfg.budget.max_test:
        x_test, y_test = x_test[: cfg.budget.max_test], y_test[: cfg.budget.max_test]
    extra: dict[str, EvalSet] = {}
    if data.ood_x is not None and cfg.ood_max:
        extra["ood"] = EvalSet(data.ood_x[: cfg.ood_max].to(device))
    x_val, y_val = data.x_val, data.y_val
    if cfg.tune.max_val:
        x_val, y_val = x_val[: cfg.tune.max_val], y_val[: cfg.tune.max_val]
    test = EvalSet(x_test.to(device), y_test.to(device))
    return test, extra, EvalSet(x_val.to(device), y_val.to(device))


def _enabled(cfg: Any) -> list[str]:
    """The enabled methods, in the registry's order."""
    return [key for key in METHODS if cfg.methods[key].enabled]


def _variants(cfg: Any, key: str) -> list[bool]:
    """Whether method ``key`` runs grid-tuned (``False``), adapted (``True``) or both, as
    ``tune.mode`` says (the optimisers, at temperature 0, are always grid-tuned)."""
    mode = getattr(cfg.tune, "mode", "grid")
    if mode == "grid" or not METHODS[key].is_sampler:
        return [False]
    return [True] if mode == "adapt" else [False, True]


def _method_steps(cfg: Any, key: str) -> int:
    """Steps of one method on the progress bar: its tuning runs (if tuned), then every seed."""
    spec, section = METHODS[key], cfg.methods[key]
    n, sizes = len(spec.grid(section)), spec.stage_grid_sizes(section) or [0]
    tuned = cfg.tune.enabled and max(n, *sizes) > 1
    n_tune_runs = sum(n * max(1, m) for m in sizes) if tuned else 0  # (each stage's grids)
    return n_tune_runs * cfg.tune.n_steps * cfg.tune.n_seeds + len(cfg.seeds) * cfg.budget.n_steps


def _total_steps(cfg: Any) -> int:
    """Steps of the progress bar: tuning runs of every tuned grid, then every seed."""
    seeds = len(cfg.seeds) * cfg.budget.n_steps
    return sum(
        seeds if adapted else _method_steps(cfg, key)
        for key in _enabled(cfg)
        for adapted in _variants(cfg, key)
    )


def run_benchmark(
    cfg: Any,
    problem: Any,
    *,
    sampler_path: str | os.PathLike | None,
    out_dir: str | os.PathLike,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    finished: FinishedMethods | None = None,
) -> BenchmarkResult:
    """Tune and run every enabled method of ``cfg`` (a ``BenchmarkConfig``) on ``problem``.

    Args:
        cfg: validated benchmark config (``experiments.benchmark_config.load_benchmark_config``).
        problem: a ``tasks.registry.Problem`` (or
            :class:`~metasampler.benchmark.synthetic.SyntheticProblem`) whose ``data`` has the
            :class:`~metasampler.splits.ClassificationSplits` attributes.
        sampler_path: the NNSGHMC file (needed when ``methods.nnsghmc.enabled``).
        out_dir: where TensorBoard logs go (``<out_dir>/tb/<method>/seed<seed>``); a staging
            directory in ``evaluate.py``.
        progress: show a tqdm bar over all steps (tuning and evaluation).
        log: receives one-line status messages (default ``tqdm.write``, which keeps the
            progress bar intact).
        finished: where each method is stored when it finishes and taken back from when an
            interrupted run stored it (:mod:`.resume`; one process only).

    Step sizes are tuned once per method on the validation split (seed ``tune.seed``, same
    for every grid value), then every seed in ``cfg.seeds`` runs with the chosen value. All
    methods share the seed ``s`` for run ``s``, hence the same initial positions and
    minibatch sequence where their random-number use agrees.
    """
    if getattr(cfg.tune, "mode", "grid") != "grid" and world_size() > 1:
        raise ValueError(
            f"tune.mode={cfg.tune.mode} runs in one process (each rank would adapt its own "
            "step); use tune.mode=grid under torchrun"
        )
    main_process = is_main_process()  # torchrun: only rank 0 reports and writes
    test, extra, val = _eval_sets(cfg, problem.data, problem.target.device)
    setting = _Setting(
        cfg,
        problem,
        sampler_path,
        test,
        extra,
        val,
        _Progress(_total_steps(cfg), progress and main_process),
        (log or tqdm.write) if main_process else _silent,
        Path(out_dir) / "tb",
        main_process,
    )
    methods = [
        MethodBenchmark(key, setting, adapted)
        for key in _enabled(cfg)
        for adapted in _variants(cfg, key)
    ]
    try:
        for method in methods:
            _run_or_restore(method, finished)
    finally:
        setting.progress.bar.close()
    # (the adapted rows of tune.mode=both are in the tables, not in the curves' figures)
    runs = {m.key: m.runs for m in methods if m.entry.get("error") is None and m.key in METHODS}
    summary = _summary(setting, {m.key: m.entry for m in methods})
    return BenchmarkResult(summary, runs)


def _run_or_restore(method: MethodBenchmark, finished: FinishedMethods | None) -> None:
    """Take ``method`` back from ``finished`` if an interrupted run stored it, else run it
    (and store it there)."""
    setting, key = method.setting, method.key
    restored = None if finished is None else finished.restore(key, setting.tb_root)
    if restored is not None:
        method.entry, method.runs = restored
        cfg = setting.cfg
        steps = len(cfg.seeds) * cfg.budget.n_steps
        setting.progress.skip(steps if method.adapted else _method_steps(cfg, key))
        setting.log(f"{method.spec.label}: taken from the interrupted run ({finished.directory})")
        return
    method.run()
    if finished is not None:
        finished.store(key, method.entry, method.runs, setting.tb_root)


def _silent(_: str) -> None:
    pass


def _summary(setting: _Setting, methods: dict[str, Any]) -> dict[str, Any]:
    """The ``results.json`` document."""
    cfg, problem = setting.cfg, setting.problem
    data, target = problem.data, problem.target
    world = world_size()
    summary = {
        "name": cfg.name,
        "task": problem.name,
        "data": getattr(data, "name", "?"),
        "n_train": int(target.n_data),
        "n_val": int(data.x_val.shape[0]),
        "n_test": int(setting.test.x.shape[0]),
        "n_ood": int(setting.extra["ood"].x.shape[0]) if "ood" in setting.extra else 0,
        "n_classes": int(data.n_classes),
        "dim": int(target.dim),
        "batch_size": int(target.batch_size),
        "budget": OmegaConf.to_container(cfg.budget, resolve=True),
        "tune": OmegaConf.to_container(cfg.tune, resolve=True),
        "seeds": [int(s) for s in cfg.seeds],
        "sampler_path": None if setting.sampler_path is None else str(setting.sampler_path),
        "environment": {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "device": str(target.device),
            # (only when sharded, so single-process results keep their exact form)
            **({"processes": world} if world > 1 else {}),
        },
        "config": OmegaConf.to_container(cfg, resolve=True),
        "methods": methods,
    }
    if is_sequence_model(target):  # scored per frame: say so (classification keys unchanged)
        summary["scoring"] = "frames"
        summary["n_test_frames"] = int(frame_targets(setting.test.y).shape[0])
    return summary
