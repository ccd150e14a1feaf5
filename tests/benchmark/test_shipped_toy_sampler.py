"""The shipped toy sampler as loaded: it mixes on the paper's 20-D test Gaussian, and its stored
thermostat is part of why."""

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
def test_the_shipped_toy_sampler_mixes_in_its_stored_thermostat():
    # As loaded (the default design: thermostat on; measured KL@1k 0.105, KL@3k 0.030, ESS
    # 28.8 with the file of version 0.2.0) against the same nets without the thermostat
    # (0.194, 0.096, 31.0); SGHMC at the same step and friction 1 reaches 1.43 and 0.33.
    loaded = ms.load_sampler("toy_gaussian", eta=0.025)
    assert loaded.thermostat and loaded.uses_stiffness and loaded.gamma == "exact"
    shipped = short_test_run(loaded)
    undone = ms.load_sampler("toy_gaussian", eta=0.025)
    undone.thermostat = False
    plain = short_test_run(undone)
    assert shipped["kl@1000"] < 0.15 and shipped["kl@3000"] < 0.05 and shipped["ess"] > 20
    assert shipped["kl@3000"] < 0.6 * plain["kl@3000"], (shipped, plain)
