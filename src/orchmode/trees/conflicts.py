"""Conflicts: a change merged anyway, markers and all, for a resolver to finish.

A change that conflicts with the tree as merged so far is merged into it with git's conflict
markers where the two disagree. The resolver's workspace shows that tree; its first message
shows every conflicted hunk; and its result is checked for markers left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core.results import Change
from .checkout import Checkout
from .git import TreeError
from .merges import Merges
from .store import TreeStore

#: Lines of context shown around a conflicted hunk.
HUNK_CONTEXT = 3
#: A conflicted file's text shown at most (a bigger one is cut, and says so).
MAX_HUNKS_CHARS = 40_000


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


class Conflicts:
    """Works out a change's conflict with the working directory, and what a resolver left."""

    def __init__(self, store: TreeStore, checkout: Checkout, merges: Merges) -> None:
        self.store = store
        self.checkout = checkout
        self.merges = merges

    async def conflict_of(self, change: Change, label: str) -> Conflict | None:
        """``change`` merged into the working directory as it is now, conflict markers and
        all (``label`` names the change in them); None when it merges cleanly, or when its
        conflict is not one of content that an agent can edit (its snapshot is gone, it
        does not apply to it, or the working directory changed under the merge)."""
        store = self.store
        await store.open()
        if not await store.has(change.base):
            return None
        theirs = await asyncio.shield(self.merges.merge_ahead(change))
        if theirs is None:
            return None
        index = store.scratch_index("conflict")
        try:
            ours_tree = await self.checkout.tree_now(index)
        finally:
            with contextlib.suppress(OSError):
                index.unlink()
        ours = await store.commit(ours_tree, change.base)
        other = await store.commit(theirs, change.base)
        code, out = await self._merge_tree(ours, other, label)
        if code == 0:
            return None
        head, _, messages = out.decode(errors="surrogateescape").partition("\n\n")
        lines = head.splitlines()
        tree, files = lines[0].strip(), tuple(dict.fromkeys(f for f in lines[1:] if f))
        commit = await store.commit(tree, change.base)
        patch = await store.diff(change.base, tree)
        hunks = await self._hunks(tree, files, ("as-merged", label))
        said = tuple(line for line in messages.splitlines() if line.startswith("CONFLICT"))
        return Conflict(ours, tree, commit, patch, files, said, hunks, ("as-merged", label))

    async def _merge_tree(self, ours: str, other: str, label: str) -> tuple[int, bytes]:
        """``git merge-tree`` of the two commits, under branch names that label the markers
        (the branches are gone again after it)."""
        ours_ref, theirs_ref = "refs/heads/as-merged", f"refs/heads/{label}"
        try:
            await self.store.git("update-ref", ours_ref, ours)
            await self.store.git("update-ref", theirs_ref, other)
            return await self.store.git(
                "-c", "merge.conflictStyle=merge", "merge-tree", "--write-tree",
                "--name-only", "as-merged", label, ok=(0, 1),
            )  # fmt: skip
        finally:
            for ref in (ours_ref, theirs_ref):
                with contextlib.suppress(TreeError):
                    await self.store.git("update-ref", "-d", ref)

    async def edited_besides(
        self, base: str, files: Sequence[str], changes: Sequence[Change], ours: str
    ) -> bool:
        """Whether ``files`` in ``ours`` (the working directory as merged so far) are more
        than ``changes`` made of them in ``base``: the user edited them meanwhile. Worked
        out on an index that holds these files alone."""
        store = self.store
        index = store.scratch_index("edited")
        try:
            _, listed = await store.git("ls-tree", "-z", base, "--", *files, index=index)
            info = listed.replace(b"\0", b"\n")
            await store.git("update-index", "--index-info", index=index, data=info)
            include = [f"--include={name}" for name in files]
            for change in changes:
                code, _ = await store.git(
                    "apply", "--cached", "--binary", *include, "-", index=index,
                    data=change.patch.encode(errors="surrogateescape"), ok=(0, 1),
                )  # fmt: skip
                if code != 0:
                    return True
            _, mine = await store.git("ls-files", "-s", "-z", index=index)
            _, theirs = await store.git("ls-tree", "-z", ours, "--", *files, index=index)
        finally:
            with contextlib.suppress(OSError):
                Path(index).unlink()
        return _blobs(mine, 1) != _blobs(theirs, 2)

    async def markers_left(self, tree: str, conflict: Conflict) -> list[str]:
        """The conflicted files of ``tree`` that still hold the conflict's marker lines."""
        starts = tuple(f"{mark} {label}".encode() for mark, label in zip(
            ("<<<<<<<", ">>>>>>>"), conflict.labels, strict=True
        ))  # fmt: skip
        left = []
        for name in conflict.files:
            blob = await self.store.blob(tree, name)
            if blob is not None and any(
                line.rstrip(b"\r").startswith(starts) for line in blob.split(b"\n")
            ):
                left.append(name)
        return left

    async def _hunks(self, tree: str, files: Sequence[str], labels: tuple[str, str]) -> str:
        """The conflicted parts of ``files`` in ``tree``, with a little context."""
        parts: list[str] = []
        for name in files:
            blob = await self.store.blob(tree, name)
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


def _blobs(listing: bytes, at: int) -> dict[bytes, bytes]:
    """Each path's blob id in ``ls-files -s`` (field 1) or ``ls-tree`` (field 2) output."""
    entries = (e.partition(b"\t") for e in listing.split(b"\0") if e)
    return {name: meta.split()[at] for meta, _, name in entries}


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
