"""One cgroup per sandboxed shell: where this process may make them, making them, removing them.

Memory and process limits hold per shell only through a cgroup; making one means reading
mountinfo, delegating controllers, and retrying removal while a killed shell is reaped.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SandboxUnavailable"]

# Retries of removing a shell's cgroup while its last processes are reaped: 0.05 s, doubling
# up to 3.2 s between tries, for a minute in all (a loaded machine may take seconds to reap).
_RETRY_FIRST = 0.05
_RETRY_LAST = 3.2
_RETRY_FOR = 60.0


class SandboxUnavailable(OSError):
    """Raised instead of starting a shell unsandboxed; the shell reports it as an error result."""


@dataclass(frozen=True)
class _Cgroups:
    """Where this process makes one cgroup per shell: its own directory per controller."""

    version: int
    #: controller (``pids``, ``memory``) -> the ``orchmode-<pid>`` directory made for it
    bases: dict[str, Path]


_shell_ids = itertools.count(1)
_stale: set[Path] = set()  # shell cgroups whose removal failed (still busy): retried later
_retry_lock = threading.Lock()  # the set and the chain of retries, shared across threads
_retry_next: list[float | None] = [None]  # the running chain's next delay (None: no chain)
_retry_until = 0.0  # when the chain gives up (time.monotonic)


def _mount_points() -> tuple[dict[str, tuple[str, str]], tuple[str, str] | None]:
    """cgroup v1 mounts by controller, and the v2 mount: (mount point, mount root) each."""
    v1: dict[str, tuple[str, str]] = {}
    v2: tuple[str, str] | None = None
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            head, _, tail = line.partition(" - ")
            fields, extra = head.split(), tail.split()
            if len(fields) < 5 or len(extra) < 3:
                continue
            root, point = _unescape(fields[3]), _unescape(fields[4])
            if extra[0] == "cgroup2":
                v2 = (point, root)
            elif extra[0] == "cgroup":
                for option in extra[2].split(","):
                    v1.setdefault(option, (point, root))
    return v1, v2


def _unescape(path: str) -> str:
    """mountinfo writes spaces, tabs, newlines and backslashes in octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def _located(mount: tuple[str, str], cgroup_path: str) -> Path:
    point, root = mount
    if root != "/" and cgroup_path.startswith(root):
        cgroup_path = cgroup_path[len(root) :]
    return Path(point, cgroup_path.lstrip("/"))


@functools.cache
def _cgroups() -> _Cgroups | None:
    """Make this process's cgroup directories for shells, if the kernel lets us; else None.

    cgroup v1 (a hierarchy per controller): children of our own cgroups in the ``pids``
    and ``memory`` hierarchies. cgroup v2: a child of our own cgroup, when its controllers
    are already delegated to children (they cannot be while we are a member, except at
    the root). Anything else, such as a user without a writable cgroup: rlimits instead.
    """
    try:
        v1, v2 = _mount_points()
        with open("/proc/self/cgroup", encoding="utf-8") as fh:
            memberships = [line.rstrip("\n").split(":", 2) for line in fh]
    except OSError:
        return None
    memberships = [m for m in memberships if len(m) == 3]
    parents: dict[str, Path] = {}
    version = 1
    for _hierarchy, controllers, path in memberships:
        for controller in controllers.split(","):
            if controller in ("pids", "memory") and controller in v1:
                parents[controller] = _located(v1[controller], path)
    unified = [path for hierarchy, controllers, path in memberships if hierarchy == "0"]
    if not parents and v2 is not None and unified:
        mine = _located(v2, unified[0])
        try:
            delegated = (mine / "cgroup.subtree_control").read_text().split()
        except OSError:
            delegated = []
        parents = {c: mine for c in ("pids", "memory") if c in delegated}
        version = 2
    bases: dict[str, Path] = {}
    for controller, parent in parents.items():
        base = parent / f"orchmode-{os.getpid()}"
        try:
            _sweep_dead(parent)
            base.mkdir(exist_ok=True)
            if version == 2:  # hand the controller on to the shells' cgroups
                (base / "cgroup.subtree_control").write_text(f"+{controller}")
            if not (base / "cgroup.procs").exists():
                raise OSError("not a cgroup")
        except OSError:
            with contextlib.suppress(OSError):
                base.rmdir()
            continue
        bases[controller] = base
    if not bases:
        return None
    atexit.register(_remove_all, tuple(dict.fromkeys(bases.values())))
    return _Cgroups(version, bases)


def _sweep_dead(parent: Path) -> None:
    """Remove the cgroup directories of orchmode processes that died without cleaning up."""
    for entry in parent.glob("orchmode-*"):
        pid = entry.name.removeprefix("orchmode-")
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            _remove_all((entry,))


def _remove_all(bases: tuple[Path, ...]) -> None:
    """Remove every shell cgroup under ``bases``, then the bases (busy ones are left)."""
    for base in bases:
        for child in base.glob("shell-*"):
            with contextlib.suppress(OSError):
                child.rmdir()
        with contextlib.suppress(OSError):
            base.rmdir()


def _make_shell_cgroups(cgroups: _Cgroups, processes: int, memory_bytes: int) -> list[Path]:
    """A new cgroup in each hierarchy for one shell, with its limits written."""
    with _retry_lock:
        stale = list(_stale)
    _remove_cgroups(stale)
    name = f"shell-{next(_shell_ids)}"
    made: list[Path] = []
    try:
        for base in dict.fromkeys(cgroups.bases.values()):
            path = base / name
            path.mkdir()
            made.append(path)
            if cgroups.bases.get("pids") == base:
                (path / "pids.max").write_text(str(processes))
            if cgroups.bases.get("memory") == base:
                limit = "memory.limit_in_bytes" if cgroups.version == 1 else "memory.max"
                (path / limit).write_text(str(memory_bytes))
                if cgroups.version == 2 and (path / "memory.swap.max").exists():
                    (path / "memory.swap.max").write_text("0")
    except OSError as exc:
        _remove_cgroups(made)
        raise SandboxUnavailable(f"could not make the shell's cgroup: {exc}") from exc
    return made


def _remove_cgroups(paths: list[Path]) -> None:
    """Remove shell cgroups; one still busy is retried for a while, on a timer thread.

    A killed shell's last processes are reaped a moment after its pipe closes, and a
    cgroup cannot be removed until they are. The removal is often called from a worker
    thread (a shell's close does its kernel work off the event loop), so the retries run
    on their own daemon timer, not on a loop. Whatever they miss is tried again by the
    next shell to start and at exit.
    """
    global _retry_until
    with _retry_lock:
        busy = [path for path in paths if not _removed(path)]
        if not busy:
            return
        if not _stale.issuperset(busy):  # each newly busy one gets its minute of retries
            _retry_until = time.monotonic() + _RETRY_FOR
        _stale.update(busy)
        if _retry_next[0] is not None:
            return  # a chain of retries is already running: it takes these up
        _retry_next[0] = _RETRY_FIRST
    _retry_after(_RETRY_FIRST)


def _removed(path: Path) -> bool:
    """Remove one cgroup directory; False when it is still busy."""
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    _stale.discard(path)
    return True


def _retry_after(delay: float) -> None:
    timer = threading.Timer(delay, _retry_stale, (delay,))
    timer.daemon = True  # never holds up the process's exit (atexit sweeps what is left)
    timer.start()


def _retry_stale(delay: float) -> None:
    with _retry_lock:
        for path in list(_stale):
            _removed(path)
        if not _stale or time.monotonic() >= _retry_until:
            _retry_next[0] = None
            return
        delay = min(delay * 2, _RETRY_LAST)
        _retry_next[0] = delay
    _retry_after(delay)
