"""Read-only checkouts of snapshots, which the agents' overlays are layered on.

The tree is checked out once: the first Workflow call's snapshot is materialised, as hard
links to the working directory's files that hold it where the snapshot's index says they
do (:mod:`.links`), else in full; each later call's snapshot is the same directory brought
up to date by git, which replaces only the files that differ (a checkout of links is
checked by every entry's stat: a file the user edited in place since is replaced too). A
commit that is not the materialised one (a resolver's tree, with the changes merged so far
and conflict markers in it) is a thin layer over it: the difference, applied once by
``git apply`` inside an overlay (over links, the files that differ, written by git), so it
costs what differs.

The checkout is kept between sessions, in ``.orchmode/trees/checkout`` (see
:class:`KeptCheckout`): the next session in this directory brings it up to date instead
of checking the tree out again. Sessions share it under a lock: it is changed only by a
session that holds it alone; one that finds it in use by another layers over it.

Each checkout carries a ``.git`` of the agents' own (HEAD detached at the snapshot, objects
borrowed from the private store, its index the checkout's own). Agents never write it: they
write their upper layers only.

A checkout holds *stubs* too: the empty directories and files where the sandbox shows
``.orchmode/`` and the ignored entries (``.venv/``, ``node_modules/``) of the working
directory, which a read-only view could not create. They are made while nobody uses the
checkout; one in use that lacks some gets a thin layer of them on top instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..core.overlay import Overlay
from ..core.programs import program
from .git import _Work, copy_index, on_thread
from .layers import PATCH_FLAGS, PATCH_FORM
from .links import SnapshotIndex, link_checkout
from .runs import remove_index, remove_tree, write_file

#: Beside a checkout's index: the checkout holds links to the working directory's files.
_LINKED = "orchmode-linked"
#: Config of the gits that read a checkout: no conversions, and no trust in ctime (a link
#: to a file changes it).
_CORE = "[core]\n\trepositoryformatversion = 0\n\ttrustctime = false\n"

#: Attributes that keep checkouts and hashing byte for byte: the agents see the blobs as
#: they are stored, and what they write is stored as they wrote it.
_PLAIN_ATTRIBUTES = "* -text -eol -filter -ident -working-tree-encoding\n"


@dataclass
class Lower:
    """A checkout of one commit, and how many workspaces are layered on it now."""

    path: Path
    commit: str
    users: int = 0
    #: Layers over it for other commits, by commit (their users count as its users).
    deltas: dict[str, Path] = field(default_factory=dict)
    #: Set for the checkout kept between sessions: its lock.
    kept: KeptCheckout | None = None


class KeptCheckout:
    """The checkout kept between sessions, and the lock the sessions share it under.

    Every session that uses it holds a shared lock for as long as it lives; a session
    changes it only while it holds it alone (an exclusive lock, never waited for), so no
    overlay is ever mounted on a checkout being changed. Its commit is written beside it
    only once it is whole: a session killed while changing it leaves none, and the next
    one checks the tree out again.
    """

    def __init__(self, home: Path) -> None:
        self.path = home / "checkout"
        self._lock = home / "checkout.lock"
        self._commit = home / "checkout.commit"
        self._fd: int | None = None

    def own(self) -> bool:
        """Hold it alone, if no other session holds it now (blocking nothing)."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def share(self) -> None:
        """Hold it with the other sessions (waiting out one that is changing it)."""
        fcntl.flock(self._open(), fcntl.LOCK_SH)

    def reown(self) -> bool:
        """From shared to alone, if no other session holds it; shared again if one does
        (it may have changed meanwhile: read :meth:`commit` again)."""
        fd = self._open()
        fcntl.flock(fd, fcntl.LOCK_UN)
        if self.own():
            return True
        fcntl.flock(fd, fcntl.LOCK_SH)
        return False

    def commit(self) -> str | None:
        with contextlib.suppress(OSError):
            text = self._commit.read_text().strip()
            if len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text):
                return text
        return None

    def forget(self) -> None:
        """About to change it: until :meth:`record`, it is whole at no commit."""
        with contextlib.suppress(FileNotFoundError):
            self._commit.unlink()

    def record(self, commit: str) -> None:
        partial = self._commit.with_suffix(".tmp")
        partial.write_text(f"{commit}\n")
        os.replace(partial, self._commit)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing lets the lock go
            self._fd = None

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self._lock, os.O_RDWR | os.O_CREAT, 0o600)
        return self._fd


@dataclass(frozen=True)
class Stack:
    """The read-only layers of a workspace, top first, and what they show (the mount
    points for ``.orchmode/`` and the ignored entries included)."""

    layers: tuple[Path, ...]
    #: The commit the layers show.
    commit: str
    #: The checkout at the bottom (released when the workspace closes).
    lower: Lower

    @property
    def bare(self) -> bool:
        """Whether the stack is the checkout alone, mount points and all: a view that
        writes nothing can then be a plain read-only bind of it, with no overlay."""
        return self.layers == (self.lower.path,)


class Lowers:
    """The checkouts of one :class:`~orchmode.trees.trees.Trees` run, and their layers."""

    def __init__(
        self,
        run: Path,
        plain: Path,
        store: Path,
        name: Callable[[str], str],
        kept: KeptCheckout | None = None,
    ) -> None:
        self.run = run
        #: The checkout kept between sessions, if this store keeps one (a Ray node's does
        #: not: its home goes with the session).
        self.kept = kept
        #: A git directory that borrows the store's objects and converts nothing.
        self.plain = plain
        self.store = store
        self._name = name
        self._lowers: list[Lower] = []
        self._stubs: dict[frozenset[str], Path] = {}
        self._lock = asyncio.Lock()
        #: The latest snapshot's index, which says which files a new checkout can link.
        self._offered: SnapshotIndex | None = None

    def offer(self, index: SnapshotIndex) -> None:
        """Keep the latest snapshot's index (in place of the one before) for a checkout of
        its commit."""
        self._forget_offered()
        if self._lowers:
            remove_index(index.path)  # a checkout is made: it is only ever brought up to date
        else:
            self._offered = index

    def prepare_plain(self, exclude: str) -> None:
        """Make (or refresh) the plain git directory: no conversions, the user's excludes."""
        plain = self.plain
        (plain / "objects" / "info").mkdir(parents=True, exist_ok=True)
        (plain / "refs").mkdir(exist_ok=True)
        (plain / "info").mkdir(exist_ok=True)
        if not (plain / "HEAD").exists():
            write_file(plain / "HEAD", "ref: refs/heads/orchmode\n")
        write_file(
            plain / "config",
            f"{_CORE}\tbare = true\n\tsymlinks = true\n",
        )
        write_file(plain / "objects" / "info" / "alternates", f"{self.store / 'objects'}\n")
        write_file(plain / "info" / "attributes", _PLAIN_ATTRIBUTES)
        write_file(plain / "info" / "exclude", exclude)

    def plain_env(self, **extra: str) -> dict[str, str]:
        return {"GIT_DIR": str(self.plain), **extra}

    # ------------------------------------------------------------------------- acquire

    async def acquire(self, commit: str, workdir: Path, ignored: Sequence[str]) -> Stack:
        """Layers that show ``commit``: its own checkout, or a layer over another one, and
        the mount points for ``.orchmode/`` and the ``ignored`` entries ``workdir`` has (a
        Ray node has none of the user's ignored files to show).

        The caller must :meth:`release` the stack's lower when its workspace closes.
        """
        wanted = frozenset((".orchmode/", *(n for n in ignored if _exists(workdir, n))))
        stack = await self._acquire(commit, wanted)
        if _stubbed(stack.lower.path, wanted):
            return stack
        return replace(stack, layers=(self._stub_layer(wanted), *stack.layers))

    async def _acquire(self, commit: str, wanted: frozenset[str]) -> Stack:
        async with self._lock:
            lower = next((lw for lw in self._lowers if lw.commit == commit), None)
            if lower is None:
                unused = next((lw for lw in self._lowers if lw.users == 0), None)
                if unused is not None and await self._update(unused, commit, wanted):
                    lower = unused
            if lower is None and self._lowers:
                lower = self._lowers[-1]  # in use at another commit: a layer over it
            if lower is None:
                lower = await self._materialise(commit, wanted)
            if lower.users == 0 and lower.kept is None and not _stubbed(lower.path, wanted):
                stub(lower.path, wanted)  # nobody's layers are on it now
            lower.users += 1
            try:
                if lower.commit == commit:
                    return Stack((lower.path,), commit, lower)
                delta = lower.deltas.get(commit)
                if delta is None:
                    delta = await self._delta(lower, commit)
                    lower.deltas[commit] = delta
                return Stack((delta, lower.path), commit, lower)
            except BaseException:
                lower.users -= 1
                raise

    def release(self, lower: Lower) -> None:
        lower.users = max(0, lower.users - 1)

    def _stub_layer(self, wanted: frozenset[str]) -> Path:
        """A layer of the mount points ``wanted``, for a checkout that lacks some and is in
        use (nothing may change a lower layer under a mounted overlay)."""
        layer = self._stubs.get(wanted)
        if layer is None:
            layer = self.run / self._name("stubs")
            layer.mkdir(parents=True)
            stub(layer, wanted)
            self._stubs[wanted] = layer
        return layer

    def _forget_offered(self) -> None:
        if self._offered is not None:
            remove_index(self._offered.path)
            self._offered = None

    def close(self) -> None:
        self._lowers.clear()
        self._stubs.clear()
        self._offered = None  # its file goes with the run's directory
        if self.kept is not None:
            self.kept.close()

    # ---------------------------------------------------------------------------- work

    async def _materialise(self, commit: str, wanted: frozenset[str]) -> Lower:
        """The session's checkout: the one kept between sessions when it can be had (else
        one of this run's own), at ``commit`` — or at another session's commit, when that
        session holds it too: then ``commit`` is a layer over it."""
        if self.kept is not None:
            kept = await self._adopt(self.kept, commit, wanted)
            if kept is not None:
                self._forget_offered()  # brought up to date, never made anew here
                self._lowers.append(kept)
                return kept
        path = self.run / self._name("lower")
        lower = Lower(path, commit)
        try:
            await on_thread(lambda work: self._checkout(work, path, commit, fresh=True))
        except BaseException:
            remove_tree(path)
            raise
        self._lowers.append(lower)
        return lower

    async def _adopt(self, kept: KeptCheckout, commit: str, wanted: frozenset[str]) -> Lower | None:
        if await asyncio.to_thread(kept.own):
            before = kept.commit()
            fresh = before is None or not (kept.path / ".git" / "index").is_file()
            try:
                await self._rewrite(kept, commit, wanted, fresh=fresh)
            except BaseException:
                kept.close()
                raise
        else:
            await asyncio.to_thread(kept.share)  # another session holds it: layered over
        theirs = kept.commit()  # ours, unless another session changed it as ours went shared
        if theirs is None or (theirs != commit and not await self._known(theirs)):
            kept.close()
            return None
        return Lower(kept.path, theirs, kept=kept)

    async def _rewrite(
        self, kept: KeptCheckout, commit: str, wanted: frozenset[str], *, fresh: bool
    ) -> None:
        """Bring the kept checkout to ``commit`` while holding it alone; shared after."""
        before = kept.commit()
        kept.forget()
        if fresh:
            await asyncio.to_thread(remove_tree, kept.path)
        await on_thread(
            lambda work: self._checkout(work, kept.path, commit, fresh=fresh, before=before)
        )
        stub(kept.path, wanted)
        kept.record(commit)
        await asyncio.to_thread(kept.share)  # from alone to shared: never waits

    async def _known(self, commit: str) -> bool:
        code, _ = await on_thread(
            lambda work: work.git(
                "cat-file", "-e", f"{commit}^{{commit}}", env={"GIT_DIR": str(self.store)},
                cwd=self.run, ok=(0, 1, 128),
            )
        )  # fmt: skip
        return code == 0

    async def _update(self, lower: Lower, commit: str, wanted: frozenset[str]) -> bool:
        """Bring an unused checkout to ``commit`` (only the files that differ are written);
        False when it cannot be changed now (another session holds the kept one)."""
        for delta in lower.deltas.values():
            remove_tree(delta)
        lower.deltas.clear()
        kept = lower.kept
        if kept is not None:
            if not await asyncio.to_thread(kept.reown):
                lower.commit = kept.commit() or lower.commit  # as the other one left it
                return False
            try:
                await self._rewrite(kept, commit, wanted, fresh=False)
            except BaseException:
                self._lowers.remove(lower)
                kept.close()
                raise
            lower.commit = kept.commit() or commit
            return lower.commit == commit
        try:
            old = lower.commit
            await on_thread(
                lambda work: self._checkout(work, lower.path, commit, fresh=False, before=old)
            )
        except BaseException:
            self._lowers.remove(lower)
            remove_tree(lower.path)
            raise
        lower.commit = commit
        return True

    def _checkout(
        self, work: _Work, path: Path, commit: str, *, fresh: bool, before: str | None = None
    ) -> None:
        """Check ``commit`` out in ``path``: whole, or from ``before``, which it holds now."""
        dot_git = path / ".git"
        if fresh:
            (dot_git / "objects" / "info").mkdir(parents=True)
            (dot_git / "refs" / "heads").mkdir(parents=True)
            (dot_git / "info").mkdir()
            (dot_git / "config").write_text(f"{_CORE}\tfilemode = true\n\tbare = false\n")
            (dot_git / "objects" / "info" / "alternates").write_text(f"{self.store / 'objects'}\n")
        env = self.plain_env(GIT_INDEX_FILE=str(dot_git / "index"), GIT_WORK_TREE=str(path))
        linked = dot_git / _LINKED
        code = 1
        if fresh:
            offered = self._offered
            if offered is not None and offered.commit == commit:
                self._offered = None  # the checkout takes its file
                code = 0 if link_checkout(work, offered, path, env) >= 0 else 1
                if code == 0:
                    linked.touch()
        elif before is not None and not linked.exists():
            # From one tree to the other: only the entries that differ are looked at.
            code, _ = work.git(
                "read-tree", "-m", "-u", before, commit, env=env, cwd=path, ok=(0, 1, 128)
            )
        if code != 0:
            # Fresh, or a stand-in where a file now goes, or links (a file edited in place
            # since is no longer what the index says): every entry is checked, by its stat.
            work.git("read-tree", "--reset", "-u", commit, env=env, cwd=path)
        shutil.copyfile(self.plain / "info" / "exclude", dot_git / "info" / "exclude")
        (dot_git / "HEAD").write_text(f"{commit}\n")

    async def _delta(self, lower: Lower, commit: str) -> Path:
        """A layer that turns ``lower``'s checkout into ``commit``'s."""
        if (lower.path / ".git" / _LINKED).exists():
            return await self._layer_of_commit(lower, commit)
        _, out = await on_thread(
            lambda work: work.git(
                *PATCH_FORM, "diff-tree", "-p", *PATCH_FLAGS, lower.commit, commit,
                env={"GIT_DIR": str(self.store)}, cwd=self.run,
            )
        )  # fmt: skip
        return await self.layer_from_patch((lower.path,), out)

    async def _layer_of_commit(self, lower: Lower, commit: str) -> Path:
        """A layer of every file where ``lower``'s links differ from ``commit``, by each
        entry's stat rather than a patch: a file the user edited in place since is no
        longer what the checkout's commit says, and a patch would not apply to it."""
        stem = self._name("layer")
        layer, scratch, target = (self.run / f"{stem}{part}" for part in ("", "-work", "-mnt"))
        for directory in (layer, scratch, target):
            directory.mkdir(parents=True)
        index = self.run / f"{stem}.index"
        overlay = Overlay((lower.path,), target, upper=layer, work=scratch)
        # the namespace maps the owner to root: owners and inodes are not compared
        argv = overlay.wrap(
            [program("git"), "-c", "core.checkStat=minimal", "read-tree", "--reset", "-u", commit]
        )
        env = self.plain_env(GIT_INDEX_FILE=str(index), GIT_WORK_TREE=str(target))
        try:
            copy_index(lower.path / ".git" / "index", index)
            await on_thread(lambda work: work.run(argv, env=env, cwd=self.run))
        except BaseException:
            remove_tree(layer)
            raise
        finally:
            remove_index(index)
            remove_tree(scratch)
            with contextlib.suppress(OSError):
                target.rmdir()
        return layer

    async def layer_from_patch(self, stack: tuple[Path, ...], patch: bytes) -> Path:
        """A new layer holding ``patch`` applied over ``stack``: written by ``git apply``
        in an overlay mounted for it alone, so deletions become whiteouts."""
        stem = self._name("layer")
        layer, scratch, target = (self.run / f"{stem}{part}" for part in ("", "-work", "-mnt"))
        for directory in (layer, scratch, target):
            directory.mkdir(parents=True)
        overlay = Overlay(stack, target, upper=layer, work=scratch)
        argv = overlay.wrap([program("git"), "apply", "--binary", "--whitespace=nowarn", "-"])
        try:
            if patch.strip():
                await on_thread(
                    lambda work: work.run(argv, env=self.plain_env(), cwd=self.run, data=patch)
                )
        except BaseException:
            remove_tree(layer)
            raise
        finally:
            remove_tree(scratch)
            with contextlib.suppress(OSError):
                target.rmdir()
        return layer


def stub(layer: Path, names: frozenset[str]) -> None:
    """Empty stand-ins in ``layer`` (a directory for a name ending in ``/``, else a file)
    where the sandbox mounts ``.orchmode/`` and shows ignored entries: a read-only view
    cannot make its own mount points."""
    root = layer.resolve()
    for name in names:
        point = layer / name.rstrip("/")
        if os.path.lexists(point) or not point.resolve().is_relative_to(root):
            continue
        with contextlib.suppress(OSError):
            if name.endswith("/"):
                point.mkdir(parents=True)
            else:
                point.parent.mkdir(parents=True, exist_ok=True)
                point.touch()


def _exists(workdir: Path, name: str) -> bool:
    return os.path.lexists(workdir / name.rstrip("/"))


def _stubbed(layer: Path, names: frozenset[str]) -> bool:
    """Whether ``layer`` holds a mount point for each of ``names`` already."""
    return all(os.path.lexists(layer / name.rstrip("/")) for name in names)
