"""Commits made of a snapshot and a patch: the layers that show them, and their commits.

A workspace that starts from a snapshot with a patch on top (a verifier's, a resolver's)
is shown a layer with the patch applied over the snapshot's checkout; its agent's change is
measured from the commit that layer makes. That commit is a child of the snapshot, so the
same layer gives the same commit on every machine.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..core.results import Change
from .git import TreeError, _Work, on_thread
from .layers import read_layer
from .lowers import Stack
from .store import TreeStore


class Derived:
    """The layers and commits patches make of snapshots, each made once."""

    def __init__(self, store: TreeStore) -> None:
        self.store = store
        self._patch_layers: dict[tuple[tuple[Path, ...], str, str], Path] = {}
        self._derived: dict[Path, tuple[str, str]] = {}

    def close(self) -> None:
        self._patch_layers.clear()
        self._derived.clear()

    async def patch_layer(self, stack: Stack, patch: str) -> Path:
        """A layer with ``patch`` applied over ``stack`` (made once per stack and patch)."""
        # The commit too: the same checkout holds another commit once it is brought up to date.
        key = (stack.layers, stack.commit, Change(stack.commit, patch).digest)
        layer = self._patch_layers.get(key)
        if layer is None:
            data = patch.encode(errors="surrogateescape")
            layer = await self.store.lowers.layer_from_patch(stack.layers, data)
            self._patch_layers[key] = layer
        return layer

    async def derive(self, base: str, layer: Path) -> tuple[str, str]:
        """The commit (and its tree) that ``layer`` makes of ``base``: a child of ``base``,
        so that the same layer gives the same commit on every machine."""
        derived = self._derived.get(layer)
        if derived is None:
            store = self.store
            base_tree = await store.tree_of(base)
            env = store.env()
            tree, _, _ = await on_thread(
                lambda work: read_layer(work, layer, base_tree, env, store.home, _nothing_ignored)
            )
            derived = self._derived[layer] = (await store.commit(tree, base), tree)
        return derived

    async def derive_from_patch(self, base: str, patch: str) -> str:
        """The commit ``patch`` makes of ``base`` (a child of it), worked out in the store."""
        index = self.store.scratch_index("derive")
        try:
            tree = await self.store.applied(f"{base}^{{tree}}", patch, index)
        finally:
            with contextlib.suppress(OSError):
                index.unlink()
        if tree is None:
            raise TreeError("the patch does not apply to its snapshot")
        return await self.store.commit(tree, base)


def _nothing_ignored(_work: _Work, _paths: list[bytes], _exact: bool) -> set[bytes]:
    """A layer orchmode made holds what it holds: nothing of it is ignored."""
    return set()
