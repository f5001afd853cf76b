"""Snapshots: the working directory at one moment, hashed into the private store.

The user's repository is only read. A snapshot hashes the working tree with a private index
(a copy of the user's, for its stat cache) and writes its objects into the private store; no
index, HEAD, branch, stash, config or worktree list of the user's is touched. Secret files
are left out, and so are untracked files past :data:`MAX_UNTRACKED_MB`: each agent's copy
would hold them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..core.secrets import Secrets
from .checkout import Checkout
from .git import TreeError, _Work, copy_index, on_thread
from .links import SnapshotIndex
from .runs import remove_index
from .store import TreeStore

log = logging.getLogger("orchmode")

#: Ignored entries shown read-only in a copy at most; past this the rest are left out.
MAX_SHOWN = 200
#: Megabytes of untracked, unignored files a snapshot takes at most: each copy holds them
#: all, so a forgotten data directory would be copied once per agent.
MAX_UNTRACKED_MB = 200
#: Times a snapshot reads the tree before it gives up on files that change as it reads them,
#: pausing 10 ms, then twice as long each time (1.3 s in all): a database written without
#: pause (its log cut short at each checkpoint) spoils a read a quarter of the time on a
#: busy machine.
SNAPSHOT_ATTEMPTS = 8
SNAPSHOT_PAUSE = 0.01

_STATUS = (
    "status", "--porcelain=v2", "-z", "--no-renames", "--untracked-files=all",
    "--ignored=matching", "--ignore-submodules=all", "--", ".",
)  # fmt: skip


class TooMuchUntracked(TreeError):
    """The snapshot would hold more untracked files than a workspace may (not retried)."""


@dataclass(frozen=True)
class Snapshot:
    """The working directory at one moment, as a commit in the private store."""

    commit: str
    #: Ignored entries (relative paths, a directory's with a trailing ``/``): not copied,
    #: shown read-only from the working directory instead.
    ignored: tuple[str, ...] = ()


class Snapshots:
    """Takes snapshots of the working directory into the store."""

    def __init__(self, store: TreeStore, checkout: Checkout, secrets: Secrets | None) -> None:
        self.store = store
        self.checkout = checkout
        #: The secret files a snapshot leaves out.
        self.secrets = secrets
        self._looker: ThreadPoolExecutor | None = None

    def close(self) -> None:
        if self._looker is not None:
            self._looker.shutdown(wait=True)
            self._looker = None

    async def snapshot(self) -> Snapshot:
        """The working directory now: tracked, untracked-but-not-ignored, uncommitted.

        One walk of the tree (``git status``, with the user's index for its stat cache),
        then only the files it names as changed or new are hashed.
        """
        store = self.store
        await store.open()
        index = store.scratch_index("snapshot")
        try:
            for attempt in range(1, SNAPSHOT_ATTEMPTS + 1):
                remove_index(index)  # and the lock a git stopped by a signal leaves
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
            _, out = await store.git("commit-tree", tree, "-m", "orchmode snapshot")
            commit = out.decode().strip()
        except BaseException:
            remove_index(index)
            raise
        self._offer(commit, index)
        store.remember(commit, tree)
        self.checkout.presumed = tree
        return Snapshot(commit, ignored)

    def _offer(self, commit: str, index: Path) -> None:
        """Hand the index the snapshot was hashed with to the checkouts: its stat data says
        which of the working directory's files a checkout can link (paths from the top
        only: a subdirectory's snapshot is a subtree, which the index does not match)."""
        repo = self.store.repo
        if repo is not None and repo.prefix:
            remove_index(index)
            return
        top = repo.toplevel if repo is not None else self.store.workdir
        self.store.lowers.offer(SnapshotIndex(commit, index, top))

    def _walk(self, work: _Work, index: Path) -> tuple[str, tuple[str, ...]]:
        """The working directory's tree, and its ignored entries."""
        repo, workdir = self.store.repo, self.store.workdir
        env = self.store.workdir_env(index)
        top = repo.toplevel if repo is not None else workdir
        if repo is not None and (repo.git_dir / "index").is_file():
            with contextlib.suppress(OSError):
                copy_index(repo.git_dir / "index", index)  # its stat cache saves hashing
        # the secret files are looked for while git reads the tree: two walks at once
        looking = self._looking()
        code, out = work.git(*_STATUS, env=env, cwd=workdir, ok=(0, 128))
        if code != 0:
            # A copied index git cannot read here (split index, a newer version): start
            # from nothing, and hash every file.
            with contextlib.suppress(OSError):
                index.unlink()
            _, out = work.git(*_STATUS, env=env, cwd=workdir)
        changed, untracked, ignored = parse_status(out)
        at = repo.prefix if repo is not None else ""  # git names paths from the top
        withheld = {at + name for name in looking.result()} if looking else set()
        if withheld:
            changed = [p for p in changed if p not in withheld]
            untracked = [p for p in untracked if p not in withheld]
        _check_untracked(top, untracked)
        _update_index(work, env, top, [*changed, *untracked], "--add", "--remove")
        # tracked ones too: a snapshot never holds a secret file
        _update_index(work, env, top, sorted(withheld), "--force-remove")
        prefix = ["--prefix", repo.prefix] if repo is not None and repo.prefix else []
        _, tree = work.git("write-tree", *prefix, env=env, cwd=workdir)
        shown = self._shown(ignored, repo.prefix if repo else "")
        return tree.decode().strip(), self._with_withheld(shown)

    def _looking(self) -> Future[tuple[str, ...]] | None:
        """The secret files being looked for again, on a thread of their own."""
        if self.secrets is None:
            return None
        if self._looker is None:
            self._looker = ThreadPoolExecutor(1, thread_name_prefix="orchmode-secrets")
        return self._looker.submit(self.secrets.look)

    def _with_withheld(self, shown: tuple[str, ...]) -> tuple[str, ...]:
        """The entries workspaces show from the working directory, with a place for each
        secret file (where the sandbox shows its note)."""
        if self.secrets is None or not self.secrets.found:
            return shown
        return (*shown, *(n for n in self.secrets.found if n not in shown))

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
            path = self.store.workdir / name.rstrip("/")
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


def _update_index(work: _Work, env: dict[str, str], top: Path, paths: list[str], *how: str) -> None:
    """``git update-index`` of ``paths`` (from the repository's top), if there are any."""
    if not paths:
        return
    listing = b"\0".join(p.encode(errors="surrogateescape") for p in paths) + b"\0"
    work.git("update-index", *how, "-z", "--stdin", env=env, cwd=top, data=listing)


def _check_untracked(top: Path, untracked: list[str]) -> None:
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


def parse_status(out: bytes) -> tuple[list[str], list[str], list[str]]:
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
