"""``research/scripts/toy_unseen_targets.py``: toy samplers on targets their training never saw."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import toy_unseen_targets  # noqa: E402


def test_each_sampler_spec_runs_on_each_target(tmp_path, capsys):
    out = tmp_path / "runs.jsonl"
    specs = ["msgnht", "toy_gaussian_noise_estimate", "toy_gaussian_stiffness:0:1:0"]
    argv = ["--targets", "banana", "mixture4", "--samplers", *specs, "--n-steps", "60"]
    assert toy_unseen_targets.main([*argv, "--json", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["target"], r["sampler"]) for r in rows] == [
        (t, s) for t in ("banana", "mixture4") for s in specs
    ]
    assert all(r["kl@60"] >= 0 and r["ess"] > 0 for r in rows)
    assert capsys.readouterr().out.count("| banana |") == 3


def test_a_file_spec_sets_what_it_names():
    sampler = toy_unseen_targets.build("toy_gaussian_stiffness:0:1:1:1", eta=0.025)
    assert not sampler.thermostat and sampler.d_output_scale == 1.0
    assert sampler.grad_noise_estimate and sampler.leapfrog
    shipped = toy_unseen_targets.build("toy_gaussian_noise_estimate", eta=0.025)
    assert shipped.thermostat and shipped.d_output_scale == 0.5 and shipped.grad_noise_estimate


def test_a_malformed_spec_is_refused(capsys):
    assert toy_unseen_targets.main(["--samplers", "toy_gaussian_stiffness:yes:1:0"]) == 2
    assert "THERMOSTAT:SCALE:ESTIMATE" in capsys.readouterr().err
