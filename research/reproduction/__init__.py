"""Reproductions of the seed papers' baseline results, one module per experiment.

=================  ================================================  =====================
experiment         what                                              module
=================  ================================================  =====================
``mixture25``      25-Gaussian mode coverage (seed 000 Table 4)      ``mixture25.py``
``blr``            logistic-regression ESS (seed 000 Table 5)        ``blr.py``
``double_well``    mSGNHT Euler vs splitting KL (seed 001 Fig. 1-2)  ``double_well.py``
``mixture4``       4-Gaussian sample statistics (seed 002 Table 1)   ``mixture4.py``
``bnn_regression`` BNN regression RMSE/NLL/mESS (seed 002 Table 2)   ``bnn_regression.py``
=================  ================================================  =====================

Each module exposes a config dataclass, ``validate(cfg)`` and ``run(cfg) -> ExperimentOutput``;
``reproduce.py`` at the repository root is the command line.
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXPERIMENTS: dict[str, tuple[str, str]] = {
    "mixture25": ("mixture25", "Mixture25Config"),
    "blr": ("blr", "BLRConfig"),
    "double_well": ("double_well", "DoubleWellConfig"),
    "mixture4": ("mixture4", "Mixture4Config"),
    "bnn_regression": ("bnn_regression", "BNNRegressionConfig"),
}

__all__ = ["EXPERIMENTS", "experiment_module"]


def experiment_module(name: str) -> ModuleType:
    """The module of experiment ``name`` (imported on first use)."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose from {sorted(EXPERIMENTS)}")
    return importlib.import_module(f".{EXPERIMENTS[name][0]}", __name__)
