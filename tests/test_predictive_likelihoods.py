"""Predictions of every built-in likelihood: NLL and accuracy of Bernoulli and Gaussian models
checked against hand computations, the README's step-size tuning recipe on a logistic
regression, and the convergence summary watching what is identifiable."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import sklearn.datasets
import torch
from torch import nn

import metasampler as ms
from metasampler.posterior import outputs_affine_in_parameters
from metasampler.sampling import SampleResult


def _result(theta: torch.Tensor, target) -> SampleResult:
    s, k, _ = theta.shape
    return SampleResult(theta, torch.zeros(s, k), torch.arange(1, s + 1), None, target)


def logistic_data(n: int = 200, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=generator)
    logits = 2.0 * x[:, 0] - 1.0 * x[:, 1] + 0.5
    y = (torch.rand(n, generator=generator) < logits.sigmoid()).float()
    return x, y


# -- the README recipe ------------------------------------------------------------------------
def test_the_readme_tuning_recipe_runs_on_a_logistic_regression():
    # The README's "Choosing the step" recipe as written, on a logistic regression (a Bernoulli
    # likelihood) with a baseline sampler: this body is the snippet the README shows.
    x, y = map(torch.tensor, sklearn.datasets.make_moons(500, noise=0.2, random_state=0))
    xv, yv = map(torch.tensor, sklearn.datasets.make_moons(250, noise=0.2, random_state=1))
    net = torch.nn.Linear(2, 1)  # logistic regression: one logit
    model = ms.BayesianModel(net, (x, y), likelihood="bernoulli", prior_std=1.0, batch_size=50)

    def validation_nll(lr):
        run = ms.sample(
            ms.samplers.SGHMC(lr=lr),
            model,
            n_chains=4,
            n_steps=500,
            burn_in=200,
            seed=1,
            progress=False,
        )
        return model.predict(run.theta, xv).nll(yv)

    tuned = ms.benchmark.tune_step_size(validation_nll, [0.01, 0.03, 0.1], max_extensions=4)
    result = ms.sample(
        ms.samplers.SGHMC(lr=tuned.best),
        model,
        n_chains=4,
        n_steps=1000,
        burn_in=300,
        thin=5,
        seed=0,
        progress=False,
    )  # noqa: E501
    pred = model.predict(result.theta, xv)
    print(tuned.best, pred.nll(yv), pred.accuracy(yv))  # ~0.27, ~0.33 nats, ~0.86
    report = ms.summary(result)  # watches the weights: a logistic regression's are identified

    assert tuned.interior and all(math.isfinite(score) for _, score in tuned.scores)
    # A linear boundary on the moons: about 0.86 right, well below log 2 nats.
    assert 0.8 < pred.accuracy(yv) < 0.92 and 0.25 < pred.nll(yv) < 0.4
    assert report.watched == "parameters" and report.max_rhat < 1.1


# -- Bernoulli --------------------------------------------------------------------------------
def test_bernoulli_nll_and_accuracy_match_a_hand_computation():
    x, y = logistic_data()
    model = ms.BayesianModel(nn.Linear(2, 1), (x, y), likelihood="bernoulli")
    theta = torch.randn(5, 3, model.dim, generator=torch.Generator().manual_seed(1))
    pred = model.predict(theta, x[:40])
    assert pred.likelihood == "bernoulli" and pred.logits.shape == (5, 3, 40, 1)
    # By hand: each draw's probability of y=1, the mixture over the 15 draws, its -log.
    weight, bias = theta[..., :2], theta[..., 2]
    p1 = ((x[:40] @ weight.reshape(15, 2).T) + bias.reshape(15)).sigmoid().T  # (15, 40)
    mixture = torch.where(y[:40].bool(), p1, 1 - p1).double().mean(0)
    assert pred.nll(y[:40]) == pytest.approx(float(-mixture.log().mean()), rel=1e-5)
    assert pred.accuracy(y[:40]) == float(((p1.mean(0) > 0.5) == y[:40].bool()).double().mean())
    assert pred.nll(y[:40].unsqueeze(-1)) == pred.nll(y[:40])  # (B, 1) or (B,) targets
    for bad, why in [(y[:39], "shape"), (y[:40] * 2, "0/1 targets"), (y[:40] + 0.5, "0/1")]:
        with pytest.raises(ValueError, match=why):
            pred.nll(bad)


def test_bernoulli_nll_stays_exact_for_confident_wrong_predictions():
    # A float32 probability rounds to 1 beyond a logit of ~17; the NLL comes from the logits,
    # so a wrong prediction at logit 30 costs its 30 nats, not the float32 floor's ~87.
    model = ms.BayesianModel(
        nn.Linear(1, 1, bias=False), (torch.ones(1, 1), torch.zeros(1)), likelihood="bernoulli"
    )
    pred = model.predict(torch.full((4, 1, 1), 30.0), torch.ones(1, 1))
    assert pred.mean.item() == 1.0  # (rounded)
    assert pred.nll(torch.zeros(1)) == pytest.approx(30.0, rel=1e-6)
    assert pred.accuracy(torch.zeros(1)) == 0.0 and pred.accuracy(torch.ones(1)) == 1.0


def test_bernoulli_sequence_leaves_out_padding_frames():
    class Frames(nn.Module):  # logits (B, T, P) from inputs (B, T, P)
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.scale * x

    x = torch.tensor([[[2.0, -1.0], [0.5, 3.0]], [[1.0, 1.0], [9.0, 9.0]]])
    y = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [-1.0, -1.0]]])  # last: padding
    model = ms.BayesianModel(Frames(), (x, y), likelihood="bernoulli_sequence")
    pred = model.predict(torch.tensor([[[1.0]], [[2.0]]]), x)  # two draws, scale 1 and 2
    valid = (y >= 0).all(-1, keepdim=True).expand(y.shape)
    p1 = torch.stack([x.sigmoid(), (2 * x).sigmoid()])
    mixture = torch.where(y.bool(), p1, 1 - p1).double().mean(0)
    assert pred.nll(y) == pytest.approx(float(-mixture.log()[valid].mean()), rel=1e-6)
    right = ((p1.mean(0) > 0.5) == (y > 0.5))[valid]
    assert pred.accuracy(y) == float(right.double().mean())


# -- Gaussian ---------------------------------------------------------------------------------
def test_gaussian_nll_is_the_mixture_over_draws_and_accuracy_is_refused():
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(30, 3, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3 * torch.randn(30, generator=generator)
    model = ms.BayesianModel(nn.Linear(3, 1), (x, y), likelihood="gaussian", noise_std=0.3)
    theta = torch.randn(4, 2, model.dim, generator=generator)
    pred = model.predict(theta, x)
    assert pred.likelihood == "gaussian" and pred.noise_std == 0.3
    # By hand: log (1/8) sum_n N(y; mean_n, 0.3^2) for each target, averaged.
    flat = theta.reshape(8, 4).double()
    means = x.double() @ flat[:, :3].T + flat[:, 3]  # (30, 8)
    density = torch.exp(-0.5 * ((y.double()[:, None] - means) / 0.3) ** 2) / (
        0.3 * math.sqrt(2 * math.pi)
    )
    expected = -density.mean(1).log().mean()
    assert pred.nll(y) == pytest.approx(float(expected), rel=1e-6)
    # Far targets: the density underflows by hand, the logsumexp stays finite.
    assert math.isfinite(pred.nll(y + 1e3)) and pred.nll(y + 1e3) > 1e6
    with pytest.raises(ValueError, match="accuracy needs a classifier's predictions"):
        pred.accuracy(y)
    with pytest.raises(ValueError, match="finite real targets"):
        pred.nll(torch.full((30,), float("nan")))


def test_a_custom_likelihood_has_no_nll():
    x, y = logistic_data(20)
    model = ms.BayesianModel(
        nn.Linear(2, 1), (x, y), likelihood=lambda o, t: -((o.squeeze(-1) - t) ** 2)
    )
    pred = model.predict(torch.zeros(4, 1, model.dim), x)
    with pytest.raises(ValueError, match="nll needs a built-in likelihood"):
        pred.nll(y)
    with pytest.raises(ValueError, match="custom"):
        pred.accuracy(y)


# -- summary: what is identifiable ------------------------------------------------------------
def test_summary_watches_the_weights_of_a_logistic_regression_that_has_not_mixed():
    # The second feature carries almost no information (scaled by 1e-3), so its weight is
    # pinned by the prior (std 3) only and relaxes over thousands of steps; chains started at
    # -18, -6, 6 and 18 have not mixed in it, while the predictions hardly depend on it (their
    # R-hat is about 1.03, under the threshold: the summary of earlier releases said nothing).
    x, y = logistic_data(200)
    x = x * torch.tensor([1.0, 1e-3])
    model = ms.BayesianModel(nn.Linear(2, 1), (x, y), likelihood="bernoulli", prior_std=3.0)
    init = torch.zeros(4, 3)
    init[:, 1] = torch.tensor([-18.0, -6.0, 6.0, 18.0])
    sgld = ms.samplers.SGLD(eta=0.008)
    result = ms.sample(sgld, model, 4, 1000, init=init, burn_in=300, seed=0, progress=False)
    assert outputs_affine_in_parameters(model, result.theta)
    with pytest.warns(ms.ConvergenceWarning, match=r"R-hat of the parameters .*weight\[0, 1\]"):
        report = ms.summary(result)
    assert report.watched == "parameters" and report.param_rhat.max() > 1.1
    assert report.pred_rhat.max() < 1.1  # (watching the predictions, nothing would warn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ms.summary(result, watch="predictions").watched == "predictions"


class SumLogit(nn.Module):
    """Logits ``((a + b) x, 0)``: only ``a + b`` is identified by the data, but the outputs are
    linear in ``(a, b)``, so with the Gaussian prior the posterior is log-concave (one mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.zeros(()))
        self.b = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logit = (self.a + self.b) * x[:, 0]
        return torch.stack([logit, torch.zeros_like(logit)], -1)


def test_a_linear_model_whose_chains_disagree_on_a_direction_the_data_ignore_warns():
    # Chains that split a + b differently agree on every prediction; for a linear model that is
    # not another equivalent mode but a direction the chains have not explored (the prior
    # pins a - b): the parameters are watched, and warn.
    gen = torch.Generator().manual_seed(1)
    x = torch.linspace(-2, 2, 9).unsqueeze(-1)
    model = ms.BayesianModel(SumLogit(), (x, (x[:, 0] > 0).long()), likelihood="categorical")
    total = 1.0 + 0.3 * torch.randn(400, 4, generator=gen)  # a + b: the same in every chain
    split = torch.arange(4.0).view(1, 4) * 3.0  # a - b: apart in every chain
    theta = torch.stack([split + total / 2, total / 2 - split], -1)
    assert outputs_affine_in_parameters(model, theta)
    with pytest.warns(ms.ConvergenceWarning, match=r"R-hat of the parameters .*largest for [ab]\)"):
        report = ms.summary(_result(theta, model))
    assert report.watched == "parameters" and np.nanmax(report.pred_rhat) < 1.1


def test_summary_watch_argument_is_checked():
    target = ms.EnergyTarget(lambda t: 0.5 * (t * t).sum(-1), dim=2)
    iid = torch.randn(50, 2, 2, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="watch must be one of"):
        ms.summary(_result(iid, target), watch="weights")
    with pytest.raises(ValueError, match="watch='predictions' needs a BayesianModel"):
        ms.summary(_result(iid, target), watch="predictions")
    assert ms.summary(_result(iid, target), warn=False).watched == "parameters"


def test_a_hidden_layer_or_a_custom_likelihood_is_not_taken_for_identified():
    x, y = logistic_data(30)
    mlp = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1))
    model = ms.BayesianModel(mlp, (x, y), likelihood="bernoulli")
    theta = model.init_positions(3, torch.Generator().manual_seed(0)).unsqueeze(0)
    assert not outputs_affine_in_parameters(model, theta)
    linear = ms.BayesianModel(
        nn.Linear(2, 1), (x, y), likelihood=lambda o, t: -((o[:, 0] - t) ** 2)
    )
    draws = torch.randn(8, 2, linear.dim, generator=torch.Generator().manual_seed(0))
    assert outputs_affine_in_parameters(linear, draws)
    assert ms.summary(_result(draws, linear), warn=False).watched == "predictions"
