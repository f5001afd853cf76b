"""Merging changes into the working directory: three-way, each whole or not at all.

A change is a patch against its snapshot. It is merged three-way (``git merge-tree``) into
the tree the changes before it made, in the private store; the working directory is written
once, at the end, by the session's checkout (:mod:`.checkout`). What each change makes of
its own snapshot is worked out ahead (:meth:`Merges.merge_ahead`), while its verifier runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..core.results import Change
from ..core.secrets import Secrets
from .checkout import Checkout
from .patches import FileChange, PatchSummary, summary_of
from .refusals import refusals
from .store import TreeStore

Fate = Literal["merged", "conflict", "refused", "no change"]


@dataclass(frozen=True)
class Merge:
    """What became of one patch."""

    fate: Fate
    #: For a conflict, the files in conflict; for a refusal, the reasons.
    detail: tuple[str, ...] = ()
    #: The tree it made (of the working directory and the changes before it), if merged.
    tree: str = ""


class Merges:
    """Merges changes into the working directory, and works out ahead what each makes."""

    def __init__(
        self, store: TreeStore, checkout: Checkout, secrets: Secrets | None = None
    ) -> None:
        self.store = store
        self.checkout = checkout
        #: The secret files a change may not write.
        self.secrets = secrets
        #: The tree each change makes of its snapshot, worked out ahead.
        self._theirs: dict[tuple[str, str], asyncio.Task[str | None]] = {}

    def close(self) -> None:
        for task in self._theirs.values():
            task.cancel()
        self._theirs.clear()

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
        store, checkout = self.store, self.checkout
        await store.open()
        stem = store.name("merge")
        index = store.run / f"{stem}.index"
        try:
            if checkout.presumed is not None:
                merges, moved = await self._merge_from(checkout.presumed, changes, index)
                if not moved:
                    return merges
            start = await checkout.tree_now(index)
            checkout.presumed = start
            merges, moved = await self._merge_from(start, changes, index)
            if not moved:
                return merges
            detail = tuple(f"{p} (changed while merging)" for p in moved)
            return [Merge("conflict", detail) if m.fate == "merged" else m for m in merges]
        finally:
            for leftover in store.run.glob(f"{stem}*"):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    async def _merge_from(
        self, start: str, changes: Sequence[Change], index: Path
    ) -> tuple[list[Merge], list[str]]:
        """The merges from the tree ``start``, written out; or the files that turned out
        to differ on disk from ``start`` (then nothing was written)."""
        merges = await self.merged_onto(start, changes, index)
        current = next((m.tree for m in reversed(merges) if m.fate == "merged"), start)
        if current != start:
            moved = await self.checkout.write_out(start, current, index)
            if moved:
                return merges, moved
            self.checkout.presumed = current
        return merges, []

    async def merged_onto(self, start: str, changes: Sequence[Change], index: Path) -> list[Merge]:
        """``changes`` merged in order onto the tree ``start``, in the store only, each
        all or nothing: a merged one's tree holds it and every merged one before it."""
        current = start
        merges: list[Merge] = []
        for change in changes:
            merge = await self._combine(change, current, index)
            merges.append(merge)
            if merge.fate == "merged":
                current = merge.tree
        return merges

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

    def know(self, change: Change, tree: str) -> None:
        """The tree ``change`` makes of its base, already known (read from its layer): its
        merge need not work it out again."""
        key = (change.base, change.digest)
        if key not in self._theirs:
            task = asyncio.create_task(self._known_tree(tree, change.base))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._theirs[key] = task

    async def _known_tree(self, tree: str, base: str) -> str | None:
        await self.store.commit(tree, base)  # its merge's commit, made ahead
        return tree

    async def _theirs_tree(self, change: Change) -> str | None:
        store = self.store
        await store.open()
        if not await store.has(change.base):
            return None
        index = store.scratch_index("theirs")
        try:
            tree = await store.applied(await store.tree_of(change.base), change.patch, index)
        finally:
            with contextlib.suppress(OSError):
                index.unlink()
        if tree is not None:
            await store.commit(tree, change.base)  # its merge's commit, made ahead too
        return tree

    async def _merge(self, change: Change, index: Path, ours: str, *, check_links: bool) -> Merge:
        store = self.store
        based = await store.has(change.base)
        base_tree = await store.tree_of(change.base) if based else ours
        if based:
            theirs = await asyncio.shield(self.merge_ahead(change))
            if theirs is None:
                return Merge("conflict", ("it does not apply to its own snapshot",))
        else:  # its snapshot is gone (another machine's journal): it must fit as things are
            theirs = await store.applied(ours, change.patch, index)
            if theirs is None:
                why = "its snapshot is gone and it does not apply to the tree as it is"
                return Merge("conflict", (why,))
        links = await self._link_refusals(base_tree, theirs) if check_links else []
        if links:
            return Merge("refused", tuple(links))
        if not based or ours == base_tree:
            return Merge("merged", tree=theirs)
        mine = await store.commit(ours, change.base)
        other = await store.commit(theirs, change.base)
        code, out = await store.git(
            "merge-tree", "--write-tree", "--name-only", "--no-messages", mine, other, ok=(0, 1)
        )
        lines = out.decode(errors="surrogateescape").splitlines()
        if code != 0:
            conflicts = tuple(dict.fromkeys(line for line in lines[1:] if line))
            return Merge("conflict", conflicts)
        return Merge("merged", tree=lines[0].strip())

    async def _link_refusals(self, before: str, after: str) -> list[str]:
        """Refusals for the symbolic links the change leaves, judged on the trees: a link
        moved by a pure rename has no mode in the patch text, but it has one here."""
        _, out = await self.store.git("diff-tree", "-r", "-z", "--no-renames", before, after)
        fields = out.split(b"\0")
        links: list[FileChange] = []
        for meta, raw in zip(fields[::2], fields[1::2], strict=False):
            parts = meta.decode().lstrip(":").split()
            if len(parts) < 5 or parts[1] != "120000":
                continue
            _, target = await self.store.git("cat-file", "blob", parts[3])
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
