"""The fault suite's store faults: real `orchmode` processes against the scripted server,
with the PostgreSQL server stopped under them, the disk under `.orchmode/` full, and the
SQLite journal damaged. (Two resumes of one session at once: test_resume.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, role_of
from recorded_runs import base_env, orchmode, scripted_server
from support.postgres import PostgresServer, PostgresUnavailable, postgres_instance
from support.store_faults import (
    DAMAGES,
    FaultUnavailable,
    damage_journal,
    fill_disk,
    restart_postgres_during,
    stop_postgres_when,
    tmpfs,
)

pytestmark = pytest.mark.faults

#: A short lease, so the claims of a run that stopped lapse quickly for its resume.
LEASE = ("--claim-lease", "2")
WORKERS = 8


def scenario(**kw: Any) -> OrchestrationScenario:
    return OrchestrationScenario(subtasks=WORKERS, **kw)


def uninterrupted(server: ScriptedServer, where: Path, *flags: str) -> str:
    """What the run prints on stdout when nothing goes wrong."""
    where.mkdir()
    result = orchmode("run", "review this", "--base-url", server.url, *flags, cwd=where)
    assert result.returncode == 0, result.stderr
    return result.stdout


def start_run(
    server: ScriptedServer, cwd: Path, *flags: str, python: tuple[str, ...] = ("-m", "orchmode")
) -> tuple[subprocess.Popen[str], Path, Path]:
    """``orchmode run`` in the background; the process and the files of its stdout, stderr."""
    out, err = cwd / "run.out", cwd / "run.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, *python, "run", "review this", "--base-url", server.url,
             "--plain", *flags],
            cwd=cwd, env=base_env(), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
            text=True,
        )  # fmt: skip
    return process, out, err


def while_running(process: subprocess.Popen[str], ready: Callable[[], bool]) -> Callable[[], bool]:
    """``ready``, failing at once if the run has already ended."""

    def check() -> bool:
        assert process.poll() is None, "the run ended before the fault"
        return ready()

    return check


def workers_answered(server: ScriptedServer) -> int:
    """Workers whose last request (their report) the scripted server has answered."""
    return sum(
        1
        for e in server.log
        if e.outcome == "ok"
        and e.path == "/v1/messages"
        and role_of(e.body) != "main"
        and len(e.body.get("messages", [])) > 1
        and str(e.body["messages"][0]["content"]).startswith("Check item")
    )


def first_requests(server: ScriptedServer) -> list[str]:
    """Each subagent's first request (its prompt), as often as it was sent."""
    return [
        str(e.body["messages"][0]["content"])
        for e in server.log
        if e.path == "/v1/messages"
        and role_of(e.body) != "main"
        and len(e.body.get("messages", [])) == 1
    ]


def one_line_error(stderr: str, *, notices: tuple[str, ...] = ()) -> str:
    """The command's one error line, its last; fails on any other line but progress
    (``[…]``) and the ``notices`` expected before it."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.strip().splitlines() if not line.startswith(("[", *notices))]
    assert len(lines) == 1 and lines[0].startswith("orchmode: "), stderr
    assert lines[0] == stderr.strip().splitlines()[-1]
    return lines[0]


# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    """A private PostgreSQL server of this test's own, to stop and start again."""
    try:
        with postgres_instance() as server:
            yield server
    except PostgresUnavailable as exc:
        if os.environ.get("ORCHMODE_TEST_POSTGRES") == "required":
            pytest.fail(f"{exc} (ORCHMODE_TEST_POSTGRES=required)")
        pytest.skip(str(exc))


def recorded_results(url: str) -> list[tuple[str, int]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [
            (str(r[0]), int(r[1]))
            for r in conn.execute("SELECT role, COUNT(*) FROM results GROUP BY role ORDER BY role")
        ]


@pytest.mark.postgres
def test_postgresql_stopped_and_started_again_mid_fanout_the_run_completes(
    scripted: Callable[..., ScriptedServer], tmp_path: Path, postgres: PostgresServer
) -> None:
    expected = uninterrupted(scripted(scenario(delay=0.2)), tmp_path / "uninterrupted")
    server = scripted(scenario(delay=0.2))
    store = ("--store", postgres.url)
    process, out, err = start_run(server, tmp_path, "--max-concurrent", "2", *LEASE, *store)
    down = restart_postgres_during(
        postgres,
        while_running(process, lambda: workers_answered(server) >= 3),
        down_at_least=3.0,  # longer than the lease: the claims lapse meanwhile
    )
    assert process.wait(timeout=120) == 0, err.read_text()
    stderr = err.read_text()
    assert out.read_text() == expected
    assert "Traceback" not in stderr
    assert "lost the store" in stderr and "answers again" in stderr  # it did see the outage
    assert down >= 3.0
    # each agent run and recorded once: no prompt asked twice, one result row each
    asked = first_requests(server)
    assert len(asked) == len(set(asked)) == 2 * WORKERS
    assert recorded_results(postgres.url) == [("verifier", WORKERS), ("worker", WORKERS)]
    print(f"PostgreSQL was down for {down:.2f} s mid fan-out")


#: ``orchmode`` with the outage limit shortened, so a test need not wait out the 60 s.
def outage_limit(seconds: float) -> tuple[str, ...]:
    return (
        "-c",
        "import sys, orchmode.store.postgres as p; from orchmode.cli.commands import main; "
        f"p.OUTAGE_LIMIT = {seconds}; sys.exit(main())",
    )


@pytest.mark.postgres
def test_postgresql_down_past_the_outage_limit_stops_the_run_resumably(
    scripted: Callable[..., ScriptedServer], tmp_path: Path, postgres: PostgresServer
) -> None:
    expected = uninterrupted(scripted(scenario(delay=0.2)), tmp_path / "uninterrupted")
    server = scripted(scenario(delay=0.2))
    store = ("--store", postgres.url)
    process, _, err = start_run(
        server, tmp_path, "--max-concurrent", "2", *LEASE, *store, python=outage_limit(2)
    )
    stopped = stop_postgres_when(
        postgres, while_running(process, lambda: workers_answered(server) >= 3)
    )
    code = process.wait(timeout=60)
    stopped_for = time.monotonic() - stopped
    stderr = err.read_text()
    assert code == 6, stderr
    # A fast shutdown ends the server's backends one by one: a retry can still find a live
    # pooled connection, so "answers again" and a second "lost" may come before the stop.
    notices = ("orchmode: WARNING: lost the store at", "orchmode: WARNING: the store at")
    line = one_line_error(stderr, notices=notices)
    assert line.startswith(
        f"orchmode: the store at postgresql://orchmode@127.0.0.1:{postgres.port}"
    )
    assert "has been unreachable for 2 s" in line and "`orchmode resume`" in line, line
    password = postgres.url.split(":")[2].split("@")[0]
    assert password not in stderr
    assert 2 <= stopped_for < 30  # the limit, and not much longer
    print(f"the run stopped {stopped_for:.1f} s after the server did: {line}")
    postgres.start()
    result = orchmode("resume", "--base-url", server.url, *LEASE, *store, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected
    assert recorded_results(postgres.url) == [("verifier", WORKERS), ("worker", WORKERS)]


# --------------------------------------------------------------------------- disk full

#: Reports of real size, so the run needs a few MB under .orchmode/.
BIG = {"report_bytes": 30_000, "verifier_report_bytes": 10_000}


def leftovers(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.name.startswith((".tmp-", ".journal.db.new-"))]


@pytest.fixture
def nearly_full(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A working directory whose `.orchmode/` is a 16 MB tmpfs with 1.2 MB left (a run
    needs about 3 MB), and the file that fills it: unlink it to free the space."""
    work = tmp_path / "work"
    work.mkdir()
    state = work / ".orchmode"
    try:
        mounted = tmpfs(state, 16 << 20)
        mounted.__enter__()
    except FaultUnavailable as exc:
        pytest.skip(f"cannot stage a full disk here: {exc}")
    try:
        yield work, fill_disk(state, 1_200_000)
    finally:
        mounted.__exit__(None, None, None)


def test_a_full_disk_stops_the_run_in_one_line_and_a_resume_after_freeing_space_finishes_it(
    scripted: Callable[..., ScriptedServer], tmp_path: Path, nearly_full: tuple[Path, Path]
) -> None:
    server = scripted(scenario(**BIG))
    expected = uninterrupted(server, tmp_path / "uninterrupted")
    work, filler = nearly_full
    state = work / ".orchmode"
    run = orchmode("run", "review this", "--base-url", server.url, "--plain", cwd=work)
    assert run.returncode == 6, run.stderr
    line = one_line_error(run.stderr)
    assert "the disk is full" in line and f"{state}/" in line, line
    assert "`orchmode resume`" in line
    # nothing half-written: the journal whole, every result file whole, no temp file
    db = sqlite3.connect(f"file:{state / 'journal.db'}?mode=ro", uri=True)
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        db.close()
    written = list(state.glob("results/*/*.json"))
    for path in written:
        assert json.loads(path.read_text())["role"] in ("worker", "verifier")
    assert len(written) < 2 * WORKERS
    assert not leftovers(state)
    filler.unlink()
    result = orchmode("resume", "--base-url", server.url, *LEASE, cwd=work)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected
    assert len(list(state.glob("results/*/*.json"))) == 2 * WORKERS
    assert not leftovers(state)


def test_a_full_disk_ends_a_chat_in_one_line_instead_of_failing_every_later_turn(
    scripted: Callable[..., ScriptedServer], nearly_full: tuple[Path, Path]
) -> None:
    server = scripted(scenario(**BIG))
    work, filler = nearly_full
    chat = subprocess.run(
        [sys.executable, "-m", "orchmode", "chat", "--base-url", server.url,
         "--session", "full", *LEASE],
        cwd=work, env=base_env(), input="review this\nnever sent\n", capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert chat.returncode == 6, chat.stderr
    line = one_line_error(chat.stderr)
    assert "the disk is full" in line and "`orchmode resume`" in line, line
    assert "never sent" not in json.dumps([e.body for e in server.log])
    filler.unlink()
    result = orchmode("resume", "full", "--base-url", server.url, *LEASE, cwd=work)
    assert result.returncode == 0, result.stderr
    assert f"{WORKERS} agents reported; {WORKERS} results were confirmed" in result.stdout


# --------------------------------------------------------------------------- damaged journal


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with one finished run recorded in its journal (made once)."""
    where = tmp_path_factory.mktemp("recorded")
    with scripted_server(scenario()) as server:
        result = orchmode("run", "review this", "--base-url", server.url, cwd=where)
    assert result.returncode == 0, result.stderr
    return where


#: Every command that reads the journal.
READERS = (("resume",), ("run", "review this"), ("show",), ("budget",), ("runs",), ("report",))


def digest(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_journal_is_one_line_naming_it_and_is_left_as_it_was(
    recorded_run: Path, tmp_path: Path, how: str
) -> None:
    work = tmp_path / "work"
    shutil.copytree(recorded_run, work)
    damaged = damage_journal(work / ".orchmode" / "journal.db", how, seed=26)
    before = digest(work / ".orchmode")
    # nothing answers at this address: a command that got past the journal would say so
    unreachable = ("--base-url", "http://127.0.0.1:9")
    for command in READERS:
        flags = unreachable if command[0] in ("run", "resume") else ()
        result = orchmode(*command, *flags, cwd=work)
        assert result.returncode == 6, (command, result.stderr)
        line = one_line_error(result.stderr)
        assert str(damaged) in line, (command, line)
        assert "orchmode has not changed it" in line and "restore" in line, line
        assert digest(work / ".orchmode") == before, command
