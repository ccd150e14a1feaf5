"""A config file must hold a mapping: the shared loader says so for every entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from experiments.benchmark_config import load_benchmark_config
from experiments.run_config import load_config
from metasampler.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("text", "holds"),
    [("hello\n", "a string ('hello')"), ("- a\n- b\n", "a list"), ("42\n", "a number ('42')")],
)
def test_a_file_that_is_not_a_mapping_is_named_the_same_by_both_loaders(tmp_path, text, holds):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    messages = []
    for load in (load_config, load_benchmark_config):
        with pytest.raises(ConfigError, match="must hold a mapping of keys to values") as info:
            load(path)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert str(path) in messages[0] and f"not {holds}" in messages[0]


def test_a_key_without_a_value_is_still_a_mapping(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("hello:\n")
    with pytest.raises(ConfigError, match="invalid config key 'hello'"):
        load_config(path)


def test_train_meta_says_the_file_must_hold_a_mapping(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("hello\n")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train_meta.py"), "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert f"config error: config file {path} must hold a mapping" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_suite_config_checks_every_task_before_any_run(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    import evaluate

    suite = evaluate._load_suite("configs/suite.yaml")
    assert "tune.mode=both" in suite["tasks"]["MNIST NT"]["overrides"]
    bad = tmp_path / "suite.yaml"
    bad.write_text(
        "seeds: [0]\ntasks:\n  first:\n    config: configs/eval/quick.yaml\n"
        "  second:\n    config: configs/eval/quick.yaml\n    overrides: [tune.mode=sometimes]\n"
    )
    with pytest.raises(evaluate._Stop, match=r"tasks\.second: .*tune\.mode"):
        evaluate._load_suite(str(bad))
