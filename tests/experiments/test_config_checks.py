"""Config validation (issue #15): what a config sweep found, rejected before any directory is
written, by the loaders and by both CLIs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments.benchmark_config import load_benchmark_config
from experiments.run_config import load_config
from metasampler.config import ConfigError
from tasks.registry import build_problem

ROOT = Path(__file__).resolve().parents[2]
LOADERS = [load_config, load_benchmark_config]


@pytest.mark.parametrize("text", ["", "# just a comment\n", "\n\n  # two\n"])
@pytest.mark.parametrize("loader", LOADERS)
def test_empty_or_comment_only_config_is_an_error(tmp_path, loader, text):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="empty"):
        loader(path)


def test_yaml_errors_give_line_and_column(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: ok\ntrain: {epochs: 3\nseed: 1\n")
    with pytest.raises(ConfigError, match=r"line 3, column \d+"):
        load_config(path)


@pytest.mark.parametrize("name", ["../../x", "..", ".", "", "a/b", "a\\b", ".hidden", " x"])
@pytest.mark.parametrize("loader", LOADERS)
def test_run_names_cannot_leave_out_dir(loader, name):
    with pytest.raises(ConfigError, match="name must be"):
        loader(None, [f"name='{name}'"])


@pytest.mark.parametrize("kl_at", ["[0]", "[-5]", "[2001]", "[1000,5000]"])
def test_kl_at_outside_the_evaluation_run_is_rejected(kl_at):
    with pytest.raises(ConfigError, match="eval.kl_at"):
        load_config(None, ["eval.n_steps=2000", f"eval.kl_at={kl_at}"])
    # Without evaluation during training the entries are unused, so they are not checked.
    load_config(None, ["train.eval_every=0", f"eval.kl_at={kl_at}"])


@pytest.mark.parametrize("device", ["bogus", "cuda:x", "npu"])
@pytest.mark.parametrize("loader", LOADERS)
def test_bogus_device_is_rejected(loader, device):
    with pytest.raises(ConfigError, match="device"):
        loader(None, [f"device={device}"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a build or machine without CUDA")
@pytest.mark.parametrize("loader", LOADERS)
def test_cuda_without_cuda_is_rejected(loader):
    with pytest.raises(ConfigError, match="no CUDA"):
        loader(None, ["device=cuda"])


@pytest.mark.parametrize("loader", LOADERS)
def test_out_dir_that_is_a_file_is_rejected(tmp_path, loader):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out_dir in (blocker, blocker / "below"):
        with pytest.raises(ConfigError, match="not a directory"):
            loader(None, [f"out_dir={out_dir}"])
    with pytest.raises(ConfigError, match="out_dir/name.*not a directory"):
        loader(None, [f"out_dir={tmp_path}", "name=file"])


@pytest.mark.parametrize("key", ["task.cov", "eval.task.cov"])
def test_bogus_covariance_is_rejected(key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [f"{key}=bogus"])


@pytest.mark.parametrize(
    "override",
    ["task.eig_range=[1.0,0.1]", "task.eig_range=[0.1]", "eval.task.eig_range=[0,1]",
     "task.eig_spacing=bogus"],
)  # fmt: skip
def test_bogus_eigenvalue_spectrum_is_rejected(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


def test_train_activations_only_for_networks_and_not_empty():
    override = "task.train_activations=[relu]"
    with pytest.raises(ConfigError, match=r"task\.train_activations varies.*has none"):
        load_config(None, [override])
    mnist = load_config(ROOT / "configs" / "feedforward.yaml", [override])
    assert [a.value for a in mnist.task.train_activations] == ["relu"]
    with pytest.raises(ConfigError, match=r"task\.train_activations is empty"):
        load_config(ROOT / "configs" / "feedforward.yaml", ["task.train_activations=[]"])


def test_eigenvalue_spectrum_reaches_the_training_gaussian():
    cfg = load_config(None, ["task.eig_range=[0.003,1.0]", "task.eig_spacing=log"])
    variances = build_problem(cfg.task).exact.cov.diagonal()
    assert float(variances.min()) == pytest.approx(0.003)
    assert float(variances.max()) == pytest.approx(1.0)


# The CLI goes through load_config, tested case by case above; these check the wiring (an
# error message, exit status 2, nothing written) for the cases that used to run or crash.
CLI_CASES = {
    "empty": (None, []),
    "escape": ("toy", ["name=../../escaped"]),
    "kl_at": ("toy", ["eval.kl_at=[0]", "device=bogus"]),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_train_cli_fails_with_a_message_before_writing(tmp_path, case):
    config, extra = CLI_CASES[case]
    if config is None:
        path = tmp_path / "in" / "empty.yaml"
        path.parent.mkdir()
        path.write_text("# nothing\n")
    else:
        path = ROOT / "configs" / "toy_gaussian.yaml"
    out = tmp_path / "out" / "deeper"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train_meta.py"), "--config", str(path), f"out_dir={out}"]
        + extra,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert "config error" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
    assert not (tmp_path.parent / "escaped").exists()


# overrides on both sides of `--sampler` parse too (they used to stop at "unrecognized
# arguments")
@pytest.mark.parametrize("sampler_between_overrides", [False, True])
def test_evaluate_cli_rejects_out_dir_that_is_a_file(tmp_path, sampler_between_overrides):
    blocker = tmp_path / "results"
    blocker.write_text("not a directory")
    between = ["--sampler", str(ROOT / "pretrained" / "toy_gaussian.safetensors"), "seeds=[0]"]
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "evaluate.py"),
            "--config",
            str(ROOT / "configs" / "eval" / "quick.yaml"),
            f"out_dir={blocker}",
            "methods.nnsghmc.enabled=false",
        ]
        + (between if sampler_between_overrides else []),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "not a directory" in proc.stderr and "Traceback" not in proc.stderr
    assert blocker.read_text() == "not a directory"


@pytest.mark.parametrize(
    ("design", "message"),
    [(dict(curl_input="stiffness", thermostat=True), "curl_input='stiffness' needs exact Gamma"),
     (dict(curl_input="momentum", thermostat=True), "thermostat needs exact Gamma")],
)  # fmt: skip
def test_evaluate_cli_rejects_finite_differences_on_a_file_that_needs_exact_gamma(
    tmp_path, design, message
):
    """``methods.nnsghmc.gamma=finite_difference`` on a file whose curl sees the stiffness, or
    that runs a thermostat, stops before any work, naming the option and what to set (not a
    traceback mid-run)."""
    from metasampler.learned import NNSGHMC

    path = tmp_path / "exact.safetensors"
    NNSGHMC(lr=0.01, q_hidden=(2,), d_hidden=(2,), **design).save(str(path))
    proc = subprocess.run(
        [
            sys.executable, str(ROOT / "evaluate.py"),
            "--config", str(ROOT / "configs" / "eval" / "quick.yaml"),
            "--sampler", str(path), f"out_dir={tmp_path / 'out'}",
            "methods.nnsghmc.gamma=finite_difference", "methods.nnsghmc_constant.enabled=false",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "methods.nnsghmc.gamma: " in proc.stderr and message in proc.stderr
    assert "set gamma='exact'" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
