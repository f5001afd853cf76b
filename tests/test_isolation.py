"""Workers that change code, each in its own copy of the tree: real git, the real sandbox,
real HTTP to the scripted model, whose workers run the shell commands their subtasks name."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import StartServer, conversation_for, settings_for, store_for
from orchmode.core import programs
from orchmode.core.events import ChangeSettled, Event, EventBus, WorkspacesChosen
from orchmode.core.prompts import RESOLVE_MARKER
from orchmode.session.agent import Conversation as Session
from orchmode.shell.bwrap import probe
from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario
from recorded_runs import kill_run_when, orchmode, worker_prompts
from support.run_state import repo_state
from test_script import started, workflow_block

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]


@pytest.fixture(autouse=True)
def _bubblewrap_works() -> None:
    problem = probe().problem
    if problem is not None:
        pytest.fail(problem)


def command_of(subtask: str) -> str | None:
    """A subtask names its worker's command after ``$ ``."""
    return subtask.split("$ ", 1)[1] if "$ " in subtask else None


def refute_marked(prompt: str) -> str:
    return "refuted" if "REFUTE" in prompt else "confirmed"


def editing(subtasks: list[str], **kwargs: Any) -> OrchestrationScenario:
    kwargs.setdefault("verdict", refute_marked)
    return OrchestrationScenario(
        subtasks=subtasks, scout_command=None, worker_command=command_of, **kwargs
    )


def repo(root: Path, files: dict[str, str], *, git: bool = True) -> Path:
    root.mkdir()
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content)
    if git:
        subprocess.run(["git", "init", "-q", "-b", "main"], cwd=root, check=True)
        subprocess.run([*GIT, "add", "-A"], cwd=root, check=True)
        subprocess.run([*GIT, "commit", "-qm", "start"], cwd=root, check=True)
    return root


def git_out(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=True
    ).stdout


async def run(
    server: ScriptedServer, tmp_path: Path, workdir: Path, **overrides: Any
) -> tuple[list[ChangeSettled], Session]:
    """One orchestrated turn in ``workdir``; the changes it settled, and the closed session."""
    settings = settings_for(server, tmp_path, workdir=workdir, **overrides)
    events = EventBus()
    settled: list[ChangeSettled] = []

    def keep(event: Event) -> None:
        if isinstance(event, ChangeSettled):
            settled.append(event)

    events.subscribe(keep)
    tmp_path.mkdir(exist_ok=True)
    store = store_for(tmp_path)
    session = await conversation_for(settings, events=events, store=store)
    try:
        await session.turn("do the work")
    finally:
        await session.close()
    return settled, session


def tool_result_text(server: ScriptedServer) -> str:
    return str(workflow_block(server)["content"])


def nothing_left(workdir: Path) -> None:
    runs = workdir / ".orchmode" / "trees" / "runs"
    assert not runs.exists() or not any(runs.iterdir()), list(runs.iterdir())
    if (workdir / ".git").exists():
        assert git_out(workdir, "worktree", "list").count("\n") == 1
        assert "orchmode" not in git_out(workdir, "for-each-ref")


# -------------------------------------------------------------------------- the case


async def test_seven_workers_append_to_one_file_and_all_six_confirmed_changes_are_merged(
    serve: StartServer, tmp_path: Path
) -> None:
    """The issue's case: 7 workers each write a file of their own and append a line to one
    shared file; the seventh is refuted. The first append merges cleanly; each later one
    collides with those merged before it, goes to a resolver (which keeps both sides), is
    verified again and merged. All six confirmed changes land, their own files too; the
    refuted one is nowhere; the repository itself is as it was."""
    workdir = repo(tmp_path / "work", {"shared.txt": "head\n", "README": "x\n"})
    before = repo_state(workdir)
    subtasks = [
        f"Write part {i}{' REFUTE' if i == 7 else ''} $ echo part{i} > part{i}.txt && "
        f"echo from-{i} >> shared.txt"
        for i in range(1, 8)
    ]
    server = await serve(editing(subtasks, delay=0.05))
    settled, _ = await run(server, tmp_path, workdir)
    assert [(e.index, e.fate) for e in settled] == [(i, "merged") for i in range(1, 7)] + [
        (7, "not merged")
    ]
    lines = (workdir / "shared.txt").read_text().splitlines()
    assert lines[0] == "head" and sorted(lines[1:]) == [f"from-{i}" for i in range(1, 7)]
    for i in range(1, 7):
        assert (workdir / f"part{i}.txt").read_text() == f"part{i}\n"
    assert not (workdir / "part7.txt").exists()
    assert "from-7" not in (workdir / "shared.txt").read_text()
    result = tool_result_text(server)
    assert "[change 1] merged: 2 files (+2 −0)" in result
    assert "[change 2] merged after resolving a conflict with change 1: " in result
    assert "[change 3] merged after resolving a conflict with changes 1 and 2: " in result
    assert "[change 7] not merged (refuted)" in result
    assert len(started(server, "resolver")) == 5
    assert repo_state(workdir) == before
    nothing_left(workdir)


async def test_seven_workers_on_files_of_their_own_all_land_but_the_refuted_one(
    serve: StartServer, tmp_path: Path
) -> None:
    workdir = repo(tmp_path / "work", {"README": "x\n"})
    subtasks = [
        f"Write part {i}{' REFUTE' if i == 7 else ''} $ echo part{i} > part{i}.txt"
        for i in range(1, 8)
    ]
    server = await serve(editing(subtasks, delay=0.05))
    settled, _ = await run(server, tmp_path, workdir)
    assert [e.fate for e in settled] == ["merged"] * 6 + ["not merged"]
    for i in range(1, 7):
        assert (workdir / f"part{i}.txt").read_text() == f"part{i}\n"
    assert not (workdir / "part7.txt").exists()
    assert "[change 1] merged: 1 file (+1 −0): part1.txt (+1 −0)" in tool_result_text(server)
    nothing_left(workdir)


#: Two workers that change the same line: a conflict, whichever merges first.
RAISE_THE_LIMIT = [
    "Raise the limit to 2 $ sed -i 's/LIMIT = 1/LIMIT = 2/' config.py",
    "Raise the limit to 3 $ sed -i 's/LIMIT = 1/LIMIT = 3/' config.py",
]


async def test_with_resolve_keep_a_conflict_is_kept_whole_and_readable(
    serve: StartServer, tmp_path: Path
) -> None:
    workdir = repo(tmp_path / "work", {"config.py": "LIMIT = 1\nNAME = 'a'\n"})
    subtasks = RAISE_THE_LIMIT
    server = await serve(editing(subtasks))
    settled, session = await run(server, tmp_path, workdir, resolve="keep")
    assert [e.fate for e in settled] == ["merged", "conflict"]
    assert (workdir / "config.py").read_text() == "LIMIT = 2\nNAME = 'a'\n"
    conflict = settled[1]
    assert "config.py" in conflict.detail
    patch = Path(conflict.path)
    assert patch.is_file() and "+LIMIT = 3" in patch.read_text()
    result = tool_result_text(server)
    assert f"[change 2] conflict in config.py (kept as {patch}): not applied" in result
    assert started(server, "resolver") == []
    # The main agent reads the kept patch from its own sandbox, and cannot change it.
    shell = session.make_shell()
    try:
        shown = await shell.run(f"cat {patch} && echo more >> {patch}")
    finally:
        await shell.close()
    assert "+LIMIT = 3" in shown.output
    assert "Read-only file system" in shown.output or "Permission denied" in shown.output
    # Nothing of the conflicting patch was written, and it still applies to its base.
    assert "LIMIT = 3" not in (workdir / "config.py").read_text()


async def test_each_verifier_checks_its_own_workers_change_in_a_read_only_copy(
    serve: StartServer, tmp_path: Path
) -> None:
    workdir = repo(tmp_path / "work", {"a.txt": "a\n"})
    subtasks = [f"Write note {i} $ echo note-{i} > note.txt && git add -A" for i in (1, 2)]
    scenario = editing(
        subtasks, verifier_command="git status --short; cat note.txt; touch probe.txt"
    )
    server = await serve(scenario)
    settled, _ = await run(server, tmp_path, workdir, merge="none")
    assert [e.fate for e in settled] == ["kept", "kept"]
    outputs = {}
    for entry in server.log:
        first = str(entry.body["messages"][0]["content"])
        if "Try hard to refute" in first and len(entry.body["messages"]) == 3:
            outputs[first] = json.dumps(entry.body["messages"][-1]["content"])
    assert len(outputs) == 2
    for prompt, output in outputs.items():
        mine = "note-1" if "Write note 1" in prompt else "note-2"
        other = "note-2" if mine == "note-1" else "note-1"
        assert mine in output and other not in output
        assert "note.txt" in output  # its worker's change, in its copy
        assert "Read-only file system" in output
        assert "It also changed the tree (patch" in prompt
    # merge = none: nothing applied, both patches kept.
    assert not (workdir / "note.txt").exists()
    assert all(Path(e.path).is_file() for e in settled)


async def test_a_repositorys_own_git_unshare_mount_and_bash_never_run_in_their_place(
    serve: StartServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PATH whose first entry is empty (``PATH=$UNSET:$PATH`` leaves one) names the
    current directory, and orchmode runs in the repository: one that ships executables
    named after the programs orchmode runs for its own work gets none of them run, neither
    on the host (git, the overlay's unshare and mount, bubblewrap) nor as the agent's
    shell. Each fake leaves a mark where only a process on the host could write it."""
    marks = tmp_path / "marks"
    marks.mkdir()
    names = ("git", "unshare", "mount", "bash", "bwrap", "true", "sh")
    fakes = {name: f"#!/bin/sh\necho {name} >> {marks}/{name}\nexit 97\n" for name in names}
    workdir = repo(tmp_path / "work", {"README": "x\n", **fakes})
    for name in names:
        (workdir / name).chmod(0o755)
    subprocess.run([*GIT, "commit", "-qam", "the repository's own programs"], cwd=workdir)
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("PATH", os.pathsep + os.environ["PATH"])
    programs.program.cache_clear()
    programs.system_program.cache_clear()
    try:
        server = await serve(editing(["Make a file $ echo made > made.txt"], delay=0.05))
        settled, _ = await run(server, tmp_path, workdir)
    finally:
        programs.program.cache_clear()
        programs.system_program.cache_clear()
    assert sorted(p.name for p in marks.iterdir()) == []
    assert [e.fate for e in settled] == ["merged"]
    assert (workdir / "made.txt").read_text() == "made\n"


async def test_binary_deletion_rename_and_mode_change_reach_the_tree(
    serve: StartServer, tmp_path: Path
) -> None:
    workdir = repo(
        tmp_path / "work",
        {"old.txt": "keep me\n" * 20, "gone.txt": "bye\n", "run.sh": "echo hi\n"},
    )
    command = (
        "git mv old.txt new.txt && rm gone.txt && chmod +x run.sh && "
        "printf '\\000\\001\\002\\377' > blob.bin"
    )
    server = await serve(editing([f"Reshape the tree $ {command}"]))
    settled, _ = await run(server, tmp_path, workdir)
    assert [e.fate for e in settled] == ["merged"], settled
    assert (workdir / "new.txt").read_text() == "keep me\n" * 20
    assert not (workdir / "old.txt").exists() and not (workdir / "gone.txt").exists()
    assert os.access(workdir / "run.sh", os.X_OK)
    assert (workdir / "blob.bin").read_bytes() == b"\x00\x01\x02\xff"
    assert "old.txt → new.txt" in settled[0].files
    # The user's index still says what it said: the merge wrote the working tree only.
    assert git_out(workdir, "diff", "--cached", "--name-only") == ""


async def test_workers_see_uncommitted_edits_and_ignored_dirs_read_only(
    serve: StartServer, tmp_path: Path
) -> None:
    workdir = repo(tmp_path / "work", {".gitignore": ".venv/\n", "app.py": "v = 1\n"})
    (workdir / "app.py").write_text("v = 2  # not committed\n")
    (workdir / "draft.md").write_text("an untracked draft\n")
    (workdir / ".venv" / "bin").mkdir(parents=True)
    (workdir / ".venv" / "bin" / "tool").write_text("the venv's tool\n")
    command = "cat app.py draft.md .venv/bin/tool; touch .venv/new 2>&1; pwd"
    server = await serve(editing([f"Look $ {command}"]))
    settled, _ = await run(server, tmp_path, workdir)
    assert [e.fate for e in settled] == ["no change"] or not settled
    output = json.dumps([e.body for e in server.log if "Look $" in json.dumps(e.body)])
    assert "not committed" in output and "an untracked draft" in output
    assert "the venv's tool" in output
    assert "Read-only file system" in output
    assert str(workdir) in output  # the copy is shown at the working directory's path
    assert not (workdir / ".venv" / "new").exists()


async def test_refused_patches_and_a_read_only_git_dir(serve: StartServer, tmp_path: Path) -> None:
    workdir = repo(tmp_path / "work", {"a.txt": "a\n"})
    subtasks = [
        "Escape $ ln -s /etc/passwd escape",
        "Settings $ echo 'sandbox = \"off\"' > orchmode.toml",
        "State $ mkdir -p .orchmode/x 2>&1; echo x > .orchmode/x/y 2>&1; echo tried",
    ]
    server = await serve(editing(subtasks))
    settled, _ = await run(server, tmp_path, workdir)
    fates = {e.index: (e.fate, e.detail) for e in settled}
    assert fates[1][0] == "refused" and "points outside the tree" in fates[1][1]
    assert fates[2][0] == "refused" and "settings" in fates[2][1]
    assert 3 not in fates  # its writes to .orchmode failed: no change at all
    assert "[change 3] no change" in tool_result_text(server)
    assert not (workdir / "escape").is_symlink()
    assert not (workdir / "orchmode.toml").exists()
    # In the shared tree too, the repository itself is read-only to agents.
    server = await serve(editing(["Hook $ echo evil > .git/hooks/pre-commit 2>&1; echo done"]))
    await run(server, tmp_path / "second", workdir, isolation="shared")
    assert not (workdir / ".git" / "hooks" / "pre-commit").exists()
    assert "Read-only file system" in json.dumps([e.body for e in server.log])


async def test_a_directory_that_is_not_a_git_repository(serve: StartServer, tmp_path: Path) -> None:
    workdir = repo(tmp_path / "plain", {"notes.txt": "one\n", "sub/deep.txt": "d\n"}, git=False)
    subtasks = [
        "Extend $ echo two >> notes.txt && rm sub/deep.txt",
        "Add $ mkdir -p docs && echo hello > docs/hi.md",
    ]
    server = await serve(editing(subtasks))
    settled, _ = await run(server, tmp_path, workdir)
    assert [e.fate for e in settled] == ["merged", "merged"]
    assert (workdir / "notes.txt").read_text() == "one\ntwo\n"
    assert not (workdir / "sub" / "deep.txt").exists()
    assert (workdir / "docs" / "hi.md").read_text() == "hello\n"
    assert not (workdir / ".git").exists()
    nothing_left(workdir)


async def test_a_user_edit_made_during_the_call_is_merged_with_not_overwritten(
    serve: StartServer, tmp_path: Path
) -> None:
    """The user edits one file while the workers run: a worker's change to another part of
    it merges around the edit; a worker's change to the same line conflicts with the edit,
    and goes to a resolver, whose resolution keeps both."""
    lines = "".join(f"line {i}\n" for i in range(1, 21))
    workdir = repo(tmp_path / "work", {"doc.txt": lines})
    edit = f"sed -i 's/^line 1$/line 1 (user)/' {workdir}/doc.txt"
    subtasks = [
        "Touch the end $ sed -i 's/^line 20$/line 20 (worker)/' doc.txt",
        "Touch the start $ sed -i 's/^line 1$/line 1 (worker)/' doc.txt",
    ]

    def user_edits_then_confirms(prompt: str) -> str:
        # Asked of a verifier: the workers have their copies by now, the merge is to come.
        subprocess.run(edit, shell=True, check=True)
        return "confirmed"

    server = await serve(editing(subtasks, verdict=user_edits_then_confirms))
    settled, _ = await run(server, tmp_path, workdir, max_concurrent=1)
    text = (workdir / "doc.txt").read_text()
    assert "line 1 (user)" in text
    assert "line 20 (worker)" in text
    assert "line 1 (worker)" in text
    assert [e.fate for e in settled] == ["merged", "merged"]
    assert settled[1].detail == (
        "after resolving a conflict with change 1 and your edits made since the call began"
    )
    (resolver,) = started(server, "resolver")
    assert "<<<<<<< as-merged\n" in resolver and "line 1 (user)" in resolver


async def test_shared_isolation_writes_directly_as_before(
    serve: StartServer, tmp_path: Path
) -> None:
    workdir = repo(tmp_path / "work", {"a.txt": "a\n"})
    server = await serve(editing(["Write $ echo direct > b.txt", "Write REFUTE $ echo c > c.txt"]))
    settled, _ = await run(server, tmp_path, workdir, isolation="shared")
    assert settled == []
    assert (workdir / "b.txt").read_text() == "direct\n"
    assert (workdir / "c.txt").exists()  # shared: even a refuted worker's write stays
    assert "[change" not in tool_result_text(server)
    assert len(started(server, "worker")) == 2


@pytest.mark.slow
def test_kill_9_mid_fanout_leaves_nothing_after_the_next_start_and_resume_merges(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """A run killed while its workers' copies exist leaves them; the next start sweeps
    them, and the resume merges every change once — finished workers' patches come from
    the journal, not from running them again."""
    workdir = repo(tmp_path / "work", {"base.txt": "base\n"})
    before = repo_state(workdir)
    subtasks = [f"Write part {i} $ echo part{i} > part{i}.txt" for i in range(1, 7)]
    scenario = editing(subtasks, delay=0.3)
    server = scripted(scenario)
    runs = workdir / ".orchmode" / "trees" / "runs"

    journal = workdir / ".orchmode" / "journal.db"

    def copies_exist() -> bool:
        return runs.is_dir() and any(p.is_dir() for r in runs.iterdir() for p in r.iterdir())

    def some_finished_and_copies_exist() -> bool:
        return copies_exist() and journal.exists() and len(worker_prompts(journal)) >= 2

    flags = ("--base-url", server.url, "--claim-lease", "2", "--max-concurrent", "3")
    kill_run_when(some_finished_and_copies_exist, "write the parts", *flags, cwd=workdir)
    assert copies_exist()  # kill -9: nothing cleaned up
    left = list(runs.iterdir())
    scenario.delay = 0.0
    since = len(server.log)
    done = orchmode("resume", *flags[:4], cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert not any(r.exists() for r in left)
    nothing_left(workdir)
    for i in range(1, 7):
        assert (workdir / f"part{i}.txt").read_text() == f"part{i}\n"
    assert repo_state(workdir) == before
    workers_asked = [
        str(e.body["messages"][0]["content"])
        for e in server.log[since:]
        if len(e.body["messages"]) == 1
        and "Write part" in str(e.body["messages"][0]["content"])
        and "Try hard" not in str(e.body["messages"][0]["content"])
    ]
    assert len(workers_asked) < 6  # the finished ones came from the journal


def journal_rows(journal: Path, role: str) -> list[str]:
    """The prompts of the ``role`` rows recorded in a SQLite journal so far."""
    if not journal.exists():
        return []
    try:
        db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)
        try:
            query = "SELECT prompt FROM results WHERE role = ?"
            return [row[0] for row in db.execute(query, (role,))]
        finally:
            db.close()
    except sqlite3.OperationalError:  # not created yet
        return []


@pytest.mark.slow
def test_kill_9_after_a_confirmed_resolution_and_resume_merges_every_change_once(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """Killed once a resolution is confirmed (recorded, written or not): the resume merges
    every confirmed change exactly once, runs no finished resolver again, and leaves no
    workspace behind."""
    workdir = repo(tmp_path / "work", {"shared.txt": "head\n"})
    before = repo_state(workdir)
    subtasks = [
        f"Write part {i} $ echo part{i} > part{i}.txt && echo from-{i} >> shared.txt"
        for i in range(1, 5)
    ]
    scenario = editing(subtasks, delay=0.2)
    server = scripted(scenario)
    journal = workdir / ".orchmode" / "journal.db"

    def a_resolution_is_confirmed() -> bool:
        return any(p.startswith("resolution of change") for p in journal_rows(journal, "resolver"))

    flags = ("--base-url", server.url, "--claim-lease", "2")
    kill_run_when(a_resolution_is_confirmed, "write the parts", *flags, cwd=workdir)
    finished = [p for p in journal_rows(journal, "resolver") if p.startswith(RESOLVE_MARKER)]
    assert finished  # the confirmed resolution's resolver, at least
    scenario.delay = 0.0
    since = len(server.log)
    done = orchmode("resume", *flags, cwd=workdir)
    assert done.returncode == 0, done.stderr
    lines = (workdir / "shared.txt").read_text().splitlines()
    assert lines[0] == "head" and sorted(lines[1:]) == [f"from-{i}" for i in range(1, 5)]
    for i in range(1, 5):
        assert (workdir / f"part{i}.txt").read_text() == f"part{i}\n"
    asked_again = started(server, "resolver", since)
    assert not set(asked_again) & set(finished)  # no finished resolution is redone
    assert repo_state(workdir) == before
    nothing_left(workdir)


@pytest.mark.slow
def test_kill_9_after_later_changes_were_written_over_a_merged_one_resumes_without_merging_it_again(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """Killed once the second change's resolution is written over the first change's line:
    the resume takes the changes already written as merged (the journal says so) rather
    than merging the first again onto a tree that has both lines — a conflict that would
    go to a resolver — and every line is there once."""
    workdir = repo(tmp_path / "work", {"shared.txt": "head\n"})
    subtasks = [f"Write part {i} $ echo from-{i} >> shared.txt" for i in range(1, 4)]
    scenario = editing(subtasks, delay=0.2)
    server = scripted(scenario)
    shared = workdir / "shared.txt"

    def second_written() -> bool:
        return "from-2" in shared.read_text()

    flags = ("--base-url", server.url, "--claim-lease", "2")
    kill_run_when(second_written, "write the parts", *flags, cwd=workdir)
    scenario.delay = 0.0
    since = len(server.log)
    done = orchmode("resume", *flags, cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert shared.read_text() == "head\nfrom-1\nfrom-2\nfrom-3\n"
    asked = started(server, "resolver", since)
    assert not [p for p in asked if "<subtask>\nWrite part 1 " in p], asked
    result = next(
        str(e.body["messages"][-1]["content"])
        for e in server.log[since:]
        if "[change 1]" in str(e.body["messages"][-1]["content"])
    )
    assert "[change 1] merged: 1 file (+1 −0)" in result
    assert "[change 2] merged after resolving a conflict with change 1" in result
    nothing_left(workdir)


async def test_a_resolution_its_verifier_refutes_stays_out_and_the_change_is_kept(
    serve: StartServer, tmp_path: Path
) -> None:
    workdir = repo(tmp_path / "work", {"config.py": "LIMIT = 1\nNAME = 'a'\n"})
    subtasks = RAISE_THE_LIMIT

    def refute_resolutions(prompt: str) -> str:
        return "refuted" if "resolved a merge conflict" in prompt else "confirmed"

    server = await serve(editing(subtasks, verdict=refute_resolutions))
    settled, _ = await run(server, tmp_path, workdir)
    assert [e.fate for e in settled] == ["merged", "conflict"]
    assert (workdir / "config.py").read_text() == "LIMIT = 2\nNAME = 'a'\n"
    assert "its resolution was refuted" in settled[1].detail
    patch = Path(settled[1].path)
    assert patch.is_file() and "+LIMIT = 3" in patch.read_text()
    result = tool_result_text(server)
    assert "[change 2] conflict in config.py (kept as " in result
    assert "a resolver tried, but its resolution was refuted" in result
    (resolver,) = started(server, "resolver")
    assert "<<<<<<< as-merged\n" in resolver and ">>>>>>> change-2" in resolver
    assert "Raise the limit to 3" in resolver  # the subtask as it was given
    verifiers = started(server, "verifier")
    assert len(verifiers) == 3 and "LIMIT = 3" in verifiers[-1]  # both intents, shown


async def test_a_resolver_that_leaves_markers_is_not_verified_and_the_change_is_kept(
    serve: StartServer, tmp_path: Path
) -> None:
    workdir = repo(tmp_path / "work", {"config.py": "LIMIT = 1\n"})
    subtasks = [f"Limit {n} $ sed -i 's/LIMIT = 1/LIMIT = {n}/' config.py" for n in (2, 3)]
    server = await serve(editing(subtasks, resolver_command="cat config.py"))
    settled, _ = await run(server, tmp_path, workdir)
    assert [e.fate for e in settled] == ["merged", "conflict"]
    assert "conflict markers are left in config.py" in settled[1].detail
    assert len(started(server, "verifier")) == 2  # no verifier for a resolution left undone
    assert (workdir / "config.py").read_text() == "LIMIT = 2\n"


async def test_resolvers_count_against_the_budget(serve: StartServer, tmp_path: Path) -> None:
    workdir = repo(tmp_path / "work", {"config.py": "LIMIT = 1\n"})
    subtasks = [f"Limit {n} $ sed -i 's/LIMIT = 1/LIMIT = {n}/' config.py" for n in (2, 3)]
    server = await serve(editing(subtasks))
    settled, _ = await run(server, tmp_path, workdir, max_subagents=4)
    assert [e.fate for e in settled] == ["merged", "conflict"]
    assert "the session's budget is used up" in settled[1].detail
    assert started(server, "resolver") == []


async def test_a_call_chooses_worktree_in_a_shared_session_and_a_bad_value_is_an_error(
    serve: StartServer, tmp_path: Path
) -> None:
    workdir = repo(tmp_path / "work", {"a.txt": "a\n"})
    scenario = editing(["Write REFUTE $ echo c > c.txt"], workflow_input={"isolation": "worktree"})
    server = await serve(scenario)
    settled, _ = await run(server, tmp_path, workdir, isolation="shared")
    assert [e.fate for e in settled] == ["not merged"]
    assert not (workdir / "c.txt").exists()
    scenario.workflow_input = {"isolation": "sideways"}
    server = await serve(scenario)
    await run(server, tmp_path / "again", workdir)
    block = workflow_block(server)
    assert block.get("is_error") and '"isolation" must be "worktree"' in str(block["content"])
    assert started(server, "worker") == []


SCRIPT = """
done = parallel(["Part A $ echo a > a.txt", "Part B REFUTE $ echo b > b.txt"], isolation="worktree")
checks = [verify(p, r) for p, r in zip(["Part A", "Part B REFUTE"], done)]
[c["verdict"] for c in checks]
"""


async def test_a_script_s_isolated_agents_are_verified_in_their_copies_then_merged(
    serve: StartServer, tmp_path: Path
) -> None:
    workdir = repo(tmp_path / "work", {"base.txt": "x\n"})
    server = await serve(editing([], script=SCRIPT, verifier_command="cat a.txt b.txt 2>&1"))
    settled, _ = await run(server, tmp_path, workdir, isolation="shared")
    assert [(e.index, e.fate) for e in settled] == [(1, "merged"), (2, "not merged")]
    assert (workdir / "a.txt").read_text() == "a\n" and not (workdir / "b.txt").exists()
    text = str(workflow_block(server)["content"])
    assert text.startswith('["confirmed", "refuted"]')
    assert "[change 1] merged" in text and "[change 2] not merged (refuted)" in text


async def test_a_verifier_checks_the_copy_its_worker_left_even_when_nothing_changed(
    serve: StartServer, tmp_path: Path
) -> None:
    # Each worker notes its name in its copy's own .git, which is no part of its change;
    # a verifier shown that same copy reads it back, a fresh copy has none.
    workdir = repo(tmp_path / "work", {"a.txt": "a\n"})
    subtasks = [f"Look at {i} $ git config user.name pair-{i}" for i in range(1, 7)]
    scenario = editing(
        subtasks, verifier_command="echo copy-of-$(git config user.name || echo nobody)"
    )
    server = await serve(scenario)
    await run(server, tmp_path, workdir, max_concurrent=3)
    seen = {}
    for entry in server.log:
        first = str(entry.body["messages"][0]["content"])
        if "Try hard to refute" in first and len(entry.body["messages"]) == 3:
            seen[first] = json.dumps(entry.body["messages"][-1]["content"])
    assert len(seen) == 6
    for prompt, output in seen.items():
        mine = next(i for i in range(1, 7) if f"Look at {i} " in prompt)
        assert f"copy-of-pair-{mine}" in output, output
    nothing_left(workdir)


APPENDING_SCRIPT = """
entries = ["Entry A $ echo a >> list.txt", "Entry B $ echo b >> list.txt"]
done = parallel(entries, isolation="worktree")
[verify(p, r)["verdict"] for p, r in zip(entries, done)]
"""


async def test_a_script_s_conflicting_changes_are_resolved_too(
    serve: StartServer, tmp_path: Path
) -> None:
    workdir = repo(tmp_path / "work", {"list.txt": "head\n"})
    server = await serve(editing([], script=APPENDING_SCRIPT))
    settled, _ = await run(server, tmp_path, workdir, isolation="shared")
    assert [(e.index, e.fate) for e in settled] == [(1, "merged"), (2, "merged")]
    assert settled[1].detail == "after resolving a conflict with change 1"
    assert (workdir / "list.txt").read_text() == "head\na\nb\n"
    text = str(workflow_block(server)["content"])
    assert "[change 2] merged after resolving a conflict with change 1" in text


async def test_a_snapshot_that_cannot_be_taken_stops_the_call_with_a_clear_error(
    serve: StartServer, tmp_path: Path
) -> None:
    """The snapshot is taken while the workers' first requests are in flight; when it is
    refused (here, 250 MB of untracked files nobody ignored), the call's agents are stopped,
    nothing is merged, and the model is told why and what to do."""
    workdir = repo(tmp_path / "work", {"a.txt": "a\n"})
    with open(workdir / "dump.bin", "wb") as handle:
        handle.truncate(250_000_000)  # sparse: large to git, cheap to make
    server = await serve(editing(["Write $ echo b > b.txt"], delay=0.2))
    settled, _ = await run(server, tmp_path, workdir)
    assert settled == []
    block = workflow_block(server)
    assert block.get("is_error")
    text = str(block["content"])
    assert "250 MB of untracked files" in text and "dump.bin" in text
    assert '"isolation": "shared"' in text
    assert not (workdir / "b.txt").exists()
    nothing_left(workdir)


async def test_where_overlays_are_refused_the_run_says_so_once_and_copies_still_merge(
    serve: StartServer, tmp_path: Path
) -> None:
    workdir = repo(tmp_path / "a,b", {"a.txt": "a\n"})  # a comma: mount options cannot say it
    events = EventBus()
    chosen: list[WorkspacesChosen] = []
    events.subscribe(lambda e: chosen.append(e) if isinstance(e, WorkspacesChosen) else None)
    subtasks = [f"Write {i} $ echo {i} > f{i}.txt" for i in range(1, 4)]
    server = await serve(editing(subtasks))
    settings = settings_for(server, tmp_path, workdir=workdir)
    session = await conversation_for(settings, events=events, store=store_for(tmp_path))
    try:
        await session.turn("do the work")
    finally:
        await session.close()
    (said,) = chosen
    assert not said.overlays and "cannot carry" in said.reason
    for i in range(1, 4):
        assert (workdir / f"f{i}.txt").read_text() == f"{i}\n"
    nothing_left(workdir)
