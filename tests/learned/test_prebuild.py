"""``metasampler.prebuild``: a sampler's compiled step built ahead of its first use."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from compiled_packages import empty_package_registries

import metasampler as ms
from metasampler import prebuild
from metasampler.learned import aot
from metasampler.learned.fast import compile_unavailable

NAME = "toy_gaussian"  # (a shipped sampler)


def other_model() -> ms.BayesianModel:
    """Not the model prebuild samples: another size, data and batch."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(120, 5, generator=generator)
    y = torch.randint(0, 3, (120,), generator=generator)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    return ms.BayesianModel(net, (x, y), likelihood="categorical", prior_std=1.0, batch_size=40)


@pytest.mark.skipif(compile_unavailable(torch.device("cpu")) is not None, reason="no compiler")
def test_prebuild_makes_a_first_use_load_the_package(monkeypatch, tmp_path):
    monkeypatch.delenv("METASAMPLER_COMPILE", raising=False)  # (the suite's eager default)
    empty_package_registries(monkeypatch, tmp_path)
    assert prebuild.prebuild([NAME]) == [prebuild.Prebuilt(NAME, True)]
    assert list(tmp_path.glob("*.pt2"))

    empty_package_registries(monkeypatch)  # a fresh process, the same cache

    def no_build(*args):
        raise AssertionError("a first use after prebuild started a build")

    monkeypatch.setattr(aot, "_start", no_build)
    sampler = ms.load_sampler(NAME, lr=0.1)  # default compile; another step and model
    result = ms.sample(sampler, other_model(), n_chains=3, n_steps=4, seed=0, progress=False)
    assert len(aot._RUNNERS) == 1, "the package was not loaded"
    assert torch.isfinite(result.theta).all()


def test_prebuild_without_a_compiler_builds_nothing_and_says_why(monkeypatch, tmp_path):
    empty_package_registries(monkeypatch, tmp_path)
    monkeypatch.setattr(prebuild, "compile_unavailable", lambda device: "no C++ compiler")
    monkeypatch.setattr(aot, "_start", lambda *args: pytest.fail("a build started"))
    path = str(tmp_path / "paper.safetensors")  # a sampler file, as a path
    ms.NNSGHMC(eta=0.01, curl_input="momentum", thermostat=False).save(path)
    results = prebuild.prebuild([NAME, path])
    assert results == [
        prebuild.Prebuilt(NAME, False, "no C++ compiler"),
        prebuild.Prebuilt(path, False, "no C++ compiler"),
    ]
    assert prebuild.main([NAME]) == 1


@pytest.mark.skipif(compile_unavailable(torch.device("cpu")) is not None, reason="no compiler")
def test_a_failed_build_is_reported_not_ready_with_its_reason(monkeypatch, tmp_path):
    # prebuild reads a failure from the warning aot gives (aot.UNAVAILABLE): a build that
    # exits with an error must come back not ready, and main must exit 1.
    monkeypatch.delenv("METASAMPLER_COMPILE", raising=False)
    empty_package_registries(monkeypatch, tmp_path)

    def failing_build(spec, package):
        return subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])

    monkeypatch.setattr(aot, "_start", failing_build)
    [result] = prebuild.prebuild([NAME])
    assert (result.name, result.ready) == (NAME, False)
    assert result.detail.startswith(aot.UNAVAILABLE) and "exited with 3" in result.detail
    empty_package_registries(monkeypatch, tmp_path)
    assert prebuild.main([NAME]) == 1


def test_prebuild_of_an_unknown_sampler_is_a_usage_error_before_any_build(monkeypatch, capsys):
    monkeypatch.setattr(aot, "_start", lambda *args: pytest.fail("a build started"))
    with pytest.raises(SystemExit) as exit_info:
        prebuild.main([NAME, "no_such_sampler"])
    assert exit_info.value.code == 2
    assert "no_such_sampler" in capsys.readouterr().err


def test_a_builds_notice_names_the_command_that_builds_ahead_of_a_run(
    monkeypatch, tmp_path, capsys
):
    started = []
    monkeypatch.setattr(aot, "start_child", lambda *args, **kwargs: started.append(args))
    spec = type("Spec", (), {"to_json": lambda self: "{}"})()
    aot._start(spec, tmp_path / "step.pt2")
    notice = capsys.readouterr().err
    assert len(started) == 1 and "in the background" in notice
    command = notice.split("`")[1].split()  # python -m MODULE NAME_OR_FILE
    assert command[:2] == ["python", "-m"] and command[2] == prebuild.__name__
    assert callable(prebuild.main)
