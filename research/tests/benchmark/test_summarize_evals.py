"""research/scripts/summarize_evals.py: the cross-task table reads results.json files correctly."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import summarize_evals  # noqa: E402

sys.path.pop(0)


def _result(tmp_path: Path, name: str, errors: dict[str, list[float]]) -> Path:
    methods = {}
    for key, values in errors.items():
        runs = [
            {"seed": i, "curves": [{"step": 10, "ensemble_error": v / 2}]}
            for i, v in enumerate(values)
        ]
        mean = sum(values) / len(values)
        methods[key] = {
            "label": key.upper(),
            "is_sampler": key != "adam",
            "summary": {"average_error": {"mean": mean, "se": 0.001, "n": len(values)}},
            "runs": runs,
        }
    directory = tmp_path / name
    directory.mkdir()
    (directory / "results.json").write_text(json.dumps({"name": name, "methods": methods}))
    return directory


def test_table_marks_the_best_sampler_and_skips_optimisers(tmp_path):
    a = _result(tmp_path, "task_a", {"sghmc": [0.1, 0.12], "sgld": [0.2, 0.2], "adam": [0.01]})
    table = summarize_evals.summarize([a], "average_error")
    lines = table.splitlines()
    assert lines[0] == "| method | task_a |"
    assert "| SGHMC | **11.00 ± 0.10** |" in lines  # percent, best sampler in bold
    assert "| ADAM (optimiser) | 1.00 ± 0.10 |" in lines  # lower, but not a sampler: not bold


def test_step_reads_learning_curves(tmp_path):
    a = _result(tmp_path, "task_a", {"sghmc": [0.1, 0.3], "sgld": [0.2, 0.2]})
    table = summarize_evals.summarize([a], "ensemble_error", step=10)
    assert "| SGHMC | **10.00 ± 5.00** |" in table.splitlines()
    assert "–" in summarize_evals.summarize([a], "ensemble_error", step=99)


def test_from_step_averages_each_seeds_curve_from_that_step_on(tmp_path):
    curves = [  # two seeds; from step 20 on their means are 0.3 and 0.5
        [{"step": 10, "ensemble_nll": 9.0}, {"step": 20, "ensemble_nll": 0.2},
         {"step": 30, "ensemble_nll": 0.4}],
        [{"step": 10, "ensemble_nll": 9.0}, {"step": 20, "ensemble_nll": 0.5},
         {"step": 30, "ensemble_nll": None}, {"step": 40, "ensemble_nll": 0.5}],
    ]  # fmt: skip
    methods = {
        "sghmc": {"label": "SGHMC", "is_sampler": True, "summary": {},
                  "runs": [{"seed": i, "curves": c} for i, c in enumerate(curves)]},
    }  # fmt: skip
    directory = tmp_path / "task"
    directory.mkdir()
    (directory / "results.json").write_text(json.dumps({"name": "task", "methods": methods}))
    table = summarize_evals.summarize([directory], "ensemble_nll", 20, from_step=True)
    assert "| SGHMC | **0.400 ± 0.100** |" in table.splitlines()  # mean of 0.3 and 0.5
    assert (
        "| SGHMC | **0.350 ± 0.150** |"
        in summarize_evals.summarize([directory], "ensemble_nll", 20).splitlines()
    )  # at step 20 alone: 0.2 and 0.5


def test_missing_results_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="results.json"):
        summarize_evals.summarize([tmp_path], "average_error")
    assert summarize_evals.main([str(tmp_path)]) == 2
