"""``research/scripts/thermostat_friction_scale.py``: the script that writes a toy sampler's
file inside its thermostat with the friction scale :func:`choose_friction_scale` picks."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import metasampler as ms
from metasampler.export import read_header

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "research" / "scripts"))

import thermostat_friction_scale  # noqa: E402

TOY_FILE = ROOT / "pretrained" / "toy_gaussian_known_noise.safetensors"  # (as trained)


def test_the_script_writes_the_file_inside_its_thermostat_with_the_choice(tmp_path, capsys):
    out = tmp_path / "scaled.safetensors"
    argv = [str(TOY_FILE), "--out", str(out), "--scales", "1", "0.5"]
    argv += ["--seeds", "0", "--n-steps", "150", "--n-chains", "6", "--tolerance", "100"]
    torch.manual_seed(0)
    assert thermostat_friction_scale.main(argv) == 0
    assert "chosen friction scale: 0.5" in capsys.readouterr().out
    loaded = ms.load_sampler(out)  # a fresh load: the file holds the choice
    assert loaded.thermostat and loaded.d_output_scale == 0.5
    provenance = read_header(out)["provenance"]
    assert "d_output_scale x 0.5" in provenance["set_after_training"]
    assert provenance["config"] == read_header(TOY_FILE)["provenance"]["config"]


def test_the_script_refuses_a_sampler_not_trained_on_a_gaussian(tmp_path, capsys):
    out = tmp_path / "never.safetensors"
    mnist = ROOT / "pretrained" / "mnist_mlp_floor_5units.safetensors"
    assert thermostat_friction_scale.main([str(mnist), "--out", str(out)]) == 2
    assert "not a toy Gaussian" in capsys.readouterr().err and not out.exists()


def test_the_script_refuses_a_file_already_inside_its_thermostat(tmp_path, capsys):
    # toy_gaussian_stiffness stores the thermostat and a scaled friction: scaling it again
    # would compound the two choices
    stiffness = ROOT / "pretrained" / "toy_gaussian_stiffness.safetensors"
    out = tmp_path / "never.safetensors"
    assert thermostat_friction_scale.main([str(stiffness), "--out", str(out)]) == 2
    assert "already runs inside its thermostat" in capsys.readouterr().err and not out.exists()


def test_the_script_checks_where_it_will_write_before_running(tmp_path, capsys):
    out = tmp_path / "missing" / "scaled.safetensors"
    assert thermostat_friction_scale.main([str(TOY_FILE), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_script_refuses_a_training_task_it_cannot_rebuild(tmp_path, capsys):
    from metasampler.export import save_sampler

    odd = tmp_path / "odd.safetensors"
    config = "task:\n  kind: paper_train_gaussian\n  no_such_key: 1\nsampler: {}\n"
    save_sampler(ms.load_sampler(TOY_FILE), odd, provenance={"config": config})
    out = tmp_path / "never.safetensors"
    assert thermostat_friction_scale.main([str(odd), "--out", str(out)]) == 2
    assert "cannot be rebuilt" in capsys.readouterr().err and not out.exists()


def test_the_script_can_choose_on_the_training_task_in_a_rotated_basis_too(tmp_path, capsys):
    out = tmp_path / "scaled.safetensors"
    argv = [str(TOY_FILE), "--out", str(out), "--scales", "1", "0.5", "--rotated"]
    argv += ["--seeds", "0", "--n-steps", "150", "--n-chains", "6", "--tolerance", "100"]
    assert thermostat_friction_scale.main(argv) == 0
    table = capsys.readouterr().out
    assert "| 0 | 0.5 |" in table and "| 1 | 0.5 |" in table  # both tasks ran every scale
    assert "rotated basis (task 1, seed 7)" in read_header(out)["provenance"]["set_after_training"]
