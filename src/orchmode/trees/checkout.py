"""The session's checkout: the user's working directory, read as a tree and written whole.

A merge is written into the working directory all at once or not at all. While it writes,
its intent (the tree before and the tree merged) is on disk: a process killed in the middle
leaves it, and the next merge here finishes the write first
(:meth:`Checkout.finish_interrupted_write`), so no change is ever left written in part.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

from ..core.secrets import Secrets
from ..core.wording import listed
from .git import TreeError, copy_index, git
from .runs import remove_index
from .store import TREES_DIR, TreeStore

log = logging.getLogger("orchmode")

#: For each path that differs between two trees: its blob before (None: not there).
Before = dict[str, str | None]
#: For each path that is there after: its mode and blob.
After = dict[str, tuple[str, str]]


class Checkout:
    """The working directory as a tree of the store, and merges written into it."""

    def __init__(self, store: TreeStore, secrets: Secrets | None = None) -> None:
        self.store = store
        self.workdir = store.workdir
        #: The secret files a tree of the working directory leaves out.
        self.secrets = secrets
        #: The tree the working directory is taken to hold, until a merge finds otherwise:
        #: the last snapshot's, then each merge's.
        self.presumed: str | None = None

    @property
    def intent(self) -> Path:
        """Where a write into the working directory says, while it lasts, what it writes."""
        return self.store.home / "merge.intent"

    # ------------------------------------------------------------------------ reading

    async def tree_now(self, index: Path) -> str:
        """The working directory's tree as it is now (secret files left out, as a
        snapshot leaves them out)."""
        repo = self.store.repo
        env = self.store.workdir_env(index)
        if repo is not None and (repo.git_dir / "index").is_file():
            with contextlib.suppress(OSError):
                copy_index(repo.git_dir / "index", index)  # its stat cache saves hashing
        prefix = repo.prefix if repo is not None else ""
        withheld = sorted(await asyncio.to_thread(self._withheld))
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

    def _withheld(self) -> set[str]:
        """The secret files in the working directory now (their values are learnt for
        masking)."""
        if self.secrets is None:
            return set()
        return set(self.secrets.look())

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

    # ------------------------------------------------------------------------ writing

    async def write_out(self, ours: str, merged: str, index: Path) -> list[str]:
        """Write the files that differ between the tree as it was and the merged one, after
        checking that none of them changed on disk; the ones that did (nothing written)."""
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

    async def finish_interrupted_write(self) -> list[str]:
        """Finish the write into the working directory that a process killed while it
        wrote left half done (its intent is still on disk): every file it was to write is
        written, every one it was to delete is deleted, so the directory holds the merge
        whole, as if the process had not been killed. The paths, if there was one. Called
        with the merge lock held (no other process is writing)."""
        await self.store.open()
        try:
            words = self.intent.read_text().split()
        except FileNotFoundError:
            return []
        if len(words) != 2 or not all(_is_object_id(w) for w in words):
            # Cut while it was written: the write it announced had not begun.
            self.intent.unlink(missing_ok=True)
            return []
        ours, merged = words
        index = self.store.scratch_index("finish")
        try:
            before, after = await self._files_between(ours, merged, index)
            kept, unexpected = await self._keep_unexpected(before, after)
            await self._write_files(before, after, index)
        finally:
            remove_index(index)
        self.intent.unlink(missing_ok=True)
        self.presumed = None  # the directory is read again by the next merge
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

    async def _keep_unexpected(self, before: Before, after: After) -> tuple[Path, list[str]]:
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

    async def _files_between(self, ours: str, merged: str, index: Path) -> tuple[Before, After]:
        """The paths that differ between two trees: each one's blob in ``ours`` (None: not
        there), and the mode and blob in ``merged`` of each one that is there."""
        _, out = await self.store.git(
            "diff-tree", "-r", "-z", "--no-renames", ours, merged, index=index
        )
        fields = out.split(b"\0")
        before: Before = {}
        after: After = {}
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

    async def _write_files(self, before: Before, after: After, index: Path) -> None:
        """Delete what ``after`` lacks of ``before``; write ``after``'s files."""
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
            await self.store.git("update-index", "-z", "--index-info", index=index, data=info)
            work = {**self.store.env(index), "GIT_WORK_TREE": str(self.workdir)}
            listing = b"\0".join(p.encode(errors="surrogateescape") for p in after) + b"\0"
            await git(
                "checkout-index", "-f", "-z", "--stdin", env=work, cwd=self.workdir, data=listing
            )

    async def _changed_since(self, expected: Before) -> list[str]:
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


def _is_object_id(word: str) -> bool:
    return len(word) in (40, 64) and all(c in "0123456789abcdef" for c in word)
