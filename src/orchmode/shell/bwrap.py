"""Probing bubblewrap once per process: is it installed, which flags work, how limits hold.

The probe runs a real, empty sandbox under the shells' seccomp filter, which costs
milliseconds, so it is cached; a missing binary, a kernel that refuses namespaces or a
filter that cannot be applied becomes one line saying what to do.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..core.overlay import Overlay, unsafe_path
from ..core.programs import find, system_program
from . import seccomp
from .cgroups import _cgroups
from .policy import _MIB

__all__ = ["Probe", "overlay_problem", "probe"]

_PROBE_TIMEOUT = 10.0
_FIX = "or pass --sandbox off to run commands unsandboxed"


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
    shells must not each pay it. The empty sandbox runs under the seccomp filter, so a
    filter that cannot be applied is found here too, and named.
    """
    # A bare name is looked up on PATH's absolute directories only (a relative one would
    # find the repository's own `bwrap`); a path the user gave is taken as it is.
    found = shutil.which(bwrap) if os.sep in bwrap else find(bwrap)
    if found is None:
        where = f"at {bwrap}" if os.sep in bwrap else f"({bwrap!r} is not on PATH)"
        return Probe(
            None,
            f"the bash sandbox is unavailable: bubblewrap was not found {where} — install it "
            f"(apt install bubblewrap), {_FIX}",
        )
    found = os.path.abspath(found)
    unavailable = seccomp.unavailable()
    if unavailable is not None:
        return Probe(found, unavailable)
    options = _options(found)
    sizes = "--size" in options
    reason = "it did not run"
    tmpfs = ["--size", str(_MIB), "--tmpfs", "/tmp"] if sizes else ["--tmpfs", "/tmp"]
    mounts = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *tmpfs]
    choices = _flag_choices(options, allow_network)
    for flags in choices:
        ok, reason = _try_filtered([found, *flags, *mounts], [system_program("true")])
        if ok:
            return Probe(found, None, flags, sizes, _limit_methods())
    if _try([found, *choices[0], *mounts, "--", system_program("true")])[0]:
        return Probe(
            found,
            f"the bash sandbox is unavailable: bubblewrap could not apply its seccomp filter "
            f"({reason}) — check that the kernel has seccomp (CONFIG_SECCOMP_FILTER), {_FIX}",
        )
    return Probe(
        found,
        f"the bash sandbox is unavailable: bubblewrap cannot make its namespaces here "
        f"({reason}) — allow unprivileged user namespaces, {_FIX}",
    )


def overlay_problem(bwrap: str, allow_network: bool, where: Path) -> str | None:
    """Why agents' workspaces cannot be overlays with their layers in ``where``, or None.

    Tried for real, once per file system: an overlay mounted in a user namespace of its
    own, bubblewrap started inside it (as every agent's shell is), a file written and one
    deleted through it; the write must land in the upper layer and the deletion be a
    whiteout there, the lower layer untouched.
    """
    found = probe(bwrap, allow_network)
    if found.problem is not None or found.bwrap is None:
        return found.problem or "bubblewrap is not available"
    for tool in ("unshare", "mount"):
        if find(tool) is None:
            return f"{tool} (util-linux) is not installed"
    if unsafe_path(where):
        return f"the path {where} holds a character overlay mount options cannot carry"
    try:
        device = os.stat(where).st_dev
    except OSError as exc:
        return f"{where} cannot be read ({exc.strerror})"
    return _overlay_problem(found.bwrap, found.flags, str(where), device)


@functools.cache
def _overlay_problem(bwrap: str, flags: tuple[str, ...], where: str, _device: int) -> str | None:
    scratch = Path(tempfile.mkdtemp(prefix=".overlay-probe-", dir=where))
    try:
        lower, upper, work, target = (scratch / n for n in ("lower", "upper", "work", "mnt"))
        for directory in (lower, upper, work, target):
            directory.mkdir()
        (lower / "gone").write_text("x")
        flags = (*flags, *(() if "--unshare-user" in flags else ("--unshare-user",)))
        sandboxed = [
            bwrap, *flags, "--uid", str(os.getuid()), "--gid", str(os.getgid()),
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--bind", str(target), str(target), "--chdir", str(target),
        ]  # fmt: skip
        fd = seccomp.open_program()  # through the overlay's wrapper, as the shells' is
        try:
            sandboxed += ["--seccomp", str(fd), "--", "/bin/sh", "-c", "echo new > new && rm gone"]
            ok, reason = _try(Overlay((lower,), target, upper, work).wrap(sandboxed), (fd,))
        finally:
            os.close(fd)
        if not ok:
            return f"an overlay in a user namespace could not be made here ({reason})"
        gone = os.lstat(upper / "gone")
        if not (upper / "new").is_file() or not (stat.S_ISCHR(gone.st_mode) and gone.st_rdev == 0):
            return "overlayfs here does not keep writes and deletions in the upper layer"
        if not (lower / "gone").is_file():
            return "overlayfs here changed the lower layer"
        return None
    except OSError as exc:
        return f"an overlay could not be tried here ({exc})"
    finally:
        _remove(scratch)


def _remove(path: Path) -> None:
    """Remove a probe's directory, overlayfs's mode-0 scratch directory included."""
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(root, name), 0o700)
    shutil.rmtree(path, ignore_errors=True)


def _options(bwrap: str) -> set[str]:
    """The options this bubblewrap knows, from its ``--help``."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            [bwrap, "--help"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT
        )
        return set(re.findall(r"^\s+(--[a-z-]+)", done.stdout, flags=re.M))
    return set()


def _try_filtered(sandbox: list[str], command: list[str]) -> tuple[bool, str]:
    """Run ``command`` in the sandbox ``sandbox`` sets up, under the seccomp filter."""
    fd = seccomp.open_program()
    try:
        return _try([*sandbox, "--seccomp", str(fd), "--", *command], (fd,))
    finally:
        os.close(fd)


def _try(argv: list[str], pass_fds: tuple[int, ...] = ()) -> tuple[bool, str]:
    """Run ``argv``; whether it succeeded, else the first line of why not."""
    try:
        done = subprocess.run(
            argv,
            pass_fds=pass_fds,
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
