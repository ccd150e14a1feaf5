"""metasampler.benchmark.prior_check: the variance a sampler gives a prior-only coordinate."""

from __future__ import annotations

import math

import pytest
import torch

from metasampler import load_sampler
from metasampler.benchmark import prior_check
from metasampler.benchmark.prior_check import prior_only_variances, sampled_variance
from metasampler.samplers import SGHMC, SGLD
from metasampler.samplers.cyclical import cyclical_sghmc
from metasampler.sampling import sample

N_DATA, CHAINS, STEPS = 3500, 20, 2000


def variance(make, burn_in: int = 500) -> float:
    rows = prior_only_variances(make, N_DATA, CHAINS, STEPS, dim=500)
    return sampled_variance(rows, burn_in, STEPS)


def test_sghmc_at_a_constant_step_samples_the_prior_variance() -> None:
    # (NT+AF's tuned SGHMC: lr 0.15, friction 0.01 per step)
    eta = math.sqrt(0.15 / N_DATA)
    assert variance(lambda: SGHMC(eta=eta, friction=0.01 / eta)) == pytest.approx(1, abs=0.08)


def test_cyclical_sghmc_samples_about_half_of_it_and_all_of_it_without_exploration() -> None:
    # NT+AF's tuned cSGHMC (lr 0.1, friction 0.00333 per step, 4 cycles): its temperature-0
    # exploration stages take about half of each cycle's SDE time (docs/RESULTS.md).
    eta = math.sqrt(0.1 / N_DATA)

    def make(explore_fraction: float):
        return lambda: cyclical_sghmc(
            eta=eta, total_steps=STEPS, n_cycles=4, friction=0.00333 / eta,
            explore_fraction=explore_fraction,
        )  # fmt: skip

    assert 0.4 < variance(make(0.25)) < 0.6
    assert variance(make(0.0)) > 0.85


def test_only_sampling_steps_after_burn_in_count_and_a_divergence_is_nan() -> None:
    eta = math.sqrt(0.1 / N_DATA)
    rows = prior_only_variances(
        lambda: cyclical_sghmc(eta=eta, total_steps=100, n_cycles=2, friction=0.1 / eta),
        N_DATA, 4, 100, dim=10,
    )  # fmt: skip
    assert [r.step for r in rows] == list(range(1, 101))
    assert [r.collects for r in rows[:13]] == [False] * 13  # (the first 12.5 of 50 steps)
    kept = [r.variance for r in rows if r.step > 60 and r.collects]
    assert sampled_variance(rows, 60, 100) == pytest.approx(sum(kept) / len(kept))
    # a step far too large for the Gaussian: the chains blow up before the end
    rows = prior_only_variances(lambda: SGLD(eta=50.0), N_DATA, 4, 100, dim=10)
    assert len(rows) < 100 and math.isnan(sampled_variance(rows, 0, 100))


def test_the_chains_start_on_the_device_asked_for(monkeypatch) -> None:
    # A learned sampler's nets sit on the benchmark's device: its chains must too (an
    # evaluation with device=cuda failed here when the start was moved back to the CPU).
    asked = {}

    def spy(*args, **kwargs):
        asked["device"] = kwargs.get("device")
        return sample(*args, **kwargs)

    monkeypatch.setattr(prior_check, "sample", spy)
    rows = prior_only_variances(lambda: SGLD(eta=0.01), N_DATA, 2, 3, dim=4, device="cpu")
    assert len(rows) == 3 and asked["device"] is not None
    assert torch.device(asked["device"]) == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_learned_sampler_on_cuda_runs_the_check() -> None:
    make = lambda: load_sampler("mnist_mlp_positive_preconditioned", device="cuda")  # noqa: E731
    rows = prior_only_variances(make, N_DATA, 2, 5, dim=10, device="cuda")
    assert len(rows) == 5
