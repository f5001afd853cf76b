"""The sandbox's seccomp filter: each refusal a real command in the real sandbox, and the
exported program run through a BPF interpreter, for x86_64 and aarch64.

Unix sockets are tried against real listeners bound on the host at paths the sandbox
shows (``/var/tmp``, the working directory), and the same connections are made
unsandboxed first, so that a refusal is the sandbox's and not a missing listener's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pyseccomp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmode.core.overlay import Overlay
from orchmode.core.settings import Settings
from orchmode.shell import seccomp
from orchmode.shell.bash import BashSession
from orchmode.shell.bwrap import probe
from orchmode.shell.policy import SandboxPolicy
from orchmode.shell.sandbox import Sandbox
from recorded_runs import base_env


@pytest.fixture(autouse=True)
def _sandbox_works() -> None:
    """Fail, not skip, without a working sandbox: orchmode refuses to run without one."""
    problem = probe().problem
    if problem is not None:
        pytest.fail(problem)


# ---------------------------------------------------------------------------- helpers


class Listener:
    """A Unix socket listening on the host, at a path or an abstract name."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(64)  # connections wait in the backlog: no accept needed

    def close(self) -> None:
        self.sock.close()
        if not self.address.startswith("\0"):
            with_missing_ok(Path(self.address))


def with_missing_ok(path: Path) -> None:
    path.unlink(missing_ok=True)


def host_connect(address: str) -> str:
    """Connect unsandboxed, as the probe script does: the listener really answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        try:
            client.connect(address)
        except OSError as exc:
            return errno.errorcode[exc.errno or 0]
    return "ok"


# Run in the sandbox: connect to each address, print "ok" or the errno's name per line.
CONNECT = r"""
import errno, socket, sys
for address in sys.argv[1:]:
    address = address.replace("@", "\0", 1) if address.startswith("@") else address
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(address)
        print("ok")
    except OSError as exc:
        print(errno.errorcode[exc.errno])
"""

# Run in the sandbox: make each system call with harmless arguments, print the errno's
# name or "ok" per line. Arguments are chosen so that an unfiltered kernel would answer
# something other than the filter's EPERM (see each test).
SYSCALLS = r"""
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR_CLONE = int(sys.argv[1])
for spec in sys.argv[2:]:
    nr, *args = (int(x, 0) for x in spec.split(","))
    args = [ctypes.c_long(a - (1 << 64) if a >= 1 << 63 else a) for a in args]
    result = libc.syscall(ctypes.c_long(nr), *args)
    if result == 0 and nr == NR_CLONE:
        os._exit(0)  # a child made by clone, were it allowed
    print("ok" if result >= 0 else errno.errorcode[ctypes.get_errno()])
"""


@pytest.fixture
def sockets_dir() -> Iterator[Path]:
    """A directory outside /run, /tmp and the home directory: the sandbox shows it."""
    path = Path(tempfile.mkdtemp(prefix="orchmode-sockets-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    (path / "connect.py").write_text(CONNECT)
    (path / "syscalls.py").write_text(SYSCALLS)
    return path


@pytest.fixture
def listeners() -> Iterator[Callable[[str], Listener]]:
    made: list[Listener] = []

    def listen(address: str) -> Listener:
        listener = Listener(address)
        made.append(listener)
        assert host_connect(address) == "ok"  # reachable without the sandbox
        return listener

    yield listen
    for listener in made:
        listener.close()


Shells = Callable[..., BashSession]


@pytest.fixture
async def shells() -> AsyncIterator[Shells]:
    made: list[BashSession] = []

    def make(workdir: Path, sandbox: Sandbox | None = None, **kw: Any) -> BashSession:
        if sandbox is None:
            sandbox = Sandbox.from_settings(Settings(**kw), workdir)
        assert sandbox is not None
        shell = BashSession(workdir, timeout=30, sandbox=sandbox.for_shell())
        made.append(shell)
        return shell

    yield make
    for shell in made:
        await shell.close()


async def connects(shell: BashSession, *addresses: str) -> list[str]:
    shown = [a.replace("\0", "@", 1) for a in addresses]
    result = await shell.run("python3 connect.py " + " ".join(shown))
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def nr(name: str, arch: int = pyseccomp.Arch.NATIVE) -> int:
    number = pyseccomp.resolve_syscall(arch, name)
    assert number >= 0, name
    return int(number)


async def syscalls(shell: BashSession, *calls: tuple[str, tuple[int, ...]]) -> list[str]:
    specs = [",".join(map(str, (nr(name), *args))) for name, args in calls]
    result = await shell.run(f"python3 syscalls.py {nr('clone')} " + " ".join(specs))
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


# ------------------------------------------------------------------ Unix sockets by path


async def test_a_unix_socket_outside_run_is_refused_with_eperm(
    shells: Shells, work: Path, sockets_dir: Path, listeners: Callable[[str], Listener]
) -> None:
    outside = listeners(str(sockets_dir / "db.sock"))
    inside = listeners(str(work / "project.sock"))  # a socket a project keeps in its tree
    shell = shells(work)
    assert await connects(shell, outside.address, inside.address) == ["EPERM", "EPERM"]
    connect = f"socket.socket(socket.AF_UNIX).connect({outside.address!r})"
    result = await shell.run(f'python3 -c "import socket; {connect}"')
    assert result.exit_code == 1
    assert "PermissionError: [Errno 1] Operation not permitted" in result.output


async def test_socketpair_subprocess_and_fork_still_work(shells: Shells, work: Path) -> None:
    shell = shells(work)
    script = (
        "import multiprocessing, socket, subprocess\n"
        "a, b = socket.socketpair(); a.sendall(b'pair'); print(b.recv(4).decode())\n"
        "print(subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout.strip())\n"
        "with multiprocessing.get_context('fork').Pool(2) as pool:\n"
        "    print(sum(pool.map(abs, [-1, -2, -3])))\n"
        "import asyncio\n"
        "print(asyncio.run(asyncio.sleep(0, 'loop')))\n"  # its self-pipe is a socketpair
    )
    (work / "works.py").write_text(script)
    result = await shell.run("python3 works.py && echo piped | cat && (true &) && wait")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["pair", "child", "6", "loop", "piped"]


async def test_forkserver_needs_unix_sockets_and_all_allows_it(shells: Shells, work: Path) -> None:
    """What docs/sandbox.md names as needing Unix sockets: multiprocessing's forkserver."""
    (work / "forkserver.py").write_text(
        "import multiprocessing\n"
        "if __name__ == '__main__':\n"
        "    with multiprocessing.get_context('forkserver').Pool(1) as pool:\n"
        "        print(pool.apply(abs, (-7,)))\n"
    )
    refused = await shells(work).run("python3 forkserver.py")
    assert refused.exit_code != 0
    assert "Operation not permitted" in refused.output
    allowed = await shells(work, sandbox_unix_sockets="all").run("python3 forkserver.py")
    assert allowed.exit_code == 0, allowed.output
    assert allowed.output == "7"


async def test_listed_sockets_are_reachable_and_no_other(
    shells: Shells, work: Path, sockets_dir: Path, listeners: Callable[[str], Listener]
) -> None:
    wanted = listeners(str(sockets_dir / "test-db.sock"))
    other = listeners(str(sockets_dir / "other.sock"))
    inside = listeners(str(work / "project.sock"))
    shell = shells(work, sandbox_unix_sockets=(wanted.address,))
    found = await connects(shell, wanted.address, other.address, inside.address)
    assert found == ["ok", "ECONNREFUSED", "ECONNREFUSED"]
    # The others are covered, not removed: the host's listeners still answer.
    assert host_connect(other.address) == host_connect(inside.address) == "ok"


async def test_a_listed_socket_in_the_tree_leaves_an_agents_copy_as_it_was(
    shells: Shells, work: Path, tmp_path: Path, listeners: Callable[[str], Listener]
) -> None:
    """A copy has no place for the host's socket: none is made in it, and the shell starts."""
    wanted = listeners(str(work / "db.sock"))
    lower, below, target = tmp_path / "lower", tmp_path / "below", tmp_path / "mnt"
    for directory in (lower, below, target):
        directory.mkdir()
    (lower / "connect.py").write_text(CONNECT)
    (lower / ".orchmode").mkdir()  # as a snapshot has, for the state directory's cover
    settings = Settings(sandbox_unix_sockets=(wanted.address,))
    base = Sandbox.from_settings(settings, work)
    assert base is not None
    for writable in (False, True):
        upper, scratch = tmp_path / f"upper-{writable}", tmp_path / f"w-{writable}"
        upper.mkdir()
        scratch.mkdir()
        overlay = (  # a read-only overlay needs two layers
            Overlay((lower,), target, upper, scratch)
            if writable
            else Overlay((lower, below), target)
        )
        copy = base.in_copy(target, writable=writable, overlay=overlay)
        assert await connects(shells(work, copy), wanted.address) == ["ENOENT"]
        assert list(upper.iterdir()) == []
    assert await connects(shells(work, base), wanted.address) == ["ok"]


async def test_a_listed_socket_under_run_is_shown_in_the_emptied_run(
    shells: Shells, work: Path, listeners: Callable[[str], Listener]
) -> None:
    if not os.access("/run", os.W_OK):
        pytest.skip("needs a socket under /run, which only root can bind")
    directory = Path(tempfile.mkdtemp(prefix="orchmode-test-", dir="/run"))
    try:
        wanted = listeners(str(directory / "db.sock"))
        other = listeners(str(directory / "other.sock"))
        shell = shells(work, sandbox_unix_sockets=(wanted.address,))
        assert await connects(shell, wanted.address, other.address) == ["ok", "ENOENT"]
        hidden = await shells(work).run(f"ls {directory}")
        assert "No such file or directory" in hidden.output  # /run stays empty without it
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def test_all_makes_every_socket_reachable(
    shells: Shells, work: Path, sockets_dir: Path, listeners: Callable[[str], Listener]
) -> None:
    one = listeners(str(sockets_dir / "one.sock"))
    two = listeners(str(work / "two.sock"))
    shell = shells(work, sandbox_unix_sockets="all")
    assert await connects(shell, one.address, two.address) == ["ok", "ok"]


@pytest.mark.parametrize("allowed", [(), "all", "listed"])
async def test_the_hosts_abstract_sockets_are_out_of_the_sandboxs_network_namespace(
    shells: Shells,
    work: Path,
    sockets_dir: Path,
    listeners: Callable[[str], Listener],
    allowed: Any,
) -> None:
    abstract = listeners("\0orchmode-test-" + secrets.token_hex(6))
    if allowed == "listed":
        allowed = (listeners(str(sockets_dir / "db.sock")).address,)
    shell = shells(work, sandbox_unix_sockets=allowed)
    expected = "EPERM" if allowed == () else "ECONNREFUSED"
    assert await connects(shell, abstract.address) == [expected]


async def test_with_the_network_shared_only_the_filter_keeps_abstract_sockets_out(
    shells: Shells, work: Path, listeners: Callable[[str], Listener]
) -> None:
    """What docs/sandbox.md says a list does not cover: ``--allow-network`` shares the
    host's network namespace, and with it the host's abstract names."""
    abstract = listeners("\0orchmode-test-" + secrets.token_hex(6))
    refused = shells(work, allow_network=True)
    assert await connects(refused, abstract.address) == ["EPERM"]
    every = shells(work, allow_network=True, sandbox_unix_sockets="all")
    assert await connects(every, abstract.address) == ["ok"]


async def test_socket_masks_follow_the_hosts_sockets_at_each_shell_start(
    work: Path, sockets_dir: Path, listeners: Callable[[str], Listener]
) -> None:
    """Read per shell from /proc/net/unix: a socket bound later is covered by the next shell."""
    wanted = listeners(str(sockets_dir / "db.sock"))
    policy = SandboxPolicy(
        mode="workspace-write", workdir=work, unix_sockets=(wanted.address,), homes=()
    )
    before = policy.socket_masks()
    late = listeners(str(sockets_dir / "late.sock"))
    after = policy.socket_masks()
    assert ["--ro-bind", os.devnull, late.address] == after[after.index(late.address) - 2 :][:3]
    assert late.address not in before and wanted.address not in after
    # Hidden places hold no mask: the sandbox shows them empty anyway.
    in_tmp = listeners(f"/tmp/orchmode-{secrets.token_hex(4)}.sock")
    assert in_tmp.address not in policy.socket_masks()


# ------------------------------------------------------------------ the other refusals


async def test_new_namespaces_are_refused_by_the_filter(shells: Shells, work: Path) -> None:
    """bubblewrap's --disable-userns alone answers ENOSPC; the filter answers first, EPERM."""
    shell = shells(work)
    result = await shell.run("unshare -U true")
    assert result.exit_code == 1
    assert "unshare failed: Operation not permitted" in result.output
    new_user, new_net, sigchld = 0x10000000, 0x40000000, 17
    found = await syscalls(
        shell,
        ("unshare", (new_user,)),
        ("unshare", (new_net | 0x400,)),  # with CLONE_FILES beside it
        ("unshare", (0x80,)),  # CLONE_NEWTIME
        ("clone", (new_user | sigchld, 0, 0, 0, 0)),
        ("clone", ((1 << 32) | new_net | sigchld, 0, 0, 0, 0)),  # upper half set
        ("clone3", (0, 0)),  # EFAULT unfiltered: no struct given
        ("unshare", (0x400,)),  # CLONE_FILES: no namespace, allowed
    )
    assert found == ["EPERM"] * 5 + ["ENOSYS", "ok"]


async def test_other_processes_cannot_be_read_or_steered(shells: Shells, work: Path) -> None:
    shell = shells(work)
    pid = os.getpid()  # the harness: not even in the sandbox's PID namespace
    found = await syscalls(
        shell,
        ("process_vm_readv", (0, 0, 0, 0, 0, 0)),  # own process, nothing to read: 0 unfiltered
        ("pidfd_getfd", (2**32 - 1, 0, 0)),  # EBADF unfiltered
        ("ptrace", (16, pid, 0, 0)),  # PTRACE_ATTACH: ESRCH unfiltered
        ("ptrace", (0, 0, 0, 0)),  # PTRACE_TRACEME: 0 unfiltered
    )
    assert found == ["EPERM"] * 4


async def test_kernel_surface_no_command_needs_is_refused(shells: Shells, work: Path) -> None:
    shell = shells(work)
    found = await syscalls(
        shell,
        ("keyctl", (0, 2**64 - 3, 0)),  # KEYCTL_GET_KEYRING_ID of the session's keyring
        ("add_key", (0, 0, 0, 0, 0)),  # EFAULT unfiltered
        ("request_key", (0, 0, 0, 0)),
        ("perf_event_open", (0, 0, 2**64 - 1, 2**64 - 1, 0)),
        ("io_uring_setup", (1, 0)),  # EFAULT unfiltered: no params
        ("mount", (0, 0, 0, 0, 0)),
        ("umount2", (0, 0)),
        ("fsopen", (0, 0)),
        ("open_tree", (2**64 - 100, 0, 0)),
        ("move_mount", (0, 0, 0, 0, 0)),
        ("mount_setattr", (0, 0, 0, 0, 0)),
        ("pivot_root", (0, 0)),
        ("setns", (2**32 - 1, 0)),  # EBADF unfiltered
        ("ioctl", (0, 0x5412, 0)),  # TIOCSTI on stdin (/dev/null): ENOTTY unfiltered
        ("ioctl", ((1 << 32), (1 << 32) | 0x541C, 0)),  # TIOCLINUX, upper halves set
        ("ioctl", (0, 0x5401, 0)),  # TCGETS: allowed (ENOTTY on /dev/null)
        ("socket", ((1 << 32) | socket.AF_UNIX, socket.SOCK_STREAM, 0)),  # upper half set
        ("socket", (socket.AF_INET, socket.SOCK_STREAM, 0)),
        ("socketpair", (socket.AF_UNIX, socket.SOCK_STREAM, 0, 0)),  # EFAULT: no array
    )
    assert found == ["EPERM"] * 15 + ["ENOTTY", "EPERM", "ok", "EFAULT"]
    assert shell.running


# A 32-bit system call from a 64-bit process: getpid through int 0x80, where the number 20
# means getpid (on x86_64, 20 is writev). No filter could read such a call by its number.
INT80 = r"""
import ctypes, mmap
code = bytes.fromhex("b814000000cd80c3")  # mov eax, 20; int 0x80; ret
buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(code)
print("pid", ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))())
"""


async def test_a_call_through_the_32_bit_abi_kills_the_process(shells: Shells, work: Path) -> None:
    if seccomp.native_arch() != "x86_64":
        pytest.skip("int 0x80 is x86's")
    (work / "int80.py").write_text(INT80)
    host = subprocess.run(
        [sys.executable, "int80.py"], cwd=work, capture_output=True, text=True, timeout=30
    )
    if host.returncode != 0:
        pytest.skip("this kernel runs no 32-bit calls (no IA32 emulation) in the first place")
    assert host.stdout.startswith("pid ")
    shell = shells(work)
    result = await shell.run("python3 int80.py; echo status $?")
    assert "Bad system call" in result.output
    assert result.output.endswith("status 159")  # 128 + SIGSYS
    assert (await shell.run("echo still here")).output == "still here"


# ------------------------------------------------------------------ descriptors


def open_files() -> list[str]:
    """What this process's descriptors point at."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # listdir's own, closed since
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
    return targets


def listed_fds(output: str) -> dict[str, str]:
    """``ls -l /proc/self/fd`` as {number: target}, without ls's own directory."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        if " -> " in line:
            left, target = line.split(" -> ", 1)
            if not target.endswith("/fd"):
                found[left.split()[-1]] = target
    return found


async def test_no_descriptor_but_the_shells_reaches_the_sandbox(
    shells: Shells, work: Path, tmp_path: Path
) -> None:
    held = os.open(tmp_path, os.O_RDONLY)  # the harness holds descriptors of its own
    read, write = os.pipe()
    os.set_inheritable(held, True)
    os.set_inheritable(write, True)
    try:
        lower, upper, scratch, target = (tmp_path / n for n in ("lower", "upper", "w", "mnt"))
        for directory in (lower, upper, scratch, target):
            directory.mkdir()
        base = Sandbox.from_settings(Settings(), work)
        assert base is not None
        layered = base.in_copy(
            target, writable=True, overlay=Overlay((lower,), target, upper, scratch)
        )
        for shell in (shells(work), shells(work, layered)):
            result = await shell.run("ls -l /proc/self/fd")
            assert result.exit_code == 0, result.output
            assert sorted(listed_fds(result.output)) == ["0", "1", "19", "2"], result.output
        # Each filter's memfd is closed here once its shell has started.
        assert not [t for t in open_files() if "orchmode-seccomp" in t]
    finally:
        for fd in (held, read, write):
            os.close(fd)


def test_each_shell_gets_a_descriptor_of_its_own_read_from_the_start() -> None:
    """Two shells starting at once must not share an offset in one program."""
    one, two = seccomp.open_program(), seccomp.open_program()
    try:
        assert one != two
        assert os.read(one, 1 << 16) == seccomp.program()
        assert os.read(two, 1 << 16) == seccomp.program()
        assert os.get_inheritable(one) is False
    finally:
        os.close(one)
        os.close(two)


# ------------------------------------------------------------------ the program itself


AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SCMP_ARCH = {"x86_64": pyseccomp.Arch.X86_64, "aarch64": pyseccomp.Arch.AARCH64}
ALLOW, KILL_PROCESS = 0x7FFF0000, 0x80000000


def errno_action(code: int) -> int:
    return 0x00050000 | code


def run_bpf(program: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """Classic BPF as the kernel runs a seccomp filter, on one ``seccomp_data``."""
    full = (*args, *(0,) * (6 - len(args)))
    data = struct.pack("<iIQ6Q", nr, arch, 0, *full)
    code = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    acc = x = 0
    memory = [0] * 16
    pc = 0
    while True:
        op, jt, jf, k = code[pc]
        pc += 1
        if op == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
        elif op == 0x00:  # ld #k
            acc = k
        elif op == 0x60:  # ld M[k]
            acc = memory[k]
        elif op == 0x61:  # ldx M[k]
            x = memory[k]
        elif op == 0x02:  # st M[k]
            memory[k] = acc
        elif op == 0x03:  # stx M[k]
            memory[k] = x
        elif op == 0x54:  # and #k
            acc &= k
        elif op == 0x07:  # tax
            x = acc
        elif op == 0x87:  # txa
            acc = x
        elif op == 0x05:  # ja
            pc += k
        elif op in (0x15, 0x25, 0x35, 0x45):  # jeq, jgt, jge, jset #k
            taken = {0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
            pc += jt if taken else jf
        elif op == 0x06:  # ret #k
            return k
        elif op == 0x16:  # ret a
            return acc
        else:
            raise AssertionError(f"opcode {op:#x} at {pc - 1}: not in the interpreter")


ARCH_NAMES = ["x86_64", "aarch64"]


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_the_program_refuses_each_listed_call_on_each_architecture(arch: str) -> None:
    program = seccomp.program(True, arch)
    audit = AUDIT_ARCH[arch]

    def call(name: str, *args: int) -> int:
        return run_bpf(program, nr(name, SCMP_ARCH[arch]), audit, args)

    for refusal in seccomp.REFUSED:
        for name in refusal.calls:
            if refusal.when is None:
                assert call(name) == errno_action(refusal.error), name
            else:
                for argument, _mask, value in refusal.when:
                    args = [0] * 6
                    args[argument] = value
                    assert call(name, *args) == errno_action(refusal.error), (name, value)
                assert call(name) == ALLOW, name
    assert call("socket", socket.AF_UNIX, 1, 0) == errno_action(errno.EPERM)
    assert call("socket", socket.AF_INET, 1, 0) == ALLOW
    assert call("socketpair", socket.AF_UNIX, 1, 0, 0) == ALLOW
    for name in ("read", "write", "openat", "execve", "wait4", "connect", "bind", "kill"):
        assert call(name) == ALLOW, name
    # Another ABI's numbers mean other calls: 32-bit ARM or x86 is killed, as is x32.
    assert run_bpf(program, 1, 0x40000028 if arch == "aarch64" else 0x40000003) == KILL_PROCESS
    if arch == "x86_64":
        assert run_bpf(program, 0x40000000 | 41, audit, (socket.AF_UNIX,)) == KILL_PROCESS


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_all_lifts_the_unix_socket_refusal_and_keeps_the_rest(arch: str) -> None:
    program = seccomp.program(False, arch)
    audit, numbers = AUDIT_ARCH[arch], SCMP_ARCH[arch]
    assert run_bpf(program, nr("socket", numbers), audit, (socket.AF_UNIX,)) == ALLOW
    assert run_bpf(program, nr("ptrace", numbers), audit) == errno_action(errno.EPERM)
    assert run_bpf(program, nr("clone3", numbers), audit) == errno_action(errno.ENOSYS)


@settings(max_examples=300, deadline=None)
@given(
    arch=st.sampled_from(ARCH_NAMES),
    family=st.integers(0, 2**32 - 1),
    upper=st.integers(0, 2**32 - 1),
    flags=st.integers(0, 2**64 - 1),
)
def test_only_the_low_half_of_an_int_argument_decides(
    arch: str, family: int, upper: int, flags: int
) -> None:
    """The kernel reads socket's family as an int: garbage above it must not slip past."""
    program = seccomp.program(True, arch)
    audit, numbers = AUDIT_ARCH[arch], SCMP_ARCH[arch]
    refused = errno_action(errno.EPERM)
    got = run_bpf(program, nr("socket", numbers), audit, ((upper << 32) | family,))
    assert got == (refused if family == socket.AF_UNIX else ALLOW)
    new = 0x7E020000  # every CLONE_NEW* flag clone knows
    got = run_bpf(program, nr("clone", numbers), audit, (flags,))
    assert got == (refused if flags & new else ALLOW)


def test_the_docs_table_names_every_refused_call() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "sandbox.md").read_text("utf-8")
    table = page.split("## System calls and Unix sockets")[1].split("\n\n")[2]
    for refusal in seccomp.REFUSED:
        for name in refusal.calls:
            assert f"`{name}" in table, name
    assert "`socket(AF_UNIX, …)`" in table and "`ENOSYS`" in table


def test_the_filter_decodes_to_its_rules_in_libseccomps_own_words() -> None:
    text = seccomp.export_pfc(True, "x86_64")
    assert "if ($arch == 3221225534)" in text
    assert 'filter for syscall "clone3" (435)' in text and "action ERRNO(38);" in text
    assert "if ($a0.lo32 & 0xffffffff == 1)" in text  # socket(AF_UNIX)
    assert "action KILL_PROCESS;" in text.split("# invalid architecture action")[1]
    lifted = seccomp.export_pfc(False, "aarch64")
    assert "if ($arch == 3221225655)" in lifted
    assert 'filter for syscall "socket"' not in lifted
    assert 'filter for syscall "ptrace"' in lifted


# ------------------------------------------------------------------ where it cannot apply


def test_an_architecture_the_filter_does_not_cover_refuses_to_run(tmp_path: Path) -> None:
    """``setarch i686`` makes ``uname -m`` say i686, as a 32-bit machine would."""
    if shutil.which("setarch") is None:
        pytest.fail("setarch (util-linux) is needed to play another architecture")
    done = subprocess.run(
        ["setarch", "i686", sys.executable, "-m", "orchmode", "run", "go"],
        cwd=tmp_path,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 8, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("orchmode: the bash sandbox is unavailable: its seccomp filter")
    assert "not i686" in lines[0] and "--sandbox off" in lines[0]


def test_without_libseccomp_nothing_runs_and_the_reason_names_the_package_and_the_opt_out(
    work: Path,
) -> None:
    """``sys.modules[name] = None`` makes Python's import fail, as on a machine without it."""
    code = (
        "import asyncio, sys; sys.modules['pyseccomp'] = None\n"
        "from orchmode.core.settings import Settings\n"
        "from orchmode.shell.bash import BashSession\n"
        "from orchmode.shell.bwrap import probe\n"
        "from orchmode.shell.sandbox import Sandbox\n"
        "print(probe().problem)\n"
        "async def main():\n"
        "    sandbox = Sandbox.from_settings(Settings(), '.')\n"
        "    async with BashSession('.', sandbox=sandbox.for_shell()) as shell:\n"
        "        print((await shell.run('touch ran')).output)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=work, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    problem, result = done.stdout.strip().splitlines()
    assert problem.startswith("the bash sandbox is unavailable: its seccomp filter needs ")
    assert "apt install libseccomp2" in problem and "--sandbox off" in problem
    assert result == f"(error: could not start the shell: {problem})"
    assert not (work / "ran").exists()


def test_the_setting_reaches_the_policy(work: Path) -> None:
    listed = Settings(sandbox_unix_sockets="/var/tmp/a.sock, /srv/b.sock")
    policy = SandboxPolicy.from_settings(listed, work)
    assert policy.unix_sockets == ("/var/tmp/a.sock", "/srv/b.sock")
    assert not policy.blocks_unix_sockets
    assert SandboxPolicy.from_settings(Settings(), work).blocks_unix_sockets
    every = SandboxPolicy.from_settings(Settings(sandbox_unix_sockets="all"), work)
    assert every.unix_sockets == "all" and every.socket_masks() == []
    mounts = policy.mounts()
    at = mounts.index("/srv/b.sock")
    assert mounts[at - 1 : at + 2] == ["--ro-bind-try", "/srv/b.sock", "/srv/b.sock"]
