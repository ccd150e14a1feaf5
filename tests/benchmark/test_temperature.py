"""metasampler.benchmark.temperature: the virial's temperature of chain states."""

from __future__ import annotations

import pytest
import torch

from metasampler import BayesianModel
from metasampler.benchmark.temperature import (
    configurational_temperature,
    coordinate_virials,
    layer_slices,
    noise_heat,
    parameter_slices,
)
from metasampler.targets import EnergyTarget


def _correlated_gaussian(dim: int) -> tuple[EnergyTarget, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    root = torch.randn(dim, dim, generator=gen, dtype=torch.float64) / dim**0.5
    cov = root @ root.T + 0.1 * torch.eye(dim, dtype=torch.float64)
    precision = torch.linalg.inv(cov)

    def energy(theta: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((theta @ precision) * theta).sum(-1)

    return EnergyTarget(energy, dim), torch.linalg.cholesky(cov)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_exact_samples_of_exp_minus_u_over_t_read_t(temperature: float) -> None:
    # Exact draws of exp(-U / T) for a correlated Gaussian U: the chains' mean reads T within
    # its sampling error (~1 % with 4,000 chains x 50 dimensions), and no other temperature.
    target, chol = _correlated_gaussian(50)
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(4000, 50, generator=gen, dtype=torch.float64)
    theta = temperature**0.5 * z @ chol.T
    read = configurational_temperature(target, theta)
    assert read.shape == (4000,)
    assert abs(float(read.mean()) / temperature - 1.0) < 0.03
    # ... and so does every coordinate on its own, within 4 standard errors of its mean
    virials = coordinate_virials(target, theta)
    se = virials.std(0) / 4000**0.5
    assert ((virials.mean(0) - temperature).abs() < 4 * se).all()
    assert (se < 0.15 * temperature).all()  # (the check has power)


def test_a_network_reads_the_derivative_of_its_energy_along_the_ray() -> None:
    # theta . grad U(theta) is d/ds U(s theta) at s = 1: checked against a central difference
    # of the full-data energy of a small Bayesian MLP (all its data, prior included).
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(64, 3, generator=gen, dtype=torch.float64)
    y = (x[:, 0] > 0).long()
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    target = BayesianModel(net.double(), (x, y), batch_size=16)
    theta = torch.randn(3, target.dim, generator=gen, dtype=torch.float64)
    h = 1e-5
    ray = (target.energy((1 + h) * theta) - target.energy((1 - h) * theta)) / (2 * h)
    torch.testing.assert_close(configurational_temperature(target, theta), ray / target.dim)


def test_positions_must_be_chains_by_dimensions() -> None:
    target, _ = _correlated_gaussian(3)
    with pytest.raises(ValueError, match="chains, dim"):
        configurational_temperature(target, torch.zeros(3))


def test_parameter_slices_give_one_group_without_a_parameter_layout() -> None:
    target = EnergyTarget(lambda theta: (theta * theta).sum(-1) / 2, dim=5)
    assert parameter_slices(target) == [("theta", slice(0, 5))]
    net = BayesianModel(
        torch.nn.Linear(3, 2), (torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    )
    assert [(name, part.stop - part.start) for name, part in parameter_slices(net)] == [
        ("weight", 6), ("bias", 2)
    ]  # fmt: skip


def test_layer_slices_join_each_modules_weight_and_bias() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x, y = torch.zeros(5, 3), torch.zeros(5, dtype=torch.long)
    layers = layer_slices(BayesianModel(net, (x, y)))
    assert layers == [("0", slice(0, 16)), ("2", slice(16, 26))]
    target = EnergyTarget(lambda theta: (theta * theta).sum(-1) / 2, dim=5)
    assert layer_slices(target) == [("theta", slice(0, 5))]


def test_noise_heat_is_eta_q2_v_over_2d_from_an_unbiased_estimate_of_v() -> None:
    # Gradient noise of SD 3 (V = 9) on every coordinate; Q = 2 and D = 0.5 on the first half,
    # Q = 1 and D = 1 on the second: h = eta Q^2 V / (2 D) = 0.036 and 0.0045 at eta = 0.001.
    target = EnergyTarget(lambda x: 0.5 * x.square().sum(-1), 2000, grad_noise_std=3.0)
    theta = torch.zeros(4, 2000)
    half = torch.arange(2000) < 1000
    curl, friction = torch.where(half, 2.0, 1.0).expand(4, -1), torch.where(half, 0.5, 1.0)
    gen = torch.Generator().manual_seed(0)
    heat = noise_heat(target, theta, curl, friction.expand(4, -1), 0.001, draws=8, generator=gen)
    assert heat.shape == (4, 2000)
    assert float(heat[:, :1000].mean()) == pytest.approx(0.036, rel=0.03)
    assert float(heat[:, 1000:].mean()) == pytest.approx(0.0045, rel=0.03)
    with pytest.raises(ValueError, match="draws"):
        noise_heat(target, theta, curl, friction, 0.001, draws=0)
