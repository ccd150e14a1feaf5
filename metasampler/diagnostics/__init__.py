"""Sample-quality diagnostics: ESS (several estimators), R-hat, KL divergences, mode coverage.

Every function accepts NumPy arrays or torch tensors (any device, any float dtype; they are
detached and copied to float64 NumPy) and returns NumPy arrays or Python floats. This module
does not import torch.

Shapes. Samples are ``(S, K, D)`` = (samples, chains, dims), as returned by
``metasampler.sample(...).theta``. ``(S, D)`` is read as one chain and ``(S,)`` as one chain of a
scalar; per-dimension functions then return a float instead of a ``(1,)`` array.

Which ESS to use:

* :func:`ess` — the modern default (Geyer initial monotone sequence, chains combined through
  within/between variances as in Stan / Vehtari et al. 2021). *Total* ESS over all chains.
* :func:`ess_beast` — the estimator behind the toy ESS of Gong et al. (ICLR 2019,
  footnote 2: "Implementation follows the ESS function in the BEAST package"). Per chain, then
  **averaged** over chains. Use ``ess_beast_paper`` for the number that is comparable with the
  paper's "NNSGHMC 59 vs SGHMC 22" (see its docstring for what exactly the reference does).
* :func:`ess_batch_means`, :func:`ess_spectral_variance` — ``ESS = n * lambda^2 / sigma^2`` with
  batch-means / Bartlett spectral-variance estimates of the asymptotic variance ``sigma^2``
  (Flegal & Jones 2010; Pal et al., §2.4, Table 1). Total ESS over all chains.
* :func:`multivariate_ess` — Vats, Flegal & Jones (2019), determinant form, batch means.

KL divergences: :func:`gaussian_kl` and :func:`cumulative_gaussian_kl` (Gong et al. 2019, Fig. 2,
toy Gaussian), both through :func:`gaussian_kl_from_moments`; :func:`histogram_kl` (Li et al. 2016,
Fig. 1, 1-D double well) through :func:`histogram_kl_from_counts`, which documents the one direction
convention (``KL_DIRECTIONS``); :func:`mode_coverage` (Zhang et al. 2020, Table 4,
25-Gaussian mixture).

Modules: ``ess`` (autocorrelation, Geyer and BEAST ESS), ``batch_means`` (batch-means and
spectral variance, multivariate ESS), ``rhat``, ``divergences`` (Gaussian and histogram KL),
``modes`` (mode coverage); ``_arrays`` holds the shared input handling.

References:
    Geyer (1992), Practical Markov chain Monte Carlo, Statist. Sci. 7(4).
    Gelman et al. (2013), Bayesian Data Analysis, 3rd ed., §11.4-11.5.
    Vehtari, Gelman, Simpson, Carpenter, Bürkner (2021), Rank-normalization, folding, and
        localization: an improved R-hat, Bayesian Analysis 16(2).
    Flegal & Jones (2010), Batch means and spectral variance estimators in MCMC, Ann. Statist.
    Vats, Flegal & Jones (2019), Multivariate output analysis for MCMC, Biometrika 106(2).
    Vats & Knudson (2021), Revisiting the Gelman-Rubin diagnostic, Statist. Sci. 36(4).
    Rambaut, Drummond et al., BEAST / Tracer, ``dr.inference.trace.TraceCorrelation``.
"""

from __future__ import annotations

from .batch_means import (
    asymptotic_variance_batch_means,
    asymptotic_variance_spectral,
    batch_means_covariance,
    ess_batch_means,
    ess_spectral_variance,
    multivariate_ess,
)
from .divergences import (
    KL_DIRECTIONS,
    cumulative_gaussian_kl,
    gaussian_kl,
    gaussian_kl_from_moments,
    histogram_kl,
    histogram_kl_from_counts,
)
from .ess import autocorrelation, autocovariance, ess, ess_beast, ess_beast_paper
from .modes import mode_coverage
from .rhat import split_rhat

__all__ = [
    "autocorrelation",
    "autocovariance",
    "ess",
    "ess_beast",
    "ess_beast_paper",
    "asymptotic_variance_batch_means",
    "asymptotic_variance_spectral",
    "ess_batch_means",
    "ess_spectral_variance",
    "multivariate_ess",
    "batch_means_covariance",
    "split_rhat",
    "gaussian_kl",
    "gaussian_kl_from_moments",
    "cumulative_gaussian_kl",
    "histogram_kl",
    "histogram_kl_from_counts",
    "KL_DIRECTIONS",
    "mode_coverage",
]
