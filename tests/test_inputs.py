"""Inputs checked where they enter (issue #15): ``BayesianModel`` data against its module,
``sample``'s arguments, step arguments, and a cyclical schedule's run length."""

from __future__ import annotations

import pytest
import torch

import metasampler as ms
from metasampler.samplers import SGLD, cyclical_sgld
from metasampler.schedules import CyclicalCosine


def target() -> ms.EnergyTarget:
    return ms.EnergyTarget(lambda th: 0.5 * (th**2).sum(-1), dim=2)


def classifier_data(n: int = 30, features: int = 4, classes: int = 3):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g)


def test_bayesian_model_checks_the_feature_count_at_construction():
    x, y = classifier_data(features=5)
    with pytest.raises(ValueError, match=r"cannot take the data's inputs x of shape \(N, 5\)"):
        ms.BayesianModel(torch.nn.Linear(4, 3), (x, y))


@pytest.mark.parametrize(("bad", "shown"), [(3, r"\[0, 3\]"), (-1, r"\[-1, 2\]")])
def test_bayesian_model_checks_the_label_range_at_construction(bad, shown):
    x, y = classifier_data()
    y[7] = bad
    with pytest.raises(ValueError, match=r"labels y must be in \[0, 2\].*got labels in " + shown):
        ms.BayesianModel(torch.nn.Linear(4, 3), (x, y))


@pytest.mark.parametrize(
    ("likelihood", "bad", "shown"),
    [("bernoulli", 2.0, r"\[0, 2\]"), ("bernoulli", -0.5, r"\[-0.5, 1\]")],
)
def test_bayesian_model_checks_bernoulli_targets_are_probabilities(likelihood, bad, shown):
    # y log p + (1 - y) log(1 - p) with y outside [0, 1] is no likelihood: the posterior
    # would be of something else, silently
    x, y = classifier_data(classes=2)
    y = y.float()
    y[3] = bad
    with pytest.raises(ValueError, match=r"targets y in \[0, 1\], got values in " + shown):
        ms.BayesianModel(torch.nn.Linear(4, 1), (x, y), likelihood=likelihood)
    soft = torch.full_like(y, 0.3)  # probabilities are targets too
    assert ms.BayesianModel(torch.nn.Linear(4, 1), (x, soft), likelihood=likelihood).n_data == 30


def test_predictions_and_held_out_scores_check_the_inputs_shape():
    """A logistic regression asked about inputs with another feature count: a ValueError
    naming both shapes, from ``predict`` and from the held-out score adaptation uses."""
    x, y = classifier_data(classes=2)
    model = ms.BayesianModel(torch.nn.Linear(4, 1), (x, y.float()), likelihood="bernoulli")
    theta = model.init_positions(2, torch.Generator().manual_seed(0))
    shown = r"cannot take inputs x of shape \(6, 5\) \(the model's data x: \(N, 4\)\)"
    wrong = torch.randn(6, 5)
    with pytest.raises(ValueError, match=shown):
        model.predict(theta, wrong)
    with pytest.raises(ValueError, match=shown):
        model.log_likelihood(theta, wrong, torch.ones(6))
    assert model.predict(theta, x[:6]).mean.shape == (6, 1)  # the data's shape still works


def test_bayesian_model_accepts_good_data():
    model = ms.BayesianModel(torch.nn.Linear(4, 3), classifier_data(), batch_size=10)
    result = ms.sample(SGLD(lr=1e-3), model, 2, 3, seed=0, progress=False)
    assert result.theta.shape == (3, 2, 15)


def test_chains_take_the_model_s_dtype_and_a_continued_state_its_chain_count():
    x, y = classifier_data()
    model = ms.BayesianModel(torch.nn.Linear(4, 3).double(), (x.double(), y), batch_size=10)
    first = ms.sample(SGLD(lr=1e-3), model, 2, 3, seed=0, progress=False)  # no dtype given
    assert first.theta.dtype == torch.float64
    with pytest.raises(ValueError, match=r"init \(a state\) has 2 chains but n_chains=3"):
        ms.sample(SGLD(lr=1e-3), model, 3, 3, init=first.final_state, progress=False)
    assert ms.sample(SGLD(lr=1e-3), target(), 2, 3, progress=False).theta.dtype == torch.float32


BAD_SAMPLE_ARGS = [
    (dict(n_steps=None), "n_steps must be an integer"),
    (dict(n_steps=True), "n_steps must be an integer"),
    (dict(n_steps=2.5), "n_steps must be an integer"),
    (dict(n_chains="4"), "n_chains must be an integer"),
    (dict(thin=0), "thin must be an integer >= 1"),
    (dict(burn_in=-1), "burn_in must be an integer >= 0"),
    (dict(burn_in=10), r"burn_in \(10\) must be < n_steps \(10\)"),
    (dict(burn_in=12), r"burn_in \(12\) must be < n_steps"),
    (dict(burn_in=5, thin=6), "no sample would be kept"),
    (dict(thin=11), "no sample would be kept"),
    (dict(seed=2**64), "seed must be None or an integer"),
    (dict(seed=-(2**63) - 1), "seed must be None or an integer"),
    (dict(seed=1.5), "seed must be None or an integer"),
    (dict(dtype=torch.int64), "dtype must be None or a floating"),
    (dict(callback=3), "callback must be callable"),
    (dict(sampler=object()), "sampler must be a metasampler sampler"),
    (dict(sampler="SGLD"), "sampler must be a metasampler sampler"),
    (dict(target=object()), "target must have dim, n_data and evaluate"),
    (dict(target=torch.zeros(3)), "target must have dim, n_data and evaluate"),
]


@pytest.mark.parametrize(("changes", "message"), BAD_SAMPLE_ARGS)
def test_sample_validates_its_arguments(changes, message):
    args = dict(sampler=SGLD(eta=0.01), target=target(), n_chains=4, n_steps=10)
    args.update(changes)
    with pytest.raises(ValueError, match=message):
        ms.sample(progress=False, **args)


def test_sample_keeps_integral_arguments_working():
    result = ms.sample(SGLD(eta=0.01), target(), 3, 10, burn_in=4, thin=3, seed=2**64 - 1,
                       progress=False)  # fmt: skip
    assert result.steps.tolist() == [7, 10]


@pytest.mark.parametrize("bad", [True, False, "0.1", None])
def test_step_and_temperature_must_be_numbers_not_bools(bad):
    if bad is not None:
        with pytest.raises(ValueError, match="eta must be a number"):
            SGLD(eta=bad)
    with pytest.raises(ValueError, match="temperature must be a number"):
        SGLD(eta=0.1, temperature=bad)


def test_cyclical_schedule_refuses_steps_past_its_run():
    schedule = CyclicalCosine(total_steps=20, n_cycles=2)
    schedule(20)
    with pytest.raises(ValueError, match="total_steps=20"):
        schedule(21)
    sampler = cyclical_sgld(eta=0.01, total_steps=20, n_cycles=2)
    with pytest.raises(ValueError, match="total_steps=20"):
        ms.sample(sampler, target(), 2, 21, seed=0, progress=False)
    # A run split in two is fine while it stays within total_steps.
    first = ms.sample(sampler, target(), 2, 12, seed=0, progress=False)
    ms.sample(sampler, target(), 2, 8, init=first.final_state, seed=1, progress=False)
    with pytest.raises(ValueError, match="total_steps=20"):
        ms.sample(sampler, target(), 2, 9, init=first.final_state, seed=1, progress=False)


@pytest.mark.parametrize(
    ("likelihood", "outputs", "y", "shown"),
    [
        (
            "categorical",
            3,
            torch.zeros(30, 1, dtype=torch.long),
            r"outputs \(1, 3\) and y \(1, 1\)",
        ),
        ("gaussian", 1, torch.zeros(30, 2), r"outputs \(1, 1\) and y \(1, 2\)"),
        ("bernoulli", 2, torch.zeros(30), r"outputs \(1, 2\) and y \(1,\)"),
    ],
)
def test_bayesian_model_checks_the_targets_fit_the_outputs(likelihood, outputs, y, shown):
    """Targets of a shape the module's outputs do not fit fail at construction (and as
    held-out data), naming both shapes, not inside the first step's vmap."""
    x, _ = classifier_data()
    with pytest.raises(ValueError, match=r"^data: .*" + shown):
        ms.BayesianModel(torch.nn.Linear(4, outputs), (x, y), likelihood=likelihood)
    model = ms.BayesianModel(torch.nn.Linear(4, 3), classifier_data())
    with pytest.raises(ValueError, match=r"^validation: .*labels \(B, ...\)"):
        model.check_data(x, torch.zeros(30, 1, dtype=torch.long), "validation")
    # a (B, 1) regression head takes (B,) targets as well as (B, 1)
    for targets in (torch.zeros(30), torch.zeros(30, 1)):
        assert ms.BayesianModel(torch.nn.Linear(4, 1), (x, targets), "gaussian").n_data == 30


def test_a_run_that_kept_no_samples_says_so_where_samples_are_needed():
    model = ms.BayesianModel(torch.nn.Linear(4, 3), classifier_data())
    result = ms.sample(SGLD(lr=1e-3), model, 4, 20, seed=0, progress=False, store=False)
    assert result.theta.shape == (0, 4, 15)
    message = r"no samples \(.*store=False"
    with pytest.raises(ValueError, match=message):
        ms.summary(result)
    with pytest.raises(ValueError, match=message):
        result.to_inference_data()
    with pytest.raises(ValueError, match=message):
        model.predict(result.theta)
    assert repr(result) == "SampleResult(0 samples x 4 chains x 15 parameters)"


def test_assign_params_refuses_values_that_are_not_finite_floats():
    net = torch.nn.Linear(2, 1)
    before = [p.detach().clone() for p in net.parameters()]
    for bad in (torch.tensor([1.0, float("nan"), 0.0]), torch.tensor([1, 2, 3])):
        with pytest.raises(ValueError, match="finite floating-point"):
            ms.assign_params(net, bad)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))


def test_noise_std_is_refused_where_the_likelihood_has_no_noise():
    x, y = classifier_data(classes=2)
    with pytest.raises(ValueError, match=r"noise_std is the gaussian likelihood's .* bernoulli"):
        ms.BayesianModel(torch.nn.Linear(4, 1), (x, y.float()), "bernoulli", noise_std=0.5)
    model = ms.BayesianModel(torch.nn.Linear(4, 1), (x, y.float()), "gaussian", noise_std=0.5)
    assert model.noise_std == 0.5
