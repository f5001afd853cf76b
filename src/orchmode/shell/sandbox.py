"""The bubblewrap sandbox every agent's bash runs in: its command line per shell, and the preflight.

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
  of the host's loopback services. The only way out is orchmode's filtering proxy
  (:mod:`orchmode.shell.proxy`): a short step before the shell makes its listening socket
  on that loopback and hands it to orchmode over a socket pair, and the proxy variables
  (``HTTP_PROXY``…) point there, so only the domains the rules allow are reached;
- a seccomp filter, which bubblewrap loads before the shell starts, refuses the system
  calls no command needs: ``socket(AF_UNIX)`` (a socket anywhere in the read-only file
  system could be connected to), ``ptrace`` and its kin, mounts, new namespaces, io_uring
  and more. ``sandbox_unix_sockets`` lifts the Unix socket refusal for all sockets, or
  for those it lists, binding them in and covering the host's others;
- a new PID namespace and ``--die-with-parent``: when the shell is killed, or orchmode
  dies, everything the shell started dies with it;
- CPU time is an rlimit per process; memory and the number of processes are a cgroup per
  shell where orchmode can make one, and rlimits otherwise.

Whether bubblewrap works here, under the filter, is probed once per process and cached. A
missing binary, a kernel that refuses namespaces or a filter that cannot be applied is
reported in one line, and a command never falls back to running unsandboxed:
``--sandbox off`` is the explicit opt-out.

The probe lives in :mod:`orchmode.shell.bwrap`, the mounts and ulimits in
:mod:`orchmode.shell.policy`, the filter in :mod:`orchmode.shell.seccomp`, and the
per-shell cgroups in :mod:`orchmode.shell.cgroups`; this module puts them together. The
filter reaches bubblewrap on a descriptor of its own per shell (``--seccomp FD``), passed
through the cgroup and overlay wrappers by the spawn and closed by bubblewrap once read:
the proxy's socket pair end goes the same way, to the listener step, which closes it
before the shell starts: no other descriptor of orchmode's reaches a sandbox.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from ..core.overlay import Overlay
from ..core.programs import system_program
from ..core.secrets import Secrets
from ..core.settings import Settings
from . import seccomp
from .bwrap import Probe, probe
from .cgroups import SandboxUnavailable, _cgroups, _make_shell_cgroups, _remove_cgroups
from .policy import _MIB, STATE_DIR, SandboxPolicy
from .proxy import Attachment, Proxy, Seat

__all__ = ["Sandbox", "ShellSandboxing", "preflight"]

log = logging.getLogger("orchmode")

# Joins the shell's cgroups, then becomes bubblewrap: nothing it starts is outside them.
_CGROUP_SCRIPT = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1/cgroup.procs" || exit 125; '
    'n=$((n - 1)); shift; done; exec "$@"'
)


class Sandbox:
    """A session's sandbox: one command line, built on first use, shared by every shell."""

    def __init__(self, policy: SandboxPolicy, proxy: Proxy | None = None) -> None:
        if policy.mode == "off":
            raise ValueError("an `off` policy has no sandbox")
        self.policy = policy
        #: The filtering proxy the shells' connections go through (when the policy says
        #: they do: see :attr:`SandboxPolicy.proxied`); None: they reach no network.
        self.proxy = proxy if policy.proxied else None
        self._prefix: list[str] | None = None
        self._suffix: list[str] | None = None
        #: The secret files the cached command line hides.
        self._withheld: tuple[str, ...] = ()
        if policy.mode == "workspace-write":
            # Made on the host now, so the sandbox finds it (hidden) and cannot create it.
            with contextlib.suppress(OSError):
                (policy.workdir / STATE_DIR).mkdir(exist_ok=True)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        workdir: Path,
        readable: tuple[Path, ...] = (),
        secrets: Secrets | None = None,
    ) -> Sandbox | None:
        """The sandbox for ``settings``, or None when the user turned it off."""
        if settings.sandbox == "off":
            return None
        policy = SandboxPolicy.from_settings(settings, workdir, readable=readable, secrets=secrets)
        if not policy.allow_network and policy.python is None and policy.perl is None:
            log.warning(
                "orchmode: no perl or python3 found for the network proxy's listener — sandboxed "
                "commands reach no network at all"
            )
        return cls(policy, Proxy.from_settings(settings) if policy.proxied else None)

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
        overlay: Overlay | None = None,
    ) -> Sandbox:
        """The same sandbox for an agent that works in a copy of the tree: a directory, or
        an ``overlay`` mounted on ``tree`` first."""
        return Sandbox(
            replace(
                self.policy,
                tree=tree,
                tree_writable=writable,
                shared=shared,
                views=views,
                overlay=overlay,
            ),
            self.proxy,
        )

    def read_only(self) -> Sandbox:
        """The same sandbox with the working directory read-only (a role whose bash only
        reads the tree); itself when it is read-only already."""
        if self.policy.mode == "read-only":
            return self
        return Sandbox(replace(self.policy, mode="read-only"), self.proxy)

    def probe(self) -> Probe:
        return probe(self.policy.bwrap, self.policy.allow_network)

    def for_shell(self) -> ShellSandboxing:
        return ShellSandboxing(self)

    def argv(
        self,
        tmpdir: str,
        cgroup_dirs: list[Path] | None = None,
        *,
        seccomp_fd: int,
        channel_fd: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> list[str]:
        """The command line that runs what follows it (bash, with environment ``env``) in
        the sandbox.

        ``seccomp_fd`` holds the filter's program (:func:`orchmode.shell.seccomp.open_program`),
        and must reach bubblewrap open, at that number: through the wrappers (which keep
        their descriptors) by the spawn's ``pass_fds``. bubblewrap closes it once read.
        ``channel_fd``, passed the same way, is the socket pair end the proxy's listener
        is sent out on (see :meth:`SandboxPolicy.listener_step`).
        """
        found = self.probe()
        if found.problem is not None or found.bwrap is None:
            raise SandboxUnavailable(found.problem)
        policy = self.policy
        prefix, suffix = self._fixed_parts(found)
        wrapper, inner = _limits_steps(policy, cgroup_dirs)
        step_options: list[str] = []
        if channel_fd is not None:
            # First thing inside: the listener made in the sandbox's network namespace.
            copied = self.proxy is None or self.proxy.copies_listeners
            step = policy.listener_step(channel_fd, copied=copied, env=env)
            step_options, inner = step.options, [*step.command, *inner]
        sandboxed = [
            *prefix,
            *policy.socket_masks(),
            *["--ro-bind", tmpdir, tmpdir],  # the shell's command files, last: on top
            *["--seccomp", str(seccomp_fd)],
            *step_options,
            *suffix,
            *inner,
        ]
        if policy.overlay is not None:
            sandboxed = policy.overlay.wrap(sandboxed)
        return [*wrapper, *sandboxed]

    def _fixed_parts(self, found: Probe) -> tuple[list[str], list[str]]:
        """What comes before and after each shell's own arguments: the same for every
        shell until a secret file is found (it is then hidden too)."""
        policy = self.policy
        if self._withheld != policy.withheld:  # secret files found since: hidden too
            self._prefix = None
        if self._prefix is None or self._suffix is None:
            self._withheld = policy.withheld
            flags = list(found.flags)
            if policy.overlay is not None:
                # Inside the overlay's namespace the shell is that namespace's root: map it
                # back to the user, as a sandbox without an overlay shows it.
                if "--unshare-user" not in flags:
                    flags.append("--unshare-user")
                flags += ["--uid", str(os.getuid()), "--gid", str(os.getgid())]
            assert found.bwrap is not None  # argv has refused a sandbox without it
            self._prefix = [found.bwrap, *flags, *policy.mounts(sizes=found.sizes)]
            proxy_env = policy.proxy_env() if self.proxy is not None else {}
            self._suffix = [
                *["--chdir", str(policy.workdir)],
                *["--setenv", "HOME", policy.home, "--setenv", "TMPDIR", "/tmp"],
                *[arg for name, value in proxy_env.items() for arg in ("--setenv", name, value)],
                *["--unsetenv", "XDG_RUNTIME_DIR", "--unsetenv", "DBUS_SESSION_BUS_ADDRESS"],
                "--",
            ]
        return self._prefix, self._suffix


def _limits_steps(
    policy: SandboxPolicy, cgroup_dirs: list[Path] | None
) -> tuple[list[str], list[str]]:
    """The wrapper that joins the shell's cgroups (none without them), and the step inside
    the sandbox that sets the limits no cgroup holds."""
    wrapper: list[str] = []
    bases: Mapping[str, Path] = {}
    if cgroup_dirs:
        cgroups = _cgroups()
        bases = cgroups.bases if cgroups is not None else {}
    script = policy.limits_script(cgroup_pids="pids" in bases, cgroup_memory="memory" in bases)
    inner = [system_program("bash"), "--noprofile", "--norc", "-c", script, "orchmode-sandbox"]
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
    return wrapper, inner


class ShellSandboxing:
    """One shell's part of the sandbox: its cgroup, made on first start, kept across restarts.

    The sandbox may be given as a function that makes it when the shell first starts: an
    agent's workspace is only known once it is open.
    """

    def __init__(self, sandbox: Sandbox | Callable[[], Sandbox], mode: str | None = None) -> None:
        self._made = sandbox if isinstance(sandbox, Sandbox) else None
        self._make = None if isinstance(sandbox, Sandbox) else sandbox
        self._mode = mode if mode is not None else self._sandbox.mode
        self._cgroup_dirs: list[Path] | None = None
        #: The secret files the last shell started hides (None: none started yet).
        self._hidden: tuple[str, ...] | None = None
        #: Descriptors the last command line names, not yet taken by its spawn.
        self._fds: tuple[int, ...] = ()
        #: Orchmode's end of the last command line's socket pair, until the shell starts.
        self._channel: socket.socket | None = None
        #: The running shell's listener, served by the proxy.
        self._attachment: Attachment | None = None

    @property
    def _sandbox(self) -> Sandbox:
        if self._made is None:
            assert self._make is not None
            self._made = self._make()
        return self._made

    @property
    def mode(self) -> str:
        return self._mode

    def argv(self, tmpdir: str, env: Mapping[str, str]) -> list[str]:
        found = self._sandbox.probe()
        if found.problem is not None:
            raise SandboxUnavailable(found.problem)
        if self._cgroup_dirs is None:
            cgroups = _cgroups()
            policy = self._sandbox.policy
            self._cgroup_dirs = (
                _make_shell_cgroups(cgroups, policy.processes, policy.memory_mb * _MIB)
                if cgroups is not None
                else []
            )
        self._hidden = self._sandbox.policy.withheld
        self._close_fds()
        fd = seccomp.open_program(self._sandbox.policy.blocks_unix_sockets)
        fds = [fd]
        channel_fd = None
        try:
            if self._sandbox.proxy is not None:
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                self._channel = ours
                channel_fd = theirs.detach()
                fds.append(channel_fd)
            argv = self._sandbox.argv(
                tmpdir, self._cgroup_dirs, seccomp_fd=fd, channel_fd=channel_fd, env=env
            )
        except BaseException:
            for opened in fds:
                os.close(opened)
            self._drop_channel()
            raise
        self._fds = tuple(fds)
        return argv

    def started(self, seat: Seat, pid: int | None = None) -> None:
        """The shell the last :meth:`argv` names has started as ``pid`` (on the event
        loop): the proxy serves its listener, for ``seat``, once the listener step hands
        it out."""
        channel, self._channel = self._channel, None
        if self._attachment is not None:  # the previous shell's
            self._attachment.close()
            self._attachment = None
        proxy = self._sandbox.proxy
        if channel is not None and proxy is not None:
            self._attachment = proxy.adopt(channel, seat, pid)
        elif channel is not None:
            channel.close()

    def _drop_channel(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def take_fds(self) -> tuple[int, ...]:
        """The descriptors the last :meth:`argv` names (the seccomp filter's): the caller
        passes them to the shell's process, then closes them."""
        fds, self._fds = self._fds, ()
        return fds

    def _close_fds(self) -> None:
        for fd in self.take_fds():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._drop_channel()

    def newly_withheld(self) -> tuple[str, ...]:
        """The secret files found since the last shell started (it shows them as they are)."""
        if self._hidden is None:
            return ()
        hidden = set(self._hidden)
        return tuple(n for n in self._sandbox.policy.withheld if n not in hidden)

    def release(self) -> None:
        """Remove the shell's cgroup (its processes are dead: the session has closed)."""
        self._close_fds()
        if self._attachment is not None:
            self._attachment.close()
            self._attachment = None
        if self._cgroup_dirs:
            _remove_cgroups(self._cgroup_dirs)
        self._cgroup_dirs = None


def preflight(settings: Settings) -> list[str]:
    """Check at start that commands can run as configured; returns warnings for the user.

    Raises :class:`~orchmode.core.errors.SandboxError` when they cannot be sandboxed, so that
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
