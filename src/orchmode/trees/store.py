"""The private object store of one working directory: set up, named, and read.

Every git command orchmode runs on the user's tree goes through ``.orchmode/trees/store.git``
(or a Ray node's own home): the user's repository is only read, its objects borrowed through
``alternates``. This module makes the store, says which git variables reach it, and answers
what it holds: commits and trees, patches between them, bundles for another machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .git import TreeError, _Work, git, on_thread
from .layers import PATCH_FLAGS, PATCH_FORM
from .links import NO_CTIME
from .lowers import KeptCheckout, Lowers
from .runs import held_lock, run_name, sweep_dead_runs, write_file

TREES_DIR = Path(".orchmode") / "trees"


@dataclass(frozen=True)
class UserRepo:
    """The user's repository, as far as a snapshot needs it."""

    git_dir: Path
    objects: Path
    toplevel: Path
    #: The working directory's path inside the repository, ``""`` or ``"sub/dir/"``.
    prefix: str


class TreeStore:
    """Where one working directory's objects, runs and checkouts live, and the git
    variables that reach them."""

    def __init__(self, workdir: Path, home: Path | None = None) -> None:
        self.workdir = Path(os.path.realpath(workdir))
        #: Where the store and the copies live: the working directory's ``.orchmode/trees``,
        #: or a directory of its own (a Ray node's, outside the directory Ray manages).
        self.home = self.workdir / TREES_DIR if home is None else Path(os.path.realpath(home))
        self.private = home is not None
        self.git_dir = self.home / "store.git"
        #: A stable path to the user's objects, the same in a sandbox as outside it.
        self.alias = self.home / "base-objects"
        self.runs = self.home / "runs"
        self.run = self.runs / run_name()
        self.repo: UserRepo | None = None
        self._opened = False
        self._lock = asyncio.Lock()
        self._serial = 0
        #: Trees of commits made or read here, and commits made of (tree, parent).
        self._trees: dict[str, str] = {}
        self._commits: dict[tuple[str, str], str] = {}
        #: The checkouts overlays are layered on, and the layers made over them.
        kept = None if self.private else KeptCheckout(self.home)
        self.lowers = Lowers(self.run, self.home / "plain.git", self.git_dir, self.name, kept)

    async def open(self) -> None:
        """Make the store (once), sweep what dead processes left, make this run's dir."""
        async with self._lock:
            if self._opened:
                return
            self.home.mkdir(parents=True, exist_ok=True)
            if not self.private:
                ignore_state(self.workdir / ".orchmode")
            sweep_dead_runs(self.runs)
            self.repo = await self._find_repo()
            await on_thread(self._set_up)
            self.run.mkdir(parents=True, exist_ok=True)
            self._opened = True

    @property
    def objects(self) -> Path:
        return self.git_dir / "objects"

    @property
    def user_objects(self) -> Path | None:
        """The real directory of the user's objects (outside or inside the working dir)."""
        return self.repo.objects if self.repo is not None else None

    def name(self, stem: str) -> str:
        """A name for a scratch file or directory of this run, never given twice."""
        self._serial += 1
        return f"{stem}-{self._serial}"

    def scratch_index(self, stem: str) -> Path:
        """A fresh index file's path in this run's directory."""
        return self.run / f"{self.name(stem)}.index"

    def env(self, index: Path | None = None) -> dict[str, str]:
        """Git variables that work on the private store alone (with ``index``, if given)."""
        env = {"GIT_DIR": str(self.git_dir)}
        if index is not None:
            env["GIT_INDEX_FILE"] = str(index)
        return env

    def workdir_env(self, index: Path) -> dict[str, str]:
        """Git variables that read the working directory as the user's git sees it, with a
        private index and every new object going to the private store."""
        repo = self.repo
        env = {
            "GIT_INDEX_FILE": str(index),
            "GIT_OBJECT_DIRECTORY": str(self.objects),
            # the checkout's links change the files' ctimes: modification times still count
            **NO_CTIME,
        }
        if repo is None:
            env.update(GIT_DIR=str(self.git_dir), GIT_WORK_TREE=str(self.workdir))
        else:
            env.update(
                GIT_DIR=str(repo.git_dir),
                GIT_WORK_TREE=str(repo.toplevel),
                GIT_ALTERNATE_OBJECT_DIRECTORIES=str(repo.objects),
            )
        return env

    async def git(
        self,
        *args: str,
        index: Path | None = None,
        data: bytes | None = None,
        ok: Sequence[int] = (0,),
    ) -> tuple[int, bytes]:
        """Run git on the store, from its home."""
        return await git(*args, env=self.env(index), cwd=self.home, data=data, ok=ok)

    # ------------------------------------------------------------------------- set-up

    async def _find_repo(self) -> UserRepo | None:
        code, out = await git(
            "rev-parse",
            "--absolute-git-dir",
            "--git-common-dir",
            "--show-toplevel",
            "--show-prefix",
            env={},
            cwd=self.workdir,
            ok=(0, 128),
        )
        lines = out.decode(errors="surrogateescape").splitlines()
        if code != 0 or len(lines) < 3:
            return None
        git_dir = Path(lines[0])
        common = Path(lines[1])
        if not common.is_absolute():
            common = self.workdir / common
        prefix = lines[3] if len(lines) > 3 else ""
        objects = Path(os.path.realpath(common / "objects"))
        return UserRepo(git_dir, objects, Path(lines[2]), prefix)

    def _set_up(self, work: _Work) -> None:
        """Make the store and its links, one session at a time: two started together in one
        directory would otherwise both ``git init`` it, and the loser fails."""
        with held_lock(self.home / "store.lock"):
            if not (self.git_dir / "HEAD").is_file():
                work.git(
                    "init", "-q", "--bare", "--template=", str(self.git_dir), env={},
                    cwd=self.home,
                )  # fmt: skip
            self._link_user_objects()
            self.lowers.prepare_plain(self._write_excludes())

    def _link_user_objects(self) -> None:
        """The store borrows the user's objects through a link whose path a sandbox can
        show too (the real one may be hidden under the copy that covers the working dir)."""
        alternates = self.objects / "info" / "alternates"
        alternates.parent.mkdir(parents=True, exist_ok=True)
        if self.repo is None:
            write_file(alternates, "")
            return
        target = str(self.repo.objects)
        if not (self.alias.is_symlink() and os.readlink(self.alias) == target):
            with contextlib.suppress(FileNotFoundError):
                self.alias.unlink()
            temporary = self.home / f".link-{uuid.uuid4().hex[:8]}"
            temporary.symlink_to(target)
            os.replace(temporary, self.alias)
        write_file(alternates, f"{self.alias}\n")

    def _write_excludes(self) -> str:
        """The user's own excludes, so copies and patches ignore what the user ignores."""
        lines = ["/.orchmode/"]
        if self.repo is not None:
            with contextlib.suppress(OSError):
                lines.append((self.repo.git_dir / "info" / "exclude").read_text())
        info = self.git_dir / "info"
        info.mkdir(exist_ok=True)
        text = "\n".join(lines) + "\n"
        write_file(info / "exclude", text)
        return text

    # ------------------------------------------------------------------ what it holds

    def remember(self, commit: str, tree: str) -> None:
        """``commit``'s tree, known without asking git."""
        self._trees[commit] = tree

    async def tree_of(self, commit: str) -> str:
        tree = self._trees.get(commit)
        if tree is None:
            _, out = await self.git("rev-parse", f"{commit}^{{tree}}")
            tree = self._trees[commit] = out.decode().strip()
        return tree

    async def has(self, commit: str) -> bool:
        await self.open()
        if commit in self._trees:
            return True  # made or read here: the store keeps every object it is given
        code, _ = await self.git("cat-file", "-e", f"{commit}^{{commit}}", ok=(0, 1, 128))
        return code == 0

    async def commit(self, tree: str, parent: str) -> str:
        """The commit of ``tree`` with ``parent``: the same one for the same two, anywhere."""
        commit = self._commits.get((tree, parent))
        if commit is None:
            _, out = await self.git("commit-tree", tree, "-p", parent, "-m", "orchmode merge")
            commit = out.decode().strip()
            self._commits[tree, parent] = commit
            self._trees[commit] = tree
        return commit

    async def blob(self, tree: str, name: str) -> bytes | None:
        code, out = await self.git("cat-file", "blob", f"{tree}:{name}", ok=(0, 128))
        return out if code == 0 else None

    async def applied(self, tree: str, patch: str, index: Path) -> str | None:
        """The tree ``patch`` makes of ``tree``, or None when it does not apply to it."""
        await self.git("read-tree", tree, index=index)
        code, _ = await self.git(
            "apply", "--cached", "--binary", "-", index=index,
            data=patch.encode(errors="surrogateescape"), ok=(0, 1),
        )  # fmt: skip
        if code != 0:
            return None
        _, out = await self.git("write-tree", index=index)
        return out.decode().strip()

    async def tree_with(self, tree: str, patch: str) -> str | None:
        """The tree ``patch`` makes of ``tree``, or None when it does not apply to it."""
        if not patch.strip():
            return tree
        index = self.scratch_index("with")
        try:
            return await self.applied(tree, patch, index)
        finally:
            with contextlib.suppress(OSError):
                index.unlink()

    async def diff(self, before: str, after: str) -> str:
        """The patch from ``before`` to ``after`` (commits or trees), in the pinned form."""
        _, out = await on_thread(
            lambda work: work.git(
                *PATCH_FORM, "diff-tree", "-p", *PATCH_FLAGS, before, after,
                env=self.env(), cwd=self.home,
            )
        )  # fmt: skip
        return out.decode(errors="surrogateescape")

    # ------------------------------------------------------------------------ bundles

    async def bundle(self, commit: str) -> bytes:
        """The snapshot and every object it needs, for a node that has none of them."""
        ref = f"refs/orchmode/{commit}"
        await self.git("update-ref", ref, commit)
        path = self.run / f"{self.name('bundle')}.bundle"
        try:
            await self.git("bundle", "create", "-q", str(path), ref)
            return path.read_bytes()
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
            await self.git("update-ref", "-d", ref)

    async def receive(self, commit: str, data: bytes) -> None:
        """Take a snapshot sent as a :meth:`bundle` into this store."""
        await self.open()
        if await self.has(commit):
            return
        path = self.run / f"{self.name('bundle')}.bundle"
        path.write_bytes(data)
        try:
            await self.git("fetch", "-q", str(path), f"refs/orchmode/{commit}")
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
        if not await self.has(commit):
            raise TreeError(f"the snapshot {commit[:12]} did not arrive whole")


def ignore_state(state: Path) -> None:
    """A ``.gitignore`` of ``*`` in orchmode's state dir: git (the user's, and every
    snapshot's) never sees the journal, the results or the copies."""
    marker = state / ".gitignore"
    if not marker.exists():
        with contextlib.suppress(OSError):
            marker.write_text("*\n")
