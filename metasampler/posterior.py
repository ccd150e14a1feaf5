"""What a practitioner does with a finished run: a convergence summary and ArviZ export.

:func:`summary` reports the bulk ESS and the rank-normalised split R-hat (Vehtari et al. 2021,
computed by :mod:`metasampler.diagnostics`) of every parameter and, for a
:class:`~metasampler.BayesianModel`, of every posterior-predictive quantity (the class
probabilities of each example, ...). It warns with :class:`ConvergenceWarning` when R-hat is
high, looking at what is identifiable:

* For a neural network (a hidden layer: outputs nonlinear in the parameters), the warning
  looks at the predictions, not the weights: hidden units can be permuted (and signs flipped)
  without changing the function, so chains started apart sit in different but equivalent
  weight modes and weight R-hat stays far above 1 even when the predictions agree.
* For a model whose outputs are affine in its parameters (a linear or logistic regression,
  softmax regression, regression on fixed features) with a built-in likelihood, the
  log-likelihood is concave in the parameters and the prior Gaussian, so the posterior is
  log-concave: one mode, no equivalent copies. Chains that disagree on the parameters have
  not mixed even where the predictions on the data hardly differ, so the warning looks at
  the parameters.

:func:`to_inference_data` converts a run to ArviZ's ``InferenceData`` (an optional extra:
``pip install "metasampler[arviz]"``), swapping ``(samples, chains)`` to ArviZ's
``(chain, draw)``.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from . import diagnostics
from .bayesian import BayesianModel, ParamSpec

__all__ = [
    "APART_THRESHOLD",
    "ConvergenceWarning",
    "Summary",
    "WATCH_CHOICES",
    "outputs_affine_in_parameters",
    "summary",
    "to_inference_data",
]

#: What :func:`summary`'s warning can look at.
WATCH_CHOICES = ("auto", "parameters", "predictions")
# The built-in likelihoods, each concave in the module's outputs.
_LOG_CONCAVE = ("categorical", "gaussian", "bernoulli", "bernoulli_sequence")

#: The classic rule of thumb (Gelman et al., Bayesian Data Analysis, 3rd ed., §11.4). The
#: warning looks at the largest R-hat of many quantities (every class probability of every
#: example), which exceeds Vehtari et al.'s (2021) stricter 1.01 by chance alone in runs of a
#: few hundred draws; pass ``rhat_threshold=1.01`` for final results.
RHAT_THRESHOLD = 1.1

#: A chain stands apart when its mean of a quantity is more than this many within-chain
#: standard deviations (the chains' median) from the median of the chains' means.
APART_THRESHOLD = 5.0


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
        apart: the chains whose mean of the watched quantity with the largest R-hat stands
            apart from the others' (:data:`APART_THRESHOLD` within-chain standard deviations
            from their median; a chain stuck where the others left, for instance), when they
            are fewer than half the chains; empty otherwise.
    """

    param_ess: np.ndarray
    param_rhat: np.ndarray
    pred_ess: np.ndarray | None
    pred_rhat: np.ndarray | None
    n_draws: int
    n_chains: int
    watched: str
    apart: tuple[int, ...] = ()

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
        if self.apart:
            lines.append(f"chains apart from the others: {', '.join(map(str, self.apart))}")
        return "\n".join(lines)


def summary(
    result: SampleResult,
    x: Tensor | None = None,
    *,
    rhat_threshold: float = RHAT_THRESHOLD,
    warn: bool = True,
    watch: str = "auto",
) -> Summary:
    """ESS and R-hat of the parameters and, for a ``BayesianModel``, of its predictions.

    Args:
        result: a run of :func:`metasampler.sample` with at least 4 kept samples per chain.
        x: inputs for the predictions (default: the model's training inputs).
        rhat_threshold: warn when the largest watched R-hat exceeds it.
        warn: set ``False`` to only return the numbers.
        watch: which R-hat the warning looks at. ``"auto"`` (default): the parameters of a
            target that is not a ``BayesianModel``, and of a ``BayesianModel`` with a built-in
            likelihood whose module's outputs are affine in the parameters (a regression
            without hidden layers: its posterior is log-concave, so the parameters are
            identified); the predictions otherwise (hidden layers, whose permuted units give
            equivalent weight modes, or a custom likelihood). Affinity is checked
            numerically: the outputs on (up to 64 of) the inputs, in float64, at the
            posterior mean and at unit steps along two fixed random directions, must have
            zero second differences. ``"parameters"`` or ``"predictions"`` choose directly.

    Returns:
        A :class:`Summary` (its ``watched`` says which was watched); ``print`` it for a table.

    Raises:
        TypeError: ``result`` is not a run's result (no ``theta`` tensor).
        ValueError: too few samples (none: a run with ``store=False``); ``watch`` not one
            of :data:`WATCH_CHOICES`; or ``watch="predictions"`` for a target that is not a
            ``BayesianModel``.

    Warns:
        ConvergenceWarning: the largest watched R-hat is above ``rhat_threshold``.
    """
    theta = getattr(result, "theta", None)
    if not isinstance(theta, Tensor):
        raise TypeError(
            "summary needs the result of metasampler.sample (a SampleResult), got "
            f"{type(result).__name__}"
        )
    _require_samples(theta, "summary")
    if theta.ndim != 3 or theta.shape[0] < 4:
        raise ValueError(
            "summary needs at least 4 kept samples per chain (result.theta of shape "
            f"(S >= 4, K, D)), got {tuple(theta.shape)}; lower thin or burn_in"
        )
    if watch not in WATCH_CHOICES:
        raise ValueError(f"watch must be one of {WATCH_CHOICES}, got {watch!r}")
    target = result.target
    is_model = isinstance(target, BayesianModel)
    if watch == "predictions" and not is_model:
        raise ValueError(
            "watch='predictions' needs a BayesianModel target (its predictions); this run's "
            f"target is {type(target).__name__}"
        )
    # One definition of ESS / R-hat: metasampler.diagnostics (bulk ESS as ArviZ's az.ess).
    param_ess = diagnostics.ess(theta, rank_normalize=True)
    param_rhat = diagnostics.split_rhat(theta, rank_normalize=True)
    pred_ess = pred_rhat = None
    if is_model:
        draws = target.predict(theta, x).draws  # (S, K, B, ...)
        per_quantity = draws.reshape(draws.shape[0], draws.shape[1], -1)
        pred_ess = diagnostics.ess(per_quantity, rank_normalize=True).reshape(draws.shape[2:])
        pred_rhat = diagnostics.split_rhat(per_quantity, rank_normalize=True).reshape(
            draws.shape[2:]
        )
    if watch == "auto":
        identified = not is_model or (
            target.likelihood in _LOG_CONCAVE and outputs_affine_in_parameters(target, theta, x)
        )
        watch = "parameters" if identified else "predictions"
    watched = theta if watch == "parameters" else per_quantity
    rhat = param_rhat if watch == "parameters" else pred_rhat.ravel()
    worst = int(np.nanargmax(rhat)) if np.isfinite(rhat).any() else None
    report = Summary(
        param_ess,
        param_rhat,
        pred_ess,
        pred_rhat,
        n_draws=theta.shape[0],
        n_chains=theta.shape[1],
        watched=watch,
        apart=() if worst is None else _chains_apart(watched[:, :, worst].detach().double()),
    )
    if warn and report.max_rhat > rhat_threshold:
        where = ""
        if watch == "parameters" and is_model and worst is not None:
            layout = ParamSpec.from_module(target.module)  # the model's own flat layout
            where = f" (largest for {_parameter_name(layout, worst)})"
        apart = ""
        if report.apart:
            chains = ", ".join(str(k) for k in report.apart)
            many = len(report.apart) > 1
            subject = f"chains {chains} stand" if many else f"chain {chains} stands"
            apart = f"; {subject} apart from the others (Summary.apart)"
        # one chain's split R-hat compares its two halves
        compared = f"the {report.n_chains} chains" if report.n_chains > 1 else "the chain's halves"
        warnings.warn(
            f"R-hat of the {report.watched} is up to {report.max_rhat:.2f} (> "
            f"{rhat_threshold}){where}: {compared} have not converged to the "
            f"same distribution{apart}; run longer (more steps or burn-in) before trusting the "
            "results",
            ConvergenceWarning,
            stacklevel=2,
        )
    return report


def _chains_apart(series: Tensor) -> tuple[int, ...]:
    """The chains of ``series`` ``(S, K)`` whose mean is more than :data:`APART_THRESHOLD`
    within-chain standard deviations from the median of the chains' means, when fewer than
    half the chains are (where most disagree, no chain is the odd one out)."""
    means, sds = series.mean(0), series.std(0)
    scale = float(sds.median())
    if not scale > 0:
        return ()
    far = ((means - means.median()).abs() / scale > APART_THRESHOLD).nonzero().ravel()
    return tuple(int(k) for k in far) if 2 * len(far) < series.shape[1] else ()


def outputs_affine_in_parameters(
    model: BayesianModel, theta: Tensor, x: Tensor | None = None
) -> bool:
    """Whether ``model``'s outputs on ``x`` are an affine function of its parameters (a model
    without hidden layers), checked numerically.

    The module, in float64, is evaluated on up to 64 rows of ``x`` (default: the training
    inputs) at the mean of ``theta`` (``(S, K, D)`` or ``(K, D)``), at unit steps ``±u``,
    ``±v`` along two fixed random directions and at ``+u+v``; every second difference must
    vanish (to ``1e-6`` of the outputs' size). A module that fails in float64 counts as not
    affine.
    """
    rows = (model.x if x is None else x)[:64]
    rows = rows.to(model.device, torch.float64) if rows.is_floating_point() else rows
    center = theta.detach().reshape(-1, theta.shape[-1]).double().mean(0).cpu()
    u, v = torch.randn(
        2, center.shape[0], generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    points = torch.stack([center, center + u, center - u, center + v, center - v, center + u + v])
    try:
        module = copy.deepcopy(model.module).to(device=model.device, dtype=torch.float64)
        buffers = dict(module.named_buffers())
        spec: ParamSpec = model.spec
        with torch.no_grad():
            outputs = torch.stack(
                [
                    torch.func.functional_call(
                        module, (spec.unflatten(point.to(model.device)), buffers), (rows,)
                    )
                    for point in points
                ]
            )
    except Exception:  # (a module that cannot run so: not known to be affine)
        return False
    if not bool(torch.isfinite(outputs).all()):
        return False
    f0, fu, fmu, fv, fmv, fuv = outputs
    second = torch.stack([fu + fmu - 2 * f0, fv + fmv - 2 * f0, fuv - fu - fv + f0])
    return float(second.abs().max()) <= 1e-6 * float(outputs.abs().max())


def _parameter_name(spec: ParamSpec, index: int) -> str:
    """The module's name for entry ``index`` of the flat vector, e.g. ``0.weight[1, 2]``."""
    layout = zip(spec.names, spec.shapes, spec.offsets, spec.numels, strict=True)
    for name, shape, offset, numel in layout:
        if offset <= index < offset + numel:
            position = np.unravel_index(index - offset, tuple(shape)) if len(shape) else ()
            return f"{name}[{', '.join(str(int(i)) for i in position)}]" if position else name
    return f"theta[{index}]"


def _require_samples(theta: Tensor, what: str) -> None:
    """Stop with a clear message where a run kept no samples (``sample(..., store=False)``)."""
    if theta.ndim == 3 and theta.shape[0] == 0:
        raise ValueError(
            f"{what}: the result holds no samples (sample(..., store=False) keeps none; "
            "pass store=True, or collect the samples with callback=)"
        )


def to_inference_data(result: SampleResult) -> Any:
    """``result`` as an ArviZ ``InferenceData`` with ``(chain, draw, ...)`` variables.

    Use :meth:`SampleResult.to_inference_data`; see there for the layout.

    Raises:
        ImportError: ArviZ is not installed (the message gives the install command).
        ValueError: the result holds no samples (a run with ``store=False``).
    """
    try:
        import arviz as az
    except ImportError:
        raise ImportError(
            'to_inference_data needs ArviZ: pip install "metasampler[arviz]"'
        ) from None
    _require_samples(result.theta, "to_inference_data")
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
