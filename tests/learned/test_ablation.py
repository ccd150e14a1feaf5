"""The constant-nets ablation (:mod:`metasampler.learned.ablation`): the same sampler with each
net replaced by its mean output."""

from __future__ import annotations

import pytest
import torch
from statistical import random_gaussian

from metasampler.learned import NNSGHMC
from metasampler.learned.ablation import net_means, stored_net_means, with_constant_nets

MEANS = {"q": 0.7, "f_d": 0.4}


def trained_like(**kwargs) -> NNSGHMC:
    """A sampler whose nets vary strongly with their inputs."""
    sampler = NNSGHMC(eta=0.05, q_hidden=(8,), d_hidden=(8,), alpha=0.02, seed=1, **kwargs)
    with torch.no_grad():
        for p in sampler.parameters():
            p.mul_(2.0)
    return sampler.double()


@pytest.mark.parametrize(
    "design",
    [dict(curl_input="stiffness", thermostat=True), dict(curl_input="momentum", thermostat=False)],
    ids=["default", "paper"],
)
def test_constant_nets_give_the_means_everywhere_and_no_gamma(design):
    target = random_gaussian(dim=4).target()
    sampler = trained_like(**design)
    constant = with_constant_nets(sampler, MEANS)
    gen = torch.Generator().manual_seed(0)
    grad_sq = torch.rand(6, 4, generator=gen, dtype=torch.float64) * 10  # (the stiffness input)
    kwargs = {"grad_sq": grad_sq} if design["curl_input"] == "stiffness" else {}
    for scale in (0.1, 1.0, 5.0):  # states near and far
        theta = scale * torch.randn(6, 4, generator=gen, dtype=torch.float64)
        p = scale * torch.randn(6, 4, generator=gen, dtype=torch.float64)
        terms = constant.drift_terms(theta.requires_grad_(True), p, target, **kwargs)
        # Q_f = mean q; eta D_f = alpha Q_f^2 + s_D mean f_D
        torch.testing.assert_close(terms.q, torch.full_like(terms.q, MEANS["q"]))
        per_step = constant.alpha * MEANS["q"] ** 2 + constant.friction_scale * MEANS["f_d"]
        torch.testing.assert_close(terms.d, torch.full_like(terms.d, per_step / constant.eta))
        assert terms.gamma_theta.abs().max() == 0 and terms.gamma_p.abs().max() == 0
        learned = sampler.drift_terms(theta, p, target, **kwargs)
        assert learned.q.std() > 0.01 and learned.gamma_p.abs().max() > 1e-3  # (it varies)
    # The copy keeps the design, the step and the statistics; the original is untouched.
    assert constant.arguments() == sampler.arguments() and constant.eta == sampler.eta
    assert torch.equal(constant.momentum_std, sampler.momentum_std)
    assert not torch.equal(sampler.f_q.head.weight, constant.f_q.head.weight)


def test_the_means_of_constant_nets_are_those_constants():
    target = random_gaussian(dim=3).target()
    constant = with_constant_nets(trained_like(), MEANS).float()
    measured = net_means(constant, target, torch.zeros(5, 3), n_steps=20, every=5)
    assert measured == pytest.approx(MEANS, rel=1e-5)


def test_bad_means_and_a_file_without_means_are_refused(tmp_path):
    sampler = trained_like()
    for bad in ({"q": 1.0}, {"q": float("nan"), "f_d": 0.1}, {"q": 1.0, "f_d": -0.5}, {}):
        with pytest.raises(ValueError, match="net means must hold finite 'q' and 'f_d' >= 0"):
            with_constant_nets(sampler, bad)
    path = tmp_path / "s.safetensors"
    sampler.save(str(path))
    with pytest.raises(ValueError, match="stores no net means"):
        stored_net_means(path)
    sampler.save(str(path), provenance={"net_means": MEANS})
    assert stored_net_means(path) == MEANS
