"""The toy sampling targets with exact densities and moments (SPEC §4 toy settings, §5), in one
place to import them from.

Each lives in its own module (the shared base class and argument checks in
:mod:`tasks.toy_base`):

* :mod:`tasks.gaussian` — :class:`GaussianTask`, :func:`gaussian`, :func:`gaussian_2d`,
  :func:`paper_train_gaussian`, :func:`paper_test_gaussian` (paper 004 §5.1, F.1);
* :mod:`tasks.double_well` — :class:`DoubleWell` (paper 001 §3);
* :mod:`tasks.mixture` — :class:`GaussianMixtureTask`, :func:`mixture_25` (paper 000 §5.1),
  :func:`mixture_4` (paper 002 §5.1);
* :mod:`tasks.banana` — :class:`BananaTask` (Haario et al. 1999).
"""

from __future__ import annotations

from .banana import BananaTask
from .double_well import DoubleWell
from .gaussian import (
    GaussianTask,
    gaussian,
    gaussian_2d,
    paper_test_gaussian,
    paper_train_gaussian,
)
from .mixture import GaussianMixtureTask, mixture_4, mixture_25
from .toy_base import ToyTask

__all__ = [
    "ToyTask",
    "GaussianTask",
    "gaussian",
    "gaussian_2d",
    "paper_train_gaussian",
    "paper_test_gaussian",
    "DoubleWell",
    "GaussianMixtureTask",
    "mixture_25",
    "mixture_4",
    "BananaTask",
]
