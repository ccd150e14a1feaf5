"""The held-out predictive loss of meta-training (issue #11): its value is the evaluation's
posterior-average NLL, its meta-gradient moves the nets downhill, and runs with it resume
bit-exactly; bad settings are refused before any work."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from test_meta_training import small_settings, toy_family
from torch import nn

from experiments.run_config import load_config
from metasampler.bayesian import BayesianModel
from metasampler.benchmark.metrics import (
    ensemble_log_probs_from_lp,
    negative_log_likelihood,
    predict_log_probs,
)
from metasampler.config import ConfigError
from metasampler.learned import NNSGHMC
from metasampler.meta.heldout import HeldOutPredictive, heldout_predictive_loss
from metasampler.meta.trainer import MetaTrainer
from tasks.problem import Problem

PAPER = dict(accumulate=True, step_per_loss=True, continue_chains=True, in_chain_weight=0.0)


def tiny_problem(seed: int = 0) -> Problem:
    """A 4-6-3 tanh classifier on separable synthetic data, with a validation split."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(4, 3, generator=gen)
    x = torch.randn(140, 4, generator=gen)
    y = (x @ w).argmax(1)
    torch.manual_seed(seed)
    module = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    target = BayesianModel(module, (x[:100], y[:100]), batch_size=25)
    data = SimpleNamespace(x_val=x[100:], y_val=y[100:])

    def init(n_chains: int, generator: torch.Generator) -> torch.Tensor:
        return target.init_positions(n_chains, generator, scheme="module")

    return Problem(target=target, init=init, exact=None, name="tiny", data=data)


def test_the_loss_is_the_posterior_average_nll_of_the_slices():
    problem = tiny_problem()
    gen = torch.Generator().manual_seed(1)
    slices = [problem.init(5, gen) for _ in range(3)]
    x, y = problem.data.x_val, problem.data.y_val
    loss = heldout_predictive_loss(slices, problem.target.log_likelihood, x, y)
    # The evaluation's route: class log-probabilities of all 15 samples, averaged, scored.
    log_probs = torch.cat([predict_log_probs(problem.target, s, x) for s in slices])
    expected = negative_log_likelihood(ensemble_log_probs_from_lp(log_probs), y)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    # Not the mean of the samples' own NLLs: pooling the predictive is what is scored.
    separate = sum(negative_log_likelihood(lp, y) for lp in log_probs) / len(log_probs)
    assert float(loss) < separate - 1e-3


def test_a_step_against_its_meta_gradient_lowers_the_heldout_loss():
    problem = tiny_problem()
    x, y = problem.data.x_val, problem.data.y_val
    assert_slice_loss_descends(
        problem, lambda slices: heldout_predictive_loss(slices, problem.target.log_likelihood, x, y)
    )


def assert_slice_loss_descends(problem: Problem, slice_loss) -> None:
    """``slice_loss`` of the slices of a short NNSGHMC unroll on ``problem`` reaches the nets,
    and a small step against its meta-gradient lowers it."""
    sampler = NNSGHMC(eta=0.05, q_hidden=(5,), d_hidden=(5,), seed=2)

    def loss() -> torch.Tensor:
        gen = torch.Generator().manual_seed(3)
        state = sampler.init(problem.init(6, gen), problem.target, gen)
        slices = []
        for _ in range(12):
            state = sampler.step(state, problem.target, gen)
            slices.append(state.theta)
        return slice_loss(slices[4::4])

    assert_meta_gradient_descends(loss, list(sampler.parameters()))


def assert_meta_gradient_descends(loss, params: list[torch.Tensor], step: float = 0.02) -> None:
    """A small step against ``d loss() / d params`` lowers ``loss()``, one along it raises it."""
    before = loss()
    grads = torch.autograd.grad(before, params, allow_unused=True)
    norm = torch.sqrt(sum((g**2).sum() for g in grads if g is not None))
    assert norm > 0  # the loss reaches the nets through the unroll
    with torch.no_grad():
        for p, g in zip(params, grads, strict=True):
            if g is not None:
                p -= step * g / norm
        downhill = loss()
        for p, g in zip(params, grads, strict=True):
            if g is not None:
                p += 2 * step * g / norm
        uphill = loss()
    assert float(downhill) < float(before.detach()) < float(uphill)


def test_minibatches_are_drawn_without_replacement_from_the_run_generator():
    problem = tiny_problem()
    seen: list[torch.Tensor] = []

    def log_likelihood(theta, x, rows):  # (the labels here are row numbers)
        seen.append(rows)
        return problem.target.log_likelihood(theta, x, problem.data.y_val[rows])

    x, rows = problem.data.x_val, torch.arange(40)
    theta = problem.init(2, torch.Generator().manual_seed(1))
    draws = []
    for _ in range(2):
        held = HeldOutPredictive(log_likelihood, x, rows, 16, torch.Generator().manual_seed(0))
        draws.append([float(held.loss([theta])) for _ in range(2)])
    assert all(len(r) == 16 and len(set(r.tolist())) == 16 for r in seen)
    assert not torch.equal(seen[0], seen[1])  # a fresh minibatch per call
    assert torch.equal(seen[0], seen[2]) and draws[0] == draws[1]  # from the given generator
    with pytest.raises(ValueError, match="as many labels as inputs"):
        HeldOutPredictive(log_likelihood, x, rows[:3], 16, torch.Generator())


def _run(settings, tmp_path=None, seed=5) -> MetaTrainer:
    sampler = NNSGHMC(eta=0.05, q_hidden=(5,), d_hidden=(5,), seed=0)
    trainer = MetaTrainer(
        sampler, lambda epoch, gen: tiny_problem(), settings, run_dir=tmp_path, seed=seed,
        progress=False,
    )  # fmt: skip
    return trainer


def heldout_settings(**overrides):
    base = dict(
        epochs=3, sub_epochs=2, steps_per_sub_epoch=12, n_chains=6, unroll=6, replay_prob=0.0,
        checkpoint_every=1, heldout_weight=1.0, heldout_batch=16, **PAPER,
    )  # fmt: skip
    return small_settings(**{**base, **overrides})


def test_training_with_the_heldout_loss_logs_it_and_resumes_bit_exactly(tmp_path):
    assert_term_trains_and_resumes(heldout_settings, "heldout", tmp_path)


def assert_term_trains_and_resumes(settings, term: str, tmp_path) -> None:
    """With ``settings()`` (3 epochs) the loss ``term`` is logged, changes the training (against
    its weight at 0) and a run resumed after epoch 2 ends bit-exactly where a straight run
    does."""
    logged: dict[str, float] = {}
    straight = _run(settings())
    straight.report.logger = SimpleNamespace(scalar=lambda tag, v, step: logged.update({tag: v}))
    straight.train()
    assert {"loss/cross_chain", f"loss/{term}"} <= set(logged)
    assert math.isfinite(logged[f"loss/{term}"]) and all(map(math.isfinite, straight.history.loss))
    without = _run(settings(**{f"{term}_weight": 0.0}))
    without.train()
    assert straight.history.loss != without.history.loss  # the term changes the training
    run_dir = tmp_path / "run"
    _run(settings(epochs=2), run_dir).train()
    resumed = _run(settings(), run_dir, seed=9)
    assert (resumed.resume(), resumed.train().loss) == (2, straight.history.loss)
    nets = [m.sampler.state_dict().values() for m in (straight, resumed)]
    assert all(torch.equal(a, b) for a, b in zip(*nets, strict=True))


@pytest.mark.parametrize(
    "schedule",
    [
        dict(accumulate=False, step_per_loss=False, continue_chains=False),  # one combined step
        dict(accumulate=False, step_per_loss=True, continue_chains=True),  # a step per loss
    ],
)
def test_every_schedule_trains_on_the_heldout_loss_with_the_elbo_terms(schedule):
    logged: dict[str, float] = {}
    trainer = _run(heldout_settings(epochs=1, in_chain_weight=1.0, **schedule))
    trainer.report.logger = SimpleNamespace(scalar=lambda tag, v, step: logged.update({tag: v}))
    history = trainer.train()
    assert {"loss/cross_chain", "loss/in_chain", "loss/heldout"} <= set(logged)
    assert 0 < logged["loss/heldout"] < 5 and all(map(math.isfinite, history.loss))
    without = _run(heldout_settings(epochs=1, in_chain_weight=1.0, heldout_weight=0.0, **schedule))
    assert without.train().loss != history.loss


def test_heldout_alone_trains_without_the_elbo_terms(monkeypatch):
    from metasampler.meta import update as update_module

    calls = []
    monkeypatch.setattr(update_module, "cross_chain_loss", lambda *a, **k: calls.append(1) or 1 / 0)
    trainer = _run(heldout_settings(epochs=1, cross_chain_weight=0.0))
    before = [p.detach().clone() for p in trainer.sampler.parameters()]
    trainer.train()
    assert not calls  # a zero weight computes nothing
    moved = [
        not torch.equal(a, b) for a, b in zip(before, trainer.sampler.parameters(), strict=True)
    ]
    assert any(moved)


def test_a_task_without_a_validation_split_is_refused_naming_the_setting():
    trainer = MetaTrainer(
        NNSGHMC(eta=0.02, q_hidden=(4,), d_hidden=(4,)), toy_family(),
        small_settings(epochs=1, heldout_weight=1.0), progress=False,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="train.heldout_weight"):
        trainer.train()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["task.kind=mnist_mlp", "train.heldout_weight=1", "train.cross_chain_every=0"],
            "cross_chain_every",
        ),  # fmt: skip
        (["train.heldout_weight=1"], "needs a Bayesian task .* got task.kind=paper_train_gaussian"),
        (["train.heldout_weight=-1"], "heldout_weight must be >= 0"),
        (["train.heldout_batch=0"], "heldout_batch must be >= 1"),
        (["train.cross_chain_weight=0", "train.in_chain_weight=0"], "every loss is disabled"),
    ],
)
def test_the_config_refuses_heldout_settings_that_cannot_run(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)
