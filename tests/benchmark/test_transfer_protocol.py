"""The fair transfer protocol of ``evaluate.py``: step-size grids extended until the choice is
interior, a warm-up phase for every method, options tuned with the step, and runs split by seed
or method merged."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from test_evaluation import sgld_validation_objective

from experiments.benchmark_config import load_benchmark_config
from metasampler import NNSGHMC, load_sampler, sample
from metasampler.benchmark import (
    METHODS,
    apply_warmup,
    build_method,
    markdown_table,
    merge_seed_results,
    run_benchmark,
    synthetic_classification_problem,
    tune_step_size,
)
from metasampler.config import ConfigError
from metasampler.files import jsonable
from metasampler.schedules import CyclicalCosine, WarmUp
from metasampler.stepsize import resolve_eta
from metasampler.targets import NonFiniteError


# --------------------------------------------------------------------------------------------
# Grid extension
# --------------------------------------------------------------------------------------------
def _bowl(optimum: float):
    """A validation score with its minimum at ``optimum`` (quadratic in log lr)."""
    calls: list[float] = []

    def objective(lr: float) -> float:
        calls.append(lr)
        return (math.log(lr) - math.log(optimum)) ** 2

    return objective, calls


def test_extension_moves_an_edge_choice_above_the_grid_to_an_interior_one():
    objective, _ = _bowl(0.5)
    plain = tune_step_size(objective, [0.01, 0.02, 0.04])
    assert plain.best == 0.04 and plain.interior is False  # the edge without the extension

    objective, calls = _bowl(0.5)
    result = tune_step_size(objective, [0.01, 0.02, 0.04], max_extensions=10)
    assert result.grid == [0.01, 0.02, 0.04]
    assert result.extensions == pytest.approx([0.08, 0.16, 0.32, 0.64, 1.28])
    assert result.best == pytest.approx(0.64) and result.interior is True
    assert calls[:3] == [0.01, 0.02, 0.04] and len(calls) == 8  # one run per value


def test_extension_below_the_grid_and_the_cap():
    objective, _ = _bowl(0.001)
    result = tune_step_size(objective, [0.1, 0.3], max_extensions=10)  # ratio 3 downwards
    assert result.best == pytest.approx(0.1 / 81) and result.interior is True
    assert result.extensions[0] == pytest.approx(0.1 / 3)

    objective, _ = _bowl(0.001)
    capped = tune_step_size(objective, [0.1, 0.3], max_extensions=2)
    assert len(capped.extensions) == 2 and capped.interior is False  # the cap is reported
    assert capped.best == pytest.approx(0.1 / 9)


def test_a_grid_of_steps_is_extended_by_whole_steps_and_never_to_zero():
    objective, _ = _bowl(40)
    result = tune_step_size(objective, [300, 500], max_extensions=10, whole=True)
    assert result.extensions == [180, 108, 65, 39, 23]  # ratio 5/3 down, rounded
    assert result.best == 39 and result.interior is True
    objective, calls = _bowl(0.1)  # the optimum below every step: stops at 1
    result = tune_step_size(objective, [2, 3], max_extensions=10, whole=True)
    assert result.extensions == [1] and calls == [2, 3, 1] and result.interior is False


def test_a_near_tie_at_an_end_is_extended_past_with_an_edge_tolerance():
    # Session 17: a floor sampler's one-run validation scores on MNIST NT were 0.244 / 0.226 /
    # 0.234 at lr 0.018 / 0.036 / 0.072, so the tuner stopped at 0.036 (interior), but 0.144
    # scored 0.194. A bump next to the best is a near-tie at the end: with a tolerance the
    # grid goes on past it to the better value, and stops where the end is clearly worse.
    scores = {0.018: 0.244, 0.036: 0.226, 0.072: 0.234, 0.144: 0.194, 0.288: 0.204, 0.576: 0.4}
    calls = []

    def objective(lr: float) -> float:
        calls.append(lr)
        return scores[round(lr, 3)]

    grid = [0.018, 0.036, 0.072]
    plain = tune_step_size(objective, grid, max_extensions=4)
    assert plain.best == 0.036 and plain.interior and plain.extensions == []
    tolerant = tune_step_size(objective, grid, max_extensions=4, edge_tolerance=0.05)
    # 0.234 is within 5 % of 0.226: extend to 0.144 (new best, at the end), then 0.288 (0.204:
    # within 5.2 % of 0.194, not 5 %) ends it; the lower end (8 % worse) is never extended
    assert tolerant.extensions == pytest.approx([0.144, 0.288])
    assert tolerant.best == pytest.approx(0.144) and tolerant.interior is True
    wide = tune_step_size(objective, grid, max_extensions=4, edge_tolerance=0.06)
    assert wide.extensions == pytest.approx([0.144, 0.288, 0.576])  # 0.204 is a near-tie now
    capped = tune_step_size(objective, grid, max_extensions=1, edge_tolerance=0.06)
    assert capped.extensions == pytest.approx([0.144]) and capped.interior is False
    with pytest.raises(ValueError, match="edge_tolerance"):
        tune_step_size(objective, grid, max_extensions=4, edge_tolerance=-0.1)


def test_a_diverged_extension_counts_as_worst_and_all_diverged_extends_down():
    def objective(lr: float) -> float:
        if lr > 0.3:
            raise NonFiniteError("non-finite position in chain 0 at step 2")
        return -lr  # larger is better until it diverges

    result = tune_step_size(objective, [0.025, 0.05, 0.1], max_extensions=5)
    assert result.extensions == pytest.approx([0.2, 0.4])
    assert result.best == pytest.approx(0.2) and result.interior is True
    assert "step 2" in result.errors[result.extensions[1]]

    # every grid value diverges: smaller values are tried until one works
    result = tune_step_size(objective, [0.8, 1.6], max_extensions=5)
    assert result.extensions == pytest.approx([0.4, 0.2, 0.1])
    assert result.best == pytest.approx(0.2) and result.interior is True


def test_extension_with_real_sgld_runs_finds_the_step_beyond_the_grid():
    """SGLD on a synthetic task whose good steps (~0.3) lie above the initial grid: the plain
    tuner returns the grid's upper edge, the extension goes on to an interior choice with a
    better validation NLL."""
    problem = synthetic_classification_problem(
        n_train=120, n_val=60, n_test=60, n_ood=0, n_features=4, batch_size=30
    )
    nlls: dict[float, float] = {}
    objective = sgld_validation_objective(problem, nlls)
    grid = [0.001, 0.01]
    plain = tune_step_size(objective, grid)
    assert plain.best == 0.01 and plain.interior is False
    extended = tune_step_size(objective, grid, max_extensions=6)
    assert extended.interior is True and extended.best > 0.01
    assert nlls[extended.best] < nlls[0.01]


# --------------------------------------------------------------------------------------------
# Warm-up
# --------------------------------------------------------------------------------------------
def test_warmup_schedule_scales_only_the_first_steps_and_keeps_exploration_flags():
    inner = CyclicalCosine(total_steps=8, n_cycles=2, explore_fraction=0.5)
    warm = WarmUp(3, 0.5, inner)
    for k in range(1, 9):
        expected = inner(k).scale * (0.5 if k <= 3 else 1.0)
        assert warm(k).scale == pytest.approx(expected)
        assert warm(k).explore == inner(k).explore
    with pytest.raises(ValueError, match="scale"):
        WarmUp(3, 0.0)


@pytest.mark.parametrize(("key", "power"), [("sgld", 1.0), ("sghmc", 0.5)])
def test_warmup_runs_the_first_steps_at_the_reduced_learning_rate(key, power):
    """A warm-up of W steps at lr factor f is bit-identical, for those W steps, to the same
    method at lr f * lr (eta scaled by f for first-order, sqrt(f) for second-order) with the
    same constants."""
    problem = synthetic_classification_problem(n_train=60, n_val=10, n_test=10, n_ood=0)
    target, n = problem.target, problem.target.n_data
    lr, factor, steps = 0.05, 0.25, 4
    warm = build_method(key, {}, lr, n_data=n, n_steps=steps)
    eta_warmup = apply_warmup(warm, steps, factor, n)
    plain = build_method(key, {}, lr * factor, n_data=n, n_steps=steps)
    if key == "sghmc":  # the friction C is kept from the chosen step, as alpha is for NNSGHMC
        plain.friction = warm.friction
    base = build_method(key, {}, lr, n_data=n, n_steps=steps)
    runs = [
        sample(s, target, 2, steps, init=lambda g: problem.init(2, g), seed=3, progress=False).theta
        for s in (warm, plain, base)
    ]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])
    assert eta_warmup == pytest.approx(resolve_eta(None, lr, n, warm.order) * factor**power)


def _nnsghmc(**kw) -> NNSGHMC:
    """A small sampler whose nets are scaled down (stable at the tests' steps)."""
    sampler = NNSGHMC(lr=0.01, q_hidden=[4], d_hidden=[4], seed=0, **kw)
    with torch.no_grad():
        for p in sampler.parameters():
            p.mul_(0.1)
        sampler.f_q.head.bias.fill_(1.0)
    return sampler


def _run_synthetic(cfg, sampler_path, out_dir):
    """``run_benchmark`` of ``cfg`` on the synthetic task its ``synthetic`` section describes."""
    s = cfg.synthetic
    problem = synthetic_classification_problem(
        n_train=s.n_train, n_val=s.n_val, n_test=s.n_test, n_ood=0, n_features=s.n_features,
        batch_size=s.batch_size,
    )  # fmt: skip
    return run_benchmark(cfg, problem, sampler_path=sampler_path, out_dir=out_dir, progress=False)


def test_benchmark_applies_the_warmup_and_reports_the_protocol(tmp_path):
    path = tmp_path / "sampler.safetensors"
    _nnsghmc().save(str(path))
    cfg = load_benchmark_config(
        None,
        [
            "name=proto",
            "seeds=[0]",
            "progress=false",
            "tensorboard=false",
            "synthetic={n_train: 120, n_val: 60, n_test: 60, n_ood: 0, n_features: 4, "
            "batch_size: 30}",
            "budget={n_chains: 2, n_steps: 12, burn_in: 4, thin: 2, eval_every: 4, "
            "warmup_steps: 4, warmup_lr_factor: 0.25}",
            "tune={n_steps: 8, burn_in: 3, thin: 2, max_extensions: 3}",
            "methods.nnsghmc.lr_grid=[0.01]",
            "methods.nnsghmc.compile=false",  # (eager: no package build)
            "methods.sgld.lr_grid=[0.001, 0.002]",
            *(f"methods.{m}.enabled=false" for m in ("nnsghmc_constant", "psgld", "sghmc")),
            *(f"methods.{m}.enabled=false" for m in ("msgnht", "csgld", "csghmc", "sgdm", "adam")),
        ],
    )
    result = _run_synthetic(cfg, path, tmp_path)
    methods = result.summary["methods"]
    eta = math.sqrt(0.01 / 120)
    assert methods["nnsghmc"]["warmup_eta"] == pytest.approx(eta * 0.5)
    assert "alpha" not in methods["nnsghmc"]  # (the file's friction per step, as trained)
    sgld = methods["sgld"]
    assert sgld["tuning_grid"] == [0.001, 0.002]
    assert sgld["tuning_extensions"]  # tiny steps: the upper edge wins and is extended
    assert any(row["extension"] for row in sgld["tuning"])
    assert sgld["warmup_eta"] == pytest.approx(sgld["eta"] * 0.25)
    table = markdown_table(result.summary)
    assert "Warm-up, every method: the first 4 steps at 0.25" in table
    assert "| extensions: lr → val NLL |" in table


def test_config_rejects_bad_protocol_values():
    with pytest.raises(ConfigError, match="warmup_steps"):
        load_benchmark_config(
            None, ["budget.n_steps=10", "budget.burn_in=2", "budget.warmup_steps=10"]
        )
    with pytest.raises(ConfigError, match="warmup_lr_factor"):
        load_benchmark_config(None, ["budget.warmup_lr_factor=0"])
    with pytest.raises(ConfigError, match="max_extensions"):
        load_benchmark_config(None, ["tune.max_extensions=-1"])


# --------------------------------------------------------------------------------------------
# Runs split by seed, merged
# --------------------------------------------------------------------------------------------
def _small_benchmark(tmp_path, seeds: str, *extra: str):
    cfg = load_benchmark_config(
        None,
        [
            "name=split",
            f"seeds={seeds}",
            "progress=false",
            "tensorboard=false",
            "synthetic={n_train: 120, n_val: 60, n_test: 60, n_ood: 0, n_features: 4, "
            "batch_size: 30}",
            "budget={n_chains: 2, n_steps: 12, burn_in: 4, thin: 2, eval_every: 4}",
            "tune={n_steps: 8, burn_in: 3, thin: 2}",
            "methods.nnsghmc.enabled=false",
            "methods.nnsghmc_constant.enabled=false",
            "methods.sgld.lr_grid=[0.1, 0.3]",
            *(f"methods.{m}.enabled=false" for m in ("psgld", "sghmc", "msgnht", "csgld")),
            *(f"methods.{m}.enabled=false" for m in ("csghmc", "sgdm")),
            *extra,
        ],
    )
    problem = synthetic_classification_problem(
        n_train=120, n_val=60, n_test=60, n_ood=0, n_features=4, batch_size=30
    )
    result = run_benchmark(cfg, problem, sampler_path=None, out_dir=tmp_path, progress=False)
    return json.loads(json.dumps(jsonable(result.summary)))


def test_runs_split_by_seed_merge_into_the_all_seeds_result(tmp_path):
    whole = _small_benchmark(tmp_path, "[0, 1, 2]")
    parts = [_small_benchmark(tmp_path, "[1]"), _small_benchmark(tmp_path, "[0, 2]")]
    merged = merge_seed_results(parts)
    assert merged.summary["seeds"] == [0, 1, 2]
    for key in ("sgld", "adam"):
        got, want = merged.summary["methods"][key], whole["methods"][key]
        assert [r["seed"] for r in got["runs"]] == [0, 1, 2]
        for metric in ("ensemble_nll", "average_error"):
            assert got["summary"][metric]["mean"] == pytest.approx(want["summary"][metric]["mean"])
            assert got["summary"][metric]["se"] == pytest.approx(want["summary"][metric]["se"])
        assert sorted(merged.runs[key]) == [0, 1, 2]
    with pytest.raises(ValueError, match="repeat seeds"):
        merge_seed_results([parts[0], parts[0]])
    other = json.loads(json.dumps(parts[0]))
    other["methods"]["sgld"]["lr"] = 123.0
    with pytest.raises(ValueError, match="tuned differently"):
        merge_seed_results([other, parts[1]])


def test_runs_split_by_method_and_seed_merge_into_the_whole_result(tmp_path):
    whole = _small_benchmark(tmp_path, "[0, 1]")
    sgld_only = _small_benchmark(tmp_path, "[0, 1]", "methods.adam.enabled=false")
    adam_parts = [
        _small_benchmark(tmp_path, f"[{s}]", "methods.sgld.enabled=false") for s in (0, 1)
    ]
    merged = merge_seed_results([sgld_only, *adam_parts])
    assert merged.summary["seeds"] == [0, 1]
    assert list(merged.summary["methods"]) == ["sgld", "adam"]
    assert merged.summary["config"]["methods"]["adam"]["enabled"]
    for key in ("sgld", "adam"):
        got, want = merged.summary["methods"][key], whole["methods"][key]
        assert got["summary"]["average_nll"]["mean"] == pytest.approx(
            want["summary"]["average_nll"]["mean"]
        )
    with pytest.raises(ValueError, match="different seeds"):
        merge_seed_results([sgld_only, adam_parts[0]])


def test_parts_with_adapted_rows_merge(tmp_path):
    """``tune.mode: both`` gives each sampler a second row, ``<method>_adapted``, whose config
    section is its method's."""
    parts = [
        _small_benchmark(
            tmp_path,
            "[0, 1]",
            "tune.mode=both",
            "budget.n_steps=110",
            "budget.burn_in=100",
            f"methods.{off}.enabled=false",
        )  # fmt: skip
        for off in ("adam", "sgld")
    ]
    merged = merge_seed_results(parts).summary
    assert list(merged["methods"]) == ["sgld", "sgld_adapted", "adam"]
    assert merged["methods"]["sgld_adapted"]["adapted"]  # the per-seed choices
    assert merged["config"]["methods"]["sgld"]["enabled"]


# --------------------------------------------------------------------------------------------
# Friction tuned with the step (momentum methods)
# --------------------------------------------------------------------------------------------
def _friction_benchmark(tmp_path, *extra: str):
    return _small_benchmark(
        tmp_path,
        "[0]",
        "methods.sgld.enabled=false",
        "methods.adam.enabled=false",
        "methods.sghmc.enabled=true",
        "tune.max_extensions=4",
        *extra,
    )


def test_friction_grid_tunes_the_step_at_every_friction_and_runs_the_best_pair(tmp_path):
    summary = _friction_benchmark(
        tmp_path,
        "methods.sghmc.lr_grid=[0.02, 0.08]",
        "methods.sghmc.momentum_decay_grid=[0.01, 0.1, 1.0]",
    )
    entry = summary["methods"]["sghmc"]
    rows = entry["tuning"]
    frictions = entry["momentum_decay_grid"] + entry["momentum_decay_extensions"]
    assert sorted({r["momentum_decay"] for r in rows}) == sorted(frictions)
    finite = [r for r in rows if r["diverged_at"] is None]
    steps_at = {a: [r["lr"] for r in rows if r["momentum_decay"] == a] for a in frictions}
    assert {0.02, 0.08} <= set(steps_at[0.01])  # the configured grid at the first friction
    for i, a in enumerate(frictions[1:], 1):  # later ones start at the nearest one's best step
        nearest = min(frictions[:i], key=lambda b: abs(math.log(b / a)))
        scores = [(r["val_nll"], r["lr"]) for r in finite if r["momentum_decay"] == nearest]
        assert min(scores)[1] in steps_at[a] and len(steps_at[a]) >= 2
    best = min(finite, key=lambda r: r["val_nll"])
    assert (entry["momentum_decay"], entry["lr"]) == (best["momentum_decay"], best["lr"])
    assert [r["chosen"] for r in rows].count(True) == 1 and best["chosen"]
    assert entry["momentum_decay_interior"] in (True, False)

    # the evaluation ran the chosen pair: a seed rebuilt by hand gives the same numbers
    problem = synthetic_classification_problem(
        n_train=120, n_val=60, n_test=60, n_ood=0, n_features=4, batch_size=30
    )
    from metasampler.benchmark.run import EvalSet, run_method

    sampler = build_method(
        "sghmc",
        {"momentum_decay": entry["momentum_decay"]},
        entry["lr"],
        n_data=problem.target.n_data,
        n_steps=12,
    )
    rerun = run_method(
        sampler, problem.target, problem.init,
        main=EvalSet(problem.data.x_test, problem.data.y_test),
        n_chains=2, n_steps=12, burn_in=4, thin=2, eval_every=4, seed=0,
    )  # fmt: skip
    assert rerun.final["average_nll"] == pytest.approx(entry["runs"][0]["final"]["average_nll"])

    table = markdown_table(summary)
    assert "## Options tuned with the step" in table and "| friction/step a |" in table
    assert f"| SGHMC | {entry['lr']:g} | {entry['momentum_decay']:g} |" in table


def test_friction_grid_is_extended_until_the_chosen_friction_is_interior(tmp_path, monkeypatch):
    """A validation score whose best friction (0.3) lies above the initial grid and whose best
    step grows with the friction: the friction grid is extended to an interior choice and the
    step is the best one at that friction."""
    from metasampler.benchmark import transfer

    def score(self, lr: float) -> float:
        a = self.option_value
        self.tuning_rows.append({"lr": lr, "val_nll": 0.0, "diverged_at": None})
        self.tuning_rows[-1]["momentum_decay"] = a
        value = (math.log(a / 0.3)) ** 2 + (math.log(lr / (0.2 * a))) ** 2
        self.tuning_rows[-1]["val_nll"] = value
        return value

    monkeypatch.setattr(transfer.MethodBenchmark, "_objective", score)
    summary = _friction_benchmark(
        tmp_path,
        "methods.sghmc.lr_grid=[0.005, 0.01, 0.02]",
        "methods.sghmc.momentum_decay_grid=[0.01, 0.03]",
    )
    entry = summary["methods"]["sghmc"]
    assert entry["momentum_decay_extensions"] == pytest.approx([0.09, 0.27, 0.81])
    assert entry["momentum_decay"] == pytest.approx(0.27) and entry["momentum_decay_interior"]
    assert entry["lr"] == pytest.approx(0.04)  # the step nearest 0.2 x 0.27 at that friction
    assert entry["tuning_interior"] is True
    # the step grid follows the friction: at 0.81 it starts centred on 0.27's best step
    at_081 = [r["lr"] for r in entry["tuning"] if r["momentum_decay"] == pytest.approx(0.81)]
    assert at_081[:3] == pytest.approx([0.02, 0.04, 0.08])

    # an initial grid alone ends on its edge and says so
    summary = _friction_benchmark(
        tmp_path,
        "tune.max_extensions=0",
        "methods.sghmc.lr_grid=[0.005, 0.01, 0.02]",
        "methods.sghmc.momentum_decay_grid=[0.01, 0.03]",
    )
    entry = summary["methods"]["sghmc"]
    assert entry["momentum_decay"] == 0.03 and entry["momentum_decay_interior"] is False
    table = markdown_table(summary)
    assert "| SGHMC | friction/step a | 0.01 → " in table and "grid edge" in table


def test_config_rejects_a_bad_friction_grid():
    with pytest.raises(ConfigError, match="momentum_decay_grid"):
        load_benchmark_config(None, ["methods.sghmc.momentum_decay_grid=[0.01, -0.1]"])


def test_without_tuning_a_friction_grid_runs_its_first_value(tmp_path):
    summary = _friction_benchmark(
        tmp_path,
        "tune.enabled=false",
        "methods.sghmc.lr_grid=[0.02, 0.08]",
        "methods.sghmc.momentum_decay_grid=[0.05, 0.1]",
    )
    entry = summary["methods"]["sghmc"]
    assert (entry["lr"], entry["momentum_decay"]) == (0.02, 0.05) and entry["tuning"] == []


def test_a_friction_grid_with_one_step_tunes_the_friction_alone(tmp_path):
    summary = _friction_benchmark(
        tmp_path,
        "methods.sghmc.lr_grid=[0.05]",
        "methods.sghmc.momentum_decay_grid=[0.01, 0.1, 1.0]",
    )
    entry = summary["methods"]["sghmc"]
    assert entry["lr"] == 0.05 and entry["tuning_grid"] == [0.05]
    rows = entry["tuning"]
    assert {r["lr"] for r in rows} == {0.05} and len(rows) >= 3  # one run per friction
    finite = [r for r in rows if r["diverged_at"] is None]
    assert entry["momentum_decay"] == min(finite, key=lambda r: r["val_nll"])["momentum_decay"]


def test_a_friction_grid_of_one_value_is_used_while_the_step_is_tuned(tmp_path):
    summary = _friction_benchmark(
        tmp_path,
        "methods.sghmc.lr_grid=[0.02, 0.04, 0.08]",
        "methods.sghmc.momentum_decay_grid=[0.05]",
    )
    entry = summary["methods"]["sghmc"]
    assert entry["momentum_decay"] == 0.05
    assert {r["momentum_decay"] for r in entry["tuning"]} == {0.05}


@pytest.mark.parametrize(
    ("design", "refused"),
    [(dict(curl_input="stiffness", thermostat=True), "curl_input='stiffness' needs exact Gamma"),
     (dict(curl_input="momentum", thermostat=True), "thermostat needs exact Gamma")],
)  # fmt: skip
def test_a_gamma_override_the_files_design_cannot_run_names_the_file(tmp_path, design, refused):
    """A file of the default design (or with a thermostat) runs with its exact Gamma;
    ``methods.nnsghmc.gamma=finite_difference`` is an error naming the file and the reason
    (``load_sampler``'s own override too, as an argument error). The paper's design takes it."""
    path = tmp_path / "t.safetensors"
    _nnsghmc(**design).save(str(path))
    kept = build_method("nnsghmc", {}, 0.02, n_data=120, n_steps=10, sampler_path=path)
    assert kept.thermostat and kept.gamma == "exact"
    with pytest.raises(ValueError, match=f"{path.name}: {re.escape(refused)}"):
        build_method(
            "nnsghmc", {"gamma": "finite_difference"}, 0.02, n_data=120, n_steps=10,
            sampler_path=path,
        )  # fmt: skip
    with pytest.raises(ValueError, match="gamma='finite_difference' cannot run"):
        load_sampler(path, gamma="finite_difference")
    paper = tmp_path / "paper.safetensors"
    _nnsghmc(curl_input="momentum", thermostat=False).save(str(paper))
    options = {"gamma": "finite_difference"}
    built = build_method("nnsghmc", options, 0.02, n_data=120, n_steps=10, sampler_path=paper)
    assert built.gamma == "finite_difference"


def _sgld_tuning(tmp_path, *tune: str) -> list[dict]:
    """SGLD's tuning rows on a tiny synthetic task, with ``tune.<key>=<value>`` overrides."""
    cfg = load_benchmark_config(
        None,
        [
            "name=seeds", "seeds=[0]", "progress=false", "tensorboard=false",
            "synthetic={n_train: 120, n_val: 60, n_test: 60, n_ood: 0, n_features: 4, "
            "batch_size: 30}",
            "budget={n_chains: 2, n_steps: 12, burn_in: 4, thin: 2, eval_every: 4}",
            "tune={n_steps: 8, burn_in: 3, thin: 2, max_extensions: 0}",
            "methods.sgld.lr_grid=[0.01, 0.02]",
            *(f"tune.{kv}" for kv in tune),
            *(f"methods.{m}.enabled=false" for m in METHODS if m != "sgld"),
        ],
    )  # fmt: skip
    result = _run_synthetic(cfg, None, tmp_path)
    return result.summary["methods"]["sgld"]["tuning"]


def test_tuning_scores_average_the_runs_of_several_seeds(tmp_path):
    # tune.n_seeds = 2: each value's score is the mean of the runs with seeds tune.seed and
    # tune.seed + 1, which are exactly the single-seed runs of those seeds.
    pooled = _sgld_tuning(tmp_path / "a", "n_seeds=2", "seed=5")
    first = _sgld_tuning(tmp_path / "b", "seed=5")
    second = _sgld_tuning(tmp_path / "c", "seed=6")
    for row, one, two in zip(pooled, first, second, strict=True):
        assert row["val_nll_per_seed"] == [one["val_nll"], two["val_nll"]]
        assert row["val_nll"] == pytest.approx((one["val_nll"] + two["val_nll"]) / 2)
        assert one["val_nll"] != two["val_nll"]  # (the seeds' runs differ)
    with pytest.raises(ConfigError, match="tune.n_seeds"):
        load_benchmark_config(None, ["tune.n_seeds=0"])


def test_tuning_can_score_the_final_ensemble(tmp_path):
    # tune.metric = ensemble_nll scores a run by its final K-chain ensemble: with a burn-in
    # that leaves only the last sample in the posterior average, the two scores coincide;
    # with a longer average they differ.
    average = _sgld_tuning(tmp_path / "a")
    ensemble = _sgld_tuning(tmp_path / "b", "metric=ensemble_nll")
    last_sample = _sgld_tuning(tmp_path / "c", "burn_in=7", "thin=1")
    for avg, ens, last in zip(average, ensemble, last_sample, strict=True):
        assert ens["val_nll"] != pytest.approx(avg["val_nll"], rel=1e-4)
        assert ens["val_nll"] == pytest.approx(last["val_nll"], rel=1e-5)
    with pytest.raises(ConfigError, match="tune.metric"):
        load_benchmark_config(None, ["tune.metric=accuracy"])
    # (an ensemble of fewer chains than the evaluation's scores another quantity)
    with pytest.raises(ConfigError, match="tune.n_chains"):
        load_benchmark_config(None, ["tune.metric=ensemble_nll", "tune.n_chains=5"])
