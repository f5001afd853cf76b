"""Snapshots on disk, read-only, that the agents' overlays are layered on.

A session checks the tree out once: the first Workflow call's snapshot is materialised in
full (the one cost that grows with the repository), and each later call's snapshot is the
same directory brought up to date by git, which rewrites only the files that differ. A
commit that is not the materialised one (a resolver's tree, with the changes merged so far
and conflict markers in it) is a thin layer over it: the difference, applied once by
``git apply`` inside an overlay, so it costs what differs.

Each checkout carries a ``.git`` of the agents' own (HEAD detached at the snapshot, objects
borrowed from the private store, its index the checkout's own). Agents never write it: they
write their upper layers only.

Above every stack lies a layer of *stubs*: the empty directories and files where the sandbox
shows ``.orchmode/`` and the ignored entries (``.venv/``, ``node_modules/``) of the working
directory, which a read-only overlay could not create.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..core.overlay import Overlay
from .git import _Work, on_thread
from .layers import PATCH_FLAGS, PATCH_FORM
from .runs import remove_tree

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
    #: The mount points it holds itself (made while nobody used it), see :func:`stub`.
    stubs: frozenset[str] = frozenset()


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
    """The checkouts of one :class:`~orchmode.trees.copies.Trees` run, and their layers."""

    def __init__(
        self,
        run: Path,
        plain: Path,
        store: Path,
        name: Callable[[str], str],
    ) -> None:
        self.run = run
        #: A git directory that borrows the store's objects and converts nothing.
        self.plain = plain
        self.store = store
        self._name = name
        self._lowers: list[Lower] = []
        self._stubs: dict[frozenset[str], Path] = {}
        self._lock = asyncio.Lock()

    def prepare_plain(self, exclude: str) -> None:
        """Make (or refresh) the plain git directory: no conversions, the user's excludes."""
        plain = self.plain
        (plain / "objects" / "info").mkdir(parents=True, exist_ok=True)
        (plain / "refs").mkdir(exist_ok=True)
        (plain / "info").mkdir(exist_ok=True)
        head = plain / "HEAD"
        if not head.exists():
            head.write_text("ref: refs/heads/orchmode\n")
        (plain / "config").write_text(
            "[core]\n\trepositoryformatversion = 0\n\tbare = true\n\tsymlinks = true\n"
        )
        (plain / "objects" / "info" / "alternates").write_text(f"{self.store / 'objects'}\n")
        (plain / "info" / "attributes").write_text(_PLAIN_ATTRIBUTES)
        (plain / "info" / "exclude").write_text(exclude)

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
        if wanted <= stack.lower.stubs:
            return stack
        return replace(stack, layers=(self._stub_layer(wanted), *stack.layers))

    async def _acquire(self, commit: str, wanted: frozenset[str]) -> Stack:
        async with self._lock:
            lower = next((lw for lw in self._lowers if lw.commit == commit), None)
            if lower is None:
                lower = next((lw for lw in self._lowers if lw.users == 0), None)
                if lower is not None:
                    await self._update(lower, commit)
            if lower is None and self._lowers:
                lower = self._lowers[-1]  # in use at another commit: a layer over it
            if lower is None:
                lower = await self._materialise(commit)
            if lower.users == 0 and not wanted <= lower.stubs:
                stub(lower.path, wanted)  # nobody's layers are on it now
                lower.stubs |= wanted
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

    def close(self) -> None:
        self._lowers.clear()
        self._stubs.clear()

    # ---------------------------------------------------------------------------- work

    async def _materialise(self, commit: str) -> Lower:
        path = self.run / self._name("lower")
        lower = Lower(path, commit)
        try:
            await on_thread(lambda work: self._checkout(work, path, commit, fresh=True))
        except BaseException:
            remove_tree(path)
            raise
        self._lowers.append(lower)
        return lower

    async def _update(self, lower: Lower, commit: str) -> None:
        """Bring an unused checkout to ``commit``: only the files that differ are written."""
        for delta in lower.deltas.values():
            remove_tree(delta)
        lower.deltas.clear()
        try:
            await on_thread(lambda work: self._checkout(work, lower.path, commit, fresh=False))
        except BaseException:
            self._lowers.remove(lower)
            remove_tree(lower.path)
            raise
        lower.commit = commit

    def _checkout(self, work: _Work, path: Path, commit: str, *, fresh: bool) -> None:
        dot_git = path / ".git"
        if fresh:
            (dot_git / "objects" / "info").mkdir(parents=True)
            (dot_git / "refs" / "heads").mkdir(parents=True)
            (dot_git / "info").mkdir()
            (dot_git / "config").write_text(
                "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"
            )
            (dot_git / "objects" / "info" / "alternates").write_text(f"{self.store / 'objects'}\n")
        env = self.plain_env(GIT_INDEX_FILE=str(dot_git / "index"), GIT_WORK_TREE=str(path))
        work.git("read-tree", "--reset", "-u", commit, env=env, cwd=path)
        shutil.copyfile(self.plain / "info" / "exclude", dot_git / "info" / "exclude")
        (dot_git / "HEAD").write_text(f"{commit}\n")

    async def _delta(self, lower: Lower, commit: str) -> Path:
        """A layer that turns ``lower``'s checkout into ``commit``'s."""
        _, out = await on_thread(
            lambda work: work.git(
                *PATCH_FORM, "diff-tree", "-p", *PATCH_FLAGS, lower.commit, commit,
                env={"GIT_DIR": str(self.store)}, cwd=self.run,
            )
        )  # fmt: skip
        return await self.layer_from_patch((lower.path,), out)

    async def layer_from_patch(self, stack: tuple[Path, ...], patch: bytes) -> Path:
        """A new layer holding ``patch`` applied over ``stack``: written by ``git apply``
        in an overlay mounted for it alone, so deletions become whiteouts."""
        stem = self._name("layer")
        layer, scratch, target = (self.run / f"{stem}{part}" for part in ("", "-work", "-mnt"))
        for directory in (layer, scratch, target):
            directory.mkdir(parents=True)
        overlay = Overlay(stack, target, upper=layer, work=scratch)
        argv = overlay.wrap(["git", "apply", "--binary", "--whitespace=nowarn", "-"])
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
