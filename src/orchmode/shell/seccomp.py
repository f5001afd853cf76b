"""The seccomp filter every sandboxed shell runs under: the system calls no command needs, refused.

bubblewrap's namespaces decide what a command can *see*; this filter decides what it can
*ask the kernel for*. It is built with libseccomp (through ``pyseccomp``, ctypes bindings
with the API of libseccomp's own), exported once per process as a classic BPF program, and
handed to each shell's bubblewrap on a descriptor of its own (``--seccomp FD``), which
loads it after the sandbox is set up and before the shell starts: the shell and all it
starts run under it, and no process can lift it.

What it refuses, and why (``docs/sandbox.md`` has the same table for users):

- ``socket(AF_UNIX, …)``: a Unix socket anywhere in the read-only host file system (a
  database's, LXD's, the Nix daemon's) can be connected to; a read-only mount and a network
  namespace do not stop ``connect()``. ``socketpair`` stays allowed (pipes, ``subprocess``,
  asyncio). Lifted by ``sandbox_unix_sockets`` (see :mod:`orchmode.shell.policy`).
- reading or steering other processes: ``ptrace``, ``process_vm_readv/writev``,
  ``pidfd_getfd``;
- the kernel's keyrings (``keyctl``, ``add_key``, ``request_key``), BPF programs, perf
  events, ``userfaultfd`` and ``kexec``: kernel attack surface that no build or test needs;
- ``io_uring``: its operations are not system calls, so they pass this filter unseen (an
  ``IORING_OP_SOCKET`` would make the Unix socket that ``socket`` may not);
- mounts and namespaces: the ``mount`` family, ``pivot_root``, ``setns``, and ``unshare``
  or ``clone`` with a ``CLONE_NEW*`` flag — a fresh namespace is where many of the kernel's
  privilege escalations start;
- ``clone3`` always, with ``ENOSYS``: its flags are in memory, where seccomp cannot read
  them, so it cannot be allowed without namespaces; "not implemented" makes glibc (2.34+)
  and other runtimes fall back to ``clone``, whose flags are in a register the filter
  does check (Docker and Flatpak do the same);
- ``ioctl(TIOCSTI)`` and ``ioctl(TIOCLINUX)``: typing into a terminal's input.
- the setuid and setgid bits, by ``chmod``, ``open``, ``creat`` or ``mknod`` and their
  ``*at`` forms (``openat2``, whose mode is in memory, answers ``ENOSYS``): the sandbox's
  mounts are ``nosuid``, but a setuid file left in the working directory keeps its bit on
  the host, where anyone who can reach it runs it as the user orchmode ran as (root, often,
  in a container or CI);

Each refusal answers ``EPERM`` (``ENOSYS`` for ``clone3``) rather than killing, so a
program sees an ordinary error it can report. The filter covers the machine's own
architecture, x86_64 or aarch64; a system call made through another ABI (32-bit
``int 0x80`` or x32 on x86_64) kills the process, since its numbers mean other calls.
Arguments that the kernel reads as 32-bit ``int`` are compared on their low 32 bits
only, so that garbage in a register's upper half cannot slip a call past its rule.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import platform
import socket
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..core.programs import absolute_path_only
from .cgroups import SandboxUnavailable

__all__ = [
    "ARCHES",
    "REFUSED",
    "Refusal",
    "SeccompUnavailable",
    "export_pfc",
    "native_arch",
    "open_program",
    "program",
    "unavailable",
]

#: The architectures the filter is written for: libseccomp's name, and ``uname -m``'s.
ARCHES = {"x86_64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}

# The flags that make a namespace (linux/sched.h). CLONE_NEWTIME shares its bit with
# clone's exit signal (CSIGNAL), so it is only a namespace flag for unshare.
_CLONE_NEW = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
_CLONE_NEWTIME = 0x00000080
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C
_LOW32 = 0xFFFFFFFF
_SETID_WHY = (
    "leaving a setuid or setgid file behind (the sandbox's nosuid mount stops one inside "
    "it, not on the host, where it would run as the user orchmode ran as)"
)
#: Calls newer than some libseccomp releases (2.5.4 has no fchmodat2), by number: the
#: unified numbering that x86_64 and aarch64 share for every call added since Linux 5.1.
_NEWER_CALLS = {"openat2": 437, "fchmodat2": 452}


@dataclass(frozen=True)
class Refusal:
    """System calls refused together, for one reason (a row of the docs' table)."""

    calls: tuple[str, ...]
    why: str
    #: ``None``: every call; else ``(argument, mask, value)`` alternatives, one matching
    #: being enough: ``args[argument] & mask == value``.
    when: tuple[tuple[int, int, int], ...] | None = None
    error: int = errno.EPERM


#: Everything the filter refuses, but the Unix sockets (see :func:`_build`).
REFUSED: tuple[Refusal, ...] = (
    Refusal(
        ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd"),
        "reading or steering another process (the harness, another agent's shell)",
    ),
    Refusal(
        ("keyctl", "add_key", "request_key"),
        "the kernel keyrings, where credentials are kept",
    ),
    Refusal(
        ("bpf", "perf_event_open", "userfaultfd", "kexec_load", "kexec_file_load"),
        "kernel attack surface no build or test needs",
    ),
    Refusal(
        ("io_uring_setup", "io_uring_enter", "io_uring_register"),
        "its operations (a socket, a connect) are not system calls: the filter cannot see them",
    ),
    Refusal(
        (
            "mount",
            "umount2",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "move_mount",
            "open_tree",
            "mount_setattr",
            "pivot_root",
        ),
        "changing what the sandbox's file system shows",
    ),
    Refusal(("setns",), "entering another namespace"),
    Refusal(
        ("unshare",),
        "making a namespace (with any CLONE_NEW* flag)",
        when=tuple((0, flag, flag) for flag in (*_CLONE_NEW.values(), _CLONE_NEWTIME)),
    ),
    Refusal(
        ("clone",),
        "making a namespace (with any CLONE_NEW* flag)",
        when=tuple((0, flag, flag) for flag in _CLONE_NEW.values()),
    ),
    Refusal(
        ("clone3",),
        "its flags are in memory, out of the filter's sight: glibc falls back to clone",
        error=errno.ENOSYS,
    ),
    Refusal(
        ("chmod", "fchmod", "creat", "mknod"),
        _SETID_WHY,
        when=((1, stat.S_ISUID, stat.S_ISUID), (1, stat.S_ISGID, stat.S_ISGID)),
    ),
    Refusal(
        ("fchmodat", "fchmodat2", "open", "mknodat"),
        _SETID_WHY,
        when=((2, stat.S_ISUID, stat.S_ISUID), (2, stat.S_ISGID, stat.S_ISGID)),
    ),
    Refusal(
        ("openat",),
        _SETID_WHY,
        when=((3, stat.S_ISUID, stat.S_ISUID), (3, stat.S_ISGID, stat.S_ISGID)),
    ),
    Refusal(
        ("openat2",),
        "its mode is in memory, out of the filter's sight: callers fall back to openat",
        error=errno.ENOSYS,
    ),
    Refusal(
        ("ioctl",),
        "typing into a terminal (TIOCSTI, TIOCLINUX)",
        when=((1, _LOW32, _TIOCSTI), (1, _LOW32, _TIOCLINUX)),
    ),
)
_UNIX_SOCKETS = Refusal(
    ("socket",),
    "connecting to the host's services by their Unix sockets",
    when=((0, _LOW32, socket.AF_UNIX),),
)

_FIX = "or pass --sandbox off to run commands unsandboxed"


class SeccompUnavailable(SandboxUnavailable):
    """The filter cannot be built or applied here; the message says why and what to do."""


def _libseccomp() -> Any:
    """pyseccomp, which loads libseccomp.so.2 when imported (and raises if it is missing).

    Imported with PATH's relative entries left out: finding the library may run a
    compiler by name, which must not be one the repository ships."""
    try:
        with absolute_path_only():
            import pyseccomp
    except (ImportError, RuntimeError, OSError) as exc:
        raise SeccompUnavailable(
            f"the bash sandbox is unavailable: its seccomp filter needs libseccomp ({exc}) — "
            f"install it (apt install libseccomp2; pip install pyseccomp), {_FIX}"
        ) from None
    return pyseccomp


def native_arch() -> str:
    """libseccomp's name for this machine's architecture, if the filter covers it."""
    machine = platform.machine()
    arch = ARCHES.get(machine)
    if arch is None:
        raise SeccompUnavailable(
            f"the bash sandbox is unavailable: its seccomp filter covers x86_64 and aarch64, "
            f"not {machine or 'this architecture'} — run orchmode on one of those, {_FIX}"
        )
    return arch


def _build(block_unix: bool, arch: str) -> Any:
    """The filter as a libseccomp context, for ``arch`` (libseccomp's name for it)."""
    sc = _libseccomp()
    target = {"x86_64": sc.Arch.X86_64, "aarch64": sc.Arch.AARCH64}[arch]
    filt = sc.SyscallFilter(sc.ALLOW)
    # A call through another ABI (int 0x80, x32) has numbers that mean other calls.
    filt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    with contextlib.suppress(OSError):  # libseccomp 2.5+: a binary search, not a list
        filt.set_attr(sc.Attr.CTL_OPTIMIZE, 2)
    if sc.system_arch() != target:
        filt.add_arch(target)
        filt.remove_arch(sc.Arch.NATIVE)
    for refusal in (*REFUSED, *((_UNIX_SOCKETS,) if block_unix else ())):
        action = sc.ERRNO(refusal.error)
        for call in refusal.calls:
            # Named through the native numbering; libseccomp translates for ``arch`` and
            # leaves out a call that an architecture does not have.
            number = sc.resolve_syscall(sc.Arch.NATIVE, call)
            if number == -1:  # unknown to this libseccomp: it is older than the call
                number = _NEWER_CALLS.get(call, -1)
            if number == -1:
                continue
            if refusal.when is None:
                filt.add_rule(action, number)
                continue
            for argument, mask, value in refusal.when:
                filt.add_rule(action, number, sc.Arg(argument, sc.MASKED_EQ, mask, value))
    return filt


@contextlib.contextmanager
def _scratch() -> Iterator[Any]:
    with tempfile.TemporaryFile() as file:
        yield file


@functools.cache
def program(block_unix: bool = True, arch: str | None = None) -> bytes:
    """The filter as a BPF program, as bubblewrap's ``--seccomp`` reads it; once per process."""
    filt = _build(block_unix, arch or native_arch())
    with _scratch() as file:
        try:
            filt.export_bpf(file)
        except OSError as exc:
            raise SeccompUnavailable(
                f"the bash sandbox is unavailable: its seccomp filter could not be exported "
                f"({exc}) — check libseccomp2's install, {_FIX}"
            ) from None
        file.seek(0)
        data: bytes = file.read()
    return data


def export_pfc(block_unix: bool = True, arch: str | None = None) -> str:
    """The filter in libseccomp's readable pseudo-code (PFC), for tests and the curious."""
    filt = _build(block_unix, arch or native_arch())
    with _scratch() as file:
        filt.export_pfc(file)
        file.seek(0)
        text: str = file.read().decode()
    return text


def open_program(block_unix: bool = True) -> int:
    """A new descriptor holding the program, read from its start: one per shell.

    bubblewrap reads the program from the descriptor's current offset, so two shells
    starting at once must not share one. Close-on-exec: a spawn passes it on explicitly.
    """
    data = program(block_unix)
    fd = os.memfd_create("orchmode-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


@functools.cache
def unavailable() -> str | None:
    """Why the filter cannot be built here (one line for the user), or None."""
    try:
        program(True)
        program(False)
    except SeccompUnavailable as exc:
        return str(exc)
    with (
        contextlib.suppress(OSError),
        open("/proc/self/status", encoding="ascii", errors="replace") as status,
    ):
        if not any(line.startswith("Seccomp:") for line in status):
            return (
                "the bash sandbox is unavailable: this kernel has no seccomp "
                f"(CONFIG_SECCOMP_FILTER) for its filter — use a kernel built with it, {_FIX}"
            )
    return None
