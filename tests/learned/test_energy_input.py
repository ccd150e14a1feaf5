"""``energy_input``: what the nets see of the energy, and Gamma's chain rule through it."""

from __future__ import annotations

import pytest
import torch

import metasampler as ms
from metasampler.learned import NNSGHMC
from tasks.toy import gaussian


def _sampler(energy_input: str) -> NNSGHMC:
    # Nets that depend strongly on the energy, so a wrong factor in Gamma shows.
    return NNSGHMC(
        eta=0.01, q_hidden=(8,), d_hidden=(8,), energy_input=energy_input, seed=3,
        energy_input_scale=2.0,
    ).double()  # fmt: skip


def _diag_jacobian(fn, x: torch.Tensor) -> torch.Tensor:
    """``d fn(x)_{k,i} / d x_{k,i}`` for a ``(K, D)`` map."""
    jac = torch.autograd.functional.jacobian(fn, x)  # (K, D, K, D)
    k, d = x.shape
    return jac.reshape(k * d, k * d).diagonal().reshape(k, d)


@pytest.mark.parametrize("energy_input", ["per_datum", "per_coordinate"])
def test_gamma_is_the_divergence_of_the_learned_matrices(energy_input):
    # Gamma_p,i = d Q_f,i / d theta_i + d D_f,i / d p_i and Gamma_theta,i = -d Q_f,i / d p_i
    # (SPEC §3): computed by autograd through the whole input pipeline, they must equal the
    # sampler's own Gamma, whichever scaling the energy input gets.
    sampler = _sampler(energy_input)
    task = gaussian(3, mean=1.0, cov="correlated", seed=0)
    target = task.target(0.0, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(2, 3, generator=gen, dtype=torch.float64)
    p = torch.randn(2, 3, generator=gen, dtype=torch.float64)
    terms = sampler.drift_terms(theta, p, target)

    def q_of_theta(x):
        return sampler.drift_terms(x, p, target).q

    def q_of_p(m):
        return sampler.drift_terms(theta.requires_grad_(False), m, target).q

    def d_of_p(m):
        return sampler.drift_terms(theta, m, target).d

    dq_dtheta = _diag_jacobian(q_of_theta, theta.clone().requires_grad_(True))
    gamma_p = dq_dtheta + _diag_jacobian(d_of_p, p.clone())
    gamma_theta = -_diag_jacobian(q_of_p, p.clone())
    torch.testing.assert_close(terms.gamma_p, gamma_p, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(terms.gamma_theta, gamma_theta, rtol=1e-6, atol=1e-9)
    assert dq_dtheta.abs().max() > 1e-3  # the energy path is exercised


def test_per_coordinate_input_has_the_same_scale_in_any_dimension():
    # Standard Gaussians of 10 and 40 dimensions at equilibrium: the per-datum energy input
    # grows with D (about D / 2), the per-coordinate one stays near 1/2, so a sampler trained
    # in 10-D sees at test in 40-D the inputs it was trained on.
    means = {}
    for energy_input in ("per_datum", "per_coordinate"):
        sampler = _sampler(energy_input)
        for dim in (10, 40):
            task = gaussian(dim, mean=0.0, cov="identity")
            target = task.target(0.0, dtype=torch.float64)
            theta = torch.randn(4000, dim, generator=torch.Generator().manual_seed(dim),
                                dtype=torch.float64)  # fmt: skip
            u, _ = sampler._energy_input(target.evaluate(theta, None), target)
            means[energy_input, dim] = float(u.mean()) / sampler.energy_input_scale
    assert means["per_datum", 10] == pytest.approx(5.0, rel=0.05)
    assert means["per_datum", 40] == pytest.approx(20.0, rel=0.05)
    assert means["per_coordinate", 10] == pytest.approx(0.5, rel=0.05)
    assert means["per_coordinate", 40] == pytest.approx(0.5, rel=0.05)


def test_energy_input_round_trips_through_a_file(tmp_path):
    path = tmp_path / "s.safetensors"
    _sampler("per_coordinate").save(path)
    assert ms.load_sampler(path).energy_input == "per_coordinate"
    # Files written before the argument existed (format 2, e.g. the shipped samplers before
    # their upgrade) load with the behaviour they were trained with.
    assert ms.load_sampler("toy_gaussian").energy_input == "per_datum"
