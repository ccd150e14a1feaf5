"""The learnable sampler: per-coordinate nets and NNSGHMC."""

from ..nnsghmc_args import GAMMA_MODES, NNSGHMCArgs
from .nets import CoordinateMLP
from .nnsghmc import NNSGHMC, DriftTerms

__all__ = ["CoordinateMLP", "DriftTerms", "GAMMA_MODES", "NNSGHMC", "NNSGHMCArgs"]
