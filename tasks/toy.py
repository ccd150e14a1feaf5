"""The toy sampling targets with exact densities and moments (docs/METHOD.md §5), in one
place to import them from.

Each lives in its own module (the shared base class and argument checks in
:mod:`tasks.toy_base`):

* :mod:`tasks.gaussian` — :class:`GaussianTask`, :func:`gaussian`, :func:`gaussian_2d`,
  :func:`paper_train_gaussian`, :func:`paper_test_gaussian` (Gong et al. 2019, §5.1, appendix F.1);
* :mod:`tasks.double_well` — :class:`DoubleWell` (Li et al. 2016, §3);
* :mod:`tasks.mixture` — :class:`GaussianMixtureTask`, :func:`mixture_25` (Zhang et al. 2020, §5.1),
  :func:`mixture_4` (Pal et al., §5.1);
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
