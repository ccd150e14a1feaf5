"""Seed-paper reproductions (``reproduce.py``, ``reproduction/``).

Fast checks of the pieces the reproduction tables rest on: the mode-coverage count, the ESS
estimator with reference moments, the closed-form logistic target against
:class:`metasampler.BayesianModel`, the per-split BNN target, config
validation, and the command line writing its outputs atomically.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import reproduce
import torch
from omegaconf import OmegaConf
from reproduction import EXPERIMENTS, experiment_module
from reproduction.blr import LogisticTarget, ess_reference_moments
from reproduction.bnn_regression import SplitMLPTarget
from reproduction.common import (
    ConfigError,
    ExperimentOutput,
    load_experiment_config,
    write_outputs,
)
from reproduction.mixture4 import sample_statistics
from reproduction.mixture25 import Mixture25Config, coverage
from reproduction.mixture25 import validate as validate25
from torch import nn

import metasampler as ms
from tasks.toy import mixture_25

ROOT = Path(__file__).resolve().parents[2]


def _cfg25(**overrides) -> OmegaConf:
    items = [f"{k}={v}" for k, v in overrides.items()]
    return load_experiment_config(Mixture25Config, None, items, validate25)


# -- mode coverage (seed 000 Table 4) -----------------------------------------------------------
def test_mode_coverage_separates_stuck_from_exploring_chains():
    task = mixture_25()
    gen = torch.Generator().manual_seed(0)
    cfg = _cfg25(n_runs=2, chains_per_run=4)
    # stuck: every chain of both runs sits in mode 0 -> one mode, single and parallel
    stuck = task.centres[0] + 0.1 * torch.randn(500, 8, 2, generator=gen, dtype=torch.float64)
    got = coverage(task, stuck, cfg)
    assert got["single"] == [1, 1] and got["parallel"] == [1, 1]
    # exploring: chain j of a run visits modes 5j .. 5j+4 (125 samples each) -> 5 modes per
    # chain, 20 per run of 4 chains; a mode with 99 samples does not count (threshold 100)
    parts = []
    for j in range(4):
        modes = torch.arange(5 * j, 5 * j + 5).repeat_interleave(125)
        parts.append(task.centres[modes])
    explore = torch.stack(parts, 1).repeat(1, 2, 1)  # (625, 8, 2)
    explore = explore + 0.05 * torch.randn(explore.shape, generator=gen, dtype=torch.float64)
    got = coverage(task, explore, cfg)
    assert got["single"] == [5, 5] and got["parallel"] == [20, 20]
    assert coverage(task, explore[:99], cfg)["parallel"] == [0, 0]


def test_csgld_covers_more_modes_than_sgld_on_a_short_run():
    # Seed 000's qualitative claim at a tiny budget: 3000 steps, 2 runs x 2 chains, a mode
    # counts with 20 samples. SGLD's decaying step leaves each chain in the mode it first
    # reaches (measured: 1 mode per chain); cSGLD's restarts hop between modes (measured 10+).
    module = experiment_module("mixture25")
    cfg = _cfg25(
        n_runs=2, chains_per_run=2, n_steps=3000, min_count=20, progress=False,
        **{"nnsghmc.enabled": False, "csgld.n_cycles": 10},
    )  # fmt: skip
    out = module.run(cfg)
    sgld, csgld = out.results["sgld"], out.results["csgld"]
    assert max(sgld["single"]) <= 2
    assert min(csgld["parallel"]) >= 2 * max(sgld["parallel"]) + 2
    assert "| Parallel cSGLD | 24.4 ± 0.22 |" in out.markdown
    assert out.figures["density"][:8] == b"\x89PNG\r\n\x1a\n"


# -- ESS with reference moments (seed 000 appendix K.1) -----------------------------------------
def test_ess_reference_moments_iid_ar1_and_bias():
    gen = np.random.default_rng(0)
    b = 4000
    iid = gen.standard_normal((b, 3))
    ess = ess_reference_moments(iid, np.zeros(3), np.ones(3))
    assert np.all(np.abs(ess / b - 1) < 0.15), ess
    # AR(1) with rho = 0.9: ESS -> B (1 - rho) / (1 + rho) = B / 19
    rho, x = 0.9, np.zeros((b, 1))
    noise = gen.standard_normal((b, 1)) * math.sqrt(1 - rho**2)
    for t in range(1, b):
        x[t] = rho * x[t - 1] + noise[t]
    ess_ar = float(ess_reference_moments(x, np.zeros(1), np.ones(1))[0])
    assert 0.6 < ess_ar / (b / 19) < 1.4, ess_ar
    # the same iid draws shifted by one sd: the reference moments expose the bias
    biased = ess_reference_moments(iid + 1.0, np.zeros(3), np.ones(3))
    assert np.all(biased < 0.05 * b), biased


def test_sample_statistics_match_iid_and_ar1():
    gen = np.random.default_rng(1)
    chain = gen.standard_normal((10_000, 2)) * np.array([1.0, 2.0])
    stats = sample_statistics(chain)
    np.testing.assert_allclose(stats["lambda2"], [1.0, 4.0], rtol=0.05)
    assert np.all(np.abs(stats["ess_sv"] / 10_000 - 1) < 0.2)
    assert np.all(np.abs(stats["ess_bm"] / 10_000 - 1) < 0.35)


# -- targets -----------------------------------------------------------------------------------
def test_logistic_target_matches_bayesian_model():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 4, generator=gen, dtype=torch.float64)
    y = (torch.rand(50, generator=gen) < 0.4).double()
    theta = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    ours = LogisticTarget(x, y, prior_std=2.0, batch_size=8)
    ref = ms.BayesianModel(
        nn.Linear(4, 1).double(), (x, y), likelihood="bernoulli", prior_std=2.0, batch_size=8
    )
    a = ours.evaluate(theta, torch.Generator().manual_seed(5))
    b = ref.evaluate(theta, torch.Generator().manual_seed(5))  # same minibatch draw
    energy_offset = a.energy - b.energy  # BayesianModel may add a constant
    np.testing.assert_allclose(energy_offset, energy_offset[0].expand(3), atol=1e-9)
    np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-9, atol=1e-9)


def test_split_mlp_target_uses_each_chains_own_split():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 12, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(2, 12, generator=gen, dtype=torch.float64)
    target = SplitMLPTarget(x, y, hidden=4, prior_std=1.0, batch_size=12)  # full batch
    theta = 0.3 * torch.randn(2, target.dim, generator=gen, dtype=torch.float64)
    ev = target.evaluate(theta, gen)
    for k in range(2):
        w1, b1, w2, b2, ls = (t[k] for t in target.unpack(theta))
        mean = torch.relu(x[k] @ w1 + b1) @ w2 + b2
        nll = -torch.distributions.Normal(mean, ls.exp()).log_prob(y[k]).sum()
        expected = nll + 0.5 * (theta[k] ** 2).sum()
        assert float(ev.energy[k]) == pytest.approx(float(expected), rel=1e-10)
    assert ev.grad.shape == theta.shape and bool(torch.isfinite(ev.grad).all())


# -- configs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_shipped_configs_load(name: str):
    module = experiment_module(name)
    schema = getattr(module, EXPERIMENTS[name][1])
    path = ROOT / "configs" / "reproduce" / f"{name}.yaml"
    cfg = load_experiment_config(schema, path, None, module.validate)
    assert OmegaConf.is_readonly(cfg)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["n_stepz=10"], "n_stepz"),
        (["n_steps=many"], "n_steps"),
        (["n_runs=0"], "n_runs must be >= 1"),
        (["csgld.explore_fraction=1.0"], r"csgld.explore_fraction must be in \[0, 1\)"),
        (["sgld.eta=-0.1"], "sgld.eta must be a finite number > 0"),
        (["init_low=5", "init_high=1"], "init_high must be > init_low"),
        (["n_steps"], "key=value"),
    ],
)
def test_bad_config_values_fail_naming_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_experiment_config(Mixture25Config, None, overrides, validate25)


def test_bad_config_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_experiment_config(Mixture25Config, bad, None, validate25)
    with pytest.raises(ConfigError, match="not found"):
        load_experiment_config(Mixture25Config, tmp_path / "none.yaml", None, validate25)


def test_cli_rejects_bad_override_before_running(tmp_path, capsys):
    rc = reproduce.main(["mixture4", "--out", str(tmp_path), "n_runz=3"])
    assert rc == 2 and "n_runz" in capsys.readouterr().err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


# -- outputs ------------------------------------------------------------------------------------
def test_cli_writes_outputs_on_a_tiny_config(tmp_path, capsys):
    rc = reproduce.main(
        ["mixture4", "--out", str(tmp_path), "n_steps=600", "burn_in=100", "n_runs=3",
         "nnsghmc.enabled=false", "progress=false"]
    )  # fmt: skip
    assert rc == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["mixture4.json", "mixture4.md", "mixture4_samples.png"]
    payload = json.loads((tmp_path / "mixture4.json").read_text())
    assert payload["experiment"] == "mixture4" and "n_steps: 600" in payload["config"]
    stats = payload["results"]["sgld"]["x"]["ess_sv"]
    assert stats["n"] == 3 and stats["mean"] > 0
    table = (tmp_path / "mixture4.md").read_text()
    assert "| SGLD | x | 0.1507 |" in table and "| cSGLD | y | 0.1853 |" in table
    assert "## mixture4" in capsys.readouterr().out


def test_write_outputs_is_atomic(tmp_path, monkeypatch):
    output = ExperimentOutput("exp", {"a": 1.0}, "| t |", {"fig": b"\x89PNG-bytes"})
    write_outputs(output, tmp_path, "seed: 0\n")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    # a failure while writing the second file leaves every file either old or new, and no
    # temporary files behind
    calls = {"n": 0}
    real_replace = os.replace

    def flaky_replace(src, dst):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", flaky_replace)
    new = ExperimentOutput("exp", {"a": 2.0}, "| new |", {"fig": b"\x89PNG-new"})
    with pytest.raises(OSError, match="disk full"):
        write_outputs(new, tmp_path, "seed: 1\n")
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(after) == set(before)  # no temporary files left
    assert json.loads(after["exp.json"])["results"] == {"a": 2.0}  # first file replaced whole
    assert after["exp.md"] == before["exp.md"]  # second file untouched


# -- double well (seed 001) ---------------------------------------------------------------------
def test_double_well_reports_euler_divergence_and_runs_splitting():
    # At h = 0.3 mSGNHT-Euler is unstable on the quartic well (measured: 20 of 20 chains
    # non-finite within 740 steps); splitting runs 250k steps there. The table must say so
    # instead of crashing or printing a number.
    module = experiment_module("double_well")
    cfg = load_experiment_config(
        module.DoubleWellConfig, None,
        ["step_sizes=[0.3]", "chains_per_step=4", "n_steps=2000", "figure_steps=[0.3]",
         "progress=false"],
        module.validate,
    )  # fmt: skip
    out = module.run(cfg)
    euler, split = out.results["euler"][0], out.results["splitting"][0]
    assert euler["diverged_chains"] == 4 and math.isnan(euler["kl_true_hist"])
    assert split["diverged_chains"] == 0 and 0 < split["kl_true_hist"] < 0.2
    assert "diverged (4/4 chains)" in out.markdown
    assert 0.5 < split["xi_final_mean"] < 1.6  # the thermostat finds B = 1
