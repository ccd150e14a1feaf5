"""``research/scripts/thermostat_probe.py``: where each integrator leaves a stiff Gaussian's positions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import thermostat_probe  # noqa: E402


def test_the_probe_shows_each_integrators_stiffness_bias(capsys):
    # Without gradient noise: the Euler positions run hot at eta^2 k = 2 (about 2.1), the
    # leapfrog positions are exact at every stiffness, and mSGNHT-S's splitting runs cold
    # there (about 0.5); the script prints one row per sampler.
    argv = ["--sigma", "0", "--chains", "200", "--steps", "2500", "--burn-in", "500"]
    assert thermostat_probe.main(argv) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[1]] = [float(c) for c in cells[2:]]
    assert set(rows) == {"Euler", "Euler + thermostat", "leapfrog + thermostat", "mSGNHT-S"}
    assert rows["Euler"][-1] > 1.7
    assert all(abs(r - 1) < 0.08 for r in rows["leapfrog + thermostat"])
    assert rows["mSGNHT-S"][-1] < 0.7 and abs(rows["mSGNHT-S"][0] - 1) < 0.08


def test_the_probe_refuses_a_burn_in_as_long_as_the_run():
    with pytest.raises(SystemExit):
        thermostat_probe.main(["--steps", "100", "--burn-in", "100"])
