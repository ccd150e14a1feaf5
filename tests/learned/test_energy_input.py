"""What the nets see of the energy (per coordinate for an energy without data, per datum for a
model of data), and Gamma's chain rule through it."""

from __future__ import annotations

import pytest
import torch

from metasampler.learned import NNSGHMC
from tasks.toy import gaussian


def _sampler(curl_input: str) -> NNSGHMC:
    # Nets that depend strongly on the energy, so a wrong factor in Gamma shows.
    sampler = NNSGHMC(
        eta=0.01, q_hidden=(8,), d_hidden=(8,), curl_input=curl_input, seed=3, compile=False
    ).double()
    sampler.energy_std.fill_(0.5)
    return sampler


def _diag_jacobian(fn, x: torch.Tensor) -> torch.Tensor:
    """``d fn(x)_{k,i} / d x_{k,i}`` for a ``(K, D)`` map."""
    jac = torch.autograd.functional.jacobian(fn, x)  # (K, D, K, D)
    k, d = x.shape
    return jac.reshape(k * d, k * d).diagonal().reshape(k, d)


@pytest.mark.parametrize("curl_input", ["stiffness", "momentum"])
def test_gamma_is_the_divergence_of_the_learned_matrices(curl_input):
    # Gamma_p,i = d Q_f,i / d theta_i + d D_f,i / d p_i and Gamma_theta,i = -d Q_f,i / d p_i
    # (docs/METHOD.md §3): computed by autograd through the whole input pipeline, they must
    # equal the sampler's own Gamma, whatever the curl sees.
    sampler = _sampler(curl_input)
    task = gaussian(3, mean=1.0, cov="correlated", seed=0)
    target = task.target(0.0, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(2, 3, generator=gen, dtype=torch.float64)
    p = torch.randn(2, 3, generator=gen, dtype=torch.float64)
    # (the stiffness statistic of each chain: a constant of z)
    kw = {"grad_sq": torch.tensor([[0.3, 2.0, 9.0], [1.0, 1.0, 40.0]], dtype=torch.float64)}
    kw = kw if curl_input == "stiffness" else {}
    terms = sampler.drift_terms(theta, p, target, **kw)

    def q_of_theta(x):
        return sampler.drift_terms(x, p, target, **kw).q

    def q_of_p(m):
        return sampler.drift_terms(theta.requires_grad_(False), m, target, **kw).q

    def d_of_p(m):
        return sampler.drift_terms(theta, m, target, **kw).d

    dq_dtheta = _diag_jacobian(q_of_theta, theta.clone().requires_grad_(True))
    gamma_p = dq_dtheta + _diag_jacobian(d_of_p, p.clone())
    gamma_theta = -_diag_jacobian(q_of_p, p.clone())
    torch.testing.assert_close(terms.gamma_p, gamma_p, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(terms.gamma_theta, gamma_theta, rtol=1e-6, atol=1e-9)
    assert dq_dtheta.abs().max() > 1e-3  # the energy path is exercised
    assert (gamma_theta.abs().max() > 1e-3) == (curl_input == "momentum")


class _DataModel:
    """An energy presented as a model of ``n_data`` data (not an ``EnergyTarget``)."""

    def __init__(self, inner, n_data: int) -> None:
        self.inner, self.dim, self.n_data = inner, inner.dim, n_data

    def evaluate(self, theta, generator=None, create_graph=False):
        return self.inner.evaluate(theta, generator, create_graph)


def test_the_energy_input_is_per_coordinate_without_data_and_per_datum_with_data():
    # Standard Gaussians of 10 and 40 dimensions at equilibrium (U about D / 2): an energy
    # without data enters per coordinate (about 1/2 in any dimension, so a sampler trained in
    # 10-D sees at test in 40-D the inputs it was trained on); the same energy as a model of
    # N = 5 data enters per datum (U / N, about D / 10).
    sampler = _sampler("stiffness")
    sampler.energy_std.fill_(1.0)
    means = {}
    for dim in (10, 40):
        target = gaussian(dim, mean=0.0, cov="identity").target(0.0, dtype=torch.float64)
        theta = torch.randn(4000, dim, generator=torch.Generator().manual_seed(dim),
                            dtype=torch.float64)  # fmt: skip
        for name, t in (("energy", target), ("data", _DataModel(target, 5))):
            u, _ = sampler._energy_input(t.evaluate(theta, None), t)
            means[name, dim] = float(u.mean())
    assert means["energy", 10] == pytest.approx(0.5, rel=0.05)
    assert means["energy", 40] == pytest.approx(0.5, rel=0.05)
    assert means["data", 10] == pytest.approx(1.0, rel=0.05)
    assert means["data", 40] == pytest.approx(4.0, rel=0.05)
