"""What a sandboxed shell may see and do: the bwrap mounts and the ulimits, built from settings.

Command-line assembly from a frozen policy, kept apart from the probe and the cgroups so
that what an agent can reach is read in one place.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import pwd
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

from ..core.overlay import Overlay
from ..core.secrets import WITHHELD_NOTE, Secrets
from ..core.settings import CONFIG_FILE, SandboxMode, Settings
from .environment import proxy_environment

__all__ = ["STATE_DIR", "SandboxPolicy", "system_perl", "system_python"]

#: orchmode's own directory in the working directory: journal, records, budget.
STATE_DIR = ".orchmode"
_MIB = 1024 * 1024
# Between the soft CPU limit (SIGXCPU, which bash reports by name) and the hard one (SIGKILL).
_CPU_GRACE = 5

# Sets the rlimits inside the sandbox, then becomes the persistent shell. RLIMIT_NPROC is
# set here, after bubblewrap made the user namespace, so that it counts the sandbox's
# own processes only; set outside, it would count all of the user's.
_LIMITS_SCRIPT = (
    '{limits} || {{ echo "orchmode: the sandbox limits could not be set" >&2; exit 126; }}; '
    'exec "$@"'
)


# Run inside the sandbox, before the shell (and under its seccomp filter): makes the filtering
# proxy's listening socket in the sandbox's own network namespace, sends its descriptor to
# orchmode over the socket pair end it was given (argv[1]), closes that end, and becomes
# the shell (argv[2:]). Only _socket, os and sys: no module is imported that costs time.
# The listener is close-on-exec, as is every socket Python makes: the shell never holds it.
_LISTENER_STEP = (
    "import _socket as s,os,sys\n"
    "f=int(sys.argv[1])\n"
    "try:\n"
    " l=s.socket(s.AF_INET,s.SOCK_STREAM)\n"
    " l.setsockopt(s.SOL_SOCKET,s.SO_REUSEADDR,1)\n"
    " l.bind(('127.0.0.1',{port}));l.listen(4096)\n"
    " c=s.socket(fileno=f)\n"
    " c.sendmsg([b'L'],[(s.SOL_SOCKET,s.SCM_RIGHTS,l.fileno().to_bytes(4,sys.byteorder))])\n"
    " c.close();l.close()\n"
    "except OSError as e:\n"
    " os.write(2,('orchmode: this shell has no network proxy (%s) — commands reach no "
    "network; restart the shell'%e).encode()+b'\\n')\n"
    " os.closerange(f,f+1)\n"
    # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec:
    # back to their defaults, or `yes | head` would complain of a broken pipe, and a file
    # past agent_write_mb would fail its writes instead of stopping the process.
    "import _signal as g\n"
    "g.signal(g.SIGPIPE,g.SIG_DFL);g.signal(g.SIGXFSZ,g.SIG_DFL)\n"
    "os.execvp(sys.argv[2],sys.argv[2:])\n"
)


# The first step where a perl is found, cheaper than Python's (perl starts in about a
# quarter of the time: 3 ms of CPU against 14 on the machine of docs/benchmarks.md): the
# same listener made with perl's built-in socket calls, the socket constants handed in by
# orchmode (argv: channel, AF_INET, SOCK_STREAM, SOL_SOCKET, SO_REUSEADDR). Perl cannot
# send a descriptor, so it says which one holds the listener ("L<fd>") and waits: orchmode
# copies it out with pidfd_getfd(2) and answers "A". Where the kernel will not copy it,
# orchmode answers "N" and the step becomes the Python one (argv: its path and code, or two
# empty strings), which sends the listener itself. Perl ignores no signal, and the
# listener is close-on-exec (perl's descriptors above 2 are): the shell holds neither.
# Perl starts without the user's PERL* variables (PERL5OPT, PERL_UNICODE, PERLIO and the like
# can load modules the sandbox does not show, or put a :utf8 layer on the channel, which
# syswrite refuses), and with PERL_BADLANG=0 (no warning about a locale that is not
# installed): argv then holds their count and NAME VALUE pairs, put back before the exec,
# so the shell gets the environment it would have had.
_PERL_LISTENER_STEP = r"""
my ($c, $af, $st, $sol, $reuse, $py, $code, $n) = splice(@ARGV, 0, 8);
my %kept = splice(@ARGV, 0, 2 * $n);
delete $ENV{{PERL_BADLANG}};
@ENV{{keys %kept}} = values %kept;
my $l;
my $opened = open(my $ch, "+<&=", $c);
my $ok = $opened && socket($l, $af, $st, 0) && setsockopt($l, $sol, $reuse, 1)
  && bind($l, pack("S n a4 x8", $af, {port}, pack("C4", 127, 0, 0, 1))) && listen($l, 4096);
my $why = "$!";
my $answer = "";
if ($ok) {{ syswrite($ch, "L" . fileno($l) . "\n"); sysread($ch, $answer, 1); }}
close($l) if $ok;
if ($answer eq "N" && $py ne "") {{  # the channel kept open across exec (F_SETFD, 0)
  fcntl($ch, 2, 0) and exec {{ $py }} $py, "-I", "-S", "-c", $code, $c, @ARGV;
}}
$why = "its listener could not be handed out" if $ok && $answer ne "A";
syswrite(STDERR, "orchmode: this shell has no network proxy ($why) \xe2\x80\x94 commands "
  . "reach no network; restart the shell\n") if $answer ne "A";
close($ch) if $opened;
exec {{ $ARGV[0] }} @ARGV or die "orchmode: could not start $ARGV[0]: $!\n";
"""


class ListenerStep(NamedTuple):
    """The proxy's listener step: bubblewrap's options for it (the environment it starts
    with), and its command, which the shell's follows."""

    options: list[str]
    command: list[str]


@functools.cache
def system_perl() -> str | None:
    """The host's perl, outside any home directory (which the sandbox hides), for the
    proxy's listener step; None when there is none (Python's step is used)."""
    for candidate in ("/usr/bin/perl", "/usr/local/bin/perl", "/bin/perl"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


@functools.cache
def system_python() -> str | None:
    """A Python the sandbox can run (the host's own, outside any home directory, which the
    sandbox hides) for the proxy's listener step; None when there is none."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _home_dirs(env: Mapping[str, str]) -> list[Path]:
    """The user's home directories to hide: ``$HOME`` and the account's, resolved."""
    candidates = [env.get("HOME", "")]
    with contextlib.suppress(KeyError):
        candidates.append(pwd.getpwuid(os.getuid()).pw_dir)
    homes: list[Path] = []
    for raw in candidates:
        if raw and os.path.isabs(raw):
            home = Path(os.path.realpath(raw))
            # One that does not exist holds nothing to hide (and could not be mounted on).
            if home != Path("/") and home not in homes and home.is_dir():
                homes.append(home)
    return homes


def _depth(path: Path) -> int:
    return len(path.relative_to("/").parts)


@dataclass(frozen=True)
class SandboxPolicy:
    """What a sandboxed shell may see and do: everything its bwrap command line is made from."""

    mode: SandboxMode
    workdir: Path
    allow_network: bool = False
    cpu_seconds: int = 300
    memory_mb: int = 4096
    processes: int = 512
    #: The largest file a process of the shell may write, in MB (RLIMIT_FSIZE; 0: none).
    file_mb: int = 0
    bwrap: str = "bwrap"
    #: Directories hidden behind empty ones; the first is ``HOME`` inside the sandbox.
    homes: tuple[Path, ...] = field(default_factory=lambda: tuple(_home_dirs(os.environ)))
    #: Directories shown read-only even inside the hidden state directory: the session's
    #: saved results, which agents read and never write.
    readable: tuple[Path, ...] = ()
    #: An agent's own copy of the tree (``worktree`` isolation), shown at the working
    #: directory's path so that every path, and every tool installed for it, still works.
    tree: Path | None = None
    #: Whether the copy is writable (a worker's) or read-only (its verifier's).
    tree_writable: bool = True
    #: Entries of the working directory that a copy leaves out (ignored ones such as
    #: ``.venv/`` or ``node_modules/``), shown read-only from the working directory itself.
    shared: tuple[str, ...] = ()
    #: Read-only binds (source, destination) inside the hidden state directory: the
    #: private object store a copy's git borrows from, and the user's objects behind it.
    views: tuple[tuple[Path, Path], ...] = ()
    #: When the copy is an overlay: mounted on ``tree`` in the shell's own namespaces before
    #: bubblewrap starts (see :mod:`orchmode.core.overlay`).
    overlay: Overlay | None = None
    #: The session's secret files, each shown as a note saying it is withheld.
    secrets: Secrets | None = field(default=None, compare=False)
    #: Unix sockets commands may connect to (``sandbox_unix_sockets``): none (the seccomp
    #: filter refuses ``socket(AF_UNIX)``), these paths (the rest hidden), or ``all``.
    unix_sockets: tuple[str, ...] | Literal["all"] = ()
    #: The port the filtering proxy listens on inside the sandbox (see :attr:`proxied`).
    proxy_port: int = 3128
    #: The Python that makes the proxy's listener inside the sandbox, where no perl does
    #: (or the kernel will not copy perl's out); with neither, there is no proxy.
    python: str | None = field(default_factory=system_python)
    #: The perl that makes the listener, more cheaply (see ``_PERL_LISTENER_STEP``).
    perl: str | None = field(default_factory=system_perl)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        workdir: Path,
        env: Mapping[str, str] | None = None,
        readable: tuple[Path, ...] = (),
        secrets: Secrets | None = None,
    ) -> SandboxPolicy:
        return cls(
            secrets=secrets,
            readable=tuple(Path(os.path.realpath(p)) for p in readable),
            mode=settings.sandbox,
            workdir=Path(os.path.realpath(workdir)),
            allow_network=settings.allow_network,
            cpu_seconds=settings.sandbox_cpu_seconds,
            memory_mb=settings.sandbox_memory_mb,
            processes=settings.sandbox_processes,
            file_mb=settings.agent_write_mb,
            bwrap=settings.sandbox_bwrap,
            homes=tuple(_home_dirs(os.environ if env is None else env)),
            unix_sockets=settings.sandbox_unix_sockets,
        )

    @property
    def proxied(self) -> bool:
        """Whether commands reach the network through orchmode's filtering proxy: always
        in a sandbox, except where ``allow_network`` gave them the host's network."""
        has_step = self.python is not None or self.perl is not None
        return self.mode != "off" and not self.allow_network and has_step

    def proxy_env(self) -> dict[str, str]:
        """The proxy variables the sandbox's commands get (none when not :attr:`proxied`)."""
        return proxy_environment(self.proxy_port) if self.proxied else {}

    def listener_step(
        self, channel_fd: int, *, copied: bool = True, env: Mapping[str, str] | None = None
    ) -> ListenerStep:
        """The command that makes the proxy's listener inside the sandbox and hands it out
        on ``channel_fd``, then runs what follows it: perl's step while orchmode can copy
        the listener out (``copied``), else Python's (see ``_PERL_LISTENER_STEP``). ``env``
        is the shell's environment: perl's step starts without its PERL* variables and
        gives them back to the shell."""
        python_code = _LISTENER_STEP.format(port=self.proxy_port)
        if self.perl is not None and (copied or self.python is None):
            perl_code = _PERL_LISTENER_STEP.format(port=self.proxy_port)
            constants = (socket.AF_INET, socket.SOCK_STREAM, socket.SOL_SOCKET, socket.SO_REUSEADDR)
            fallback = (self.python, python_code) if self.python is not None else ("", "")
            kept = sorted((k, v) for k, v in (env or {}).items() if k.startswith("PERL"))
            options = [arg for name, _ in kept for arg in ("--unsetenv", name)]
            command = [self.perl, "-e", perl_code, str(channel_fd), *map(str, constants)]
            command += [*fallback, str(len(kept)), *itertools.chain.from_iterable(kept)]
            return ListenerStep([*options, "--setenv", "PERL_BADLANG", "0"], command)
        assert self.python is not None
        return ListenerStep([], [self.python, "-I", "-S", "-c", python_code, str(channel_fd)])

    @property
    def blocks_unix_sockets(self) -> bool:
        """Whether the seccomp filter refuses ``socket(AF_UNIX)`` (no socket is listed)."""
        return self.unix_sockets == ()

    @property
    def home(self) -> str:
        """``HOME`` inside the sandbox: the real home's path, now an empty directory."""
        return str(self.homes[0]) if self.homes else "/tmp"

    def mounts(self, *, sizes: bool = True) -> list[str]:
        """The filesystem part of the bwrap command line (without the shell's own dir).

        bubblewrap applies mounts in order and a later mount hides what is beneath it, so
        they are sorted by depth: a mask on /tmp comes before a working directory inside
        it, and a working directory comes before a home directory inside it.
        """
        ops = [*self._system_mounts(sizes), *self._tree_mounts(), *self._withheld()]
        ops.extend(self._state_mounts())
        # The sockets the user listed, wherever they are (/run included); one that is not
        # there yet is left out rather than failing the shell.
        ops.extend((p, ["--ro-bind-try", str(p), str(p)]) for p in self._listed_sockets())
        ops.sort(key=lambda op: _depth(op[0]))  # stable: equal depths keep their order
        return ["--ro-bind", "/", "/", *itertools.chain.from_iterable(args for _, args in ops)]

    def _system_mounts(self, sizes: bool) -> list[tuple[Path, list[str]]]:
        """Devices, /proc, the masks over /tmp and /run, and the home directories."""

        def tmpfs(path: Path, size: int) -> list[str]:
            return ["--size", str(size), "--tmpfs", str(path)] if sizes else ["--tmpfs", str(path)]

        ops: list[tuple[Path, list[str]]] = [
            (Path("/dev"), ["--dev", "/dev"]),
            (Path("/proc"), ["--proc", "/proc"]),
            # Kernel settings (core_pattern, binfmt_misc, modprobe): bubblewrap covers
            # /proc/sys only when the directory itself is writable, yet when orchmode runs
            # as root the files in it are, host-wide. Read-only, as /sys is.
            (Path("/proc/sys"), ["--ro-bind", "/proc/sys", "/proc/sys"]),
            # Half the memory: tmpfs pages count against the shell's memory cgroup, and a
            # full /tmp should say "no space left", not get the shell killed.
            (Path("/tmp"), tmpfs(Path("/tmp"), self.memory_mb * _MIB // 2)),
            # The sockets of the host's daemons (Docker, D-Bus, systemd) can be connected
            # to through a read-only mount, and a network namespace does not stop that.
            (Path("/run"), tmpfs(Path("/run"), _MIB)),
        ]
        if os.path.isdir("/var/run") and not os.path.islink("/var/run"):
            ops.append((Path("/var/run"), tmpfs(Path("/var/run"), _MIB)))
        if self.allow_network:
            resolver = Path(os.path.realpath("/etc/resolv.conf")).parent
            if resolver.is_relative_to("/run") and resolver != Path("/run"):
                # Keep name resolution: systemd-resolved's stub file and socket.
                ops.append((resolver, ["--ro-bind", str(resolver), str(resolver)]))
        for home in self.homes:
            if home == self.workdir:
                ops.extend(_dot_entry_masks(home))
            else:
                ops.append((home, tmpfs(home, 16 * _MIB)))
        return ops

    def _tree_mounts(self) -> list[tuple[Path, list[str]]]:
        """The working directory (or the agent's copy of it), and what stays read-only in it."""
        workdir = self.workdir
        ops: list[tuple[Path, list[str]]] = []
        writable = self.mode == "workspace-write" and (self.tree is None or self.tree_writable)
        bind = "--bind" if writable else "--ro-bind"
        source = self.tree if self.tree is not None else workdir
        ops.append((workdir, [bind, str(source), str(workdir)]))
        config = self._config_file(source)
        if writable and config is not None:
            # Settings for the next run, such as `sandbox = "off"`.
            ops.append(
                (workdir / CONFIG_FILE, ["--ro-bind", str(config), str(workdir / CONFIG_FILE)])
            )
        dot_git = workdir / ".git"
        if self.tree is None and writable and os.path.lexists(dot_git):
            # The repository itself (its hooks, its config, its refs) is never the agents'.
            ops.append((dot_git, ["--ro-bind", str(dot_git), str(dot_git)]))
        if self.tree is not None:
            # Sources are read from the host's own tree, beneath the copy that covers it.
            for name in self.shared:
                entry = workdir / name.rstrip("/")
                if self._withholds(name):
                    continue
                if os.path.lexists(entry) and not os.path.islink(entry) and self._has_stub(name):
                    ops.append((entry, ["--ro-bind", str(entry), str(entry)]))
        return ops

    def _state_mounts(self) -> list[tuple[Path, list[str]]]:
        """orchmode's state directory, read-only, with the results and views shown in it."""
        ops: list[tuple[Path, list[str]]] = []
        state = self.workdir / STATE_DIR
        shown = [p for p in self.readable if p.is_dir()]
        inside = [p for p in shown if p.is_relative_to(state)]
        if state.is_dir():
            # The results are bound into the empty tmpfs before it turns read-only: bwrap
            # makes their mount points in it, which it could not do afterwards.
            binds = [arg for p in inside for arg in ("--ro-bind", str(p), str(p))]
            binds += [
                arg
                for src, dest in self.views
                if src.is_dir() and dest.is_relative_to(state)
                for arg in ("--ro-bind", str(src), str(dest))
            ]
            ops.append((state, ["--tmpfs", str(state), *binds, "--remount-ro", str(state)]))
        ops.extend(
            (dest, ["--ro-bind", str(src), str(dest)])
            for src, dest in self.views
            if src.is_dir() and not dest.is_relative_to(state)
        )
        ops.extend((p, ["--ro-bind", str(p), str(p)]) for p in shown if p not in inside)
        return ops

    def _listed_sockets(self) -> list[Path]:
        """The listed sockets to bind in. Not one in the working directory when the
        sandbox shows a copy of it: the copy has no place for it (bubblewrap would make one,
        a new file in the agent's change) and the entries it shares show the host's own."""
        if self.unix_sockets == "all":
            return []
        paths = [Path(os.path.realpath(p)) for p in self.unix_sockets]
        workdir = self.workdir
        return [
            p
            for p in paths
            if not p.is_relative_to(workdir)
            or (self.tree is None and not p.is_relative_to(workdir / STATE_DIR))
        ]

    def socket_masks(self, table: str = "/proc/net/unix") -> list[str]:
        """bwrap arguments hiding the host's bound Unix sockets that are not listed, when
        some are (``sandbox_unix_sockets`` paths): each is covered by ``/dev/null``.

        The filter lets ``socket(AF_UNIX)`` through then, and cannot see the path that
        ``connect()`` names, so every other socket the host has bound at a path the sandbox
        shows is covered, as ``table`` lists them when the shell starts. Read anew per
        shell: sockets come and go. Not covered: a socket bound after the shell started,
        one bound in another network namespace (a container's), one whose path was relative.
        """
        if self.unix_sockets == "all" or not self.unix_sockets:
            return []
        listed = {Path(os.path.realpath(p)) for p in self.unix_sockets}
        args: list[str] = []
        for path in sorted(_bound_sockets(table)):
            real = Path(os.path.realpath(path))
            if real in listed or not self._shows_host(real):
                continue
            try:
                if not stat.S_ISSOCK(os.lstat(real).st_mode):
                    continue
            except OSError:
                continue
            args += ["--ro-bind", os.devnull, str(real)]
        return args

    def _shows_host(self, path: Path) -> bool:
        """Whether the sandbox shows the host's own ``path`` (not an empty or copied one)."""
        workdir = self.workdir
        if path.is_relative_to(workdir):
            if path.is_relative_to(workdir / STATE_DIR):
                return False
            if self.tree is None:
                return True
            # A copy holds no live socket; the entries shown from the working directory do.
            first = path.relative_to(workdir).parts[:1]
            return bool(first) and first[0] in {n.rstrip("/") for n in self.shared}
        hidden = [Path("/tmp"), Path("/run"), Path("/var/run"), *self.homes]
        return not any(path.is_relative_to(h) for h in hidden)

    @property
    def withheld(self) -> tuple[str, ...]:
        """The secret files this sandbox shows as a note (relative to the working directory).

        In the working directory itself: those found there. In a workspace: those among the
        entries shown from the working directory, where a snapshot (which never holds one)
        left a place for them.
        """
        secrets = self.secrets
        if secrets is None or not secrets.files:
            return ()
        if self.tree is None:
            return secrets.found
        return tuple(n for n in self.shared if self._withholds(n))

    def _withholds(self, name: str) -> bool:
        return (
            self.secrets is not None and not name.endswith("/") and self.secrets.files.matches(name)
        )

    def _withheld(self) -> list[tuple[Path, list[str]]]:
        """A read-only note bound over each secret file: an agent that reads one is told
        it is withheld, and cannot write, move or delete it."""
        ops: list[tuple[Path, list[str]]] = []
        for name in self.withheld:
            entry = self.workdir / name
            # a dangling link, or a file gone since it was found, has nothing to hide and
            # no place to mount on
            if not os.path.exists(entry) or entry.is_dir() or not self._has_stub(name):
                continue
            if self.tree is None and os.path.islink(entry):
                # bubblewrap cannot mount on a link (it follows it from a root of its own,
                # where an absolute one leads nowhere, and the shell would not start): the
                # note goes on the file it leads to, where the sandbox shows that file, and
                # elsewhere the link leads nowhere inside
                real = Path(os.path.realpath(entry))
                if not self._shows_host(real):
                    continue
                entry = real
            note = withheld_note(self.workdir / STATE_DIR)
            ops.append((entry, ["--ro-bind", str(note), str(entry)]))
        return ops

    def _config_file(self, source: Path) -> Path | None:
        """The tree's ``orchmode.toml``, as the host sees it: in the copy, or in the first
        layer of the overlay that holds one."""
        layers = self.overlay.lowers if self.overlay is not None else (source,)
        for layer in layers:
            config = layer / CONFIG_FILE
            if os.path.lexists(config):
                # a link cannot be mounted on (see _withheld): one is no file to protect
                return config if config.is_file() and not config.is_symlink() else None
        return None

    def _has_stub(self, name: str) -> bool:
        """Whether the tree has a place to show an ignored entry: a read-only overlay cannot
        make a mount point that its layers lack."""
        if self.overlay is None or self.overlay.writable:
            return True
        return any(os.path.lexists(layer / name.rstrip("/")) for layer in self.overlay.lowers)

    def limits_script(self, *, cgroup_pids: bool, cgroup_memory: bool) -> str:
        """The ``ulimit`` calls run inside the sandbox before the shell starts."""
        limits = [  # soft first: a hard limit below the current soft one is refused
            f"ulimit -S -t {self.cpu_seconds}",
            f"ulimit -H -t {self.cpu_seconds + _CPU_GRACE}",
        ]
        if not cgroup_memory:
            limits.append(f"ulimit -d {self.memory_mb * 1024}")
        if not cgroup_pids:
            limits.append(f"ulimit -u {self.processes}")
        if self.file_mb > 0:
            # No file past agent_write_mb ("File too large"), and no core dump written into
            # the tree. bash counts -f in KiB; a POSIX sh (dash, bash as sh) in 512-byte
            # blocks: the script runs in either.
            kib = self.file_mb * 1024
            limits.append(
                f'case "${{BASH_VERSION-}}:${{SHELLOPTS-}}" in :*|*posix*) '
                f"ulimit -f {kib * 2};; *) ulimit -f {kib};; esac"
            )
            limits.append("ulimit -c 0")
        return _LIMITS_SCRIPT.format(limits=" && ".join(limits))


def _bound_sockets(table: str) -> set[str]:
    """The paths of the Unix sockets bound in this network namespace, from ``table``
    (``/proc/net/unix``: seven fields, then the path; abstract names start with ``@``)."""
    paths: set[str] = set()
    with (
        contextlib.suppress(OSError),
        open(table, encoding="utf-8", errors="surrogateescape") as lines,
    ):
        next(lines, None)  # the header
        for line in lines:
            fields = line.rstrip("\n").split(None, 7)
            if len(fields) == 8 and fields[7].startswith("/"):
                paths.add(fields[7])
    return paths


@functools.cache
def withheld_note(state: Path) -> Path:
    """The note shown in place of a secret file, written once in orchmode's state directory
    (hidden from agents: bubblewrap reads a bind's source from the host); an empty file
    where it cannot be written, for a secret file is hidden all the same."""
    note = state / "withheld.txt"
    try:
        if not note.is_file() or note.read_text(encoding="utf-8") != WITHHELD_NOTE:
            state.mkdir(parents=True, exist_ok=True)
            temporary = state / f".withheld-{os.getpid()}"
            temporary.write_text(WITHHELD_NOTE, encoding="utf-8")
            os.chmod(temporary, 0o444)
            os.replace(temporary, note)
    except OSError:
        return Path(os.devnull)
    return note


def _dot_entry_masks(home: Path) -> list[tuple[Path, list[str]]]:
    """When the home directory is the working directory, hide its dot entries instead."""
    masks: list[tuple[Path, list[str]]] = []
    with contextlib.suppress(OSError):
        for entry in sorted(os.scandir(home), key=lambda e: e.name):
            if not entry.name.startswith(".") or entry.name == STATE_DIR:
                continue
            if entry.is_dir(follow_symlinks=False):
                masks.append(
                    (Path(entry.path), ["--tmpfs", entry.path, "--remount-ro", entry.path])
                )
            else:
                masks.append((Path(entry.path), ["--ro-bind", "/dev/null", entry.path]))
    return masks
