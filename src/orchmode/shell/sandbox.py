"""The bubblewrap sandbox every agent's bash runs in: its command line, its limits, the probe.

Model-written commands are untrusted input running with the user's permissions.
bubblewrap puts each persistent shell in fresh user, mount, PID, IPC, UTS, cgroup and
(unless the network is allowed) network namespaces, with no daemon and for a few
milliseconds per shell:

- the host's filesystem is read-only, the working directory read-write (or read-only),
  ``/tmp`` and the home directory are private and empty, and ``/run`` (where Docker's,
  D-Bus's and systemd's sockets live) is empty;
- orchmode's own state (``.orchmode/``) is hidden behind an empty read-only mount, so an
  agent cannot rewrite the journal or the budget;
- a new network namespace holds nothing but its own loopback: no DNS, no internet, none
  of the host's loopback services;
- a new PID namespace and ``--die-with-parent``: when the shell is killed, or orchmode
  dies, everything the shell started dies with it;
- CPU time is an rlimit per process; memory and the number of processes are a cgroup per
  shell where orchmode can make one, and rlimits otherwise.

Whether bubblewrap works here is probed once per process and cached. A missing binary or
a kernel that refuses namespaces is reported in one line, and a command never falls back
to running unsandboxed: ``--sandbox off`` is the explicit opt-out.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import itertools
import logging
import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..core.settings import CONFIG_FILE, SandboxMode, Settings

__all__ = [
    "Probe",
    "Sandbox",
    "SandboxPolicy",
    "SandboxUnavailable",
    "ShellSandboxing",
    "preflight",
    "probe",
]

log = logging.getLogger("orchmode")

#: orchmode's own directory in the working directory: journal, records, budget.
STATE_DIR = ".orchmode"
_MIB = 1024 * 1024
# Between the soft CPU limit (SIGXCPU, which bash reports by name) and the hard one (SIGKILL).
_CPU_GRACE = 5
_PROBE_TIMEOUT = 10.0
# Retries of removing a shell's cgroup while its last processes are reaped: 0.05 s, doubling.
_RETRY_FIRST = 0.05
_RETRY_LAST = 3.2
_FIX = "or pass --sandbox off to run commands unsandboxed"

# Sets the rlimits inside the sandbox, then becomes the persistent shell. RLIMIT_NPROC is
# set here, after bubblewrap made the user namespace, so that it counts the sandbox's
# own processes only; set outside, it would count all of the user's.
_LIMITS_SCRIPT = (
    '{limits} || {{ echo "orchmode: the sandbox limits could not be set" >&2; exit 126; }}; '
    'exec "$@"'
)
# Joins the shell's cgroups, then becomes bubblewrap: nothing it starts is outside them.
_CGROUP_SCRIPT = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1/cgroup.procs" || exit 125; '
    'n=$((n - 1)); shift; done; exec "$@"'
)


class SandboxUnavailable(OSError):
    """Raised instead of starting a shell unsandboxed; the shell reports it as an error result."""


# ------------------------------------------------------------------------------ probe


@dataclass(frozen=True)
class Probe:
    """Whether bubblewrap can sandbox a shell here, with which flags, and how limits hold."""

    bwrap: str | None
    problem: str | None
    #: The namespace flags that worked, strongest first tried.
    flags: tuple[str, ...] = ()
    #: Whether this bubblewrap can cap a tmpfs's size (``--size``, since 0.7).
    sizes: bool = False
    #: How each limit is enforced, e.g. ``{"processes": "cgroup v1 pids.max per shell"}``.
    limits: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.problem is None

    def describe(self) -> str:
        return "; ".join(f"{name} by {how}" for name, how in self.limits.items())


def _flag_choices(options: set[str], allow_network: bool) -> list[tuple[str, ...]]:
    """Namespace flags to try, strongest first.

    ``--disable-userns`` (bubblewrap 0.8+) stops the sandbox from making user namespaces
    of its own, which is kernel attack surface no command needs; it needs a user
    namespace, which some hosts (root without one) cannot make, hence the fallback.
    """
    base = ("--unshare-all", *(("--share-net",) if allow_network else ()), "--die-with-parent")
    base += ("--cap-drop", "ALL")
    if "--disable-userns" in options:
        return [(*base, "--unshare-user", "--disable-userns"), base]
    return [base]


@functools.cache
def probe(bwrap: str = "bwrap", allow_network: bool = False) -> Probe:
    """Find bubblewrap, learn its options, and run one empty sandbox like the shells' own.

    Cached for the life of the process: it costs a few milliseconds, and hundreds of
    shells must not each pay it.
    """
    found = shutil.which(bwrap)
    if found is None:
        where = f"at {bwrap}" if os.sep in bwrap else f"({bwrap!r} is not on PATH)"
        return Probe(
            None,
            f"the bash sandbox is unavailable: bubblewrap was not found {where} — install it "
            f"(apt install bubblewrap), {_FIX}",
        )
    found = os.path.abspath(found)
    options = _options(found)
    sizes = "--size" in options
    reason = "it did not run"
    for flags in _flag_choices(options, allow_network):
        tmpfs = ["--size", str(_MIB), "--tmpfs", "/tmp"] if sizes else ["--tmpfs", "/tmp"]
        mounts = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *tmpfs]
        ok, reason = _try([found, *flags, *mounts, "--", "true"])
        if ok:
            return Probe(found, None, flags, sizes, _limit_methods())
    return Probe(
        found,
        f"the bash sandbox is unavailable: bubblewrap cannot make its namespaces here "
        f"({reason}) — allow unprivileged user namespaces, {_FIX}",
    )


def _options(bwrap: str) -> set[str]:
    """The options this bubblewrap knows, from its ``--help``."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            [bwrap, "--help"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT
        )
        return set(re.findall(r"^\s+(--[a-z-]+)", done.stdout, flags=re.M))
    return set()


def _try(argv: list[str]) -> tuple[bool, str]:
    """Run ``argv``; whether it succeeded, else the first line of why not."""
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=_PROBE_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0]
    if done.returncode == 0:
        return True, ""
    lines = done.stderr.strip().splitlines()
    return False, lines[0] if lines else f"exit status {done.returncode}"


def _limit_methods() -> dict[str, str]:
    cgroups = _cgroups()
    if cgroups is None:
        bases: dict[str, Path] = {}
        version = ""
    else:
        bases, version = cgroups.bases, f"cgroup v{cgroups.version}"
    memory_file = "memory.max" if version == "cgroup v2" else "memory.limit_in_bytes"
    return {
        "cpu": "RLIMIT_CPU per process",
        "memory": f"{version} {memory_file} per shell"
        if "memory" in bases
        else "RLIMIT_DATA per process",
        "processes": f"{version} pids.max per shell"
        if "pids" in bases
        else "RLIMIT_NPROC in the sandbox's user namespace",
    }


# ---------------------------------------------------------------------------- cgroups


@dataclass(frozen=True)
class _Cgroups:
    """Where this process makes one cgroup per shell: its own directory per controller."""

    version: int
    #: controller (``pids``, ``memory``) -> the ``orchmode-<pid>`` directory made for it
    bases: dict[str, Path]


_shell_ids = itertools.count(1)
_stale: set[Path] = set()  # shell cgroups whose removal failed (still busy): retried later
_retry_loop: asyncio.AbstractEventLoop | None = None  # where retries are scheduled


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
    _remove_cgroups(list(_stale))
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
    """Remove shell cgroups; one still busy is retried later, from the running event loop.

    A killed shell's last processes are reaped a moment after its pipe closes, and a
    cgroup cannot be removed until they are. Whatever the retries miss is tried again by
    the next shell to start and at exit.
    """
    for path in paths:
        try:
            path.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            _stale.add(path)
            continue
        _stale.discard(path)
    if _stale:
        _schedule_retry(_RETRY_FIRST)


def _schedule_retry(delay: float) -> None:
    """One chain of retries per event loop, however many shells close at once."""
    global _retry_loop
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    if _retry_loop is loop and delay == _RETRY_FIRST:
        return  # a chain is already running on this loop
    _retry_loop = loop
    loop.call_later(delay, _retry_stale, delay)


def _retry_stale(delay: float) -> None:
    global _retry_loop
    _retry_loop = None
    for path in list(_stale):
        try:
            path.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            continue
        _stale.discard(path)
    if _stale and delay * 2 <= _RETRY_LAST:
        _schedule_retry(delay * 2)


# ----------------------------------------------------------------------------- policy


def _home_dirs(env: Mapping[str, str]) -> list[Path]:
    """The user's home directories to hide: ``$HOME`` and the account's, resolved."""
    candidates = [env.get("HOME", "")]
    with contextlib.suppress(KeyError):
        candidates.append(pwd.getpwuid(os.getuid()).pw_dir)
    homes: list[Path] = []
    for raw in candidates:
        if raw and os.path.isabs(raw):
            home = Path(os.path.realpath(raw))
            if home != Path("/") and home not in homes:
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

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        workdir: Path,
        env: Mapping[str, str] | None = None,
        readable: tuple[Path, ...] = (),
    ) -> SandboxPolicy:
        return cls(
            readable=tuple(Path(os.path.realpath(p)) for p in readable),
            mode=settings.sandbox,
            workdir=Path(os.path.realpath(workdir)),
            allow_network=settings.allow_network,
            cpu_seconds=settings.sandbox_cpu_seconds,
            memory_mb=settings.sandbox_memory_mb,
            processes=settings.sandbox_processes,
            bwrap=settings.sandbox_bwrap,
            homes=tuple(_home_dirs(os.environ if env is None else env)),
        )

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
        workdir = self.workdir

        def tmpfs(path: Path, size: int) -> list[str]:
            return ["--size", str(size), "--tmpfs", str(path)] if sizes else ["--tmpfs", str(path)]

        ops: list[tuple[Path, list[str]]] = [
            (Path("/dev"), ["--dev", "/dev"]),
            (Path("/proc"), ["--proc", "/proc"]),
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
            if home == workdir:
                ops.extend(_dot_entry_masks(home))
            else:
                ops.append((home, tmpfs(home, 16 * _MIB)))
        writable = self.mode == "workspace-write" and (self.tree is None or self.tree_writable)
        bind = "--bind" if writable else "--ro-bind"
        source = self.tree if self.tree is not None else workdir
        ops.append((workdir, [bind, str(source), str(workdir)]))
        config = source / CONFIG_FILE
        if writable and config.is_file():
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
                if os.path.lexists(entry) and not os.path.islink(entry):
                    ops.append((entry, ["--ro-bind", str(entry), str(entry)]))
        state = workdir / STATE_DIR
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
        ops.sort(key=lambda op: _depth(op[0]))  # stable: equal depths keep their order
        return ["--ro-bind", "/", "/", *itertools.chain.from_iterable(args for _, args in ops)]

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
        return _LIMITS_SCRIPT.format(limits=" && ".join(limits))


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


# ---------------------------------------------------------------------------- runtime


class Sandbox:
    """A session's sandbox: one command line, built on first use, shared by every shell."""

    def __init__(self, policy: SandboxPolicy) -> None:
        if policy.mode == "off":
            raise ValueError("an `off` policy has no sandbox")
        self.policy = policy
        self._prefix: list[str] | None = None
        self._suffix: list[str] | None = None
        if policy.mode == "workspace-write":
            # Made on the host now, so the sandbox finds it (hidden) and cannot create it.
            with contextlib.suppress(OSError):
                (policy.workdir / STATE_DIR).mkdir(exist_ok=True)

    @classmethod
    def from_settings(
        cls, settings: Settings, workdir: Path, readable: tuple[Path, ...] = ()
    ) -> Sandbox | None:
        """The sandbox for ``settings``, or None when the user turned it off."""
        if settings.sandbox == "off":
            return None
        return cls(SandboxPolicy.from_settings(settings, workdir, readable=readable))

    @property
    def mode(self) -> str:
        return self.policy.mode

    def in_copy(
        self,
        tree: Path,
        *,
        writable: bool,
        shared: tuple[str, ...] = (),
        views: tuple[tuple[Path, Path], ...] = (),
    ) -> Sandbox:
        """The same sandbox for an agent that works in a copy of the tree."""
        return Sandbox(
            replace(self.policy, tree=tree, tree_writable=writable, shared=shared, views=views)
        )

    def probe(self) -> Probe:
        return probe(self.policy.bwrap, self.policy.allow_network)

    def for_shell(self) -> ShellSandboxing:
        return ShellSandboxing(self)

    def argv(self, tmpdir: str, cgroup_dirs: list[Path] | None = None) -> list[str]:
        """The command line that runs what follows it (bash) in the sandbox."""
        found = self.probe()
        if found.problem is not None or found.bwrap is None:
            raise SandboxUnavailable(found.problem)
        policy = self.policy
        if self._prefix is None or self._suffix is None:
            self._prefix = [found.bwrap, *found.flags, *policy.mounts(sizes=found.sizes)]
            self._suffix = [
                *["--chdir", str(policy.workdir)],
                *["--setenv", "HOME", policy.home, "--setenv", "TMPDIR", "/tmp"],
                *["--unsetenv", "XDG_RUNTIME_DIR", "--unsetenv", "DBUS_SESSION_BUS_ADDRESS"],
                "--",
            ]
        wrapper: list[str] = []
        bases: Mapping[str, Path] = {}
        if cgroup_dirs:
            cgroups = _cgroups()
            bases = cgroups.bases if cgroups is not None else {}
        script = policy.limits_script(cgroup_pids="pids" in bases, cgroup_memory="memory" in bases)
        inner = ["bash", "--noprofile", "--norc", "-c", script, "orchmode-sandbox"]
        if cgroup_dirs:
            joins = _CGROUP_SCRIPT
            if "pids" in bases and "memory" in bases:
                # Only the CPU limit is left, and a process passes it on to all it starts:
                # the wrapper sets it before becoming bubblewrap, which saves starting a
                # second bash in every sandbox (a tenth of a shell's start-up).
                joins = _CGROUP_SCRIPT.replace('exec "$@"', script)
                inner = []
            wrapper = ["/bin/sh", "-c", joins, "orchmode-cgroup"]
            wrapper += [str(len(cgroup_dirs)), *map(str, cgroup_dirs)]
        return [
            *wrapper,
            *self._prefix,
            *["--ro-bind", tmpdir, tmpdir],  # the shell's command files, last: on top
            *self._suffix,
            *inner,
        ]


class ShellSandboxing:
    """One shell's part of the sandbox: its cgroup, made on first start, kept across restarts."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox
        self._cgroup_dirs: list[Path] | None = None

    @property
    def mode(self) -> str:
        return self._sandbox.mode

    def argv(self, tmpdir: str) -> list[str]:
        if self._cgroup_dirs is None and self._sandbox.probe().ok:
            cgroups = _cgroups()
            policy = self._sandbox.policy
            self._cgroup_dirs = (
                _make_shell_cgroups(cgroups, policy.processes, policy.memory_mb * _MIB)
                if cgroups is not None
                else []
            )
        return self._sandbox.argv(tmpdir, self._cgroup_dirs)

    def release(self) -> None:
        """Remove the shell's cgroup (its processes are dead: the session has closed)."""
        if self._cgroup_dirs:
            _remove_cgroups(self._cgroup_dirs)
        self._cgroup_dirs = None


def preflight(settings: Settings) -> list[str]:
    """Check at start that commands can run as configured; returns warnings for the user.

    Raises :class:`~orchmode.errors.SandboxError` when they cannot be sandboxed, so that
    nothing runs, and nothing is spent, until the user installs bubblewrap or opts out.
    """
    from ..core.errors import SandboxError

    if settings.sandbox == "off":
        return [
            "the sandbox is off (--sandbox off): model-written commands run unsandboxed, "
            "with your permissions, files, network and credentials"
        ]
    found = probe(settings.sandbox_bwrap, settings.allow_network)
    if found.problem is not None:
        raise SandboxError(found.problem)
    log.debug("sandbox %s with %s; %s", settings.sandbox, found.bwrap, found.describe())
    if os.geteuid() == 0 and "cgroup" not in found.limits["processes"]:
        return [
            "--sandbox-processes is not enforced: orchmode runs as root, whom RLIMIT_NPROC "
            "does not bind, and cannot make a cgroup here"
        ]
    return []
