"""Approvals: an agent waits parked for the user's answer, given in any process, kept in the store.

The store's own approval tests (both backends, racing processes) are in test_store.py; here
the broker an agent asks through, the command line that answers (real `orchmode` processes
against the same SQLite file) and the library's functions.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import orchmode
from conftest import API_KEY, StartServer
from orchmode.core.events import ApprovalAnswered, ApprovalRequested, Event
from orchmode.core.settings import Settings
from orchmode.executors.approvals import DENY_MODE, Answer, Approvals
from orchmode.store import ApprovalRequest, Store, open_store
from orchmode.testing import Reply, ScriptedRequest
from recorded_runs import base_env
from recorded_runs import orchmode as run_orchmode


def asking(
    key: str = "k", session: str = "s1", workdir: str = "/w", **change: Any
) -> ApprovalRequest:
    fields: dict[str, Any] = dict(
        session=session, agent="worker 1.2", workdir=workdir, kind="command", what="npm ci",
        why="Bash(npm:*) in permissions_ask", rule="Bash(npm ci)", key=key,
    )  # fmt: skip
    return ApprovalRequest(**{**fields, **change})


class Seen:
    """The events a broker emitted, and a way to wait for the next of one kind."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._arrived = asyncio.Condition()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        asyncio.get_running_loop().create_task(self._tell())

    async def _tell(self) -> None:
        async with self._arrived:
            self._arrived.notify_all()

    async def until(self, done: Callable[[], bool], timeout: float = 30) -> None:
        async def waited() -> None:
            async with self._arrived:
                await self._arrived.wait_for(done)

        await asyncio.wait_for(waited(), timeout)

    async def first(self, kind: type[Any], timeout: float = 30) -> Any:
        await self.until(lambda: bool(self.of(kind)), timeout)
        return self.of(kind)[0]

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


class Parking:
    """A ``park`` that records when the agent gave its slot away and took one back."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def __call__(self) -> AbstractAsyncContextManager[None]:
        @asynccontextmanager
        async def parked() -> AsyncIterator[None]:
            self.log.append("parked")
            try:
                yield
            finally:
                self.log.append("back")

        return parked()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await open_store(f"sqlite://{tmp_path / 'journal.db'}")
    yield opened
    await opened.close()


def broker(
    store: Store, tmp_path: Path, seen: Callable[[Event], None], **settings: Any
) -> Approvals:
    return Approvals(
        store, "s1", tmp_path, Settings(**settings), seen, config_dir=tmp_path / "config"
    )


# --- the broker ------------------------------------------------------------------------------


async def test_an_orchmode_approve_in_another_process_wakes_the_parked_agent(
    store: Store, tmp_path: Path
) -> None:
    seen, parking = Seen(), Parking()
    approvals = broker(store, tmp_path, seen, approval_timeout=120)
    waiting = asyncio.create_task(approvals.ask(asking(), park=parking))
    requested: ApprovalRequested = await seen.first(ApprovalRequested)
    assert (requested.id, requested.agent, requested.kind, requested.what) == (
        1, "worker 1.2", "command", "npm ci",
    )  # fmt: skip
    assert parking.log == ["parked"] and not waiting.done()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "orchmode", "approve", str(requested.id),
        "--store", f"sqlite://{tmp_path / 'journal.db'}",
        cwd=tmp_path, env=base_env(), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    assert "approved 1: worker 1.2 (session s1) may run npm ci" in out.decode()
    answer = await asyncio.wait_for(waiting, 30)
    assert answer == Answer(True, "approved", "approved by the user", id=1)
    assert parking.log == ["parked", "back"]
    answered: ApprovalAnswered = await seen.first(ApprovalAnswered)
    assert (answered.id, answered.answer, answered.always) == (1, "approved", False)
    assert (await store.approval(1)).status == "approved"  # type: ignore[union-attr]


async def test_an_answer_in_this_process_wakes_the_agent_without_waiting_for_a_poll(
    store: Store, tmp_path: Path
) -> None:
    seen = Seen()
    approvals = broker(store, tmp_path, seen, approval_timeout=120)
    approvals.poll_interval = 3600  # no poll would come within the test's time
    waiting = asyncio.create_task(approvals.ask(asking()))
    requested = await seen.first(ApprovalRequested)
    answered = await approvals.answer(requested.id, False, reason="not on this machine")
    assert answered is not None and answered.status == "denied"
    answer = await asyncio.wait_for(waiting, 10)
    assert answer == Answer(False, "denied", "denied by the user: not on this machine", id=1)
    assert await approvals.answer(requested.id, True) is None  # answered already
    await approvals.close()


async def test_nobody_answering_times_out_as_a_denial_recorded_in_the_store(
    store: Store, tmp_path: Path
) -> None:
    seen, parking = Seen(), Parking()
    approvals = broker(store, tmp_path, seen, approval_timeout=0.3)
    answer = await asyncio.wait_for(approvals.ask(asking(), park=parking), 30)
    assert not answer.approved and answer.status == "timed out" and answer.id == 1
    assert "no answer came within 0.3 s (approval_timeout) — denied" in answer.reason
    assert (await store.approval(1)).status == "timed out"  # type: ignore[union-attr]
    assert [e.answer for e in seen.of(ApprovalAnswered)] == ["timed out"]
    assert parking.log == ["parked", "back"]
    assert await store.answer_approval(1, True) is None  # too late


@pytest.mark.parametrize("mode", ["deny", "allow"])
async def test_deny_and_allow_modes_answer_at_once_and_record_nothing(
    store: Store, tmp_path: Path, mode: str
) -> None:
    seen, parking = Seen(), Parking()
    approvals = broker(store, tmp_path, seen, approvals=mode)
    answer = await asyncio.wait_for(approvals.ask(asking(), park=parking), 10)
    assert answer.approved is (mode == "allow") and answer.id is None
    if mode == "deny":
        assert answer.reason == DENY_MODE and "--approvals deny" in answer.reason
    assert await store.approvals() == [] and seen.events == [] and parking.log == []


async def test_a_resumed_run_keeps_the_answer_given_and_asks_again_for_the_unanswered(
    store: Store, tmp_path: Path
) -> None:
    # The run before the kill asked twice; the user answered one.
    answered = await store.request_approval(asking("answered"))
    await store.answer_approval(answered.id, True, always=True)
    unanswered = await store.request_approval(asking("unanswered"))
    seen, parking = Seen(), Parking()
    approvals = broker(store, tmp_path, seen, approval_timeout=120)
    kept = await asyncio.wait_for(approvals.ask(asking("answered"), park=parking), 10)
    assert kept.approved and kept.always and kept.id == answered.id
    assert seen.events == [] and parking.log == []  # no question, no wait
    again = asyncio.create_task(approvals.ask(asking("unanswered")))
    requested = await seen.first(ApprovalRequested)
    assert requested.id == unanswered.id  # the same question, not a new one
    await approvals.answer(unanswered.id, False)
    assert not (await asyncio.wait_for(again, 10)).approved
    assert len(await store.approvals()) == 2


async def test_a_cancelled_wait_leaves_the_approval_pending_for_a_resume(
    store: Store, tmp_path: Path
) -> None:
    seen, parking = Seen(), Parking()
    approvals = broker(store, tmp_path, seen, approval_timeout=120)
    waiting = asyncio.create_task(approvals.ask(asking(), park=parking))
    await seen.first(ApprovalRequested)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert parking.log == ["parked", "back"]
    assert [a.status for a in await store.approvals()] == ["pending"]
    assert seen.of(ApprovalAnswered) == []
    await approvals.close()


async def test_twenty_waiting_agents_share_one_poller_and_each_gets_its_own_answer(
    store_url: str, tmp_path: Path
) -> None:
    """On SQLite and PostgreSQL alike: answers written by another connection (as another
    process would) reach each waiting agent through the one poller."""
    seen = Seen()
    store = await open_store(store_url)
    other = await open_store(store_url)  # another process's view of the same store
    try:
        approvals = broker(store, tmp_path, seen, approval_timeout=120)
        approvals.poll_interval = 0.05
        waiting = [asyncio.create_task(approvals.ask(asking(f"k{i}"))) for i in range(20)]
        await seen.until(lambda: len(seen.of(ApprovalRequested)) == 20)
        pollers = [t for t in asyncio.all_tasks() if t.get_name() == "orchmode-approvals"]
        assert len(pollers) == 1
        asked = await other.approvals(pending=True)
        assert sorted(a.id for a in asked) == list(range(1, 21))
        for approval in asked:  # yes to even keys, no to odd ones
            i = int(approval.request.key.removeprefix("k"))
            assert await other.answer_approval(approval.id, i % 2 == 0, reason=f"r{i}")
        answers = await asyncio.wait_for(asyncio.gather(*waiting), 30)
        assert [a.approved for a in answers] == [i % 2 == 0 for i in range(20)]
        assert [a.reason for a in answers] == [
            f"denied by the user: r{i}" if i % 2 else f"approved by the user: r{i}"
            for i in range(20)
        ]
        await asyncio.wait_for(pollers[0], 10)  # nothing waits: the poller ends by itself
    finally:
        await other.close()
        await store.close()


async def test_an_always_answer_is_remembered_for_the_directory_and_loaded_back(
    store: Store, tmp_path: Path
) -> None:
    """Needs ``orchmode.core.permissions.remember`` and ``Rules.load`` (the rules branch)."""
    from orchmode.core.permissions import Rules

    project = tmp_path / "project"
    project.mkdir()
    xdg = tmp_path / "xdg"
    seen = Seen()
    approvals = Approvals(
        store, "s1", project, Settings(approval_timeout=120), seen,
        config_dir=xdg / "orchmode",
    )  # fmt: skip
    waiting = asyncio.create_task(approvals.ask(asking(workdir=str(project))))
    requested = await seen.first(ApprovalRequested)
    await approvals.answer(requested.id, True, always=True)
    answer = await asyncio.wait_for(waiting, 10)
    assert answer.approved and answer.always
    env = {"XDG_CONFIG_HOME": str(xdg), "HOME": str(tmp_path / "home")}
    asks = Settings(permissions_ask=("Bash(npm ci)",))  # what made the agent ask
    rules, _ = Rules.load(asks, project, env)
    verdict = rules.command("npm ci")
    assert (verdict.decision, verdict.source) == ("allow", "remembered")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rules, _ = Rules.load(asks, elsewhere, env)
    assert rules.command("npm ci").decision == "ask"  # for that directory only


# --- the command line ------------------------------------------------------------------------


def cli(tmp_path: Path, *args: str) -> Any:
    return run_orchmode(*args, "--store", f"sqlite://{tmp_path / 'journal.db'}", cwd=tmp_path)


async def test_orchmode_approvals_lists_the_pending_ones_as_a_table_and_as_json(
    store: Store, tmp_path: Path
) -> None:
    await store.request_approval(asking("a"))
    b = await store.request_approval(
        asking("b", session="s2", kind="domain", what="evil.example:443", why="network_ask")
    )
    await store.answer_approval(b.id, False)
    await store.request_approval(asking("c", agent="worker 2.1", what="rm -rf \x1b[31mbuild"))
    listed = await asyncio.to_thread(cli, tmp_path, "approvals")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["ID", "SESSION", "AGENT", "KIND", "WHAT", "WHY", "AGE"]
    assert lines[1].split()[:6] == ["1", "s1", "worker", "1.2", "command", "npm"]
    assert lines[2].split()[:2] == ["3", "s1"] and "\\x1b[31m" in lines[2]  # shown, never obeyed
    assert "\x1b" not in listed.stdout and len(lines) == 4  # b is answered: not listed
    as_json = await asyncio.to_thread(cli, tmp_path, "approvals", "--json")
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [r["id"] for r in records] == [1, 3]
    assert records[0] | {"age": 0, "created_at": 0} == {
        "id": 1, "session": "s1", "agent": "worker 1.2", "kind": "command", "what": "npm ci",
        "why": "Bash(npm:*) in permissions_ask", "rule": "Bash(npm ci)", "workdir": "/w",
        "status": "pending", "created_at": 0, "age": 0, "answered_at": None, "always": False,
        "reason": "",
    }  # fmt: skip
    one_session = await asyncio.to_thread(cli, tmp_path, "approvals", "--json", "--session", "s2")
    assert one_session.stdout == ""  # s2's only approval is answered
    every = await asyncio.to_thread(cli, tmp_path, "approvals", "--all")
    assert every.stdout.splitlines()[0].split()[-1] == "STATUS"
    assert every.stdout.splitlines()[2].split()[-1] == "denied"


def test_orchmode_approvals_with_no_store_says_none_and_makes_no_store(tmp_path: Path) -> None:
    listed = cli(tmp_path, "approvals")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == "no approval is waiting for an answer"
    assert not (tmp_path / "journal.db").exists()


def test_approving_with_no_store_is_a_clear_error(tmp_path: Path) -> None:
    result = cli(tmp_path, "approve", "1")
    assert result.returncode == 1
    assert result.stderr.startswith("orchmode: no approval 1: nothing is recorded in sqlite://")
    assert not (tmp_path / "journal.db").exists()


async def test_deny_records_the_reason_and_a_second_answer_is_refused(
    store: Store, tmp_path: Path
) -> None:
    await store.request_approval(asking())
    denied = await asyncio.to_thread(cli, tmp_path, "deny", "1", "--reason", "use the mirror")
    assert denied.returncode == 0, denied.stderr
    assert denied.stdout.strip() == "denied 1: worker 1.2 (session s1) may not run npm ci"
    approval = await store.approval(1)
    assert approval is not None and (approval.status, approval.reason) == (
        "denied", "use the mirror",
    )  # fmt: skip
    again = await asyncio.to_thread(cli, tmp_path, "approve", "1")
    assert again.returncode == 1
    assert "orchmode: approval 1 was answered already (denied)" in again.stderr
    missing = await asyncio.to_thread(cli, tmp_path, "deny", "7")
    assert missing.returncode == 1 and "orchmode: no approval 7 in " in missing.stderr


@pytest.mark.parametrize("bad", ["x", "0", "-3"])
def test_an_id_that_is_not_a_number_is_refused_in_one_line(tmp_path: Path, bad: str) -> None:
    result = cli(tmp_path, "approve", bad)
    assert result.returncode == 2
    assert "an approval's ID is its number" in result.stderr
    assert "Traceback" not in result.stderr


async def test_orchmode_approve_always_remembers_the_rule_in_the_users_configuration(
    store: Store, tmp_path: Path
) -> None:
    """Needs ``orchmode.core.permissions.remember`` (the rules branch)."""
    from orchmode.core.permissions import Rules

    project = tmp_path / "project"
    project.mkdir()
    await store.request_approval(asking(workdir=str(project)))
    xdg = tmp_path / "xdg"
    env = base_env(XDG_CONFIG_HOME=str(xdg), HOME=str(tmp_path / "home"))
    result = await asyncio.to_thread(
        run_orchmode, "approve", "1", "--always", "--store",
        f"sqlite://{tmp_path / 'journal.db'}", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"remembered for {project}: Bash(npm ci) is allowed there" in result.stdout
    assert (await store.approval(1)).always  # type: ignore[union-attr]
    asks = Settings(permissions_ask=("Bash(npm ci)",))
    rules, _ = Rules.load(asks, project, {"XDG_CONFIG_HOME": str(xdg), "HOME": str(tmp_path)})
    verdict = rules.command("npm ci")
    assert (verdict.decision, verdict.source) == ("allow", "remembered")


# --- the library -----------------------------------------------------------------------------


async def test_the_library_lists_approves_and_denies_from_any_process(
    store: Store, tmp_path: Path
) -> None:
    settings = Settings(journal=tmp_path / "journal.db")
    for key in ("a", "b", "c"):
        await store.request_approval(asking(key))
    listed = await orchmode.approvals(settings, workdir=tmp_path)
    assert [a.id for a in listed] == [1, 2, 3]
    assert all(isinstance(a, orchmode.Approval) for a in listed)
    approved = await orchmode.approve(1, settings=settings, workdir=tmp_path)
    assert approved.status == "approved"
    denied = await orchmode.deny(2, "no", settings=settings, workdir=tmp_path)
    assert (denied.status, denied.reason) == ("denied", "no")
    assert [a.id for a in await orchmode.approvals(settings, workdir=tmp_path)] == [3]
    assert len(await orchmode.approvals(settings, workdir=tmp_path, pending=False)) == 3
    with pytest.raises(orchmode.ApprovalNotPending, match="answered already"):
        await orchmode.deny(1, settings=settings, workdir=tmp_path)
    with pytest.raises(orchmode.ApprovalNotPending, match="no approval 9"):
        await orchmode.approve(9, settings=settings, workdir=tmp_path)
    elsewhere = tmp_path / "empty"
    elsewhere.mkdir()
    assert await orchmode.approvals(workdir=elsewhere) == []
    assert not (elsewhere / ".orchmode").exists()


# --- orchmode chat ---------------------------------------------------------------------------


async def test_chat_answers_approvals_typed_while_its_turn_runs(
    serve: StartServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The turn is held open (its model request waits on a gate) while an agent asks; the
    `/approve` and `/deny` typed then answer it, and a message typed then waits its turn."""
    from orchmode.cli import chat
    from orchmode.session import api

    gate = asyncio.Event()

    async def responder(request: ScriptedRequest) -> Reply:
        if not gate.is_set():
            await gate.wait()
            return Reply.text("First answer.")
        return Reply.text("Second answer.")

    server = await serve(responder)
    settings = Settings(base_url=server.url, max_retries=0, approval_timeout=120)
    sessions: list[orchmode.Session] = []
    seen = Seen()
    real = api.open_session

    @asynccontextmanager
    async def spy(*args: Any, **kwargs: Any) -> AsyncIterator[orchmode.Session]:
        async with real(*args, **kwargs) as session:
            sessions.append(session)
            session.subscribe(seen)
            yield session

    monkeypatch.setattr(chat, "open_session", spy)
    read_end, write_end = os.pipe()
    typed = open(write_end, "w", buffering=1)  # noqa: SIM115 (closed below)
    stdin = open(read_end)  # noqa: SIM115 (closed below)

    def type_in(line: str) -> None:
        typed.write(line + "\n")

    running = asyncio.create_task(
        chat.run_chat(
            settings,
            tmp_path,
            orchmode.Credentials(api_key=API_KEY),
            display_mode="plain",
            stdin=stdin,
        )
    )
    try:
        type_in("go")
        await seen.first(orchmode.TurnStarted)
        (session,) = sessions
        conversation = session.conversation
        # An agent of this turn asks, through a broker of its own (as the agents will).
        agent = Approvals(
            conversation.store, session.id, tmp_path, settings, conversation.events.emit,
            config_dir=tmp_path / "config",
        )  # fmt: skip
        first = asyncio.create_task(agent.ask(asking("a", session=session.id)))
        await seen.first(ApprovalRequested)
        type_in("and then this")  # a message: kept for after the turn
        type_in("/approve 1")
        assert (await asyncio.wait_for(first, 30)).approved
        second = asyncio.create_task(agent.ask(asking("b", session=session.id)))
        await seen.until(lambda: len(seen.of(ApprovalRequested)) == 2)
        type_in("/deny 2 Use The Mirror")
        answer = await asyncio.wait_for(second, 30)
        assert (answer.approved, answer.reason) == (False, "denied by the user: Use The Mirror")
        turns = [e for e in seen.events if isinstance(e, orchmode.TurnDone)]
        assert turns == []  # both answered while the turn still ran
        gate.set()
        await seen.until(lambda: len(seen.of(orchmode.TurnDone)) == 2)  # the kept message ran
        type_in("/exit")
        await asyncio.wait_for(running, 30)
    finally:
        gate.set()
        typed.close()
        if not running.done():
            running.cancel()
        stdin.close()
    out = capsys.readouterr().out
    assert (
        "[chat] approval 1: worker 1.2 asks to run npm ci (Bash(npm:*) in permissions_ask) — "
        "/approve 1, /approve 1 always, or /deny 1 [why]" in out
    )
    assert "[chat] approved 1" in out and "[chat] denied 2" in out
    assert "[chat] approval 2 denied: Use The Mirror" in out
    assert out.index("First answer.") < out.index("Second answer.")
    requests = [e.body["messages"] for e in server.log]
    assert requests[-1][-1] == {"role": "user", "content": "and then this"}


async def test_chat_says_which_approvals_wait_and_refuses_a_bad_number(
    serve: StartServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchmode.cli import chat

    server = await serve(lambda request: Reply.text("ok"))
    settings = Settings(base_url=server.url, max_retries=0, session="c1")
    store = await open_store(settings.store_url(tmp_path))
    try:
        await store.request_approval(asking("a", session="c1"))
    finally:
        await store.close()
    script = io.StringIO("/approvals\n/approve x\n/approve 1 sometimes\n/approve 9\n/deny 1\n")
    await chat.run_chat(
        settings, tmp_path, orchmode.Credentials(api_key=API_KEY), display_mode="plain",
        stdin=script,
    )  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert (
        "[chat] approval 1: worker 1.2 asks to run npm ci (Bash(npm:*) in permissions_ask)" in out
    )
    usage = "[chat] /approve N [always]: N is the approval's number, as /approvals lists it"
    assert out.count(usage) == 2
    assert any(line.startswith("[chat] no approval 9 in ") for line in out)
    assert "[chat] denied 1" in out


async def test_always_for_a_question_with_no_rule_approves_this_once_and_says_so(
    store: Store, tmp_path: Path
) -> None:
    await store.request_approval(asking(rule=""))
    approvals = broker(store, tmp_path, Seen())
    with pytest.raises(
        orchmode.OrchmodeError, match=r"approved this once: .* cannot be remembered"
    ):
        await approvals.answer(1, True, always=True)
    assert (await store.approval(1)).status == "approved"  # type: ignore[union-attr]
    assert not (tmp_path / "config").exists()


async def test_lines_typed_on_a_terminal_during_a_turn_are_taken_whole_and_none_is_lost() -> None:
    """What chat reads from a real terminal (a pseudo-terminal, as the kernel gives it)
    while a turn runs: only whole lines, a half-typed one left for the prompt after."""
    import pty

    from orchmode.cli.chat import PromptLines

    master, slave = pty.openpty()
    try:
        lines = PromptLines(None, slave)
        typed = lines.meanwhile()
        assert typed is lines.meanwhile()  # one reader for every turn
        os.write(master, b"/approve 1\n/deny 2 no\n")
        assert await asyncio.wait_for(typed.read(""), 10) == "/approve 1"
        os.write(master, b"half typ")
        assert await asyncio.wait_for(typed.read(""), 10) == "/deny 2 no"
        waiting = asyncio.create_task(typed.read(""))
        done, _ = await asyncio.wait({waiting}, timeout=0.3)
        assert not done  # a half line is not a line
        os.write(master, b"ed\n")
        assert await asyncio.wait_for(waiting, 10) == "half typed"
    finally:
        os.close(master)
        os.close(slave)


async def test_a_secret_in_an_asking_command_is_masked_in_the_question_recorded(
    tmp_path: Path,
) -> None:
    """The command an agent asks to run is recorded in the store, where secrets never go:
    the session's values are masked in it (and in the event), and the question times out
    as a denial with the reason in the refusal."""
    from orchmode.core.permissions import Rules
    from orchmode.core.secrets import Masker
    from orchmode.executors.permits import Permits

    settings = Settings(permissions_ask=("Bash(echo deploy:*)",), approval_timeout=0.2)
    rules, _ = Rules.load(settings, tmp_path, {"HOME": str(tmp_path)})
    store = await open_store(f"sqlite:///{tmp_path / 'store.db'}")
    seen: list[Event] = []
    secret = "hunter2-very-secret-value"
    try:
        broker = Approvals(store, "s1", tmp_path, settings, seen.append)
        permits = Permits(rules, "s1", tmp_path, broker, Masker([secret]))
        refusal = await permits.for_agent("worker 1.1").command(f"echo deploy {secret}")
        (recorded,) = await store.approvals("s1")
        await broker.close()
    finally:
        await store.close()
    assert refusal is not None and "was not run" in refusal and "approval_timeout" in refusal
    assert recorded.status == "timed out"
    assert secret not in recorded.request.what and "echo deploy" in recorded.request.what
    assert not any(secret in repr(event) for event in seen)
