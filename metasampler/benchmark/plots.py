"""The result figures: learning curves (Gong et al. 2019, Fig. 3), predictive-entropy CDFs
(Zhang et al. 2020, Fig. 4) and the reliability diagram. Every method keeps one style in every
figure. Matplotlib is imported when a figure is drawn (Agg backend)."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .methods import METHODS
from .results import BenchmarkResult
from .run import MethodRun

__all__ = ["figure_png", "plot_calibration", "plot_entropy_cdf", "plot_learning_curves"]


def _aggregate_curves(runs: Mapping[int, MethodRun], x: str, y: str):
    """Mean and standard error over seeds of curve ``y`` against ``x`` (x: seed mean)."""
    rows = [run.curves for run in runs.values() if run.curves]
    if not rows:
        return None
    length = min(len(r) for r in rows)
    xs = np.array([[r[i][x] for i in range(length)] for r in rows], dtype=float)
    ys = np.array([[r[i][y] for i in range(length)] for r in rows], dtype=float)
    mean_x = xs.mean(0)
    finite = np.isfinite(ys)
    n = finite.sum(0)
    total = np.where(finite, ys, 0.0).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_y = np.where(n > 0, total / n, np.nan)
        sq = np.where(finite, (ys - mean_y) ** 2, 0.0).sum(0)
        se = np.where(n > 1, np.sqrt(sq / (n - 1)) / np.sqrt(n), np.nan)
    return mean_x, mean_y, (se if len(rows) > 1 else None)


# Plot styles: every method keeps one colour, line style and marker in every figure.
# Samplers get distinct colours and dash patterns (SGHMC and mSGNHT-S overlap often, so they
# differ in both); NNSGHMC, the method under study, is drawn thickest; the optimiser
# references (T = 0, not samplers) are thin, grey and translucent.
_SAMPLER_STYLES = {
    "nnsghmc": ("#1f77b4", "-", "o", 2.6),
    "sgld": ("#ff7f0e", (0, (5, 2)), "v", 1.6),
    "psgld": ("#2ca02c", (0, (1, 1.5)), "^", 1.8),
    "sghmc": ("#d62728", "-", "s", 1.6),
    "msgnht": ("#9467bd", (0, (6, 2, 1, 2)), "D", 1.6),
    "msgnht_euler": ("#bcbd22", (0, (6, 2, 1, 2, 1, 2)), "d", 1.6),
    "csgld": ("#8c564b", (0, (3, 1, 1, 1, 1, 1)), "P", 1.6),
    "csghmc": ("#e377c2", (0, (2, 2)), "X", 1.6),
    "nnsghmc_constant": ("#17becf", (0, (4, 1.5)), "*", 2.2),  # its ablation
}
_OPTIMISER_STYLES = {"sgdm": ("0.55", (0, (1, 2)), "1"), "adam": ("0.35", (0, (4, 3)), "2")}
_BAND_NOTE = "lines: mean over {n} seed(s); shaded band: ±1 standard error across seeds"


def _style(key: str) -> dict[str, Any]:
    """Matplotlib keyword arguments of method ``key`` (see the table above)."""
    if key in _SAMPLER_STYLES:
        color, ls, marker, lw = _SAMPLER_STYLES[key]
        return dict(color=color, ls=ls, marker=marker, lw=lw, alpha=1.0, zorder=3)
    color, ls, marker = _OPTIMISER_STYLES.get(key, ("0.5", ":", "."))
    return dict(color=color, ls=ls, marker=marker, lw=1.0, alpha=0.6, zorder=2)


def _label(key: str) -> str:
    return METHODS[key].display


def _legend_above(ax) -> None:
    """A legend for this panel, above it, so it never hides a curve; a panel with nothing
    drawn says so instead (merged results keep no per-example entropies)."""
    if not ax.get_legend_handles_labels()[0]:
        ax.text(0.5, 0.5, "no data in these results", ha="center", transform=ax.transAxes)
        return
    ax.legend(
        fontsize=7,
        ncol=5,
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),
        frameon=False,
        handlelength=3.0,
        columnspacing=1.0,
    )


def _clip_to_samplers(ax, curves: list[tuple[bool, np.ndarray]]) -> None:
    """Cap the y-axis where one curve would squeeze the rest (span 1.5 times theirs): at the
    highest value a sampler reaches after the first quarter of its curve, plus a margin; the
    axis label says so."""
    settled = [y[len(y) // 4 :] for is_sampler, y in curves if is_sampler and np.isfinite(y).any()]
    every = [y for _, y in curves if np.isfinite(y).any()]
    if not settled or not every:
        return
    top = max(np.nanmax(y) for y in settled)
    low = min(np.nanmin(y) for y in every)
    highest = max(np.nanmax(y) for y in every)
    if highest - low > 1.5 * (top - low):  # the rest would get under 2/3 of the axis
        margin = 0.08 * (top - low)
        ax.set_ylim(low - margin, top + margin)
        ax.set_ylabel(ax.get_ylabel() + "\n(clipped: higher curves are cut off)")


def plot_learning_curves(result: BenchmarkResult, kind: str = "average"):
    """Test error and NLL against epochs and sampling wall-clock (Gong et al. 2019, Fig. 3), mean
    over seeds with a ±1 standard-error band; ``kind`` is ``"average"`` or ``"ensemble"``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    what = "posterior average" if kind == "average" else f"{result.summary['budget']['n_chains']}"
    what = what if kind == "average" else what + "-chain ensemble"
    n_seeds = max((len(runs) for runs in result.runs.values()), default=0)
    plotted: dict[tuple[int, int], list[tuple[bool, np.ndarray]]] = {}
    for key, runs in result.runs.items():
        style = _style(key)
        for row, x in enumerate(("epoch", "seconds")):
            for col, (metric, scale) in enumerate((("error", 100.0), ("nll", 1.0))):
                agg = _aggregate_curves(runs, x, f"{kind}_{metric}")
                if agg is None:
                    continue
                mx, my, se = agg
                ax = axes[row, col]
                ax.plot(
                    mx, my * scale, label=_label(key), ms=4, markevery=max(1, len(mx) // 6), **style
                )
                if se is not None:
                    ax.fill_between(
                        mx,
                        (my - se) * scale,
                        (my + se) * scale,
                        color=style["color"],
                        alpha=0.15 * style["alpha"],
                        lw=0,
                    )
                plotted.setdefault((row, col), []).append((METHODS[key].is_sampler, my * scale))
    for row, xlabel in enumerate(("epochs", "sampling wall-clock (s)")):
        axes[row, 0].set_ylabel("test error (%)")
        axes[row, 1].set_ylabel("test NLL (nats)")
        for col in range(2):
            axes[row, col].set_xlabel(xlabel)
            axes[row, col].grid(alpha=0.3)
            _clip_to_samplers(axes[row, col], plotted.get((row, col), []))
            _legend_above(axes[row, col])
    fig.suptitle(
        f"{result.summary['name']}: test error and NLL of the {what} (lower is better)\n"
        + _BAND_NOTE.format(n=n_seeds),
        fontsize=11,
    )
    fig.tight_layout()
    return fig


def plot_entropy_cdf(result: BenchmarkResult):
    """Empirical CDF of the posterior-average predictive entropy on the test set and on the
    out-of-distribution inputs (Zhang et al. 2020, Fig. 4; on OOD inputs, lower curves are
    better)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = [("main", "test set (in-distribution): higher curve = more confident")]
    if result.summary["n_ood"]:
        sets.append(("ood", "out-of-distribution inputs: lower curve = better (less confident)"))
    fig, axes = plt.subplots(1, len(sets), figsize=(6.5 * len(sets), 5.2), squeeze=False)
    log_c = math.log(result.summary["n_classes"])
    for ax, (name, title) in zip(axes[0], sets, strict=True):
        for key, runs in result.runs.items():
            values = [run.entropies[name] for run in runs.values() if name in run.entropies]
            if not values:
                continue
            ent = np.sort(np.concatenate(values))
            cdf = np.arange(1, ent.size + 1) / ent.size
            style = {k: v for k, v in _style(key).items() if k != "marker"}
            ax.step(ent, cdf, where="post", label=_label(key), **style)
        ax.axvline(log_c, color="k", lw=0.8, ls=":")
        ax.text(log_c, 0.02, " log C\n (uniform)", fontsize=7, ha="right")
        ax.set_xlim(0, log_c * 1.02)
        ax.set_ylim(0, 1.0)
        ax.set_xlabel("predictive entropy of the posterior average (nats)")
        ax.set_ylabel("fraction of inputs with entropy ≤ x")
        ax.set_title(title, fontsize=9, pad=42)
        ax.grid(alpha=0.3)
        _legend_above(ax)
    fig.suptitle(f"{result.summary['name']}: predictive entropy, all seeds pooled", fontsize=11)
    fig.tight_layout()
    return fig


def plot_calibration(result: BenchmarkResult):
    """Reliability diagram of the posterior average (first seed of every method)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6.5))
    ax.plot([0, 1], [0, 1], color="k", lw=0.8, ls="--", label="perfectly calibrated")
    for key, runs in result.runs.items():
        first = next((r for r in runs.values() if r.calibration is not None), None)
        if first is None:
            continue
        conf, acc, count = first.calibration
        used = count > 0
        ax.plot(conf[used], acc[used], ms=4, label=_label(key), **_style(key))
    ax.set_xlabel("confidence (predicted probability of the chosen class)")
    ax.set_ylabel("accuracy of the predictions in that confidence bin")
    ax.set_title(
        f"{result.summary['name']}: reliability of the posterior average (first seed)\n"
        "below the diagonal = over-confident",
        fontsize=10,
        pad=48,
    )
    ax.grid(alpha=0.3)
    _legend_above(ax)
    fig.tight_layout()
    return fig


def figure_png(fig: Any) -> bytes:
    """The PNG bytes of a figure (110 dpi); the figure is closed."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()
