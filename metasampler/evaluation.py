"""Transfer-generalisation benchmark of Bayesian neural networks (004 §5.2, Table 1, Fig. 3).

The reusable pieces behind ``evaluate.py``:

* **Metrics** on predictions of ``K`` chains: every chain's network gives logits ``(K, B, C)``;
  the *ensemble* predictive is the average of the chains' probabilities,
  ``p(y | x) = 1/K sum_k softmax(f_k(x))_y`` (computed in log space,
  :func:`ensemble_log_probs`). From a ``(B, C)`` predictive: test error, negative
  log-likelihood (mean over examples), expected calibration error
  (:func:`expected_calibration_error`, equal-width confidence bins, Guo et al. 2017) and
  predictive entropy.
* :class:`RunningAverage`: the *posterior average* predictive, the mean of the probabilities of
  all chains over every kept sample since burn-in, accumulated in log space (float64) so that
  no sample has to be stored.
* :func:`tune_step_size`: pick the grid value with the lowest validation NLL (a diverged run
  scores ``inf``); with ``max_extensions`` the grid is extended beyond an end while the best
  value sits there, so that the choice is interior (reported in the results).
* The transfer protocol of 004's MNIST code, for every method alike: :func:`apply_warmup` (the
  first steps at a fraction of the learning rate) and, for a loaded NNSGHMC with absolute
  friction units, :func:`set_alpha_from_warmup` (``alpha = alpha_per_step / eta_warmup``).
* :func:`run_method`: one sampler, ``K`` chains, ``n_steps`` steps through
  :func:`metasampler.sample` with a callback that streams test-set learning curves (ensemble
  of the current chains and running posterior average, against steps and sampling wall-clock)
  and scores out-of-distribution inputs; nothing is stored but the accumulators.
* :func:`run_benchmark` / :func:`write_results`: tuning, every method over several seeds,
  JSON / CSV / markdown / PNG / TensorBoard outputs (see ``evaluate.py``).

Conventions: "lr" is the optimiser-style per-batch learning rate of SPEC §1, converted to the
SDE step ``eta`` by :mod:`metasampler.stepsize` (``lr / N`` for SGLD, pSGLD, SGD-M, Adam;
``sqrt(lr / N)`` for SGHMC, mSGNHT, NNSGHMC). Friction-type constants are given per step
(``momentum_decay = eta * C``, NNSGHMC's ``alpha_per_step = eta_warmup * alpha``, the paper's
0.01), so they follow the tuned step.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import distributed
from .bayesian import BayesianModel
from .files import atomic_write_bytes, atomic_write_text, jsonable
from .samplers import (
    PSGLD,
    SGHMC,
    SGLD,
    SGNHT,
    Adam,
    Sampler,
    SamplerState,
    SGDMomentum,
    cyclical_sghmc,
    cyclical_sgld,
)
from .sampling import sample
from .schedules import WarmUp
from .splits import ClassificationSplits
from .stepsize import resolve_eta
from .targets import NonFiniteError

__all__ = [
    "METHODS",
    "BenchmarkResult",
    "ClassificationSplits",
    "EvalSet",
    "MethodRun",
    "MethodSpec",
    "RunningAverage",
    "SyntheticProblem",
    "TuneResult",
    "TuningError",
    "atomic_write_bytes",
    "atomic_write_text",
    "apply_warmup",
    "build_method",
    "calibration_bins",
    "ensemble_log_probs",
    "ensemble_metrics",
    "format_mean_se",
    "error_rate",
    "expected_calibration_error",
    "frame_metrics",
    "frame_targets",
    "is_sequence_model",
    "jsonable",
    "mean_se",
    "merge_seed_results",
    "metrics_from_log_probs",
    "negative_log_likelihood",
    "predict_frame_log_probs",
    "predict_log_probs",
    "predictive_entropy",
    "run_benchmark",
    "run_method",
    "set_alpha_from_warmup",
    "synthetic_classification_problem",
    "tune_step_size",
    "write_results",
]


# ============================================================================================
# Metrics
# ============================================================================================
def ensemble_log_probs(logits: Tensor) -> Tensor:
    """Log of the chain-averaged predictive probabilities.

    Args:
        logits: ``(K, B, C)`` logits of ``K`` chains on ``B`` examples.

    Returns:
        ``(B, C)``: ``log(1/K sum_k softmax(logits_k))``, computed with ``logsumexp``.
    """
    if logits.ndim != 3:
        raise ValueError(f"logits must have shape (K, B, C), got {tuple(logits.shape)}")
    log_p = F.log_softmax(logits.double(), dim=-1)
    return torch.logsumexp(log_p, dim=0) - math.log(logits.shape[0])


def _check_pred(log_probs: Tensor, y: Tensor | None = None) -> None:
    if log_probs.ndim != 2:
        raise ValueError(f"log_probs must have shape (B, C), got {tuple(log_probs.shape)}")
    if y is not None and (y.ndim != 1 or y.shape[0] != log_probs.shape[0]):
        raise ValueError(f"labels must have shape ({log_probs.shape[0]},), got {tuple(y.shape)}")


def error_rate(log_probs: Tensor, y: Tensor) -> float:
    """Fraction of examples whose most probable class is not the label.

    Args:
        log_probs: ``(B, C)`` log predictive probabilities (or anything monotone in them).
        y: ``(B,)`` integer labels.
    """
    _check_pred(log_probs, y)
    return float((log_probs.argmax(-1) != y.to(log_probs.device)).double().mean())


def negative_log_likelihood(log_probs: Tensor, y: Tensor) -> float:
    """Mean negative log predictive probability of the labels, ``-1/B sum_b log p(y_b|x_b)``."""
    _check_pred(log_probs, y)
    picked = log_probs.gather(-1, y.to(log_probs.device).long().unsqueeze(-1)).squeeze(-1)
    return float(-picked.double().mean())


def calibration_bins(
    log_probs: Tensor, y: Tensor, n_bins: int = 15
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-bin mean confidence, accuracy and count for equal-width confidence bins.

    The confidence of an example is its top predictive probability; bin ``b`` holds
    confidences in ``(b/n_bins, (b+1)/n_bins]`` (a confidence of exactly 0 goes to bin 0).
    Empty bins have confidence and accuracy ``nan``.
    """
    _check_pred(log_probs, y)
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins!r}")
    conf, pred = log_probs.double().exp().max(-1)
    correct = (pred == y.to(pred.device)).double()
    index = (torch.ceil(conf * n_bins).long() - 1).clamp(0, n_bins - 1)
    count = torch.bincount(index, minlength=n_bins).double()
    conf_sum = torch.bincount(index, weights=conf, minlength=n_bins)
    acc_sum = torch.bincount(index, weights=correct, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = (conf_sum / count).cpu().numpy()
        mean_acc = (acc_sum / count).cpu().numpy()
    return mean_conf, mean_acc, count.cpu().numpy()


def expected_calibration_error(log_probs: Tensor, y: Tensor, n_bins: int = 15) -> float:
    """``ECE = sum_b (n_b / B) |accuracy_b - confidence_b|`` over equal-width confidence bins
    (Guo et al., ICML 2017; 15 bins by default)."""
    conf, acc, count = calibration_bins(log_probs, y, n_bins)
    used = count > 0
    return float(np.sum(count[used] / count.sum() * np.abs(acc[used] - conf[used])))


def predictive_entropy(log_probs: Tensor) -> Tensor:
    """Per-example entropy ``-sum_c p_c log p_c`` (nats) of ``(B, C)`` log-probabilities;
    ``log C`` for a uniform predictive, 0 for a certain one."""
    _check_pred(log_probs)
    log_probs = log_probs.double()
    p = log_probs.exp()
    terms = torch.where(p > 0, p * log_probs, torch.zeros_like(p))
    return -terms.sum(-1)


def metrics_from_log_probs(log_probs: Tensor, y: Tensor, n_bins: int = 15) -> dict[str, float]:
    """``error``, ``nll``, ``ece`` and mean ``entropy`` of a ``(B, C)`` log predictive."""
    return {
        "error": error_rate(log_probs, y),
        "nll": negative_log_likelihood(log_probs, y),
        "ece": expected_calibration_error(log_probs, y, n_bins),
        "entropy": float(predictive_entropy(log_probs).mean()),
    }


def ensemble_metrics(logits: Tensor, y: Tensor, n_bins: int = 15) -> dict[str, float]:
    """Metrics of the ``K``-chain ensemble (average of the chains' probabilities).

    Args:
        logits: ``(K, B, C)`` logits.
        y: ``(B,)`` labels.
        n_bins: ECE bins.

    Returns:
        ``{"error", "nll", "ece", "entropy"}`` (entropy: mean over examples, nats).
    """
    return metrics_from_log_probs(ensemble_log_probs(logits), y, n_bins)


class RunningAverage:
    """Running posterior-average predictive: mean probabilities over chains and kept samples.

    ``update`` takes the ``(K, B, C)`` log-probabilities of the ``K`` current chains; after
    ``S`` updates :meth:`log_mean` is ``log(1/(S K) sum_s sum_k p_{s,k})``, accumulated as a
    float64 ``logsumexp`` (no underflow, nothing stored but one ``(B, C)`` tensor).
    """

    def __init__(self) -> None:
        self._log_sum: Tensor | None = None
        self.count = 0

    def update(self, log_probs: Tensor) -> None:
        """Add every chain of a ``(K, B, C)`` tensor of log-probabilities."""
        if log_probs.ndim != 3:
            raise ValueError(f"log_probs must have shape (K, B, C), got {tuple(log_probs.shape)}")
        part = torch.logsumexp(log_probs.double(), dim=0)
        if self._log_sum is None:
            self._log_sum = part
        else:
            if part.shape != self._log_sum.shape:
                raise ValueError(
                    f"shape changed: accumulated {tuple(self._log_sum.shape)}, "
                    f"got {tuple(part.shape)}"
                )
            self._log_sum = torch.logaddexp(self._log_sum, part)
        self.count += log_probs.shape[0]

    def log_mean(self) -> Tensor:
        """``(B, C)`` log of the average probabilities; raises if nothing was added."""
        if self._log_sum is None:
            raise ValueError("RunningAverage is empty: no sample has been added")
        return self._log_sum - math.log(self.count)

    def mean(self) -> Tensor:
        """``(B, C)`` average probabilities."""
        return self.log_mean().exp()


@torch.no_grad()
def predict_log_probs(
    model: BayesianModel, theta: Tensor, x: Tensor, batch_size: int = 1000
) -> Tensor:
    """``(K, B, C)`` log-softmax outputs of every chain's network, in chunks of examples."""
    pieces = [
        F.log_softmax(model.forward(theta, x[i : i + batch_size]).double(), dim=-1)
        for i in range(0, x.shape[0], batch_size)
    ]
    return torch.cat(pieces, dim=1)


# --------------------------------------------------------------------------------------------
# Sequence tasks (likelihood "bernoulli_sequence": 88-key piano rolls, tasks/chorales.py)
# --------------------------------------------------------------------------------------------
# A sequence task is scored per frame: its "examples" are the real (unpadded) frames, and its
# per-chain "log-probabilities" are (K, F, 1 + P): column 0 is log p(frame_f | theta_k) (the
# product of the P independent Bernoullis), columns 1: are log P(key on | theta_k). Averaging
# probabilities over chains (ensemble_log_probs_from_lp, RunningAverage) then gives the chain
# mixture of every frame and its per-key marginals, so the classification accumulators apply
# unchanged.
def is_sequence_model(model: Any) -> bool:
    """Whether ``model`` (a target) is scored per frame (``bernoulli_sequence`` likelihood)."""
    return getattr(model, "likelihood", None) == "bernoulli_sequence"


def frame_targets(y: Tensor) -> Tensor:
    """The real frames of padded targets ``(B, T, P)`` (frames of ``-1`` dropped), ``(F, P)``
    booleans, in the order of :func:`predict_frame_log_probs`."""
    if y.ndim != 3:
        raise ValueError(f"sequence targets must have shape (B, T, P), got {tuple(y.shape)}")
    return y[(y >= 0).all(-1)] > 0.5


@torch.no_grad()
def predict_frame_log_probs(
    model: BayesianModel, theta: Tensor, x: Tensor, y: Tensor, batch_size: int = 1000
) -> Tensor:
    """``(K, F, 1 + P)`` per-frame log-likelihoods and per-key log-marginals of every chain on
    the real frames of ``(x, y)`` (sequences in chunks of ``batch_size``); see above."""
    from .bayesian import bernoulli_frame_log_lik

    pieces = []
    for i in range(0, x.shape[0], batch_size):
        logits = model.forward(theta, x[i : i + batch_size]).double()  # (K, b, T, P)
        targets = y[i : i + batch_size].to(logits.device, torch.float64).expand_as(logits)
        frame = bernoulli_frame_log_lik(logits, targets).unsqueeze(-1)
        valid = (targets[0] >= 0).all(-1)
        pieces.append(torch.cat([frame, F.logsigmoid(logits)], dim=-1)[:, valid])
    return torch.cat(pieces, dim=1)


def frame_metrics(log_probs: Tensor, targets: Tensor) -> dict[str, float]:
    """Metrics of an ``(F, 1 + P)`` frame predictive (see above) against ``(F, P)`` targets.

    ``nll``: mean over frames of ``-log p(frame)`` (nats per frame, summed over keys);
    ``error``: ``1 - `` frame-level accuracy ``TP / (TP + FP + FN)`` (Bay et al. 2009) of keys
    predicted on where their predictive marginal exceeds 1/2; ``ece`` and ``entropy`` are
    ``nan`` (not defined here).
    """
    if log_probs.ndim != 2 or log_probs.shape[0] != targets.shape[0]:
        raise ValueError(
            f"frame log-probs (F, 1 + P) and targets (F, P) do not match: "
            f"{tuple(log_probs.shape)}, {tuple(targets.shape)}"
        )
    on = log_probs[:, 1:] > -math.log(2.0)
    truth = targets.to(on.device).bool()
    tp = float((on & truth).sum())
    wrong = float((on ^ truth).sum())  # false positives + false negatives
    accuracy = tp / (tp + wrong) if tp + wrong > 0 else 1.0
    return {
        "error": 1.0 - accuracy,
        "nll": float(-log_probs[:, 0].double().mean()),
        "ece": math.nan,
        "entropy": math.nan,
    }


# ============================================================================================
# Step-size tuning
# ============================================================================================
class TuningError(RuntimeError):
    """Every value of a step-size grid diverged or gave a non-finite validation NLL."""


@dataclass
class TuneResult:
    """Outcome of :func:`tune_step_size`.

    Attributes:
        best: the chosen value (lowest score; the first evaluated of equal scores).
        scores: ``[(value, score)]`` in evaluation order (the grid, then each extension);
            ``inf`` marks a diverged run.
        errors: ``{value: message}`` for runs that raised :class:`NonFiniteError`.
        grid: the initial grid.
        extensions: the values added beyond an end of the grid, in the order they were tried.
        interior: whether ``best`` lies strictly inside the range of evaluated values (a
            smaller and a larger value both scored worse); ``None`` when nothing was tuned.
    """

    best: float
    scores: list[tuple[float, float]]
    errors: dict[float, str] = field(default_factory=dict)
    grid: list[float] = field(default_factory=list)
    extensions: list[float] = field(default_factory=list)
    interior: bool | None = None


def _next_beyond_edge(scores: Sequence[tuple[float, float]]) -> float | None:
    """The value to try next when the best score sits at an end of the evaluated values.

    Above the largest value when that is the best; below the smallest when that is the best or
    when every run diverged (a diverged run counts as worst: smaller steps are the way out).
    The step beyond an end is the ratio of the two values nearest that end, so a geometric grid
    stays geometric. ``None`` when the best value is interior (nothing to extend).
    """
    values = sorted({v for v, _ in scores})
    if len(values) < 2:
        return None
    best_value, best_score = min(scores, key=lambda vs: vs[1])
    if not math.isfinite(best_score) or best_value == values[0]:
        return values[0] * values[0] / values[1]
    if best_value == values[-1]:
        return values[-1] * values[-1] / values[-2]
    return None


def tune_step_size(
    objective: Callable[[float], float], grid: Sequence[float], max_extensions: int = 0
) -> TuneResult:
    """Evaluate ``objective(value)`` (a validation NLL) for each grid value; keep the lowest.

    A run that raises :class:`~metasampler.NonFiniteError`, or returns a non-finite score,
    scores ``inf`` (worst). With a single grid value the objective is not called.

    With ``max_extensions > 0`` the grid is extended while the best value sits at one of its
    ends (or every value diverged): the next value beyond that end, at the ratio of the two
    values nearest it, is evaluated too, up to ``max_extensions`` extra values. A best value at
    an end of a short grid says only that the optimum may lie beyond it; the extension finds
    out, so that the choice is interior (``TuneResult.interior``) unless the cap is reached.

    Raises:
        ValueError: empty grid or negative ``max_extensions``.
        TuningError: every evaluated value scored ``inf``.
    """
    grid = [float(v) for v in grid]
    if not grid:
        raise ValueError("the step-size grid is empty")
    if max_extensions < 0:
        raise ValueError(f"max_extensions must be >= 0, got {max_extensions!r}")
    if len(grid) == 1:
        return TuneResult(grid[0], [(grid[0], float("nan"))], grid=grid)
    scores: list[tuple[float, float]] = []
    errors: dict[float, str] = {}

    def evaluate(value: float) -> None:
        try:
            score = float(objective(value))
        except NonFiniteError as err:
            score, errors[value] = math.inf, str(err)
        if not math.isfinite(score):
            score = math.inf
        scores.append((value, score))

    for value in grid:
        evaluate(value)
    extensions: list[float] = []
    while len(extensions) < max_extensions:
        value = _next_beyond_edge(scores)
        if value is None or not (value > 0 and math.isfinite(value)):
            break
        extensions.append(value)
        evaluate(value)
    best_value, best_score = min(scores, key=lambda vs: vs[1])  # min keeps the first of ties
    if not math.isfinite(best_score):
        raise TuningError(
            f"every step size in {sorted(v for v, _ in scores)} diverged or gave a non-finite "
            "validation NLL; lower the grid"
        )
    values = [v for v, _ in scores]
    interior = min(values) < best_value < max(values)
    return TuneResult(best_value, scores, errors, grid, extensions, interior)


# ============================================================================================
# Methods
# ============================================================================================
@dataclass(frozen=True)
class MethodSpec:
    """A method of the benchmark: config key, display label, ``lr`` conversion order."""

    key: str
    label: str
    order: str  # "first": eta = lr / N; "second": eta = sqrt(lr / N)
    is_sampler: bool = True


METHODS: dict[str, MethodSpec] = {
    spec.key: spec
    for spec in (
        MethodSpec("nnsghmc", "NNSGHMC", "second"),
        MethodSpec("sgld", "SGLD", "first"),
        MethodSpec("psgld", "pSGLD", "first"),
        MethodSpec("sghmc", "SGHMC", "second"),
        MethodSpec("msgnht", "mSGNHT-S", "second"),
        MethodSpec("csgld", "cSGLD", "first"),
        MethodSpec("csghmc", "cSGHMC", "second"),
        MethodSpec("sgdm", "SGD-M", "first", is_sampler=False),
        MethodSpec("adam", "Adam", "first", is_sampler=False),
    )
}


def build_method(
    key: str,
    options: Mapping[str, Any],
    lr: float | None,
    *,
    n_data: int,
    n_steps: int,
    sampler_path: str | os.PathLike | None = None,
) -> Sampler:
    """The sampler of method ``key`` at per-batch learning rate ``lr``.

    Args:
        key: a key of :data:`METHODS`.
        options: the method's config section (``momentum_decay``, ``n_cycles``, ...).
        lr: per-batch learning rate; ``None`` only for ``nnsghmc`` (the file's stored step).
        n_data: ``N`` of the training set (converts ``momentum_decay`` into a friction).
        n_steps: planned run length (cyclical schedules).
        sampler_path: the NNSGHMC file.
    """
    if key not in METHODS:
        raise ValueError(f"unknown method {key!r}; known: {sorted(METHODS)}")
    if key == "nnsghmc":
        from .export import load_sampler

        if sampler_path is None:
            raise ValueError("nnsghmc needs a sampler file (sampler_path or --sampler)")
        gamma = options.get("gamma")
        gamma = getattr(gamma, "value", gamma)
        sampler = load_sampler(sampler_path, lr=lr, gamma=gamma)
        sampler.use_compile = options.get("compile", False)
        return sampler
    if lr is None:
        raise ValueError(f"method {key!r} needs a learning rate")
    eta = resolve_eta(None, lr, n_data, METHODS[key].order)
    if key == "sgld":
        return SGLD(lr=lr)
    if key == "psgld":
        return PSGLD(lr=lr, beta=options.get("beta", 0.99), lam=options.get("lam", 1e-5))
    friction = options.get("momentum_decay", 0.01) / eta
    if key == "sghmc":
        return SGHMC(lr=lr, friction=friction)
    if key == "msgnht":
        return SGNHT(lr=lr, diffusion=friction, multivariate=True, integrator="splitting")
    cycles = {
        "total_steps": n_steps,
        "n_cycles": options.get("n_cycles", 4),
        "explore_fraction": options.get("explore_fraction", 0.25),
    }
    if key == "csgld":
        return cyclical_sgld(lr=lr, **cycles)
    if key == "csghmc":
        return cyclical_sghmc(lr=lr, friction=friction, **cycles)
    if key == "sgdm":
        return SGDMomentum(lr=lr, momentum=options.get("momentum", 0.9))
    return Adam(lr=lr)


def apply_warmup(sampler: Sampler, steps: int, lr_factor: float, n_data: int) -> float:
    """Put a warm-up phase in front of ``sampler``'s schedule; return the warm-up SDE step.

    The first ``steps`` steps run at ``lr_factor`` times the per-batch learning rate, i.e. the
    SDE step times ``eta(lr_factor) / eta(1)`` of the sampler's order (``lr_factor`` for
    first-order, ``sqrt(lr_factor)`` for second-order samplers), on top of the sampler's own
    schedule (:class:`~metasampler.schedules.WarmUp`). ``steps = 0`` leaves the sampler as it
    is and returns its base step.
    """
    eta = resolve_eta(sampler.eta, sampler.lr, n_data, sampler.order)
    if steps <= 0:
        return eta
    scale = resolve_eta(None, lr_factor, 1, sampler.order) / resolve_eta(
        None, 1.0, 1, sampler.order
    )
    sampler.schedule = WarmUp(steps, scale, sampler.schedule)
    return eta * scale


def set_alpha_from_warmup(sampler: Any, alpha_per_step: float | None, eta_warmup: float) -> str:
    """The paper's test-time ``alpha`` (004 F.2): ``alpha = alpha_per_step / eta_warmup``.

    Applies to a loaded NNSGHMC whose ``friction_units`` is ``"absolute"`` (every sampler file
    before format 2): its ``D_f = alpha Q_f^2 + ...`` is a friction per unit time, so the
    paper re-derives ``alpha`` from the first (warm-up) step of the test run and keeps it, the
    friction per step ``eta alpha Q_f^2`` being ``alpha_per_step Q_f^2`` during the warm-up. A
    ``"per_step"`` sampler's constants are already per step and are left alone, and so is any
    sampler when ``alpha_per_step`` is ``None``.

    Returns:
        A short description of what was done (for the result files).
    """
    units = getattr(sampler, "friction_units", "absolute")
    if alpha_per_step is None:
        return f"file ({sampler.alpha:.4g})"
    if units != "absolute":
        return f"file ({sampler.alpha:.4g}, {units} units)"
    sampler.alpha = float(alpha_per_step) / eta_warmup
    return f"{alpha_per_step:g} / eta_warmup = {sampler.alpha:.4g}"


# ============================================================================================
# Problems
# ============================================================================================
@dataclass
class SyntheticProblem:
    """Same fields as ``tasks.registry.Problem``: ``target``, ``init``, ``exact``, ``name``,
    ``data``."""

    target: BayesianModel
    init: Callable[[int, torch.Generator], Tensor]
    exact: None
    name: str
    data: ClassificationSplits


def synthetic_classification_problem(
    n_train: int = 400,
    n_val: int = 200,
    n_test: int = 200,
    n_ood: int = 200,
    n_features: int = 8,
    n_classes: int = 3,
    hidden: Sequence[int] = (16,),
    activation: str = "relu",
    separation: float = 2.0,
    batch_size: int = 50,
    prior_std: float = 1.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> SyntheticProblem:
    """Gaussian class blobs (means ``separation * N(0, I)``, unit noise) classified by a small
    MLP; OOD inputs are broad noise ``N(0, (3 * separation)^2 I)``. For tests and smoke runs."""
    g = torch.Generator().manual_seed(int(seed))
    means = separation * torch.randn(n_classes, n_features, generator=g)

    def draw(n: int) -> tuple[Tensor, Tensor]:
        y = torch.randint(0, n_classes, (n,), generator=g)
        return means[y] + torch.randn(n, n_features, generator=g), y

    (x_tr, y_tr), (x_va, y_va), (x_te, y_te) = draw(n_train), draw(n_val), draw(n_test)
    ood = 3.0 * separation * torch.randn(n_ood, n_features, generator=g) if n_ood else None
    acts = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "softplus": nn.Softplus}
    layers: list[nn.Module] = []
    width = n_features
    for h in hidden:
        layers += [nn.Linear(width, h), acts[activation]()]
        width = h
    module = nn.Sequential(*layers, nn.Linear(width, n_classes))
    target = BayesianModel(
        module, (x_tr, y_tr), prior_std=prior_std, batch_size=batch_size, dtype=dtype, device=device
    )

    def init(n_chains: int, generator: torch.Generator) -> Tensor:
        return target.init_positions(n_chains, generator)

    data = ClassificationSplits(
        *(t.to(device) for t in (x_tr, y_tr, x_va, y_va, x_te, y_te)),
        n_classes=n_classes,
        ood_x=None if ood is None else ood.to(device),
        name=f"synthetic({n_classes} classes, {n_features} features)",
        model=module,
        input_shape=(n_features,),
    )
    return SyntheticProblem(target, init, None, f"synthetic(D={target.dim})", data)


# ============================================================================================
# One method, one seed
# ============================================================================================
@dataclass
class EvalSet:
    """Inputs scored during a run; ``y=None`` marks unlabeled (out-of-distribution) inputs,
    for which only the predictive entropy is computed."""

    x: Tensor
    y: Tensor | None = None


@dataclass
class MethodRun:
    """What :func:`run_method` measured.

    Attributes:
        curves: one row per evaluation: ``step``, ``epoch`` (``step * M / N``), ``seconds``
            (sampling wall-clock since initialisation, evaluation time excluded),
            ``ensemble_error``,
            ``ensemble_nll`` (the ``K`` current chains), ``average_error``, ``average_nll``
            (running posterior average; ``nan`` before burn-in), ``n_averaged``.
        final: final metrics: ``ensemble_*`` and ``average_*`` for ``error``, ``nll``,
            ``ece``, ``entropy`` on the ``main`` set, ``<set>_entropy`` /
            ``<set>_entropy_ensemble`` for the unlabeled sets, ``seconds``,
            ``seconds_per_step``, ``n_averaged``. ``nan`` where a diverged run has none
            (``average_*`` also when no sample was averaged).
        entropies: per-example predictive entropy of the posterior average, per set name.
        calibration: ``(confidence, accuracy, count)`` bins of the posterior average.
        diverged_at: the step at which a chain became non-finite, else ``None``.
        message: the divergence message.
    """

    curves: list[dict[str, float]]
    final: dict[str, float]
    entropies: dict[str, np.ndarray]
    calibration: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    diverged_at: int | None = None
    message: str | None = None


def run_method(
    sampler: Sampler,
    target: BayesianModel,
    init: Callable[[int, torch.Generator], Tensor],
    *,
    main: EvalSet,
    extra: Mapping[str, EvalSet] | None = None,
    n_chains: int,
    n_steps: int,
    burn_in: int,
    thin: int,
    eval_every: int,
    seed: int,
    eval_batch_size: int = 1000,
    ece_bins: int = 15,
    on_step: Callable[[int], None] | None = None,
    on_eval: Callable[[dict[str, float]], None] | None = None,
) -> MethodRun:
    """Run ``sampler`` for ``n_chains`` chains and ``n_steps`` steps, evaluating on the fly.

    Every ``thin`` steps after ``burn_in`` (and only in a schedule's sampling stages) the ``K``
    current chains enter the running posterior average of every eval set. Every
    ``eval_every`` steps, and after the last step, the labeled ``main`` set is scored for the
    ``K``-chain ensemble and the running average (a learning-curve row, passed to
    ``on_eval``). Nothing but the accumulators is kept (``store=False`` in ``sample``).

    A chain that becomes non-finite ends the run: the rows so far are kept, the final metrics
    are ``nan`` and ``diverged_at`` / ``message`` say where.

    Under torchrun the ``n_chains`` chains are sharded across the ranks (each runs its share
    with its own stream, :func:`metasampler.distributed.rank_seed` of ``seed``); ensemble and
    posterior-average predictives are combined over all ranks before any metric is computed,
    so every rank returns the metrics of all ``n_chains`` chains, and a divergence on one
    rank ends the run on all of them.

    Args:
        sampler: any sampler (baseline or loaded NNSGHMC).
        target: the :class:`BayesianModel` on the training split.
        init: ``(n_chains, generator) -> (K, D)`` start positions.
        main: labeled set of the learning curves (test set; validation set when tuning).
            For a sequence target (``bernoulli_sequence`` likelihood) it is scored per frame
            (:func:`frame_metrics`: error = 1 - frame accuracy, NLL per frame; ECE, entropy
            and calibration are not computed).
        extra: unlabeled sets, e.g. ``{"ood": EvalSet(x_ood)}``, scored by entropy only.
        n_chains, n_steps, burn_in, thin, eval_every: the budget.
        seed: seeds initialisation, noise and minibatches.
        eval_batch_size: examples per forward pass.
        ece_bins: bins of the calibration error.
        on_step: called with the step index after every step (progress bars).
        on_eval: called with every learning-curve row.
    """
    if main.y is None:
        raise ValueError("the main eval set needs labels")
    extra = dict(extra or {})
    sets = {"main": main, **extra}
    shard = distributed.chain_shard(n_chains)  # this rank's chains (all of them if single)
    peer = {"failed": False}
    averages = {name: RunningAverage() for name in sets}
    curves: list[dict[str, float]] = []
    n_data, batch = target.n_data, target.batch_size
    clock = {"sampling": 0.0, "mark": 0.0, "step": 0}
    y_main = main.y.to(target.device)
    # Sequence tasks are scored per frame (see predict_frame_log_probs); no ECE / entropy.
    sequence = is_sequence_model(target)
    if sequence and extra:
        raise ValueError("sequence tasks take no unlabeled eval sets (extra)")
    frames = frame_targets(y_main) if sequence else None

    def predict(theta: Tensor) -> Tensor:
        if sequence:
            return predict_frame_log_probs(target, theta, main.x, y_main, eval_batch_size)
        return predict_log_probs(target, theta, main.x, eval_batch_size)

    def curve_scores(lp: Tensor) -> tuple[float, float]:
        if sequence:
            values = frame_metrics(lp, frames)
            return values["error"], values["nll"]
        return error_rate(lp, y_main), negative_log_likelihood(lp, y_main)

    def callback(state: SamplerState) -> None:
        now = time.perf_counter()
        clock["sampling"] += now - clock["mark"]
        k = state.step
        collect = k > burn_in and (k - burn_in) % thin == 0 and sampler.collects(k)
        report = k % eval_every == 0 or k == n_steps
        if collect or report:
            _stop_if_a_peer_diverged(peer)
            main_lp = predict(state.theta)
            if collect:
                averages["main"].update(main_lp)
                for name, ev in extra.items():
                    averages[name].update(
                        predict_log_probs(target, state.theta, ev.x, eval_batch_size)
                    )
            if report:
                ens = _ensemble_lp(main_lp, n_chains)
                ens_error, ens_nll = curve_scores(ens)
                merged = _merged(averages["main"])
                row = {
                    "step": k,
                    "epoch": k * batch / n_data,
                    "seconds": clock["sampling"],
                    "ensemble_error": ens_error,
                    "ensemble_nll": ens_nll,
                    "average_error": math.nan,
                    "average_nll": math.nan,
                    "n_averaged": merged.count,
                }
                if merged.count:
                    avg = merged.log_mean()
                    row["average_error"], row["average_nll"] = curve_scores(avg)
                curves.append(row)
                if on_eval is not None:
                    on_eval(row)
                if k == n_steps:
                    final_state["theta"], final_state["main_lp"] = state.theta, main_lp
        if on_step is not None:
            on_step(k)
        clock["step"] = k
        clock["mark"] = time.perf_counter()

    def timed_init(generator: torch.Generator) -> Tensor:
        theta = init(shard.size, generator)
        clock["mark"] = time.perf_counter()  # the clock starts after initialisation
        return theta

    final_state: dict[str, Tensor] = {}
    diverged_at, message = None, None
    clock["mark"] = time.perf_counter()
    try:
        sample(
            sampler,
            target,
            shard.size,
            n_steps,
            init=timed_init,
            seed=shard.seed(seed),
            progress=False,
            callback=callback,
            store=False,
            dtype=target.dtype,
            device=target.device,
        )
    except NonFiniteError as err:
        message = str(err)
        if shard.world > 1 and not peer["failed"]:
            # This rank's chains diverged: tell the other ranks, which wait for it at their
            # next scoring step, so that all ranks stop together with the same message.
            failure = distributed.peer_status(err)
            message = f"rank {failure.rank}: {failure.detail}"
        diverged_at = _step_from_message(message, default=int(clock["step"]) + 1)

    seconds = clock["sampling"]
    final: dict[str, float] = {"seconds": seconds}
    entropies: dict[str, np.ndarray] = {}
    calibration = None
    nan_metrics = dict.fromkeys(("error", "nll", "ece", "entropy"), math.nan)
    finished = diverged_at is None and "theta" in final_state
    if finished and shard.world > 1:  # every rank's chains (all ranks finish together)
        averages = {name: _merged(average) for name, average in averages.items()}
    averaged = finished and averages["main"].count > 0
    ens = _ensemble_lp(final_state["main_lp"], n_chains) if finished else None
    avg = averages["main"].log_mean() if averaged else None
    for prefix, lp in (("ensemble", ens), ("average", avg)):
        if lp is None:
            values = nan_metrics
        elif sequence:
            values = frame_metrics(lp, frames)
        else:
            values = metrics_from_log_probs(lp, y_main, ece_bins)
        final.update({f"{prefix}_{name}": value for name, value in values.items()})
    if avg is not None and not sequence:
        entropies["main"] = predictive_entropy(avg).cpu().numpy()
        calibration = calibration_bins(avg, y_main, ece_bins)
    for name, ev in extra.items():
        final[f"{name}_entropy"] = final[f"{name}_entropy_ensemble"] = math.nan
        if averaged:
            ent = predictive_entropy(averages[name].log_mean())
            entropies[name] = ent.cpu().numpy()
            final[f"{name}_entropy"] = float(ent.mean())
        if finished:
            lp = predict_log_probs(target, final_state["theta"], ev.x, eval_batch_size)
            ent_ens = predictive_entropy(_ensemble_lp(lp, n_chains))
            final[f"{name}_entropy_ensemble"] = float(ent_ens.mean())
    final["n_averaged"] = float(averages["main"].count)
    done = n_steps if diverged_at is None else max(diverged_at, 1)
    final["seconds_per_step"] = seconds / done
    return MethodRun(curves, final, entropies, calibration, diverged_at, message)


def ensemble_log_probs_from_lp(log_probs: Tensor) -> Tensor:
    """``(K, B, C)`` per-chain log-probabilities -> ``(B, C)`` log of their average."""
    return torch.logsumexp(log_probs, 0) - math.log(log_probs.shape[0])


# Chains sharded across ranks (torchrun): ensemble predictions are combined *before* any
# metric is computed (the error of an ensemble is not the mean of the ranks' errors). Each
# rank sends one (B, C) log-sum of its chains' probabilities, so the communication per scoring
# step grows with the eval set, not with K or D. Single process: the local values as they are.
def _ensemble_lp(log_probs: Tensor, n_total: int) -> Tensor:
    """``log(1/K sum_k p_k)`` over all ranks' chains from this rank's ``(k, B, C)``."""
    if distributed.world_size() == 1:
        return ensemble_log_probs_from_lp(log_probs)
    log_sum = distributed.logsumexp_over_ranks(torch.logsumexp(log_probs, 0))
    return log_sum - math.log(n_total)


def _merged(average: RunningAverage) -> RunningAverage:
    """One running average of all ranks' chains (``average`` itself in a single process)."""
    if distributed.world_size() == 1 or average._log_sum is None:
        return average
    merged = RunningAverage()
    merged._log_sum = distributed.logsumexp_over_ranks(average._log_sum)
    count = torch.tensor([float(average.count)], dtype=torch.float64)
    merged.count = int(distributed.all_reduce_sum(count).item())
    return merged


def _stop_if_a_peer_diverged(peer: dict[str, bool]) -> None:
    """Sharded runs, at every scoring step: stop here too if another rank's chains diverged
    (that rank reports at the scoring step the others wait at; no rank is left hanging)."""
    failure = distributed.peer_status(None)
    if failure is not None:
        peer["failed"] = True
        raise NonFiniteError(f"rank {failure.rank}: {failure.detail}")


def _step_from_message(message: str, default: int | None) -> int | None:
    """The step number in a :class:`NonFiniteError` message (``... at step 17 ...``)."""
    words = message.replace(",", " ").replace("(", " ").split()
    for before, word in zip(words, words[1:], strict=False):
        if before == "step" and word.isdigit():
            return int(word)
    return default


# ============================================================================================
# The benchmark
# ============================================================================================
@dataclass
class BenchmarkResult:
    """Everything :func:`write_results` writes.

    Attributes:
        summary: the JSON document (config, budget, chosen step sizes, per-seed and
            aggregated final metrics, learning curves).
        runs: ``{method: {seed: MethodRun}}``.
    """

    summary: dict[str, Any]
    runs: dict[str, dict[int, MethodRun]]


_FINAL_METRICS = (
    "average_error",
    "average_nll",
    "average_ece",
    "ensemble_error",
    "ensemble_nll",
    "ensemble_ece",
    "average_entropy",
    "ood_entropy",
    "seconds_per_step",
)


def mean_se(values: Iterable[float]) -> dict[str, float | int]:
    """``{"mean", "se", "n"}`` of the finite values (``se = std(ddof=1) / sqrt(n)``; ``nan``
    for fewer than two values, ``mean`` too for none)."""
    vals = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = int(vals.size)
    if n == 0:
        return {"mean": math.nan, "se": math.nan, "n": 0}
    se = float(vals.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return {"mean": float(vals.mean()), "se": se, "n": n}


def run_benchmark(
    cfg: Any,
    problem: Any,
    *,
    sampler_path: str | os.PathLike | None,
    out_dir: str | os.PathLike,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> BenchmarkResult:
    """Tune and run every enabled method of ``cfg`` (a ``BenchmarkConfig``) on ``problem``.

    Args:
        cfg: validated benchmark config (``metasampler.config.load_benchmark_config``).
        problem: a ``tasks.registry.Problem`` (or :class:`SyntheticProblem`) whose ``data``
            has the :class:`ClassificationSplits` attributes.
        sampler_path: the NNSGHMC file (needed when ``methods.nnsghmc.enabled``).
        out_dir: where TensorBoard logs go (``<out_dir>/tb/<method>/seed<seed>``); a staging
            directory in ``evaluate.py``.
        progress: show a tqdm bar over all steps (tuning and evaluation).
        log: receives one-line status messages (default ``tqdm.write``, which keeps the
            progress bar intact).

    Step sizes are tuned once per method on the validation split (seed ``tune.seed``, same
    for every grid value), then every seed in ``cfg.seeds`` runs with the chosen value. All
    methods share the seed ``s`` for run ``s``, hence the same initial positions and
    minibatch sequence where their random-number use agrees.
    """
    from omegaconf import OmegaConf
    from tqdm.auto import tqdm

    log = log or tqdm.write
    main_process = distributed.is_main_process()  # torchrun: only rank 0 reports and writes
    if not main_process:

        def log(_: str) -> None:
            pass

    data = problem.data
    target: BayesianModel = problem.target
    budget, tune = cfg.budget, cfg.tune
    n_data = target.n_data
    writer_root = Path(out_dir) / "tb"
    device = target.device
    x_test, y_test = data.x_test, data.y_test
    if budget.max_test:
        x_test, y_test = x_test[: budget.max_test], y_test[: budget.max_test]
    test = EvalSet(x_test.to(device), y_test.to(device))
    extra: dict[str, EvalSet] = {}
    if data.ood_x is not None and cfg.ood_max:
        extra["ood"] = EvalSet(data.ood_x[: cfg.ood_max].to(device))
    x_val, y_val = data.x_val, data.y_val
    if tune.max_val:
        x_val, y_val = x_val[: tune.max_val], y_val[: tune.max_val]
    val = EvalSet(x_val.to(device), y_val.to(device))
    tune_chains = tune.n_chains or budget.n_chains

    methods = [key for key in METHODS if cfg.methods[key].enabled]
    grids: dict[str, list[float | None]] = {}
    for key in methods:
        grid = [float(v) for v in cfg.methods[key].lr_grid]
        grids[key] = grid if grid else [None]  # None: nnsghmc's stored step
    n_tune_runs = sum(len(g) for g in grids.values() if len(g) > 1) if tune.enabled else 0
    total = n_tune_runs * tune.n_steps + len(methods) * len(cfg.seeds) * budget.n_steps
    bar = tqdm(
        total=total, disable=not (progress and main_process), unit="step", dynamic_ncols=True
    )

    def tick(_: int) -> None:
        bar.update(1)

    def writer(*parts: str):
        if not cfg.tensorboard or not main_process:
            return None
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(log_dir=str(writer_root.joinpath(*parts)))

    # What every tuning and evaluation run shares: the target, its initialisation, the scoring
    # settings and the progress bar.
    run_on_target = functools.partial(
        run_method,
        target=target,
        init=problem.init,
        eval_batch_size=budget.eval_batch_size,
        ece_bins=cfg.ece_bins,
        on_step=tick,
    )
    method_summaries: dict[str, Any] = {}
    runs: dict[str, dict[int, MethodRun]] = {}
    try:
        for key in methods:
            spec, options = METHODS[key], OmegaConf.to_container(cfg.methods[key], resolve=True)
            grid = grids[key]

            def make(lr: float | None, n_steps: int, key: str = key, options=options) -> Sampler:
                """The method at ``lr`` with the protocol's warm-up phase and, for NNSGHMC,
                the paper's ``alpha`` (both identical in tuning and evaluation runs)."""
                sampler = build_method(
                    key, options, lr, n_data=n_data, n_steps=n_steps, sampler_path=sampler_path
                )
                warmup = min(budget.warmup_steps, n_steps)
                eta_warmup = apply_warmup(sampler, warmup, budget.warmup_lr_factor, n_data)
                if key == "nnsghmc":
                    sampler.alpha_note = set_alpha_from_warmup(
                        sampler, options.get("alpha_per_step"), eta_warmup
                    )
                return sampler

            def eta_of(lr: float | None, key: str = key) -> float:
                sampler = make(lr, budget.n_steps)
                return resolve_eta(sampler.eta, sampler.lr, n_data, sampler.order)

            entry: dict[str, Any] = {"label": spec.label, "is_sampler": spec.is_sampler}
            method_summaries[key] = entry
            # ---- tuning on the validation split
            tuning_rows: list[dict[str, Any]] = []
            if tune.enabled and len(grid) > 1:
                bar.set_description(f"tune {spec.label}")

                def objective(
                    lr: float, make=make, rows=tuning_rows, initial=frozenset(grid)
                ) -> float:
                    if lr not in initial:  # an extension of the grid: one more tuning run
                        bar.total += tune.n_steps
                        bar.refresh()
                    result = run_on_target(
                        make(lr, tune.n_steps),
                        main=val,
                        n_chains=tune_chains,
                        n_steps=tune.n_steps,
                        burn_in=tune.burn_in,
                        thin=tune.thin,
                        eval_every=tune.n_steps,
                        seed=tune.seed,
                    )
                    rows.append(
                        {
                            "lr": lr,
                            "val_nll": result.final["average_nll"],
                            "val_error": result.final["average_error"],
                            "diverged_at": result.diverged_at,
                        }
                    )
                    if result.diverged_at is not None:
                        bar.update(tune.n_steps - result.diverged_at)
                        raise NonFiniteError(result.message or "diverged")
                    return result.final["average_nll"]

                try:
                    tuned = tune_step_size(objective, grid, tune.max_extensions)
                    chosen = tuned.best
                    entry.update(
                        tuning_grid=tuned.grid,
                        tuning_extensions=tuned.extensions,
                        tuning_interior=tuned.interior,
                    )
                except TuningError as err:
                    entry.update(
                        lr=None,
                        eta=None,
                        tuning=tuning_rows,
                        tuning_grid=grid,
                        tuning_extensions=[r["lr"] for r in tuning_rows if r["lr"] not in grid],
                        tuning_interior=None,
                        runs=[],
                        summary={},
                        error=str(err),
                    )
                    log(f"{spec.label}: {err}; skipped")
                    bar.update(len(cfg.seeds) * budget.n_steps)
                    continue
            else:
                chosen = grid[0]
            eta = eta_of(chosen)
            lr_used = chosen
            if chosen is None:  # the file's own step
                lr_used = make(None, budget.n_steps).lr
            for row in tuning_rows:
                row["eta"] = eta_of(row["lr"])
                row["chosen"] = row["lr"] == chosen
                row["extension"] = row["lr"] not in grid
            entry.update(lr=lr_used, eta=eta, tuning=tuning_rows, error=None)
            entry.setdefault("tuning_grid", [v for v in grid if v is not None])
            entry.setdefault("tuning_extensions", [])
            entry.setdefault("tuning_interior", None)
            evaluated = make(chosen, budget.n_steps)
            entry["warmup_eta"] = (
                evaluated.schedule.scale * eta if isinstance(evaluated.schedule, WarmUp) else None
            )
            if key == "nnsghmc":
                entry["alpha"] = float(evaluated.alpha)
                entry["alpha_note"] = evaluated.alpha_note
            if tuning_rows:
                scores = ", ".join(f"{r['lr']:g}: {r['val_nll']:.4f}" for r in tuning_rows)
                where = {True: "interior", False: "grid edge", None: ""}[entry["tuning_interior"]]
                log(f"{spec.label}: lr grid (val NLL) {scores} -> lr={chosen:g} ({where})")
            tw = writer(key, "tune")
            if tw is not None:
                for i, row in enumerate(tuning_rows):
                    tw.add_scalar("tune/val_nll", _finite_or(row["val_nll"], math.inf), i)
                    tw.add_scalar("tune/lr", row["lr"], i)
                tw.add_text("tune/chosen", f"lr={lr_used}, eta={eta:.6g}")
                tw.close()
            # ---- evaluation over seeds
            runs[key] = {}
            per_seed: list[dict[str, Any]] = []
            for seed in cfg.seeds:
                bar.set_description(f"{spec.label} seed {seed}")
                sw = writer(key, f"seed{seed}")
                start = time.time()

                def on_eval(row: dict[str, float], sw=sw, start=start) -> None:
                    if sw is None:
                        return
                    step, wall = int(row["step"]), start + row["seconds"]
                    for name in ("ensemble_error", "ensemble_nll", "average_error", "average_nll"):
                        value = row[name]
                        if math.isfinite(value):
                            prefix, metric = name.split("_", 1)
                            sw.add_scalar(f"{prefix}/test_{metric}", value, step, walltime=wall)

                result = run_on_target(
                    make(chosen, budget.n_steps),
                    main=test,
                    extra=extra,
                    n_chains=budget.n_chains,
                    n_steps=budget.n_steps,
                    burn_in=budget.burn_in,
                    thin=budget.thin,
                    eval_every=budget.eval_every,
                    seed=int(seed),
                    on_eval=on_eval,
                )
                if sw is not None:
                    sw.close()
                if result.diverged_at is not None:
                    bar.update(budget.n_steps - result.diverged_at)
                    log(f"{spec.label} seed {seed}: diverged: {result.message}")
                final = dict(result.final)
                runs[key][int(seed)] = result
                per_seed.append(
                    {
                        "seed": int(seed),
                        "final": final,
                        "diverged_at": result.diverged_at,
                        "message": result.message,
                        "curves": result.curves,
                    }
                )
            entry["runs"] = per_seed
            entry["summary"] = {
                m: mean_se(r["final"].get(m, math.nan) for r in per_seed) for m in _FINAL_METRICS
            }
            entry["n_diverged"] = sum(r["diverged_at"] is not None for r in per_seed)
    finally:
        bar.close()

    summary = {
        "name": cfg.name,
        "task": problem.name,
        "data": getattr(data, "name", "?"),
        "n_train": int(n_data),
        "n_val": int(data.x_val.shape[0]),
        "n_test": int(test.x.shape[0]),
        "n_ood": int(extra["ood"].x.shape[0]) if "ood" in extra else 0,
        "n_classes": int(data.n_classes),
        "dim": int(target.dim),
        "batch_size": int(target.batch_size),
        "budget": OmegaConf.to_container(budget, resolve=True),
        "tune": OmegaConf.to_container(tune, resolve=True),
        "seeds": [int(s) for s in cfg.seeds],
        "sampler_path": None if sampler_path is None else str(sampler_path),
        "environment": {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "device": str(device),
            # (only when sharded, so single-process results keep their exact form)
            **({"processes": distributed.world_size()} if distributed.world_size() > 1 else {}),
        },
        "config": OmegaConf.to_container(cfg, resolve=True),
        "methods": method_summaries,
    }
    if is_sequence_model(target):  # scored per frame: say so (classification keys unchanged)
        summary["scoring"] = "frames"
        summary["n_test_frames"] = int(frame_targets(test.y).shape[0])
    return BenchmarkResult(summary, runs)


def merge_seed_results(summaries: Sequence[Mapping[str, Any]]) -> BenchmarkResult:
    """One result from ``results.json`` documents of the same benchmark run on disjoint seeds
    (e.g. one process per seed on a shared CPU), as if all seeds had run in one process.

    Every part must have tuned each method to the same value (tuning uses ``tune.seed``, not
    the evaluation seeds, so identical configs give identical choices); the per-seed runs are
    concatenated in seed order and the mean ± standard error recomputed. The returned
    :class:`BenchmarkResult` carries the learning curves (no entropies or calibration bins, which
    ``results.json`` does not store).

    Raises:
        ValueError: fewer than two parts, repeated seeds, or parts that differ in their
            methods or tuned step sizes.
    """
    if len(summaries) < 2:
        raise ValueError("merging needs at least two results.json documents")
    first = summaries[0]
    seeds = [int(s) for part in summaries for s in part["seeds"]]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"the parts repeat seeds: {seeds}")
    merged = json.loads(json.dumps(first))  # a deep copy
    merged["seeds"] = sorted(seeds)
    merged["config"]["seeds"] = sorted(seeds)
    runs: dict[str, dict[int, MethodRun]] = {}
    for key, entry in merged["methods"].items():
        parts = [part["methods"].get(key) for part in summaries]
        if any(p is None for p in parts):
            raise ValueError(f"method {key!r} is missing from some of the parts")
        chosen = {(p.get("lr"), p.get("error")) for p in parts}
        if len(chosen) != 1:
            raise ValueError(f"method {key!r} was tuned differently in the parts: {chosen}")
        if entry.get("error"):
            continue
        per_seed = sorted((r for p in parts for r in p["runs"]), key=lambda r: r["seed"])
        entry["runs"] = per_seed
        finals = [
            {k: math.nan if v is None else v for k, v in r["final"].items()} for r in per_seed
        ]
        entry["summary"] = {m: mean_se(f.get(m, math.nan) for f in finals) for m in _FINAL_METRICS}
        entry["n_diverged"] = sum(r["diverged_at"] is not None for r in per_seed)
        runs[key] = {
            int(r["seed"]): MethodRun(
                [{k: math.nan if v is None else v for k, v in row.items()} for row in r["curves"]],
                finals[i],
                {},
                None,
                r["diverged_at"],
                r["message"],
            )
            for i, r in enumerate(per_seed)
        }
    return BenchmarkResult(merged, runs)


def _finite_or(value: float | None, default: float) -> float:
    return value if value is not None and math.isfinite(value) else default


# ============================================================================================
# Writing results
# ============================================================================================
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
    """The warm-up phase and NNSGHMC's ``alpha`` in words (empty without either)."""
    budget = summary["budget"]
    parts = []
    if budget.get("warmup_steps"):
        parts.append(
            f"Warm-up, every method: the first {budget['warmup_steps']} steps at "
            f"{budget['warmup_lr_factor']:g} × the chosen per-batch lr."
        )
    nn = summary["methods"].get("nnsghmc") or {}
    if nn.get("alpha_note"):
        parts.append(f"NNSGHMC alpha: {nn['alpha_note']}.")
    return " ".join(parts)


def markdown_table(summary: Mapping[str, Any]) -> str:
    """The results table: mean ± standard error over seeds, one row per method."""
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
        "| Method | lr | test err % (avg) | test NLL (avg) | test err % (ens) | "
        "test NLL (ens) | ECE (avg) | OOD entropy | ms/step | diverged |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in summary["methods"].values():
        label = entry["label"] + ("" if entry["is_sampler"] else " (optimiser)")
        if entry.get("error"):
            lines.append(f"| {label} | – | {entry['error']} | | | | | | | |")
            continue
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
            ("seconds_per_step", 1000, 1),
        )
        cells = " | ".join(format_mean_se(s[m], scale, digits) for m, scale, digits in columns)
        lines.append(f"| {label} | {lr} | {cells} | {entry['n_diverged']}/{n_runs} |")
    lines += [
        "",
        "avg: running posterior average (all chains, all kept samples); ens: ensemble of the "
        "K final chains. NLL in nats per test example; ECE with "
        f"{summary['config']['ece_bins']} bins; OOD entropy: mean predictive entropy (nats) "
        "of the posterior average on out-of-distribution inputs (higher is better). "
        "ms/step: sampling wall-clock, evaluation excluded. lr: per-batch learning rate "
        "chosen on the validation split.",
    ]
    if summary.get("scoring") == "frames":
        lines += [
            "",
            f"Sequence task, scored on the {summary['n_test_frames']} real test frames: NLL in "
            "nats per frame (summed over the keys) of the chain mixture; err = 1 - frame-level "
            "accuracy TP/(TP+FP+FN) of keys whose predictive probability exceeds 1/2; N counts "
            "chunks of frames; no ECE or OOD set.",
        ]
    lines += [
        "",
        "## Step-size tuning (validation NLL of the posterior average)",
        "",
        "| Method | initial grid: lr → val NLL | extensions: lr → val NLL | chosen lr | eta | "
        "choice |",
        "|---|---|---|---|---|---|",
    ]
    for entry in summary["methods"].values():
        rows = entry.get("tuning") or []

        def scored(rows: list[dict[str, Any]]) -> str:
            return ", ".join(
                f"{r['lr']:g} → "
                + (f"{r['val_nll']:.4f}" if r["diverged_at"] is None else "diverged")
                for r in sorted(rows, key=lambda r: r["lr"])
            )

        initial = scored([r for r in rows if not r.get("extension")])
        extended = scored([r for r in rows if r.get("extension")])
        lr = "–" if entry.get("lr") is None else f"{entry['lr']:g}"
        eta = "–" if entry.get("eta") is None else f"{entry['eta']:.3g}"
        interior = entry.get("tuning_interior")
        if interior is None and len(rows) > 1 and entry.get("lr") is not None:
            values = [r["lr"] for r in rows]  # results written before the extension existed
            interior = min(values) < entry["lr"] < max(values)
        choice = {True: "interior", False: "grid edge", None: "–"}[interior]
        lines.append(
            f"| {entry['label']} | {initial or 'not tuned'} | {extended or '–'} | {lr} | {eta} "
            f"| {choice} |"
        )
    lines += [
        "",
        "extensions: while the best value sat at an end of the grid, the next value beyond it "
        "(at the ratio of the two values nearest that end) was tuned too, at most "
        f"{summary['tune'].get('max_extensions', 0)} times; a diverged run counts as worst. "
        "grid edge: the choice is still at an end after the last extension (the optimum may lie "
        "beyond it).",
    ]
    return "\n".join(lines) + "\n"


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
            "eta": entry.get("eta"),
            "tuning_interior": entry.get("tuning_interior"),
            "warmup_eta": entry.get("warmup_eta"),
            "alpha": entry.get("alpha"),
            "n_diverged": entry.get("n_diverged"),
            "error": entry.get("error"),
        }
        for metric, stat in (entry.get("summary") or {}).items():
            row[f"{metric}_mean"], row[f"{metric}_se"] = stat["mean"], stat["se"]
            row["n_seeds"] = stat["n"]
        rows.append(row)
    return rows


_SUMMARY_FIELDS = (
    ["method", "label", "lr", "eta", "tuning_interior", "warmup_eta", "alpha", "n_seeds"]
    + ["n_diverged"]
    + [f"{m}_{s}" for m in _FINAL_METRICS for s in ("mean", "se")]
    + ["error"]
)


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
    "csgld": ("#8c564b", (0, (3, 1, 1, 1, 1, 1)), "P", 1.6),
    "csghmc": ("#e377c2", (0, (2, 2)), "X", 1.6),
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
    spec = METHODS[key]
    return spec.label if spec.is_sampler else f"{spec.label} (optimiser)"


def _legend_above(ax) -> None:
    """A legend for this panel, above it, so it never hides a curve."""
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
    """Test error and NLL against epochs and sampling wall-clock (004 Fig. 3), mean over
    seeds with a ±1 standard-error band; ``kind`` is ``"average"`` or ``"ensemble"``."""
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
    out-of-distribution inputs (000 Fig. 4; on OOD inputs, lower curves are better)."""
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


def _figure_bytes(fig) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


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
    atomic_write_text(directory / "summary.csv", _csv_text(_summary_rows(summary), _SUMMARY_FIELDS))
    atomic_write_text(directory / "curves.csv", _csv_text(_curve_rows(summary), _CURVE_FIELDS))
    tuning = [
        {"method": key, **row}
        for key, entry in summary["methods"].items()
        for row in entry.get("tuning") or []
    ]
    atomic_write_text(
        directory / "tuning.csv",
        _csv_text(
            tuning,
            ["method", "lr", "eta", "val_nll", "val_error", "diverged_at", "extension", "chosen"],
        ),
    )
    atomic_write_text(directory / "table.md", markdown_table(summary))
    atomic_write_text(directory / "config.yaml", config_yaml)
    figures = {
        "learning_curves.png": lambda: plot_learning_curves(result, "average"),
        "learning_curves_ensemble.png": lambda: plot_learning_curves(result, "ensemble"),
        "entropy_cdf.png": lambda: plot_entropy_cdf(result),
        "calibration.png": lambda: plot_calibration(result),
    }
    for name, make in figures.items():
        atomic_write_bytes(directory / name, _figure_bytes(make()))
