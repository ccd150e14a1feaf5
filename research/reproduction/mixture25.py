"""25-Gaussian mixture mode coverage: SGLD vs cSGLD (Zhang et al., ICLR 2020, seed 000,
§5.1, Fig. 2, appendix A.1 Table 4 and Fig. 5).

Target: 25 equal-weight Gaussians with means on ``{-4,-2,0,2,4}^2`` and covariance ``0.03 I``
(:func:`tasks.toy.mixture_25`). A mode is covered when at least ``min_count = 100`` samples lie
within ``radius = 0.25`` of its centre. Table 4 reports the mean ± standard error over 10 runs
of one chain ("SGLD", "cSGLD") and of 4 parallel chains pooled ("Parallel ..."), 50k steps per
chain.

All ``n_runs * chains_per_run`` chains run as one batch of chains; the single-chain setting
scores the first chain of every run, the parallel setting the pooled chains of every run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

import metasampler as ms
from metasampler.samplers import SGLD
from metasampler.schedules import PolynomialDecay
from tasks.toy import mixture_25

from . import common
from .common import (
    LABELS,
    CSGLDSettings,
    ExperimentOutput,
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

__all__ = ["Mixture25Config", "validate", "run", "PAPER"]

#: Seed 000 Table 4 (mean ± standard error over 10 runs).
PAPER = {
    "sgld": (1.8, 0.13),
    "csgld": (6.7, 0.52),
    "parallel_sgld": (18.0, 0.47),
    "parallel_csgld": (24.4, 0.22),
}


@dataclass
class SGLDSettings:
    eta: float = 0.05  # alpha_k = eta * (b + k)^-gamma
    b: float = 0.0
    gamma: float = 0.55


@dataclass
class NNSGHMCSettings(common.NNSGHMCSettings):
    n_steps: int = 0  # 0: the same n_steps as the baselines


@dataclass
class Mixture25Config:
    seed: int = 0
    progress: bool = True
    n_runs: int = 10
    chains_per_run: int = 4
    n_steps: int = 50_000
    grad_noise_std: float = 1.0
    init_low: float = -10.0
    init_high: float = 10.0
    radius: float = 0.25
    min_count: int = 100
    sgld: SGLDSettings = field(default_factory=SGLDSettings)
    csgld: CSGLDSettings = field(
        default_factory=lambda: CSGLDSettings(eta=0.09, n_cycles=30, explore_fraction=0.25)
    )
    nnsghmc: NNSGHMCSettings = field(default_factory=NNSGHMCSettings)
    density_bins: int = 120
    dpi: int = 70


def validate(cfg: DictConfig) -> None:
    """Range checks; raises :class:`~metasampler.config.ConfigError`."""
    check_int_at_least(cfg, 1, "n_runs", "chains_per_run", "n_steps", "min_count")
    check_csgld(cfg)
    check_positive(cfg, "sgld.eta", "nnsghmc.eta", "radius", "sgld.gamma")
    require(cfg.grad_noise_std >= 0, f"grad_noise_std must be >= 0, got {cfg.grad_noise_std!r}")
    require(cfg.init_high > cfg.init_low, "init_high must be > init_low")
    require(cfg.nnsghmc.n_steps >= 0, "nnsghmc.n_steps must be >= 0")
    require(cfg.density_bins >= 10, "density_bins must be >= 10")


def coverage(task: Any, theta: torch.Tensor, cfg: DictConfig) -> dict[str, Any]:
    """Per-run mode coverage of ``theta`` ``(S, n_runs * chains_per_run, 2)``: the first chain
    of each run (single) and all chains of each run pooled (parallel)."""
    c = cfg.chains_per_run
    single, parallel = [], []
    for run in range(cfg.n_runs):
        chains = theta[:, run * c : (run + 1) * c]
        single.append(task.modes_covered(chains[:, 0], cfg.radius, cfg.min_count))
        parallel.append(task.modes_covered(chains.reshape(-1, 2), cfg.radius, cfg.min_count))
    return {
        "single": single,
        "parallel": parallel,
        "single_stat": mean_se(single),
        "parallel_stat": mean_se(parallel),
    }


def within_mode_variance(task: Any, theta: torch.Tensor, max_points: int = 200_000) -> float:
    """Mean per-coordinate squared distance to the nearest centre (exact: ``0.03``), on an
    evenly thinned subset of the samples: a check of the samplers' discretisation bias."""
    x = theta.reshape(-1, 2)
    x = x[:: max(1, x.shape[0] // max_points)]
    d2 = ((x[:, None, :] - task.centres[None]) ** 2).sum(-1).min(-1).values
    return float(d2.mean() / 2)


def run(cfg: DictConfig) -> ExperimentOutput:
    """Run SGLD, cSGLD (and NNSGHMC) on the 25-Gaussian mixture; tables and density images."""
    task = mixture_25()
    target = task.target(cfg.grad_noise_std, dtype=torch.float64)
    k = cfg.n_runs * cfg.chains_per_run
    gen = torch.Generator().manual_seed(cfg.seed)
    init = cfg.init_low + (cfg.init_high - cfg.init_low) * torch.rand(
        k, 2, generator=gen, dtype=torch.float64
    )
    samplers: dict[str, tuple[Any, int]] = {
        "sgld": (
            SGLD(eta=cfg.sgld.eta, schedule=PolynomialDecay(cfg.sgld.b, cfg.sgld.gamma)),
            cfg.n_steps,
        ),
        "csgld": (csgld_sampler(cfg.csgld, cfg.n_steps), cfg.n_steps),
    }
    if cfg.nnsghmc.enabled:
        samplers["nnsghmc"] = (
            ms.load_sampler(cfg.nnsghmc.path, eta=cfg.nnsghmc.eta),
            cfg.nnsghmc.n_steps or cfg.n_steps,
        )
    results: dict[str, Any] = {}
    images: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for i, (name, (sampler, n_steps)) in enumerate(samplers.items()):
        out = ms.sample(
            sampler, target, k, n_steps, init=init, seed=cfg.seed + 1 + i,
            progress=cfg.progress, dtype=torch.float64,
        )  # fmt: skip
        theta = out.theta
        results[name] = {"n_steps": n_steps, "n_kept": int(theta.shape[0])}
        results[name].update(coverage(task, theta, cfg))
        results[name]["within_mode_variance"] = within_mode_variance(task, theta)
        images[name] = (
            theta[:, 0].numpy(),
            theta[:, : cfg.chains_per_run].reshape(-1, 2).numpy(),
        )
    return ExperimentOutput(
        "mixture25", results, _markdown(results, cfg), {"density": _plot(task, images, cfg)}
    )


def _markdown(results: dict[str, Any], cfg: DictConfig) -> str:
    lines = [
        f"Modes covered (of 25; >= {cfg.min_count} samples within {cfg.radius}), mean ± "
        f"standard error over {cfg.n_runs} runs, {cfg.n_steps:,} steps per chain.",
        "",
        "| Algorithm | Paper (seed 000 Table 4) | Ours |",
        "|---|---|---|",
    ]
    for setting, prefix in (("single", ""), ("parallel", "Parallel ")):
        for name in results:
            key = name if setting == "single" else f"parallel_{name}"
            paper = PAPER.get(key)
            paper_txt = f"{paper[0]} ± {paper[1]}" if paper else "—"
            ours = fmt_mean_se(results[name][f"{setting}_stat"], 1)
            lines.append(f"| {prefix}{LABELS[name]} | {paper_txt} | {ours} |")
    lines += [
        "",
        "Within-mode variance per coordinate (mean squared distance to the nearest centre / 2; "
        "exact 0.03): "
        + ", ".join(f"{LABELS[n]} {results[n]['within_mode_variance']:.3f}" for n in results)
        + ".",
    ]
    return "\n".join(lines)


def _plot(task: Any, images: dict[str, tuple[np.ndarray, np.ndarray]], cfg: DictConfig) -> bytes:
    plt = matplotlib_agg()
    names = list(images)
    fig, axes = plt.subplots(2, len(names) + 1, figsize=(2.3 * (len(names) + 1), 4.6))
    edges = np.linspace(-6, 6, cfg.density_bins + 1)
    grid = torch.from_numpy(0.5 * (edges[1:] + edges[:-1]))
    xx, yy = torch.meshgrid(grid, grid, indexing="xy")
    dens = task.log_density(torch.stack([xx.reshape(-1), yy.reshape(-1)], -1)).exp()
    for row, setting in enumerate(("single chain", f"{cfg.chains_per_run} parallel chains")):
        axes[row, 0].imshow(dens.reshape(xx.shape).numpy(), origin="lower", extent=(-6, 6, -6, 6))
        axes[row, 0].set_title("target", fontsize=9)
        for j, name in enumerate(names):
            pts = images[name][row]
            hist, _, _ = np.histogram2d(pts[:, 1], pts[:, 0], bins=[edges, edges])
            ax = axes[row, j + 1]
            ax.imshow(hist, origin="lower", extent=(-6, 6, -6, 6))
            covered = task.modes_covered(torch.from_numpy(pts), cfg.radius, cfg.min_count)
            ax.set_title(f"{LABELS[name]}, {setting}\n{covered} modes", fontsize=8)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    return figure_png(fig, cfg.dpi)
