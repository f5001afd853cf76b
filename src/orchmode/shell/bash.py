"""Persistent, asyncio-driven bash sessions that back the model's ``bash_20250124`` tool."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Protocol

from ..core.programs import program, system_program
from ..core.secrets import Masker
from ..core.wording import listed
from .bash_process import OUT_FD, ShellProcess, ShellProtocol, wait_event
from .connections import Seat
from .output import _OutputCollector
from .processes import _signal_name, use_pidfd_child_watcher

__all__ = ["BashSession", "ShellResult", "ShellSandbox"]

# How long to wait for the kernel to deliver a killed shell's exit status, and for the
# output pipe to reach EOF once everything holding it is dead. Both are upper bounds on
# waiting for events, not sleeps: they only matter if something escaped the kill.
_REAP_GRACE = 5.0
_DRAIN_GRACE = 1.0
_RESET_NOTE = "so the working directory and environment are reset"
# How often a running command's guard is asked whether it must stop (a statvfs: cheap).
_GUARD_PAUSE = 0.5
# The exit code of a process killed by SIGXFSZ: it wrote past the sandbox's file size limit.
_TOO_LARGE = 128 + signal.SIGXFSZ
_TOO_LARGE_NOTE = (
    "(exit code 153: a process was stopped for writing a file past the largest size one "
    "file may have here, agent_write_mb; nothing past that size was written)"
)
_USAGE = 'send {"command": "<shell command>"} to run a command, or {"restart": true}'


class ShellSandbox(Protocol):
    """What runs bash inside a sandbox (see :mod:`orchmode.shell.sandbox`) for one session.

    ``argv`` is asked anew for every shell started, because the shell's private dir for
    command files (``tmpdir``) must be visible inside (``env`` is the environment the shell
    is started with); an ``OSError`` it raises becomes
    the command's error result. ``take_fds`` hands over the descriptors that command line
    names (the seccomp filter's): passed to the shell's process, then closed here.
    ``newly_withheld`` names the secret files found since the
    running shell started, which it does not hide: that shell is replaced before its next
    command. ``started`` is told, on the event loop, that the shell ``argv`` names has
    started (the proxy then serves its listener, for ``seat``). ``release`` is called when
    the session closes.
    """

    @property
    def mode(self) -> str: ...

    def argv(self, tmpdir: str, env: Mapping[str, str]) -> Sequence[str]: ...

    def take_fds(self) -> tuple[int, ...]: ...

    def newly_withheld(self) -> tuple[str, ...]: ...

    def started(self, seat: Seat, pid: int | None = None) -> None: ...

    def release(self) -> None: ...


@dataclass(frozen=True)
class ShellResult:
    """What one tool call produced; ``output`` is ready to be the tool_result content."""

    output: str
    is_error: bool
    exit_code: int | None
    timed_out: bool
    duration: float


def _error(message: str, duration: float = 0.0) -> ShellResult:
    """An error result that never reached (or never came back from) a command."""
    return ShellResult(
        output=message, is_error=True, exit_code=None, timed_out=False, duration=duration
    )


class BashSession:
    """One agent's persistent bash shell: cwd, variables and functions survive calls.

    The shell starts on the first command. Calls are serialised. A timeout, ``exit`` or
    ``restart`` kills the shell's whole process group and the next command gets a fresh
    shell. After :meth:`close` the session may be used again: the next command simply
    starts a new shell (and a new private temp dir).
    """

    def __init__(
        self,
        cwd: str | os.PathLike[str],
        *,
        timeout: float = 60.0,
        output_limit: int = 8000,
        env: Mapping[str, str] | None = None,
        argv_prefix: Sequence[str] = (),
        sandbox: ShellSandbox | None = None,
        before_start: Callable[[], Awaitable[None]] | None = None,
        masker: Masker | None = None,
        guard: Callable[[], str | None] | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if output_limit < 1:
            raise ValueError(f"output_limit must be at least 1, got {output_limit!r}")
        self._cwd = os.fspath(cwd)
        self._timeout = float(timeout)
        self._output_limit = output_limit
        self._env = dict(os.environ if env is None else env)
        # By absolute path: a repository's own `bash` never becomes the shell (see
        # orchmode.core.programs); in a sandbox, one the sandbox shows.
        bash = system_program("bash") if sandbox is not None else program("bash")
        self._argv = [*argv_prefix, bash, "--noprofile", "--norc"]
        self._sandbox = sandbox
        #: Awaited before the first shell starts: the agent's copy of the tree being made.
        self._before_start = before_start
        #: Secrets masked in every result, before it reaches the model or the records.
        self._masker = masker
        #: Asked before each command, and every half second while one runs: a reason it
        #: returns (the disk nearly full) refuses the command, or stops the one running.
        self._guard = guard
        #: Why the shell was stopped from outside (:meth:`stop`), until a result says so.
        self._stopped: str | None = None
        self._closed = False
        self._lock = asyncio.Lock()
        self._shell: ShellProcess | None = None
        self._tmpdir: str | None = None
        #: Asked before each command (the permission rules, and the user for an ``ask``):
        #: a text it returns refuses the command with that reason, and nothing runs.
        self.permit: Callable[[str], Awaitable[str | None]] | None = None
        #: Waits for the user in progress (see :meth:`held`), and their time so far.
        self._holds = 0
        self._held_since = 0.0
        self._held_total = 0.0
        #: Who is behind this shell's network connections (the agent that holds it, how
        #: to ask its user, where its events go): set when the shell is given to an agent.
        self.seat = Seat()
        #: How many times a bash process was started for it (restarts included).
        self.starts = 0

    @property
    def pid(self) -> int | None:
        """PID (and process-group id) of the running shell; None when none is running."""
        shell = self._shell
        return shell.pid if shell is not None and shell.alive() else None

    @property
    def running(self) -> bool:
        """Whether a shell is up now (started ahead, and not exited since)."""
        shell = self._shell
        return shell is not None and shell.alive() and not self._closed

    @property
    def sandbox_mode(self) -> str:
        """The sandbox the commands run in, as recorded in events (``off`` for none)."""
        return "off" if self._sandbox is None else self._sandbox.mode

    async def handle(self, tool_input: object) -> ShellResult:
        """Run one model-supplied ``bash_20250124`` input; bad shapes become error results."""
        if not isinstance(tool_input, Mapping):
            return _error(
                f"(error: the bash tool input must be a JSON object, "
                f"got {type(tool_input).__name__}; {_USAGE})"
            )
        command = tool_input.get("command")
        restart = tool_input.get("restart")
        if restart is not None and not isinstance(restart, bool):
            return _error(
                f"(error: 'restart' must be true or false, got {type(restart).__name__}; {_USAGE})"
            )
        if restart:
            if command is not None:
                return _error(
                    "(error: send either 'command' or 'restart', not both; the shell was "
                    "not restarted and nothing ran)"
                )
            return await self.restart()
        if command is None:
            return _error(f"(error: the input has no 'command'; {_USAGE})")
        if not isinstance(command, str):
            return _error(
                f"(error: 'command' must be a string, got {type(command).__name__}; {_USAGE})"
            )
        return await self.run(command)

    async def run(self, command: str | None) -> ShellResult:
        """Run ``command`` in the persistent shell, waiting at most ``timeout`` seconds."""
        if command is None or not command.strip():
            return _error(f"(error: a non-empty command is required; {_USAGE})")
        if self.permit is not None:
            refusal = await self.permit(command)
            if refusal is not None:
                return _error(refusal)
        async with self._lock:
            result = await self._run_locked(command)
        if self._masker:  # error texts too, which name paths and commands
            result = replace(result, output=self._masker.mask(result.output))
        return result

    async def start(self) -> None:
        """Start the shell now rather than on the first command.

        Lets a caller overlap bash's start-up with something slow, such as the agent's
        first model request. A failure is not raised here: the next command reports it.
        """
        async with self._lock:
            if self._shell is None and not self._closed:  # a late start must not outlive close
                with contextlib.suppress(OSError):
                    await self._spawn()

    async def restart(self) -> ShellResult:
        """Drop the current shell; the next command starts a fresh one."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with self._lock:
            if self._shell is not None:
                await self._discard(self._shell)
        return ShellResult(
            output="shell restarted",
            is_error=False,
            exit_code=None,
            timed_out=False,
            duration=loop.time() - started,
        )

    async def close(self) -> None:
        """Kill the shell's process group and remove the temp dir; safe to call twice."""
        self._closed = True
        shell = self._shell
        if shell is not None:
            shell.kill(sweep=False)  # at once, so a running command ends instead of blocking us
        async with self._lock:
            if self._shell is not None:
                await self._discard(self._shell)
            await asyncio.to_thread(self._remove_files)  # kernel work, off the event loop

    def stop(self, reason: str) -> None:
        """Kill the shell's processes now, those in the background too, for ``reason``:
        the command running, if one is, ends with ``reason`` in its result; the next
        command starts a fresh shell."""
        self._stopped = reason
        shell = self._shell
        if shell is not None:
            shell.kill(sweep=False)
            shell.protocol.wake.set()

    def abandon(self) -> None:
        """Kill the shell and remove its files now, without waiting: for a shutdown in
        which a close that was under way may have been cancelled. Safe to call twice."""
        self._closed = True
        if self._shell is not None:
            self._abandon(self._shell)
        with contextlib.suppress(OSError):
            self._remove_files()

    def __del__(self) -> None:
        # Last resort for a session that was never closed: no background job outlives it.
        shell = getattr(self, "_shell", None)
        if shell is not None:
            with contextlib.suppress(Exception):
                shell.kill()
        tmpdir = getattr(self, "_tmpdir", None)
        if tmpdir is not None:
            with contextlib.suppress(Exception):
                shutil.rmtree(tmpdir, ignore_errors=True)

    async def __aenter__(self) -> BashSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _spawn(self) -> ShellProcess:
        """Start bash in its own session, with a private dir for command files."""
        use_pidfd_child_watcher()
        self.starts += 1
        if self._before_start is not None:
            await self._before_start()
        # A private dir and, sandboxed, the shell's cgroups (mkdir and writes in cgroupfs):
        # a millisecond or two of kernel work, done on a worker thread so that a wave of
        # agents starting does not hold up the event loop that sends their requests.
        argv = await asyncio.to_thread(self._spawn_argv)
        # Taken here, not on the thread: were this cancelled while the thread ran, they
        # would stay with the sandbox, which closes them at its next argv or release.
        fds = self._sandbox.take_fds() if self._sandbox is not None else ()
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.subprocess_exec(
                ShellProtocol,
                *argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=self._cwd,
                env=self._env,
                start_new_session=True,
                pass_fds=fds,
            )
        finally:
            for fd in fds:  # the shell has its own copies now
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self._sandbox is not None:
            self._sandbox.started(self.seat, transport.get_pid())
        shell = ShellProcess(
            transport,
            protocol,
            transport.get_pid(),
            secrets.token_hex(16),
            contained=self._sandbox is not None,
        )
        self._shell = shell
        shell.preamble = f"exec {OUT_FD}>&1\n"
        return shell

    def _spawn_argv(self) -> list[str]:
        if self._tmpdir is None or not os.path.isdir(self._tmpdir):
            self._tmpdir = tempfile.mkdtemp(prefix="orchmode-shell-")
        if self._sandbox is None:
            return list(self._argv)
        return [*self._sandbox.argv(self._tmpdir, self._env), *self._argv]

    def _remove_files(self) -> None:
        """The temp dir and the sandbox's cgroups, once the shell's processes are gone."""
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
        if self._sandbox is not None:
            self._sandbox.release()

    async def _discard(self, shell: ShellProcess) -> None:
        """Kill ``shell``'s processes, reap it and release its pipes."""
        if self._shell is shell:
            self._shell = None
        proto = shell.protocol
        try:
            shell.kill(sweep=False)
            await wait_event(proto.exited, _REAP_GRACE)
            shell.kill()  # and stragglers that changed process group but kept our session
            await wait_event(proto.eof, _DRAIN_GRACE)
        finally:
            shell.transport.close()

    def _abandon(self, shell: ShellProcess) -> None:
        """Synchronous kill for cancellation paths, where we cannot await the reaping."""
        if self._shell is shell:
            self._shell = None
        shell.kill()
        shell.transport.close()

    async def _run_locked(self, command: str) -> ShellResult:
        loop = asyncio.get_running_loop()
        started = loop.time()
        notes: list[str] = []
        refused = self._guard() if self._guard is not None else None
        if refused is not None:
            return _error(f"({refused}; the command was not run)")
        self._stopped = None
        shell = await self._usable_shell(notes)
        if shell is None:
            try:
                shell = await self._spawn()
            except OSError as exc:
                return _error(f"(error: could not start the shell: {exc})", loop.time() - started)
        assert self._tmpdir is not None
        script = Path(self._tmpdir, "command.sh")
        try:
            script.write_text(command, encoding="utf-8", errors="replace")
        except OSError as exc:
            return _error(f"(error: could not stage the command: {exc})", loop.time() - started)
        masker = self._masker
        margin = masker.longest if masker else 0
        collector = _OutputCollector(shell.marker, self._output_limit, margin)
        shell.protocol.begin(collector)
        try:
            shell.used = True
            shell.send(shell.command_line(str(script)))
            timed_out = not await self._wait(shell, collector, started + self._timeout)
        except asyncio.CancelledError:
            self._abandon(shell)
            raise
        if timed_out:
            await self._discard(shell)
            notes.insert(
                0,
                f"(timed out after {self._timeout:g} s; the shell was restarted, {_RESET_NOTE})",
            )
            return self._result(notes, collector, None, True, loop.time() - started, masker)
        code = collector.status if collector.finished else await self._ended_early(shell, notes)
        if self._stopped is not None:  # it ended as it was stopped: the shell is gone
            notes.append(f"({self._stopped}; the next command starts a fresh shell)")
            self._stopped = None
        if code == _TOO_LARGE and self._sandbox is not None:
            notes.append(_TOO_LARGE_NOTE)
        return self._result(notes, collector, code, False, loop.time() - started, masker)

    async def _usable_shell(self, notes: list[str]) -> ShellProcess | None:
        """The running shell, unless it has exited or secret files were found since it
        started (it is then discarded, and ``notes`` say why the state was reset)."""
        shell = self._shell
        if shell is not None and not shell.alive():
            await self._discard(shell)
            shell = None
            notes.append(
                f"(note: the previous shell had exited, so this ran in a fresh shell, "
                f"{_RESET_NOTE})"
            )
        fresh = self._sandbox.newly_withheld() if shell is not None and self._sandbox else ()
        if shell is not None and fresh:
            await self._discard(shell)
            shell = None
            notes.append(
                f"(note: orchmode found secret files since the shell started "
                f"({listed(fresh)}); this ran in a fresh shell that withholds them, "
                f"{_RESET_NOTE})"
            )
        return shell

    async def _ended_early(self, shell: ShellProcess, notes: list[str]) -> int | None:
        """The exit code of a shell that exited (or closed its output) before finishing
        the command, with a note saying how it ended; None when it is not known."""
        # EOF on the pipe usually arrives just before the exit status, so give it a moment.
        died_by_itself = await wait_event(shell.protocol.exited, _DRAIN_GRACE)
        await self._discard(shell)
        rc = shell.returncode()
        if died_by_itself and rc is not None and rc >= 0:
            notes.append(
                f"(the shell exited; the next command starts a fresh shell, {_RESET_NOTE})"
            )
            return rc
        if died_by_itself and rc is not None and self._stopped is not None:
            notes.append(
                f"({self._stopped}; the command was stopped, with everything the shell "
                f"started, and the next command starts a fresh shell, {_RESET_NOTE})"
            )
            self._stopped = None
            return 128 - rc
        if died_by_itself and rc is not None:
            notes.append(
                f"(the shell was killed by {_signal_name(-rc)}; the next command "
                f"starts a fresh shell, {_RESET_NOTE})"
            )
            return 128 - rc
        notes.append(f"(the shell closed its output and was restarted, {_RESET_NOTE})")
        return None

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """The running command waits for the user (a connection the proxy holds until an
        approval is answered): its time limit stands still meanwhile."""
        loop = asyncio.get_running_loop()
        self._holds += 1
        if self._holds == 1:
            self._held_since = loop.time()
        try:
            yield
        finally:
            self._holds -= 1
            if self._holds == 0:
                self._held_total += loop.time() - self._held_since

    def _held_for(self, now: float) -> float:
        """Seconds the commands so far waited for the user (see :meth:`held`)."""
        return self._held_total + (now - self._held_since if self._holds else 0.0)

    async def _wait(
        self, shell: ShellProcess, collector: _OutputCollector, deadline: float
    ) -> bool:
        """Wait for the marker, the shell's death or the deadline (moved on by the time the
        command waited for the user); False on timeout."""
        loop = asyncio.get_running_loop()
        proto = shell.protocol
        deadline -= self._held_for(loop.time())  # what was held before this command began
        while not (collector.finished or proto.exited.is_set() or proto.eof.is_set()):
            remaining = deadline + self._held_for(loop.time()) - loop.time()
            if remaining <= 0:
                return False
            proto.wake.clear()
            if self._guard is None:
                await wait_event(proto.wake, remaining)
            elif not await wait_event(proto.wake, min(remaining, _GUARD_PAUSE)):
                reason = self._guard() if self._stopped is None else None
                if reason is not None:
                    self.stop(reason)
        return True

    @staticmethod
    def _result(
        notes: list[str],
        collector: _OutputCollector,
        code: int | None,
        timed_out: bool,
        duration: float,
        masker: Masker | None = None,
    ) -> ShellResult:
        """Assemble the model-facing text: status lines first, then the output."""
        header = list(notes)
        if code is not None and code != 0:
            header.insert(0, f"(exit code {code})")
        output = "\n".join([*header, collector.render(masker.mask if masker else None)])
        is_error = timed_out or code is None or code != 0
        return ShellResult(
            output=output,
            is_error=is_error,
            exit_code=code,
            timed_out=timed_out,
            duration=duration,
        )
