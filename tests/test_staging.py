"""Results published as a whole; stale staging and temporary files cleaned (issue #15)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from metasampler import staging
from metasampler.staging import clean_stale, new_staging_dir, publish_directory


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def host() -> str:
    return staging.owner_tag().rsplit("-", 2)[0]


def fill(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


def contents(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.iterdir())}


OLD = {"results.json": "old", "table.md": "old", "extra.txt": "old only"}
NEW = {"results.json": "new", "table.md": "new", "tuning.csv": "new"}


@pytest.mark.parametrize("exchange", [True, False])
def test_publish_swaps_the_whole_directory(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(staging, "_exchange", lambda a, b: False)
    final = fill(tmp_path / "run", OLD)
    stage = fill(new_staging_dir(tmp_path, "run"), NEW)
    publish_directory(stage, final)
    assert contents(final) == NEW  # nothing of the previous run mixed in
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_publish_into_a_new_place(tmp_path):
    stage = fill(new_staging_dir(tmp_path, "run"), NEW)
    publish_directory(stage, tmp_path / "run")
    assert contents(tmp_path / "run") == NEW and not stage.exists()


@pytest.mark.parametrize("exchange", [True, False])
@pytest.mark.parametrize("kill_at", [1, 2, 3])
def test_a_kill_during_publish_leaves_old_or_new_results_never_a_mix(
    tmp_path, monkeypatch, exchange, kill_at
):
    """Every system call of the publish step is a possible kill point: afterwards (and after
    the next run's clean-up) the results directory is entirely old or entirely new."""
    calls = {"n": 0}

    def killable(real):
        def wrapper(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == kill_at:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        return wrapper

    if not exchange:
        monkeypatch.setattr(staging, "_exchange", lambda a, b: False)
    else:
        monkeypatch.setattr(staging, "_exchange", killable(staging._exchange))
    monkeypatch.setattr(staging.os, "rename", killable(os.rename))
    monkeypatch.setattr(staging.shutil, "rmtree", killable(staging.shutil.rmtree))
    final = fill(tmp_path / "run", OLD)
    stage = fill(new_staging_dir(tmp_path, "run"), NEW)
    try:
        publish_directory(stage, final)
    except KeyboardInterrupt:
        pass
    monkeypatch.undo()
    # The killed process is gone: its leftovers are now stale for the next run.
    monkeypatch.setattr(staging, "_owner_gone", lambda match: True)
    clean_stale(tmp_path, "run")
    assert contents(final) in (OLD, NEW)
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_clean_stale_removes_only_clearly_stale_entries_of_this_run(tmp_path):
    dead, alive = dead_pid(), os.getppid()
    stale = fill(tmp_path / f".run.partial-{host()}-{dead}-0123abcd", {"a": "1"})
    legacy = fill(tmp_path / ".run.partial-0123abcd", {"a": "1"})
    os.utime(legacy, (0, 0))  # an old release's staging, long abandoned
    keep = [
        fill(tmp_path / f".run.partial-{host()}-{alive}-0123abcd", {"a": "1"}),  # running
        fill(tmp_path / f".run.partial-otherhost-{dead}-0123abcd", {"a": "1"}),  # not ours
        fill(tmp_path / f".other.partial-{host()}-{dead}-0123abcd", {"a": "1"}),  # other run
        fill(tmp_path / ".run.partial-4567abcd", {"a": "1"}),  # recent legacy: maybe running
        fill(tmp_path / ".run.partial-notours", {"a": "1"}),
        fill(tmp_path / "run", {"r": "1"}),
    ]
    removed = clean_stale(tmp_path, "run")
    assert sorted(removed) == sorted([stale, legacy])
    assert all(p.exists() for p in keep) and not stale.exists() and not legacy.exists()


def test_clean_stale_restores_results_a_kill_left_between_two_renames(tmp_path):
    previous = fill(tmp_path / f".run.previous-{host()}-{dead_pid()}-0123abcd", OLD)
    clean_stale(tmp_path, "run")
    assert contents(tmp_path / "run") == OLD and not previous.exists()


def test_remove_stale_files(tmp_path):
    dead = dead_pid()
    stale = tmp_path / f".s.safetensors.{host()}-{dead}-0123abcd.tmp"
    legacy = tmp_path / f".s.safetensors.{'a' * 32}.tmp"
    live = tmp_path / f".s.safetensors.{host()}-{os.getppid()}-0123abcd.tmp"
    other = tmp_path / f".t.safetensors.{host()}-{dead}-0123abcd.tmp"
    for path in (stale, legacy, live, other):
        path.write_text("x")
    os.utime(legacy, (0, 0))
    removed = staging.remove_stale_files(tmp_path, ".s.safetensors.", ".tmp")
    assert sorted(removed) == sorted([stale, legacy])
    assert live.exists() and other.exists()
