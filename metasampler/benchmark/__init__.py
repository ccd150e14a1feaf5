"""Sampler benchmarks.

The transfer-generalisation benchmark of Bayesian neural networks (Gong et al. 2019, §5.2, Table 1,
Fig. 3) behind ``evaluate.py``, one concern per module:

* :mod:`.metrics`: ensemble / posterior-average metrics (error, NLL, ECE, entropy; per frame
  for sequence tasks), :class:`RunningAverage`, :func:`mean_se`;
* :mod:`.methods`: the method registry :data:`METHODS` (config section schema, builder,
  lr -> eta order, tuned parameter), :func:`build_method`;
* :mod:`.protocol`: the warm-up phase and NNSGHMC's ``alpha`` (Gong et al.'s MNIST protocol),
  :class:`MethodFactory`;
* :mod:`.tuning`: :func:`tune_step_size` (grid + automatic extension beyond an end);
* :mod:`.run`: one method, one seed (:func:`run_method`, :class:`MethodRunner`);
* :mod:`.transfer`: tuning and the seed loop of every method (:func:`run_benchmark`);
* :mod:`.results`, :mod:`.tables`, :mod:`.plots`, :mod:`.publish`: the result document, the
  tables, the figures and the result files (:func:`write_results`);
* :mod:`.synthetic`: a data-free classification problem for tests and smoke runs;
* :mod:`.gaussian`: the toy Gaussian benchmark (Gong et al. 2019, §5.1, :func:`gaussian_benchmark`);

Conventions: "lr" is the optimiser-style per-batch learning rate of docs/METHOD.md §1, converted to
the SDE step ``eta`` by :mod:`metasampler.stepsize` (``lr / N`` for SGLD, pSGLD, SGD-M, Adam;
``sqrt(lr / N)`` for SGHMC, mSGNHT, NNSGHMC). Friction-type constants are given per step
(``momentum_decay = eta * C``, the paper's 0.01), so they follow the tuned step.
"""

from .gaussian import gaussian_benchmark
from .methods import METHODS, BuildContext, MethodGrid, MethodSpec, build_method
from .metrics import (
    RunningAverage,
    calibration_bins,
    ensemble_log_probs,
    ensemble_log_probs_from_lp,
    ensemble_metrics,
    error_rate,
    expected_calibration_error,
    frame_metrics,
    frame_targets,
    is_sequence_model,
    mean_se,
    member_and_ensemble_nll,
    member_nll,
    metrics_from_log_probs,
    negative_log_likelihood,
    predict_frame_log_probs,
    predict_log_probs,
    predictive_entropy,
)
from .plots import plot_calibration, plot_entropy_cdf, plot_learning_curves
from .protocol import MethodFactory, apply_warmup
from .publish import RESULT_FILES, write_results
from .results import FINAL_METRICS, BenchmarkResult, merge_seed_results
from .run import EvalSet, MethodRun, MethodRunner, run_method
from .synthetic import SyntheticProblem, synthetic_classification_problem
from .tables import format_mean_se, markdown_table
from .transfer import MethodBenchmark, run_benchmark
from .tuning import TuneResult, TuningError, tune_step_size

__all__ = [
    "FINAL_METRICS",
    "METHODS",
    "RESULT_FILES",
    "BenchmarkResult",
    "BuildContext",
    "EvalSet",
    "MethodBenchmark",
    "MethodFactory",
    "MethodGrid",
    "MethodRun",
    "MethodRunner",
    "MethodSpec",
    "RunningAverage",
    "SyntheticProblem",
    "TuneResult",
    "TuningError",
    "apply_warmup",
    "build_method",
    "calibration_bins",
    "ensemble_log_probs",
    "ensemble_log_probs_from_lp",
    "ensemble_metrics",
    "error_rate",
    "expected_calibration_error",
    "format_mean_se",
    "frame_metrics",
    "frame_targets",
    "gaussian_benchmark",
    "is_sequence_model",
    "markdown_table",
    "mean_se",
    "member_and_ensemble_nll",
    "member_nll",
    "merge_seed_results",
    "metrics_from_log_probs",
    "negative_log_likelihood",
    "plot_calibration",
    "plot_entropy_cdf",
    "plot_learning_curves",
    "predict_frame_log_probs",
    "predict_log_probs",
    "predictive_entropy",
    "run_benchmark",
    "run_method",
    "synthetic_classification_problem",
    "tune_step_size",
    "write_results",
]
