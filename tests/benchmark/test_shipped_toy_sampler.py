"""The shipped toy samplers as loaded: their stored thermostat and scaled friction
make them mix faster on the 20-D test Gaussian (docs/RESULTS.md, sessions 56-57)."""

from __future__ import annotations

import pytest

import metasampler as ms
from metasampler.benchmark.gaussian import TEST_GRAD_NOISE_STD, gaussian_benchmark
from tasks.gaussian import paper_test_gaussian


def short_test_run(sampler) -> dict[str, float]:
    """The paper's toy test protocol, shortened to 3,000 steps (test seed 0)."""
    sampler.use_compile = False
    return gaussian_benchmark(
        sampler, paper_test_gaussian(), n_chains=50, n_steps=3000, kl_at=[1000, 3000], seed=0,
        grad_noise_std=TEST_GRAD_NOISE_STD,
    )  # fmt: skip


@pytest.mark.slow
def test_the_shipped_toy_sampler_mixes_because_of_its_stored_settings():
    # As loaded (thermostat on, a quarter of the learned friction; measured KL@1k 0.090,
    # KL@3k 0.025, ESS 35.9) against the same nets with both settings undone (0.143, 0.047,
    # 18.3): the stored settings must load and must matter.
    loaded = ms.load_sampler("toy_gaussian_stiffness", eta=0.025)
    assert loaded.thermostat and loaded.d_output_scale == 0.25
    shipped = short_test_run(loaded)
    undone = ms.load_sampler("toy_gaussian_stiffness", eta=0.025)
    undone.thermostat, undone.d_output_scale = False, 1.0
    plain = short_test_run(undone)
    assert shipped["kl@1000"] < 0.11 and shipped["kl@3000"] < 0.035 and shipped["ess"] > 30
    assert plain["kl@3000"] > 0.04 and plain["ess"] < 25


@pytest.mark.slow
def test_the_shipped_noise_estimating_sampler_mixes_faster_in_its_stored_thermostat():
    # quickstart's default file, estimating the noise, as loaded (thermostat on, half the
    # learned friction; measured KL@1k 0.089, KL@3k 0.025, ESS 31.1) against both settings
    # undone (0.119, 0.034, 24.4)
    def loaded(undo: bool):
        sampler = ms.load_sampler("toy_gaussian_noise_estimate", eta=0.025)
        sampler.grad_noise_estimate = True
        if undo:
            sampler.thermostat, sampler.d_output_scale = False, 1.0
        return sampler

    shipped, plain = short_test_run(loaded(False)), short_test_run(loaded(True))
    assert loaded(False).thermostat and loaded(False).d_output_scale == 0.5
    assert shipped["kl@3000"] < 0.029 and shipped["ess"] > 28
    assert plain["kl@3000"] > 0.03 and plain["ess"] < 27
