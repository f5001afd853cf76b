"""The bash process behind a session: its output pipe, its end-of-command marker, its kill."""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import dataclass

from .output import _OutputCollector
from .processes import _kill_tree, has_ended

# Output that background jobs write between two commands is shown with the next command;
# this caps how much of it we hold on to.
STRAY_CAP = 64 * 1024

# The shell's output pipe is duplicated onto this descriptor at start-up, and every command
# runs with stdout/stderr redirected from it. The redirection is undone after each command,
# so a command's `exec >file` or `exec 1>&-` cannot swallow the end marker or later output.
OUT_FD = 19


class ShellProtocol(asyncio.SubprocessProtocol):
    """Routes the shell's merged stdout/stderr into the current command's collector."""

    def __init__(self) -> None:
        self.collector: _OutputCollector | None = None
        self.stray = bytearray()
        self.exited = asyncio.Event()  # the shell has been reaped
        self.eof = asyncio.Event()  # nothing can write to the output pipe any more
        self.wake = asyncio.Event()  # something the waiting command should look at

    def begin(self, collector: _OutputCollector) -> None:
        """Make ``collector`` receive output, starting with anything left over."""
        self.collector = collector
        if self.stray:
            data = bytes(self.stray)
            self.stray.clear()
            collector.feed(data)

    def _keep_stray(self, data: bytes) -> None:
        room = STRAY_CAP - len(self.stray)
        if room > 0:
            self.stray += data[:room]

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        if isinstance(data, str):  # never happens with pipes; keeps the types honest
            data = data.encode()
        collector = self.collector
        if collector is None or collector.finished:
            self._keep_stray(data)
            return
        if collector.feed(data):
            self._keep_stray(collector.leftover)
            collector.leftover = b""
            self.wake.set()

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self.eof.set()
            self.wake.set()

    def process_exited(self) -> None:
        self.exited.set()
        self.wake.set()


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait for ``event`` at most ``timeout`` seconds; True if it was set."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        return False
    return True


@dataclass
class ShellProcess:
    """One running bash process and the pieces needed to talk to it."""

    transport: asyncio.SubprocessTransport
    protocol: ShellProtocol
    pid: int
    nonce: str
    used: bool = False
    #: In a sandbox's own PID namespace, which the kernel empties when its first process
    #: dies: killing the group is enough, and the /proc sweep (a read of every process on
    #: the machine, per shell) is skipped.
    contained: bool = False
    #: Sent ahead of the first command, in the same write (one wake-up of bash, not two).
    preamble: str = ""
    #: Its process group was sent SIGKILL (a close kills at once, then reaps).
    killed: bool = False

    @property
    def marker(self) -> bytes:
        return b"\n" + self.nonce.encode() + b" "

    def alive(self) -> bool:
        proto = self.protocol
        if proto.exited.is_set() or proto.eof.is_set() or self.transport.is_closing():
            return False
        return not has_ended(self.pid)  # killed since the loop last looked

    def send(self, line: str) -> None:
        stdin = self.transport.get_pipe_transport(0)
        if not isinstance(stdin, asyncio.WriteTransport):
            raise RuntimeError("the shell has no stdin pipe")
        stdin.write((self.preamble + line).encode())
        self.preamble = ""

    def kill(self, *, sweep: bool = True) -> None:
        """SIGKILL the group; ``sweep`` also hunts the session's members through /proc.

        A shell that never ran a command has no children to hunt, nor has a contained one
        anything that could escape, so neither sweeps (a read of every process's stat file).
        """
        sweep = sweep and self.used and not self.contained
        if self.killed and not sweep:
            return  # its group had SIGKILL already: the kernel lets no member fork past it
        self.killed = True
        _kill_tree(self.pid, self.protocol.exited.is_set(), sweep=sweep)

    def returncode(self) -> int | None:
        return self.transport.get_returncode()

    def command_line(self, script: str) -> str:
        """The line that runs ``script`` with its output on :data:`OUT_FD`, then prints
        the marker and the exit status. The nonce is split in two so that ``set -x``
        tracing never prints it whole."""
        half = len(self.nonce) // 2
        return (
            f"{{ . {shlex.quote(script)} ; }} < /dev/null >&{OUT_FD} 2>&1; "
            f"printf '\\n%s%s %d\\n' {self.nonce[:half]} {self.nonce[half:]} \"$?\" "
            f">&{OUT_FD}\n"
        )
