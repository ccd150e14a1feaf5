"""Checking a ``device`` argument before any work is done on it.

``torch.device`` accepts names this build or machine cannot use (``"cuda"`` on a CPU-only
build, ``"cuda:3"`` on a one-GPU machine), and the failure then surfaces deep inside the
first tensor operation or random generator. :func:`check_device` parses the argument and
checks that the device is usable here, so that a bad argument is one
:class:`DeviceError` naming the argument and what is wrong.
"""

from __future__ import annotations

import torch

__all__ = ["DeviceError", "check_device"]


class DeviceError(ValueError):
    """A ``device`` argument that is not a device name, or names a device that this torch
    build or machine does not have. The message names the argument and its value."""


def check_device(
    device: torch.device | str | int | None, argument: str = "device"
) -> torch.device | None:
    """``device`` parsed into a :class:`torch.device` that this build and machine can use.

    Accepted: the CPU (``"cpu"``); CUDA (``"cuda"``, ``"cuda:<index>"`` or an ``int`` index)
    where torch has CUDA and that GPU is visible; Apple's ``"mps"`` and Intel's ``"xpu"``
    where available. ``None`` is returned unchanged (the caller's default applies).

    Args:
        device: what the caller was given.
        argument: the argument's name, for the message (e.g. ``"device"``).

    Returns:
        The parsed device, or ``None``.

    Raises:
        DeviceError: ``device`` is not a ``str``, ``int`` or ``torch.device``; not a device
            name; or a device that is not available here (the message says which part).
    """
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise DeviceError(
            f"{argument} must be a device name such as 'cpu' or 'cuda:0' (or a torch.device), "
            f"got {type(device).__name__} {device!r}"
        )
    given = device
    if isinstance(device, int):
        if device < 0:
            raise DeviceError(f"{argument}={device!r}: a CUDA device index must be >= 0")
        device = f"cuda:{device}"
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise DeviceError(
            f"{argument}={device!r} is not a device name: expected 'cpu', 'cuda', 'cuda:<index>' "
            "or 'mps'"
        ) from None
    problem = _unavailable(parsed)
    if problem is not None:
        shown = given if isinstance(given, int) else str(given)
        raise DeviceError(f"{argument}={shown!r}: {problem}; use {argument}='cpu'")
    return parsed


def _unavailable(device: torch.device) -> str | None:
    """Why ``device`` cannot be used here (``None`` if it can)."""
    kind, index = device.type, device.index
    if kind == "cpu":
        return None if index in (None, 0) else "there is one CPU device, 'cpu' (index 0)"
    if kind == "cuda":
        if torch.version.cuda is None and torch.version.hip is None:
            return f"this torch build ({torch.__version__}) has no CUDA support"
        if not torch.cuda.is_available():
            return "no CUDA GPU is visible (check the driver and CUDA_VISIBLE_DEVICES)"
        count = torch.cuda.device_count()
        if index is not None and index >= count:
            return f"there is no CUDA device {index}: {count} visible (cuda:0 to cuda:{count - 1})"
        return None
    if kind == "mps":
        mps = getattr(torch.backends, "mps", None)
        return None if mps is not None and mps.is_available() else "MPS is not available here"
    if kind == "xpu":
        xpu = getattr(torch, "xpu", None)
        return None if xpu is not None and xpu.is_available() else "XPU is not available here"
    return f"{kind!r} devices are not supported for sampling (use 'cpu', 'cuda' or 'mps')"
