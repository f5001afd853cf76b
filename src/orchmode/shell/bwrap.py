"""Probing bubblewrap once per process: is it installed, which flags work, how limits hold.

The probe runs a real, empty sandbox, which costs milliseconds, so it is cached; a
missing binary or a kernel that refuses namespaces becomes one line saying what to do.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .cgroups import _cgroups
from .policy import _MIB

__all__ = ["Probe", "probe"]

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
