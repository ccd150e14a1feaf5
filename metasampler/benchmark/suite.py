"""The benchmark suite's one table and its figures.

``python evaluate.py --suite configs/suite.yaml`` runs the toy Gaussian (:func:`toy_rows`) and
every Bayesian-network task the suite lists (each an ``evaluate.py`` run at the suite's
budget), then :func:`suite_table` puts them in one markdown table and :func:`plot_suite` /
:func:`plot_toy_kl` draw the comparison. Every function here reads results only: the runs
themselves are :func:`~metasampler.benchmark.gaussian.gaussian_benchmark` and
:func:`~metasampler.benchmark.run_benchmark`.

The verdict of a task compares the learned sampler's posterior-average NLL with every
baseline that samples the posterior's temperature (its final chains' configurational
temperature within :data:`TEMPERATURE_TOLERANCE` of 1): a sampler that runs cold can score a
lower NLL by sampling a sharper distribution than the posterior, which is not what a sampler
of the posterior should be compared on. Where the task ran every sampler adapted in its
burn-in too (``tune.mode: both``), a second verdict compares the adapted rows alone: each
sampler as a user runs it with ``adapt=True``, no grid.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..diagnostics import cumulative_gaussian_kl, ess_beast_paper
from ..samplers.base import Sampler
from ..sampling import sample
from .tables import format_mean_se

__all__ = [
    "ADAPTED_TOLERANCE",
    "TEMPERATURE_TOLERANCE",
    "adaptation_summary",
    "plot_suite",
    "plot_toy_kl",
    "suite_summary",
    "suite_table",
    "toy_rows",
]

#: A baseline samples "at the posterior's temperature" when its final chains' temperature is
#: within this of 1.
TEMPERATURE_TOLERANCE = 0.1
#: An adapted sampler "matches" its grid-tuned row when its posterior-average NLL is at most
#: this fraction above it.
ADAPTED_TOLERANCE = 0.03
LEARNED = "nnsghmc"
CONSTANT = "nnsghmc_constant"
ADAPTED = "_adapted"


def _mean_se(values: Sequence[float]) -> dict[str, float]:
    values = [float(v) for v in values]
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return {"mean": statistics.fmean(values), "se": se, "n": len(values)}


@torch.no_grad()
def toy_rows(
    samplers: Mapping[str, Callable[[], Sampler]],
    task: Any,
    seeds: Sequence[int],
    n_chains: int = 50,
    n_steps: int = 12_000,
    grad_noise_std: float = 1.0,
    curve_every: int = 250,
) -> dict[str, dict[str, Any]]:
    """Each sampler on the Gaussian ``task`` (the paper's toy protocol: chains from
    ``U([0, 6]^D)``, no burn-in, gradient noise of ``grad_noise_std``), per seed: the KL of the
    Gaussian fitted to all samples so far, every ``curve_every`` steps, and the ESS.

    Returns ``{label: {"kl": mean_se, "ess": mean_se, "curve_steps": [...],
    "curve": [mean KL ...]}}``.
    """
    target = task.target(grad_noise_std)
    at = list(range(curve_every, n_steps + 1, curve_every))
    rows = {}
    for label, make in samplers.items():
        curves, esses = [], []
        for seed in seeds:

            def init(generator: torch.Generator) -> torch.Tensor:
                return 6.0 * torch.rand((n_chains, task.dim), generator=generator)

            result = sample(make(), target, n_chains, n_steps, init=init, seed=seed, progress=False)
            samples = result.theta.double()
            curves.append(cumulative_gaussian_kl(samples, task.mean, task.cov, at=at))
            esses.append(float(ess_beast_paper(samples)))
        curve = np.mean(curves, axis=0)
        rows[label] = {
            "kl": _mean_se([c[-1] for c in curves]),
            "ess": _mean_se(esses),
            "curve_steps": at,
            "curve": [float(v) for v in curve],
        }
    return rows


def _baseline(key: str, entry: Mapping[str, Any], adapted: bool = False) -> bool:
    """Whether ``key`` is a hand-designed sampler's row run at its grid-tuned setting (with
    ``adapted``: its adapted row)."""
    learned = key in (LEARNED, CONSTANT) or key.startswith(LEARNED + "_")
    usable = bool(entry.get("is_sampler")) and not entry.get("error")
    return not learned and key.endswith(ADAPTED) == adapted and usable


def adaptation_summary(tasks: Mapping[str, Mapping[str, Any]]) -> str:
    """Per task and sampler with both rows, the grid-tuned and the adapted posterior-average
    NLL (``<key>_adapted``, ``tune.mode: both``), their difference and whether it is within
    :data:`ADAPTED_TOLERANCE`, with the steps each chose; ``""`` where no task has adapted
    rows."""
    lines = []
    for name, summary in tasks.items():
        methods = summary["methods"]
        for key, entry in methods.items():
            adapted = methods.get(key + ADAPTED)
            if adapted is None or key.endswith(ADAPTED):
                continue
            if entry.get("error") or adapted.get("error"):
                lines.append(f"| {name} | {entry['label']} |" + " – |" * 6)
                continue
            grid = entry["summary"]["average_nll"]["mean"]
            mine = adapted["summary"]["average_nll"]["mean"]
            change = (mine - grid) / abs(grid)
            steps = ", ".join(f"{c['lr']:.3g}" for c in adapted.get("adapted", []))
            mark = "yes" if change <= ADAPTED_TOLERANCE else "**no**"
            lines.append(
                f"| {name} | {entry['label']} | {grid:.4f} | {mine:.4f} | {100 * change:+.1f} % | "
                f"{entry['lr']:.3g} | {steps} | {mark} |"
            )
    if not lines:
        return ""
    header = [
        "| task | sampler | NLL, grid-tuned | NLL, adapted | change | grid lr | adapted lr "
        f"(per seed) | within {100 * ADAPTED_TOLERANCE:.0f} % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    return "\n".join(header + lines)


def _verdict(methods: Mapping[str, Any], adapted: bool = False) -> str:
    """Whether the learned sampler's posterior-average NLL is at or below every sampler
    baseline's that samples at temperature about 1; where none does at the task's budget
    (chains still spreading from their start), against every sampler baseline, said so. With
    ``adapted``, the adapted rows against each other (``"–"`` where the task has none)."""
    learned = methods.get(LEARNED + ADAPTED if adapted else LEARNED)
    if not learned or learned.get("error"):
        return "–" if adapted else "no learned sampler"
    mine = learned["summary"]["average_nll"]["mean"]
    at_one, all_baselines = [], []
    for key, entry in methods.items():
        if not _baseline(key, entry, adapted):
            continue
        temperature = entry["summary"].get("temperature", {}).get("mean", math.nan)
        row = (entry["label"], entry["summary"]["average_nll"]["mean"])
        all_baselines.append(row)
        if abs(temperature - 1.0) <= TEMPERATURE_TOLERANCE:
            at_one.append(row)
    compared, prefix = at_one, ""
    if not at_one:
        compared, prefix = all_baselines, "no baseline at T ≈ 1 at this budget; against all: "
    beaten_by = [label for label, nll in compared if nll < mine]
    return prefix + ("**ahead**" if not beaten_by else "behind " + ", ".join(beaten_by))


def _task_verdicts(methods: Mapping[str, Any]) -> str:
    """The task's verdict, and its adapted rows' where it has them."""
    adapted = _verdict(methods, adapted=True)
    return _verdict(methods) + ("" if adapted == "–" else f"; adapted rows: {adapted}")


def _best_baseline(methods: Mapping[str, Any], at_temperature_one: bool) -> Any:
    """The sampler baseline with the lowest posterior-average NLL (optionally only those at
    temperature about 1), or ``None``."""
    best = None
    for key, entry in methods.items():
        if not _baseline(key, entry):
            continue
        temperature = entry["summary"].get("temperature", {}).get("mean", math.nan)
        if at_temperature_one and abs(temperature - 1.0) > TEMPERATURE_TOLERANCE:
            continue
        if best is None or entry["summary"]["average_nll"]["mean"] < best[1]:
            best = (entry["label"], entry["summary"]["average_nll"]["mean"], temperature)
    return best


def suite_summary(
    toy: Mapping[str, Mapping[str, Any]] | None, tasks: Mapping[str, Mapping[str, Any]]
) -> str:
    """One row per task: the learned sampler's and the constant-net ablation's headline
    number (toy: KL at the last step; networks: posterior-average NLL), the best sampler
    baseline at temperature about 1 and the best of all sampler baselines, the verdict and
    the adapted rows' verdict (``"–"`` where a task has no adapted rows)."""
    lines = [
        "| task | learned | constant nets | best baseline at T ≈ 1 | best baseline (its T) | "
        "verdict | verdict, adapted |",
        "|---|---|---|---|---|---|---|",
    ]
    if toy:
        rows = list(toy.values())
        labels = list(toy)
        kl = [row["kl"]["mean"] for row in rows]
        baselines = [(lab, k) for lab, k in zip(labels[2:], kl[2:], strict=True)]
        best = min(baselines, key=lambda b: b[1]) if baselines else ("–", math.nan)
        verdict = "**ahead**" if kl[0] <= best[1] else "behind"
        lines.append(
            f"| toy Gaussian (KL@{rows[0]['curve_steps'][-1]}) | {kl[0]:.4f} | {kl[1]:.4f} | "
            f"{best[0]} {best[1]:.4f} | {best[0]} {best[1]:.4f} | {verdict} | – |"
        )
    for name, summary in tasks.items():
        methods = summary["methods"]

        def nll(key: str, methods: Mapping[str, Any] = methods) -> str:
            entry = methods.get(key)
            if not entry or entry.get("error"):
                return "–"
            return format_mean_se(entry["summary"]["average_nll"], 1, 4)

        at_one, overall = _best_baseline(methods, True), _best_baseline(methods, False)
        at_one_text = "none" if at_one is None else f"{at_one[0]} {at_one[1]:.4f}"
        overall_text = (
            "–" if overall is None else (f"{overall[0]} {overall[1]:.4f} ({overall[2]:.2f})")
        )
        lines.append(
            f"| {name} (NLL avg) | {nll(LEARNED)} | {nll(CONSTANT)} | {at_one_text} | "
            f"{overall_text} | {_verdict(methods)} | {_verdict(methods, adapted=True)} |"
        )
    return "\n".join(lines)


def suite_table(
    toy: Mapping[str, Mapping[str, Any]] | None,
    tasks: Mapping[str, Mapping[str, Any]],
    wall_seconds: float | None = None,
) -> str:
    """The suite's markdown table: the toy rows (KL at the last step, ESS) and, per task, every
    method's posterior-average error and NLL, the final ensemble's NLL, its temperature and
    ``prior var`` (``tasks``: ``{task name: results.json summary}``), with each task's
    verdict."""
    lines = [suite_summary(toy, tasks), ""]
    adaptation = adaptation_summary(tasks)
    if adaptation:
        lines += [
            "### Adapted in the burn-in against grid-tuned (`tune.mode: both`)",
            "",
            adaptation,
            "",
        ]
    if toy:
        lines += [
            "### Toy Gaussian (20-D, the paper's test protocol)",
            "",
            "| method | KL (last step) | ESS |",
            "|---|---|---|",
        ]
        for label, row in toy.items():
            kl, ess = format_mean_se(row["kl"], 1, 4), format_mean_se(row["ess"], 1, 1)
            lines.append(f"| {label} | {kl} | {ess} |")
        lines.append("")
    for name, summary in tasks.items():
        budget = summary["budget"]
        lines += [
            f"### {name}: {summary['task']}",
            "",
            f"{budget['n_chains']} chains × {budget['n_steps']} steps, seeds "
            f"{summary['seeds']}; verdict: {_task_verdicts(summary['methods'])}.",
            "",
            "| method | err % (avg) | NLL (avg) | NLL (ens) | temp | prior var | ms/step |",
            "|---|---|---|---|---|---|---|",
        ]
        for entry in summary["methods"].values():
            label = entry["label"] + ("" if entry.get("is_sampler") else " (optimiser)")
            if entry.get("error"):
                lines.append(f"| {label} | {entry['error']} | | | | | |")
                continue
            s = entry["summary"]
            prior = entry.get("prior_variance")
            cells = [
                format_mean_se(s["average_error"], 100, 2),
                format_mean_se(s["average_nll"], 1, 4),
                format_mean_se(s["ensemble_nll"], 1, 4),
                format_mean_se(s["temperature"], 1, 2) if "temperature" in s else "–",
                "–" if prior is None or not math.isfinite(prior) else f"{prior:.2f}",
                format_mean_se(s["seconds_per_step"], 1000, 1),
            ]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    if wall_seconds is not None:
        lines.append(f"Wall time of the whole suite: {wall_seconds / 60:.0f} minutes.")
    return "\n".join(lines)


def plot_suite(tasks: Mapping[str, Mapping[str, Any]], path: str | Path) -> None:
    """One panel per task: each sampler's posterior-average NLL and error with standard-error
    bars (``path``: a PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(tasks)
    fig, axes = plt.subplots(2, max(len(names), 1), figsize=(3.2 * max(len(names), 1), 6.4))
    axes = np.asarray(axes).reshape(2, -1)
    # one row per method over all tasks (a task without a method leaves its row empty)
    labels: list[str] = []
    for summary in tasks.values():
        for entry in summary["methods"].values():
            if entry["label"] not in labels:
                labels.append(entry["label"])
    for col, name in enumerate(names):
        keyed = [(k, e) for k, e in tasks[name]["methods"].items() if not e.get("error")]
        entries = [e for _, e in keyed]
        rows = [labels.index(e["label"]) for e in entries]
        for row, (metric, scale, title) in enumerate(
            (("average_nll", 1, "NLL (avg)"), ("average_error", 100, "error % (avg)"))
        ):
            ax = axes[row, col]
            means = [e["summary"][metric]["mean"] * scale for e in entries]
            # (one seed: no standard error)
            errors = [np.nan_to_num(e["summary"][metric]["se"] or 0.0) * scale for e in entries]
            colors = ["tab:red" if k == LEARNED else "tab:orange" if k == CONSTANT else "tab:gray"
                      for k, _ in keyed]  # fmt: skip
            ax.barh(rows, means, xerr=errors, color=colors)
            ax.set_yticks(range(len(labels)), labels if col == 0 else [""] * len(labels))
            ax.set_xlim(min(means) * 0.97, max(means) * 1.02)
            ax.set_title(f"{name}: {title}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_toy_kl(toy: Mapping[str, Mapping[str, Any]], path: str | Path) -> None:
    """The toy Gaussian's KL over steps, one curve per sampler (log scale; ``path``: a PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for label, row in toy.items():
        ax.plot(row["curve_steps"], row["curve"], label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("KL of the fitted Gaussian (all samples so far)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
