"""What the sandbox's seccomp filter costs: a shell's start-up, and a command.

Each figure against the same sandbox without the filter, in the same run, the two
interleaved so that the machine's drift falls on both:

1. **A shell's start-up**: a fresh sandboxed shell until its first command (``true``) has
   answered, as an agent's first command waits for it. The filter adds building its
   program (once per process, printed apart), a memfd per shell, and bubblewrap reading
   and loading it. Target: <= +1 ms per shell.
   The same for bubblewrap alone (``bwrap … -- true``), which has less noise around it,
   and its CPU time, which a busy machine's other processes do not stretch.
2. **A command** in a running shell: ``true``, ``python3 -c pass`` (an interpreter's
   start, some thousand system calls), and the worst case, 400,000 system calls (``dd``
   copying a byte at a time), each of which enters the filter. Target: no measurable cost
   (the difference within the run-to-run spread) but for the worst case, whose cost per
   system call is printed.
3. **A shell's start-up with ``sandbox_unix_sockets`` listing a socket**: the host's
   ``/proc/net/unix`` read and the other sockets covered, per shell.

    .venv/bin/python bench/seccomp.py [--shells 40] [--commands 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from orchmode.core.settings import Settings
from orchmode.shell import seccomp
from orchmode.shell.bash import BashSession
from orchmode.shell.bwrap import probe
from orchmode.shell.policy import SandboxPolicy
from orchmode.shell.sandbox import Sandbox, ShellSandboxing

STORM = "dd if=/dev/zero of=/dev/null bs=1 count=200000 status=none"
STORM_CALLS = 400_000


class Unfiltered(ShellSandboxing):
    """The same shell's sandbox without ``--seccomp``: the baseline."""

    def argv(self, tmpdir: str, env: Mapping[str, str]) -> list[str]:
        argv = super().argv(tmpdir, env)
        at = argv.index("--seccomp")
        del argv[at : at + 2]
        for fd in self.take_fds():
            os.close(fd)
        return argv


@functools.cache
def one_rule() -> bytes:
    """A filter of one rule (``kexec_load`` refused): what any filter costs a system call."""
    import pyseccomp

    filt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    filt.add_rule(pyseccomp.ERRNO(1), "kexec_load")
    with tempfile.TemporaryFile() as file:
        filt.export_bpf(file)
        file.seek(0)
        return file.read()


class OneRule(ShellSandboxing):
    """The same shell's sandbox under a filter of one rule."""

    def argv(self, tmpdir: str, env: Mapping[str, str]) -> list[str]:
        argv = super().argv(tmpdir, env)
        for fd in self.take_fds():
            os.close(fd)
        fd = os.memfd_create("bench-one-rule", os.MFD_CLOEXEC)
        os.write(fd, one_rule())
        os.lseek(fd, 0, os.SEEK_SET)
        self._fds = (fd,)
        argv[argv.index("--seccomp") + 1] = str(fd)
        return argv


def shell(
    workdir: Path, filtered: bool, kind: type[ShellSandboxing] = ShellSandboxing, **settings: object
) -> BashSession:
    sandbox = Sandbox.from_settings(Settings(**settings), workdir)  # type: ignore[arg-type]
    assert sandbox is not None
    sandboxing = kind(sandbox) if filtered else Unfiltered(sandbox)
    return BashSession(workdir, timeout=60, sandbox=sandboxing)


async def start_ms(workdir: Path, filtered: bool, **settings: object) -> float:
    """Milliseconds from nothing to a fresh shell's first answer."""
    session = shell(workdir, filtered, **settings)
    try:
        started = time.perf_counter()
        result = await session.run("true")
        elapsed = time.perf_counter() - started
        assert result.exit_code == 0, result.output
    finally:
        await session.close()
    return elapsed * 1000


async def interleaved(
    repeats: int, *runs: Callable[[], Awaitable[float]]
) -> list[tuple[float, float]]:
    """Each run ``repeats`` times, taking turns (in reverse order every other round, so
    that none always follows the same one); (median, spread) per run, spread being half
    the interquartile range."""
    times: list[list[float]] = [[] for _ in runs]
    for round_ in range(repeats):
        order = list(enumerate(runs))
        for i, run in order[:: -1 if round_ % 2 else 1]:
            times[i].append(await run())
    out = []
    for series in times:
        q1, _, q3 = statistics.quantiles(series, n=4)
        out.append((statistics.median(series), (q3 - q1) / 2))
    return out


async def command_ms(
    repeats: int, workdir: Path, command: str, one_rule: bool = False
) -> list[tuple[float, float]]:
    sessions = [shell(workdir, True), shell(workdir, False)]
    if one_rule:
        sessions.append(shell(workdir, True, OneRule))
    try:
        for session in sessions:
            await session.run("true")  # started

        def timed(session: BashSession) -> Callable[[], Awaitable[float]]:
            async def run() -> float:
                started = time.perf_counter()
                result = await session.run(command)
                assert result.exit_code == 0, result.output
                return (time.perf_counter() - started) * 1000

            return run

        return await interleaved(repeats, *(timed(s) for s in sessions))
    finally:
        for session in sessions:
            await session.close()


def bwrap_ms(filtered: bool, cpu: bool = False) -> float:
    """Milliseconds for bubblewrap to set up the shells' sandbox and run ``true`` in it:
    of the clock, or (``cpu``) of CPU time, bubblewrap's and its children's, which the
    other processes on a busy machine do not stretch."""
    found = probe()
    assert found.bwrap is not None, found.problem
    argv = [found.bwrap, *found.flags, "--ro-bind", "/", "/", "--dev", "/dev"]
    argv += ["--proc", "/proc", "--tmpfs", "/tmp"]
    fds: tuple[int, ...] = ()
    if filtered:
        fds = (seccomp.open_program(),)
        argv += ["--seccomp", str(fds[0])]
    try:
        started = time.perf_counter()
        process = subprocess.Popen([*argv, "--", "true"], pass_fds=fds)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        elapsed = time.perf_counter() - started
        assert process.returncode == 0
        return (usage.ru_utime + usage.ru_stime if cpu else elapsed) * 1000
    finally:
        for fd in fds:
            os.close(fd)


async def sync(run: Callable[[], float]) -> float:
    return run()


def line(what: str, filtered: tuple[float, float], bare: tuple[float, float]) -> str:
    (f, f_spread), (b, b_spread) = filtered, bare
    return (
        f"  {what:<34} {f:8.2f} ms ±{f_spread:.2f} with, {b:8.2f} ms ±{b_spread:.2f} "
        f"without = {f / b:.3f}x ({f - b:+.2f} ms)"
    )


async def main_async(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    seccomp.program(True)
    built = (time.perf_counter() - started) * 1000
    fds = []
    started = time.perf_counter()
    for _ in range(1000):
        fds.append(seccomp.open_program())
    per_fd = (time.perf_counter() - started) / 1000 * 1e6
    for fd in fds:
        os.close(fd)
    print(
        f"the filter's program: {len(seccomp.program(True))} bytes, built and exported in "
        f"{built:.1f} ms once per process; a memfd holding it {per_fd:.1f} µs per shell"
    )
    with tempfile.TemporaryDirectory(prefix="orchmode-bench-seccomp-") as scratch:
        workdir = Path(scratch)
        await start_ms(workdir, True)  # the probe, the caches
        print(f"a shell's start-up to its first answer (median of {args.shells}, interleaved)")
        filtered, bare = await interleaved(
            args.shells,
            lambda: start_ms(workdir, True),
            lambda: start_ms(workdir, False),
        )
        print(line("start-up", filtered, bare))
        filtered, bare = await interleaved(
            args.shells * 3,
            lambda: sync(lambda: bwrap_ms(True)),
            lambda: sync(lambda: bwrap_ms(False)),
        )
        print(line("bubblewrap alone, bwrap -- true", filtered, bare))
        filtered, bare = await interleaved(
            args.shells * 3,
            lambda: sync(lambda: bwrap_ms(True, cpu=True)),
            lambda: sync(lambda: bwrap_ms(False, cpu=True)),
        )
        print(line("the same, CPU time", filtered, bare))
        print(f"a command in a running shell (median of {args.commands}, interleaved)")
        print(line("true", *await command_ms(args.commands, workdir, "true")))
        pythons = await command_ms(max(args.commands // 4, 10), workdir, "python3 -c pass")
        print(line("python3 -c pass", *pythons))
        storm = await command_ms(max(args.commands // 10, 10), workdir, STORM, one_rule=True)
        print(line("dd, 400,000 system calls", storm[0], storm[1]))
        print(line("the same under a one-rule filter", storm[2], storm[1]))
        extra = (storm[0][0] - storm[1][0]) / STORM_CALLS * 1e6
        floor = (storm[2][0] - storm[1][0]) / STORM_CALLS * 1e6
        print(f"  = {extra:.0f} ns per system call, of which {floor:.0f} ns any filter costs")
        wanted = Path("/var/tmp", f"orchmode-bench-{os.getpid()}.sock")
        with socket.socket(socket.AF_UNIX) as listener, contextlib.ExitStack() as cleanup:
            listener.bind(str(wanted))
            cleanup.callback(wanted.unlink)
            listener.listen()
            with open("/proc/net/unix", encoding="utf-8") as table:
                bound = sum(1 for _ in table) - 1
            policy = SandboxPolicy(
                mode="workspace-write", workdir=workdir, unix_sockets=(str(wanted),)
            )
            started = time.perf_counter()
            for _ in range(200):
                policy.socket_masks()
            masks = (time.perf_counter() - started) / 200 * 1e6
            print(
                f"a shell's start-up with sandbox_unix_sockets = [one socket] "
                f"({bound} sockets bound on this host; median of {args.shells}): the "
                f"table read and the others covered in {masks:.0f} µs"
            )
            listed, blocked = await interleaved(
                args.shells,
                lambda: start_ms(workdir, True, sandbox_unix_sockets=(str(wanted),)),
                lambda: start_ms(workdir, True),
            )
            print(line("listed, against none listed", listed, blocked))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shells", type=int, default=40)
    parser.add_argument("--commands", type=int, default=200)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
