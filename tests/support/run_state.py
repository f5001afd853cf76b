"""What a run leaves in a directory, read from outside: every file's kind, mode and bytes,
the repository's own state, and the workspaces, temporary files and processes left over."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

Entry = tuple[str, int, str]  # kind, permission bits, sha256 of the bytes (or link target)


def tree_state(root: Path, skip: Sequence[str] = (".orchmode", ".git")) -> dict[str, Entry]:
    """Every path under ``root`` (directories too) but ``skip``: its kind, mode, content."""
    found: dict[str, Entry] = {}
    for top, dirs, files in os.walk(root):
        rel = os.path.relpath(top, root)
        if rel == ".":
            dirs[:] = [d for d in dirs if d not in skip]
        for name in (*dirs, *files):  # a link to a directory is among dirs, not followed
            path = os.path.join(top, name)
            info = os.lstat(path)
            key = os.path.relpath(path, root)
            if stat.S_ISLNK(info.st_mode):
                found[key] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                found[key] = ("dir", stat.S_IMODE(info.st_mode), "")
            else:
                with open(path, "rb") as handle:
                    digest = hashlib.sha256(handle.read()).hexdigest()
                found[key] = ("file", stat.S_IMODE(info.st_mode), digest)
    return found


def differences(expected: Mapping[str, Entry], actual: Mapping[str, Entry]) -> list[str]:
    """How ``actual`` differs from ``expected``, one line a path (the first 20)."""
    lines = []
    for path in sorted(set(expected) | set(actual)):
        want, have = expected.get(path), actual.get(path)
        if want == have:
            continue
        if want is None:
            lines.append(f"{path}: there, but not in the uninterrupted run's")
        elif have is None:
            lines.append(f"{path}: missing")
        elif want[0] != have[0]:
            lines.append(f"{path}: a {have[0]}, not a {want[0]}")
        elif want[1] != have[1]:
            lines.append(f"{path}: mode {have[1]:o}, not {want[1]:o}")
        else:
            lines.append(f"{path}: other bytes")
    return lines[:20] + ([f"… and {len(lines) - 20} more"] if len(lines) > 20 else [])


def git_out(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=True
    ).stdout


def repo_state(root: Path) -> dict[str, str]:
    """Everything of the user's repository that orchmode must never change (its own path
    written as ``<workdir>``, so that copies of one repository compare)."""
    dot = root / ".git"
    state = {
        "head": git_out(root, "rev-parse", "HEAD"),
        "symbolic": git_out(root, "symbolic-ref", "HEAD"),
        "branches": git_out(root, "branch", "--list", "-a"),
        "refs": git_out(root, "for-each-ref"),
        "stash": git_out(root, "stash", "list"),
        "worktrees": git_out(root, "worktree", "list", "--porcelain"),
        "index": hashlib.sha256((dot / "index").read_bytes()).hexdigest(),
        "config": (dot / "config").read_text(),
        "staged": git_out(root, "diff", "--cached", "--name-status"),
    }
    return {k: v.replace(str(root), "<workdir>") for k, v in state.items()}


#: What orchmode keeps in ``.orchmode/trees`` between sessions: the store, the checkout
#: and the locks sessions share (``flock``: the files stay, no lock is held).
KEPT_IN_TREES = frozenset(
    {
        "store.git",
        "plain.git",
        "checkout",
        "checkout.commit",
        "checkout.lock",
        "store.lock",
        "merge.lock",
        "base-objects",
        "runs",
    }
)
#: Names of temporary files, anywhere under ``.orchmode`` (outside git's own object store).
_TEMPORARY = re.compile(r"^(\.tmp-.*|.*\.tmp|.*\.lock|\.trash-.*|\.link-.*|.*\.index)$")


def left_behind(workdir: Path) -> list[str]:
    """Workspaces, layers, copies and temporary files a finished session should not leave."""
    state = workdir / ".orchmode"
    trees = state / "trees"
    found = []
    if trees.exists():
        found += [f"trees/{p.name}" for p in trees.iterdir() if p.name not in KEPT_IN_TREES]
        runs = trees / "runs"
        if runs.exists():
            found += [f"trees/runs/{p.name}" for p in runs.iterdir()]
    for top, dirs, files in os.walk(state):
        rel = os.path.relpath(top, state)
        if rel.startswith(("trees/checkout", "trees/store.git/objects", "trees/plain.git")):
            dirs[:] = []
            continue
        for name in [*files, *dirs]:
            where = os.path.join(rel, name) if rel != "." else name
            if where in ("trees/checkout.lock", "trees/store.lock", "trees/merge.lock"):
                continue
            if _TEMPORARY.match(name):
                found.append(where)
    return sorted(set(found))


def processes_in(workdir: Path) -> list[str]:
    """The processes whose working directory or command line is in ``workdir``."""
    where = os.path.realpath(workdir)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cwd = os.readlink(entry / "cwd")
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if cwd == where or cwd.startswith(where + "/") or where in argv:
                found.append(f"{entry.name}: {argv.strip()[:120]} (in {cwd})")
    return found
