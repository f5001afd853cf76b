"""``Trees``: the working tree snapshotted, shown to each agent, and its changes merged back.

With ``isolation = "worktree"`` every agent of a Workflow call works in a workspace of the
working directory as it was when the call started (:mod:`.workspaces`: an overlay on one
checkout, or a full copy made here), and its change comes back as a patch. All of it is
git plumbing on a **private** object store, ``.orchmode/trees/store.git``:

- the user's repository is only read. A snapshot hashes the working tree with a private
  index (a copy of the user's, for its stat cache) and writes its objects into the private
  store, which borrows the user's objects through ``alternates``; no index, HEAD, branch,
  stash, config or worktree list of the user's is touched. A directory that is not a
  repository gets the same from the private store alone.
- every git command orchmode runs on a workspace uses the private store as its git dir,
  never the workspace's own ``.git``: that one is the agent's, and a config it wrote there
  (a ``core.fsmonitor`` or a filter command) would otherwise run outside the sandbox.
- workspaces live in ``.orchmode/trees/runs/<host>-<pid>-<id>/``; each is removed when its
  agent ends, the run's directory when the session closes, and one whose process died
  (``kill -9``) by the next start in this directory.
- a patch is merged with a three-way merge against its snapshot (``git merge-tree``), then
  written into the working directory all at once or not at all; one that conflicts can be
  merged anyway, markers and all (:meth:`Trees.conflict_of`), for a resolver to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import stat
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..core.results import Change
from ..core.secrets import Secrets
from ..core.wording import listed
from .git import TreeError, _Work, git, on_thread
from .layers import PATCH_FLAGS, PATCH_FORM, read_layer
from .limits import DiskLimits, left_out_of
from .patches import FileChange, PatchSummary, refusals, summary_of
from .runs import (
    held_lock,
    remove_tree,
    remove_workspace,
    run_name,
    sweep_dead_runs,
    write_file,
)
from .snapshots import KeptCheckout, Lowers, Stack, stub

log = logging.getLogger("orchmode")

TREES_DIR = Path(".orchmode") / "trees"
#: Ignored entries shown read-only in a copy at most; past this the rest are left out.
MAX_SHOWN = 200
#: Megabytes of untracked, unignored files a snapshot takes at most: each copy holds them
#: all, so a forgotten data directory would be copied once per agent.
MAX_UNTRACKED_MB = 200

Fate = Literal["merged", "conflict", "refused", "no change"]
#: Times a snapshot reads the tree before it gives up on files that change as it reads them,
#: pausing 10 ms, then twice as long each time (1.3 s in all): a database written without
#: pause (its log cut short at each checkpoint) spoils a read a quarter of the time on a
#: busy machine.
SNAPSHOT_ATTEMPTS = 8
SNAPSHOT_PAUSE = 0.01


class TooMuchUntracked(TreeError):
    """The snapshot would hold more untracked files than a workspace may (not retried)."""


def _remove_index(index: Path) -> None:
    for path in (index, index.with_name(index.name + ".lock")):
        with contextlib.suppress(OSError):
            path.unlink()


@dataclass(frozen=True)
class Snapshot:
    """The working directory at one moment, as a commit in the private store."""

    commit: str
    #: Ignored entries (relative paths, a directory's with a trailing ``/``): not copied,
    #: shown read-only from the working directory instead.
    ignored: tuple[str, ...] = ()


@dataclass(frozen=True)
class Copy:
    """One agent's copy of the tree, and where orchmode keeps its own index of it."""

    path: Path
    #: The commit the copy was made from: a worker's change is its difference from this.
    start: str
    index: Path


@dataclass(frozen=True)
class Merge:
    """What became of one patch."""

    fate: Fate
    #: For a conflict, the files in conflict; for a refusal, the reasons.
    detail: tuple[str, ...] = ()
    #: The tree it made (of the working directory and the changes before it), if merged.
    tree: str = ""


@dataclass(frozen=True)
class Conflict:
    """A change that conflicts with the tree as merged so far, merged into it anyway, with
    git's conflict markers where the two disagree: what a resolver starts from."""

    #: The tree as merged so far (the working directory now), as a child of the change's base.
    ours: str
    #: That tree with the change merged in, markers and all, and its commit (a child of the
    #: change's base, so that the same conflict is the same commit everywhere).
    tree: str
    commit: str
    #: From the change's base to ``tree``: what the resolver's workspace shows over the
    #: call's snapshot.
    patch: str
    files: tuple[str, ...]
    #: git's own lines: ``CONFLICT (content): Merge conflict in a.py``, ….
    messages: tuple[str, ...]
    #: Every conflicted hunk, its marker lines and a few lines around it, file by file.
    hunks: str
    #: The marker labels: the tree as merged so far, and the change.
    labels: tuple[str, str]


#: Lines of context shown around a conflicted hunk.
HUNK_CONTEXT = 3
#: A conflicted file's text shown at most (a bigger one is cut, and says so).
MAX_HUNKS_CHARS = 40_000


@dataclass(frozen=True)
class _Repo:
    """The user's repository, as far as a snapshot needs it."""

    git_dir: Path
    objects: Path
    toplevel: Path
    #: The working directory's path inside the repository, ``""`` or ``"sub/dir/"``.
    prefix: str


class Trees:
    """The private store of one working directory, and this process's copies of it."""

    def __init__(
        self, workdir: Path, home: Path | None = None, secrets: Secrets | None = None
    ) -> None:
        self.workdir = Path(os.path.realpath(workdir))
        #: The secret files a snapshot leaves out and a change may not write.
        self.secrets = secrets
        #: Where the store and the copies live: the working directory's ``.orchmode/trees``,
        #: or a directory of its own (a Ray node's, outside the directory Ray manages).
        self.home = self.workdir / TREES_DIR if home is None else Path(os.path.realpath(home))
        self._private = home is not None
        self.store = self.home / "store.git"
        #: A stable path to the user's objects, the same in a sandbox as outside it.
        self.alias = self.home / "base-objects"
        self.runs = self.home / "runs"
        self.run = self.runs / run_name()
        self._repo: _Repo | None = None
        self._opened = False
        self._lock = asyncio.Lock()
        self._serial = 0
        #: The tree each change makes of its snapshot, worked out ahead (see :meth:`prepare`).
        self._theirs: dict[tuple[str, str], asyncio.Task[str | None]] = {}
        self._deleter: ThreadPoolExecutor | None = None
        self._looker: ThreadPoolExecutor | None = None
        #: The checkouts overlays are layered on, and the layers made over them.
        kept = None if self._private else KeptCheckout(self.home)
        self.lowers = Lowers(self.run, self.home / "plain.git", self.store, self._name, kept)
        self._trees: dict[str, str] = {}
        self._patch_layers: dict[tuple[tuple[Path, ...], str, str], Path] = {}
        self._derived: dict[Path, tuple[str, str]] = {}
        #: The tree the working directory is taken to hold, until a merge finds otherwise:
        #: the last snapshot's, then each merge's (see :meth:`merge_all`).
        self._presumed: str | None = None
        self._commits: dict[tuple[str, str], str] = {}
        #: The stand-ins made in each copy for secret files' notes.
        self._stand_ins: dict[Path, tuple[str, ...]] = {}

    # ----------------------------------------------------------------- set-up, clean-up

    async def open(self) -> None:
        """Make the store (once), sweep what dead processes left, make this run's dir."""
        async with self._lock:
            if self._opened:
                return
            self.home.mkdir(parents=True, exist_ok=True)
            if not self._private:
                ignore_state(self.workdir / ".orchmode")
            sweep_dead_runs(self.runs)
            self._repo = await self._find_repo()
            await on_thread(self._set_up_store)
            self.run.mkdir(parents=True, exist_ok=True)
            self._opened = True

    def sweep(self) -> list[Path]:
        """Remove the copies of processes on this host that died; which run dirs went."""
        return sweep_dead_runs(self.runs)

    def close(self) -> None:
        """Remove this run's copies; the store stays (resumed merges need its snapshots),
        unless it is a private one."""
        if self._deleter is not None:
            self._deleter.shutdown(wait=True)
            self._deleter = None
        if self._looker is not None:
            self._looker.shutdown(wait=True)
            self._looker = None
        for task in self._theirs.values():
            task.cancel()
        self._theirs.clear()
        self.lowers.close()
        self._patch_layers.clear()
        self._derived.clear()
        remove_tree(self.home if self._private else self.run)

    @property
    def store_objects(self) -> Path:
        return self.store / "objects"

    @property
    def user_objects(self) -> Path | None:
        """The real directory of the user's objects (outside or inside the working dir)."""
        return self._repo.objects if self._repo is not None else None

    async def _find_repo(self) -> _Repo | None:
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
        return _Repo(git_dir, objects, Path(lines[2]), prefix)

    def _set_up_store(self, work: _Work) -> None:
        """Make the store and its links, one session at a time: two started together in one
        directory would otherwise both ``git init`` it, and the loser fails."""
        with held_lock(self.home / "store.lock"):
            if not (self.store / "HEAD").is_file():
                work.git(
                    "init", "-q", "--bare", "--template=", str(self.store), env={}, cwd=self.home
                )
            self._link_user_objects()
            self.lowers.prepare_plain(self._write_excludes())

    def _link_user_objects(self) -> None:
        """The store borrows the user's objects through a link whose path a sandbox can
        show too (the real one may be hidden under the copy that covers the working dir)."""
        alternates = self.store_objects / "info" / "alternates"
        alternates.parent.mkdir(parents=True, exist_ok=True)
        if self._repo is None:
            write_file(alternates, "")
            return
        target = str(self._repo.objects)
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
        if self._repo is not None:
            with contextlib.suppress(OSError):
                lines.append((self._repo.git_dir / "info" / "exclude").read_text())
        info = self.store / "info"
        info.mkdir(exist_ok=True)
        text = "\n".join(lines) + "\n"
        write_file(info / "exclude", text)
        return text

    def _name(self, stem: str) -> str:
        self._serial += 1
        return f"{stem}-{self._serial}"

    # -------------------------------------------------------------------------- snapshot

    async def snapshot(self) -> Snapshot:
        """The working directory now: tracked, untracked-but-not-ignored, uncommitted.

        One walk of the tree (``git status``, with the user's index for its stat cache),
        then only the files it names as changed or new are hashed.
        """
        await self.open()
        index = self.run / f"{self._name('snapshot')}.index"
        try:
            for attempt in range(1, SNAPSHOT_ATTEMPTS + 1):
                _remove_index(index)  # and the lock a git stopped by a signal leaves
                try:
                    tree, ignored = await on_thread(lambda work: self._walk(work, index))
                    break
                except TooMuchUntracked:
                    raise
                except TreeError as exc:
                    # A file that changed while git read it (a log, a database being
                    # written): the tree is read again.
                    if attempt == SNAPSHOT_ATTEMPTS:
                        raise
                    log.info("reading the working directory again: %s", exc)
                    await asyncio.sleep(SNAPSHOT_PAUSE * 2 ** (attempt - 1))
            _, out = await git(
                "commit-tree", tree, "-m", "orchmode snapshot", env=self._store_env(), cwd=self.home
            )
            commit = out.decode().strip()
        finally:
            _remove_index(index)
        self._trees[commit] = tree
        self._presumed = tree
        return Snapshot(commit, ignored)

    def _walk(self, work: _Work, index: Path) -> tuple[str, tuple[str, ...]]:
        """The working directory's tree, and its ignored entries."""
        repo = self._repo
        env = self._workdir_env(index)
        top = repo.toplevel if repo is not None else self.workdir
        status = (
            "status", "--porcelain=v2", "-z", "--no-renames", "--untracked-files=all",
            "--ignored=matching", "--ignore-submodules=all", "--", ".",
        )  # fmt: skip
        if repo is not None and (repo.git_dir / "index").is_file():
            with contextlib.suppress(OSError):
                shutil.copyfile(repo.git_dir / "index", index)  # its stat cache saves hashing
        # the secret files are looked for while git reads the tree: two walks at once
        looking = self._looking()
        code, out = work.git(*status, env=env, cwd=self.workdir, ok=(0, 128))
        if code != 0:
            # A copied index git cannot read here (split index, a newer version): start
            # from nothing, and hash every file.
            with contextlib.suppress(OSError):
                index.unlink()
            _, out = work.git(*status, env=env, cwd=self.workdir)
        changed, untracked, ignored = _parse_status(out)
        at = repo.prefix if repo is not None else ""  # git names paths from the top
        withheld = {at + name for name in looking.result()} if looking else set()
        if withheld:
            changed = [p for p in changed if p not in withheld]
            untracked = [p for p in untracked if p not in withheld]
        self._check_untracked(top, untracked)
        paths = [*changed, *untracked]
        if paths:
            listing = b"\0".join(p.encode(errors="surrogateescape") for p in paths) + b"\0"
            work.git(
                "update-index", "--add", "--remove", "-z", "--stdin",
                env=env, cwd=top, data=listing,
            )  # fmt: skip
        if withheld:  # tracked ones too: a snapshot never holds a secret file
            listing = b"\0".join(p.encode(errors="surrogateescape") for p in withheld) + b"\0"
            work.git(
                "update-index", "--force-remove", "-z", "--stdin",
                env=env, cwd=top, data=listing,
            )  # fmt: skip
        prefix = ["--prefix", repo.prefix] if repo is not None and repo.prefix else []
        _, tree = work.git("write-tree", *prefix, env=env, cwd=self.workdir)
        shown = self._shown(ignored, repo.prefix if repo else "")
        return tree.decode().strip(), self._with_withheld(shown)

    def _looking(self) -> Future[tuple[str, ...]] | None:
        """The secret files being looked for again, on a thread of their own."""
        if self.secrets is None:
            return None
        if self._looker is None:
            self._looker = ThreadPoolExecutor(1, thread_name_prefix="orchmode-secrets")
        return self._looker.submit(self.secrets.look)

    def _withheld(self, prefix: str) -> set[str]:
        """The secret files in the working directory now, as paths from the repository's
        top (the form ``git status`` gives); their values are learnt for masking."""
        if self.secrets is None:
            return set()
        return {prefix + name for name in self.secrets.look()}

    def _with_withheld(self, shown: tuple[str, ...]) -> tuple[str, ...]:
        """The entries workspaces show from the working directory, with a place for each
        secret file (where the sandbox shows its note)."""
        if self.secrets is None or not self.secrets.found:
            return shown
        return (*shown, *(n for n in self.secrets.found if n not in shown))

    def _workdir_env(self, index: Path) -> dict[str, str]:
        """Git variables that read the working directory as the user's git sees it, with a
        private index and every new object going to the private store."""
        repo = self._repo
        env = {"GIT_INDEX_FILE": str(index), "GIT_OBJECT_DIRECTORY": str(self.store_objects)}
        if repo is None:
            env.update(GIT_DIR=str(self.store), GIT_WORK_TREE=str(self.workdir))
        else:
            env.update(
                GIT_DIR=str(repo.git_dir),
                GIT_WORK_TREE=str(repo.toplevel),
                GIT_ALTERNATE_OBJECT_DIRECTORIES=str(repo.objects),
            )
        return env

    def _store_env(self, index: Path | None = None) -> dict[str, str]:
        env = {"GIT_DIR": str(self.store)}
        if index is not None:
            env["GIT_INDEX_FILE"] = str(index)
        return env

    def store_env(self) -> dict[str, str]:
        """Git variables that work on the private store alone."""
        return self._store_env()

    async def _tree_of_workdir(self, index: Path) -> str:
        """The working directory's tree as it is now (secret files left out, as a
        snapshot leaves them out)."""
        repo = self._repo
        env = self._workdir_env(index)
        if repo is not None and (repo.git_dir / "index").is_file():
            with contextlib.suppress(OSError):
                shutil.copyfile(repo.git_dir / "index", index)  # its stat cache saves hashing
        prefix = repo.prefix if repo is not None else ""
        withheld = sorted(await asyncio.to_thread(self._withheld, ""))
        # never hashed into the store, tracked or not (an ignored one `add` leaves alone,
        # and would refuse to be named)
        excluded = [f":(exclude,literal){name}" for name in await self._unignored(withheld, env)]
        try:
            await git("add", "-A", "--", ".", *excluded, env=env, cwd=self.workdir)
        except TreeError:
            # A copied index git cannot read here (split index, a newer version): start
            # from nothing, and hash every file.
            with contextlib.suppress(OSError):
                index.unlink()
            await git("add", "-A", "--", ".", *excluded, env=env, cwd=self.workdir)
        if withheld:
            listing = b"\0".join(n.encode(errors="surrogateescape") for n in withheld) + b"\0"
            await git(
                "update-index", "--force-remove", "-z", "--stdin",
                env=env, cwd=self.workdir, data=listing,
            )  # fmt: skip
        write = ["--prefix", prefix] if prefix else []
        _, out = await git("write-tree", *write, env=env, cwd=self.workdir)
        return out.decode().strip()

    async def _unignored(self, paths: list[str], env: dict[str, str]) -> list[str]:
        """Those of ``paths`` (relative to the working directory) git does not ignore."""
        if not paths:
            return []
        listing = b"\0".join(p.encode(errors="surrogateescape") for p in paths) + b"\0"
        code, out = await git(
            "check-ignore", "-z", "--stdin", env=env, cwd=self.workdir, data=listing, ok=(0, 1)
        )
        ignored = {p.decode(errors="surrogateescape") for p in out.split(b"\0") if p}
        return [p for p in paths if p not in ignored] if code == 0 else paths

    def _check_untracked(self, top: Path, untracked: list[str]) -> None:
        """Refuse a snapshot that would copy a heap of files git does not track (in a
        repository the user's own index says what is tracked; outside one, nothing is)."""
        sizes: list[tuple[int, str]] = []
        for name in untracked:
            with contextlib.suppress(OSError):
                sizes.append((os.lstat(top / name).st_size, name))
        total = sum(size for size, _ in sizes)
        if total > MAX_UNTRACKED_MB * 1_000_000:
            largest = ", ".join(f"{n} ({z / 1e6:.0f} MB)" for z, n in sorted(sizes)[-3:][::-1])
            raise TooMuchUntracked(
                f"the working directory has {total / 1e6:.0f} MB of untracked files that are "
                f"not ignored, over the {MAX_UNTRACKED_MB} MB a copy for each agent may hold "
                f'(largest: {largest}) — add them to .gitignore, or use isolation "shared"'
            )

    def _shown(self, ignored: list[str], prefix: str) -> tuple[str, ...]:
        """The ignored entries a workspace shows from the working directory (relative to
        it, directories first), at most :data:`MAX_SHOWN`."""
        shown: list[str] = []
        for raw in ignored:
            if prefix and not raw.startswith(prefix):
                continue
            name = raw[len(prefix) :]
            if not name or name.split("/")[0] == ".orchmode":
                continue
            path = self.workdir / name.rstrip("/")
            if path.is_symlink():
                continue  # it could point anywhere, even somewhere the sandbox hides
            shown.append(name)
        shown.sort(key=lambda n: (not n.endswith("/"), n))
        if len(shown) > MAX_SHOWN:
            log.warning(
                "%d ignored entries in the working directory; the agents' copies show the "
                "first %d read-only",
                len(shown),
                MAX_SHOWN,
            )
        return tuple(shown[:MAX_SHOWN])

    async def has(self, commit: str) -> bool:
        await self.open()
        if commit in self._trees:
            return True  # made or read here: the store keeps every object it is given
        code, _ = await git(
            "cat-file",
            "-e",
            f"{commit}^{{commit}}",
            env=self._store_env(),
            cwd=self.home,
            ok=(0, 1, 128),
        )
        return code == 0

    async def bundle(self, commit: str) -> bytes:
        """The snapshot and every object it needs, for a node that has none of them."""
        ref = f"refs/orchmode/{commit}"
        env = self._store_env()
        await git("update-ref", ref, commit, env=env, cwd=self.home)
        path = self.run / f"{self._name('bundle')}.bundle"
        try:
            await git("bundle", "create", "-q", str(path), ref, env=env, cwd=self.home)
            return path.read_bytes()
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
            await git("update-ref", "-d", ref, env=env, cwd=self.home)

    async def receive(self, commit: str, data: bytes) -> None:
        """Take a snapshot sent as a :meth:`bundle` into this store."""
        await self.open()
        if await self.has(commit):
            return
        path = self.run / f"{self._name('bundle')}.bundle"
        path.write_bytes(data)
        try:
            await git(
                "fetch",
                "-q",
                str(path),
                f"refs/orchmode/{commit}",
                env=self._store_env(),
                cwd=self.home,
            )
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
        if not await self.has(commit):
            raise TreeError(f"the snapshot {commit[:12]} did not arrive whole")

    # ---------------------------------------------------------------------------- layers

    def plan_directory(self, stem: str) -> Path:
        """Where an agent's workspace will be (known before it exists)."""
        return self.run / self._name(_safe(stem))

    async def tree_of(self, commit: str) -> str:
        tree = self._trees.get(commit)
        if tree is None:
            _, out = await git(
                "rev-parse", f"{commit}^{{tree}}", env=self._store_env(), cwd=self.home
            )
            tree = self._trees[commit] = out.decode().strip()
        return tree

    async def patch_layer(self, stack: Stack, patch: str) -> Path:
        """A layer with ``patch`` applied over ``stack`` (made once per stack and patch)."""
        # The commit too: the same checkout holds another commit once it is brought up to date.
        key = (stack.layers, stack.commit, Change(stack.commit, patch).digest)
        layer = self._patch_layers.get(key)
        if layer is None:
            data = patch.encode(errors="surrogateescape")
            layer = await self.lowers.layer_from_patch(stack.layers, data)
            self._patch_layers[key] = layer
        return layer

    async def derive(self, base: str, layer: Path) -> tuple[str, str]:
        """The commit (and its tree) that ``layer`` makes of ``base``: a child of ``base``,
        so that the same layer gives the same commit on every machine."""
        derived = self._derived.get(layer)
        if derived is None:
            base_tree = await self.tree_of(base)
            env = self._store_env()
            tree, _, _ = await on_thread(
                lambda work: read_layer(work, layer, base_tree, env, self.home, _nothing_ignored)
            )
            derived = self._derived[layer] = (await self._commit(tree, base), tree)
        return derived

    async def derive_from_patch(self, base: str, patch: str) -> str:
        """The commit ``patch`` makes of ``base`` (a child of it), worked out in the store."""
        index = self.run / f"{self._name('derive')}.index"
        try:
            tree = await self._applied(f"{base}^{{tree}}", patch, index)
        finally:
            with contextlib.suppress(OSError):
                index.unlink()
        if tree is None:
            raise TreeError("the patch does not apply to its snapshot")
        return await self._commit(tree, base)

    def know(self, change: Change, tree: str) -> None:
        """The tree ``change`` makes of its base, already known (read from its layer): its
        merge need not work it out again."""
        key = (change.base, change.digest)
        if key not in self._theirs:
            task = asyncio.create_task(self._known_tree(tree, change.base))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._theirs[key] = task

    async def _known_tree(self, tree: str, base: str) -> str | None:
        await self._commit(tree, base)  # its merge's commit, made ahead
        return tree

    def throw_away(self, path: Path, *, layers: bool = False) -> None:
        """Remove a workspace's directory off the critical path (see :meth:`discard`);
        ``layers`` for an overlay's, which is mostly empty directories."""
        trash = self.run / f".trash-{path.name}"
        try:
            os.rename(path, trash)
        except OSError:
            trash = path
        if self._deleter is None:
            self._deleter = ThreadPoolExecutor(1, thread_name_prefix="orchmode-trash")
        self._deleter.submit(remove_workspace if layers else remove_tree, trash)

    # ---------------------------------------------------------------------------- copies

    def plan_copy(self, stem: str, commit: str) -> Copy:
        """Where a new copy of ``commit`` will be (known before it exists, for its sandbox)."""
        name = self._name(_safe(stem))
        return Copy(self.run / name, commit, self.run / f"{name}.index")

    async def make_copy(self, copy: Copy, patch: str = "", ignored: Sequence[str] = ()) -> None:
        """Fill ``copy`` with its commit and ``patch`` on top (staged, not committed, so that
        ``git status`` and ``git diff HEAD`` in the copy show it), and give it a ``.git`` of
        the agent's own.

        ``ignored`` entries are not copied: their mount points are made instead, so that a
        read-only copy can still show them from the working directory.
        """
        await self.open()
        path = copy.path
        path.mkdir(parents=True)
        env = {**self._store_env(copy.index), "GIT_WORK_TREE": str(path)}
        await git("read-tree", "--reset", "-u", copy.start, env=env, cwd=path)
        # A dozen small file operations: kept on the loop, where they cost a fraction of
        # what handing them to a thread costs on a busy machine (the GIL changing hands).
        self._agent_git_dir(path, copy.start, copy.index)
        if patch.strip():
            agents = {**self._store_env(path / ".git" / "index"), "GIT_WORK_TREE": str(path)}
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
        shown = [n for n in ignored if os.path.lexists(self.workdir / n.rstrip("/"))]
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
        (dot_git / "objects" / "info" / "alternates").write_text(f"{self.store_objects}\n")
        shutil.copyfile(self.store / "info" / "exclude", dot_git / "info" / "exclude")
        shutil.copyfile(index, dot_git / "index")

    async def change_of(self, copy: Copy, limits: DiskLimits | None = None) -> Change:
        """The copy's difference from where it started: every addition, deletion, rename,
        mode change and binary file, as one patch; a file too big for it (see
        :func:`.limits.left_out_of`) is left out, and named."""
        return await on_thread(lambda work: self._read_change(work, copy, limits))

    def _read_change(self, work: _Work, copy: Copy, limits: DiskLimits | None) -> Change:
        env = {**self._store_env(copy.index), "GIT_WORK_TREE": str(copy.path)}
        # the places made for secret files' notes are not the agent's writes
        stand_ins = self._stand_ins.get(copy.path, ())
        too_big = self._too_big(work, copy, env, stand_ins, limits) if limits else {}
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

    def _too_big(
        self,
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
        changed, untracked, _ = _parse_status(out)
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

    # ---------------------------------------------------------------------------- merging

    async def merge(self, change: Change) -> Merge:
        """Merge ``change`` into the working directory: all of it, or none of it."""
        (merge,) = await self.merge_all([change])
        return merge

    async def merge_all(self, changes: Sequence[Change]) -> list[Merge]:
        """Merge ``changes`` in order into the working directory, each all or nothing.

        Each is merged three-way into the tree the ones before it made, in the private
        store; the directory is written once, at the end. The merges start from the tree
        the directory is taken to hold (the last snapshot's, or the last merge's), and the
        files to be written are checked on disk first: when the user edited none of them,
        that is all it costs, whatever the tree's size. When one was edited, the merges
        are done again from the directory as it is (the user's edits merged with, not
        overwritten); and if a file to be written changes on disk even then, nothing is
        written and every change that would have been is a conflict.
        """
        await self.open()
        stem = self._name("merge")
        index = self.run / f"{stem}.index"
        try:
            if self._presumed is not None:
                merges, moved = await self._merge_from(self._presumed, changes, index)
                if not moved:
                    return merges
            start = await self._tree_of_workdir(index)
            self._presumed = start
            merges, moved = await self._merge_from(start, changes, index)
            if not moved:
                return merges
            detail = tuple(f"{p} (changed while merging)" for p in moved)
            return [Merge("conflict", detail) if m.fate == "merged" else m for m in merges]
        finally:
            for leftover in self.run.glob(f"{stem}*"):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    async def _merge_from(
        self, start: str, changes: Sequence[Change], index: Path
    ) -> tuple[list[Merge], list[str]]:
        """The merges from the tree ``start``, written out; or the files that turned out
        to differ on disk from ``start`` (then nothing was written)."""
        current = start
        merges: list[Merge] = []
        for change in changes:
            merge = await self._combine(change, current, index)
            merges.append(merge)
            if merge.fate == "merged":
                current = merge.tree
        if current != start:
            moved = await self._write_out(start, current, index)
            if moved:
                return merges, moved
            self._presumed = current
        return merges, []

    async def _combine(self, change: Change, ours: str, index: Path) -> Merge:
        """``change`` merged into the tree ``ours``, in the store only; its tree if merged."""
        summary = summary_of(change)
        if isinstance(summary, str):
            return Merge("refused", (f"the patch cannot be read: {summary}",))
        if not summary.files:
            return Merge("no change")
        refused = refusals(summary, self.secrets.files if self.secrets is not None else None)
        if refused:
            return Merge("refused", tuple(refused))
        links = any(
            f.old_path is not None or "120000" in (f.new_mode, f.old_mode) for f in summary.files
        )
        return await self._merge(change, index, ours, check_links=links)

    def merge_ahead(self, change: Change) -> asyncio.Task[str | None]:
        """Start working out the tree ``change`` makes of its snapshot (or None when its
        snapshot is gone or it does not apply to it). Independent of every other change,
        so it is done as soon as the worker ends, while its verifier runs; the merges at
        the end of the call, which must go one at a time, only take it up."""
        key = (change.base, change.digest)
        task = self._theirs.get(key)
        if task is None:
            task = asyncio.create_task(self._theirs_tree(change))
            # A failure is reported by the merge that awaits it; one never merged is dropped.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._theirs[key] = task
        return task

    async def _theirs_tree(self, change: Change) -> str | None:
        await self.open()
        if not await self.has(change.base):
            return None
        index = self.run / f"{self._name('theirs')}.index"
        try:
            tree = await self._applied(await self.tree_of(change.base), change.patch, index)
        finally:
            with contextlib.suppress(OSError):
                index.unlink()
        if tree is not None:
            await self._commit(tree, change.base)  # its merge's commit, made ahead too
        return tree

    async def _applied(self, tree: str, patch: str, index: Path) -> str | None:
        """The tree ``patch`` makes of ``tree``, or None when it does not apply to it."""
        store = self._store_env(index)
        await git("read-tree", tree, env=store, cwd=self.home)
        code, _ = await git(
            "apply", "--cached", "--binary", "-", env=store, cwd=self.home,
            data=patch.encode(errors="surrogateescape"), ok=(0, 1),
        )  # fmt: skip
        if code != 0:
            return None
        _, out = await git("write-tree", env=store, cwd=self.home)
        return out.decode().strip()

    async def _merge(self, change: Change, index: Path, ours: str, *, check_links: bool) -> Merge:
        based = await self.has(change.base)
        base_tree = await self.tree_of(change.base) if based else ours
        if based:
            theirs = await asyncio.shield(self.merge_ahead(change))
            if theirs is None:
                return Merge("conflict", ("it does not apply to its own snapshot",))
        else:  # its snapshot is gone (another machine's journal): it must fit as things are
            theirs = await self._applied(ours, change.patch, index)
            if theirs is None:
                why = "its snapshot is gone and it does not apply to the tree as it is"
                return Merge("conflict", (why,))
        links = await self._link_refusals(base_tree, theirs) if check_links else []
        if links:
            return Merge("refused", tuple(links))
        if not based or ours == base_tree:
            merged = theirs
        else:
            mine = await self._commit(ours, change.base)
            other = await self._commit(theirs, change.base)
            code, out = await git(
                "merge-tree", "--write-tree", "--name-only", "--no-messages", mine, other,
                env=self._store_env(), cwd=self.home, ok=(0, 1),
            )  # fmt: skip
            lines = out.decode(errors="surrogateescape").splitlines()
            if code != 0:
                conflicts = tuple(dict.fromkeys(line for line in lines[1:] if line))
                return Merge("conflict", conflicts)
            merged = lines[0].strip()
        return Merge("merged", tree=merged)

    # -------------------------------------------------------------------------- conflicts

    async def conflict_of(self, change: Change, label: str) -> Conflict | None:
        """``change`` merged into the working directory as it is now, conflict markers and
        all (``label`` names the change in them); None when it merges cleanly, or when its
        conflict is not one of content that an agent can edit (its snapshot is gone, it
        does not apply to it, or the working directory changed under the merge)."""
        await self.open()
        if not await self.has(change.base):
            return None
        theirs = await asyncio.shield(self.merge_ahead(change))
        if theirs is None:
            return None
        stem = self._name("conflict")
        index = self.run / f"{stem}.index"
        ours_ref, theirs_ref = "refs/heads/as-merged", f"refs/heads/{label}"
        env = self._store_env()
        try:
            ours_tree = await self._tree_of_workdir(index)
            ours = await self._commit(ours_tree, change.base)
            other = await self._commit(theirs, change.base)
            await git("update-ref", ours_ref, ours, env=env, cwd=self.home)
            await git("update-ref", theirs_ref, other, env=env, cwd=self.home)
            code, out = await git(
                "-c", "merge.conflictStyle=merge", "merge-tree", "--write-tree",
                "--name-only", "as-merged", label, env=env, cwd=self.home, ok=(0, 1),
            )  # fmt: skip
        finally:
            for ref in (ours_ref, theirs_ref):
                with contextlib.suppress(TreeError):
                    await git("update-ref", "-d", ref, env=env, cwd=self.home)
            with contextlib.suppress(OSError):
                index.unlink()
        if code == 0:
            return None
        head, _, messages = out.decode(errors="surrogateescape").partition("\n\n")
        lines = head.splitlines()
        tree, files = lines[0].strip(), tuple(dict.fromkeys(f for f in lines[1:] if f))
        commit = await self._commit(tree, change.base)
        patch = await self.diff(change.base, tree)
        hunks = await self._hunks(tree, files, ("as-merged", label))
        said = tuple(line for line in messages.splitlines() if line.startswith("CONFLICT"))
        return Conflict(ours, tree, commit, patch, files, said, hunks, ("as-merged", label))

    async def edited_besides(
        self, base: str, files: Sequence[str], changes: Sequence[Change], ours: str
    ) -> bool:
        """Whether ``files`` in ``ours`` (the working directory as merged so far) are more
        than ``changes`` made of them in ``base``: the user edited them meanwhile. Worked
        out on an index that holds these files alone."""
        env = self._store_env(self.run / f"{self._name('edited')}.index")
        try:
            _, listed = await git("ls-tree", "-z", base, "--", *files, env=env, cwd=self.home)
            info = listed.replace(b"\0", b"\n")
            await git("update-index", "--index-info", env=env, cwd=self.home, data=info)
            include = [f"--include={name}" for name in files]
            for change in changes:
                code, _ = await git(
                    "apply", "--cached", "--binary", *include, "-", env=env, cwd=self.home,
                    data=change.patch.encode(errors="surrogateescape"), ok=(0, 1),
                )  # fmt: skip
                if code != 0:
                    return True
            _, mine = await git("ls-files", "-s", "-z", env=env, cwd=self.home)
            _, theirs = await git("ls-tree", "-z", ours, "--", *files, env=env, cwd=self.home)
        finally:
            with contextlib.suppress(OSError):
                Path(env["GIT_INDEX_FILE"]).unlink()

        def blobs(listing: bytes, at: int) -> dict[bytes, bytes]:
            entries = (e.partition(b"\t") for e in listing.split(b"\0") if e)
            return {name: meta.split()[at] for meta, _, name in entries}

        return blobs(mine, 1) != blobs(theirs, 2)

    async def diff(self, before: str, after: str) -> str:
        """The patch from ``before`` to ``after`` (commits or trees), in the pinned form."""
        _, out = await on_thread(
            lambda work: work.git(
                *PATCH_FORM, "diff-tree", "-p", *PATCH_FLAGS, before, after,
                env=self._store_env(), cwd=self.home,
            )
        )  # fmt: skip
        return out.decode(errors="surrogateescape")

    async def tree_with(self, tree: str, patch: str) -> str | None:
        """The tree ``patch`` makes of ``tree``, or None when it does not apply to it."""
        if not patch.strip():
            return tree
        index = self.run / f"{self._name('with')}.index"
        try:
            return await self._applied(tree, patch, index)
        finally:
            with contextlib.suppress(OSError):
                index.unlink()

    async def markers_left(self, tree: str, conflict: Conflict) -> list[str]:
        """The conflicted files of ``tree`` that still hold the conflict's marker lines."""
        starts = tuple(f"{mark} {label}".encode() for mark, label in zip(
            ("<<<<<<<", ">>>>>>>"), conflict.labels, strict=True
        ))  # fmt: skip
        left = []
        for name in conflict.files:
            blob = await self._blob(tree, name)
            if blob is not None and any(
                line.rstrip(b"\r").startswith(starts) for line in blob.split(b"\n")
            ):
                left.append(name)
        return left

    async def _blob(self, tree: str, name: str) -> bytes | None:
        code, out = await git(
            "cat-file", "blob", f"{tree}:{name}", env=self._store_env(), cwd=self.home,
            ok=(0, 128),
        )  # fmt: skip
        return out if code == 0 else None

    async def _hunks(self, tree: str, files: Sequence[str], labels: tuple[str, str]) -> str:
        """The conflicted parts of ``files`` in ``tree``, with a little context."""
        parts: list[str] = []
        for name in files:
            blob = await self._blob(tree, name)
            if blob is None:
                parts.append(f"--- {name}: removed on one side (see git's message above)")
                continue
            if b"\0" in blob[:8000]:
                parts.append(
                    f"--- {name}: a binary file; the tree as merged so far keeps its version"
                )
                continue
            text = blob.decode(errors="replace")
            shown = conflicted_hunks(text, labels)
            if not shown:
                parts.append(f"--- {name}: no markers (see git's message above)")
                continue
            parts.append(f"--- {name}\n{shown}")
        text = "\n".join(parts)
        if len(text) > MAX_HUNKS_CHARS:
            text = text[:MAX_HUNKS_CHARS] + "\n[orchmode: cut here; read the files themselves]"
        return text

    async def _link_refusals(self, before: str, after: str) -> list[str]:
        """Refusals for the symbolic links the change leaves, judged on the trees: a link
        moved by a pure rename has no mode in the patch text, but it has one here."""
        _, out = await git(
            "diff-tree",
            "-r",
            "-z",
            "--no-renames",
            before,
            after,
            env=self._store_env(),
            cwd=self.home,
        )
        fields = out.split(b"\0")
        links: list[FileChange] = []
        for meta, raw in zip(fields[::2], fields[1::2], strict=False):
            parts = meta.decode().lstrip(":").split()
            if len(parts) < 5 or parts[1] != "120000":
                continue
            _, target = await git(
                "cat-file", "blob", parts[3], env=self._store_env(), cwd=self.home
            )
            name = raw.decode(errors="surrogateescape")
            links.append(
                FileChange(
                    name,
                    None,
                    "added",
                    0,
                    0,
                    False,
                    None,
                    "120000",
                    target.decode(errors="surrogateescape"),
                )
            )
        return refusals(PatchSummary(tuple(links))) if links else []

    async def _commit(self, tree: str, parent: str) -> str:
        """The commit of ``tree`` with ``parent``: the same one for the same two, anywhere."""
        commit = self._commits.get((tree, parent))
        if commit is None:
            commit = await self._commit_of(tree, parent)
            self._commits[tree, parent] = commit
            self._trees[commit] = tree
        return commit

    async def _commit_of(self, tree: str, parent: str) -> str:
        _, out = await git(
            "commit-tree",
            tree,
            "-p",
            parent,
            "-m",
            "orchmode merge",
            env=self._store_env(),
            cwd=self.home,
        )
        return out.decode().strip()

    @property
    def intent(self) -> Path:
        """Where a write into the working directory says, while it lasts, what it writes."""
        return self.home / "merge.intent"

    async def finish_interrupted_write(self) -> list[str]:
        """Finish the write into the working directory that a process killed while it
        wrote left half done (its intent is still on disk): every file it was to write is
        written, every one it was to delete is deleted, so the directory holds the merge
        whole, as if the process had not been killed. The paths, if there was one. Called
        with the merge lock held (no other process is writing)."""
        await self.open()
        try:
            words = self.intent.read_text().split()
        except FileNotFoundError:
            return []
        if len(words) != 2 or not all(_is_object_id(w) for w in words):
            # Cut while it was written: the write it announced had not begun.
            self.intent.unlink(missing_ok=True)
            return []
        ours, merged = words
        index = self.run / f"{self._name('finish')}.index"
        try:
            before, after = await self._files_between(ours, merged, index)
            kept, unexpected = await self._keep_unexpected(before, after)
            await self._write_files(before, after, index)
        finally:
            _remove_index(index)
        self.intent.unlink(missing_ok=True)
        self._presumed = None  # the directory is read again by the next merge
        log.info("finished a write into the working directory a killed run left half done")
        if unexpected:
            log.warning(
                "finished a merge a killed run left half done; %s held neither the content "
                "before it nor the merged one (cut off mid-write, or edited since): what "
                "was there is kept in %s",
                listed(sorted(unexpected)),
                kept,
            )
        return list(before)

    async def _keep_unexpected(
        self, before: dict[str, str | None], after: dict[str, tuple[str, str]]
    ) -> tuple[Path, list[str]]:
        """Copy aside each file about to be rewritten or deleted whose content is neither
        the one the interrupted write started from nor the one it was writing: a file git
        was cut off writing, or one edited after the kill. Nothing on disk is lost to the
        finish. The directory of the copies (made only if there are any), and the paths."""
        actual = await self._blobs_on_disk(list(before))
        unexpected = [
            path
            for path, blob in actual.items()
            if blob not in (before[path], after[path][1] if path in after else None)
        ]
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        kept = self.workdir / TREES_DIR.parent / "kept" / stamp
        for path in unexpected:
            target = kept / path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.workdir / path, target, follow_symlinks=False)
        return kept, unexpected

    async def _files_between(
        self, ours: str, merged: str, index: Path
    ) -> tuple[dict[str, str | None], dict[str, tuple[str, str]]]:
        """The paths that differ between two trees: each one's blob in ``ours`` (None: not
        there), and the mode and blob in ``merged`` of each one that is there."""
        store = self._store_env(index)
        _, out = await git(
            "diff-tree", "-r", "-z", "--no-renames", ours, merged, env=store, cwd=self.home
        )
        fields = out.split(b"\0")
        before: dict[str, str | None] = {}
        after: dict[str, tuple[str, str]] = {}
        for meta, raw in zip(fields[::2], fields[1::2], strict=False):
            parts = meta.decode().lstrip(":").split()
            if len(parts) < 5:
                continue
            path = raw.decode(errors="surrogateescape")
            _, new_mode, old, new, status = parts[:5]
            before[path] = None if status == "A" else old
            if status != "D":
                after[path] = (new_mode, new)
        return before, after

    async def _write_out(self, ours: str, merged: str, index: Path) -> list[str]:
        """Write the files that differ between the tree as it was and the merged one, after
        checking that none of them changed on disk; the ones that did (nothing written).

        While it writes, its intent (the two trees) is on disk: a process killed in the
        middle leaves it, and the next merge here finishes the write first
        (:meth:`finish_interrupted_write`), so no change is ever left written in part."""
        before, after = await self._files_between(ours, merged, index)
        if not before:
            return []
        moved = await self._changed_since(before)
        if moved:
            return moved
        # Nothing is written before the intent is whole on disk: cut short, it names no
        # trees, and is dropped.
        self.intent.write_text(f"{ours}\n{merged}\n")
        await self._write_files(before, after, index)
        self.intent.unlink(missing_ok=True)
        return []

    async def _write_files(
        self, before: dict[str, str | None], after: dict[str, tuple[str, str]], index: Path
    ) -> None:
        """Delete what ``after`` lacks of ``before``; write ``after``'s files."""
        store = self._store_env(index)
        for path in before:
            if path not in after:
                self._delete(path)
        if after:
            # An index of these files alone: writing them costs what they are, not the tree.
            with contextlib.suppress(OSError):
                index.unlink()
            info = b"".join(
                f"{mode} {oid}\t".encode() + path.encode(errors="surrogateescape") + b"\0"
                for path, (mode, oid) in after.items()
            )
            await git("update-index", "-z", "--index-info", env=store, cwd=self.home, data=info)
            work = {**store, "GIT_WORK_TREE": str(self.workdir)}
            listing = b"\0".join(p.encode(errors="surrogateescape") for p in after) + b"\0"
            await git(
                "checkout-index", "-f", "-z", "--stdin", env=work, cwd=self.workdir, data=listing
            )

    async def _changed_since(self, expected: dict[str, str | None]) -> list[str]:
        """The paths whose content on disk is no longer the blob ``expected`` says (None:
        no file at all)."""
        actual = await self._blobs_on_disk(list(expected))
        return [p for p in expected if expected[p] != actual.get(p)]

    async def _blobs_on_disk(self, paths: list[str]) -> dict[str, str]:
        """The blob id of each path's file or symbolic link as it is on disk (absent: not
        there, or a directory)."""
        present = [p for p in paths if os.path.lexists(self.workdir / p)]
        actual: dict[str, str] = {}
        regular = [
            p
            for p in present
            if not os.path.islink(self.workdir / p) and os.path.isfile(self.workdir / p)
        ]
        if regular:
            names = "\n".join(str(self.workdir / p) for p in regular)
            listing = names.encode(errors="surrogateescape") + b"\n"
            _, out = await git(
                "hash-object", "--no-filters", "--stdin-paths", env={}, cwd=self.workdir,
                data=listing,
            )  # fmt: skip
            actual.update(zip(regular, out.decode().split(), strict=True))
        for p in present:
            if os.path.islink(self.workdir / p):
                target = os.readlink(self.workdir / p).encode(errors="surrogateescape")
                _, out = await git("hash-object", "--stdin", env={}, cwd=self.workdir, data=target)
                actual[p] = out.decode().strip()
        return actual

    def _delete(self, relative: str) -> None:
        path = self.workdir / relative
        parent = Path(os.path.realpath(path.parent))
        if not parent.is_relative_to(self.workdir):
            raise TreeError(f"{relative}: its directory leads outside the working directory")
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        for directory in path.parents:  # as git does: no directory left empty by it
            if directory == self.workdir or not directory.is_relative_to(self.workdir):
                break
            try:
                directory.rmdir()
            except OSError:
                break


def conflicted_hunks(text: str, labels: tuple[str, str]) -> str:
    """Each marked hunk of ``text`` with :data:`HUNK_CONTEXT` lines around it, numbered."""
    lines = text.split("\n")
    start, end = f"<<<<<<< {labels[0]}", f">>>>>>> {labels[1]}"
    spans: list[tuple[int, int]] = []
    opened: int | None = None
    for n, line in enumerate(lines):
        if line.startswith(start):
            opened = n
        elif line.startswith(end) and opened is not None:
            spans.append((max(0, opened - HUNK_CONTEXT), min(len(lines), n + 1 + HUNK_CONTEXT)))
            opened = None
    merged: list[tuple[int, int]] = []
    for first, last in spans:
        if merged and first <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    blocks = [
        "\n".join(f"{n + 1:>5}: {lines[n]}" for n in range(first, last)) for first, last in merged
    ]
    return "\n   ...\n".join(blocks)


def _parse_status(out: bytes) -> tuple[list[str], list[str], list[str]]:
    """From ``git status --porcelain=v2 -z --no-renames``: the tracked paths whose work
    tree differs from the index, the untracked files, and the ignored entries (paths from
    the repository's top)."""
    changed: list[str] = []
    untracked: list[str] = []
    ignored: list[str] = []
    for record in out.split(b"\0"):
        if not record:
            continue
        kind = record[:1]
        if kind == b"1":  # 1 XY sub mH mI mW hH hI path
            fields = record.split(b" ", 8)
            if len(fields) == 9 and fields[1][1:2] != b".":
                changed.append(fields[8].decode(errors="surrogateescape"))
        elif kind == b"u":  # u XY sub m1 m2 m3 mW h1 h2 h3 path: unmerged, take the file
            fields = record.split(b" ", 10)
            if len(fields) == 11:
                changed.append(fields[10].decode(errors="surrogateescape"))
        elif kind == b"?":
            untracked.append(record[2:].decode(errors="surrogateescape"))
        elif kind == b"!":
            ignored.append(record[2:].decode(errors="surrogateescape"))
    return changed, untracked, ignored


def _nothing_ignored(_work: _Work, _paths: list[bytes], _exact: bool) -> set[bytes]:
    """A layer orchmode made holds what it holds: nothing of it is ignored."""
    return set()


def ignore_state(state: Path) -> None:
    """A ``.gitignore`` of ``*`` in orchmode's state dir: git (the user's, and every
    snapshot's) never sees the journal, the results or the copies."""
    marker = state / ".gitignore"
    if not marker.exists():
        with contextlib.suppress(OSError):
            marker.write_text("*\n")


def _is_object_id(word: str) -> bool:
    return len(word) in (40, 64) and all(c in "0123456789abcdef" for c in word)


def _safe(stem: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in stem)[:40] or "agent"
