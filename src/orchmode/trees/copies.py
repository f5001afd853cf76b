"""Workspaces' copies: directories of one commit for agents, and the change each one holds.

An overlay workspace (:mod:`.workspaces`) is layered on a checkout; where overlays cannot be
made, an agent gets a full copy, made here. Either way the directory is removed off the
critical path when its agent ends (:meth:`Copies.throw_away`), and a copy's change is read
with orchmode's own index of it, never the agent's ``.git``: a config the agent wrote there
(a ``core.fsmonitor`` or a filter command) would otherwise run outside the sandbox.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..core.results import Change
from ..core.secrets import Secrets
from .git import _Work, copy_index, git, on_thread
from .limits import DiskLimits, left_out_of
from .lowers import stub
from .runs import remove_tree, remove_workspace
from .snapshot import parse_status
from .store import TreeStore


@dataclass(frozen=True)
class Copy:
    """One agent's copy of the tree, and where orchmode keeps its own index of it."""

    path: Path
    #: The commit the copy was made from: a worker's change is its difference from this.
    start: str
    index: Path


class Copies:
    """The directories of this run's workspaces: planned, filled, read, thrown away."""

    def __init__(self, store: TreeStore, secrets: Secrets | None = None) -> None:
        self.store = store
        #: The secret files whose notes a copy shows in their place.
        self.secrets = secrets
        self._deleter: ThreadPoolExecutor | None = None
        #: The stand-ins made in each copy for secret files' notes.
        self._stand_ins: dict[Path, tuple[str, ...]] = {}

    def close(self) -> None:
        """Wait for the directories being thrown away."""
        if self._deleter is not None:
            self._deleter.shutdown(wait=True)
            self._deleter = None

    def plan_directory(self, stem: str) -> Path:
        """Where an agent's workspace will be (known before it exists)."""
        return self.store.run / self.store.name(_safe(stem))

    def throw_away(self, path: Path, *, layers: bool = False) -> None:
        """Remove a workspace's directory off the critical path (see :meth:`discard`);
        ``layers`` for an overlay's, which is mostly empty directories."""
        trash = self.store.run / f".trash-{path.name}"
        try:
            os.rename(path, trash)
        except OSError:
            trash = path
        if self._deleter is None:
            self._deleter = ThreadPoolExecutor(1, thread_name_prefix="orchmode-trash")
        self._deleter.submit(remove_workspace if layers else remove_tree, trash)

    def plan_copy(self, stem: str, commit: str) -> Copy:
        """Where a new copy of ``commit`` will be (known before it exists, for its sandbox)."""
        name = self.store.name(_safe(stem))
        return Copy(self.store.run / name, commit, self.store.run / f"{name}.index")

    async def make_copy(self, copy: Copy, patch: str = "", ignored: Sequence[str] = ()) -> None:
        """Fill ``copy`` with its commit and ``patch`` on top (staged, not committed, so that
        ``git status`` and ``git diff HEAD`` in the copy show it), and give it a ``.git`` of
        the agent's own.

        ``ignored`` entries are not copied: their mount points are made instead, so that a
        read-only copy can still show them from the working directory.
        """
        await self.store.open()
        path = copy.path
        path.mkdir(parents=True)
        env = {**self.store.env(copy.index), "GIT_WORK_TREE": str(path)}
        await git("read-tree", "--reset", "-u", copy.start, env=env, cwd=path)
        # A dozen small file operations: kept on the loop, where they cost a fraction of
        # what handing them to a thread costs on a busy machine (the GIL changing hands).
        self._agent_git_dir(path, copy.start, copy.index)
        if patch.strip():
            agents = {**self.store.env(path / ".git" / "index"), "GIT_WORK_TREE": str(path)}
            await git(
                "apply",
                "--binary",
                "--index",
                "-",
                env=agents,
                cwd=path,
                data=patch.encode(),
            )
        self._mount_points(path, ignored)

    def _mount_points(self, path: Path, ignored: Sequence[str]) -> None:
        """Empty stand-ins in the copy where the sandbox shows ``.orchmode/`` and the
        ignored entries of the working directory (a node has no ignored files to show)."""
        workdir = self.store.workdir
        shown = [n for n in ignored if os.path.lexists(workdir / n.rstrip("/"))]
        fresh = [n for n in shown if not os.path.lexists(path / n.rstrip("/"))]
        stub(path, frozenset((".orchmode/", *shown)))
        secret = self.secrets.files if self.secrets is not None else None
        if secret:  # the places made for secret files' notes are not the agent's writes
            self._stand_ins[path] = tuple(n for n in fresh if secret.matches(n))

    def _agent_git_dir(self, path: Path, commit: str, index: Path) -> None:
        """The copy's own ``.git``: HEAD detached at the snapshot, objects borrowed from the
        store. It is the agent's to use as it likes; orchmode never runs git with it."""
        dot_git = path / ".git"
        (dot_git / "objects" / "info").mkdir(parents=True)
        (dot_git / "refs" / "heads").mkdir(parents=True)
        (dot_git / "info").mkdir()
        (dot_git / "HEAD").write_text(f"{commit}\n")
        (dot_git / "config").write_text(
            "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"
        )
        (dot_git / "objects" / "info" / "alternates").write_text(f"{self.store.objects}\n")
        shutil.copyfile(self.store.git_dir / "info" / "exclude", dot_git / "info" / "exclude")
        copy_index(index, dot_git / "index")

    async def change_of(self, copy: Copy, limits: DiskLimits | None = None) -> Change:
        """The copy's difference from where it started: every addition, deletion, rename,
        mode change and binary file, as one patch; a file too big for it (see
        :func:`.limits.left_out_of`) is left out, and named."""
        return await on_thread(lambda work: self._read_change(work, copy, limits))

    def _read_change(self, work: _Work, copy: Copy, limits: DiskLimits | None) -> Change:
        env = {**self.store.env(copy.index), "GIT_WORK_TREE": str(copy.path)}
        # the places made for secret files' notes are not the agent's writes
        stand_ins = self._stand_ins.get(copy.path, ())
        too_big = _too_big(work, copy, env, stand_ins, limits) if limits else {}
        withheld = [f":(exclude,literal){n}" for n in (*stand_ins, *too_big)]
        work.git("add", "-A", "--", ".", *withheld, env=env, cwd=copy.path)
        # Pinned so that no setting of the user's changes the patch's form.
        _, out = work.git(
            "-c", "core.quotePath=true", "-c", "diff.noprefix=false",
            "-c", "diff.mnemonicPrefix=false", "diff", "--cached", "--binary", "--full-index",
            "-M", "--no-color", "--no-ext-diff", "--no-textconv", "--src-prefix=a/",
            "--dst-prefix=b/", copy.start, env=env, cwd=copy.path,
        )  # fmt: skip
        return Change(copy.start, out.decode(errors="surrogateescape"), tuple(too_big.values()))

    def remove(self, copy: Copy) -> None:
        remove_tree(copy.path)
        with contextlib.suppress(OSError):
            copy.index.unlink()

    def discard(self, copy: Copy) -> None:
        """Remove a copy off the critical path: moved aside at once, deleted by a thread of
        its own (a copy of a large tree takes a while to delete); :meth:`close` waits."""
        with contextlib.suppress(OSError):
            copy.index.unlink()
        self.throw_away(copy.path)


def _too_big(
    work: _Work,
    copy: Copy,
    env: dict[str, str],
    stand_ins: Sequence[str],
    limits: DiskLimits,
) -> dict[str, str]:
    """The files the agent changed or made in ``copy`` that are too big for its change,
    measured before git hashes any of them (``git status`` compares sizes first, and
    reads no file whose size changed)."""
    _, out = work.git(
        "status", "--porcelain=v2", "-z", "--no-renames", "--untracked-files=all",
        "--ignore-submodules=all", "--", ".", env=env, cwd=copy.path,
    )  # fmt: skip
    changed, untracked, _ = parse_status(out)
    skipped = set(stand_ins)
    sizes: dict[str, int] = {}
    for name in (*changed, *untracked):
        if name in skipped:
            continue
        with contextlib.suppress(OSError):
            info = os.lstat(copy.path / name)
            if not stat.S_ISDIR(info.st_mode):
                sizes[name] = info.st_size
    return left_out_of(sizes, limits)


def _safe(stem: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in stem)[:40] or "agent"
