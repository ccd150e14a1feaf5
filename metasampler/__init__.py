"""metasampler: meta-learned SG-MCMC samplers for PyTorch.

Quick start::

    import torch, metasampler as ms
    target = ms.EnergyTarget(lambda x: 0.5 * (x**2).sum(-1), dim=10)
    result = ms.sample(ms.samplers.SGHMC(eta=0.05, friction=1.0), target, n_chains=20,
                       n_steps=2000, burn_in=500, seed=0)
    result.theta.shape  # (S, K, D)
"""

from . import benchmark, diagnostics, distributed, meta, samplers, schedules
from ._version import __version__ as __version__
from .adapt import Adapt, AdaptResult
from .bayesian import BayesianModel, Predictive, assign_params, flatten_params, unflatten_params
from .devices import DeviceError
from .export import SamplerFileError, load_sampler, pretrained_samplers
from .learned import NNSGHMC
from .posterior import ConvergenceWarning, Summary, summary
from .sampling import SampleResult, sample
from .targets import EnergyTarget, Evaluation, NonFiniteError, Target

__all__ = [
    "Adapt",
    "AdaptResult",
    "BayesianModel",
    "ConvergenceWarning",
    "DeviceError",
    "NNSGHMC",
    "Predictive",
    "Summary",
    "assign_params",
    "pretrained_samplers",
    "summary",
    "SamplerFileError",
    "benchmark",
    "diagnostics",
    "distributed",
    "flatten_params",
    "load_sampler",
    "meta",
    "unflatten_params",
    "EnergyTarget",
    "Evaluation",
    "NonFiniteError",
    "SampleResult",
    "Target",
    "sample",
    "samplers",
    "schedules",
]
