"""Agents' workspaces as copy-on-write overlays: real overlayfs in real user namespaces, the
real sandbox, real git, on trees of 10,000 files; and full copies where overlays are refused.

Each agent's command runs in its shell exactly as in a fan-out (bubblewrap inside the
overlay's namespace); its change is then read from the upper layer alone.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchmode.core.results import Change
from orchmode.core.settings import Settings
from orchmode.executors.host import ShellFactory
from orchmode.shell.bash import ShellResult
from orchmode.shell.bwrap import overlay_problem, probe
from orchmode.trees.layers import scan_upper
from orchmode.trees.limits import DiskLimits
from orchmode.trees.patches import summarise
from orchmode.trees.trees import Trees
from orchmode.trees.workspaces import OverlayWorkspace, Spec, Workspace, Workspaces
from test_isolation import GIT, git_out, repo

#: Files in the big tree: 100 directories of 100.
BIG = 10_000
REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _overlays_work(tmp_path: Path) -> None:
    problem = probe().problem or overlay_problem("bwrap", False, tmp_path)
    if problem is not None:
        pytest.fail(problem)


def build_big(root: Path, files: int = BIG) -> Path:
    """A committed repository of ``files`` source-like files, ten levels of nothing fancy."""
    root.mkdir()
    for n in range(files):
        directory = root / f"pkg{n // 1000}" / f"mod{(n // 100) % 10}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{n}.py").write_text(f"# file {n}\n" + "value = compute(a, b)\n" * 20)
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=root, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=root, check=True)
    subprocess.run([*GIT, "-c", "gc.auto=0", "commit", "-qm", "start"], cwd=root, check=True)
    subprocess.run(["git", "repack", "-adq"], cwd=root, check=True)  # no gc racing a copy
    return root


@pytest.fixture(scope="module")
def big_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_big(tmp_path_factory.mktemp("template") / "big")


@pytest.fixture
def big(big_template: Path, tmp_path: Path) -> Path:
    """A fresh copy of the 10,000-file repository for one test."""
    root = tmp_path / "big"
    shutil.copytree(big_template, root, symlinks=True)
    return root


class Agents:
    """Runs commands as agents do: each in its workspace, in its sandboxed shell."""

    def __init__(self, workdir: Path, *, overlays: bool = True, **settings: object) -> None:
        self.settings = Settings(workdir=workdir, **settings)  # type: ignore[arg-type]
        self.trees = Trees(workdir)
        limits = DiskLimits.from_settings(self.settings)
        self.workspaces = Workspaces(self.trees, overlays=overlays, limits=limits)
        self.shells = ShellFactory.build(self.settings, self.trees.workdir, ())

    async def snapshot(self) -> Spec:
        snapshot = await self.trees.snapshots.snapshot()
        return Spec(snapshot.commit, ignored=snapshot.ignored, chain="1.1")

    async def run(
        self, spec: Spec, command: str, *, keep: bool = False
    ) -> tuple[ShellResult, Change | None, Workspace]:
        workspace = self.workspaces.workspace("agent", spec)
        await workspace.open()
        shell = self.shells.in_workspace(workspace, _nothing)
        try:
            result = await shell.run(command)
        finally:
            await shell.close()
        change = await workspace.close(keep_for=spec.chain if keep else None)
        return result, change, workspace

    async def change(self, command: str) -> Change:
        spec = await self.snapshot()
        result, change, _ = await self.run(spec, command)
        assert not result.is_error, result.output
        assert change is not None
        return change

    def close(self) -> None:
        self.workspaces.discard_kept()
        self.trees.close()


async def _nothing() -> None:
    return None


@pytest.fixture
def agents_in() -> Iterator[type[Agents]]:
    made: list[Agents] = []

    class Tracked(Agents):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            made.append(self)

    yield Tracked
    for agents in made:
        agents.close()


def save(path: Path, text: str) -> None:
    """Write ``path`` as git and most editors do: a new file renamed over the old one."""
    new = path.with_name(f".{path.name}.new")
    new.write_text(text)
    new.replace(path)


def changed_files(change: Change) -> dict[str, str]:
    return {f.label: f.kind for f in summarise(change.patch).files}


# ---------------------------------------------------------------------------- real sizes


@pytest.mark.slow
async def test_a_workspace_on_10000_files_holds_only_what_its_agent_wrote(
    big: Path, agents_in: type[Agents]
) -> None:
    agents = agents_in(big)
    spec = await agents.snapshot()
    command = (
        "sed -i 's/compute/calculate/' pkg3/mod4/f3400.py && rm pkg9/mod9/f9999.py && "
        "echo new > pkg0/mod0/added.py && echo noise > run.log && mkdir -p build && "
        "echo out > build/x.o && cat pkg5/mod5/f5550.py > /dev/null && git status --short | wc -l"
    )
    result, change, workspace = await agents.run(spec, command, keep=True)
    assert not result.is_error, result.output
    assert change is not None
    assert changed_files(change) == {
        "pkg0/mod0/added.py": "added",
        "pkg3/mod4/f3400.py": "modified",
        "pkg9/mod9/f9999.py": "deleted",
    }
    # Only what it wrote is in its layer (git status wrote nothing to the tree).
    assert isinstance(workspace, OverlayWorkspace)
    written = sorted(
        str(p.relative_to(workspace.upper))
        for p in workspace.upper.rglob("*")
        if not p.is_dir() and ".git" not in p.parts
    )
    assert written == [
        "build/x.o",
        "pkg0/mod0/added.py",
        "pkg3/mod4/f3400.py",
        "pkg9/mod9/f9999.py",  # a whiteout
        "run.log",
    ]
    merges = await agents.trees.merges.merge_all([change])
    assert [m.fate for m in merges] == ["merged"]
    assert "calculate" in (big / "pkg3/mod4/f3400.py").read_text()
    assert not (big / "pkg9/mod9/f9999.py").exists()
    assert (big / "pkg0/mod0/added.py").read_text() == "new\n"
    assert not (big / "run.log").exists() and not (big / "build").exists()


def checked_out(agents: Agents) -> list[Path]:
    """Every checkout of the tree there is: the one kept between sessions, and any of the
    run's own."""
    kept = agents.trees.store.home / "checkout"
    own = [p for p in agents.trees.store.run.iterdir() if p.name.startswith("lower")]
    return [*([kept] if kept.is_dir() else []), *own]


async def test_the_session_checks_the_tree_out_once_and_later_calls_only_what_changed(
    big: Path, agents_in: type[Agents]
) -> None:
    agents = agents_in(big)
    first = await agents.snapshot()
    await agents.run(first, "true")
    (lower,) = checked_out(agents)
    untouched = lower / "pkg1/mod1/f1100.py"
    inode = untouched.stat().st_ino
    (big / "pkg2/mod2/f2200.py").write_text("edited by the user\n")
    second = await agents.snapshot()
    assert second.base != first.base
    result, _, _ = await agents.run(second, "cat pkg2/mod2/f2200.py")
    assert result.output == "edited by the user"
    # The same checkout, brought up to date: a file that did not change is the same file.
    assert checked_out(agents) == [lower]
    assert untouched.stat().st_ino == inode


async def test_the_next_session_brings_the_kept_checkout_up_to_date(
    big: Path, agents_in: type[Agents]
) -> None:
    first = agents_in(big)
    await first.run(await first.snapshot(), "true")
    (kept,) = checked_out(first)
    inode = (kept / "pkg1/mod1/f1100.py").stat().st_ino
    first.close()
    (big / "pkg2/mod2/f2200.py").write_text("edited between sessions\n")
    second = agents_in(big)
    result, _, _ = await second.run(await second.snapshot(), "cat pkg2/mod2/f2200.py")
    assert result.output == "edited between sessions"
    assert checked_out(second) == [kept]  # not checked out again
    assert (kept / "pkg1/mod1/f1100.py").stat().st_ino == inode


async def test_two_sessions_at_once_share_the_kept_checkout_and_neither_changes_it(
    tmp_path: Path, agents_in: type[Agents]
) -> None:
    workdir = repo(tmp_path / "r", {"a.txt": "first\n", "b.txt": "b\n"})
    first = agents_in(workdir)
    spec = await first.snapshot()
    held = first.workspaces.workspace("held", spec)
    await held.open()  # the first session is still using the checkout
    save(workdir / "a.txt", "second\n")  # as git and most editors save (an in-place edit:
    # test_a_file_edited_in_place_during_a_call_shows_through_and_its_merge_loses_nothing)
    second = agents_in(workdir)
    result, change, _ = await second.run(await second.snapshot(), "cat a.txt; echo c > c.txt")
    assert result.output == "second"  # its own snapshot, layered over the other's
    assert change is not None and changed_files(change) == {"c.txt": "added"}
    kept = first.trees.store.home / "checkout"
    assert (kept / "a.txt").read_text() == "first\n"  # never changed under the first
    assert checked_out(second) == [kept]
    held.discard()


async def test_a_kept_checkout_left_half_changed_is_checked_out_anew(
    tmp_path: Path, agents_in: type[Agents]
) -> None:
    workdir = repo(tmp_path / "r", {"a.txt": "a\n"})
    first = agents_in(workdir)
    await first.run(await first.snapshot(), "true")
    first.close()
    kept = workdir / ".orchmode" / "trees" / "checkout"
    half = kept / "a.txt.half"  # git replaces a file it writes, never writes it in place
    half.write_text("half written\n")
    half.replace(kept / "a.txt")  # killed while changing it: no commit left
    (workdir / ".orchmode" / "trees" / "checkout.commit").unlink()
    second = agents_in(workdir)
    result, _, _ = await second.run(await second.snapshot(), "cat a.txt")
    assert result.output == "a"


# ---------------------------------------------------------------------- every kind of edit


async def test_every_kind_of_edit_is_read_from_the_upper_layer(
    tmp_path: Path, agents_in: type[Agents]
) -> None:
    files = {
        "old.txt": "keep me\n" * 20,
        "gone.txt": "bye\n",
        "run.sh": "echo hi\n",
        "dir/a.txt": "a\n",
        "dir/deep/b.txt": "b\n",
        "file": "becomes a directory\n",
        "tracked.log": "a tracked file that an ignore pattern matches\n",
        ".gitignore": "*.log\n",
        "sub/.gitignore": "",
    }
    workdir = repo(tmp_path / "r", files)
    (workdir / "link").symlink_to("old.txt")
    subprocess.run([*GIT, "add", "-A"], cwd=workdir, check=True)
    subprocess.run([*GIT, "add", "-f", "tracked.log"], cwd=workdir, check=True)
    subprocess.run([*GIT, "commit", "-qm", "link"], cwd=workdir, check=True)
    agents = agents_in(workdir)
    command = " && ".join(
        [
            "git mv old.txt new.txt",  # a rename
            "rm gone.txt",  # a deletion
            "chmod +x run.sh",  # a mode change
            "printf '\\000\\001\\002\\377' > blob.bin",  # a binary file
            "rm -r dir && echo now a file > dir",  # a directory replaced by a file
            "rm file && mkdir file && echo inside > file/x",  # a file replaced by a directory
            "echo temp > temp.txt && rm temp.txt",  # created then deleted: no change
            "mkdir -p scratch/a && touch scratch/a/t && rm -r scratch",  # likewise
            "ln -sfn new.txt link",  # a symlink retargeted
            "echo more >> tracked.log",  # tracked: counts, whatever the ignore rules say
            "echo ignored > fresh.log",  # new and ignored: no change
            "echo '*.tmp' > sub/.gitignore && echo x > sub/y.tmp && echo z > sub/z.txt",
        ]
    )
    change = await agents.change(command)
    assert changed_files(change) == {
        "blob.bin": "added",
        "dir": "added",
        "dir/a.txt": "deleted",
        "dir/deep/b.txt": "deleted",
        "file": "deleted",
        "file/x": "added",
        "gone.txt": "deleted",
        "link": "modified",
        "old.txt → new.txt": "renamed",
        "run.sh": "modified",
        "sub/.gitignore": "modified",
        "sub/z.txt": "added",
        "tracked.log": "modified",
    }
    (merge,) = await agents.trees.merges.merge_all([change])
    assert merge.fate == "merged", merge
    assert (workdir / "new.txt").read_text() == "keep me\n" * 20
    assert (workdir / "dir").read_text() == "now a file\n"
    assert (workdir / "file" / "x").read_text() == "inside\n"
    assert os.readlink(workdir / "link") == "new.txt"
    assert os.access(workdir / "run.sh", os.X_OK)
    assert (workdir / "blob.bin").read_bytes() == b"\x00\x01\x02\xff"
    assert not (workdir / "temp.txt").exists() and not (workdir / "sub" / "y.tmp").exists()
    assert git_out(workdir, "diff", "--cached", "--name-only") == ""  # the index untouched


@pytest.mark.slow
async def test_a_200_mb_file_written_in_place_is_one_small_change(
    tmp_path: Path, agents_in: type[Agents]
) -> None:
    workdir = repo(tmp_path / "r", {"small.txt": "s\n"})
    line = "0123456789abcdef" * 4 + "\n"
    with open(workdir / "big.txt", "w") as handle:
        for _ in range(200 * 1024 * 1024 // len(line)):
            handle.write(line)
    subprocess.run([*GIT, "add", "big.txt"], cwd=workdir, check=True)
    subprocess.run([*GIT, "commit", "-qm", "big"], cwd=workdir, check=True)
    agents = agents_in(workdir, change_file_max_mb=256)  # a change may hold the file
    # Overwrite 5 bytes in the middle of the file, in place.
    change = await agents.change(
        "printf 'HELLO' | dd of=big.txt bs=1 seek=104857600 conv=notrunc status=none"
    )
    (only,) = summarise(change.patch).files
    assert (only.path, only.kind, only.added, only.removed) == ("big.txt", "modified", 1, 1)
    assert len(change.patch) < 2_000
    (merge,) = await agents.trees.merges.merge_all([change])
    assert merge.fate == "merged"
    with open(workdir / "big.txt", "rb") as handle:
        handle.seek(104857600)
        assert handle.read(5) == b"HELLO"


# ----------------------------------------------------------------------------- verifiers


async def test_a_verifier_sees_its_workers_layer_and_cannot_write(
    tmp_path: Path, agents_in: type[Agents]
) -> None:
    workdir = repo(tmp_path / "r", {"a.txt": "a\n"})
    agents = agents_in(workdir)
    spec = await agents.snapshot()
    _, change, _ = await agents.run(spec, "echo worker > w.txt && rm a.txt", keep=True)
    assert change is not None
    check = Spec(change.base, change.patch, writable=False, chain=spec.chain)
    command = "cat w.txt; ls; git status --short; touch v.txt; rm -f w.txt; echo > a.txt"
    result, nothing, _ = await agents.run(check, command)
    assert nothing is None
    assert result.output.count("Read-only file system") == 3, result.output
    assert "worker" in result.output and "?? w.txt" in result.output and " D a.txt" in result.output
    # A verifier elsewhere (no kept layer: another subtask's chain) sees the same, from the patch.
    elsewhere = Spec(change.base, change.patch, writable=False, chain="9.9")
    again, _, _ = await agents.run(elsewhere, "cat w.txt; ls; touch v.txt")
    assert "worker" in again.output and "a.txt" not in again.output.split("\n")
    assert "Read-only file system" in again.output


# ------------------------------------------------------------------- who, where, fallbacks


USER = "orchmode-test"

UNPRIVILEGED = textwrap.dedent(
    """
    import asyncio, json, os, subprocess, sys
    from pathlib import Path
    from orchmode.core.settings import Settings
    from orchmode.executors.host import ShellFactory
    from orchmode.shell.bwrap import overlay_problem
    from orchmode.trees.trees import Trees
    from orchmode.trees.workspaces import Spec, Workspaces

    async def main(workdir):
        trees = Trees(workdir)
        await trees.open()
        problem = overlay_problem("bwrap", False, trees.store.run)
        workspaces = Workspaces(trees, overlays=problem is None)
        snapshot = await trees.snapshots.snapshot()
        workspace = workspaces.workspace("agent", Spec(snapshot.commit))
        await workspace.open()
        shells = ShellFactory.build(Settings(workdir=workdir), trees.workdir, ())
        shell = shells.in_workspace(workspace, lambda: asyncio.sleep(0))
        ran = await shell.run("id -u; echo mine > mine.txt; rm a.txt; stat -c %u mine.txt")
        await shell.close()
        change = await workspace.close()
        merges = await trees.merges.merge_all([change])
        trees.close()
        print(json.dumps({"problem": problem, "output": ran.output,
                          "fates": [m.fate for m in merges], "kind": type(workspace).__name__}))

    asyncio.run(main(Path(sys.argv[1])))
    """
)


@pytest.fixture
def unprivileged_tree() -> Iterator[tuple[list[str], Path, int]]:
    """A command prefix that runs as a user who is not root, and a tree that user owns."""
    base = Path(tempfile.mkdtemp(prefix="orchmode-user-", dir="/tmp"))
    os.chmod(base, 0o755)
    if os.geteuid() != 0:
        yield [], base, os.geteuid()
        shutil.rmtree(base, ignore_errors=True)
        return
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", USER], check=True)
        entry = pwd.getpwnam(USER)
    prefix = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups"]
    yield [*prefix, "env", f"HOME={base}"], base, entry.pw_uid
    shutil.rmtree(base, ignore_errors=True)


def python_for_anyone() -> tuple[str, str]:
    """A Python of this version that any user may run (this one may live in root's home),
    and the import path that finds orchmode and what it needs."""
    paths = sysconfig.get_paths()
    path = os.pathsep.join(
        dict.fromkeys([str(REPO_ROOT / "src"), paths["purelib"], paths["platlib"]])
    )
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        real = Path(os.path.realpath(candidate))
        if real.is_file() and all(os.stat(p).st_mode & 0o001 for p in [real, *real.parents]):
            return str(real), path
    pytest.fail(f"no {version} that a user who is not root may run (install Debian's {version})")


def test_overlays_work_for_a_user_who_is_not_root_and_owns_the_tree(
    unprivileged_tree: tuple[list[str], Path, int],
) -> None:
    prefix, base, uid = unprivileged_tree
    workdir = repo(base / "work", {"a.txt": "a\n", "b.txt": "b\n"})
    subprocess.run(["chown", "-R", f"{uid}:{uid}", str(base)], check=True)
    script = base / "agent.py"
    script.write_text(UNPRIVILEGED)
    python, path = python_for_anyone()
    env = {**os.environ, "PYTHONPATH": path, "GIT_CONFIG_GLOBAL": "/dev/null"}
    done = subprocess.run(
        [*prefix, python, str(script), str(workdir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["problem"] is None and answer["kind"] == "OverlayWorkspace"
    assert answer["output"].split() == [str(uid), str(uid)], answer  # itself, and its files
    assert answer["fates"] == ["merged"]
    assert (workdir / "mine.txt").read_text() == "mine\n" and not (workdir / "a.txt").exists()
    assert (workdir / "mine.txt").stat().st_uid == uid
    assert not any((workdir / ".orchmode" / "trees" / "runs").iterdir())


async def test_where_overlays_are_refused_each_agent_gets_a_full_copy(
    tmp_path: Path, agents_in: type[Agents]
) -> None:
    workdir = repo(tmp_path / "a,b", {"a.txt": "a\n"})  # a comma: mount options cannot say it
    trees = Trees(workdir)
    await trees.open()
    problem = overlay_problem("bwrap", False, trees.store.run)
    trees.close()
    assert problem is not None and "cannot carry" in problem
    agents = agents_in(workdir, overlays=False)
    spec = await agents.snapshot()
    _, change, workspace = await agents.run(spec, "echo c > c.txt && rm a.txt", keep=True)
    assert type(workspace).__name__ == "CopyWorkspace"
    assert change is not None and changed_files(change) == {"a.txt": "deleted", "c.txt": "added"}
    check = Spec(change.base, change.patch, writable=False, chain=spec.chain)
    result, _, _ = await agents.run(check, "cat c.txt; touch x")
    assert "c" in result.output and "Read-only file system" in result.output


def test_an_upper_layer_with_nothing_in_it_is_no_change(tmp_path: Path) -> None:
    upper = tmp_path / "upper"
    (upper / ".git").mkdir(parents=True)
    (upper / ".git" / "index").write_text("the agent's own git wrote this")
    (upper / "dir").mkdir()  # a directory copied up on the way, nothing changed in it
    assert scan_upper(upper).children == {}


async def test_a_verifier_of_a_worker_that_wrote_nothing_reads_the_checkout_itself(
    tmp_path: Path, agents_in: type[Agents]
) -> None:
    """A read-only review costs no overlay for its verifier: the checkout is shown as it
    is, read-only, with the ignored entries still shown from the working directory."""
    workdir = repo(tmp_path / "r", {"a.txt": "a\n", ".gitignore": ".venv/\n"})
    (workdir / ".venv").mkdir()
    (workdir / ".venv" / "tool").write_text("the venv's tool\n")
    agents = agents_in(workdir)
    spec = await agents.snapshot()
    _, change, _ = await agents.run(spec, "cat a.txt", keep=True)
    assert change is not None and change.empty
    command = "cat a.txt .venv/tool; touch b.txt; git status --short"
    for chain in (spec.chain, "elsewhere"):  # its worker's kept workspace, and one anew
        check = Spec(change.base, change.patch, writable=False, ignored=spec.ignored, chain=chain)
        result, _, workspace = await agents.run(check, command)
        assert workspace.view.overlay is None
        assert "a\nthe venv's tool" in result.output
        assert "Read-only file system" in result.output
        assert "??" not in result.output  # the mount points it holds are no change


async def test_a_tracked_file_where_a_stand_in_was_replaces_it_in_the_checkout(
    tmp_path: Path, agents_in: type[Agents]
) -> None:
    """``build/`` was ignored (the checkout holds an empty stand-in for it); then the user
    makes ``build`` a tracked file: the checkout, brought up to date, holds the file."""
    workdir = repo(tmp_path / "r", {"a.txt": "a\n", ".gitignore": "build/\n"})
    (workdir / "build").mkdir()
    (workdir / "build" / "out.o").write_text("object\n")
    agents = agents_in(workdir)
    await agents.run(await agents.snapshot(), "ls -d build")
    shutil.rmtree(workdir / "build")
    (workdir / ".gitignore").write_text("")
    (workdir / "build").write_text("now a tracked file\n")
    result, _, _ = await agents.run(await agents.snapshot(), "cat build")
    assert result.output == "now a tracked file"
