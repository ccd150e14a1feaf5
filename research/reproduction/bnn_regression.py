"""Bayesian neural-network regression: SGLD vs cSGLD (Pal et al., survey, seed 002, §5.2,
Table 2) on Boston and Concrete.

Model (seed 002): one hidden layer of 10 ReLU units, ``y ~ N(NN(x, theta), sigma^2)``, prior
``N(0, I)`` on the weights. We sample ``log sigma`` with the weights (its prior is ``N(0, 1)``
too; the survey writes a posterior over ``sigma^2`` without giving its prior). Features and
targets are standardised with the training split's statistics; RMSE and NLL are reported in
the original units (NLL per test point, of the posterior predictive mixture).

Protocol (seed 002 §5.2): 20 random 80/20 splits; minibatch 32; initial step ``1e-4``
("learning rate"; we read it as the SDE step ``eta`` on the full-data energy ``U``, SPEC §1,
since ``lr / N`` would barely move the chain), polynomial decay for SGLD (``b = 0``,
``gamma = 0.55``; the survey gives no exponent), samples collected once the step is below
``1e-5``, which for the cosine schedule of cSGLD (``M = 5`` cycles) is the last ~20 % of every
cycle; mESS (Vats et al. 2019) of 2000 samples. The survey trains 2000 epochs; the config
reduces this for the CPU and says so.

Vectorised over splits: chain ``k`` samples the posterior of split ``k``
(:class:`SplitMLPTarget` holds every split's training data and draws an independent minibatch
per chain), so all 20 splits run as one batch of 20 chains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor

import metasampler as ms
from metasampler import diagnostics as dg
from metasampler.samplers import SGLD, cyclical_sgld
from metasampler.schedules import PolynomialDecay
from metasampler.targets import Evaluation, energy_and_grad
from tasks.uci import REGRESSION_DATASETS, load_regression

from .common import (
    LABELS,
    ExperimentOutput,
    NNSGHMCSettings,
    check_datasets,
    check_int_at_least,
    check_positive,
    fmt_mean_se,
    mean_se,
    require,
    sampler_entries,
    trace_figure,
)

__all__ = ["BNNRegressionConfig", "SplitMLPTarget", "PAPER", "make_splits", "run", "validate"]

#: Seed 002 Table 2: {data set: {sampler: (RMSE, RMSE se, NLL, NLL se, mESS)}}
PAPER = {
    "boston": {
        "sgld": (3.43, 0.18, 2.65, 0.18, 350.30),
        "csgld": (3.22, 0.18, 2.69, 0.18, 1826.01),
    },
    "concrete": {
        "sgld": (5.92, 0.09, 3.19, 0.09, 563.37),
        "csgld": (5.74, 0.12, 3.18, 0.12, 711.17),
    },
}


@dataclass
class BNNRegressionConfig:
    seed: int = 0
    progress: bool = True
    datasets: list[str] = field(default_factory=lambda: ["boston", "concrete"])
    n_splits: int = 20
    test_fraction: float = 0.2
    hidden: int = 10
    prior_std: float = 1.0
    batch_size: int = 32
    epochs: int = 2000
    eta: float = 1e-4  # initial SDE step on the full-data energy
    collect_below: float = 1e-5  # collect samples once the step is below this
    sgld_gamma: float = 0.55
    n_cycles: int = 5
    n_keep: int = 2000  # samples per chain for prediction and mESS
    nnsghmc: NNSGHMCSettings = field(default_factory=lambda: NNSGHMCSettings(eta=0.003))
    dpi: int = 70


def validate(cfg: DictConfig) -> None:
    """Range checks; raises :class:`~metasampler.config.ConfigError`."""
    check_datasets(cfg, REGRESSION_DATASETS)
    check_int_at_least(cfg, 2, "n_splits")
    check_int_at_least(cfg, 1, "hidden", "batch_size", "epochs", "n_cycles")
    check_int_at_least(cfg, 16, "n_keep")
    check_positive(cfg, "prior_std", "eta", "collect_below", "sgld_gamma", "nnsghmc.eta")
    require(0 < cfg.test_fraction < 1, f"test_fraction must be in (0, 1), got {cfg.test_fraction}")
    require(cfg.collect_below < cfg.eta, "collect_below must be < eta")


def make_splits(n: int, n_splits: int, test_fraction: float, seed: int) -> list[np.ndarray]:
    """``n_splits`` random permutations of ``range(n)``; the first ``round(test_fraction n)``
    indices of each are its test set."""
    rng = np.random.default_rng(seed)
    return [rng.permutation(n) for _ in range(n_splits)]


class SplitMLPTarget:
    """Posterior of a one-hidden-layer ReLU regression net, one data split per chain.

    ``theta = (W1 (d*H), b1 (H), w2 (H), b2, log_sigma)``;
    ``Ũ_k = -(N/M) sum_m log N(y_km; NN(x_km), sigma_k^2) + ||theta_k||^2 / (2 prior_std^2)``
    with a minibatch of ``M`` drawn without replacement independently for every chain ``k``
    from its own training set ``(x[k], y[k])`` of shape ``(K, N, d)``, ``(K, N)``.
    """

    def __init__(
        self, x: Tensor, y: Tensor, hidden: int, prior_std: float, batch_size: int
    ) -> None:
        self.x, self.y = x, y
        self.k, self.n_data, self.d = x.shape
        self.hidden = int(hidden)
        self.dim = self.d * hidden + 2 * hidden + 2
        self.prior_std = float(prior_std)
        self.batch_size = int(batch_size)

    def unpack(self, theta: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``(W1 (K, d, H), b1 (K, H), w2 (K, H), b2 (K,), log_sigma (K,))``."""
        d, h = self.d, self.hidden
        w1 = theta[:, : d * h].reshape(-1, d, h)
        b1 = theta[:, d * h : d * h + h]
        w2 = theta[:, d * h + h : d * h + 2 * h]
        return w1, b1, w2, theta[:, -2], theta[:, -1]

    def predict(self, theta: Tensor, x: Tensor) -> Tensor:
        """Means ``(K, B)`` of chain ``k``'s net on ``x[k]`` ``(K, B, d)``."""
        w1, b1, w2, b2, _ = self.unpack(theta)
        hidden = torch.relu(torch.bmm(x, w1) + b1[:, None, :])
        return (hidden * w2[:, None, :]).sum(-1) + b2[:, None]

    def evaluate(
        self, theta: Tensor, generator: torch.Generator | None = None, create_graph: bool = False
    ) -> Evaluation:
        keys = torch.rand(self.k, self.n_data, generator=generator, dtype=theta.dtype)
        idx = keys.argsort(dim=1)[:, : self.batch_size]
        xb = torch.gather(self.x, 1, idx[:, :, None].expand(-1, -1, self.d))
        yb = torch.gather(self.y, 1, idx)
        scale = self.n_data / self.batch_size
        var = self.prior_std**2

        def energy_fn(t: Tensor) -> Tensor:
            log_sigma = t[:, -1]
            z = (yb - self.predict(t, xb)) * torch.exp(-log_sigma)[:, None]
            nll = (0.5 * z * z).sum(-1) + self.batch_size * (
                log_sigma + 0.5 * math.log(2 * math.pi)
            )
            return scale * nll + 0.5 * (t * t).sum(-1) / var

        energy, grad = energy_and_grad(energy_fn, theta, create_graph)
        prior_energy = 0.5 * (theta * theta).sum(-1) / var
        return Evaluation(energy, grad, prior_energy.detach(), (theta / var).detach())


def _predictive(
    target: SplitMLPTarget, samples: Tensor, x_test: Tensor, y_test: Tensor, y_std: Tensor
) -> tuple[np.ndarray, np.ndarray]:
    """Per-split RMSE and NLL (original units) of the posterior predictive of ``samples``
    ``(S, K, D)`` on standardised ``x_test`` ``(K, T, d)``, ``y_test`` ``(K, T)``."""
    means, log_sigmas = [], []
    for s in range(samples.shape[0]):
        means.append(target.predict(samples[s], x_test))
        log_sigmas.append(samples[s][:, -1])
    mu = torch.stack(means)  # (S, K, T)
    log_sigma = torch.stack(log_sigmas)[:, :, None]  # (S, K, 1)
    rmse = ((mu.mean(0) - y_test) ** 2).mean(-1).sqrt() * y_std
    z = (y_test - mu) * torch.exp(-log_sigma)
    logp = -0.5 * z * z - log_sigma - 0.5 * math.log(2 * math.pi)
    log_pred = torch.logsumexp(logp, 0) - math.log(samples.shape[0])  # (K, T)
    nll = -log_pred.mean(-1) + torch.log(y_std)
    return rmse.numpy(), nll.numpy()


def _collect_start(cfg: DictConfig) -> int:
    """First step whose polynomially decayed SGLD step is below ``collect_below``."""
    return math.ceil((cfg.eta / cfg.collect_below) ** (1.0 / cfg.sgld_gamma))


def _samplers(cfg: DictConfig, n_steps: int) -> dict[str, tuple[Any, int]]:
    """``{key: (sampler, burn_in)}`` of the compared samplers for a run of ``n_steps``."""
    explore = 1.0 - 2.0 / math.pi * math.asin(math.sqrt(cfg.collect_below / cfg.eta))
    # cosine step eta/2 (cos(pi r) + 1) < collect_below  <=>  r > explore (r in [0, 1))
    samplers: dict[str, tuple[Any, int]] = {
        "sgld": (
            SGLD(eta=cfg.eta, schedule=PolynomialDecay(0.0, cfg.sgld_gamma)),
            min(_collect_start(cfg), n_steps - cfg.n_keep),
        ),
        "csgld": (
            cyclical_sgld(
                eta=cfg.eta,
                total_steps=n_steps,
                n_cycles=cfg.n_cycles,
                explore_fraction=explore,
            ),
            0,
        ),
    }
    if cfg.nnsghmc.enabled:
        samplers["nnsghmc"] = (
            ms.load_sampler(cfg.nnsghmc.path, eta=cfg.nnsghmc.eta),
            n_steps // 2,
        )
    return samplers


def _scores(
    target: SplitMLPTarget, theta: Tensor, x_test: Tensor, y_test: Tensor, y_std: Tensor
) -> dict[str, Any]:
    """Test RMSE / NLL and (multivariate, median) ESS of ``theta`` ``(S, n_splits, D)``."""
    rmse, nll = _predictive(target, theta, x_test, y_test, y_std)
    t_np = theta.double().numpy()
    n_splits, dim = t_np.shape[1], t_np.shape[-1]
    n_batches = min(t_np.shape[0] // 2, 2 * dim)
    mess = [dg.multivariate_ess(t_np[:, k], n_batches) for k in range(n_splits)]
    ess_med = [float(np.median(dg.ess(t_np[:, k], split=False))) for k in range(n_splits)]
    return {
        "rmse": rmse.tolist(),
        "nll": nll.tolist(),
        "mess": mess,
        "median_ess": ess_med,
        "rmse_stat": mean_se(rmse),
        "nll_stat": mean_se(nll),
        "mess_stat": mean_se(mess),
        "median_ess_stat": mean_se(ess_med),
        "mess_batches": n_batches,
    }


def run(cfg: DictConfig) -> ExperimentOutput:
    """RMSE, NLL and mESS over ``n_splits`` splits for every data set and sampler."""
    results: dict[str, Any] = {}
    traces: dict[str, dict[str, np.ndarray]] = {}
    for d_i, name in enumerate(cfg.datasets):
        x_np, y_np = load_regression(name)
        n = x_np.shape[0]
        n_test = round(cfg.test_fraction * n)
        perms = make_splits(n, cfg.n_splits, cfg.test_fraction, cfg.seed + d_i)
        tr = np.stack([p[n_test:] for p in perms])
        te = np.stack([p[:n_test] for p in perms])
        x_tr, y_tr, x_te, y_te = x_np[tr], y_np[tr], x_np[te], y_np[te]
        x_mean, x_sd = x_tr.mean(1, keepdims=True), x_tr.std(1, keepdims=True) + 1e-12
        y_mean, y_sd = y_tr.mean(1, keepdims=True), y_tr.std(1, keepdims=True)

        def as_t(a: np.ndarray) -> Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(torch.float32)

        target = SplitMLPTarget(
            as_t((x_tr - x_mean) / x_sd), as_t((y_tr - y_mean) / y_sd), cfg.hidden,
            cfg.prior_std, cfg.batch_size,
        )  # fmt: skip
        x_test, y_test = as_t((x_te - x_mean) / x_sd), as_t((y_te - y_mean) / y_sd)
        y_std = as_t(y_sd[:, 0])
        steps_per_epoch = math.ceil(target.n_data / cfg.batch_size)
        n_steps = cfg.epochs * steps_per_epoch
        samplers = _samplers(cfg, n_steps)
        entry: dict[str, Any] = {
            "n_train": target.n_data,
            "n_test": n_test,
            "dim": target.dim,
            "n_steps": n_steps,
            "epochs": cfg.epochs,
        }
        traces[name] = {}
        gen = torch.Generator().manual_seed(cfg.seed + 1000 * (d_i + 1))
        init = 0.1 * torch.randn(cfg.n_splits, target.dim, generator=gen)
        for s_i, (key, (sampler, burn_in)) in enumerate(samplers.items()):
            n_collect = sum(1 for k in range(burn_in + 1, n_steps + 1) if sampler.collects(k))
            thin = max(1, n_collect // cfg.n_keep)
            out = ms.sample(
                sampler, target, cfg.n_splits, n_steps, init=init, burn_in=burn_in, thin=thin,
                seed=cfg.seed + 10 * d_i + s_i + 1, progress=cfg.progress, dtype=torch.float32,
            )  # fmt: skip
            theta = out.theta
            pick = torch.linspace(0, theta.shape[0] - 1, min(cfg.n_keep, theta.shape[0]))
            theta = theta[pick.round().long()]
            entry[key] = {
                "burn_in": burn_in,
                "thin": thin,
                "n_kept": int(theta.shape[0]),
                **_scores(target, theta, x_test, y_test, y_std),
            }
            traces[name][key] = theta[:, 0, 0].numpy()
        results[name] = entry
    return ExperimentOutput(
        "bnn_regression", results, _markdown(results, cfg), {"traces": _plot(traces, cfg)}
    )


def _markdown(results: dict[str, Any], cfg: DictConfig) -> str:
    lines = [
        f"Test RMSE and NLL (original units), mean ± standard error over {cfg.n_splits} random "
        f"80/20 splits, {cfg.epochs} epochs (paper: 2000); mESS of {cfg.n_keep} samples "
        "(batch-means, see below) and the median per-coordinate Geyer ESS, mean ± se over "
        "splits (the paper's mESS is from one split).",
        "",
        "| Data set | Sampler | RMSE paper | RMSE ours | NLL paper | NLL ours | mESS paper | "
        "mESS ours | median ESS ours |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, _, key, e in sampler_entries(results):
        p = PAPER.get(name, {}).get(key)
        lines.append(
            f"| {name.capitalize()} | {LABELS[key]} | "
            + (f"{p[0]} ± {p[1]}" if p else "—")
            + f" | {fmt_mean_se(e['rmse_stat'], 2)} | "
            + (f"{p[2]} ± {p[3]}" if p else "—")
            + f" | {fmt_mean_se(e['nll_stat'], 2)} | "
            + (f"{p[4]:g}" if p else "—")
            + f" | {fmt_mean_se(e['mess_stat'], 0)} | {fmt_mean_se(e['median_ess_stat'], 0)} |"
        )
    return "\n".join(lines)


def _plot(traces: dict[str, dict[str, np.ndarray]], cfg: DictConfig) -> bytes:
    title = "{name}: first weight, split 0 (cf. seed 002 Fig. 4)"
    return trace_figure(traces, title, cfg.dpi, width=3.8, lw=0.5, title_size=8, legend_size=7)
