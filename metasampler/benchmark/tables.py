"""The result tables: the markdown table (``table.md``) and the CSV files (``summary.csv``,
``curves.csv``, ``tuning.csv``) of a benchmark summary."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from typing import Any

from .methods import FRICTION
from .results import FINAL_METRICS

#: What a tuning run can be scored by (``tune.metric``) and what the tables call it.
TUNE_METRICS = {"average_nll": "the posterior average", "ensemble_nll": "the final ensemble"}

__all__ = [
    "curves_csv",
    "format_mean_se",
    "markdown_table",
    "summary_csv",
    "tuning_csv",
]


def format_mean_se(stat: Mapping[str, float], scale: float = 1.0, digits: int = 3) -> str:
    """``"mean ± se"`` of a :func:`mean_se` dict times ``scale`` (``–`` without a mean, no
    ``± ...`` without a standard error)."""
    mean, se = stat.get("mean", math.nan), stat.get("se", math.nan)
    if mean is None or not math.isfinite(mean):
        return "–"
    text = f"{mean * scale:.{digits}f}"
    if se is not None and math.isfinite(se):
        text += f" ± {se * scale:.{digits}f}"
    return text


def _protocol_line(summary: Mapping[str, Any]) -> str:
    """The warm-up phase in words (empty without one)."""
    budget = summary["budget"]
    parts = []
    if budget.get("warmup_steps"):
        parts.append(
            f"Warm-up, every method: the first {budget['warmup_steps']} steps at "
            f"{budget['warmup_lr_factor']:g} × the chosen per-batch lr."
        )
    return " ".join(parts)


def markdown_table(summary: Mapping[str, Any]) -> str:
    """The results table: mean ± standard error over seeds, one row per method; then the
    step-size tuning table."""
    lines = _results_table(summary) + _tuning_table(summary) + _option_table(summary)
    return "\n".join(lines) + "\n"


def _results_table(summary: Mapping[str, Any]) -> list[str]:
    budget = summary["budget"]
    lines = [
        f"# {summary['name']}: {summary['task']}",
        "",
        f"Data: {summary['data']}; N = {summary['n_train']} train, {summary['n_val']} "
        f"validation, {summary['n_test']} test, {summary['n_ood']} OOD inputs. D = "
        f"{summary['dim']} parameters, minibatch {summary['batch_size']}.",
        f"Budget per method and seed: {budget['n_chains']} chains × {budget['n_steps']} steps "
        f"({budget['n_steps'] * summary['batch_size'] / summary['n_train']:.1f} epochs), "
        f"posterior average over every {budget['thin']}-th step after {budget['burn_in']} "
        f"burn-in steps; seeds {summary['seeds']} (mean ± standard error over seeds).",
        *filter(None, [_protocol_line(summary)]),
        "",
        "| Method | lr | friction/step | test err % (avg) | test NLL (avg) | test err % (ens) | "
        "test NLL (ens) | ECE (avg) | OOD entropy | prior var | temp | ms/step | diverged |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, entry in summary["methods"].items():
        label = entry["label"] + ("" if entry["is_sampler"] else " (optimiser)")
        if entry.get("error"):
            lines.append(f"| {label} | – | – | {entry['error']} | | | | | | | | | |")
            continue
        friction = _option(summary, key)
        friction = "–" if friction is None else f"{friction:g}"
        s = entry["summary"]
        lr = "stored" if entry["lr"] is None else f"{entry['lr']:g}"
        n_runs = len(entry["runs"])
        columns = (
            ("average_error", 100, 2),
            ("average_nll", 1, 4),
            ("ensemble_error", 100, 2),
            ("ensemble_nll", 1, 4),
            ("average_ece", 1, 4),
            ("ood_entropy", 1, 3),
        )
        cells = " | ".join(format_mean_se(s[m], scale, digits) for m, scale, digits in columns)
        prior = _prior_variance_cell(entry)
        # (results written before the column existed have no temperature)
        temperature = format_mean_se(s["temperature"], 1, 2) if "temperature" in s else "–"
        speed = format_mean_se(s["seconds_per_step"], 1000, 1)
        lines.append(
            f"| {label} | {lr} | {friction} | {cells} | {prior} | {temperature} | {speed} | "
            f"{entry['n_diverged']}/{n_runs} |"
        )
    lines += [
        "",
        "avg: running posterior average (all chains, all kept samples); ens: ensemble of the "
        "K final chains. NLL in nats per test example; ECE with "
        f"{summary['config']['ece_bins']} bins; OOD entropy: mean predictive entropy (nats) "
        "of the posterior average on out-of-distribution inputs (higher is better). "
        "prior var: the variance the method samples, at its chosen setting, schedule and "
        "budget, on N(0, 1) coordinates with exact gradients started at 0 (a weight no "
        "training example reaches, whose posterior is the prior: 1 is right), over the "
        "sampling steps after burn-in; below 1 where the chains have not spread in those "
        "directions within the budget or sample them cold, above where they over-disperse "
        "(metasampler.benchmark.prior_check; a learned sampler's nets see a Gaussian's "
        "energy there, not the network's). "
        "temp: the final chains' configurational temperature theta . grad U(theta) / D "
        "(full-data gradient; 1 in expectation over the posterior, below while chains still "
        "spread from their start or sample cold, above where they run hot; "
        "metasampler.benchmark.temperature). "
        "ms/step: sampling wall-clock, evaluation excluded. lr: per-batch learning rate "
        "chosen on the validation split; friction/step: the momentum methods' friction per "
        "step a = eta C (fixed or tuned with the step, below).",
    ]
    if summary.get("scoring") == "frames":
        lines += [
            "",
            f"Sequence task, scored on the {summary['n_test_frames']} real test frames: NLL in "
            "nats per frame (summed over the keys) of the chain mixture; err = 1 - frame-level "
            "accuracy TP/(TP+FP+FN) of keys whose predictive probability exceeds 1/2; N counts "
            "chunks of frames; no ECE or OOD set.",
        ]
    return lines


def _prior_variance_cell(entry: Mapping[str, Any]) -> str:
    """The prior-only variance (``–``: an optimiser, or results written before it existed;
    ``diverged``: the check's run did)."""
    value = entry.get("prior_variance")
    if value is None:
        return "–"
    return "diverged" if math.isnan(value) else f"{value:.2f}"


def _option(summary: Mapping[str, Any], key: str, option: str = FRICTION) -> float | None:
    """The value of ``option`` (default: the friction per step) a method ran with: the tuned
    value, else its config's (``None`` for a method without one, or where the sampler file's
    was kept)."""
    value = summary["methods"][key].get(option)
    if value is None:
        value = (summary.get("config", {}).get("methods", {}).get(key) or {}).get(option)
    return value


def _tuned_options(entry: Mapping[str, Any]) -> list[str]:
    """The options an entry tuned with its step, in order (results written before the freeze
    step could be tuned: the friction)."""
    return entry.get("tuned_options") or [entry.get("tuned_option") or FRICTION]


def _stage_rows(entry: Mapping[str, Any], option: str) -> list[dict[str, Any]]:
    """The tuning rows of the stage that tuned ``option`` (every row of a one-stage entry)."""
    return [r for r in entry.get("tuning") or [] if r.get("stage", option) == option]


def _best_per_value(entry: Mapping[str, Any], option: str) -> dict[float, float]:
    """Each value of ``option``'s lowest validation NLL over its steps (``inf``: all
    diverged)."""
    best: dict[float, float] = {}
    for row in _stage_rows(entry, option):
        score = row["val_nll"] if row["diverged_at"] is None else math.inf
        best[row[option]] = min(best.get(row[option], math.inf), score)
    return best


def _step_at_edge(entry: Mapping[str, Any], option: str, value: float) -> bool:
    """Whether the best step at ``option`` value ``value`` is the smallest or largest step
    tried there (its score is then only an upper bound of that value's best)."""
    rows = [r for r in _stage_rows(entry, option) if r[option] == value]
    finite = [r for r in rows if r["diverged_at"] is None]
    if len(rows) < 2 or not finite:
        return False
    best = min(finite, key=lambda r: r["val_nll"])["lr"]
    return best in (min(r["lr"] for r in rows), max(r["lr"] for r in rows))


def _by_value(entry: Mapping[str, Any], option: str, values: list[float]) -> str:
    """``value → best val NLL`` (or ``diverged``) for ``option``'s ``values``, increasing;
    ``*`` marks a value whose best step sat at an end of its step grid."""
    best = _best_per_value(entry, option)
    return ", ".join(
        f"{v:g} → "
        + (f"{best[v]:.4f}" if math.isfinite(best[v]) else "diverged")
        + ("*" if _step_at_edge(entry, option, v) else "")
        for v in sorted(values)
    )


def _option_table(summary: Mapping[str, Any]) -> list[str]:
    """The tuning of every method that tuned an option with its step (the friction per step,
    or NNSGHMC's freeze step): each value's best validation NLL over its tuned steps (empty
    when no method did)."""
    lines = [
        "",
        "## Options tuned with the step (best validation NLL over the steps tuned at each value)",
        "",
        "| Method | option | initial grid: value → best val NLL | extensions: value → best val "
        "NLL | chosen | choice |",
        "|---|---|---|---|---|---|",
    ]
    tuned = False
    for entry in (e for e in summary["methods"].values() if not e.get("error")):
        for option in _tuned_options(entry):
            grid = entry.get(f"{option}_grid")
            if not grid or len(grid) < 2:
                continue
            tuned = True
            extensions = entry.get(f"{option}_extensions") or []
            choice = {True: "interior", False: "grid edge", None: "–"}[
                entry.get(f"{option}_interior")
            ]
            lines.append(
                f"| {entry['label']} | {_OPTION_NAMES.get(option, option)} | "
                f"{_by_value(entry, option, grid)} | "
                f"{_by_value(entry, option, extensions) or '–'} | {entry[option]:g} | {choice} |"
            )
    if not tuned:
        return []
    lines += [
        "",
        "The step was tuned at every value of the option (the step-size table shows the chosen "
        "value's runs, tuning.csv all of them), each value after the first starting from the "
        "step grid moved to centre on the best step of the nearest value tuned before it; the "
        "value whose best step scored lowest was chosen. Extensions as for the step (whole "
        "steps for the freeze step); * marks a value whose best step is still at an end of "
        "its step grid (its score is an upper bound). Several options are tuned one after "
        "the other, in the order listed, each with the ones before it fixed at their chosen "
        "values and its step grid centred on the step chosen so far.",
    ]
    return lines


#: How the option tables name a tuned option.
_OPTION_NAMES = {FRICTION: "friction/step a"}


def _scored(rows: list[dict[str, Any]]) -> str:
    """``lr → val NLL`` (or ``diverged``) of tuning rows, by increasing lr."""
    return ", ".join(
        f"{r['lr']:g} → " + (f"{r['val_nll']:.4f}" if r["diverged_at"] is None else "diverged")
        for r in sorted(rows, key=lambda r: r["lr"])
    )


def _at_chosen_option(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The step-tuning rows of an entry at the option values it chose (all rows without
    any); with several tuned options, of the last one's stage."""
    options = [o for o in _tuned_options(entry) if entry.get(o) is not None]
    rows = _stage_rows(entry, options[-1]) if options else entry.get("tuning") or []
    return [r for r in rows if all(r.get(o, entry[o]) == entry[o] for o in options)]


def _near_tie_note(edge_tolerance: float) -> str:
    if not edge_tolerance:
        return ""
    return (
        f" An end scoring within {edge_tolerance:g} of the best (relative) was extended past "
        "too (a near-tie: one run per value is a noisy score)."
    )


def _tuning_table(summary: Mapping[str, Any]) -> list[str]:
    lines = [
        "",
        "## Step-size tuning (validation NLL of "
        f"{TUNE_METRICS[summary['tune'].get('metric', 'average_nll')]})",
        "",
        "| Method | initial grid: lr → val NLL | extensions: lr → val NLL | chosen lr | eta | "
        "choice |",
        "|---|---|---|---|---|---|",
    ]
    at_edge = False
    for entry in summary["methods"].values():
        rows = _at_chosen_option(entry)
        initial = _scored([r for r in rows if not r.get("extension")])
        extended = _scored([r for r in rows if r.get("extension")])
        lr = "–" if entry.get("lr") is None else f"{entry['lr']:g}"
        eta = "–" if entry.get("eta") is None else f"{entry['eta']:.3g}"
        interior = entry.get("tuning_interior")
        if interior is None and len(rows) > 1 and entry.get("lr") is not None:
            values = [r["lr"] for r in rows]  # results written before the extension existed
            interior = min(values) < entry["lr"] < max(values)
        choice = {True: "interior", False: "grid edge", None: "–"}[interior]
        at_edge = at_edge or interior is False
        if entry.get("adapted") is not None:  # (tune.mode adapt: no tuning runs)
            lrs = ", ".join(f"{c['lr']:.3g}" for c in entry["adapted"]) or "diverged"
            initial, choice = f"adapted in each seed's burn-in from {entry['start_lr']:g}", lrs
            lr = f"{entry['lr']:.3g} (median)" if entry.get("lr") is not None else "–"
        lines.append(
            f"| {entry['label']} | {initial or 'not tuned'} | {extended or '–'} | {lr} | {eta} "
            f"| {choice} |"
        )
    lines += [
        "",
        "extensions: while the best value sat at an end of the grid, the next value beyond it "
        "(at the ratio of the two values nearest that end) was tuned too, at most "
        f"{summary['tune'].get('max_extensions', 0)} times; a diverged run counts as worst."
        + _near_tie_note(summary["tune"].get("edge_tolerance", 0.0))
        + (  # (explained only where a row has it)
            " grid edge: the choice is still at an end after the last extension (the optimum "
            "may lie beyond it)."
            if at_edge
            else ""
        ),
    ]
    return lines


def _csv_text(rows: list[dict[str, Any]], fields: list[str]) -> str:
    buffer = io.StringIO()
    out = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    out.writeheader()
    for row in rows:
        out.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in fields})
    return buffer.getvalue()


_CURVE_FIELDS = [
    "method",
    "seed",
    "step",
    "epoch",
    "seconds",
    "ensemble_error",
    "ensemble_nll",
    "member_nll",
    "average_error",
    "average_nll",
    "n_averaged",
]


def _curve_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key, entry in summary["methods"].items():
        for run in entry.get("runs", []):
            for row in run["curves"]:
                rows.append({"method": key, "seed": run["seed"], **row})
    return rows


def _summary_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key, entry in summary["methods"].items():
        row: dict[str, Any] = {
            "method": key,
            "label": entry["label"],
            "lr": entry.get("lr"),
            FRICTION: _option(summary, key),
            "eta": entry.get("eta"),
            "tuning_interior": entry.get("tuning_interior"),
            "warmup_eta": entry.get("warmup_eta"),
            "n_diverged": entry.get("n_diverged"),
            "error": entry.get("error"),
        }
        for metric, stat in (entry.get("summary") or {}).items():
            row[f"{metric}_mean"], row[f"{metric}_se"] = stat["mean"], stat["se"]
            row["n_seeds"] = stat["n"]
        rows.append(row)
    return rows


_SUMMARY_FIELDS = (
    ["method", "label", "lr", FRICTION, "eta", "tuning_interior", "warmup_eta"]
    + ["n_seeds"]
    + ["n_diverged"]
    + [f"{m}_{s}" for m in FINAL_METRICS for s in ("mean", "se")]
    + ["error"]
)


_TUNING_FIELDS = [
    "method",
    "stage",  # the option tuned in this run's stage (several options tuned in order)
    FRICTION,
    "lr",
    "eta",
    "val_nll",
    "val_error",
    "diverged_at",
    "extension",
    "chosen",
]


def summary_csv(summary: Mapping[str, Any]) -> str:
    """``summary.csv``: one row per method (choice, protocol values, mean and se of the final
    metrics)."""
    return _csv_text(_summary_rows(summary), _SUMMARY_FIELDS)


def curves_csv(summary: Mapping[str, Any]) -> str:
    """``curves.csv``: every learning-curve row of every method and seed."""
    return _csv_text(_curve_rows(summary), _CURVE_FIELDS)


def tuning_csv(summary: Mapping[str, Any]) -> str:
    """``tuning.csv``: every tuning run of every method."""
    rows = [
        {"method": key, **row}
        for key, entry in summary["methods"].items()
        for row in entry.get("tuning") or []
    ]
    return _csv_text(rows, _TUNING_FIELDS)
