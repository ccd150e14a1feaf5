"""4-Gaussian mixture sample statistics: SGLD vs cSGLD (Pal et al., survey, seed 002, §5.1,
Fig. 2, Table 1).

Target: 4 equal-weight Gaussians with means ``(±0.4, ±0.4)`` and covariance ``0.02 I``
(:func:`tasks.toy.mixture_4`); exact per-coordinate variance ``0.02 + 0.16 = 0.18``. Each run
starts at the origin, takes 20k steps and discards the first 1k. Table 1 reports, per
coordinate, the sample variance ``lambda^2``, the spectral-variance (Bartlett window,
``b = floor(sqrt(S))``) and batch-means (batch size ``floor(sqrt(S))``) asymptotic variances
``sigma^2`` and ``ESS = S lambda^2 / sigma^2`` (seed 002 §2.4; :mod:`metasampler.diagnostics`).

Schedules (seed 002 §5.1): SGLD ``eta_0 (t+1)^-0.55`` for ``t < 200``, then held at
``eta_0 200^-0.55``, ``eta_0 = 0.01``. The survey's cSGLD formula,
``eta_0 * gamma_t * sign(d gamma_t / dt) + 0.0005`` with ``gamma_t = cos(pi 0.3 t / 360)``,
is negative for half of every period as printed, so we use the cyclical cosine schedule of
seed 000 (SPEC §2) with its peak ``alpha_0 = eta_0`` and its period: the printed curve rises
over 1200 steps, giving ``M = ceil(20000 / 1200) = 17`` cycles. The survey keeps every
sample ("for this simple problem with close modes we can retain them"), so the exploration
fraction is 0 (no T = 0 stage). Every run is one chain of a batch of ``n_runs`` chains.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

import metasampler as ms
from metasampler import diagnostics as dg
from metasampler.samplers import SGLD
from metasampler.schedules import DecayThenHold
from tasks.toy import mixture_4

from .common import (
    LABELS,
    CSGLDSettings,
    ExperimentOutput,
    NNSGHMCSettings,
    check_csgld,
    check_int_at_least,
    check_positive,
    csgld_sampler,
    figure_png,
    fmt_mean_se,
    matplotlib_agg,
    mean_se,
    require,
)

__all__ = ["Mixture4Config", "validate", "run", "PAPER", "STATS", "sample_statistics"]

STATS = ("lambda2", "sigma2_sv", "ess_sv", "sigma2_bm", "ess_bm")
#: Seed 002 Table 1: {sampler: {coordinate: (lambda^2, sigma^2_sv, ESS_sv, sigma^2_bm, ESS_bm)}}
PAPER = {
    "sgld": {
        "x": (0.1507, 19.119, 157.70, 206.23, 14.620),
        "y": (0.1684, 21.624, 155.75, 467.98, 7.1970),
    },
    "csgld": {
        "x": (0.1805, 12.660, 285.25, 18.772, 192.37),
        "y": (0.1853, 13.840, 267.81, 14.489, 255.80),
    },
}


@dataclass
class SGLDSettings:
    eta: float = 0.01  # eta_0
    decay_until: int = 200  # decay (t+1)^-gamma for t < decay_until, then hold
    gamma: float = 0.55


@dataclass
class Mixture4Config:
    seed: int = 0
    progress: bool = True
    n_runs: int = 10
    n_steps: int = 20_000
    burn_in: int = 1_000
    grad_noise_std: float = 0.0
    sgld: SGLDSettings = field(default_factory=SGLDSettings)
    csgld: CSGLDSettings = field(
        default_factory=lambda: CSGLDSettings(eta=0.01, n_cycles=17, explore_fraction=0.0)
    )
    nnsghmc: NNSGHMCSettings = field(default_factory=NNSGHMCSettings)
    dpi: int = 70


def validate(cfg: DictConfig) -> None:
    """Range checks; raises :class:`~metasampler.config.ConfigError`."""
    check_int_at_least(cfg, 1, "n_runs", "n_steps", "sgld.decay_until")
    check_int_at_least(cfg, 0, "burn_in")
    require(
        cfg.n_steps - cfg.burn_in >= 16,
        f"n_steps - burn_in must leave >= 16 samples, got {cfg.n_steps} - {cfg.burn_in}",
    )
    check_csgld(cfg)
    check_positive(cfg, "sgld.eta", "nnsghmc.eta", "sgld.gamma")
    require(cfg.grad_noise_std >= 0, f"grad_noise_std must be >= 0, got {cfg.grad_noise_std!r}")


def sample_statistics(chain: np.ndarray) -> dict[str, np.ndarray]:
    """Seed 002 Table 1 statistics of one chain ``(S, D)``, per coordinate ``(D,)``."""
    s = chain.shape[0]
    lam2 = chain.var(axis=0, ddof=1)
    sv = np.atleast_1d(dg.asymptotic_variance_spectral(chain))
    bm = np.atleast_1d(dg.asymptotic_variance_batch_means(chain))
    return {
        "lambda2": lam2,
        "sigma2_sv": sv,
        "ess_sv": s * lam2 / sv,
        "sigma2_bm": bm,
        "ess_bm": s * lam2 / bm,
    }


def run(cfg: DictConfig) -> ExperimentOutput:
    """Run SGLD, cSGLD (and NNSGHMC) from the origin; per-coordinate statistics per run."""
    task = mixture_4()
    target = task.target(cfg.grad_noise_std, dtype=torch.float64)
    init = torch.zeros(cfg.n_runs, 2, dtype=torch.float64)
    samplers: dict[str, Any] = {
        "sgld": SGLD(
            eta=cfg.sgld.eta, schedule=DecayThenHold(cfg.sgld.decay_until, cfg.sgld.gamma)
        ),
        "csgld": csgld_sampler(cfg.csgld, cfg.n_steps),
    }
    if cfg.nnsghmc.enabled:
        samplers["nnsghmc"] = ms.load_sampler(cfg.nnsghmc.path, eta=cfg.nnsghmc.eta)
    results: dict[str, Any] = {}
    traces: dict[str, np.ndarray] = {}
    for i, (name, sampler) in enumerate(samplers.items()):
        out = ms.sample(
            sampler, target, cfg.n_runs, cfg.n_steps, init=init, burn_in=cfg.burn_in,
            seed=cfg.seed + 1 + i, progress=cfg.progress, dtype=torch.float64,
        )  # fmt: skip
        theta = out.theta.numpy()  # (S, runs, 2)
        per_run = [sample_statistics(theta[:, r]) for r in range(cfg.n_runs)]
        entry: dict[str, Any] = {"n_kept": int(theta.shape[0]), "per_run": per_run}
        for c, coord in enumerate(("x", "y")):
            entry[coord] = {stat: mean_se(p[stat][c] for p in per_run) for stat in STATS}
        quadrant = (theta[..., 0] > 0) * 2 + (theta[..., 1] > 0)  # (S, runs)
        weights = np.stack([(quadrant == q).mean(0) for q in range(4)])  # (4, runs)
        entry["max_quadrant_weight_error"] = mean_se(np.abs(weights - 0.25).max(0))
        results[name] = entry
        traces[name] = theta[:, 0]
    results["exact_variance"] = float(task.cov[0, 0])
    return ExperimentOutput(
        "mixture4", results, _markdown(results, cfg), {"samples": _plot(traces, cfg)}
    )


def _markdown(results: dict[str, Any], cfg: DictConfig) -> str:
    lines = [
        f"Per-coordinate statistics of one chain (S = {cfg.n_steps - cfg.burn_in:,} kept "
        f"samples after {cfg.burn_in:,} burn-in), ours as mean ± standard error over "
        f"{cfg.n_runs} runs; the paper reports one run. Exact variance "
        f"{results['exact_variance']:.2f}.",
        "",
        "| Sampler | coord | λ² paper | λ² ours | σ²_sv paper | σ²_sv ours | ESS_sv paper | "
        "ESS_sv ours | σ²_bm paper | σ²_bm ours | ESS_bm paper | ESS_bm ours |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    digits = {"lambda2": 3, "sigma2_sv": 2, "ess_sv": 0, "sigma2_bm": 2, "ess_bm": 0}
    for name in LABELS:
        if name not in results:
            continue
        for coord in ("x", "y"):
            cells = []
            for j, stat in enumerate(STATS):
                paper = PAPER.get(name, {}).get(coord)
                cells.append(f"{paper[j]:g}" if paper else "—")
                cells.append(fmt_mean_se(results[name][coord][stat], digits[stat]))
            lines.append(f"| {LABELS[name]} | {coord} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Largest deviation of a quadrant's sample fraction from 1/4 (mean ± se over runs): "
        + ", ".join(
            f"{LABELS[n]} {fmt_mean_se(results[n]['max_quadrant_weight_error'], 3)}"
            for n in LABELS
            if n in results
        )
        + ".",
    ]
    return "\n".join(lines)


def _plot(traces: dict[str, np.ndarray], cfg: DictConfig) -> bytes:
    plt = matplotlib_agg()
    fig, axes = plt.subplots(2, len(traces), figsize=(3.0 * len(traces), 5.0), squeeze=False)
    edges = np.linspace(-1.0, 1.0, 81)
    for j, (name, chain) in enumerate(traces.items()):
        hist, _, _ = np.histogram2d(chain[:, 1], chain[:, 0], bins=[edges, edges])
        axes[0, j].imshow(hist, origin="lower", extent=(-1, 1, -1, 1))
        axes[0, j].set_title(f"{LABELS[name]}: run 0 samples", fontsize=9)
        axes[1, j].plot(chain[:, 0], lw=0.3)
        axes[1, j].set_title("trace of x", fontsize=9)
        axes[1, j].set_ylim(-1, 1)
    fig.tight_layout()
    return figure_png(fig, cfg.dpi)
