"""Publishing a results directory as a whole, and cleaning what killed runs left behind.

A run builds its results in a *staging* directory next to the final one, named
``.<name>.partial-<host>-<pid>-<8 hex>``, and :func:`publish_directory` swaps it in:

* on Linux with ``renameat2(RENAME_EXCHANGE)`` (one atomic system call: readers see the
  previous directory or the new one, never a mix, and the previous one stays until then);
* elsewhere with two renames: the previous directory is first renamed to
  ``.<name>.previous-<host>-<pid>-<8 hex>``; a kill between the two renames leaves no
  ``<name>`` but that copy, which :func:`clean_stale` renames back at the next run.

Staging directories and temporary files carry the host and process id that made them, so
:func:`clean_stale` and :func:`remove_stale_files` remove only entries that are *clearly
ours* (exactly our naming pattern) and *clearly stale* (made on this host by a process that
no longer runs); ``legacy`` names without a process id (written by older releases) count as
stale once they are older than :data:`LEGACY_STALE_SECONDS`.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import socket
import time
import uuid
from pathlib import Path

__all__ = [
    "LEGACY_STALE_SECONDS",
    "clean_stale",
    "new_staging_dir",
    "owner_tag",
    "publish_directory",
    "remove_stale_files",
]

#: Age after which an entry of an older naming scheme (no process id) counts as stale.
LEGACY_STALE_SECONDS = 24 * 3600.0

_TAG = r"(?P<host>[A-Za-z0-9_.]+)-(?P<pid>\d+)-[0-9a-f]{8}"
_LEGACY_STAGING = r"[0-9a-f]{8}"  # ".<name>.partial-<8 hex>" of earlier releases


def owner_tag() -> str:
    """``<host>-<pid>-<8 hex>``: who made a staging directory or temporary file, unique."""
    host = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _owner_gone(match: re.Match) -> bool:
    """Whether the process named by a :data:`_TAG` match has ended (on this host)."""
    host = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"
    if match.group("host") != host:
        return False  # another machine's run (shared file system): not ours to judge
    pid = int(match.group("pid"))
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists but belongs to someone else
        return False
    return False


def _is_old(path: Path) -> bool:
    try:
        return time.time() - path.lstat().st_mtime > LEGACY_STALE_SECONDS
    except OSError:
        return False


def new_staging_dir(parent: str | os.PathLike, name: str) -> Path:
    """Create and return an empty staging directory for ``parent / name``."""
    path = Path(parent) / f".{name}.partial-{owner_tag()}"
    path.mkdir(parents=False)
    return path


def clean_stale(parent: str | os.PathLike, name: str) -> list[Path]:
    """Remove stale staging directories of ``parent / name`` and finish an interrupted
    two-rename publish; returns what was removed or restored."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    staging = re.compile(rf"\.{re.escape(name)}\.partial-(?:{_TAG}|(?P<legacy>{_LEGACY_STAGING}))")
    previous = re.compile(rf"\.{re.escape(name)}\.previous-{_TAG}")
    final = parent / name
    touched = []
    for entry in sorted(parent.iterdir()):
        if not entry.is_dir() or entry.is_symlink():
            continue
        match = staging.fullmatch(entry.name)
        if match and (_is_old(entry) if match.group("legacy") else _owner_gone(match)):
            shutil.rmtree(entry, ignore_errors=True)
            touched.append(entry)
            continue
        match = previous.fullmatch(entry.name)
        if match and _owner_gone(match):
            if final.exists():
                shutil.rmtree(entry, ignore_errors=True)
            else:  # killed between the two renames: the previous results come back
                os.rename(entry, final)
            touched.append(entry)
    return touched


def remove_stale_files(directory: str | os.PathLike, prefix: str, suffix: str) -> list[Path]:
    """Remove files ``<prefix><tag><suffix>`` in ``directory`` whose owner has ended, and
    ``<prefix><32 hex><suffix>`` (older releases) older than :data:`LEGACY_STALE_SECONDS`."""
    directory = Path(directory)
    pattern = re.compile(
        rf"{re.escape(prefix)}(?:{_TAG}|(?P<legacy>[0-9a-f]{{32}})){re.escape(suffix)}"
    )
    removed = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if not match or not entry.is_file() or entry.is_symlink():
            continue
        if _is_old(entry) if match.group("legacy") else _owner_gone(match):
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths with ``renameat2(RENAME_EXCHANGE)``; ``False`` where the
    system or file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    renameat2.argtypes += [ctypes.c_uint]
    result = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return result == 0


def publish_directory(staging: str | os.PathLike, final: str | os.PathLike) -> None:
    """Make the complete directory ``staging`` the directory ``final``, replacing any previous
    one as a whole; the previous contents stay in place until the swap. Afterwards
    ``staging`` no longer exists."""
    staging, final = Path(staging), Path(final)
    if not final.exists():
        os.rename(staging, final)
        return
    if not final.is_dir() or final.is_symlink():
        raise NotADirectoryError(f"{final} exists and is not a directory; not replacing it")
    if _exchange(staging, final):
        shutil.rmtree(staging, ignore_errors=True)  # now the previous results
        return
    previous = final.parent / f".{final.name}.previous-{owner_tag()}"
    os.rename(final, previous)
    os.rename(staging, final)
    shutil.rmtree(previous, ignore_errors=True)
