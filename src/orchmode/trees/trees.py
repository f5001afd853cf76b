"""``Trees``: the working tree snapshotted, shown to each agent, and its changes merged back.

With ``isolation = "worktree"`` every agent of a Workflow call works in a workspace of the
working directory as it was when the call started (:mod:`.workspaces`: an overlay on one
checkout, or a full copy), and its change comes back as a patch. All of it is git plumbing on
a **private** object store (:mod:`.store`), so the user's index, HEAD, branches, stash,
config and worktree list are never touched. A session opens one ``Trees`` and closes it; the
work is done by its rooms, each with one job:

- :attr:`Trees.store`: the private store: its set-up, commits and trees, bundles;
- :attr:`Trees.snapshots`: the working directory hashed into it (:mod:`.snapshot`);
- :attr:`Trees.checkout`: the working directory read now, and merges written into it whole
  or, after a kill, finished (:mod:`.checkout`);
- :attr:`Trees.copies`: the workspaces' directories and the changes they hold;
- :attr:`Trees.derived`: layers and commits a patch makes of a snapshot;
- :attr:`Trees.merges` and :attr:`Trees.conflicts`: three-way merges, and conflicts kept
  with their markers for a resolver.

Workspaces live in ``.orchmode/trees/runs/<host>-<pid>-<id>/``; each is removed when its agent
ends, the run's directory when the session closes, and one whose process died (``kill -9``)
by the next start in this directory.
"""

from __future__ import annotations

from pathlib import Path

from ..core.secrets import Secrets
from .checkout import Checkout
from .conflicts import Conflicts
from .copies import Copies
from .derived import Derived
from .lowers import Lowers
from .merges import Merges
from .runs import remove_tree, sweep_dead_runs
from .snapshot import Snapshots
from .store import TreeStore


class Trees:
    """The private store of one working directory, and this process's rooms over it."""

    def __init__(
        self, workdir: Path, home: Path | None = None, secrets: Secrets | None = None
    ) -> None:
        self.store = TreeStore(workdir, home)
        self.workdir = self.store.workdir
        #: The checkouts overlays are layered on, and the layers made over them.
        self.lowers: Lowers = self.store.lowers
        self.checkout = Checkout(self.store, secrets)
        self.snapshots = Snapshots(self.store, self.checkout, secrets)
        self.copies = Copies(self.store, secrets)
        self.derived = Derived(self.store)
        self.merges = Merges(self.store, self.checkout, secrets)
        self.conflicts = Conflicts(self.store, self.checkout, self.merges)

    async def open(self) -> None:
        """Make the store (once), sweep what dead processes left, make this run's dir."""
        await self.store.open()

    def sweep(self) -> list[Path]:
        """Remove the copies of processes on this host that died; which run dirs went."""
        return sweep_dead_runs(self.store.runs)

    def close(self) -> None:
        """Remove this run's copies; the store stays (resumed merges need its snapshots),
        unless it is a private one."""
        self.copies.close()
        self.snapshots.close()
        self.merges.close()
        self.lowers.close()
        self.derived.close()
        store = self.store
        remove_tree(store.home if store.private else store.run)
