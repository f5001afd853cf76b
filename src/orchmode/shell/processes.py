"""Process plumbing: killing a shell's whole process tree, the pidfd child watcher, signal names.

None of it knows what a command or a marker is: it deals in PIDs, process groups and
sessions (read from /proc), and in how asyncio learns that a child exited.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["copy_descriptor", "use_pidfd_child_watcher"]


def _group_members(leader: int) -> list[int]:
    """PIDs whose process group or session is ``leader`` (empty if /proc is unavailable).

    Catches children that moved to their own process group (``timeout``, ``set -m``)
    but stayed in the shell's session, which ``killpg`` alone would miss.
    """
    members: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    # A member was forked after the shell, so its PID is higher, unless PIDs wrapped round
    # pid_max since the shell started: then the newest PID is lower and we read them all.
    # (Missing that would take pid_max forks and a wrap back past the shell in its lifetime.)
    newest = _newest_pid()
    skip_older = newest is not None and newest >= leader
    for entry in entries:
        if not entry.isdigit() or (skip_older and int(entry) < leader):
            continue
        try:  # os.open/os.read: this loop runs over every process, keep it cheap
            fd = os.open(f"/proc/{entry}/stat", os.O_RDONLY)
            try:
                stat = os.read(fd, 1024)
            finally:
                os.close(fd)
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 4:
            continue
        if int(fields[2]) == leader or int(fields[3]) == leader:
            members.append(int(entry))
    return members


def _newest_pid() -> int | None:
    """The PID the kernel handed out last (the final field of /proc/loadavg)."""
    try:
        with open("/proc/loadavg", "rb") as fh:
            return int(fh.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _kill_tree(leader: int, leader_reaped: bool, *, sweep: bool = True) -> None:
    """SIGKILL the shell's process group and whatever else is left in its session.

    While the leader is unreaped (or any member is alive) its PID cannot be reused, so
    ``killpg`` is safe; once it is reaped we only signal processes that still carry its
    group/session id, and never the bare PID itself.
    """
    if not leader_reaped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signal.SIGKILL)
    if not sweep:
        return
    for pid in _group_members(leader):
        if pid == leader and leader_reaped:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


_pidfd_watcher: asyncio.AbstractChildWatcher | None = None
_pidfd_unavailable = False


def use_pidfd_child_watcher() -> None:
    """On Python 3.11, watch children through pidfds instead of one thread per child.

    3.11's default watcher starts a thread for every subprocess, and starting one waits
    for the GIL: with hundreds of agents that costs milliseconds per shell. The watcher is
    set for the whole process, so it must serve every event loop, not only orchmode's (a
    library's own loop that spawns, Playwright's say): it watches each child from the loop
    running when it is spawned, as 3.12's does. 3.12+ already uses pidfds (and deprecates
    this API), so there this does nothing.
    """
    global _pidfd_watcher, _pidfd_unavailable
    if sys.version_info >= (3, 12) or _pidfd_unavailable or _pidfd_watcher is not None:
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (OSError, AttributeError):
        _pidfd_unavailable = True  # an old kernel: keep asyncio's default
        return
    _pidfd_watcher = _RunningLoopPidfdWatcher()
    asyncio.set_child_watcher(_pidfd_watcher)


class _RunningLoopPidfdWatcher(asyncio.AbstractChildWatcher):
    """A child's pidfd read by the loop that spawned it: active for any running loop."""

    def add_child_handler(  # type: ignore[override]  # the callback's arguments, loosely
        self, pid: int, callback: Callable[..., object], *args: Any
    ) -> None:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(pid)
        loop._add_reader(pidfd, self._reap, loop, pid, pidfd, callback, args)  # type: ignore[attr-defined]

    def _reap(
        self,
        loop: asyncio.AbstractEventLoop,
        pid: int,
        pidfd: int,
        callback: Callable[..., object],
        args: tuple[Any, ...],
    ) -> None:
        loop._remove_reader(pidfd)  # type: ignore[attr-defined]
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # reaped by someone else: its status is lost
            code = 255
        else:
            code = os.waitstatus_to_exitcode(status)
        os.close(pidfd)
        callback(pid, code, *args)

    def remove_child_handler(self, pid: int) -> bool:
        return True  # a pidfd's reader goes when the child ends; nothing to forget early

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        pass  # each child is watched by the loop running when it was spawned

    def is_active(self) -> bool:
        return True

    def close(self) -> None:
        pass

    def __enter__(self) -> _RunningLoopPidfdWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def has_ended(pid: int) -> bool:
    """Whether our child ``pid`` has ended (reaped, or a zombie not yet reaped), as the
    kernel says now: the event loop hears of a death only when it next polls.

    One ``waitid`` that peeks (``WNOWAIT`` leaves the child for the loop's watcher to reap):
    no file opened in /proc, and a PID reused after the reap is not taken for our child."""
    try:
        state = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True  # reaped already (or never ours): it is gone
    except OSError:
        return False
    return state is not None


#: pidfd_getfd(2)'s number: one table for every architecture since Linux 5.6 (alpha aside,
#: where the call fails and the listener step falls back to Python's).
PIDFD_GETFD = 438


def copy_descriptor(shell_pid: int, number: int, command: str) -> int | None:
    """A copy of descriptor ``number`` of the process at the end of ``shell_pid``'s chain of
    only children (the sandbox's wrappers exec one another; bubblewrap forks), if that
    process runs ``command``; None where there is no such process (any more). Raises
    ``OSError`` where the kernel refuses the copy (before Linux 5.6, or a ptrace policy
    that forbids it)."""
    pid = shell_pid
    try:
        while len(children := _read(f"/proc/{pid}/task/{pid}/children").split()) == 1:
            pid = int(children[0])
        if _read(f"/proc/{pid}/comm").strip() != command.encode()[:15]:  # comm: 15 bytes
            return None
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        copied: int = _libc().syscall(PIDFD_GETFD, pidfd, number, 0)
        error = ctypes.get_errno()
    finally:
        os.close(pidfd)
    if copied >= 0:
        return copied
    if error in (errno.ESRCH, errno.EBADF):
        return None  # it ended, or no longer holds the descriptor: its shell is going
    raise OSError(error, os.strerror(error))


def _read(path: str) -> bytes:
    """A small /proc file's content (os.open and os.read: no buffered file object)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _signal_name(number: int) -> str:
    """``SIGKILL`` for 9, or ``signal 99`` for numbers Python has no name for."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
