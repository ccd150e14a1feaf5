"""One build of a compiled step per configuration per machine: the build holds a lock in the
cache directory; other processes (and forked children) wait for its package instead of
starting their own build. The builds here are stand-in processes that hold the lock the way a
real build does (inherited from the process that started it), so no compiler is needed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import pytest
import torch
from compiled_packages import empty_package_registries

from metasampler.learned import aot

KEY = "0123456789abcdef0123456789abcdef"

pytestmark = pytest.mark.skipif(aot.fcntl is None, reason="needs fcntl (POSIX)")


class Spec:
    """What the dispatch reads of a kernel spec."""

    def digest(self) -> str:
        return KEY

    def to_json(self) -> str:
        return "{}"


# A stand-in build: holds whatever lock it inherited; on "go" writes the package (or fails).
BUILD = """
import pathlib, sys, time
package, go = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
while not go.exists():
    time.sleep(0.02)
if go.read_text() == "fail":
    print("error: the compiler failed", flush=True)
    package.with_suffix(".failed").write_text("exit status 1")
    sys.exit(1)
if go.read_text() == "ok":
    package.write_text("package")
"""


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    """Fresh registries, packages in ``tmp_path``; a package "loads" when its file exists."""
    empty_package_registries(monkeypatch, tmp_path)
    monkeypatch.setattr(aot, "_POLL_SECONDS", 0.0)
    monkeypatch.setattr(aot, "_intact", lambda package: package.exists())

    def load(key, package):
        aot._RUNNERS[key] = runner = lambda *flat: "compiled"  # noqa: E731
        return runner

    monkeypatch.setattr(aot, "_load", load)
    return tmp_path


def package_of(cache: Path) -> Path:
    return cache / f"{KEY}.pt2"


def another_process_building(cache: Path) -> subprocess.Popen:
    """A process holding the build lock of ``KEY`` as a build started elsewhere does."""
    package = package_of(cache)
    hold = "import fcntl, sys; f = open(sys.argv[3], 'a+b'); fcntl.flock(f, fcntl.LOCK_EX)\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", hold + "print('locked', flush=True)\n" + BUILD, str(package),
         str(cache / "go"), str(aot._lock_path(package))],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "locked"
    return proc


def held_by_someone(cache: Path) -> bool:
    handle = aot._take_lock(package_of(cache), block=False)
    if handle is None:
        return True
    handle.close()
    return False


def stand_in_start(started: list):
    """An ``aot._start`` that runs :data:`BUILD` with the lock it is handed."""

    def start(spec, package):
        lock = aot._STARTING_LOCK.get(package)
        started.append(lock)
        return subprocess.Popen(
            [sys.executable, "-c", BUILD, str(package), str(package.parent / "go")],
            pass_fds=() if lock is None else (lock,),
        )

    return start


def test_a_process_that_finds_the_lock_held_waits_and_loads_the_package(cache, monkeypatch, capsys):
    other = another_process_building(cache)
    monkeypatch.setattr(aot, "_start", lambda *a: pytest.fail("started a second build"))
    for _ in range(3):  # eager steps meanwhile; one notice
        assert aot._runner(Spec(), wait=False) is None
    err = capsys.readouterr().err
    assert err.count("another process is compiling the NNSGHMC step") == 1
    assert str(aot._lock_path(package_of(cache))) in err and "eager steps run meanwhile" in err
    threads = torch.get_num_threads()
    try:  # the other build runs on a core of this machine: eager steps leave it one
        torch.set_num_threads(2)
        with aot.leaving_a_core_to_builds():
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    (cache / "go").write_text("ok")
    other.wait()
    assert aot._runner(Spec(), wait=False)() == "compiled"
    assert aot._WAITING == {} and aot._BUILDS == {} and not aot._FAILED


def test_compile_true_waits_for_the_other_process_build(cache, monkeypatch, capsys):
    other = another_process_building(cache)
    monkeypatch.setattr(aot, "_start", lambda *a: pytest.fail("started a second build"))
    later = "import time, sys; time.sleep(1.0); open(sys.argv[1], 'w').write('ok')"
    release = subprocess.Popen([sys.executable, "-c", later, str(cache / "go")])
    started = time.perf_counter()
    runner = aot._runner(Spec(), wait=True)
    assert runner is not None and runner() == "compiled"
    assert time.perf_counter() - started > 0.8  # it waited for the other build
    assert "waiting for it" in capsys.readouterr().err
    release.wait()
    other.wait()


def test_a_failed_build_elsewhere_is_reported_not_rebuilt(cache, monkeypatch):
    other = another_process_building(cache)
    monkeypatch.setattr(aot, "_start", lambda *a: pytest.fail("rebuilt a failing build"))
    assert aot._runner(Spec(), wait=False) is None
    package_of(cache).with_suffix(".log").write_text("error: the compiler failed")
    (cache / "go").write_text("fail")
    other.wait()
    failed = r"unavailable \(the build by another process failed.*compiler failed"
    with pytest.warns(UserWarning, match=failed):
        assert aot._runner(Spec(), wait=False) is None
    assert len(aot._FAILED) == 1


def test_a_build_killed_elsewhere_is_taken_over_by_the_next_process(cache, monkeypatch):
    other = another_process_building(cache)
    started: list = []
    monkeypatch.setattr(aot, "_start", stand_in_start(started))
    assert aot._runner(Spec(), wait=False) is None and started == []
    other.kill()
    other.wait()
    assert aot._runner(Spec(), wait=False) is None  # takes the lock: builds here
    assert len(started) == 1 and isinstance(started[0], int) and len(aot._BUILDS) == 1
    assert held_by_someone(cache)  # the build holds the lock it inherited
    (cache / "go").write_text("ok")
    aot._BUILDS[KEY].wait()
    assert not held_by_someone(cache)
    assert aot._runner(Spec(), wait=False)() == "compiled" and len(started) == 1


def test_the_build_holds_the_lock_so_a_second_process_starts_none(cache, monkeypatch):
    started: list = []
    monkeypatch.setattr(aot, "_start", stand_in_start(started))
    assert aot._runner(Spec(), wait=False) is None and len(started) == 1
    assert held_by_someone(cache)
    # Another process, the same configuration: it sees the lock and never builds.
    code = (
        "import sys; sys.path[:0] = sys.argv[2:]; from metasampler.learned import aot; "
        "import pathlib; aot._intact = lambda p: p.exists(); "
        "spec = type('S', (), {'digest': lambda s: sys.argv[1], 'to_json': lambda s: '{}'})(); "
        "aot._start = lambda *a: sys.exit('a second build started'); "
        "aot._runner(spec, wait=False); print('waiting' if aot._WAITING else 'not waiting')"
    )
    root = str(Path(aot.__file__).resolve().parents[2])
    env = {**os.environ, aot.CACHE_ENV: str(cache)}
    second = subprocess.run(
        [sys.executable, "-c", code, KEY, root, str(Path(__file__).parent.parent)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "waiting"
    assert "another process is compiling" in second.stderr
    (cache / "go").write_text("ok")
    aot._BUILDS[KEY].wait()


def test_a_forked_child_waits_for_its_parents_build_without_a_warning(cache, monkeypatch):
    started: list = []
    monkeypatch.setattr(aot, "_start", stand_in_start(started))
    assert aot._runner(Spec(), wait=False) is None and len(aot._BUILDS) == 1
    why = cache / "child_failure.txt"
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status, never return into pytest
        status = 1
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # ("unavailable (the build exited with 0 ...)")
                assert aot._BUILDS == {} and KEY in aot._WAITING
                assert aot._runner(Spec(), wait=False) is None  # still building
                deadline = time.monotonic() + 30
                while aot._runner(Spec(), wait=False) is None and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert aot._RUNNERS[KEY]() == "compiled" and len(started) == 1
                status = 0
        except BaseException as err:  # what failed, for the parent's assertion message
            why.write_text(f"{type(err).__name__}: {err}\n{traceback.format_exc()}")
        finally:
            os._exit(status)
    time.sleep(0.3)
    (cache / "go").write_text("ok")
    aot._BUILDS[KEY].wait()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, why.read_text() if why.exists() else ""
    assert aot._runner(Spec(), wait=False)() == "compiled"


def test_wait_for_builds_waits_for_another_process_build(cache, monkeypatch):
    other = another_process_building(cache)
    monkeypatch.setattr(aot, "_start", lambda *a: pytest.fail("started a second build"))
    assert aot._runner(Spec(), wait=False) is None
    with pytest.raises(subprocess.TimeoutExpired):
        aot.wait_for_builds(timeout=0.2)
    (cache / "go").write_text("ok")
    aot.wait_for_builds(timeout=30)
    other.wait()
    assert aot._runner(Spec(), wait=False)() == "compiled"
