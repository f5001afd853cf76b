"""A checkout made of hard links to the working directory's files that hold the snapshot.

Writing every file of a large tree once more costs what the tree weighs, in time and in disk.
Most of a snapshot is the working directory's own files, unchanged: the index the snapshot
was hashed with says which (a file whose inode, size and modification time are still those
the index recorded holds the blob the index names, as git itself trusts). Such a file is
linked, which costs a directory entry; every other file (edited since, racily clean, a
symbolic link, on another file system) is written from the store. The checkout's index is
that snapshot index, so git trusts the links' stat data and never hashes them again.

Nothing may ever write through a link into the user's file: git replaces a file it updates
(unlinks it, then creates it anew), the agents write their overlay's upper layer only, and
the checkout's ``.git`` is orchmode's own files. A link changes its file's ctime, so every
git that compares the two (the checkout's, the snapshot's) is told not to trust ctime.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from .git import _Work

#: Variables that tell git not to trust ctime, which a link changes (modification times,
#: inodes and sizes still count).
NO_CTIME = {
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "core.trustctime",
    "GIT_CONFIG_VALUE_0": "false",
}
#: What a link refused for the whole tree looks like: the checkout is written instead.
#: An index keeps the low 32 bits of an inode number and a size.
_INDEXED = 0xFFFFFFFF
_NOT_HERE = {errno.EXDEV, errno.EPERM, errno.EACCES, errno.EMLINK, errno.ENOTSUP, errno.EROFS}


@dataclass(frozen=True)
class SnapshotIndex:
    """The index one snapshot was hashed with, and the directory its paths are in."""

    commit: str
    path: Path
    top: Path


#: One entry of ``git ls-files -s --debug -z``: mode, blob, stage, path, then its stat.
_ENTRY = re.compile(
    rb"([0-7]+) ([0-9a-f]+) ([0-3])\t([^\0]*)\0"
    rb"  ctime: [0-9]+:[0-9]+\n  mtime: ([0-9]+):([0-9]+)\n  dev: [0-9]+\tino: ([0-9]+)\n"
    rb"  uid: [0-9]+\tgid: [0-9]+\n  size: ([0-9]+)\tflags: [0-9a-f]+\n"
)


class _Entry(NamedTuple):
    mode: int
    path: str
    mtime_ns: int
    ino: int
    size: int


def link_checkout(work: _Work, index: SnapshotIndex, path: Path, env: dict[str, str]) -> int:
    """Fill the empty checkout ``path`` (its ``.git`` made) with ``index.commit``: links
    where they can be made, the rest written from the store; the links made. The index
    becomes the checkout's own.

    ``env`` reaches the store with the checkout's index and work tree. Returns -1, having
    written nothing, when the index does not hold the commit's tree exactly (the caller
    then checks the tree out as usual).
    """
    target = Path(env["GIT_INDEX_FILE"])
    try:
        os.replace(index.path, target)  # moved, not copied: its time kept, no second copy
    except OSError:
        return -1  # a later snapshot's took its place
    _, out = work.git("ls-files", "-s", "--debug", "-z", env=env, cwd=path)
    entries = parse_debug(out)
    _, tree = work.git("write-tree", env=env, cwd=path, ok=(0, 128))
    _, wanted = work.git("rev-parse", f"{index.commit}^{{tree}}", env=env, cwd=path)
    if tree.strip() != wanted.strip() or entries is None:
        target.unlink()
        return -1
    indexed_at = os.stat(target).st_mtime_ns
    rest: list[str] = []
    linked = 0
    linking = True
    top, checkout = f"{index.top}/", f"{path}/"
    made: set[str] = set()
    for entry in entries:
        if linking and _same_file(top + entry.path, entry, indexed_at):
            try:
                _link(top, checkout, entry.path, made)
                linked += 1
                continue
            except OSError as exc:
                linking = exc.errno not in _NOT_HERE
        rest.append(entry.path)
    if rest:
        listing = b"\0".join(p.encode(errors="surrogateescape") for p in rest) + b"\0"
        work.git("checkout-index", "-f", "-u", "-z", "--stdin", env=env, cwd=path, data=listing)
    return linked


def _same_file(name: str, entry: _Entry, indexed_at: int) -> bool:
    """Whether the working directory's file is still the one the index recorded, and the
    record trustworthy (not racily clean: modified before the index was written)."""
    if not stat.S_ISREG(entry.mode) or entry.mtime_ns >= indexed_at:
        return False
    try:
        now = os.lstat(name)
    except OSError:
        return False
    return (
        stat.S_ISREG(now.st_mode)
        and now.st_ino & _INDEXED == entry.ino
        and now.st_size & _INDEXED == entry.size
        and now.st_mtime_ns == entry.mtime_ns
        and bool(now.st_mode & 0o100) == bool(entry.mode & 0o100)
    )


def _link(top: str, checkout: str, name: str, made: set[str]) -> None:
    """Link ``top``'s file ``name`` into ``checkout`` (both paths end in ``/``)."""
    parent = os.path.dirname(name)
    if parent and parent not in made:
        os.makedirs(checkout + parent, exist_ok=True)
        made.add(parent)
    os.link(top + name, checkout + name, follow_symlinks=False)


def parse_debug(out: bytes) -> list[_Entry] | None:
    """The entries of ``git ls-files -s --debug -z``; None for an index this cannot read
    whole, or with an entry not merged (its files are then checked out as usual)."""
    entries: list[_Entry] = []
    at = 0
    for match in _ENTRY.finditer(out):
        mode, _, stage, name, seconds, nanos, ino, size = match.groups()
        if match.start() != at or stage != b"0":
            return None
        at = match.end()
        entries.append(
            _Entry(
                int(mode, 8),
                name.decode(errors="surrogateescape"),
                int(seconds) * 1_000_000_000 + int(nanos),
                int(ino),
                int(size),
            )
        )
    return entries if at == len(out) else None
