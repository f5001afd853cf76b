"""Nested fan-outs' trees: a child works on its parent's workspace, and merges back into it.

A worker that calls Workflow is waiting on that tool call, so its workspace holds still
while its children run. Its children start from what it has written so far
(:func:`change_so_far`: a layer over the same checkout the parent's overlay stands on),
and their verified changes are merged into the parent's *live* workspace
(:func:`merge_into_workspace`), not into the user's tree: the parent's own change, read when
it closes, then holds its children's work, and the level above merges it once.

The merges are worked out three-way in the private store, each whole or not at all, as at
the top level (:meth:`.Merges.merged_onto`); what they add is then written into the
workspace in one ``git apply``, which checks every file before it writes any. An overlay is
mounted only inside its shell's namespace, and overlayfs leaves writes into an upper layer
under a live mount undefined, so there it runs in the parent's own sandboxed shell, the
patch handed over as base64 text in the command, never through the model. A full copy is a
plain directory: it is written from here, with git set up on the private store, so nothing
the agent put in its own ``.git`` runs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import shlex
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

from ..core.errors import OrchmodeError
from ..core.results import Change
from .git import TreeError, git
from .layers import PATCH_FLAGS, PATCH_FORM
from .merges import Merge
from .patches import describe_summary, summary_of
from .trees import Trees
from .workspaces import CopyWorkspace, OverlayWorkspace, Workspace

#: How the parent's shell is asked to write a merge into its workspace: the patch comes in
#: the command itself (base64 needs no quoting), and git's settings that would rewrite it
#: on the way (line endings, whitespace fixes) are held off.
_APPLY = (
    "( cd -- {where} && printf '%s' '{patch}' | base64 -d | GIT_CONFIG_NOSYSTEM=1 "
    "git -c core.autocrlf=false -c core.safecrlf=false apply --binary --whitespace=nowarn - )"
)
_BLAME = "a command or setting in the workspace changed what was written"


class ShellOutcome(Protocol):
    """What a shell command gave back (a :class:`~orchmode.shell.bash.ShellResult`)."""

    @property
    def output(self) -> str: ...

    @property
    def exit_code(self) -> int | None: ...


class ParentShell(Protocol):
    """The parent agent's persistent shell (a :class:`~orchmode.shell.bash.BashSession`)."""

    #: The permission rules' check: it is for the model's commands, not orchmode's own.
    permit: Callable[[str], Awaitable[str | None]] | None

    async def run(self, command: str | None) -> ShellOutcome: ...


@dataclass(frozen=True)
class ChildChange:
    """One child worker's change, as its parent's merge takes it."""

    #: The subtask's number in the nested call (its line says ``[change index]``).
    index: int
    change: Change | None
    #: Why it is not to be merged (``fanout.changes.hold_back``'s reason: refuted, not
    #: finished, …), or None to merge it.
    held: str | None = None
    #: Where its patch is kept as a file, if the caller keeps it ("" when not).
    kept: str = ""


@dataclass(frozen=True)
class OpenWorkspace:
    """A running agent's workspace and its shell: where the workers of a Workflow call it
    makes start from, and where their changes are merged."""

    workspace: Workspace
    shell: ParentShell
    #: Opening the workspace, which goes on while the agent's first request is in flight
    #: (None: open already): a call made in its first reply waits for it.
    opening: asyncio.Future[None] | None = None

    async def opened(self) -> Workspace:
        """The workspace, once it is open (raises what opening it raised)."""
        if self.opening is not None:
            await asyncio.shield(self.opening)
        return self.workspace


#: The running agent's own workspace, set by the agent host around its run (None for an
#: agent that works in the working directory itself): a nested call reads its parent's here.
AGENT_WORKSPACE: ContextVar[OpenWorkspace | None] = ContextVar(
    "orchmode_agent_workspace", default=None
)


@contextlib.contextmanager
def working_in(
    workspace: Workspace | None, shell: ParentShell, opening: asyncio.Future[None] | None = None
) -> Iterator[None]:
    """Run the agent's code with :data:`AGENT_WORKSPACE` saying where it works."""
    token = AGENT_WORKSPACE.set(OpenWorkspace(workspace, shell, opening) if workspace else None)
    try:
        yield
    finally:
        AGENT_WORKSPACE.reset(token)


async def change_so_far(workspace: Workspace) -> Change:
    """What the agent of ``workspace`` has written so far, the workspace left open.

    Measured from the workspace's base (``workspace.spec.base``), its own starting patch
    included, so that a child's ``TreeJob(base=change.base, patch=change.patch)`` is one
    layer over the very checkout its parent's overlay stands on, however deep the nesting.
    Call it while the agent is idle (waiting on its Workflow call): a command writing
    meanwhile could be read half done.
    """
    change = await workspace.change_so_far()
    base = workspace.spec.base
    if change.base == base:
        return change
    trees = workspace.workspaces.trees
    tree = await _tree_of(trees, change)
    base_tree = await trees.store.tree_of(base)
    if tree == base_tree:
        return Change(base, "", change.left_out)
    return Change(base, await _patch(trees, base_tree, tree), change.left_out)


#: Told what became of each child's change: the child, its fate (``merged``, ``conflict``,
#: ``refused``, ``not merged`` or ``no change``) and the detail its line gives.
Settled = Callable[[ChildChange, str, str], None]


async def merge_into_workspace(
    workspace: Workspace,
    shell: ParentShell,
    children: Sequence[ChildChange],
    settled: Settled | None = None,
) -> list[str]:
    """Merge the children's changes, in order, into the parent's live ``workspace``; one
    ``[change i] …`` line per child, worded as the top level words them.

    Each change is merged three-way against the workspace as it is now, whole or not at
    all: a held one (refuted, unverified, unfinished) is not merged, a conflicting one is
    reported with its files and nothing of it is written; refusals (secret files, links out
    of the tree) are the top level's. What merged is written in one step; if that step
    fails, nothing is written and every change it held is reported as a conflict.

    ``shell`` is the parent agent's own shell (an overlay is only reachable through it);
    the parent must be idle, waiting on the call whose children these are.
    """
    async with _lock_of(workspace):
        chosen = [c for c in children if c.held is None and _has_change(c)]
        merges: dict[int, Merge] = {}
        unread = False
        if chosen:
            merges, unread = await _merge_and_write(workspace, shell, chosen)
        lines = []
        for child in children:
            line, fate, detail = _line(child, merges.get(child.index), unread)
            if settled is not None:
                settled(child, fate, detail)
            lines.append(line)
        return lines


async def _merge_and_write(
    workspace: Workspace, shell: ParentShell, chosen: Sequence[ChildChange]
) -> tuple[dict[int, Merge], bool]:
    """The merges by child, written; and whether the workspace then read back otherwise
    than they made it."""
    trees = workspace.workspaces.trees
    changes = [c.change for c in chosen if c.change is not None]
    index = trees.store.scratch_index("nested")
    try:
        ours = await _tree_of(trees, await workspace.change_so_far())
        merges = await trees.merges.merged_onto(ours, changes, index)
    except OrchmodeError as exc:
        failed = Merge("conflict", (f"merging failed: {exc}",))
        return {c.index: failed for c in chosen}, False
    finally:
        with contextlib.suppress(OSError):
            index.unlink()
    end = next((m.tree for m in reversed(merges) if m.fate == "merged"), ours)
    unread = False
    if end != ours:
        problem = await _write(workspace, shell, ours, end)
        if problem is not None:
            detail = (f"your workspace ({problem})",)
            merges = [Merge("conflict", detail) if m.fate == "merged" else m for m in merges]
        else:
            unread = await _read_back(workspace) != end
    return {c.index: m for c, m in zip(chosen, merges, strict=True)}, unread


async def _write(workspace: Workspace, shell: ParentShell, ours: str, end: str) -> str | None:
    """Write into ``workspace`` what takes its tree from ``ours`` to ``end``; why it could
    not be written, or None."""
    trees = workspace.workspaces.trees
    patch = (await _patch(trees, ours, end)).encode(errors="surrogateescape")
    if isinstance(workspace, CopyWorkspace):
        where = workspace.copy.path
        env = {**trees.store.env(), "GIT_WORK_TREE": str(where)}
        try:
            await git(
                "-c", "core.autocrlf=false", "-c", "core.safecrlf=false", "apply", "--binary",
                "--whitespace=nowarn", "-", env=env, cwd=where, data=patch,
            )  # fmt: skip
        except TreeError as exc:
            return f"it could not be written: {exc}"
        return None
    if not isinstance(workspace, OverlayWorkspace):
        return "it is not writable"
    command = _APPLY.format(
        where=shlex.quote(str(trees.workdir)), patch=base64.b64encode(patch).decode()
    )
    permit = shell.permit

    async def this_one_passes(asked: str) -> str | None:
        """The permission rules are for the model's commands: orchmode's own passes them,
        and only that very one (by identity), should anything else come meanwhile."""
        if asked is command or permit is None:
            return None
        return await permit(asked)

    shell.permit = this_one_passes
    try:
        outcome = await shell.run(command)
    finally:
        shell.permit = permit
    if outcome.exit_code != 0:
        said = outcome.output.strip().splitlines()
        return f"it could not be written: {said[-1] if said else 'no reason given'}"
    return None


async def _read_back(workspace: Workspace) -> str | None:
    """The tree the workspace holds now, or None when it cannot be read."""
    try:
        return await _tree_of(workspace.workspaces.trees, await workspace.change_so_far())
    except OrchmodeError:
        return None


async def _tree_of(trees: Trees, change: Change) -> str:
    """The tree ``change`` makes of its base (known already when it was read from a layer)."""
    if change.empty:
        return await trees.store.tree_of(change.base)
    tree = await trees.merges.merge_ahead(change)
    if tree is None:
        raise TreeError("the workspace's change does not apply to its own base")
    return tree


async def _patch(trees: Trees, before: str, after: str) -> str:
    """The patch from tree ``before`` to tree ``after``, in the form every change has."""
    _, out = await trees.store.git(*PATCH_FORM, "diff-tree", "-p", *PATCH_FLAGS, before, after)
    return out.decode(errors="surrogateescape")


def _has_change(child: ChildChange) -> bool:
    return child.change is not None and not child.change.empty


def _line(child: ChildChange, merge: Merge | None, unread: bool) -> tuple[str, str, str]:
    """The child's line, worded as ``fanout.changes`` words the top level's; its fate and
    the detail."""
    i, change = child.index, child.change
    if change is None or change.empty:
        return f"[change {i}] no change", "no change", ""
    files = describe_summary(summary_of(change))
    kept = f"; its patch is kept at {child.kept}" if child.kept else ""
    if merge is None:
        held = child.held or ""
        return f"[change {i}] not merged ({held}): {files}{kept}", "not merged", held
    detail = "; ".join(merge.detail)
    if merge.fate == "merged" and unread:
        return (
            f"[change {i}] merged, but the workspace does not read back so ({_BLAME}): {files}",
            "merged",
            _BLAME,
        )
    if merge.fate == "merged":
        return f"[change {i}] merged: {files}", "merged", ""
    if merge.fate == "no change":
        return f"[change {i}] no change", "no change", ""
    if merge.fate == "conflict":
        where = f" in {detail}" if detail else ""
        line = (
            f"[change {i}] conflict{where} (kept as {child.kept or 'no file'}): not applied, "
            f"nothing of it written ({files}) — read it, and apply what still holds with git apply"
        )
        return line, "conflict", detail
    return f"[change {i}] refused ({detail}): {files}{kept}", "refused", detail


_locks: weakref.WeakKeyDictionary[Workspace, asyncio.Lock] = weakref.WeakKeyDictionary()


def _lock_of(workspace: Workspace) -> asyncio.Lock:
    """One merge into a workspace at a time (a parent may make two calls in one turn)."""
    lock = _locks.get(workspace)
    if lock is None:
        lock = _locks[workspace] = asyncio.Lock()
    return lock
