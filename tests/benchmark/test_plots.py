"""The benchmark figures a reader takes in at a glance: every method distinguishable in colour
and line style, optimiser references de-emphasised, a legend on every panel, the band
explained, and an axis clipped where one curve would squeeze the rest."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from metasampler.benchmark import (
    METHODS,
    BenchmarkResult,
    MethodRun,
    plot_calibration,
    plot_entropy_cdf,
    plot_learning_curves,
)

matplotlib = pytest.importorskip("matplotlib")


def _result(outlier: str = "sgdm") -> BenchmarkResult:
    """Two seeds of every method with close learning curves, except ``outlier`` at 90 %."""
    rng = np.random.default_rng(0)
    runs = {}
    for index, key in enumerate(METHODS):
        level = 0.9 if key == outlier else 0.10 + 0.005 * index
        by_seed = {}
        for seed in (0, 1):
            curves = [
                {
                    "step": step,
                    "epoch": step / 10,
                    "seconds": step / 5,
                    **{
                        f"{kind}_{metric}": level * (1 + 0.5 / step) + 0.002 * seed
                        for kind in ("average", "ensemble")
                        for metric in ("error", "nll")
                    },
                }
                for step in range(10, 110, 10)
            ]
            conf = np.linspace(0.05, 0.95, 10)
            by_seed[seed] = MethodRun(
                curves=curves,
                final={},
                entropies={"main": rng.uniform(0, 2, 50), "ood": rng.uniform(0, 2, 50)},
                calibration=(conf, conf * 0.9, np.full(10, 5)),
            )
        runs[key] = by_seed
    summary = {"name": "synthetic", "budget": {"n_chains": 4}, "n_ood": 50, "n_classes": 10}
    return BenchmarkResult(summary, runs)


def _lines(ax) -> dict[str, object]:
    return {
        line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")
    }


@pytest.mark.parametrize(
    "make", [plot_learning_curves, plot_entropy_cdf, plot_calibration], ids=lambda f: f.__name__
)
def test_every_panel_has_a_legend_and_methods_are_distinguishable(make):
    fig = make(_result())
    labels = {spec.label for spec in METHODS.values()}
    for ax in fig.axes:
        legend = ax.get_legend()
        assert legend is not None, f"panel {ax.get_title()!r} has no legend"
        shown = {text.get_text().replace(" (optimiser)", "") for text in legend.get_texts()}
        assert labels <= shown
        lines = [line for label, line in _lines(ax).items() if "perfectly" not in label]
        looks = {(line.get_color(), str(line.get_linestyle()), line.get_marker()) for line in lines}
        assert len(looks) == len(lines) == len(METHODS)
        samplers = [line for line in lines if "(optimiser)" not in line.get_label()]
        optimisers = [line for line in lines if "(optimiser)" in line.get_label()]
        assert len(optimisers) == 2
        # optimiser references: thinner and fainter than any sampler
        assert max(o.get_linewidth() for o in optimisers) < min(s.get_linewidth() for s in samplers)
        assert max(o.get_alpha() for o in optimisers) < 1.0
        # SGHMC and mSGNHT-S, which often overlap, differ in colour and dash pattern
        by_label = _lines(ax)
        sghmc, msgnht = by_label["SGHMC"], by_label["mSGNHT-S"]
        assert sghmc.get_color() != msgnht.get_color()
        assert sghmc.get_linestyle() != msgnht.get_linestyle()
    matplotlib.pyplot.close(fig)


def test_learning_curves_explain_the_band_and_clip_an_optimiser_outlier():
    fig = plot_learning_curves(_result(outlier="sgdm"))
    assert "standard error" in fig._suptitle.get_text()
    for ax in fig.axes:
        top = ax.get_ylim()[1]
        assert top < 0.5 * (100 if "error" in ax.get_ylabel() else 1)  # SGD-M (90 %) cut off
        assert "clipped" in ax.get_ylabel()
    matplotlib.pyplot.close(fig)
    # Without an outlier nothing is clipped: every curve is inside the axis.
    fig = plot_learning_curves(_result(outlier="none"))
    for ax in fig.axes:
        assert "clipped" not in ax.get_ylabel()
        highest = max(np.max(line.get_ydata()) for line in _lines(ax).values())
        assert ax.get_ylim()[1] >= highest
    matplotlib.pyplot.close(fig)


def test_a_panel_without_data_says_so_without_a_warning():
    result = _result()
    for runs in result.runs.values():
        for run in runs.values():
            run.entropies = {}  # as in merged results (results.json keeps no entropies)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns on a legend with no artists
        fig = plot_entropy_cdf(result)
    for ax in fig.axes:
        assert ax.get_legend() is None
        assert [t.get_text() for t in ax.texts if "no data" in t.get_text()]
    matplotlib.pyplot.close(fig)
