"""What a practitioner does with a finished run: a convergence summary and ArviZ export.

:func:`summary` reports the bulk ESS and the rank-normalised split R-hat (Vehtari et al. 2021,
computed by :mod:`metasampler.diagnostics`) of every parameter and, for a
:class:`~metasampler.BayesianModel`, of every posterior-predictive quantity (the class
probabilities of each example, ...). It warns with :class:`ConvergenceWarning` when R-hat is
high. For a neural network the warning looks at the predictions, not the weights: hidden units
can be permuted without changing the function, so chains started apart sit in different but
equivalent weight modes and weight R-hat stays far above 1 even when the predictions agree.

:func:`to_inference_data` converts a run to ArviZ's ``InferenceData`` (an optional extra:
``pip install "metasampler[arviz]"``), swapping ``(samples, chains)`` to ArviZ's
``(chain, draw)``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from . import diagnostics
from .bayesian import BayesianModel

__all__ = ["ConvergenceWarning", "Summary", "summary", "to_inference_data"]

#: The classic rule of thumb (Gelman et al., Bayesian Data Analysis, 3rd ed., §11.4). The
#: warning looks at the largest R-hat of many quantities (every class probability of every
#: example), which exceeds Vehtari et al.'s (2021) stricter 1.01 by chance alone in runs of a
#: few hundred draws; pass ``rhat_threshold=1.01`` for final results.
RHAT_THRESHOLD = 1.1


class SampleResult(Protocol):
    """What this module reads of a run: a :class:`metasampler.SampleResult` (named here
    without importing :mod:`metasampler.sampling`, which imports this module)."""

    theta: Tensor  # (S, K, D) kept samples
    energy: Tensor  # (S, K) their (minibatch) energies
    steps: Tensor  # (S,) the step of each kept sample
    target: Any


class ConvergenceWarning(UserWarning):
    """The chains disagree (R-hat above the threshold): run longer or use more chains."""


@dataclass(frozen=True)
class Summary:
    """Bulk ESS (total over chains) and rank-normalised split R-hat of a run.

    Attributes:
        param_ess, param_rhat: ``(D,)``, one per entry of ``theta``.
        pred_ess, pred_rhat: ``(B, ...)`` for each posterior-predictive quantity on the
            summarised inputs (``None`` for targets that are not a ``BayesianModel``).
        n_draws, n_chains: samples per chain and chains.
        watched: ``"predictions"`` or ``"parameters"``: which R-hat the warning looks at.
    """

    param_ess: np.ndarray
    param_rhat: np.ndarray
    pred_ess: np.ndarray | None
    pred_rhat: np.ndarray | None
    n_draws: int
    n_chains: int
    watched: str

    @property
    def max_rhat(self) -> float:
        """The largest R-hat of the watched quantities (NaN ones, e.g. constant, ignored)."""
        rhat = self.pred_rhat if self.watched == "predictions" else self.param_rhat
        return float(np.nanmax(rhat)) if np.isfinite(rhat).any() else float("nan")

    def __str__(self) -> str:
        def row(name: str, ess: np.ndarray, rhat: np.ndarray) -> str:
            return (
                f"{name:<12}{ess.size:>8}  {np.nanmin(ess):>9.1f}  {np.nanmedian(ess):>9.1f}"
                f"  {np.nanmedian(rhat):>8.3f}  {np.nanmax(rhat):>8.3f}"
            )

        lines = [
            f"{self.n_chains} chains x {self.n_draws} draws",
            f"{'':<12}{'count':>8}  {'min ESS':>9}  {'med ESS':>9}  {'med Rhat':>8}  "
            f"{'max Rhat':>8}",
            row("parameters", self.param_ess, self.param_rhat),
        ]
        if self.pred_ess is not None and self.pred_rhat is not None:
            lines.append(row("predictions", self.pred_ess, self.pred_rhat))
        return "\n".join(lines)


def summary(
    result: SampleResult,
    x: Tensor | None = None,
    *,
    rhat_threshold: float = RHAT_THRESHOLD,
    warn: bool = True,
) -> Summary:
    """ESS and R-hat of the parameters and, for a ``BayesianModel``, of its predictions.

    Args:
        result: a run of :func:`metasampler.sample` with at least 4 kept samples per chain.
        x: inputs for the predictions (default: the model's training inputs).
        rhat_threshold: warn when the largest watched R-hat exceeds it.
        warn: set ``False`` to only return the numbers.

    Returns:
        A :class:`Summary`; ``print`` it for a table.

    Warns:
        ConvergenceWarning: R-hat above ``rhat_threshold`` for the predictions (a
        ``BayesianModel``) or the parameters (any other target).
    """
    theta = result.theta
    if theta.ndim != 3 or theta.shape[0] < 4:
        raise ValueError(
            "summary needs at least 4 kept samples per chain (result.theta of shape "
            f"(S >= 4, K, D)), got {tuple(theta.shape)}; lower thin or burn_in"
        )
    # One definition of ESS / R-hat: metasampler.diagnostics (bulk ESS as ArviZ's az.ess).
    param_ess = diagnostics.ess(theta, rank_normalize=True)
    param_rhat = diagnostics.split_rhat(theta, rank_normalize=True)
    pred_ess = pred_rhat = None
    target = result.target
    if isinstance(target, BayesianModel):
        draws = target.predict(theta, x).draws  # (S, K, B, ...)
        per_quantity = draws.reshape(draws.shape[0], draws.shape[1], -1)
        pred_ess = diagnostics.ess(per_quantity, rank_normalize=True).reshape(draws.shape[2:])
        pred_rhat = diagnostics.split_rhat(per_quantity, rank_normalize=True).reshape(
            draws.shape[2:]
        )
    report = Summary(
        param_ess,
        param_rhat,
        pred_ess,
        pred_rhat,
        n_draws=theta.shape[0],
        n_chains=theta.shape[1],
        watched="predictions" if pred_rhat is not None else "parameters",
    )
    if warn and report.max_rhat > rhat_threshold:
        warnings.warn(
            f"R-hat of the {report.watched} is up to {report.max_rhat:.2f} (> "
            f"{rhat_threshold}): the {report.n_chains} chains have not converged to the same "
            "distribution; run longer (more steps or burn-in) before trusting the results",
            ConvergenceWarning,
            stacklevel=2,
        )
    return report


def to_inference_data(result: SampleResult) -> Any:
    """``result`` as an ArviZ ``InferenceData`` with ``(chain, draw, ...)`` variables.

    Use :meth:`SampleResult.to_inference_data`; see there for the layout.

    Raises:
        ImportError: ArviZ is not installed (the message gives the install command).
    """
    try:
        import arviz as az
    except ImportError:
        raise ImportError(
            'to_inference_data needs ArviZ: pip install "metasampler[arviz]"'
        ) from None
    theta = result.theta.detach().to("cpu", torch.float64)
    chain_draw = theta.transpose(0, 1)  # (S, K, D) -> (K, S, D): ArviZ's (chain, draw)
    target = result.target
    if isinstance(target, BayesianModel):
        posterior = {
            name: value.numpy() for name, value in target.spec.unflatten(chain_draw).items()
        }
    else:
        posterior = {"theta": chain_draw.numpy()}
    energy = result.energy.detach().to("cpu", torch.float64).transpose(0, 1).numpy()
    return az.from_dict(
        posterior=posterior,
        sample_stats={"energy": energy},
        coords={"draw": result.steps.tolist()},
    )
