"""How orchmode runs git: off the event loop, cancellable, with a fixed identity and environment.

Every git step of isolation goes through here, so that none of them sees the caller's git
variables, starts a hook or an fsmonitor, or is left running when its task is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from ..core.errors import TreeError as TreeError  # where the rooms of trees/ catch it
from ..core.programs import program

#: Fixed names and dates: a snapshot's commit id depends on its tree alone.
_IDENTITY = {
    "GIT_AUTHOR_NAME": "orchmode",
    "GIT_AUTHOR_EMAIL": "orchmode@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "orchmode",
    "GIT_COMMITTER_EMAIL": "orchmode@localhost",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
#: Settings that keep plumbing from starting anything: no fsmonitor, no hooks, no gc.
_QUIET = (
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "gc.auto=0",
    "-c",
    "maintenance.auto=false",
    "-c",
    "core.autocrlf=false",
    "-c",
    "advice.detachedHead=false",
)
#: The caller's git variables would point our commands at the wrong repository.
_DROPPED = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
)


def _environment(extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED}
    env.update({"LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0", **_IDENTITY})
    env.update(extra)
    return env


def copy_index(source: Path, target: Path) -> None:
    """Copy a git index to use its stat cache, keeping its modification time.

    Git trusts an entry's stat data only when the file is older than the index itself; an
    entry written in the same second as the index is checked by content ("racily clean").
    A copy with a new time would make git trust a file rewritten within that second at the
    same size, and miss the change. Raises :class:`OSError` as the copy does.
    """
    times = os.stat(source)  # before the copy: a later index only makes more entries checked
    shutil.copyfile(source, target)
    os.utime(target, ns=(times.st_atime_ns, times.st_mtime_ns))


async def git(
    *args: str,
    env: Mapping[str, str],
    cwd: Path,
    data: bytes | None = None,
    ok: Sequence[int] = (0,),
) -> tuple[int, bytes]:
    """Run one git command; its exit code and output, or :class:`TreeError` naming it."""
    return await on_thread(lambda work: work.git(*args, env=env, cwd=cwd, data=data, ok=ok))


T = TypeVar("T")


def _name(argv: Sequence[str]) -> str:
    """``git add`` for a git command line (past its ``-c`` settings), else the program."""
    git = program("git")
    at = next((i for i, arg in enumerate(argv) if arg in (git, "git")), None)
    if at is not None:
        rest = list(argv[at + 1 :])
        while rest and rest[0] == "-c":
            rest = rest[2:]
        return f"git {rest[0]}" if rest else "git"
    return os.path.basename(argv[0]) if argv else "a command"


def _ended(code: int) -> str:
    """How a process that said nothing ended: its exit code, or the signal that stopped it."""
    if code >= 0:
        return f"exit {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"
    if name == "SIGBUS":
        return "SIGBUS (a file was cut short while git read it)"
    return name


class _Work:
    """Git commands on a worker thread, which a cancellation stops: its git is killed, and
    no later command of it starts.

    A plain fork and exec there costs the process about half of what an asyncio subprocess
    costs the event loop (its transports, pipes and child watcher). Each hop to a thread
    has a cost too, so the two commands that read a change share one.
    """

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        self.stopped = False

    def git(
        self,
        *args: str,
        env: Mapping[str, str],
        cwd: Path,
        data: bytes | None = None,
        ok: Sequence[int] = (0,),
    ) -> tuple[int, bytes]:
        return self.run((program("git"), *_QUIET, *args), env=env, cwd=cwd, data=data, ok=ok)

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        data: bytes | None = None,
        ok: Sequence[int] = (0,),
    ) -> tuple[int, bytes]:
        """Run ``argv`` (git, or git behind an overlay's mount); its exit code and output."""
        name = _name(argv)
        process = self._popen(argv, env, cwd, stdin=data is not None)
        with process:
            out, err = process.communicate(data)
        code = process.returncode
        if code not in ok:
            message = err.decode(errors="replace").strip().splitlines()
            raise TreeError(f"{name} failed: {message[-1] if message else _ended(code)}")
        return code, out

    def start(self, *args: str, env: Mapping[str, str], cwd: Path) -> subprocess.Popen[bytes]:
        """A git that this work talks to through its pipes (``cat-file --batch``)."""
        return self._popen((program("git"), *_QUIET, *args), env, cwd, stdin=True, stderr=False)

    def _popen(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        *,
        stdin: bool,
        stderr: bool = True,
    ) -> subprocess.Popen[bytes]:
        if self.stopped:
            raise TreeError(f"{_name(argv)} was not started: the work was cancelled")
        try:
            process = subprocess.Popen(
                argv,
                cwd=cwd,
                env=_environment(env),
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE if stderr else subprocess.DEVNULL,
            )
        except FileNotFoundError:
            raise TreeError(f"isolation needs {argv[0]}, which is not installed") from None
        self.processes.append(process)
        return process

    def stop(self) -> None:
        self.stopped = True
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                process.kill()


async def on_thread(function: Callable[[_Work], T]) -> T:
    """``function`` run on a worker thread; cancelled, it is stopped and waited for, so no
    git is left running and nothing is left writing."""
    work = _Work()
    task = asyncio.ensure_future(asyncio.to_thread(function, work))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        work.stop()
        with contextlib.suppress(Exception):
            await task
        raise
