"""One method, one seed: a sampler's ``K`` chains run through :func:`metasampler.sample` with
a callback that streams test-set learning curves (ensemble of the current chains and running
posterior average, against steps and sampling wall-clock) and scores out-of-distribution
inputs; nothing is stored but the accumulators (:func:`run_method`, :class:`MethodRunner`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..adapt import Adapt, AdaptResult
from ..bayesian import BayesianModel
from ..distributed import all_reduce_sum, chain_shard, logsumexp_over_ranks, peer_status, world_size
from ..samplers import Sampler, SamplerState
from ..sampling import sample
from ..targets import NonFiniteError
from .metrics import (
    RunningAverage,
    calibration_bins,
    ensemble_log_probs_from_lp,
    error_rate,
    frame_metrics,
    frame_targets,
    is_sequence_model,
    metrics_from_log_probs,
    negative_log_likelihood,
    predict_frame_log_probs,
    predict_log_probs,
    predictive_entropy,
)
from .temperature import configurational_temperature

__all__ = ["EvalSet", "MethodRun", "MethodRunner", "run_method"]


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
            ``ensemble_nll`` (the ``K`` current chains), ``member_nll`` (the mean over the
            ``K`` chains of each one's own NLL: what a single current sample predicts; by
            Jensen never below ``ensemble_nll``; ``nan`` for sequence targets),
            ``average_error``, ``average_nll`` (running posterior average; ``nan`` before
            burn-in), ``n_averaged``.
        final: final metrics: ``ensemble_*`` and ``average_*`` for ``error``, ``nll``,
            ``ece``, ``entropy`` on the ``main`` set, ``<set>_entropy`` /
            ``<set>_entropy_ensemble`` for the unlabeled sets, ``seconds``,
            ``seconds_per_step``, ``n_averaged``. ``nan`` where a diverged run has none
            (``average_*`` also when no sample was averaged).
        entropies: per-example predictive entropy of the posterior average, per set name.
        calibration: ``(confidence, accuracy, count)`` bins of the posterior average.
        diverged_at: the step at which a chain became non-finite, else ``None``.
        message: the divergence message.
        adapted: with ``adapt``, what the burn-in chose (``None`` otherwise, or when the run
            diverged before the kept samples).
    """

    curves: list[dict[str, float]]
    final: dict[str, float]
    entropies: dict[str, np.ndarray]
    calibration: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    diverged_at: int | None = None
    message: str | None = None
    adapted: AdaptResult | None = None


class _MainSet:
    """The labeled set of the learning curves: scored per example (classification) or, for a
    sequence target (``bernoulli_sequence`` likelihood), per frame (:func:`frame_metrics`)."""

    def __init__(self, target: BayesianModel, main: EvalSet, batch_size: int, ece_bins: int):
        if main.y is None:
            raise ValueError("the main eval set needs labels")
        self.target, self.x, self.y = target, main.x, main.y.to(target.device)
        self.batch_size, self.ece_bins = batch_size, ece_bins
        self.sequence = is_sequence_model(target)
        self.frames = frame_targets(self.y) if self.sequence else None

    def predict(self, theta: Tensor) -> Tensor:
        """``(K, B, C)`` (or ``(K, F, 1 + P)``) log-probabilities of this rank's chains."""
        if self.sequence:
            return predict_frame_log_probs(self.target, theta, self.x, self.y, self.batch_size)
        return predict_log_probs(self.target, theta, self.x, self.batch_size)

    def metrics(self, log_probs: Tensor) -> dict[str, float]:
        """``error``, ``nll``, ``ece``, ``entropy`` of a combined ``(B, C)`` predictive."""
        if self.sequence:
            return frame_metrics(log_probs, self.frames)
        return metrics_from_log_probs(log_probs, self.y, self.ece_bins)

    def member_nll(self, log_probs: Tensor, n_total: int) -> float:
        """Mean over all ranks' ``n_total`` chains of each chain's own NLL, from this rank's
        ``(k, B, C)`` log-probabilities (``nan`` for a sequence target)."""
        if self.sequence:
            return math.nan
        labels = self.y.view(1, -1, 1).expand(log_probs.shape[0], -1, 1)
        per_chain = -log_probs.gather(-1, labels).squeeze(-1).double().mean(-1)
        return float(all_reduce_sum(per_chain.sum()) / n_total)

    def curve_scores(self, log_probs: Tensor) -> tuple[float, float]:
        """Error and NLL of a learning-curve row."""
        if self.sequence:
            values = frame_metrics(log_probs, self.frames)
            return values["error"], values["nll"]
        return error_rate(log_probs, self.y), negative_log_likelihood(log_probs, self.y)


class MethodRunner:
    """One sampler, ``K`` chains, ``n_steps`` steps, evaluated on the fly; :meth:`run` runs it
    once. The arguments (keyword-only after ``init``) are those of :func:`run_method`."""

    def __init__(
        self,
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
        adapt: Adapt | None = None,
    ) -> None:
        if adapt is not None and world_size() > 1:
            raise ValueError("adapt runs in one process: each rank would choose its own step")
        self.adapt = adapt
        self.adapted: AdaptResult | None = None
        self.main = _MainSet(target, main, eval_batch_size, ece_bins)
        self.extra = dict(extra or {})
        if self.main.sequence and self.extra:
            raise ValueError("sequence tasks take no unlabeled eval sets (extra)")
        self.sampler, self.target, self.init = sampler, target, init
        self.n_chains, self.n_steps, self.seed = n_chains, n_steps, seed
        self.burn_in, self.thin, self.eval_every = burn_in, thin, eval_every
        self.eval_batch_size = eval_batch_size
        self.on_step, self.on_eval = on_step, on_eval
        self.shard = chain_shard(n_chains)  # this rank's chains (all if single)
        self.averages = {name: RunningAverage() for name in ("main", *self.extra)}
        self.curves: list[dict[str, float]] = []
        self.sampling_seconds, self._mark, self._step = 0.0, 0.0, 0
        self.peer_failed = False
        self.final_theta: Tensor | None = None
        self.final_lp: Tensor | None = None

    def run(self) -> MethodRun:
        """Sample and score; a chain that becomes non-finite ends the run (see
        :func:`run_method`)."""
        diverged_at, message = None, None
        self._mark = time.perf_counter()
        try:
            result = sample(
                self.sampler,
                self.target,
                self.shard.size,
                self.n_steps,
                init=self._init,
                # the warm-up ends at the burn-in: what the sampler adapts is fixed from then
                burn_in=self.burn_in if self.burn_in < self.n_steps else 0,
                seed=self.shard.seed(self.seed),
                progress=False,
                callback=self._callback,
                store=False,
                dtype=self.target.dtype,
                device=self.target.device,
                adapt=self.adapt or False,
            )
            self.adapted = result.adapted
        except NonFiniteError as err:
            diverged_at, message = self._divergence(err)
        return self._result(diverged_at, message)

    # -- during the run --------------------------------------------------------------------
    def _init(self, generator: torch.Generator) -> Tensor:
        theta = self.init(self.shard.size, generator)
        self._mark = time.perf_counter()  # the clock starts after initialisation
        return theta

    def _callback(self, state: SamplerState) -> None:
        self.sampling_seconds += time.perf_counter() - self._mark
        k = state.step
        collect = (
            k > self.burn_in and (k - self.burn_in) % self.thin == 0 and self.sampler.collects(k)
        )
        report = k % self.eval_every == 0 or k == self.n_steps
        if collect or report:
            self._stop_if_a_peer_diverged()
            main_lp = self.main.predict(state.theta)
            if collect:
                self._collect(state.theta, main_lp)
            if report:
                self._report(k, main_lp)
                if k == self.n_steps:
                    self.final_theta, self.final_lp = state.theta, main_lp
        if self.on_step is not None:
            self.on_step(k)
        self._step = k
        self._mark = time.perf_counter()

    def _collect(self, theta: Tensor, main_lp: Tensor) -> None:
        """Add the current chains to the running posterior average of every set."""
        self.averages["main"].update(main_lp)
        for name, ev in self.extra.items():
            self.averages[name].update(self._predict_extra(theta, ev))

    def _report(self, k: int, main_lp: Tensor) -> None:
        """One learning-curve row (the ``K`` current chains and the running average)."""
        ens_error, ens_nll = self.main.curve_scores(_ensemble_lp(main_lp, self.n_chains))
        merged = _merged(self.averages["main"])
        row = {
            "step": k,
            "epoch": k * self.target.batch_size / self.target.n_data,
            "seconds": self.sampling_seconds,
            "ensemble_error": ens_error,
            "ensemble_nll": ens_nll,
            "member_nll": self.main.member_nll(main_lp, self.n_chains),
            "average_error": math.nan,
            "average_nll": math.nan,
            "n_averaged": merged.count,
        }
        if merged.count:
            row["average_error"], row["average_nll"] = self.main.curve_scores(merged.log_mean())
        self.curves.append(row)
        if self.on_eval is not None:
            self.on_eval(row)

    def _predict_extra(self, theta: Tensor, ev: EvalSet) -> Tensor:
        return predict_log_probs(self.target, theta, ev.x, self.eval_batch_size)

    # -- divergence --------------------------------------------------------------------------
    def _stop_if_a_peer_diverged(self) -> None:
        """Sharded runs, at every scoring step: stop here too if another rank's chains
        diverged (that rank reports at the scoring step the others wait at; no rank is left
        hanging)."""
        failure = peer_status(None)
        if failure is not None:
            self.peer_failed = True
            raise NonFiniteError(f"rank {failure.rank}: {failure.detail}", step=failure.step)

    def _divergence(self, err: NonFiniteError) -> tuple[int, str]:
        """The step at which a chain became non-finite (the error's ``step``; the step after
        the last one completed when it has none) and the message."""
        step, message = err.step, str(err)
        if self.shard.world > 1 and not self.peer_failed:
            # This rank's chains diverged: tell the other ranks, which wait for it at their
            # next scoring step, so that all ranks stop together with the same message.
            failure = peer_status(err)
            step, message = failure.step, f"rank {failure.rank}: {failure.detail}"
        return (self._step + 1 if step is None else step), message

    # -- after the run ---------------------------------------------------------------------
    def _result(self, diverged_at: int | None, message: str | None) -> MethodRun:
        finished = diverged_at is None and self.final_theta is not None
        if finished and self.shard.world > 1:  # every rank's chains (all ranks finish together)
            self.averages = {name: _merged(average) for name, average in self.averages.items()}
        averaged = finished and self.averages["main"].count > 0
        final: dict[str, float] = {"seconds": self.sampling_seconds}
        entropies: dict[str, np.ndarray] = {}
        calibration = None
        ens = _ensemble_lp(self.final_lp, self.n_chains) if finished else None
        avg = self.averages["main"].log_mean() if averaged else None
        for prefix, lp in (("ensemble", ens), ("average", avg)):
            values = _NAN_METRICS if lp is None else self.main.metrics(lp)
            final.update({f"{prefix}_{name}": value for name, value in values.items()})
        if avg is not None and not self.main.sequence:
            entropies["main"] = predictive_entropy(avg).cpu().numpy()
            calibration = calibration_bins(avg, self.main.y, self.main.ece_bins)
        self._extra_entropies(final, entropies, finished, averaged)
        final["temperature"] = self._final_temperature() if finished else math.nan
        final["n_averaged"] = float(self.averages["main"].count)
        done = self.n_steps if diverged_at is None else max(diverged_at, 1)
        final["seconds_per_step"] = self.sampling_seconds / done
        return MethodRun(
            self.curves, final, entropies, calibration, diverged_at, message, self.adapted
        )

    def _final_temperature(self) -> float:
        """The final chains' mean configurational temperature, all ranks' chains (1 in
        expectation over the posterior; :mod:`.temperature`)."""
        per_chain = configurational_temperature(self.target, self.final_theta)
        total = all_reduce_sum(per_chain.sum().to(torch.float64).reshape(1))
        return float(total.item()) / self.n_chains

    def _extra_entropies(
        self,
        final: dict[str, float],
        entropies: dict[str, np.ndarray],
        finished: bool,
        averaged: bool,
    ) -> None:
        """Mean predictive entropy of the unlabeled sets: posterior average and ensemble."""
        for name, ev in self.extra.items():
            final[f"{name}_entropy"] = final[f"{name}_entropy_ensemble"] = math.nan
            if averaged:
                ent = predictive_entropy(self.averages[name].log_mean())
                entropies[name] = ent.cpu().numpy()
                final[f"{name}_entropy"] = float(ent.mean())
            if finished:
                lp = self._predict_extra(self.final_theta, ev)
                ent_ens = predictive_entropy(_ensemble_lp(lp, self.n_chains))
                final[f"{name}_entropy_ensemble"] = float(ent_ens.mean())


_NAN_METRICS = dict.fromkeys(("error", "nll", "ece", "entropy"), math.nan)


def run_method(
    sampler: Sampler,
    target: BayesianModel,
    init: Callable[[int, torch.Generator], Tensor],
    **kwargs: Any,
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
        adapt: choose the step (and friction) during the burn-in (:mod:`metasampler.adapt`;
            one process only); ``MethodRun.adapted`` reports the choice. The learning curve
            starts once every chain runs the chosen kernel.
    """
    return MethodRunner(sampler, target, init, **kwargs).run()


# Chains sharded across ranks (torchrun): ensemble predictions are combined *before* any
# metric is computed (the error of an ensemble is not the mean of the ranks' errors). Each
# rank sends one (B, C) log-sum of its chains' probabilities, so the communication per scoring
# step grows with the eval set, not with K or D. Single process: the local values as they are.
def _ensemble_lp(log_probs: Tensor, n_total: int) -> Tensor:
    """``log(1/K sum_k p_k)`` over all ranks' chains from this rank's ``(k, B, C)``."""
    if world_size() == 1:
        return ensemble_log_probs_from_lp(log_probs)
    log_sum = logsumexp_over_ranks(torch.logsumexp(log_probs, 0))
    return log_sum - math.log(n_total)


def _merged(average: RunningAverage) -> RunningAverage:
    """One running average of all ranks' chains (``average`` itself in a single process)."""
    if world_size() == 1 or average.log_sum is None:
        return average
    count = torch.tensor([float(average.count)], dtype=torch.float64)
    return RunningAverage.from_log_sum(
        logsumexp_over_ranks(average.log_sum),
        int(all_reduce_sum(count).item()),
    )
