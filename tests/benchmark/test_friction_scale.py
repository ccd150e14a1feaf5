"""The friction scale inside the thermostat: the rule and the search."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import metasampler as ms
from metasampler.benchmark.friction_scale import choose_friction_scale, pick_friction_scale
from tasks.gaussian import paper_train_gaussian

ROOT = Path(__file__).resolve().parents[2]

TOY_FILE = ROOT / "pretrained" / "toy_gaussian_known_noise.safetensors"  # (as trained)


def test_the_rule_stops_before_the_first_resolved_rise_beyond_the_tolerance():
    steady = [1.0, 1.02, 0.98]
    kls = [(1.0, steady), (0.5, [1.05, 1.1, 1.0]), (0.25, [1.4, 1.45, 1.5]), (0.125, steady)]
    # 0.25 rises 45 % with little scatter: rejected, and the recovery at 0.125 is not looked at
    assert pick_friction_scale(kls, tolerance=0.15) == 0.5
    # the same mean rise, scattered over a range the seeds cannot resolve, is not a rise
    noisy = [(1.0, steady), (0.5, [0.5, 2.9, 0.95])]
    assert pick_friction_scale(noisy, tolerance=0.15) == 0.5
    assert pick_friction_scale(noisy, tolerance=0.15, z=0.0) == 1.0
    # a diverged run ends the search; a lone reference is its own choice
    assert pick_friction_scale([(1.0, steady), (0.5, [math.inf, 1.0, 1.0])], 0.15) == 1.0
    assert pick_friction_scale([(1.0, [1.0])], 0.15) == 1.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"scales": (0.5, 0.25)}, "start at 1"),
        ({"scales": (1.0, 0.5, 0.5)}, "decreasing"),
        ({"seeds": ()}, "seed"),
        ({"tolerance": -0.1}, "tolerance"),
        ({"z": float("nan")}, "z must"),
    ],
)
def test_bad_search_settings_are_refused_before_any_run(kwargs, message):
    sampler = ms.load_sampler(TOY_FILE)
    with pytest.raises(ValueError, match=message):
        choose_friction_scale(sampler, paper_train_gaussian(), n_steps=10, **kwargs)


def test_a_finite_difference_sampler_cannot_be_put_in_a_thermostat():
    fd_file = ROOT / "pretrained" / "mnist_mlp_floor_5units.safetensors"
    sampler = ms.load_sampler(fd_file, gamma="finite_difference")
    with pytest.raises(ValueError, match="thermostat"):
        choose_friction_scale(sampler, paper_train_gaussian(), n_steps=10)


def test_the_search_runs_each_scale_in_the_thermostat_and_leaves_the_sampler_alone():
    sampler = ms.load_sampler(TOY_FILE)
    choice = choose_friction_scale(
        sampler,
        paper_train_gaussian(),
        scales=(1.0, 0.5),
        seeds=(0, 1),
        n_chains=8,
        n_steps=200,
        progress=False,
    )
    assert [(run.scale, run.seed) for run in choice.runs] == [
        (1.0, 0),
        (1.0, 1),
        (0.5, 0),
        (0.5, 1),
    ]
    assert all(run.kl_final > 0 and run.ess > 0 for run in choice.runs)
    assert choice.scale in (1.0, 0.5) and "chosen" in choice.table()
    assert not sampler.thermostat and sampler.d_output_scale == 1.0


def test_on_several_tasks_the_choice_is_the_smallest_scale_every_task_accepts(monkeypatch):
    # A stand-in benchmark: the KL is flat on task "flat", and rises tenfold at scale 1/4 on
    # task "rising"; the search stops there, and 1/2 is the choice of both.
    from metasampler.benchmark import friction_scale

    def fake_benchmark(sampler, task, *, seed, kl_at, **settings):
        kl = 1e-3 * (10.0 if task == "rising" and sampler.d_output_scale < 0.3 else 1.0)
        return {f"kl@{kl_at[0]}": kl, f"kl@{kl_at[-1]}": kl * (1 + seed / 100), "ess": 1.0}

    monkeypatch.setattr(friction_scale, "gaussian_benchmark", fake_benchmark)
    sampler = ms.load_sampler(TOY_FILE)
    choice = choose_friction_scale(sampler, ["flat", "rising"], progress=False)
    assert choice.scale == 0.5 and choice.task_scales == (0.25, 0.5)
    assert sorted({(run.task, run.scale) for run in choice.runs}) == [
        (0, 0.25), (0, 0.5), (0, 1.0), (1, 0.25), (1, 0.5), (1, 1.0)
    ]  # fmt: skip
    rows = choice.table().splitlines()[2:]
    assert [row.split("|")[-2].strip() for row in rows] == [
        "", "chosen", "", "", "chosen", "rejected"
    ]  # fmt: skip
