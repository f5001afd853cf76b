"""What an agent may write: the disk it takes, the free disk it leaves, the files a change holds.

Three limits, each enforced where it is cheapest and exact (see ``docs/isolation.md``):

- **one file** is capped by the kernel: the sandbox sets ``RLIMIT_FSIZE`` to
  ``agent_write_mb`` (:meth:`orchmode.shell.policy.SandboxPolicy.limits_script`), so no
  process of an agent's grows a file past it (``File too large``);
- **all it writes** is measured by a :class:`WriteWatch`: a walk of the overlay's upper
  layer (which holds only what the agent wrote), or of its copy, on a thread, every so
  often and after each command; once it passes ``agent_write_mb``, or the disk holding
  the workspace has less than ``min_free_disk_mb`` free, the agent's shell is stopped and
  it may only report (:class:`orchmode.executors.subagent.Subagent`);
- **a change** holds no file over ``change_file_max_mb``, and no more than
  :data:`CHANGE_TOTAL_FILES` times that in all (:func:`left_out_of`): a larger file is
  left out of the patch and named, never handed to git to hash and diff (a 3 GB file is
  more than git can diff in memory, and more than the journal can hold).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..core.settings import Settings
from .patches import printable

MB = 1 << 20
#: A change may hold this many times ``change_file_max_mb`` in all (the journal keeps the
#: patch whole, and SQLite holds a value of 1 GB at most: 500 MB of files, once deflated
#: and written as base 85, stays below it).
CHANGE_TOTAL_FILES = 5
#: The watch's pause between two looks: :data:`WATCH_BASE`, or longer so that it spends at
#: most :data:`WATCH_SHARE` of the time walking (a large copy is looked at less often);
#: shorter as the cap or the floor nears at the rate last seen, but not below
#: :data:`WATCH_MIN`.
WATCH_MIN = 0.05
WATCH_BASE = 0.1
WATCH_SHARE = 0.02


@dataclass(frozen=True)
class DiskLimits:
    """The three limits, in bytes (one megabyte is 2**20 bytes, as ``ulimit`` counts)."""

    #: What one agent may write in its workspace, all files together (and one file alone).
    write: int = 2048 * MB
    #: Free disk below which writing agents are stopped.
    floor: int = 1024 * MB
    #: The largest file a change may hold.
    change_file: int = 100 * MB

    @classmethod
    def from_settings(cls, settings: Settings) -> DiskLimits:
        return cls(
            settings.agent_write_mb * MB,
            settings.min_free_disk_mb * MB,
            settings.change_file_max_mb * MB,
        )

    @property
    def change_total(self) -> int:
        return CHANGE_TOTAL_FILES * self.change_file


def mb(size: int) -> str:
    """``size`` bytes as people read it: ``812 MB``, ``3.0 GB``."""
    if size >= 10 * 1024 * MB:
        return f"{size / (1024 * MB):.0f} GB"
    if size >= 1024 * MB:
        return f"{size / (1024 * MB):.1f} GB"
    return f"{size / MB:.0f} MB" if size >= 100 * MB else f"{size / MB:.1f} MB"


# -------------------------------------------------------------------------- measuring


def written_size(root: Path) -> int:
    """Bytes of the files under ``root``: what an agent wrote there, as git would have to
    read it (a sparse file counts its size), each hard-linked file once.

    One ``scandir`` per directory, whose entries carry their kind; only files are stat'ed.
    """
    total = 0
    linked: set[tuple[int, int]] = set()
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
                            continue
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # gone since it was listed
                    if info.st_nlink > 1 and stat.S_ISREG(info.st_mode):
                        if (info.st_dev, info.st_ino) in linked:
                            continue
                        linked.add((info.st_dev, info.st_ino))
                    total += info.st_size
        except OSError:
            pass  # removed while walked, or unreadable: what is not there takes nothing
    return total


def free_disk(path: Path) -> int:
    """Bytes an unprivileged user may still write on the file system holding ``path`` (or
    its nearest existing parent)."""
    for candidate in (path, *path.parents):
        try:
            found = os.statvfs(candidate)
        except OSError:
            continue
        return found.f_bavail * found.f_frsize
    return 1 << 62


def floor_problem(path: Path, limits: DiskLimits, what: str, free: int | None = None) -> str | None:
    """Why writing agents must stop now: the disk holding ``path`` (``what`` names it) has
    less free than the floor; None while it has enough. ``free``: its free bytes, when
    the caller has just read them."""
    if limits.floor <= 0:
        return None
    if free is None:
        free = free_disk(path)
    if free >= limits.floor:
        return None
    return (
        f"the disk holding {what} has {mb(free)} free, below min_free_disk_mb "
        f"({limits.floor // MB})"
    )


def cap_problem(written: int, limits: DiskLimits) -> str | None:
    """Why an agent that wrote ``written`` bytes must stop; None up to the cap (one file
    cut at it by ``RLIMIT_FSIZE`` is not past it: the agent was told, and may go on)."""
    if written <= limits.write:
        return None
    cap = limits.write // MB
    return f"it wrote {mb(written)} in its workspace, past agent_write_mb ({cap})"


# ---------------------------------------------------------------------------- watching


class WriteWatch:
    """Watches one writing agent: what it wrote (``measure``, None where it cannot be
    measured: an agent in the working directory itself) and the free disk at ``disk``.
    The first time either passes its limit, ``stop(reason)`` is called, once; the reason
    stays in :attr:`reason`."""

    def __init__(
        self,
        limits: DiskLimits,
        disk: Path,
        measure: Callable[[], int] | None,
        stop: Callable[[str], None],
        *,
        where: str = "its workspace",
    ) -> None:
        self.limits = limits
        self.disk = disk
        self.measure = measure
        self._stop = stop
        self._where = where
        self.reason: str | None = None
        #: The last measure: bytes written, and when (for the rate, and the next look).
        self.written = 0
        self._at = 0.0
        self._rate = 0.0
        #: The last free disk seen, when, and how fast it fell (bytes a second).
        self._free = 0
        self._free_at = 0.0
        self._falling = 0.0
        #: Seconds the last walk took.
        self.cost = 0.0
        #: Looks taken, and seconds spent walking in all (for the docs' measured cost).
        self.looks = 0
        self.spent = 0.0
        self._lock = asyncio.Lock()

    async def check(self) -> str | None:
        """Look now; the reason the agent was stopped, if it was (now or before)."""
        if self.reason is not None:
            return self.reason
        async with self._lock:
            if self.reason is not None:
                return self.reason
            now = time.perf_counter()
            free = free_disk(self.disk)
            if self._free_at and now > self._free_at:
                self._falling = max(0.0, (self._free - free) / (now - self._free_at))
            self._free, self._free_at = free, now
            problem = floor_problem(self.disk, self.limits, self._where, free)
            if problem is None and self.measure is not None:
                started = time.perf_counter()
                written = await asyncio.to_thread(self.measure)
                now = time.perf_counter()
                self.cost = now - started
                self.looks += 1
                self.spent += self.cost
                if self._at and now > self._at:
                    self._rate = max(0.0, (written - self.written) / (now - self._at))
                self.written, self._at = written, now
                problem = cap_problem(written, self.limits)
            if problem is not None:
                self.reason = f"orchmode stopped this agent: {problem}"
                self._stop(self.reason)
            return self.reason

    def pause(self) -> float:
        """Seconds until the next look: sooner as the cap or the floor nears at the rate
        last seen, later when a look costs more (at most :data:`WATCH_SHARE` of the time
        walking)."""
        pause = max(WATCH_BASE, self.cost / WATCH_SHARE)
        # half the time the rate last seen would take to reach the limit: the looks
        # close in on it
        if self.measure is not None and self._rate > 0:
            pause = min(pause, (self.limits.write - self.written) / self._rate / 2)
        if self._falling > 0:
            pause = min(pause, (self._free - self.limits.floor) / self._falling / 2)
        return max(WATCH_MIN, pause)

    async def run(self) -> None:
        """Look every so often until the agent is stopped, or this is cancelled."""
        while await self.check() is None:
            await asyncio.sleep(self.pause())  # a poll: nothing to wait for but time


def watching(watch: WriteWatch | None) -> contextlib.AbstractAsyncContextManager[None]:
    """``watch`` looking in the background for the block (nothing when None)."""
    return _Watching(watch)


class _Watching(contextlib.AbstractAsyncContextManager[None]):
    def __init__(self, watch: WriteWatch | None) -> None:
        self.watch = watch
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> None:
        if self.watch is not None:
            self.task = asyncio.create_task(self.watch.run())

    async def __aexit__(self, *exc: object) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


# ------------------------------------------------------------------------ a change's files


def left_out_of(sizes: dict[str, int], limits: DiskLimits) -> dict[str, str]:
    """The files of a change too big for it (by path: why), among ``sizes`` (path: bytes):
    each over ``change_file_max_mb``, then, largest first, those that take the whole past
    :attr:`DiskLimits.change_total`."""
    out: dict[str, str] = {}
    limit = limits.change_file // MB
    for path, size in sizes.items():
        if size > limits.change_file:
            out[path] = f"{printable(path)} ({mb(size)}, over change_file_max_mb = {limit})"
    kept = {p: s for p, s in sizes.items() if p not in out}
    total = sum(kept.values())
    for path, size in sorted(kept.items(), key=lambda item: (-item[1], item[0])):
        if total <= limits.change_total:
            break
        total -= size
        out[path] = (
            f"{printable(path)} ({mb(size)}: the change's files passed "
            f"{limits.change_total // MB} MB in all, {CHANGE_TOTAL_FILES} × change_file_max_mb)"
        )
    return out
