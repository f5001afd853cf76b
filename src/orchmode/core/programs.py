"""The programs orchmode runs for its own work (git, unshare, mount, bash), by absolute path.

An empty or relative entry in ``PATH`` (``PATH=:/usr/bin``, left by ``PATH=$UNSET:$PATH``,
or ``.``) names the current directory, and orchmode's is usually the repository: looked up
that way, a repository that ships an executable named ``git``, ``unshare`` or ``mount``
would run in its place, on the host, before any sandbox. So orchmode finds its programs on
the absolute directories of ``PATH`` alone, once per process. The agents' own commands
still use ``PATH`` as it is, inside their sandbox.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

#: Where a system's own programs are: shown in every sandbox (a home directory is not).
SYSTEM_DIRS = ("/usr/local/bin", "/usr/bin", "/bin")


def _first_in(directories: list[str] | tuple[str, ...], name: str) -> str | None:
    """The first executable file called ``name`` in ``directories``."""
    for directory in directories:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def absolute_path_dirs(path: str | None) -> list[str]:
    """``path``'s directories that are absolute, in order: an empty or relative one names
    whatever directory the program happens to run in."""
    return [d for d in (path or "").split(os.pathsep) if os.path.isabs(d)]


def find(name: str, path: str | None = None) -> str | None:
    """``name``'s absolute path, on the absolute directories of ``path`` (default: this
    process's ``PATH``) or else in the system's own; None where there is none."""
    path = os.environ.get("PATH") if path is None else path
    return _first_in([*absolute_path_dirs(path), *SYSTEM_DIRS], name)


def resolved(name: str, path: str | None = None) -> str:
    """What :func:`find` finds; ``/usr/bin/<name>`` when there is none, so that running it
    fails with that path named rather than finding a file of that name in the current
    directory."""
    return find(name, path) or os.path.join("/usr/bin", name)


@functools.cache
def program(name: str) -> str:
    """:func:`resolved` on this process's ``PATH``, once per process."""
    return resolved(name)


@functools.cache
def system_program(name: str) -> str:
    """``name`` where every sandbox shows it: in the system's own directories, else on a
    ``PATH`` directory outside the home (which a sandbox hides), else where the one
    :func:`program` finds really is (a home's ``~/.nix-profile/bin/bash`` is a link into
    ``/nix/store``)."""
    home = os.path.realpath(os.path.expanduser("~"))
    outside_home = [
        d
        for d in absolute_path_dirs(os.environ.get("PATH"))
        if home == "/" or os.path.commonpath([os.path.realpath(d), home]) != home
    ]
    found = _first_in([*SYSTEM_DIRS, *outside_home], name)
    if found is not None:
        return found
    found = find(name)
    return os.path.realpath(found) if found is not None else program(name)


@contextlib.contextmanager
def absolute_path_only() -> Iterator[None]:
    """``PATH`` without its empty and relative entries while the block runs: for a library
    that looks programs up itself (ctypes' ``find_library``, where the ldconfig cache does
    not know a library, runs ``gcc``, ``objdump`` and ``ld`` by name)."""
    before = os.environ.get("PATH")
    os.environ["PATH"] = os.pathsep.join(absolute_path_dirs(before)) or os.pathsep.join(SYSTEM_DIRS)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before
