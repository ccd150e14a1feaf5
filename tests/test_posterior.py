"""The practitioner's path: shipped samplers by name, predictions, putting a sample back into a
module, the convergence summary and its warning, and the ArviZ export."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import metasampler as ms
from metasampler.export import PRETRAINED_DIR
from metasampler.sampling import SampleResult

az = pytest.importorskip("arviz")


def _result(theta: torch.Tensor, target) -> SampleResult:
    """A run's result built from given draws ``(S, K, D)`` (no sampler involved)."""
    s, k, _ = theta.shape
    return SampleResult(theta, torch.zeros(s, k), torch.arange(1, s + 1), None, target)


class ProductLogit(nn.Module):
    """Logits ``(a b x, 0)``: ``(a, b)`` and ``(-a, -b)`` give the same function, so the sign
    is not identified (like the signs and order of a network's hidden units)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.ones(()))
        self.b = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logit = self.a * self.b * x[:, 0]
        return torch.stack([logit, torch.zeros_like(logit)], -1)


# -- shipped samplers by name ----------------------------------------------------------------
def test_every_shipped_sampler_loads_by_name_and_is_described():
    shipped = ms.pretrained_samplers()
    assert set(shipped) == {p.stem for p in PRETRAINED_DIR.glob("*.safetensors")}
    assert {"feedforward", "recurrent", "toy_gaussian"} <= set(shipped)
    assert all(text and text != "(no description)" for text in shipped.values())
    for name in shipped:
        sampler = ms.load_sampler(name)
        assert isinstance(sampler, ms.NNSGHMC) and not sampler.training


def test_name_and_path_load_the_same_file_and_unknown_name_lists_the_shipped(monkeypatch):
    by_name = ms.load_sampler("feedforward", lr=0.01)
    by_path = ms.load_sampler(PRETRAINED_DIR / "feedforward.safetensors", lr=0.01)
    for (n1, t1), (n2, t2) in zip(
        by_name.state_dict().items(), by_path.state_dict().items(), strict=True
    ):
        assert n1 == n2 and torch.equal(t1, t2)
    with pytest.raises(FileNotFoundError, match="no shipped sampler.*feedforward"):
        ms.load_sampler("feedforwardd")
    # A path that does not exist is reported as a path, not looked up as a name.
    with pytest.raises(FileNotFoundError, match="no sampler file"):
        ms.load_sampler("elsewhere/feedforward.safetensors")


# -- predictions and samples back into the module ---------------------------------------------
def test_predict_averages_softmax_over_samples_and_chains():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 4))
    x, y = torch.randn(20, 3), torch.randint(0, 4, (20,))
    model = ms.BayesianModel(net, (x, y), likelihood="categorical")
    theta = torch.randn(6, 2, model.dim)
    pred = model.predict(theta, x[:7])
    assert pred.draws.shape == (6, 2, 7, 4) and pred.mean.shape == (7, 4)
    # Reference: the module itself, one sample at a time.
    probs = torch.stack(
        [
            ms.assign_params(net, theta[s, k]).forward(x[:7]).softmax(-1)
            for s in range(6)
            for k in range(2)
        ]
    )
    torch.testing.assert_close(pred.mean, probs.mean(0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pred.std, probs.std(0), rtol=1e-4, atol=1e-6)
    entropy = -(probs.mean(0) * probs.mean(0).log()).sum(-1)
    torch.testing.assert_close(pred.entropy, entropy, rtol=1e-5, atol=1e-6)
    assert pred.accuracy(y[:7]) == float((probs.mean(0).argmax(-1) == y[:7]).double().mean())
    # The validation score of a step-size tuning: -log of the averaged probability of y.
    nll = -probs.mean(0)[torch.arange(7), y[:7]].log().mean()
    assert pred.nll(y[:7]) == pytest.approx(float(nll), rel=1e-5)
    confident = ms.bayesian.Predictive(probs[:1], torch.eye(4)[:2], probs[0, :2], torch.zeros(2))
    assert confident.nll(torch.tensor([0, 1])) == 0.0
    assert math.isfinite(confident.nll(torch.tensor([1, 0])))  # a zero probability: large, finite
    for bad, why in [(torch.full((7,), 4), "labels in"), (y[:6], "shape"), (y[:7] + 0.5, "labels")]:
        with pytest.raises(ValueError, match=why):
            pred.nll(bad)
    # Default inputs: the training data; bernoulli/gaussian predictions are sigmoid / identity.
    assert model.predict(theta).mean.shape == (20, 4)
    reg = ms.BayesianModel(net, (x, torch.randn(20, 4)), likelihood="gaussian")
    means = torch.stack([reg.forward(t, x) for t in theta]).flatten(0, 1)
    torch.testing.assert_close(reg.predict(theta, x).mean, means.mean(0))
    assert reg.predict(theta, x).entropy is None
    with pytest.raises(ValueError, match="categorical"):
        reg.predict(theta, x).accuracy(y)
    with pytest.raises(ValueError, match=r"y must have shape \(20, 4\)"):  # (real targets)
        reg.predict(theta, x).nll(y)
    with pytest.raises(ValueError, match=r"\(S, K, D\)"):
        model.predict(theta[0, 0], x)


def test_assign_params_is_vector_to_parameters_with_checks():
    net = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    flat = torch.randn(ms.BayesianModel(net, (torch.randn(4, 3), torch.zeros(4).long())).dim)
    other = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    torch.nn.utils.vector_to_parameters(flat, other.parameters())
    assert ms.assign_params(net, flat) is net
    for p, q in zip(net.parameters(), other.parameters(), strict=True):
        assert torch.equal(p, q)
    torch.testing.assert_close(ms.flatten_params(net), flat)
    with pytest.raises(ValueError, match=r"\(32,\) tensor"):
        ms.assign_params(net, torch.randn(2, 32))


# -- summary and its warning ------------------------------------------------------------------
def test_summary_warns_on_disagreeing_chains_and_not_on_agreeing_ones():
    gen = torch.Generator().manual_seed(0)
    target = ms.EnergyTarget(lambda t: 0.5 * (t * t).sum(-1), dim=3)
    iid = torch.randn(400, 4, 3, generator=gen)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = ms.summary(_result(iid, target))
    assert report.watched == "parameters" and report.pred_ess is None
    np.testing.assert_allclose(report.param_ess, ms.diagnostics.ess(iid, rank_normalize=True))
    np.testing.assert_allclose(
        report.param_rhat, ms.diagnostics.split_rhat(iid, rank_normalize=True)
    )
    shifted = iid + torch.arange(4.0).view(1, 4, 1)  # each chain around its own mean
    with pytest.warns(ms.ConvergenceWarning, match="R-hat of the parameters"):
        ms.summary(_result(shifted, target))
    assert ms.summary(_result(shifted, target), warn=False).max_rhat > 1.5
    with pytest.raises(ValueError, match="at least 4"):
        ms.summary(_result(iid[:3], target))
    with pytest.raises(TypeError, match="summary needs the result of metasampler.sample"):
        ms.summary(None)  # e.g. a run's result lost to a function that returned nothing


def test_the_warning_names_the_chains_that_stand_apart():
    """A chain stuck away from the others (still in its transient when the burn-in ended, for
    instance) is named, so that a user sees which chain to look at; where every chain sits
    apart, none is the odd one out and none is named."""
    gen = torch.Generator().manual_seed(3)
    target = ms.EnergyTarget(lambda t: 0.5 * (t * t).sum(-1), dim=3)
    theta = torch.randn(400, 8, 3, generator=gen)
    theta[:, 5, 1] += 10.0
    with pytest.warns(ms.ConvergenceWarning, match="chain 5 stands apart from the others"):
        report = ms.summary(_result(theta, target))
    assert report.apart == (5,)
    theta[:, 2, 1] -= 10.0
    assert ms.summary(_result(theta, target), warn=False).apart == (2, 5)
    spread = torch.randn(400, 8, 3, generator=gen) + 10.0 * torch.arange(8.0).view(1, 8, 1)
    with pytest.warns(ms.ConvergenceWarning) as caught:
        report = ms.summary(_result(spread, target))
    assert report.apart == () and "apart" not in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ms.summary(_result(torch.randn(400, 8, 3, generator=gen), target)).apart == ()


def test_summary_of_a_network_watches_the_predictions_not_the_unidentified_weights():
    gen = torch.Generator().manual_seed(1)
    x = torch.linspace(-2, 2, 9).unsqueeze(-1)
    model = ms.BayesianModel(ProductLogit(), (x, (x[:, 0] > 0).long()), likelihood="categorical")
    product = (1.0 + 0.3 * torch.randn(400, 4, generator=gen)).abs()  # a b: alike in all chains
    sign = torch.tensor([1.0, -1.0, 1.0, -1.0])  # the sign: a different mode per chain
    theta = torch.stack([sign * product.sqrt(), sign * product.sqrt()], -1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = ms.summary(_result(theta, model))
    assert report.watched == "predictions"
    assert np.nanmax(report.param_rhat) > 1.5 and report.max_rhat < 1.1
    assert report.pred_ess.shape == report.pred_rhat.shape == (9, 2)
    assert "predictions" in str(report) and "parameters" in str(report)
    # Chains whose predictions disagree do warn.
    theta_bad = theta + torch.arange(4.0).view(1, 4, 1)
    with pytest.warns(ms.ConvergenceWarning, match="R-hat of the predictions"):
        ms.summary(_result(theta_bad, model))


# -- ArviZ ------------------------------------------------------------------------------------
def test_inference_data_is_chain_draw_with_module_names_and_matches_summary_ess():
    gen = torch.Generator().manual_seed(2)
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))
    model = ms.BayesianModel(net, (torch.randn(8, 2), torch.zeros(8).long()))
    # AR(1) chains of different lengths of memory, so ESS differs between parameters
    s, k = 300, 4
    theta = torch.zeros(s, k, model.dim)
    rho = torch.linspace(0.0, 0.9, model.dim)
    for i in range(1, s):
        theta[i] = rho * theta[i - 1] + torch.randn(k, model.dim, generator=gen)
    result = _result(theta, model)
    idata = result.to_inference_data()
    post = idata.posterior
    assert set(post.data_vars) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert post["0.weight"].dims[:2] == ("chain", "draw")
    assert post["0.weight"].shape == (k, s, 3, 2)
    # chain 1, draw 5 of "0.bias" is theta[5, 1, 6:9] (0.weight comes first, 6 numbers)
    np.testing.assert_allclose(post["0.bias"].values[1, 5], theta[5, 1, 6:9].numpy())
    assert idata.sample_stats["energy"].shape == (k, s)
    az_ess = np.concatenate([az.ess(idata)[n].values.reshape(-1) for n in model.spec.names])
    ours = ms.summary(result, warn=False).param_ess
    np.testing.assert_allclose(az_ess, ours, rtol=0.05)
    az_rhat = np.concatenate([az.rhat(idata)[n].values.reshape(-1) for n in model.spec.names])
    np.testing.assert_allclose(az_rhat, ms.summary(result, warn=False).param_rhat, rtol=1e-6)


def test_inference_data_of_a_plain_target_has_one_theta_variable():
    target = ms.EnergyTarget(lambda t: 0.5 * (t * t).sum(-1), dim=3)
    result = ms.sample(
        ms.samplers.SGLD(eta=0.1), target, n_chains=2, n_steps=20, seed=0, progress=False
    )
    assert result.target is target
    idata = result.to_inference_data()
    assert idata.posterior["theta"].shape == (2, 20, 3)
    np.testing.assert_allclose(idata.posterior["theta"].values[1, 4], result.theta[4, 1].numpy())
