"""research/scripts/reference_hmc.py: HMC from saved chain states cools hot chains to the posterior's
temperature, and bad state files are refused with a clear message."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from metasampler.benchmark import synthetic_classification_problem
from metasampler.benchmark.metrics import member_nll, predict_log_probs
from metasampler.files import load_checksummed, save_checksummed

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "research" / "scripts"))
import reference_hmc  # noqa: E402

sys.path.pop(0)
import evaluate  # noqa: E402

CONFIG = str(ROOT / "configs" / "eval" / "mnist_nt.yaml")


@pytest.fixture
def problem(monkeypatch):
    """A tiny classification problem in place of the config's MNIST task."""
    tiny = synthetic_classification_problem(
        n_train=120, n_val=30, n_test=60, n_ood=0, n_features=4, hidden=(8,), batch_size=30
    )
    monkeypatch.setattr(evaluate, "_build_problem", lambda cfg, device: tiny)
    threads = torch.get_num_threads()
    yield tiny
    torch.set_num_threads(threads)  # (the script sets the config's thread count)


def _table(out: str, group: int) -> list[list[str]]:
    """The cells of group ``group``'s table, a list per reported trajectory."""
    table = out.split("chains ")[group + 1]
    return [line.split("|")[1:-1] for line in table.splitlines() if re.match(r"\| \d", line)]


def _layer_temperatures(out: str, group: int) -> list[list[float]]:
    """Per reported trajectory, the layer temperatures of group ``group``'s table."""
    return [[float(cell) for cell in row[4:6]] for row in _table(out, group)]


def test_hmc_brings_hot_chains_to_the_posteriors_temperature(problem, tmp_path, capsys) -> None:
    # Prior draws: hot where the data pin the weights far tighter than the prior.
    hot = torch.randn(8, problem.target.dim, generator=torch.Generator().manual_seed(0))
    save_checksummed(tmp_path / "hot.pt", {"theta": hot, "method": "hot", "step": 0})
    argv = [
        "--config", CONFIG, "--states", str(tmp_path / "hot.pt"), "--trajectories", "200",
        "--n-leapfrog", "10", "--adapt", "20", "--report-every", "50", "--eta", "0.05",
        "--save-states", str(tmp_path / "end.pt"),
    ]  # fmt: skip
    assert reference_hmc.main(argv) == 0
    out = capsys.readouterr().out
    rows = _layer_temperatures(out, 0)
    assert min(rows[0]) > 2.0, rows  # the start, in both layers
    assert all(0.7 < t < 1.3 for t in rows[-1]), rows  # after 180 trajectories at a fixed step
    # The train-NLL column is the final states' mean NLL on the training data.
    final = load_checksummed(tmp_path / "end.pt")["theta"]
    target = problem.target
    expected = member_nll(predict_log_probs(target, final, target.x, 1000), target.y)
    train_nll = [float(row[6]) for row in _table(out, 0)]
    assert train_nll[-1] == pytest.approx(expected, abs=1e-4)
    assert train_nll[-1] < 0.5 * train_nll[0]  # prior draws fit the data far worse


def test_states_that_do_not_fit_the_model_are_refused(problem, tmp_path, capsys) -> None:
    save_checksummed(tmp_path / "wide.pt", {"theta": torch.zeros(3, problem.target.dim + 1)})
    argv = ["--config", CONFIG, "--states", str(tmp_path / "wide.pt")]
    assert reference_hmc.main(argv) == 2
    assert "do not fit this model" in capsys.readouterr().err
    data = (tmp_path / "wide.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    assert reference_hmc.main(["--config", CONFIG, "--states", str(tmp_path / "cut.pt")]) == 2
    assert "error: states:" in capsys.readouterr().err


def test_a_saved_run_continues_with_its_groups(tmp_path) -> None:
    theta = torch.arange(5 * 3, dtype=torch.float32).view(5, 3)
    save_checksummed(tmp_path / "run.pt", {
        "theta": theta, "groups": ["a (step 8)", "b (step 8)"], "group_sizes": [2, 3],
        "trajectories": 40,
    })  # fmt: skip
    save_checksummed(tmp_path / "c.pt", {"theta": theta[:1], "method": "c", "step": 9})
    groups = reference_hmc.load_groups([str(tmp_path / "run.pt"), str(tmp_path / "c.pt")], 3, None)
    assert [label for label, _ in groups] == [
        "a (step 8) + HMC 40",
        "b (step 8) + HMC 40",
        "c (step 9)",
    ]
    assert [part.tolist() for _, part in groups] == [
        theta[:2].tolist(),
        theta[2:].tolist(),
        theta[:1].tolist(),
    ]
