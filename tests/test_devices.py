"""The ``device`` argument: checked once, before any work, with a message naming it."""

from __future__ import annotations

import pytest
import torch

import metasampler as ms
from metasampler.devices import DeviceError, check_device


def quadratic() -> ms.EnergyTarget:
    return ms.EnergyTarget(lambda x: 0.5 * (x**2).sum(-1), dim=2)


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("bogus", r"device='bogus' is not a device name: expected 'cpu', 'cuda'"),
        ("", r"device='' is not a device name"),
        ("cuda:x", r"device='cuda:x' is not a device name"),
        (-1, r"device=-1: a CUDA device index must be >= 0"),
        (1.5, r"device must be a device name .* got float 1.5"),
        (True, r"device must be a device name .* got bool True"),
        ("cpu:3", r"device='cpu:3': there is one CPU device"),
        ("meta", r"device='meta': 'meta' devices are not supported for sampling"),
    ],
)
def test_bad_devices_raise_a_device_error_naming_the_argument(device, message):
    with pytest.raises(DeviceError, match=message):
        check_device(device)
    assert issubclass(DeviceError, ValueError)


def test_good_devices_are_parsed_and_none_passes_through():
    assert check_device("cpu") == torch.device("cpu")
    assert check_device(torch.device("cpu")) == torch.device("cpu")
    assert check_device(None) is None


def test_cuda_on_a_build_without_cuda_says_so(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    with pytest.raises(
        DeviceError, match=r"device='cuda': this torch build .* has no CUDA support"
    ):
        check_device("cuda")
    with pytest.raises(DeviceError, match=r"device=0: this torch build"):
        check_device(0)


def test_cuda_index_past_the_visible_gpus_is_named(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(DeviceError, match=r"there is no CUDA device 2: 2 visible"):
        check_device("cuda:2", "where")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match=r"device='cuda': no CUDA GPU is visible"):
        check_device("cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_sample_and_load_sampler_check_the_device_first():
    sgld = ms.samplers.SGLD(lr=0.01)
    for device in ("cuda", "bogus"):
        with pytest.raises(DeviceError, match=f"device='{device}'"):
            ms.sample(sgld, quadratic(), 2, 5, device=device, progress=False)
        with pytest.raises(DeviceError, match=f"device='{device}'"):
            ms.load_sampler("toy_gaussian", device=device)
        with pytest.raises(DeviceError, match=f"device='{device}'"):
            ms.BayesianModel(torch.nn.Linear(2, 1), (torch.ones(3, 2), torch.ones(3)),
                             likelihood="gaussian", device=device)  # fmt: skip
    result = ms.sample(sgld, quadratic(), 2, 5, device="cpu", progress=False)
    assert result.theta.device.type == "cpu"


def test_load_sampler_of_none_is_a_type_error_naming_the_argument():
    with pytest.raises(
        TypeError, match=r"load_sampler: expected a sampler file's path .* got NoneType None"
    ):
        ms.load_sampler(None)
    with pytest.raises(TypeError, match=r"got int 3"):
        ms.load_sampler(3, device="bogus")  # (the path is checked before anything else)


def test_the_file_readers_given_a_loaded_sampler_say_they_need_its_path():
    from metasampler.export import read_header, training_config
    from metasampler.learned.ablation import stored_net_means

    loaded = ms.load_sampler("toy_gaussian")
    for reader in (read_header, training_config, stored_net_means):
        name = reader.__name__
        with pytest.raises(
            TypeError, match=rf"^{name}: expected a sampler file's path .* got NNSGHMC"
        ):
            reader(loaded)
    assert stored_net_means("toy_gaussian").keys() >= {"q", "f_d"}  # a name still works
