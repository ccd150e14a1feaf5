"""Bayesian logistic regression ESS: SGLD, cSGLD, SGHMC, cSGHMC (Zhang et al., ICLR 2020,
seed 000, appendix A.2 Table 5 and appendix K.1).

Data: Australian, German, Heart (:func:`tasks.uci.load_logistic`), covariates standardised,
an intercept, prior ``N(0, prior_std^2 I)``. Seed 000 collects 5000 samples after 5000 burn-in
iterations and reports the median over dimensions of

    ``ESS = B / (1 + 2 sum_s (1 - s/B) rho_s)``,
    ``rho_s = 1/(sigma^2 (B - s)) sum_{b > s} (theta_b - mu)(theta_{b-s} - mu)``,

with ``mu`` and ``sigma^2`` "obtained by running an independent sampler" (HMC; Hoffman &
Gelman 2014, whose sum stops at the first lag with ``rho_s < 0.05``). Our independent sampler
is full-batch MALA (:func:`mala_reference`); :func:`ess_reference_moments` is the estimator.
Geyer's ESS (:func:`metasampler.diagnostics.ess`, one chain, no split) is reported beside it.

Step sizes (appendix K.1; ``aN`` is the per-batch learning rate ``lr`` of SPEC §1): cSGLD and
cSGHMC ``M = 100`` cycles, ``beta = 0.01``; SGLD / SGHMC hold the step for 5000 iterations and
then decay it as ``(k - 5000)^-0.55`` (:class:`~metasampler.schedules.HoldThenDecay`; for SGHMC
the learning rate decays, so ``eta = sqrt(lr / N)`` decays with exponent 0.275); momentum
``eta = 0.5`` in their notation is a per-step friction ``eta_sde * C = 0.5``.

The runs are ``n_runs`` chains of one batch per sampler and data set. The target
(:class:`LogisticTarget`) computes the minibatch energy and gradient in closed form, drawing
minibatches exactly as :class:`metasampler.BayesianModel` does (one ``randperm`` shared by all
chains), and matches it (tested) at a fraction of the cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import Tensor
from tqdm.auto import tqdm

import metasampler as ms
from metasampler import diagnostics as dg
from metasampler.samplers import SGHMC, SGLD, cyclical_sghmc, cyclical_sgld
from metasampler.schedules import HoldThenDecay
from metasampler.stepsize import resolve_eta
from metasampler.targets import Evaluation
from tasks.uci import LOGISTIC_DATASETS, load_logistic

from .common import (
    LABELS,
    ExperimentOutput,
    NNSGHMCFile,
    check_datasets,
    check_fraction,
    check_int_at_least,
    check_positive,
    fmt_mean_se,
    mean_se,
    require,
    sampler_entries,
    trace_figure,
)

__all__ = [
    "BLRConfig",
    "LogisticTarget",
    "PAPER",
    "ess_reference_moments",
    "mala_reference",
    "run",
    "validate",
]

#: Seed 000 Table 5 (median ESS over dimensions, 5000 samples).
PAPER = {
    "australian": {"sgld": 1676, "csgld": 2138, "sghmc": 1317, "csghmc": 4707},
    "german": {"sgld": 492, "csgld": 978, "sghmc": 2007, "csghmc": 2436},
    "heart": {"sgld": 2199, "csgld": 2541, "sghmc": 5000, "csghmc": 5000},
}


@dataclass
class DatasetSteps:
    sgld_lr: float = 1.2  # a N for SGLD and cSGLD
    sghmc_lr: float = 0.5  # a N for SGHMC and cSGHMC


@dataclass
class NNSGHMCSettings(NNSGHMCFile):
    lr: float = 0.5  # per-batch learning rate, eta = sqrt(lr / N)


@dataclass
class ReferenceSettings:
    n_chains: int = 10
    n_steps: int = 20_000
    burn_in: int = 5_000


@dataclass
class BLRConfig:
    seed: int = 0
    progress: bool = True
    datasets: list[str] = field(default_factory=lambda: ["australian", "german", "heart"])
    n_runs: int = 10
    burn_in: int = 5_000
    n_samples: int = 5_000
    batch_size: int = 32
    prior_std: float = 10.0
    steps: dict[str, DatasetSteps] = field(
        default_factory=lambda: {
            "australian": DatasetSteps(1.2, 0.5),
            "german": DatasetSteps(0.5, 0.3),
            "heart": DatasetSteps(1.5, 1.0),
        }
    )
    decay_gamma: float = 0.55
    n_cycles: int = 100
    explore_fraction: float = 0.01
    momentum_decay: float = 0.5  # per-step friction eta * C
    ess_threshold: float = 0.05
    nnsghmc: NNSGHMCSettings = field(default_factory=NNSGHMCSettings)
    reference: ReferenceSettings = field(default_factory=ReferenceSettings)
    dpi: int = 70


def validate(cfg: DictConfig) -> None:
    """Range checks; raises :class:`~metasampler.config.ConfigError`."""
    check_datasets(cfg, LOGISTIC_DATASETS)
    for name in cfg.datasets:
        require(name in cfg.steps, f"steps has no entry for data set {name!r}")
        check_positive(cfg, f"steps.{name}.sgld_lr", f"steps.{name}.sghmc_lr")
    check_int_at_least(cfg, 2, "n_runs")
    check_int_at_least(cfg, 1, "n_samples", "batch_size", "n_cycles")
    check_int_at_least(cfg, 16, "n_samples")
    check_int_at_least(cfg, 0, "burn_in", "reference.burn_in")
    check_int_at_least(cfg, 1, "reference.n_chains", "reference.n_steps")
    require(cfg.reference.burn_in < cfg.reference.n_steps, "reference.burn_in must be < n_steps")
    require(cfg.n_cycles <= cfg.burn_in + cfg.n_samples, "n_cycles must be <= burn_in + n_samples")
    check_positive(cfg, "prior_std", "decay_gamma", "momentum_decay", "nnsghmc.lr")
    check_fraction(cfg, "explore_fraction", "ess_threshold")


class LogisticTarget:
    """Logistic-regression posterior with intercept, ``theta = (w (d,), b)``, on ``K`` chains.

    ``Ũ = -(N/M) sum_m [y_m o_m - softplus(o_m)] + ||theta||^2 / (2 prior_std^2)``,
    ``o = x w + b``; gradient in closed form. Minibatches as in
    :class:`metasampler.BayesianModel`: ``torch.randperm(N, generator=generator)[:M]``,
    shared by all chains; ``batch_size=None`` is full batch (no random draws).
    """

    def __init__(
        self, x: Tensor, y: Tensor, prior_std: float, batch_size: int | None = None
    ) -> None:
        self.x = x.to(torch.float64)
        self.y = y.to(torch.float64)
        self.n_data = int(x.shape[0])
        self.dim = int(x.shape[1]) + 1
        self.prior_std = float(prior_std)
        self.batch_size = self.n_data if batch_size is None else int(batch_size)

    def evaluate(
        self, theta: Tensor, generator: torch.Generator | None = None, create_graph: bool = False
    ) -> Evaluation:
        if self.batch_size < self.n_data:
            idx = torch.randperm(self.n_data, generator=generator)[: self.batch_size]
            x, y = self.x[idx], self.y[idx]
        else:
            x, y = self.x, self.y
        scale = self.n_data / x.shape[0]
        w, b = theta[:, :-1], theta[:, -1:]
        logits = w @ x.T + b  # (K, M)
        loglik = (y * logits - F.softplus(logits)).sum(-1)
        resid = y - torch.sigmoid(logits)  # d loglik / d logits
        grad_lik = -scale * torch.cat([resid @ x, resid.sum(-1, keepdim=True)], dim=-1)
        var = self.prior_std**2
        prior_energy = 0.5 * (theta * theta).sum(-1) / var
        prior_grad = theta / var
        energy = -scale * loglik + prior_energy
        return Evaluation(energy, grad_lik + prior_grad, prior_energy, prior_grad)


def mala_reference(
    target: LogisticTarget,
    init: Tensor,
    n_steps: int,
    burn_in: int,
    generator: torch.Generator,
    progress: bool = False,
) -> tuple[Tensor, float]:
    """Full-batch MALA on ``K`` chains, the "independent sampler" of seed 000 appendix K.1.

    The per-chain step adapts during burn-in towards acceptance 0.574 (Robbins-Monro on
    ``log h``) and is then frozen, so the kept samples are exact MCMC.

    Returns:
        ``(samples (n_steps - burn_in, K, D), acceptance rate after burn-in)``.
    """
    theta = init.clone()
    k = theta.shape[0]
    ev = target.evaluate(theta)
    log_h = torch.full((k, 1), math.log(1e-3), dtype=theta.dtype)
    kept, accepted = [], 0.0
    for t in tqdm(range(n_steps), desc="MALA reference", disable=not progress, leave=False):
        h = log_h.exp()
        prop = (
            theta
            - h * ev.grad
            + (2 * h).sqrt() * torch.randn(theta.shape, generator=generator, dtype=theta.dtype)
        )
        ev_p = target.evaluate(prop)
        fwd = ((prop - theta + h * ev.grad) ** 2).sum(-1)
        bwd = ((theta - prop + h * ev_p.grad) ** 2).sum(-1)
        log_alpha = ev.energy - ev_p.energy - (bwd - fwd) / (4 * h[:, 0])
        u = torch.rand(k, generator=generator, dtype=theta.dtype)
        accept = torch.log(u) < log_alpha
        theta = torch.where(accept[:, None], prop, theta)
        ev = Evaluation(
            torch.where(accept, ev_p.energy, ev.energy),
            torch.where(accept[:, None], ev_p.grad, ev.grad),
            ev.prior_energy,
            ev.prior_grad,
        )
        if t < burn_in:
            rate = torch.clamp(log_alpha, max=0.0).exp()
            log_h = log_h + 2.0 / math.sqrt(t + 10) * (rate[:, None] - 0.574)
        else:
            kept.append(theta.clone())
            accepted += float(accept.double().mean())
    return torch.stack(kept), accepted / max(1, n_steps - burn_in)


def ess_reference_moments(
    samples: np.ndarray, mean: np.ndarray, var: np.ndarray, threshold: float = 0.05
) -> np.ndarray:
    """ESS of one chain with autocorrelations from reference moments (seed 000 appendix K.1;
    Hoffman & Gelman 2014 §4.1).

    ``rho_s = sum_{b > s} (x_b - mu)(x_{b-s} - mu) / (sigma^2 (B - s))`` with the reference
    ``mu``, ``sigma^2``; ``ESS = B / (1 + 2 sum_{s=1}^{M-1} (1 - s/B) rho_s)`` with ``M`` the
    first lag where ``rho_s < threshold``. A biased chain has ``rho_s`` that do not decay
    (``(xbar - mu)^2 / sigma^2`` persists at every lag), so bias lowers the ESS.

    Args:
        samples: ``(B, D)`` one chain.
        mean, var: ``(D,)`` reference moments.

    Returns:
        ``(D,)`` ESS per dimension.
    """
    x = np.asarray(samples, dtype=np.float64) - mean
    b, d = x.shape
    n_fft = 1 << int(math.ceil(math.log2(2 * b)))
    f = np.fft.rfft(x, n=n_fft, axis=0)
    sums = np.fft.irfft(f * np.conj(f), n=n_fft, axis=0)[:b]  # (B, D) lagged product sums
    rho = sums / (var * (b - np.arange(b))[:, None])
    out = np.empty(d)
    lags = np.arange(b)
    for j in range(d):
        below = np.nonzero(rho[1:, j] < threshold)[0]
        m = below[0] + 1 if below.size else b
        s = lags[1:m]
        out[j] = b / (1.0 + 2.0 * ((1.0 - s / b) * rho[1:m, j]).sum())
    return out


def _samplers(cfg: DictConfig, name: str, n_data: int) -> dict[str, Any]:
    lr_ld, lr_hmc = cfg.steps[name].sgld_lr, cfg.steps[name].sghmc_lr
    total = cfg.burn_in + cfg.n_samples
    eta_hmc = resolve_eta(None, lr_hmc, n_data, "second")
    friction = cfg.momentum_decay / eta_hmc
    out: dict[str, Any] = {
        "sgld": SGLD(lr=lr_ld, schedule=HoldThenDecay(cfg.burn_in, cfg.decay_gamma)),
        "csgld": cyclical_sgld(
            lr=lr_ld,
            total_steps=total,
            n_cycles=cfg.n_cycles,
            explore_fraction=cfg.explore_fraction,
        ),
        "sghmc": SGHMC(
            lr=lr_hmc,
            friction=friction,
            schedule=HoldThenDecay(cfg.burn_in, cfg.decay_gamma / 2),
        ),
        "csghmc": cyclical_sghmc(
            lr=lr_hmc,
            total_steps=total,
            n_cycles=cfg.n_cycles,
            explore_fraction=cfg.explore_fraction,
            friction=friction,
        ),
    }
    if cfg.nnsghmc.enabled:
        out["nnsghmc"] = ms.load_sampler(cfg.nnsghmc.path, lr=cfg.nnsghmc.lr)
    return out


def run(cfg: DictConfig) -> ExperimentOutput:
    """ESS table for every data set and sampler, beside seed 000 Table 5."""
    results: dict[str, Any] = {}
    traces: dict[str, dict[str, np.ndarray]] = {}
    for d_i, name in enumerate(cfg.datasets):
        x_np, y_np = load_logistic(name)
        x_np = (x_np - x_np.mean(0)) / x_np.std(0)
        x, y = torch.from_numpy(x_np), torch.from_numpy(y_np).double()
        target = LogisticTarget(x, y, cfg.prior_std, cfg.batch_size)
        seed = cfg.seed + 100 * d_i
        gen = torch.Generator().manual_seed(seed)
        ref = cfg.reference
        init = torch.zeros(ref.n_chains, target.dim, dtype=torch.float64)
        full = LogisticTarget(x, y, cfg.prior_std, None)
        ref_samples, acc = mala_reference(full, init, ref.n_steps, ref.burn_in, gen, cfg.progress)
        pooled = ref_samples.reshape(-1, target.dim).numpy()
        mu, var = pooled.mean(0), pooled.var(0, ddof=1)
        entry: dict[str, Any] = {
            "n_data": target.n_data,
            "dim": target.dim,
            "reference": {"acceptance": acc, "n_samples": int(pooled.shape[0])},
        }
        traces[name] = {}
        init = torch.zeros(cfg.n_runs, target.dim, dtype=torch.float64)
        for s_i, (key, sampler) in enumerate(_samplers(cfg, name, target.n_data).items()):
            out = ms.sample(
                sampler, target, cfg.n_runs, cfg.burn_in + cfg.n_samples, init=init,
                burn_in=cfg.burn_in, seed=seed + 1 + s_i, progress=cfg.progress,
                dtype=torch.float64,
            )  # fmt: skip
            theta = out.theta.numpy()  # (B, runs, D)
            ess_ref = [
                float(np.median(ess_reference_moments(theta[:, r], mu, var, cfg.ess_threshold)))
                for r in range(cfg.n_runs)
            ]
            ess_geyer = [
                float(np.median(dg.ess(theta[:, r], split=False))) for r in range(cfg.n_runs)
            ]
            bias = np.abs(theta.mean(0) - mu) / np.sqrt(var)  # (runs, D), in posterior sds
            entry[key] = {
                "n_kept": int(theta.shape[0]),
                "ess_reference": ess_ref,
                "ess_geyer": ess_geyer,
                "ess_reference_stat": mean_se(ess_ref),
                "ess_geyer_stat": mean_se(ess_geyer),
                "mean_error_sd": mean_se(np.median(bias, axis=1)),
                "sd_ratio": mean_se(np.median(np.sqrt(theta.var(0) / var), axis=1)),
            }
            traces[name][key] = theta[:, 0, 0]
        results[name] = entry
    return ExperimentOutput("blr", results, _markdown(results, cfg), {"traces": _plot(traces, cfg)})


def _markdown(results: dict[str, Any], cfg: DictConfig) -> str:
    lines = [
        f"Median ESS over dimensions of {cfg.n_samples:,} samples after {cfg.burn_in:,} "
        f"burn-in, mean ± standard error over {cfg.n_runs} runs (the paper's runs are not "
        'stated). "ref." is seed 000\'s estimator with reference moments from full-batch MALA, '
        '"Geyer" the initial-monotone-sequence ESS; "bias" is the median over dimensions '
        'of |mean - reference mean| / reference sd, "sd ratio" the median of sample sd / '
        "reference sd.",
        "",
        "| Data set | Sampler | Paper | Ours (ref.) | Ours (Geyer) | bias | sd ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entry, key, e in sampler_entries(results):
        paper = PAPER[name].get(key)
        lines.append(
            f"| {name.capitalize()} (D={entry['dim']}) | {LABELS[key]} | "
            f"{paper if paper is not None else '—'} | "
            f"{fmt_mean_se(e['ess_reference_stat'], 0)} | "
            f"{fmt_mean_se(e['ess_geyer_stat'], 0)} | "
            f"{fmt_mean_se(e['mean_error_sd'], 2)} | {fmt_mean_se(e['sd_ratio'], 2)} |"
        )
    lines += [
        "",
        "MALA reference acceptance: "
        + ", ".join(f"{n} {e['reference']['acceptance']:.2f}" for n, e in results.items())
        + ".",
    ]
    return "\n".join(lines)


def _plot(traces: dict[str, dict[str, np.ndarray]], cfg: DictConfig) -> bytes:
    title = "{name}: first weight, run 0"
    return trace_figure(traces, title, cfg.dpi, width=3.6, lw=0.4, title_size=9, legend_size=6)
