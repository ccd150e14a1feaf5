"""Shared pieces of the seed-paper reproductions: typed configs, outputs, small helpers.

Every experiment module defines a config dataclass (the schema), a ``validate`` function
for range checks the type system cannot express, and ``run(cfg) -> ExperimentOutput``.
:func:`load_experiment_config` merges schema <- YAML file <- ``key=value`` overrides with
OmegaConf (unknown keys and wrongly typed values fail with a :class:`ConfigError` naming the
key, before any work starts), and :func:`write_outputs` writes the JSON of raw numbers, the
markdown table and the PNG figures atomically.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from metasampler.benchmark import format_mean_se, mean_se
from metasampler.config import ConfigError, load_structured
from metasampler.files import atomic_write_bytes, atomic_write_text, jsonable
from metasampler.samplers import cyclical_sgld

__all__ = [
    "ConfigError",
    "CSGLDSettings",
    "ExperimentOutput",
    "LABELS",
    "NNSGHMCFile",
    "NNSGHMCSettings",
    "check_csgld",
    "check_datasets",
    "csgld_sampler",
    "figure_png",
    "load_experiment_config",
    "mean_se",
    "fmt_mean_se",
    "require",
    "sampler_entries",
    "trace_figure",
    "write_outputs",
]


@dataclass
class ExperimentOutput:
    """What one experiment hands to :func:`write_outputs`.

    Attributes:
        name: file stem (``<name>.json``, ``<name>.md``, ``<name>_<figure>.png``).
        results: raw numbers (JSON-serialisable after
            :func:`metasampler.files.jsonable`).
        markdown: the table beside the paper's numbers, with notes.
        figures: ``{figure name: PNG bytes}``.
    """

    name: str
    results: dict[str, Any]
    markdown: str
    figures: dict[str, bytes] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------
# One loader for every config in the project: schema dataclass <- YAML file <- ``key=value``
# overrides, then ``validate``, then read-only (see :func:`metasampler.config.load_structured`).
load_experiment_config = load_structured


def require(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition``."""
    if not condition:
        raise ConfigError(message)


def check_positive(cfg: DictConfig, *keys: str) -> None:
    """Every ``keys`` value of ``cfg`` is a finite number > 0."""
    for key in keys:
        value = OmegaConf.select(cfg, key)
        require(
            value is not None and math.isfinite(value) and value > 0,
            f"{key} must be a finite number > 0, got {value!r}",
        )


def check_int_at_least(cfg: DictConfig, low: int, *keys: str) -> None:
    """Every ``keys`` value of ``cfg`` is an integer ``>= low``."""
    for key in keys:
        value = OmegaConf.select(cfg, key)
        require(value >= low, f"{key} must be >= {low}, got {value!r}")


def check_fraction(cfg: DictConfig, *keys: str) -> None:
    """Every ``keys`` value of ``cfg`` lies in ``[0, 1)``."""
    for key in keys:
        value = OmegaConf.select(cfg, key)
        require(0 <= value < 1, f"{key} must be in [0, 1), got {value!r}")


def check_datasets(cfg: DictConfig, known: Collection[str]) -> None:
    """``cfg.datasets`` lists at least one data set, each of them in ``known``."""
    require(len(cfg.datasets) >= 1, "datasets must list at least one data set")
    for name in cfg.datasets:
        require(name in known, f"datasets: unknown {name!r}; choose from {sorted(known)}")


@dataclass
class CSGLDSettings:
    """Cyclical SGLD (seed 000) on the SDE step: peak ``eta``, ``n_cycles`` cycles, and the
    exploration (T = 0) fraction of every cycle; see :func:`csgld_sampler`."""

    eta: float  # alpha_0
    n_cycles: int  # M
    explore_fraction: float  # beta


@dataclass
class NNSGHMCFile:
    """The pretrained NNSGHMC sampler at ``path``, run beside the baselines if ``enabled``."""

    enabled: bool = True
    path: str = "pretrained/toy_gaussian.safetensors"


@dataclass
class NNSGHMCSettings(NNSGHMCFile):
    """:class:`NNSGHMCFile` run at the SDE step ``eta``."""

    eta: float = 0.05


def check_csgld(cfg: DictConfig, key: str = "csgld", n_steps: str = "n_steps") -> None:
    """The :class:`CSGLDSettings` section ``key`` of ``cfg``: at least one cycle and no more
    cycles than ``cfg[n_steps]`` steps, a positive ``eta``, an exploration fraction in
    ``[0, 1)``."""
    check_int_at_least(cfg, 1, f"{key}.n_cycles")
    require(
        OmegaConf.select(cfg, f"{key}.n_cycles") <= OmegaConf.select(cfg, n_steps),
        f"{key}.n_cycles must be <= {n_steps}",
    )
    check_positive(cfg, f"{key}.eta")
    check_fraction(cfg, f"{key}.explore_fraction")


def csgld_sampler(settings: DictConfig, total_steps: int) -> Any:
    """The cyclical SGLD sampler of a :class:`CSGLDSettings` section over ``total_steps``."""
    return cyclical_sgld(
        eta=settings.eta,
        total_steps=total_steps,
        n_cycles=settings.n_cycles,
        explore_fraction=settings.explore_fraction,
    )


# --------------------------------------------------------------------------------------------
# Numbers and outputs
# --------------------------------------------------------------------------------------------
def fmt_mean_se(stat: Mapping[str, float], digits: int = 2) -> str:
    """``"mean ± se"`` with ``digits`` decimals (:func:`metasampler.benchmark.format_mean_se`)."""
    return format_mean_se(stat, digits=digits)


def figure_png(fig: Any, dpi: int = 80) -> bytes:
    """PNG bytes of a matplotlib figure (closed afterwards)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def write_outputs(output: ExperimentOutput, directory: str | Path, config_yaml: str) -> list[Path]:
    """Write ``<name>.json`` (results and config), ``<name>.md`` and ``<name>_<fig>.png``
    into ``directory`` (created if needed), each atomically (temporary file + rename).

    Returns:
        The paths written.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    payload = {"experiment": output.name, "config": config_yaml, "results": output.results}
    path = directory / f"{output.name}.json"
    atomic_write_text(path, json.dumps(jsonable(payload), indent=1, allow_nan=False) + "\n")
    written.append(path)
    path = directory / f"{output.name}.md"
    atomic_write_text(path, output.markdown.rstrip() + "\n")
    written.append(path)
    for fig_name, data in output.figures.items():
        path = directory / f"{output.name}_{fig_name}.png"
        atomic_write_bytes(path, data)
        written.append(path)
    return written


def matplotlib_agg() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


#: Table and legend names of the samplers, in table order.
LABELS = {
    "sgld": "SGLD",
    "csgld": "cSGLD",
    "sghmc": "SGHMC",
    "csghmc": "cSGHMC",
    "nnsghmc": "NNSGHMC",
}


def sampler_entries(
    results: Mapping[str, Mapping[str, Any]],
) -> Iterator[tuple[str, Mapping[str, Any], str, Any]]:
    """``(data set, its entry, sampler key, the sampler's entry)`` for every data set of
    ``results`` (``{data set: {sampler key: ..., other keys: ...}}``) and every sampler it
    holds, samplers in :data:`LABELS` order."""
    for name, entry in results.items():
        for key in LABELS:
            if key in entry:
                yield name, entry, key, entry[key]


def trace_figure(
    traces: Mapping[str, Mapping[str, np.ndarray]],
    title: str,
    dpi: int,
    *,
    width: float,
    lw: float,
    title_size: float,
    legend_size: float,
) -> bytes:
    """PNG of one panel per data set of ``traces`` (``{data set: {sampler key: trace}}``),
    every sampler's trace against the kept-sample index; panel titles are
    ``title.format(name=<data set>)``, panels ``width`` x 2.8 inches."""
    plt = matplotlib_agg()
    fig, axes = plt.subplots(1, len(traces), figsize=(width * len(traces), 2.8), squeeze=False)
    for ax, (name, per_sampler) in zip(axes[0], traces.items(), strict=True):
        for key, trace in per_sampler.items():
            ax.plot(trace, lw=lw, label=LABELS[key])
        ax.set_title(title.format(name=name), fontsize=title_size)
        ax.set_xlabel("kept sample")
    axes[0, 0].legend(fontsize=legend_size)
    fig.tight_layout()
    return figure_png(fig, dpi)
