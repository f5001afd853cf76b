"""The session's checkout made of hard links to the working directory's unchanged files:
what is linked and what written, that nothing writes through a link, what an in-place edit
during a call does, and a checkout on another file system.

Real overlays in real user namespaces, the real sandbox, real git, on trees of 10,000 files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import test_workspaces
from test_isolation import GIT, repo
from test_workspaces import Agents, _nothing, changed_files, checked_out, save

# the fixtures of the workspaces' tests, on the same trees
_overlays_work = test_workspaces._overlays_work
big_template = test_workspaces.big_template
big = test_workspaces.big
agents_in = test_workspaces.agents_in


def own_bytes(checkout: Path) -> int:
    """Bytes of the checkout's files that are not links to another's (its ``.git`` aside)."""
    total = 0
    for root, dirs, files in os.walk(checkout):
        if root == str(checkout):
            dirs.remove(".git")
        for name in files:
            info = os.lstat(os.path.join(root, name))
            if info.st_nlink == 1:
                total += info.st_size
    return total


async def test_the_first_checkout_links_the_files_that_hold_the_snapshot_and_writes_the_rest(
    big: Path, agents_in: type[Agents]
) -> None:
    (big / "pkg2/mod2/f2200.py").write_text("edited before the call\n")
    (big / "pkg0/new.py").write_text("not added yet\n")
    os.symlink("pkg0/mod0/f0.py", big / "link.py")
    agents = agents_in(big)
    spec = await agents.snapshot()
    result, change, _ = await agents.run(spec, "git status --short | wc -l; cat pkg2/mod2/f2200.py")
    assert not result.is_error, result.output
    assert result.output.split("\n") == ["0", "edited before the call"]
    assert change is not None and change.patch == ""
    (checkout,) = checked_out(agents)
    for name in ("pkg1/mod1/f1100.py", "pkg2/mod2/f2200.py", "pkg0/new.py"):
        assert (checkout / name).stat().st_ino == (big / name).stat().st_ino, name
    assert (checkout / "link.py").is_symlink()  # written from the store
    assert own_bytes(checkout) < 1_000_000  # the tree is ~4 MB: only directory entries


async def test_nothing_that_changes_a_checkout_of_links_writes_the_users_files(
    big: Path, agents_in: type[Agents]
) -> None:
    agents = agents_in(big)
    first = await agents.snapshot()
    _, change, _ = await agents.run(first, "sed -i 's/compute/merged/' pkg3/mod3/f3300.py")
    (checkout,) = checked_out(agents)
    assert change is not None
    (merge,) = await agents.trees.merges.merge_all([change])  # git writes the user's file
    assert merge.fate == "merged"
    assert "compute" in (checkout / "pkg3/mod3/f3300.py").read_text()  # the checkout's stays
    save(big / "pkg4/mod4/f4400.py", "saved by the user\n")
    subprocess.run([*GIT, "rm", "-q", "pkg5/mod5/f5500.py"], cwd=big, check=True)
    users = {p: p.read_bytes() for p in (big / "pkg3").rglob("*.py")}
    second = await agents.snapshot()  # the checkout is brought up to date under its links
    result, _, _ = await agents.run(
        second, "cat pkg4/mod4/f4400.py; grep -c merged pkg3/mod3/f3300.py; ls pkg5/mod5 | wc -l"
    )
    assert result.output.split("\n") == ["saved by the user", "20", "99"]
    assert {p: p.read_bytes() for p in (big / "pkg3").rglob("*.py")} == users
    assert "merged" in (big / "pkg3/mod3/f3300.py").read_text()


async def test_a_file_edited_in_place_during_a_call_shows_through_and_its_merge_loses_nothing(
    big: Path, agents_in: type[Agents]
) -> None:
    agents = agents_in(big)
    spec = await agents.snapshot()
    name = "pkg6/mod6/f6600.py"
    lines = (big / name).read_text().splitlines(keepends=True)
    workspace = agents.workspaces.workspace("agent", spec)
    await workspace.open()  # the call is under way: its checkout is made
    with (big / name).open("r+") as handle:  # in place: the same inode, the link's too
        handle.write(lines[0].replace("file", "FILE"))
    shell = agents.shells.in_workspace(workspace, _nothing)
    try:
        result = await shell.run(
            f"head -1 {name}; echo '# by the agent' >> {name}; echo new > pkg6/new.py"
        )
    finally:
        await shell.close()
    change = await workspace.close()
    assert result.output == "# FILE 6600"  # the agent saw the user's edit
    assert change is not None
    # The change is read against the snapshot, so it holds the user's edit as well as its own.
    assert changed_files(change) == {name: "modified", "pkg6/new.py": "added"}
    (merge,) = await agents.trees.merges.merge_all([change])
    assert merge.fate == "merged", merge  # both sides made the same edit: three-way, it merges
    text = (big / name).read_text().splitlines()
    assert text[0] == "# FILE 6600" and text.count("# FILE 6600") == 1
    assert text[-1] == "# by the agent" and len(text) == len(lines) + 1
    assert (big / "pkg6/new.py").read_text() == "new\n"
    # The next call's checkout is its snapshot again, in-place edit and all.
    after = await agents.snapshot()
    result, _, _ = await agents.run(after, f"head -1 {name}; git status --short | wc -l")
    assert result.output.split("\n") == ["# FILE 6600", "0"]


@pytest.fixture
def other_file_system() -> Iterator[Path]:
    """A directory on another file system than the tests' (a tmpfs)."""
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm here")
    where = Path(tempfile.mkdtemp(prefix="orchmode-links-", dir="/dev/shm"))
    yield where
    shutil.rmtree(where, ignore_errors=True)


async def test_a_checkout_on_another_file_system_is_written_whole(
    tmp_path: Path, other_file_system: Path, agents_in: type[Agents]
) -> None:
    workdir = repo(tmp_path / "r", {"a.txt": "a\n", "d/b.txt": "b\n"})
    if os.stat(workdir).st_dev == os.stat(other_file_system).st_dev:
        pytest.skip("/dev/shm is on the tests' file system")
    (workdir / ".orchmode").mkdir()
    (workdir / ".orchmode" / "trees").symlink_to(other_file_system)
    agents = agents_in(workdir)
    result, change, _ = await agents.run(
        await agents.snapshot(), "cat a.txt d/b.txt; echo c >> a.txt"
    )
    assert result.output == "a\nb"
    (checkout,) = checked_out(agents)
    assert (checkout / "a.txt").stat().st_nlink == 1
    assert (checkout / "a.txt").stat().st_dev != (workdir / "a.txt").stat().st_dev
    assert change is not None
    (merge,) = await agents.trees.merges.merge_all([change])
    assert merge.fate == "merged" and (workdir / "a.txt").read_text() == "a\nc\n"
