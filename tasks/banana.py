"""The banana toy target: the 2-D twisted Gaussian of Haario et al. (1999).

:class:`BananaTask` — ``x1 ~ N(0, a^2)``, ``x2 | x1 ~ N(b (x1^2 - a^2), s^2)``, with exact mean
``(0, 0)`` and covariance ``diag(a^2, s^2 + 2 a^4 b^2)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .toy_base import LOG_2PI, ToyTask, _float_dtype, _is_real, _positive

__all__ = ["BananaTask"]


class BananaTask(ToyTask):
    """2-D twisted Gaussian (Haario, Saksman & Tamminen 1999).

    ``x1 ~ N(0, a^2)``, ``x2 | x1 ~ N(b (x1^2 - a^2), s^2)``, so
    ``U(x) = x1^2 / (2 a^2) + (x2 - b (x1^2 - a^2))^2 / (2 s^2)``.
    Exact moments (``E x1^3 = 0``, ``Var x1^2 = 2 a^4``): ``mean = (0, 0)``,
    ``cov = diag(a^2, s^2 + 2 a^4 b^2)``. The curvature grows with ``|x1|``
    (``d^2 U / d x1^2`` reaches ``~ 4 b^2 x1^2 / s^2``), which makes state-dependent samplers
    and their correction terms matter.

    Args:
        a: standard deviation of ``x1``.
        b: twist.
        s: conditional standard deviation of ``x2``.
    """

    def __init__(
        self,
        a: float = 1.0,
        b: float = 1.0,
        s: float = 1.0,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        dtype = _float_dtype(dtype)
        self.a = _positive("a", a)
        if not (_is_real(b) and math.isfinite(b)):
            raise ValueError(f"b must be a finite number, got {b!r}")
        self.b = float(b)
        self.s = _positive("s", s)
        self.dim = 2
        self.mean = torch.zeros(2, dtype=dtype, device=device)
        var2 = self.s**2 + 2.0 * self.a**4 * self.b**2
        self.cov = torch.diag(torch.tensor([self.a**2, var2], dtype=dtype, device=device))
        self._log_norm = LOG_2PI + math.log(self.a * self.s)

    def _residual(self, theta: Tensor) -> Tensor:
        x1, x2 = theta[:, 0], theta[:, 1]
        return x2 - self.b * (x1 * x1 - self.a**2)

    def _energy(self, theta: Tensor) -> Tensor:
        x1 = theta[:, 0]
        r = self._residual(theta)
        return 0.5 * x1 * x1 / self.a**2 + 0.5 * r * r / self.s**2

    def _grad(self, theta: Tensor) -> Tensor:
        x1 = theta[:, 0]
        r = self._residual(theta) / self.s**2
        return torch.stack((x1 / self.a**2 - 2.0 * self.b * x1 * r, r), dim=-1)

    def _sample(self, n: int, generator: torch.Generator | None) -> Tensor:
        z = torch.randn(n, 2, generator=generator, dtype=self.mean.dtype, device=self.mean.device)
        x1 = self.a * z[:, 0]
        x2 = self.b * (x1 * x1 - self.a**2) + self.s * z[:, 1]
        return torch.stack((x1, x2), dim=-1)

    def __repr__(self) -> str:
        return f"BananaTask(a={self.a}, b={self.b}, s={self.s})"
