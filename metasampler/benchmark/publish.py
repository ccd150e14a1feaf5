"""Writing a benchmark's result files (each atomically, :mod:`metasampler.files`).

``evaluate.py`` builds them in a staging directory and publishes it as a whole
(:mod:`metasampler.staging`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..files import atomic_write_bytes, atomic_write_text, jsonable
from .plots import figure_png, plot_calibration, plot_entropy_cdf, plot_learning_curves
from .results import BenchmarkResult
from .tables import curves_csv, markdown_table, summary_csv, tuning_csv

__all__ = ["RESULT_FILES", "write_results"]


#: Files :func:`write_results` produces (stale copies from an earlier run are removed).
RESULT_FILES = (
    "results.json",
    "summary.csv",
    "curves.csv",
    "tuning.csv",
    "table.md",
    "learning_curves.png",
    "learning_curves_ensemble.png",
    "entropy_cdf.png",
    "calibration.png",
    "config.yaml",
)


def write_results(result: BenchmarkResult, directory: str | os.PathLike, config_yaml: str) -> None:
    """Write JSON, CSV, markdown and PNG results into ``directory`` (each file atomically)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    summary = result.summary
    atomic_write_text(
        directory / "results.json",
        json.dumps(jsonable(summary), indent=1, allow_nan=False) + "\n",
    )
    atomic_write_text(directory / "summary.csv", summary_csv(summary))
    atomic_write_text(directory / "curves.csv", curves_csv(summary))
    atomic_write_text(directory / "tuning.csv", tuning_csv(summary))
    atomic_write_text(directory / "table.md", markdown_table(summary))
    atomic_write_text(directory / "config.yaml", config_yaml)
    figures = {
        "learning_curves.png": lambda: plot_learning_curves(result, "average"),
        "learning_curves_ensemble.png": lambda: plot_learning_curves(result, "ensemble"),
        "entropy_cdf.png": lambda: plot_entropy_cdf(result),
        "calibration.png": lambda: plot_calibration(result),
    }
    for name, make in figures.items():
        atomic_write_bytes(directory / name, figure_png(make()))
