"""``train.compile_steps``: meta-training compiles its steps by default where that pays (a
CPU with a C++ compiler and at least ``TRAINING_COMPILE_MIN_COORDINATES`` chain-coordinates),
and as told otherwise."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from experiments.run_config import load_config
from metasampler.config import ConfigError
from metasampler.learned import fast

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import train_meta  # noqa: E402

CPU = torch.device("cpu")
TOY = ROOT / "configs" / "toy_gaussian.yaml"


def prepared(monkeypatch, overrides: list[str], compiler: bool = True):
    """The sampler ``train_meta`` would train (no calibration), with or without a compiler."""
    reason = None if compiler else "no C++ compiler (g++/clang++) on PATH"
    monkeypatch.setattr(fast, "compile_unavailable", lambda device: reason)
    cfg = load_config(TOY, overrides)
    sampler, _ = train_meta._prepare_sampler(cfg, CPU, calibrate=False)
    return sampler


def test_small_problems_stay_eager_and_large_ones_compile_by_default(monkeypatch, capsys):
    dim = load_config(TOY).task.dim
    threshold = fast.TRAINING_COMPILE_MIN_COORDINATES
    below, above = threshold // dim - 1, -(-threshold // dim)
    assert prepared(monkeypatch, [f"train.n_chains={below}"]).use_compile is None
    assert "compiling the meta-training step" not in capsys.readouterr().err
    assert prepared(monkeypatch, [f"train.n_chains={above}"]).use_compile is True
    assert "compiling the meta-training step" in capsys.readouterr().err


def test_the_default_stays_eager_without_a_compiler(monkeypatch):
    big = fast.TRAINING_COMPILE_MIN_COORDINATES
    sampler = prepared(monkeypatch, [f"train.n_chains={big}"], compiler=False)
    assert sampler.use_compile is None


@pytest.mark.parametrize("told, expected", [("true", True), ("false", None)])
def test_an_explicit_setting_is_obeyed_at_any_size(monkeypatch, told, expected):
    for n_chains in (5, fast.TRAINING_COMPILE_MIN_COORDINATES):
        overrides = [f"train.n_chains={n_chains}", f"train.compile_steps={told}"]
        assert prepared(monkeypatch, overrides).use_compile is expected


def test_not_a_boolean_is_a_config_error():
    with pytest.raises(ConfigError, match="compile_steps"):
        load_config(TOY, ["train.compile_steps=sometimes"])
