"""Test helper for the compiled step's packages (``metasampler.learned.aot``): a process
state as fresh as a new interpreter's. Imported as ``statistical`` is (see its docstring)."""

from __future__ import annotations

from pathlib import Path

import pytest


def empty_package_registries(patch: pytest.MonkeyPatch, cache: Path | None = None) -> None:
    """No package loaded, building or failed in this process (as in a fresh one), and packages
    kept in ``cache`` when given."""
    from metasampler.learned import aot

    if cache is not None:
        patch.setenv(aot.CACHE_ENV, str(cache))
    for name in ("_RUNNERS", "_BUILDS", "_WAITING", "_STARTING_LOCK"):
        patch.setattr(aot, name, {})
    patch.setattr(aot, "_FAILED", set())
