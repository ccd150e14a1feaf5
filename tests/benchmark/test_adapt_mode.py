"""``evaluate.py``'s ``tune.mode``: ``adapt`` (every seed chooses its step in its burn-in,
ranked by the validation NLL) and ``both`` (an adapted row beside each grid-tuned one)."""

from __future__ import annotations

import math

import pytest

from experiments.benchmark_config import load_benchmark_config
from metasampler.benchmark import markdown_table, run_benchmark
from metasampler.benchmark.synthetic import synthetic_classification_problem
from metasampler.config import ConfigError

_SYNTHETIC = "{n_train: 120, n_val: 60, n_test: 60, n_ood: 0, n_features: 4, batch_size: 30}"


def _benchmark(tmp_path, mode: str):
    cfg = load_benchmark_config(
        None,
        [
            "name=adapt",
            "seeds=[0]",
            "progress=false",
            "tensorboard=false",
            f"synthetic={_SYNTHETIC}",
            "budget={n_chains: 4, n_steps: 260, burn_in: 160, thin: 10, eval_every: 130}",
            "tune={n_steps: 40, burn_in: 20, thin: 5, mode: " + mode + "}",
            "methods.sgld.lr_grid=[0.0003, 0.001]",  # 100x too small: SGLD's good lr is ~0.1
            "methods.sghmc.lr_grid=[0.1]",
            *(f"methods.{m}.enabled=false" for m in ("nnsghmc", "nnsghmc_constant", "psgld")),
            *(f"methods.{m}.enabled=false" for m in ("msgnht", "csgld", "csghmc", "sgdm")),
        ],
    )
    problem = synthetic_classification_problem(
        n_train=120, n_val=60, n_test=60, n_ood=0, n_features=4, batch_size=30
    )
    return run_benchmark(cfg, problem, sampler_path=None, out_dir=tmp_path, progress=False)


def test_tune_mode_both_adds_an_adapted_row_beside_each_grid_tuned_sampler(tmp_path):
    result = _benchmark(tmp_path, "both")
    methods = result.summary["methods"]
    assert list(methods) == ["sgld", "sgld_adapted", "sghmc", "sghmc_adapted", "adam"]
    grid, adapted = methods["sgld"], methods["sgld_adapted"]
    assert grid["tuning"] and not adapted["tuning"]  # the adapted row ran no tuning runs
    assert adapted["label"] == "SGLD, adapted" and adapted["start_lr"] == 0.001
    (choice,) = adapted["adapted"]
    assert choice["criterion"] == "validation" and choice["lr"] == adapted["lr"]
    assert choice["lr"] > 0.01  # moved up from the too-small start
    sghmc = methods["sghmc_adapted"]
    assert sghmc["momentum_decay"] == pytest.approx(sghmc["adapted"][0]["momentum_decay"])
    assert math.isfinite(adapted["summary"]["average_nll"]["mean"])
    # the optimiser keeps its grid; the figures' curves are the grid-tuned rows'
    assert "adam_adapted" not in methods and set(result.runs) == {"sgld", "sghmc", "adam"}
    table = markdown_table(result.summary)
    assert "| SGLD, adapted |" in table and "| SGHMC, adapted |" in table


def test_tune_mode_adapt_replaces_the_grid(tmp_path):
    methods = _benchmark(tmp_path, "adapt").summary["methods"]
    assert list(methods) == ["sgld", "sghmc", "adam"]
    assert methods["sgld"]["label"] == "SGLD, adapted" and not methods["sgld"]["tuning"]
    assert methods["adam"]["tuning"]  # an optimiser (temperature 0) is grid-tuned


def test_tune_mode_is_checked():
    with pytest.raises(ConfigError, match="tune.mode must be one of"):
        load_benchmark_config(None, ["tune.mode=auto"])
    with pytest.raises(ConfigError, match="budget.burn_in must be >= 100"):
        load_benchmark_config(None, ["tune.mode=adapt", "budget.burn_in=50"])
