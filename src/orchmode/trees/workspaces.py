"""An agent's workspace under ``worktree`` isolation: opened once, closed once, a change out.

The agent host asks :class:`Workspaces` for a workspace, opens it (the sandbox then mounts
what :attr:`Workspace.view` says at the working directory's path), runs the agent, and
closes it, getting the agent's change. Two kinds, one shape:

- :class:`OverlayWorkspace`: a copy-on-write overlay on the call's snapshot, checked out
  once for the session (:mod:`.snapshots`). Opening it makes two empty directories; its
  change is read from its upper layer (:mod:`.layers`). Time and disk follow the agent's
  own writes, not the repository's size.
- :class:`CopyWorkspace`: a full copy of the tree, for where overlays cannot be made (the
  kernel, the file system or user namespaces refuse, or the sandbox is off).

A worker's workspace is kept, when it is to be verified, for its verifier: a verifier that
runs here is shown the very layer (or copy) its worker left, read-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from ..core.overlay import Overlay
from ..core.results import Change
from .copies import Copy
from .git import TreeError, _Work, on_thread
from .layers import check_ignore, read_layer
from .limits import DiskLimits, written_size
from .lowers import Lower
from .runs import remove_tree
from .trees import Trees

log = logging.getLogger("orchmode")


@dataclass(frozen=True)
class View:
    """What an agent's sandbox shows at the working directory's path."""

    #: What is bound there: a copy, or the mount point of the overlay.
    root: Path
    writable: bool
    #: Mounted on ``root`` first, in the shell's own namespace (None: a plain copy).
    overlay: Overlay | None
    #: Ignored entries shown read-only from the working directory itself.
    shown: tuple[str, ...]
    #: Read-only binds (source, destination) the agent's git needs: the private object
    #: store, and the user's objects behind it.
    objects: tuple[tuple[Path, Path], ...]


@dataclass(frozen=True)
class Spec:
    """What a workspace shows: ``base`` with ``patch`` on top; writable or not."""

    base: str
    patch: str = ""
    writable: bool = True
    #: Ignored entries of the working directory, shown read-only instead of copied.
    ignored: tuple[str, ...] = ()
    #: The subtask a verifier's workspace belongs to (``1.3``): it finds its worker's by it.
    chain: str = ""


class Workspace(ABC):
    """One agent's view of the tree, and what it changed there."""

    spec: Spec
    workspaces: Workspaces

    @property
    @abstractmethod
    def view(self) -> View:
        """The sandbox's mounts; known once :meth:`open` has returned."""

    @abstractmethod
    async def open(self) -> None:
        """Make the workspace (the session's snapshot checked out first, if need be)."""

    @abstractmethod
    async def close(self, *, keep_for: str | None = None) -> Change | None:
        """The agent's change (a writable workspace's), and the workspace gone — or kept
        for the verifier of subtask ``keep_for``. Nothing may still be writing in it."""

    @abstractmethod
    def discard(self) -> None:
        """Remove it without reading anything (an agent that never ran, or a verifier's)."""

    async def change_so_far(self) -> Change:
        """The agent's change up to now, read as :meth:`close` reads it, the workspace left
        open: for a nested call, whose workers start from it. Nothing may be writing in it
        meanwhile (the agent waits on its tool call)."""
        raise TreeError("only a writable workspace has a change")

    def written(self) -> int:
        """Bytes the agent has written in it so far (what it takes on disk); called on a
        thread, while the agent runs."""
        return 0

    @property
    def disk(self) -> Path:
        """A path on the file system that holds the agent's writes."""
        return self.workspaces.trees.store.run

    def _kept_or_gone(self, change: Change, keep_for: str | None) -> Change:
        """``change``, once the workspace is kept for its verifier, or else removed (a
        resolver's, which shows a patch, is never kept: its verifier is shown the whole)."""
        if keep_for is not None and not self.spec.patch:
            self.workspaces.keep(self, keep_for, change)
        else:
            self.discard()
        return change


class Workspaces:
    """Makes the workspaces of one host, of the kind that works here, and keeps workers'
    workspaces for their verifiers."""

    def __init__(self, trees: Trees, *, overlays: bool, limits: DiskLimits | None = None) -> None:
        self.trees = trees
        self.overlays = overlays
        #: What an agent may write, and the largest file its change may hold.
        self.limits = limits if limits is not None else DiskLimits()
        self._kept: dict[tuple[str, str, str], Workspace] = {}

    def workspace(self, stem: str, spec: Spec) -> Workspace:
        """A workspace for ``spec``, not yet open: a verifier's is its worker's, if kept here."""
        if not spec.writable:
            kept = self._kept.pop(_key(spec.chain, spec.base, spec.patch), None)
            if kept is not None:
                return _Verifying(kept, spec)
        if self.overlays:
            return OverlayWorkspace(self, stem, spec)
        return CopyWorkspace(self, stem, spec)

    def keep(self, workspace: Workspace, chain: str, change: Change) -> None:
        key = _key(chain, change.base, change.patch)
        older = self._kept.pop(key, None)
        if older is not None:  # the same subtask again: the older one goes
            older.discard()
        self._kept[key] = workspace

    def discard_kept(self) -> None:
        """Drop what was kept for verifiers that ran elsewhere, or not at all."""
        kept, self._kept = list(self._kept.values()), {}
        for workspace in kept:
            workspace.discard()

    def objects(self) -> tuple[tuple[Path, Path], ...]:
        store = self.trees.store
        views = [(store.objects, store.objects)]
        if store.user_objects is not None:
            views.append((store.user_objects, store.alias))
        return tuple(views)


def _key(chain: str, base: str, patch: str) -> tuple[str, str, str]:
    return chain, base, Change(base, patch).digest


# ----------------------------------------------------------------------------- overlays


class OverlayWorkspace(Workspace):
    """A copy-on-write overlay on the snapshot: see the module's docstring."""

    def __init__(self, workspaces: Workspaces, stem: str, spec: Spec) -> None:
        self.workspaces = workspaces
        self.trees = workspaces.trees
        self.spec = spec
        self.home = self.trees.copies.plan_directory(stem)
        self.upper = self.home / "upper"
        self._work = self.home / "work"
        self.target = self.home / "mnt"
        self._lower: Lower | None = None
        #: The read-only layers, top first, once open.
        self.layers: tuple[Path, ...] = ()
        #: Whether those layers are the session's checkout alone (see :attr:`Stack.bare`).
        self.bare = False
        #: The commit the layers show (``base``, or ``base`` with its patch) and its tree.
        self._shown: tuple[str, str] | None = None
        self._view: View | None = None

    @property
    def view(self) -> View:
        if self._view is None:
            raise TreeError("the workspace is not open")
        return self._view

    async def open(self) -> None:
        trees, spec = self.trees, self.spec
        await trees.open()
        lowers = trees.lowers
        stack = await lowers.acquire(spec.base, trees.workdir, spec.ignored)
        self._lower = stack.lower
        self.bare = stack.bare
        try:
            layers = stack.layers
            if spec.patch.strip():
                patched = await trees.derived.patch_layer(stack, spec.patch)
                layers = (patched, *layers)
                self.bare = False
            self.layers = layers
            self.home.mkdir(parents=True)
            self.target.mkdir()
            overlay: Overlay | None = Overlay(self.layers, self.target)
            root = self.target
            if spec.writable:
                self.upper.mkdir()
                self._work.mkdir()
                overlay = Overlay(self.layers, self.target, self.upper, self._work)
            elif len(self.layers) == 1:  # read-only, one layer: itself, no overlay needed
                overlay, root = None, self.layers[0]
        except BaseException:
            self._release()
            remove_tree(self.home)
            raise
        self._view = View(root, spec.writable, overlay, spec.ignored, self.workspaces.objects())

    async def close(self, *, keep_for: str | None = None) -> Change | None:
        if self._view is None or not self.spec.writable:
            self.discard()
            return None
        try:
            change = await self.change_so_far()
        except BaseException:
            self.discard()
            raise
        return self._kept_or_gone(change, keep_for)

    async def change_so_far(self) -> Change:
        if self._view is None or not self.spec.writable:
            raise TreeError("only an open, writable workspace has a change")
        base, base_tree = await self._shown_commit()
        tree, patch, left = await on_thread(lambda work: self._read(work, base_tree))
        change = Change(base, patch, left)
        if patch:
            self.trees.merges.know(change, tree)
        return change

    def discard(self) -> None:
        self._release()
        self.trees.copies.throw_away(self.home, layers=True)

    def _release(self) -> None:
        if self._lower is not None:
            self.trees.lowers.release(self._lower)
            self._lower = None

    async def _shown_commit(self) -> tuple[str, str]:
        """The commit and tree the agent started from: its change is measured from them."""
        if self._shown is None:
            spec = self.spec
            if not spec.patch.strip():
                tree = await self.trees.store.tree_of(spec.base)
                self._shown = (spec.base, tree)
            else:
                patched = self.layers[0]
                self._shown = await self.trees.derived.derive(spec.base, patched)
        return self._shown

    def written(self) -> int:
        # The upper layer holds only what the agent wrote (copied up whole), and the work
        # directory what overlayfs is copying up at that moment.
        if self._view is None or not self.spec.writable:
            return 0
        return written_size(self.upper) + written_size(self._work)

    def _read(self, work: _Work, base_tree: str) -> tuple[str, str, tuple[str, ...]]:
        trees = self.trees
        content = self.layers  # mount points hold no ignore rules: they change nothing

        def ignored(work: _Work, paths: list[bytes], exact: bool) -> set[bytes]:
            lowers = trees.lowers
            if not exact and len(content) == 1:
                env = lowers.plain_env(GIT_WORK_TREE=str(content[0]))
                return check_ignore(work, paths, env, content[0], None)
            target = self.home / "check"
            target.mkdir(exist_ok=True)
            overlay = Overlay((self.upper, *content), target)
            try:
                env = lowers.plain_env(GIT_WORK_TREE=str(target))
                return check_ignore(work, paths, env, self.home, overlay.wrap([]))
            finally:
                with contextlib.suppress(OSError):
                    target.rmdir()

        return read_layer(
            work,
            self.upper,
            base_tree,
            trees.store.env(),
            trees.store.home,
            ignored,
            self.workspaces.limits,
        )


class _Verifying(Workspace):
    """A verifier's view of the workspace its worker left: the same layers, read-only."""

    def __init__(self, worker: Workspace, spec: Spec) -> None:
        self.worker = worker
        self.workspaces = worker.workspaces
        self.spec = spec
        view = worker.view
        self._target: Path | None = None
        if isinstance(worker, OverlayWorkspace) and worker.bare and _empty(worker.upper):
            # It wrote nothing at all: the checkout itself, read-only, with no overlay.
            self._view = View(worker.layers[0], False, None, view.shown, view.objects)
        elif isinstance(worker, OverlayWorkspace):
            self._target = worker.home / "check-mnt"
            overlay = Overlay((worker.upper, *worker.layers), self._target)
            self._view = View(self._target, False, overlay, view.shown, view.objects)
        else:
            self._view = View(view.root, False, None, view.shown, view.objects)

    @property
    def view(self) -> View:
        return self._view

    async def open(self) -> None:
        if self._target is not None:
            self._target.mkdir(exist_ok=True)

    async def close(self, *, keep_for: str | None = None) -> Change | None:
        self.discard()
        return None

    def discard(self) -> None:
        self.worker.discard()


# -------------------------------------------------------------------------------- copies


class CopyWorkspace(Workspace):
    """A full copy of the tree (see :meth:`.Copies.make_copy`): where overlays cannot be made."""

    def __init__(self, workspaces: Workspaces, stem: str, spec: Spec) -> None:
        self.workspaces = workspaces
        self.trees = workspaces.trees
        self.spec = spec
        self.copy: Copy = self.trees.copies.plan_copy(stem, spec.base)
        self._made = False
        #: What the copy took on disk once made: the agent's writes are what it adds.
        self._start_size = 0

    @property
    def view(self) -> View:
        return View(
            self.copy.path,
            self.spec.writable,
            None,
            self.spec.ignored,
            self.workspaces.objects(),
        )

    async def open(self) -> None:
        spec = self.spec
        if spec.writable and spec.patch.strip():
            # A resolver's copy: its change is measured from the tree with the patch in it.
            start = await self.trees.derived.derive_from_patch(spec.base, spec.patch)
            self.copy = Copy(self.copy.path, start, self.copy.index)
            await self.trees.copies.make_copy(self.copy, "", spec.ignored)
        else:
            self.copy = Copy(self.copy.path, spec.base, self.copy.index)
            await self.trees.copies.make_copy(self.copy, spec.patch, spec.ignored)
        if spec.writable:
            self._start_size = await asyncio.to_thread(written_size, self.copy.path)
        self._made = True

    def written(self) -> int:
        if not self._made or not self.spec.writable:
            return 0
        return max(0, written_size(self.copy.path) - self._start_size)

    async def close(self, *, keep_for: str | None = None) -> Change | None:
        if not self._made or not self.spec.writable:
            self.discard()
            return None
        try:
            change = await self.change_so_far()
        except BaseException:
            self.discard()
            raise
        return self._kept_or_gone(change, keep_for)

    async def change_so_far(self) -> Change:
        if not self._made or not self.spec.writable:
            raise TreeError("only an open, writable workspace has a change")
        return await self.trees.copies.change_of(self.copy, self.workspaces.limits)

    def discard(self) -> None:
        self.trees.copies.discard(self.copy)


def _empty(directory: Path) -> bool:
    try:
        with os.scandir(directory) as entries:
            return next(entries, None) is None
    except OSError:
        return False
