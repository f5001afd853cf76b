"""The per-process run directories of workspaces: their names, removing them, sweeping dead
ones.

A run's directory is named ``<host>-<pid>-<id>``, so that a later start can tell, without
any record, which ones belong to processes on this host that died (``kill -9``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

from ..core.pids import pid_alive


def run_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def held_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` across processes, waited for: sessions starting
    together in one directory set its store up one after the other."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing lets the lock go


def write_file(path: Path, text: str) -> None:
    """Write ``text`` whole, and only if it differs: another session's git may be reading the
    file at that moment, and must see the old text or the new, never a cut one."""
    with contextlib.suppress(OSError):
        if path.read_text() == text:
            return
    partial = path.with_name(f".{path.name}-{uuid.uuid4().hex[:8]}")
    partial.write_text(text)
    os.replace(partial, path)


def remove_index(index: Path) -> None:
    """An index file, and the lock a git stopped by a signal leaves beside it."""
    for path in (index, index.with_name(index.name + ".lock")):
        with contextlib.suppress(OSError):
            path.unlink()


def remove_tree(path: Path) -> None:
    """Remove a copy, even one whose agent made files read-only."""

    def writable(function: object, name: str, _exc: object) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(name), 0o700)
            # only a directory: a file may be a hard link to the user's own (a checkout's)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, 0o700)
            if os.path.isdir(name) and not os.path.islink(name):
                shutil.rmtree(name, ignore_errors=True)
            else:
                os.unlink(name)

    if path.exists() or path.is_symlink():
        shutil.rmtree(path, onerror=writable)


def remove_workspace(home: Path) -> None:
    """Remove an overlay workspace's directory: most hold nothing but empty directories
    (overlayfs's scratch one unreadable), removed one by one without a walk."""
    for name in ("mnt", "check-mnt", "check", "work/work", "work", "upper"):
        with contextlib.suppress(OSError):
            os.rmdir(home / name)
    try:
        os.rmdir(home)
    except FileNotFoundError:
        return
    except OSError:
        remove_tree(home)  # an upper layer with the agent's writes in it


def sweep_dead_runs(runs: Path) -> list[Path]:
    """Remove the copies of orchmode processes on this host that are gone; which ones."""
    removed: list[Path] = []
    host = socket.gethostname()
    with contextlib.suppress(OSError):
        for entry in runs.iterdir():
            owner, _, rest = entry.name.rpartition("-")  # <host>-<pid>-<id>
            owner_host, _, pid = owner.rpartition("-")
            if owner_host != host or not pid.isdigit() or not rest:
                continue
            if int(pid) == os.getpid() or pid_alive(int(pid)):
                continue
            remove_tree(entry)
            removed.append(entry)
    return removed
