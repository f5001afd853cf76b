"""An agent's change, read from the upper layer of its overlay: what it wrote, nothing more.

overlayfs keeps in the upper layer exactly what the agent changed: each file it wrote
(copied up whole), a whiteout (a 0/0 character device) for each name it deleted, and an
opaque mark on each directory it replaced. So the change is read without walking the tree
or hashing anything the agent left alone:

1. the upper layer is walked, and turned into edits: put this file at this path, remove
   that path (a file or a whole directory);
2. new files that git would ignore are dropped, as ``git add -A`` drops them; a file
   created then deleted left nothing to walk;
3. the snapshot's tree is rewritten along the edited paths only (each directory on the
   way read with ``git cat-file``, rewritten here and written with ``git hash-object``),
   and the edited files are hashed into the private store;
4. the patch is ``git diff-tree`` between the snapshot's tree and the new one, in the
   very form ``git diff --binary`` gives (pinned, whatever the user's settings).

Every step costs what the agent wrote, whatever the repository's size.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..core.programs import program
from .git import TreeError, _Work
from .limits import DiskLimits, left_out_of

#: overlayfs marks a directory that hides what the layers below hold there.
OPAQUE = "user.overlay.opaque"
#: Top-level names in a workspace that are never part of a change: the agent's own git
#: directory, and where orchmode's state is hidden.
NOT_THE_TREE = frozenset({b".git", b".orchmode"})
#: git's modes.
TREE, REGULAR, EXECUTABLE, SYMLINK, GITLINK = b"40000", b"100644", b"100755", b"120000", b"160000"

#: A directory's entries: name → (mode, object id as hex).
Entries = dict[bytes, tuple[bytes, str]]


@dataclass
class _Node:
    """The edits at one path: removed first (``gone``), then a file put there, or edits
    to the directory's entries."""

    gone: bool = False
    put: tuple[bytes, Path, bool] | None = None  # mode, where its content is, is a link
    children: dict[bytes, _Node] = field(default_factory=dict)

    def child(self, name: bytes) -> _Node:
        node = self.children.get(name)
        if node is None:
            node = self.children[name] = _Node()
        return node


def is_whiteout(mode: int, rdev: int) -> bool:
    return stat.S_ISCHR(mode) and rdev == 0


def scan_upper(upper: Path) -> _Node:
    """The edits an upper layer holds, as a tree of :class:`_Node`."""
    root = _Node()
    _scan(upper, root, top=True)
    return root


def _scan(directory: Path, node: _Node, *, top: bool = False) -> None:
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return
    for entry in entries:
        name = os.fsencode(entry.name)
        if top and name in NOT_THE_TREE:
            continue
        info = entry.stat(follow_symlinks=False)
        path = Path(entry.path)
        if is_whiteout(info.st_mode, info.st_rdev):
            node.child(name).gone = True
        elif stat.S_ISDIR(info.st_mode):
            child = node.child(name)
            with contextlib.suppress(OSError):
                if os.getxattr(path, OPAQUE, follow_symlinks=False) == b"y":
                    child.gone = True
            _scan(path, child)
            if not child.gone and not child.children:
                del node.children[name]  # an untouched directory, copied up on the way
        elif stat.S_ISLNK(info.st_mode):
            node.child(name).put = (SYMLINK, path, True)
        elif stat.S_ISREG(info.st_mode):
            mode = EXECUTABLE if info.st_mode & stat.S_IXUSR else REGULAR
            node.child(name).put = (mode, path, False)
        # fifos, sockets and devices: git keeps none of them, nor does a change


class TreeReader:
    """Reads tree objects from a store, one ``git cat-file --batch`` for all of them."""

    def __init__(self, work: _Work, env: Mapping[str, str], cwd: Path) -> None:
        self._process = work.start("cat-file", "--batch", env=env, cwd=cwd)
        self._cache: dict[str, Entries] = {}

    def entries(self, tree: str) -> Entries:
        cached = self._cache.get(tree)
        if cached is not None:
            return cached
        process = self._process
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(tree.encode() + b"\n")
        process.stdin.flush()
        header = process.stdout.readline().split()
        if len(header) != 3 or header[1] != b"tree":
            raise TreeError(f"git cat-file: {tree} is not a tree ({b' '.join(header)!r})")
        body = process.stdout.read(int(header[2]) + 1)[:-1]
        entries = parse_tree(body)
        self._cache[tree] = entries
        return entries

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self._process.stdin is not None:
                self._process.stdin.close()
        self._process.wait()


def parse_tree(body: bytes) -> Entries:
    entries: Entries = {}
    at = 0
    while at < len(body):
        space = body.index(b" ", at)
        nul = body.index(b"\0", space)
        entries[body[space + 1 : nul]] = (body[at:space], body[nul + 1 : nul + 21].hex())
        at = nul + 21
    return entries


def tree_body(entries: Entries) -> bytes:
    """A tree object's content, its entries in git's order (a directory sorts as ``name/``)."""

    def key(item: tuple[bytes, tuple[bytes, str]]) -> bytes:
        name, (mode, _) = item
        return name + b"/" if mode == TREE else name

    return b"".join(
        mode + b" " + name + b"\0" + bytes.fromhex(oid)
        for name, (mode, oid) in sorted(entries.items(), key=key)
    )


def object_id(kind: bytes, body: bytes) -> str:
    return hashlib.sha1(kind + b" %d\0" % len(body) + body, usedforsecurity=False).hexdigest()


def tracked_paths(root: _Node, base: str, reader: TreeReader) -> set[bytes]:
    """The paths put by ``root`` that the base tree holds as a file: their edits always
    count; any other put is a new file, which git may ignore."""
    tracked: set[bytes] = set()

    def visit(node: _Node, entries: Entries | None, prefix: bytes) -> None:
        for name, child in node.children.items():
            entry = entries.get(name) if entries is not None else None
            path = prefix + name
            if child.put is not None:
                if entry is not None and entry[0] != TREE:
                    tracked.add(path)
            elif child.children:
                below = reader.entries(entry[1]) if entry is not None and entry[0] == TREE else None
                visit(child, below, path + b"/")

    visit(root, reader.entries(base), b"")
    return tracked


def puts_of(root: _Node) -> list[tuple[bytes, _Node]]:
    found: list[tuple[bytes, _Node]] = []

    def visit(node: _Node, prefix: bytes) -> None:
        for name, child in node.children.items():
            if child.put is not None:
                found.append((prefix + name, child))
            else:
                visit(child, prefix + name + b"/")

    visit(root, b"")
    return found


def drop(root: _Node, paths: Iterable[bytes]) -> None:
    """Remove the puts at ``paths`` (ignored new files): as if they were never written."""
    for path in paths:
        *parents, last = path.split(b"/")
        node: _Node | None = root
        for name in parents:
            node = node.children.get(name) if node is not None else None
        if node is not None and last in node.children:
            child = node.children[last]
            if child.gone:
                child.put = None  # the removal of what was there still stands
            else:
                del node.children[last]


def hash_contents(
    work: _Work, root: _Node, env: Mapping[str, str], cwd: Path, scratch: Path
) -> dict[int, str]:
    """Every put's content written to the store as a blob, by node; one git for all.

    A link's blob is its target; a name ``--stdin-paths`` cannot carry (a newline in it)
    is hashed from a copy.
    """
    puts = puts_of(root)
    if not puts:
        return {}
    paths: list[str] = []
    for n, (_, node) in enumerate(puts):
        assert node.put is not None
        _, source, link = node.put
        name = os.fsdecode(source)
        if link or "\n" in name or "\r" in name:
            stand_in = scratch / f"blob-{n}"
            if link:
                stand_in.write_bytes(os.fsencode(os.readlink(source)))
            else:
                with open(source, "rb") as src, open(stand_in, "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
            name = str(stand_in)
        paths.append(name)
    listing = "\n".join(paths).encode(errors="surrogateescape") + b"\n"
    _, out = work.git(
        "hash-object", "-w", "--no-filters", "--stdin-paths", env=env, cwd=cwd, data=listing
    )
    ids = out.decode().split()
    if len(ids) != len(puts):
        raise TreeError("git hash-object did not hash every file of the layer")
    return {id(node): oid for (_, node), oid in zip(puts, ids, strict=True)}


class TreeWriter:
    """The rewritten trees, hashed here and written to the store by one git at the end."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.bodies: dict[str, bytes] = {}

    def add(self, entries: Entries) -> str:
        body = tree_body(entries)
        oid = object_id(b"tree", body)
        self.bodies[oid] = body
        return oid

    def flush(self, work: _Work, env: Mapping[str, str], cwd: Path) -> None:
        if not self.bodies:
            return
        paths = []
        for oid, body in self.bodies.items():
            path = self.scratch / f"tree-{oid}"
            path.write_bytes(body)
            paths.append(str(path))
        listing = "\n".join(paths).encode(errors="surrogateescape") + b"\n"
        _, out = work.git(
            "hash-object", "-w", "-t", "tree", "--stdin-paths", env=env, cwd=cwd, data=listing
        )
        if out.decode().split() != list(self.bodies):
            raise TreeError("git wrote other trees than the layer's")


def rewrite(
    root: _Node, base: str, reader: TreeReader, blobs: Mapping[int, str], writer: TreeWriter
) -> str:
    """The tree ``base`` with the edits of ``root``; the empty tree if nothing is left."""

    def visit(node: _Node, entry: tuple[bytes, str] | None) -> tuple[bytes, str] | None:
        if node.put is not None:
            mode = node.put[0]
            return mode, blobs[id(node)]
        if entry is not None and entry[0] == GITLINK:
            return entry  # a submodule is shown as an empty directory; nothing in it counts
        starts_empty = node.gone or entry is None or entry[0] != TREE
        entries: Entries = {} if starts_empty or entry is None else dict(reader.entries(entry[1]))
        for name, child in node.children.items():
            new = visit(child, entries.get(name))
            if new is None:
                entries.pop(name, None)
            else:
                entries[name] = new
        if not entries:
            return None
        unchanged = entry is not None and not starts_empty and entries == reader.entries(entry[1])
        if unchanged:
            return entry
        return TREE, writer.add(entries)

    result = visit(root, (TREE, base))
    return result[1] if result is not None else writer.add({})


#: ``git diff`` options pinned so that no setting of the user's changes the patch's form.
PATCH_FORM = (
    "-c", "core.quotePath=true", "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false",
)  # fmt: skip
PATCH_FLAGS = (
    "--binary", "--full-index", "-M", "--no-color", "--no-ext-diff", "--no-textconv",
    "--src-prefix=a/", "--dst-prefix=b/",
)  # fmt: skip


def read_layer(
    work: _Work,
    upper: Path,
    base: str,
    store_env: Mapping[str, str],
    cwd: Path,
    ignored: Callable[[_Work, list[bytes], bool], set[bytes]],
    limits: DiskLimits | None = None,
) -> tuple[str, str, tuple[str, ...]]:
    """The tree ``upper`` makes of the tree ``base``, the patch between them, and the files
    left out of it as too big (see :func:`.limits.left_out_of`; none without ``limits``).

    ``ignored(work, paths, exact)`` says which of the new files (paths relative to the
    tree) git ignores; ``exact`` when the layer touched a ``.gitignore``, so that only the
    merged view can tell. A file too big is measured here, in the layer, and never handed
    to git: it stays as the snapshot had it.
    """
    root = scan_upper(upper)
    if not root.children:
        return base, "", ()
    left: tuple[str, ...] = ()
    with tempfile.TemporaryDirectory(prefix="orchmode-layer-") as scratch_dir:
        scratch = Path(scratch_dir)
        reader = TreeReader(work, store_env, cwd)
        try:
            tracked = tracked_paths(root, base, reader)
            new = [path for path, _ in puts_of(root) if path not in tracked]
            if new:
                drop(root, ignored(work, new, has_gitignore(root)))
            if limits is not None:
                too_big = left_out_of(_sizes(root), limits)
                drop(root, (os.fsencode(path) for path in too_big))
                left = tuple(too_big.values())
            blobs = hash_contents(work, root, store_env, cwd, scratch)
            writer = TreeWriter(scratch)
            tree = rewrite(root, base, reader, blobs, writer)
        finally:
            reader.close()
        writer.flush(work, store_env, cwd)
    if tree == base:
        return base, "", left
    _, out = work.git(
        *PATCH_FORM, "diff-tree", "-p", *PATCH_FLAGS, base, tree, env=store_env, cwd=cwd
    )
    return tree, out.decode(errors="surrogateescape"), left


def _sizes(root: _Node) -> dict[str, int]:
    """The size of each file the layer puts (by path); a link's is its target's length."""
    sizes: dict[str, int] = {}
    for path, node in puts_of(root):
        assert node.put is not None
        with contextlib.suppress(OSError):
            sizes[os.fsdecode(path)] = os.lstat(node.put[1]).st_size
    return sizes


def check_ignore(
    work: _Work, paths: list[bytes], env: Mapping[str, str], cwd: Path, wrap: list[str] | None
) -> set[bytes]:
    """Which of ``paths`` git ignores, judged in the work tree ``env`` names (run through
    ``wrap`` when that tree is an overlay that must be mounted first)."""
    listing = b"\0".join(paths) + b"\0"
    args = ("check-ignore", "-z", "--stdin", "--no-index")
    if wrap is None:
        code, out = work.git(*args, env=env, cwd=cwd, data=listing, ok=(0, 1))
    else:
        argv = [*wrap, program("git"), *args]
        code, out = work.run(argv, env=env, cwd=cwd, data=listing, ok=(0, 1))
    return {p for p in out.split(b"\0") if p} if code == 0 else set()


def has_gitignore(root: _Node) -> bool:
    """Whether the layer puts or removes a ``.gitignore`` anywhere."""
    stack = [root]
    while stack:
        node = stack.pop()
        for name, child in node.children.items():
            if name == b".gitignore":
                return True
            if child.gone and child.children:
                return True  # a directory replaced: the one it hid may have held one
            stack.append(child)
    return False
