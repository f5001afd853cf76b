"""Nested workers' trees: a child starts from its parent's workspace as it is, and its change
is merged into that live workspace, not into the working directory.

Real overlays in real user namespaces, the real sandbox and real git, on the 10,000-file tree
of :mod:`test_workspaces`: each agent's commands run in its own sandboxed shell, and the
merges into a parent's overlay go through the parent's shell, as in a nested fan-out.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import test_workspaces
from orchmode.core.results import Change
from orchmode.shell.bash import BashSession
from orchmode.trees.nested import (
    AGENT_WORKSPACE,
    ChildChange,
    change_so_far,
    merge_into_workspace,
    working_in,
)
from orchmode.trees.workspaces import Spec, Workspace
from test_isolation import repo
from test_workspaces import Agents, _nothing, changed_files

# The 10,000-file tree, the agents' maker, and the check that overlays work here.
big_template = test_workspaces.big_template
big = test_workspaces.big
agents_in = test_workspaces.agents_in
_overlays_work = test_workspaces._overlays_work

PARENT_FILE = "pkg0/mod0/f0.py"
APPENDED = "parent = True\n"


class Parent:
    """A worker left open mid-run, as one waiting on its Workflow call is: its workspace and
    its shell."""

    def __init__(self, agents: Agents, workspace: Workspace, shell: BashSession) -> None:
        self.agents = agents
        self.workspace = workspace
        self.shell = shell

    @classmethod
    async def open(cls, agents: Agents, spec: Spec, command: str) -> Parent:
        workspace = agents.workspaces.workspace("parent", spec)
        await workspace.open()
        shell = agents.shells.in_workspace(workspace, _nothing)
        parent = cls(agents, workspace, shell)
        await parent.run(command)
        return parent

    async def run(self, command: str) -> str:
        result = await self.shell.run(command)
        assert not result.is_error, result.output
        return result.output

    async def child(self, name: str, command: str) -> Change:
        """A child worker's change, its workspace layered on the parent's as it is now."""
        so_far = await change_so_far(self.workspace)
        spec = Spec(so_far.base, so_far.patch, ignored=self.workspace.spec.ignored, chain=name)
        result, change, _ = await self.agents.run(spec, command)
        assert not result.is_error, result.output
        assert change is not None
        return change

    async def close(self) -> Change:
        await self.shell.close()
        change = await self.workspace.close()
        assert change is not None
        return change


async def test_a_child_starts_from_its_parents_workspace_as_it_is_now(
    big: Path, agents_in: type[Agents]
) -> None:
    agents = agents_in(big)
    parent = await Parent.open(
        agents,
        await agents.snapshot(),
        f"echo '{APPENDED.strip()}' >> {PARENT_FILE} && rm pkg2/mod0/f2000.py && "
        "mkdir -p notes && echo plan > notes/plan.md",
    )
    child = await parent.child(
        "2.1",
        f"tail -1 {PARENT_FILE} > /tmp/seen; test -e pkg2/mod0/f2000.py || echo gone >> /tmp/seen; "
        "cat notes/plan.md >> /tmp/seen; cp /tmp/seen child-saw.txt",
    )
    # Its change is its own (the parent's edits are its base), and it saw them all.
    assert list(changed_files(child)) == ["child-saw.txt"]
    assert "+parent = True\n+gone\n+plan\n" in child.patch
    # The parent's workspace is still open and its own: it goes on writing.
    await parent.run("echo more >> notes/plan.md")
    final = await parent.close()
    assert set(changed_files(final)) == {PARENT_FILE, "pkg2/mod0/f2000.py", "notes/plan.md"}


async def test_childrens_changes_are_merged_into_the_live_workspace_and_then_into_the_tree_once(
    big: Path, agents_in: type[Agents]
) -> None:
    agents = agents_in(big)
    parent = await Parent.open(
        agents, await agents.snapshot(), f"echo '{APPENDED.strip()}' >> {PARENT_FILE}"
    )
    first = await parent.child("2.1", "sed -i '1s/.*/# first child/' pkg1/mod0/f1000.py")
    second = await parent.child(
        "2.2", f"sed -i '1s/.*/# second child/' {PARENT_FILE} && echo new > pkg9/added.py"
    )
    refuted = await parent.child("2.3", "echo refuted > pkg3/refuted.py")
    lines = await merge_into_workspace(
        parent.workspace,
        parent.shell,
        [
            ChildChange(1, first),
            ChildChange(2, second),
            ChildChange(3, refuted, held="refuted"),
            ChildChange(4, None),
        ],
    )
    assert lines[0].startswith("[change 1] merged: ")
    assert lines[1].startswith("[change 2] merged: ")
    assert lines[2].startswith("[change 3] not merged (refuted): ")
    assert lines[3] == "[change 4] no change"
    # The parent sees its children's work in its own workspace, beside its own.
    shown = await parent.run(
        f"head -1 pkg1/mod0/f1000.py {PARENT_FILE}; tail -1 {PARENT_FILE}; cat pkg9/added.py; "
        "test -e pkg3/refuted.py || echo no-refuted"
    )
    assert "# first child" in shown and "# second child" in shown
    assert shown.count(APPENDED.strip()) == 1 and "new" in shown and "no-refuted" in shown
    # Its final change holds its own edit and its children's; the tree takes it once.
    final = await parent.close()
    assert set(changed_files(final)) == {PARENT_FILE, "pkg1/mod0/f1000.py", "pkg9/added.py"}
    (merge,) = await agents.trees.merges.merge_all([final])
    assert merge.fate == "merged"
    text = (big / PARENT_FILE).read_text()
    assert text.startswith("# second child\n") and text.count(APPENDED) == 1
    assert (big / "pkg1/mod0/f1000.py").read_text().startswith("# first child\n")
    assert (big / "pkg9/added.py").read_text() == "new\n"
    assert not (big / "pkg3/refuted.py").exists()


async def test_a_conflicting_child_is_reported_and_nothing_of_it_is_written(
    big: Path, agents_in: type[Agents]
) -> None:
    agents = agents_in(big)
    parent = await Parent.open(agents, await agents.snapshot(), "echo parent > pkg5/own.py")
    first = await parent.child("2.1", f"sed -i '1s/.*/# one/' {PARENT_FILE}")
    second = await parent.child(
        "2.2", f"sed -i '1s/.*/# two/' {PARENT_FILE} && echo half > pkg9/half.py"
    )
    third = await parent.child("2.3", "echo third > pkg8/third.py")
    # The parent's permission rules refuse every command of its model: they are not asked
    # about orchmode's own, and hold again once it ran.
    refusing = _refuse_all
    parent.shell.permit = refusing
    lines = await merge_into_workspace(
        parent.workspace,
        parent.shell,
        [ChildChange(1, first), ChildChange(2, second), ChildChange(3, third)],
    )
    assert lines[0].startswith("[change 1] merged: ")
    assert lines[1].startswith(f"[change 2] conflict in {PARENT_FILE} (kept as no file): ")
    assert "not applied, nothing of it written" in lines[1]
    assert lines[2].startswith("[change 3] merged: ")
    assert parent.shell.permit is refusing
    refused = await parent.shell.run("touch pkg8/after.py")
    assert refused.is_error and "no commands today" in refused.output
    parent.shell.permit = None
    shown = await parent.run(f"head -1 {PARENT_FILE}; test -e pkg9/half.py || echo no-half")
    assert "# one" in shown and "no-half" in shown
    final = await parent.close()
    assert set(changed_files(final)) == {"pkg5/own.py", PARENT_FILE, "pkg8/third.py"}


async def test_a_grandchild_merges_into_a_child_that_stands_on_its_parents_change(
    big: Path, agents_in: type[Agents]
) -> None:
    agents = agents_in(big)
    parent = await Parent.open(agents, await agents.snapshot(), "echo 1 > level1.txt")
    so_far = await change_so_far(parent.workspace)
    spec = Spec(so_far.base, so_far.patch, ignored=parent.workspace.spec.ignored, chain="2.1")
    child = await Parent.open(agents, spec, "echo 2 > level2.txt")
    # Measured from the base both stand on: the parent's edit and the child's, one layer.
    child_so_far = await change_so_far(child.workspace)
    assert child_so_far.base == so_far.base
    assert set(changed_files(child_so_far)) == {"level1.txt", "level2.txt"}
    grandchild = await child.child("3.1", "cat level1.txt level2.txt > level3.txt")
    (line,) = await merge_into_workspace(child.workspace, child.shell, [ChildChange(1, grandchild)])
    assert line.startswith("[change 1] merged: ")
    child_change = await child.close()
    (line,) = await merge_into_workspace(
        parent.workspace, parent.shell, [ChildChange(1, child_change)]
    )
    assert line.startswith("[change 1] merged: ")
    final = await parent.close()
    assert set(changed_files(final)) == {"level1.txt", "level2.txt", "level3.txt"}
    (merge,) = await agents.trees.merges.merge_all([final])
    assert merge.fate == "merged"
    assert (big / "level3.txt").read_text() == "1\n2\n"


async def test_full_copies_take_their_childrens_changes_too(
    tmp_path: Path, agents_in: type[Agents]
) -> None:
    root = repo(tmp_path / "small", {"a.txt": "one\ntwo\nthree\n", "b/c.txt": "c\n"})
    agents = agents_in(root, overlays=False)
    parent = await Parent.open(agents, await agents.snapshot(), "echo four >> a.txt")
    first = await parent.child("2.1", "sed -i 's/one/ONE/' a.txt")
    second = await parent.child("2.2", "sed -i 's/one/uno/' a.txt && echo d > b/d.txt")
    lines = await merge_into_workspace(
        parent.workspace, parent.shell, [ChildChange(1, first), ChildChange(2, second)]
    )
    assert lines[0].startswith("[change 1] merged: ")
    assert lines[1].startswith("[change 2] conflict in a.txt ")
    assert (
        await parent.run("cat a.txt; test -e b/d.txt || echo no-d") == "ONE\ntwo\nthree\nfour\nno-d"
    )
    final = await parent.close()
    assert set(changed_files(final)) == {"a.txt"}


async def test_what_an_agent_starts_knows_the_workspace_it_works_in(
    tmp_path: Path, agents_in: type[Agents]
) -> None:
    """A nested call's fan-out runs in tasks the agent's run starts: they see its workspace."""
    root = repo(tmp_path / "small", {"a.txt": "one\n"})
    agents = agents_in(root)
    parent = await Parent.open(agents, await agents.snapshot(), "echo two >> a.txt")
    seen: list[object] = []

    async def nested_call() -> None:
        here = AGENT_WORKSPACE.get()
        assert here is not None
        seen.append(here.workspace)
        seen.append((await change_so_far(here.workspace)).patch)

    assert AGENT_WORKSPACE.get() is None
    with working_in(parent.workspace, parent.shell):
        await asyncio.create_task(nested_call())
    with working_in(None, parent.shell):  # an agent in the working directory itself
        assert AGENT_WORKSPACE.get() is None
    assert AGENT_WORKSPACE.get() is None
    assert seen[0] is parent.workspace and "+two" in str(seen[1])
    await parent.close()


async def test_a_shell_the_model_bent_is_caught_not_believed(
    tmp_path: Path, agents_in: type[Agents]
) -> None:
    """The merge runs in the parent's shell, which its model may have bent: a write that
    failed is a conflict with nothing written, one that wrote more is said so."""
    root = repo(tmp_path / "small", {"a.txt": "one\n", "b.txt": "b\n"})
    agents = agents_in(root)
    parent = await Parent.open(agents, await agents.snapshot(), "git() { return 3; }")
    child = await parent.child("2.1", "echo child > c.txt")
    (line,) = await merge_into_workspace(parent.workspace, parent.shell, [ChildChange(1, child)])
    assert line.startswith("[change 1] conflict in your workspace (it could not be written: ")
    assert "nothing of it written" in line
    assert await parent.run("test -e c.txt || echo no-c") == "no-c"
    await parent.run('git() { command git "$@" && echo extra >> b.txt; }')
    (line,) = await merge_into_workspace(parent.workspace, parent.shell, [ChildChange(1, child)])
    assert line.startswith("[change 1] merged, but the workspace does not read back so ")
    assert await parent.run("cat c.txt b.txt") == "child\nb\nextra"
    await parent.close()


async def test_binary_and_non_utf8_files_reach_the_tree_byte_for_byte(
    tmp_path: Path, agents_in: type[Agents]
) -> None:
    root = repo(tmp_path / "small", {"a.txt": "one\n"})
    agents = agents_in(root)
    parent = await Parent.open(agents, await agents.snapshot(), "echo two >> a.txt")
    child = await parent.child(
        "2.1",
        "head -c 300000 /dev/urandom > blob.bin && printf 'caf\\351\\n' > latin1.txt && "
        "ln -s a.txt link && chmod +x a.txt",
    )
    (line,) = await merge_into_workspace(parent.workspace, parent.shell, [ChildChange(1, child)])
    assert line.startswith("[change 1] merged: ")
    blob = await parent.run("sha256sum blob.bin")
    final = await parent.close()
    (merge,) = await agents.trees.merges.merge_all([final])
    assert merge.fate == "merged"
    assert hashlib.sha256((root / "blob.bin").read_bytes()).hexdigest() == blob.split()[0]
    assert (root / "latin1.txt").read_bytes() == b"caf\xe9\n"
    assert os.readlink(root / "link") == "a.txt"
    assert os.access(root / "a.txt", os.X_OK) and (root / "a.txt").read_text() == "one\ntwo\n"


async def _refuse_all(command: str) -> str | None:
    return "no commands today"
