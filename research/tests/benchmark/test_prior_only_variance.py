"""research/scripts/prior_only_variance.py: the variance a method samples where only the prior acts.

Constant-step SGHMC samples the prior's variance; cSGHMC at its tuned NT+AF settings samples
about half of it, because its temperature-0 exploration stages take about half of each cycle's
SDE time (research/NOTEBOOK.md, session 34).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "research" / "scripts"))
import prior_only_variance  # noqa: E402

sys.path.pop(0)
import evaluate  # noqa: E402

CONFIG = str(ROOT / "configs" / "eval" / "mnist_nt_af.yaml")


@pytest.fixture(autouse=True)
def _keep_threads():
    """The script sets the config's thread count; the tests after it keep theirs."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def sampled_variance(monkeypatch, capsys, method: str, lr: float, *overrides: str) -> float:
    # (N of the config's training split, without loading the digits)
    problem = SimpleNamespace(target=SimpleNamespace(n_data=3500))
    monkeypatch.setattr(evaluate, "_build_problem", lambda cfg, device: problem)
    argv = ["--config", CONFIG, "--method", method, "--lr", str(lr), "--dim", "1000", *overrides]
    assert prior_only_variance.main(argv) == 0
    line = capsys.readouterr().out
    return float(re.search(r"after step \d+ ([0-9.]+)", line).group(1))


def test_constant_step_sghmc_samples_the_prior_variance(monkeypatch, capsys) -> None:
    variance = sampled_variance(
        monkeypatch, capsys, "sghmc", 0.15, "methods.sghmc.momentum_decay=0.01"
    )
    assert variance == pytest.approx(1.0, abs=0.08)


def test_cyclical_sghmc_samples_about_half_the_prior_variance(monkeypatch, capsys) -> None:
    friction = "methods.csghmc.momentum_decay=0.00333333"
    cold = sampled_variance(monkeypatch, capsys, "csghmc", 0.1, friction)
    assert 0.4 < cold < 0.6
    # without its exploration stages the same schedule samples (nearly) the prior's variance
    no_explore = "methods.csghmc.explore_fraction=0.0"
    assert sampled_variance(monkeypatch, capsys, "csghmc", 0.1, friction, no_explore) > 0.85


def test_bad_method_or_config_is_a_clear_error(capsys) -> None:
    base = ["--config", CONFIG, "--lr", "0.1"]
    assert prior_only_variance.main([*base, "--method", "nope"]) == 2
    assert "--method 'nope' is not one of the config's methods" in capsys.readouterr().err
    assert prior_only_variance.main([*base, "--method", "sghmc", "budget.n_steps=0"]) == 2
    assert "error: config:" in capsys.readouterr().err
