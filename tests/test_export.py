"""Sampler files: round trips (same and fresh process), freezing, overrides, every bad input."""

from __future__ import annotations

import datetime
import json
import os
import pickle
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch
from torch import nn

import metasampler as ms
from metasampler import staging
from metasampler.bayesian import BayesianModel
from metasampler.export import (
    FORMAT,
    FORMAT_VERSION,
    HEADER_KEY,
    SamplerFileError,
    load_sampler,
    read_header,
    save_sampler,
    training_config,
)
from metasampler.learned import NNSGHMC, NNSGHMCArgs
from metasampler.sampler_file import header_checksum
from metasampler.sampler_format import CHECKSUM_FULL

TESTS_DIR = Path(__file__).resolve().parent

# Constructor arguments of the sampler under test; every one differs from the default, so a
# constant the format forgot would come back as the default and fail the round trip.
SETTINGS = dict(
    eta=0.03,
    q_hidden=(8, 6),
    d_hidden=(5,),
    activation="softplus",
    curl_input="momentum",
    gamma="finite_difference",
    alpha=0.1,
    friction_scale=0.05,
    grad_input_scale=1.3,
    thermostat=False,
)
BUFFERS = dict(energy_loc=0.3, energy_std=2.0, momentum_std=0.8, train_dim=4)
# (attribute path on the sampler, value expected from SETTINGS)
CONSTANTS = {
    "eta": 0.03,
    "lr": None,
    "f_q.hidden": [8, 6],
    "f_d.hidden": [5],
    "f_q.activation": "softplus",
    "f_d.activation": "softplus",
    "curl_input": "momentum",
    "alpha": 0.1,
    "friction_scale": 0.05,
    "grad_input_scale": 1.3,
    "gamma": "finite_difference",
    "thermostat": False,
}


def attr(obj, dotted: str):
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


def make_sampler() -> NNSGHMC:
    """A 'trained' sampler: non-default architecture, constants and input statistics."""
    sampler = NNSGHMC(seed=3, **SETTINGS)
    for name, value in BUFFERS.items():
        getattr(sampler, name).fill_(value)
    return sampler


@pytest.fixture
def saved(tmp_path) -> tuple[NNSGHMC, Path]:
    sampler = make_sampler()
    path = tmp_path / "sampler.safetensors"
    save_sampler(sampler, path, provenance={"seed": 7, "config": {"task": "toy", "widths": (8,)}})
    return sampler, path


def toy_run(sampler: NNSGHMC, gamma_noise: float = 0.5) -> torch.Tensor:
    scales = torch.tensor([1.0, 0.5, 2.0])
    target = ms.EnergyTarget(
        lambda x: 0.5 * (x * x / scales).sum(-1), dim=3, grad_noise_std=gamma_noise
    )
    return ms.sample(sampler, target, n_chains=5, n_steps=60, seed=2, progress=False).theta


def run_bnn(sampler: NNSGHMC) -> torch.Tensor:
    """Sample a small Bayesian MLP (D = 26, minibatches) that the sampler never saw.

    Also run in a fresh interpreter by ``test_fresh_process_round_trip``.
    """
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(24, 3, generator=gen)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    module = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    target = BayesianModel(module, (x, y), likelihood="categorical", batch_size=8)
    result = ms.sample(
        sampler,
        target,
        n_chains=4,
        n_steps=40,
        init=lambda g: target.init_positions(4, g),
        seed=5,
        progress=False,
    )
    return result.theta


def rewrite(
    src: Path, dst: Path, tensors=None, header=None, metadata=None, resign: bool = True
) -> Path:
    """Copy a sampler file with safetensors directly, editing its tensors / header; with
    ``resign`` the whole-file checksum is recomputed (so the checks behind it are reached)."""
    with safetensors.safe_open(str(src), framework="pt") as handle:
        meta = handle.metadata()
        data = {name: handle.get_tensor(name) for name in handle.keys()}
    head = json.loads(meta[HEADER_KEY])
    if tensors is not None:
        tensors(data)
    if header is not None:
        header(head)
    algorithm = head.get("checksum", {}).get("algorithm")
    if resign and algorithm == CHECKSUM_FULL:
        head["checksum"]["value"] = header_checksum(head, data)
    if metadata is None:
        metadata = {HEADER_KEY: json.dumps(head)}
    safetensors.torch.save_file(data, str(dst), metadata=metadata)
    return dst


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


# --------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------
def test_settings_are_not_defaults():
    """Guard for the round-trip tests: every constant checked differs from the default."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default = NNSGHMC(lr=1.0)
    for name, value in CONSTANTS.items():
        assert attr(default, name) != value, name
    for name, value in BUFFERS.items():
        assert float(getattr(default, name)) != value, name


def test_round_trip_same_process(saved):
    sampler, path = saved
    loaded = load_sampler(path)
    assert type(loaded) is NNSGHMC
    for name, value in CONSTANTS.items():
        assert attr(loaded, name) == value, name
    assert loaded.temperature == 1.0
    original, restored = sampler.state_dict(), loaded.state_dict()
    assert list(original) == list(restored)
    for name, value in original.items():
        assert restored[name].dtype == value.dtype, name
        assert torch.equal(restored[name], value), name
    for name, value in BUFFERS.items():
        assert float(getattr(loaded, name)) == value

    # Same seed, same trajectory (finite-difference Gamma and the statistics all in play).
    expected = toy_run(sampler)
    got = toy_run(loaded)
    assert torch.isfinite(got).all()
    assert torch.equal(got, expected)
    # ...and a differently initialised sampler does not give it (the check can fail).
    other = NNSGHMC(seed=4, **SETTINGS)
    assert not torch.allclose(toy_run(other), expected)


def test_fresh_process_round_trip(saved, tmp_path):
    sampler, path = saved
    out = tmp_path / "theta.safetensors"
    code = (
        "import sys, torch\n"
        "torch.set_num_threads(1)\n"
        f"sys.path.insert(0, {str(TESTS_DIR)!r})\n"
        "import safetensors.torch\n"
        "from metasampler.export import load_sampler\n"
        "from test_export import run_bnn\n"
        "theta = run_bnn(load_sampler(sys.argv[1]))\n"
        "safetensors.torch.save_file({'theta': theta.contiguous()}, sys.argv[2])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=TESTS_DIR.parent,
    )
    assert done.returncode == 0, done.stderr
    fresh = safetensors.torch.load_file(str(out))["theta"]
    assert fresh.shape == (40, 4, 26)
    assert torch.isfinite(fresh).all()
    assert fresh.std() > 0
    assert torch.equal(fresh, run_bnn(load_sampler(path)))
    assert torch.equal(fresh, run_bnn(sampler))


def test_loaded_sampler_is_frozen(saved):
    _, path = saved
    loaded = load_sampler(path)
    assert all(not p.requires_grad for p in loaded.parameters())
    assert all(not b.requires_grad for b in loaded.buffers())
    assert not loaded.training
    assert not any(m.training for m in loaded.modules())
    assert all(p.device.type == "cpu" for p in loaded.parameters())


def test_header_contents(saved):
    sampler, path = saved
    header = read_header(path)
    assert header["format"] == FORMAT == "metasampler.nnsghmc"
    assert header["format_version"] == FORMAT_VERSION == 10
    assert header["checksum"]["algorithm"] == CHECKSUM_FULL
    assert header["architecture"] == {
        "q_hidden": [8, 6],
        "d_hidden": [5],
        "activation": "softplus",
        "curl_input": "momentum",
        "dtype": "float32",
    }
    assert header["constants"] == {
        "gamma": "finite_difference",
        "alpha": 0.1,
        "friction_scale": 0.05,
        "grad_input_scale": 1.3,
        "thermostat": False,
    }
    assert header["training"] == {"eta": 0.03, "lr": None, "temperature": 1.0}
    assert header["statistics"] == {k: v for k, v in BUFFERS.items() if k != "train_dim"}
    assert header["train_dim"] == 4
    prov = header["provenance"]
    assert prov["seed"] == 7
    assert prov["config"] == {"task": "toy", "widths": [8]}
    assert prov["torch"] == torch.__version__
    assert prov["metasampler"] == ms.__version__
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", prov["commit"])
    created = datetime.datetime.fromisoformat(prov["created"])
    assert abs(datetime.datetime.now(datetime.timezone.utc) - created).total_seconds() < 600
    # The tensors of the file are the state dict, contiguous on CPU.
    with safetensors.safe_open(str(path), framework="pt") as handle:
        assert sorted(handle.keys()) == sorted(sampler.state_dict())


def test_user_provenance_wins_and_odd_values_are_stored_as_text(tmp_path):
    path = tmp_path / "s.safetensors"
    make_sampler().save(str(path), provenance={"commit": "abc", "where": tmp_path, "x": 1e400})
    prov = read_header(path)["provenance"]
    assert prov["commit"] == "abc"
    assert prov["where"] == str(tmp_path)
    assert prov["x"] == "inf"


# --------------------------------------------------------------------------------------------
# Load-time overrides
# --------------------------------------------------------------------------------------------
def test_step_gamma_temperature_dtype_overrides(saved):
    _, path = saved
    by_eta = load_sampler(path, eta=0.01)
    assert (by_eta.eta, by_eta.lr) == (0.01, None)
    by_lr = load_sampler(path, lr=1e-3)
    assert (by_lr.eta, by_lr.lr) == (None, 1e-3)
    with pytest.raises(ValueError, match="at most one of eta"):
        load_sampler(path, eta=0.01, lr=1e-3)
    with pytest.raises(ValueError, match="eta must be"):
        load_sampler(path, eta=-1.0)
    assert load_sampler(path, gamma="exact").gamma == "exact"
    with pytest.raises(ValueError, match="gamma must be one of"):
        load_sampler(path, gamma="magic")
    assert load_sampler(path, temperature=0.5).temperature == 0.5

    wide = load_sampler(path, dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in wide.parameters())
    assert wide.energy_std.dtype == torch.float64 and wide.train_dim.dtype == torch.int64
    theta = toy_run(wide)
    assert theta.dtype == torch.float32 and torch.isfinite(theta).all()
    with pytest.raises(ValueError, match="floating"):
        load_sampler(path, dtype=torch.int32)


def test_no_stored_step_asks_for_eta_or_lr(saved, tmp_path):
    _, path = saved
    bad = rewrite(
        path, tmp_path / "nostep.safetensors", header=lambda h: h["training"].update(eta=None)
    )
    with pytest.raises(ValueError, match="pass eta= or lr=") as info:
        load_sampler(bad)
    assert not isinstance(info.value, SamplerFileError)
    assert load_sampler(bad, eta=0.02).eta == 0.02


def test_package_level_load_sampler():
    if not hasattr(ms, "load_sampler"):
        pytest.skip("metasampler.load_sampler not exported yet")
    assert ms.load_sampler is load_sampler


# --------------------------------------------------------------------------------------------
# Saving safely
# --------------------------------------------------------------------------------------------
def test_save_refuses_non_finite(tmp_path):
    sampler = make_sampler()
    with torch.no_grad():
        sampler.f_d.head.weight[0, 1] = float("inf")
    path = tmp_path / "s.safetensors"
    with pytest.raises(SamplerFileError, match=r"'f_d\.head\.weight'.*non-finite"):
        save_sampler(sampler, path)
    assert not path.exists() and leftovers(tmp_path) == []


def test_interrupted_save_leaves_no_partial_file(tmp_path, monkeypatch):
    real = safetensors.torch.save_file

    def crash(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        data = Path(filename).read_bytes()
        Path(filename).write_bytes(data[: len(data) // 2])  # half written ...
        raise OSError("disk full")  # ... and then it fails

    path = tmp_path / "s.safetensors"
    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        save_sampler(make_sampler(), path)
    assert not path.exists()
    assert leftovers(tmp_path) == []

    # An older file at the target survives intact.
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    old = NNSGHMC(eta=0.05, seed=0)
    save_sampler(old, path)
    before = path.read_bytes()
    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        save_sampler(make_sampler(), path)
    assert path.read_bytes() == before
    assert leftovers(tmp_path) == []
    assert load_sampler(path).eta == 0.05


def test_a_failed_write_names_the_sampler_file_not_its_temporary(tmp_path, monkeypatch):
    def fail(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise safetensors.SafetensorError(f"I/O error at path {filename}")

    path = tmp_path / "s.safetensors"
    monkeypatch.setattr(safetensors.torch, "save_file", fail)
    with pytest.raises(OSError, match=re.escape(f"cannot write the sampler file {str(path)!r}")):
        save_sampler(make_sampler(), path)
    assert not path.exists()
    assert leftovers(tmp_path) == []


def test_temporary_files_of_killed_saves_are_removed_at_the_next_save(tmp_path):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    host = staging.owner_tag().rsplit("-", 2)[0]
    killed = tmp_path / f".s.safetensors.{host}-{int(ended.stdout)}-0123abcd.tmp"
    legacy = tmp_path / f".s.safetensors.{'b' * 32}.tmp"  # an older release's, long ago
    running = tmp_path / f".s.safetensors.{host}-{os.getppid()}-0123abcd.tmp"
    for leftover in (killed, legacy, running):
        leftover.write_bytes(b"half a file")
    os.utime(legacy, (0, 0))
    save_sampler(make_sampler(), tmp_path / "s.safetensors")
    assert leftovers(tmp_path) == [running.name]  # a live process's file is not touched


def test_save_refuses_a_provenance_the_loader_would_refuse(tmp_path):
    deep: dict = {}
    for _ in range(30):
        deep = {"x": deep}
    path = tmp_path / "s.safetensors"
    with pytest.raises(ValueError, match="refusing to save.*nests deeper"):
        save_sampler(make_sampler(), path, provenance={"deep": deep})
    with pytest.raises(ValueError, match="refusing to save.*bytes"):
        save_sampler(make_sampler(), path, provenance={"big": "x" * 2**20})
    assert not path.exists() and leftovers(tmp_path) == []


def test_save_keeps_ordinary_permissions(saved):
    _, path = saved
    umask = os.umask(0o022)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_nothing_is_unpickled(saved, monkeypatch):
    _, path = saved

    def forbidden(*args, **kwargs):
        raise AssertionError("load_sampler must not unpickle")

    for module, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler")):
        monkeypatch.setattr(module, name, forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    assert isinstance(load_sampler(path), NNSGHMC)


# --------------------------------------------------------------------------------------------
# Bad files
# --------------------------------------------------------------------------------------------
def test_missing_file(tmp_path):
    path = tmp_path / "nowhere.safetensors"
    with pytest.raises(FileNotFoundError, match="nowhere.safetensors"):
        load_sampler(path)
    with pytest.raises(FileNotFoundError, match="nowhere.safetensors"):
        read_header(path)


@pytest.mark.parametrize("cut", ["empty", 4, 40, "half", "minus-one"])
def test_truncated_file(saved, tmp_path, cut):
    _, path = saved
    data = path.read_bytes()
    keep = {"empty": 0, "half": len(data) // 2, "minus-one": len(data) - 1}.get(cut, cut)
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(data[:keep])
    with pytest.raises(SamplerFileError, match="is not a valid sampler file") as err:
        load_sampler(bad)
    if cut == 40:  # inside the header: says how much of it is there
        assert "only 32 bytes follow" in str(err.value)


def test_random_bytes(tmp_path):
    bad = tmp_path / "noise.safetensors"
    bad.write_bytes(
        torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0))
        .to(torch.uint8)
        .numpy()
        .tobytes()
    )
    with pytest.raises(SamplerFileError, match="is not a valid sampler file"):
        load_sampler(bad)
    with pytest.raises(SamplerFileError, match="is not a valid sampler file"):
        read_header(bad)


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}])
def test_safetensors_file_without_our_header(tmp_path, metadata):
    bad = tmp_path / "plain.safetensors"
    safetensors.torch.save_file({"w": torch.zeros(3)}, str(bad), metadata=metadata)
    with pytest.raises(SamplerFileError, match="is a safetensors file but not a metasampler"):
        load_sampler(bad)


def test_wrong_format_name(saved, tmp_path):
    _, path = saved
    bad = rewrite(path, tmp_path / "f.safetensors", header=lambda h: h.update(format="other"))
    with pytest.raises(SamplerFileError, match="not a metasampler sampler.*'other'"):
        load_sampler(bad)


@pytest.mark.parametrize("version", [99, 11, 0, "1"])
def test_other_format_version(saved, tmp_path, version):
    _, path = saved
    bad = rewrite(
        path, tmp_path / "v.safetensors", header=lambda h: h.update(format_version=version)
    )
    message = f"written by format version {version!r}; this metasampler reads versions 10"
    with pytest.raises(SamplerFileError, match=re.escape(message)):
        load_sampler(bad)
    assert read_header(bad)["format_version"] == version  # inspection still works


def as_version_9(header: dict) -> None:
    """A version-9 header, as the release before this design wrote it: the switches of the
    earlier design, and no curl_input or friction_scale."""
    header["format_version"] = 9
    architecture, constants = header["architecture"], header["constants"]
    del architecture["curl_input"], constants["friction_scale"]
    architecture.update(d_output="softplus", q_output="identity", q_momentum_input=True,
                        q_stiffness_input=False)  # fmt: skip
    constants.update(beta_off=0.0, c=0.1, q_clamp=5.0, d_output_scale=1.0, leapfrog=False,
                     stiffness_freeze_after=None, friction_units="absolute")  # fmt: skip


@pytest.mark.parametrize("version", [9, 1])
def test_a_file_of_an_earlier_design_is_refused_saying_how_to_replace_it(saved, tmp_path, version):
    _, path = saved
    old = rewrite(path, tmp_path / "v9.safetensors", header=as_version_9)
    if version != 9:
        old = rewrite(old, tmp_path / "v1.safetensors", header=lambda h: h.update(format_version=1))
    with pytest.raises(SamplerFileError) as info:
        load_sampler(old)
    message = str(info.value)
    assert f"{old} was written by format version {version}" in message
    assert "reads versions 10" in message and "an earlier NNSGHMC design" in message
    assert "Re-train it with train_meta.py" in message  # how to replace it
    assert "metasampler.pretrained_samplers()" in message  # or what to load instead
    assert "Traceback" not in message and "KeyError" not in message
    assert read_header(old)["format_version"] == version  # inspection still works
    with pytest.raises(SamplerFileError, match="earlier NNSGHMC design"):
        ms.load_sampler(old, eta=0.01, gamma="exact")  # (overrides change nothing)


def test_the_thermostat_and_the_curl_input_are_stored_and_checked(tmp_path):
    sampler = NNSGHMC(eta=0.03, seed=3)  # the default design
    path = tmp_path / "default.safetensors"
    save_sampler(sampler, path)
    header = read_header(path)
    assert header["constants"]["thermostat"] is True
    assert header["architecture"]["curl_input"] == "stiffness"
    loaded = load_sampler(path)
    assert loaded.thermostat and loaded.uses_stiffness
    assert torch.equal(toy_run(loaded), toy_run(sampler))
    for section, name, bad, why in (
        ("constants", "thermostat", 1, "true or false"),
        ("architecture", "curl_input", "energy", "one of ('stiffness', 'momentum')"),
    ):

        def edit(h, section=section, name=name, bad=bad):
            h[section][name] = bad

        edited = rewrite(path, tmp_path / f"{name}.safetensors", header=edit)
        with pytest.raises(SamplerFileError, match=re.escape(f"'{section}.{name}' must be {why}")):
            load_sampler(edited)


SHIPPED = sorted((TESTS_DIR.parent / "pretrained").glob("*.safetensors"))


def test_few_samplers_are_shipped_and_the_constructor_takes_few_arguments():
    import inspect

    assert 1 <= len(ms.pretrained_samplers()) <= 4
    assert len(inspect.signature(ms.NNSGHMC).parameters) <= 16


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_a_shipped_file_is_what_its_config_trains(path):
    # The run config the header stores (YAML text) gives the file's architecture and
    # constants, and its sampler section is the one configs/<name>.yaml ships.
    from omegaconf import OmegaConf

    from experiments.run_config import load_config

    header = read_header(path)
    loaded = load_sampler(path.stem)
    stored = training_config(path)
    from_header = NNSGHMCArgs.from_header(header["architecture"], header["constants"])
    assert NNSGHMCArgs.from_config(stored.sampler) == from_header == loaded.arguments()
    assert (stored.sampler.eta, stored.sampler.lr) == (loaded.eta, loaded.lr)
    assert stored.sampler.calibrate_steps == 0 or float(loaded.momentum_std) != 1.0
    config = TESTS_DIR.parent / "configs" / f"{path.stem}.yaml"
    assert config.is_file(), f"no {config.name} for the shipped {path.name}"
    shipped = OmegaConf.to_container(load_config(config).sampler, enum_to_str=True)
    assert OmegaConf.to_container(stored.sampler, enum_to_str=True) == shipped


def test_header_not_json_or_incomplete(saved, tmp_path):
    _, path = saved
    bad = rewrite(path, tmp_path / "j.safetensors", metadata={HEADER_KEY: "{not json"})
    with pytest.raises(SamplerFileError, match="header is not valid JSON"):
        load_sampler(bad)
    bad = rewrite(path, tmp_path / "m.safetensors", header=lambda h: h["constants"].pop("alpha"))
    with pytest.raises(SamplerFileError, match=r"\['constants.alpha'\] missing"):
        load_sampler(bad)
    bad = rewrite(
        path, tmp_path / "t.safetensors", header=lambda h: h["constants"].update(alpha="big")
    )
    with pytest.raises(SamplerFileError, match="'constants.alpha' must be a finite number"):
        load_sampler(bad)
    bad = rewrite(
        path, tmp_path / "r.safetensors", header=lambda h: h["constants"].update(alpha=-1.0)
    )
    with pytest.raises(SamplerFileError, match=r"'constants.alpha' must be a number in \[0, "):
        load_sampler(bad)


def test_missing_and_extra_tensors(saved, tmp_path):
    _, path = saved
    bad = rewrite(path, tmp_path / "a.safetensors", tensors=lambda t: t.pop("f_q.head.bias"))
    with pytest.raises(SamplerFileError, match=r"missing: \['f_q.head.bias'\]"):
        load_sampler(bad)
    bad = rewrite(
        path, tmp_path / "b.safetensors", tensors=lambda t: t.update(bonus=torch.zeros(2))
    )
    with pytest.raises(SamplerFileError, match=r"unexpected: \['bonus'\]"):
        load_sampler(bad)


def test_shape_mismatch(saved, tmp_path):
    _, path = saved

    def widen(t):
        t["f_q.layers.1.weight"] = torch.zeros(7, 8)

    bad = rewrite(path, tmp_path / "s.safetensors", tensors=widen)
    with pytest.raises(
        SamplerFileError, match=r"f_q.layers.1.weight: expected \(6, 8\), got \(7, 8\)"
    ):
        load_sampler(bad)
    # The architecture in the header decides the expected shapes.
    bad = rewrite(
        path, tmp_path / "h.safetensors", header=lambda h: h["architecture"].update(d_hidden=[6])
    )
    with pytest.raises(
        SamplerFileError, match=r"f_d.layers.0.weight: expected \(6, 3\), got \(5, 3\)"
    ):
        load_sampler(bad)


def test_integer_tensor(saved, tmp_path):
    _, path = saved

    def to_int(t):
        t["f_d.head.bias"] = torch.zeros(1, dtype=torch.int32)

    bad = rewrite(path, tmp_path / "i.safetensors", tensors=to_int)
    with pytest.raises(SamplerFileError, match=r"'f_d.head.bias' has dtype 'I32'"):
        load_sampler(bad)


@pytest.mark.parametrize("name", ["f_d.layers.0.weight", "momentum_std"])
def test_non_finite_tensor(saved, tmp_path, name):
    _, path = saved

    def poison(t):
        t[name] = t[name].clone()
        t[name].view(-1)[0] = float("nan")

    bad = rewrite(path, tmp_path / "n.safetensors", tensors=poison)
    with pytest.raises(SamplerFileError, match=rf"'{re.escape(name)}' has 1 non-finite"):
        load_sampler(bad)


def test_corrupted_data_and_inconsistent_header(saved, tmp_path):
    _, path = saved

    def nudge(t):
        t["f_q.layers.0.weight"] = t["f_q.layers.0.weight"] + 1e-3

    bad = rewrite(path, tmp_path / "c.safetensors", tensors=nudge, resign=False)
    with pytest.raises(SamplerFileError, match="do not match the checksum"):
        load_sampler(bad)
    bad = rewrite(
        path, tmp_path / "d.safetensors", header=lambda h: h["statistics"].update(energy_std=9.0)
    )
    with pytest.raises(SamplerFileError, match="header says energy_std = 9.0"):
        load_sampler(bad)

    def zero_std(t):
        t["momentum_std"] = torch.tensor(0.0, dtype=torch.float64)

    bad = rewrite(path, tmp_path / "z.safetensors", tensors=zero_std)
    with pytest.raises(SamplerFileError, match="'momentum_std' must be > 0"):
        load_sampler(bad)


def test_training_config_reads_the_run_config_a_file_stores(tmp_path):
    shipped = training_config("toy_gaussian")  # by name, as load_sampler
    assert shipped.sampler.thermostat is True and shipped.sampler.curl_input == "stiffness"
    assert shipped.task.kind == "paper_train_gaussian"
    bare = tmp_path / "bare.safetensors"
    save_sampler(ms.load_sampler("toy_gaussian"), bare, provenance={"config": None})
    assert len(training_config(bare)) == 0


def test_a_missing_path_names_the_shipped_samplers_and_appended_bytes_are_told_apart(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"shipped samplers load by name: feedforward"):
        ms.load_sampler("feedforward.safetensors")  # the shipped name with its suffix
    from metasampler.export import PRETRAINED_DIR

    longer = tmp_path / "longer.safetensors"
    longer.write_bytes((PRETRAINED_DIR / "toy_gaussian.safetensors").read_bytes() + b"\0")
    with pytest.raises(ms.SamplerFileError, match=r"the file has \d+ \(bytes appended\?\)"):
        ms.load_sampler(longer)
    shorter = tmp_path / "shorter.safetensors"
    shorter.write_bytes((PRETRAINED_DIR / "toy_gaussian.safetensors").read_bytes()[:-1])
    with pytest.raises(ms.SamplerFileError, match=r"\(truncated\?\)"):
        ms.load_sampler(shorter)
