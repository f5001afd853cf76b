"""The library API, `import orchmode`: its page's example as written, and what it promises.

Everything runs the real SDK over real HTTP against the scripted server; the expectations
come from the server's own request log, not from orchmode's accounting.
"""

from __future__ import annotations

import asyncio
import gc
import io
import json
import os
import re
import subprocess
import sys
import typing
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

import orchmode
from conftest import API_KEY, StartServer
from orchmode import RunRecord
from orchmode.core.mode import Notice
from orchmode.core.prompts import NOTICES, VERIFY_MARKER
from orchmode.testing import LoggedRequest, Reply, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, role_of
from recorded_runs import base_env

ROOT = Path(__file__).resolve().parents[1]
SECTION = "# The library API"
#: Where the section is read from; only for trying out a draft of it before it is pasted
#: into the page (the committed test always reads docs/library.md).
PAGE = Path(os.environ.get("ORCHMODE_TEST_LIBRARY_PAGE") or ROOT / "docs" / "library.md")

SYNTHESIS = "Synthesis: 3 agents reported; 3 results were confirmed."
SUMMARY = "In brief: the workflow ran and every result was checked."


def page_example() -> str:
    """The first python block of the library page's opening section, exactly as written."""
    text = PAGE.read_text(encoding="utf-8")
    start = text.find(f"\n{SECTION}\n")
    if start < 0 and not text.startswith(f"{SECTION}\n"):
        pytest.fail(f"{PAGE} has no {SECTION!r} section: the library example is missing")
    section = text[max(start, 0) + len(SECTION) + 1 :]
    following = re.search(r"^## ", section, flags=re.M)
    section = section[: following.start()] if following else section
    block = re.search(r"^```python\n(.*?)^```", section, flags=re.M | re.S)
    if block is None:
        pytest.fail(f"the {SECTION!r} section of {PAGE} has no ```python block")
    return block.group(1)


# --- reading the server's log ---------------------------------------------------------------


def messages_requests(server: ScriptedServer) -> list[LoggedRequest]:
    return [e for e in server.log if e.path == "/v1/messages" and e.status == 200]


def is_main(entry: LoggedRequest) -> bool:
    return role_of(entry.body) == "main"


def is_verifier(entry: LoggedRequest) -> bool:
    return str(entry.body["messages"][0]["content"]).startswith(VERIFY_MARKER)


def billed(entry: LoggedRequest) -> orchmode.TokenUsage:
    assert entry.billed is not None
    return entry.billed


def tokens_of(entries: list[LoggedRequest]) -> int:
    return sum(u.total_input + u.output_tokens for u in map(billed, entries))


def cost_of(entries: list[LoggedRequest]) -> float:
    price = orchmode.Settings.model_validate({}).price()
    assert price is not None
    return sum(price.cost(billed(e)) for e in entries)


def user_turn_notices(body: dict[str, Any]) -> list[list[str]]:
    """Per plain-text user turn of a request, the system messages right after it."""
    turns: list[list[str]] = []
    for message in body["messages"]:
        if message["role"] == "user" and isinstance(message["content"], str):
            turns.append([])
        elif message["role"] == "system" and turns:
            turns[-1].append(message["content"])
    return turns


# --- the library page's example -------------------------------------------------------------


@pytest.fixture
def example_server(scripted: Callable[..., ScriptedServer]) -> ScriptedServer:
    return scripted(OrchestrationScenario(subtasks=3))


def test_the_library_page_example_runs_as_written_against_the_scripted_server(
    example_server: ScriptedServer, tmp_path: Path
) -> None:
    server = example_server
    (tmp_path / "example.py").write_text(page_example(), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env=base_env(ANTHROPIC_BASE_URL=server.url),
        capture_output=True,
        text=True,
        timeout=110,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # The subscriber saw the main agent's scouting command, run (in the sandbox) and done.
    assert "[main] $ ls (exit 0)" in out, out
    # Both answers, in order: the orchestrated one, then the summary with the mode off.
    assert out.index(SYNTHESIS) < out.index(SUMMARY), out
    entries = messages_requests(server)
    main = [e for e in entries if is_main(e)]
    assert len(main) == 4  # scout, fan out, synthesise; the summary
    assert user_turn_notices(main[0].body) == [[NOTICES[Notice.ENTER]]]
    assert user_turn_notices(main[-1].body)[-1] == [NOTICES[Notice.EXIT]]
    # Its totals are the server's: requests, tokens, dollars; and six subagents launched.
    found = re.search(
        r"^(\d+) requests, (\d+) tokens, \$(\d+\.\d+), (\d+) subagents$", out, flags=re.M
    )
    assert found, out
    requests, tokens, cost, subagents = found.groups()
    assert int(requests) == len(entries) == 4 + 3 * 2 + 3  # workers run a command first
    assert int(tokens) == tokens_of(entries) > 0
    assert float(cost) == pytest.approx(cost_of(entries), abs=0.00005)
    assert float(cost) > 0
    assert int(subagents) == 6
    session_line = re.search(r"^session (\S+): (\d+) model requests · ", out, flags=re.M)
    assert session_line and int(session_line[2]) == len(entries), out
    assert (tmp_path / ".orchmode" / "journal.db").is_file()


def test_a_page_without_the_library_section_fails_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "library.md"
    elsewhere.write_text("# Another page\n\n## Another section\n\n```python\npass\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "PAGE", elsewhere)
    with pytest.raises(pytest.fail.Exception, match="has no '# The library API'"):
        page_example()


# --- the API itself --------------------------------------------------------------------------


def settings_in(server: ScriptedServer, **overrides: Any) -> orchmode.Settings:
    values: dict[str, Any] = {"base_url": server.url, "max_retries": 0, **overrides}
    return orchmode.Settings(**values)


def opened(
    tmp_path: Path, server: ScriptedServer, *, session: str | None = None, **overrides: Any
) -> AbstractAsyncContextManager[orchmode.Session]:
    """A session in ``tmp_path`` on the scripted server, for ``async with``."""
    return orchmode.open_session(
        settings_in(server, **overrides),
        workdir=tmp_path,
        credentials=orchmode.Credentials(api_key=API_KEY),
        session=session,
    )


async def test_subscribers_see_every_event_in_the_order_it_happened(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=3))
    seen: list[orchmode.Event] = []
    commands: list[orchmode.BashDone] = []
    async with opened(tmp_path, server) as session:
        session.subscribe(seen.append)
        session.subscribe(commands.append, orchmode.BashDone)
        session.subscribe(lambda event: 1 / 0)  # a broken subscriber stops nothing
        async with session.events() as stream:
            turn = asyncio.create_task(session.turn("Review this"))
            streamed = [event async for event in _until_turn_done(stream)]
            result = await turn
    assert result.ok and result.text == SYNTHESIS
    assert streamed == seen
    kinds = [type(e).__name__ for e in seen]
    assert isinstance(seen[0], orchmode.TurnStarted) and seen[0].notices == ("enter",)
    assert isinstance(seen[-1], orchmode.TurnDone) and seen[-1].stop == "end_turn"
    assert kinds.count("TurnStarted") == kinds.count("TurnDone") == 1
    # Every model request, in the order the server answered it.
    done = [e for e in seen if isinstance(e, orchmode.ModelRequestDone)]
    main_ids = [e.message_id for e in done if e.agent == "main"]
    assert main_ids == [e.message_id for e in messages_requests(server) if is_main(e)]
    assert len(done) == len(messages_requests(server)) == 3 + 3 * 2 + 3
    # Each command starts before it ends; the fan-out wraps its agents; the scout comes first.
    assert commands == [e for e in seen if isinstance(e, orchmode.BashDone)]
    assert [c.command for c in commands].count("pwd") == 3 and commands[0].command == "ls"
    starts = [i for i, k in enumerate(kinds) if k == "BashStarted"]
    ends = [i for i, k in enumerate(kinds) if k == "BashDone"]
    assert len(starts) == len(ends) == 4 and all(s < e for s, e in zip(starts, ends, strict=True))
    first, last = kinds.index("FanoutStarted"), kinds.index("FanoutDone")
    agents = [i for i, k in enumerate(kinds) if k in ("SubagentStarted", "SubagentDone")]
    assert ends[0] < first < min(agents) and max(agents) < last
    roles = [e.role for e in seen if isinstance(e, orchmode.SubagentDone)]
    assert sorted(roles) == ["verifier"] * 3 + ["worker"] * 3


async def _until_turn_done(
    stream: orchmode.EventStream[orchmode.Event],
) -> AsyncIterator[orchmode.Event]:
    async for event in stream:
        yield event
        if isinstance(event, orchmode.TurnDone):
            return


async def test_an_unsubscribed_callback_and_a_closed_stream_get_nothing_more(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=1, scout_command=None))
    first: list[orchmode.Event] = []
    async with opened(tmp_path, server, mode=False) as session:
        unsubscribe = session.subscribe(first.append)
        stream = session.events(orchmode.TurnDone)
        assert (await session.turn("one")).ok
        unsubscribe()
        stream.close()
        assert (await session.turn("two")).ok
        later = session.events(orchmode.TurnStarted)
    assert [type(e).__name__ for e in first] == ["TurnStarted", "ModelRequestDone", "TurnDone"]
    assert [e.stop async for e in stream] == ["end_turn"]  # what it held, then the end
    assert [e async for e in later] == []  # the session closed: the stream ended


async def test_switching_the_mode_off_reaches_the_model_with_the_next_turn(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=2, scout_command=None))
    async with opened(tmp_path, server, mode=False) as session:
        assert session.mode is False
        session.set_mode(True)
        assert session.mode is True
        assert (await session.turn("Review this")).text.startswith("Synthesis: 2 agents")
        session.set_mode(False)
        asked = len(server.log)
        assert session.mode is False and len(server.log) == asked  # nothing sent on its own
        answer = await session.turn("Sum it up")
    assert answer.ok and answer.text == SUMMARY
    main = [e.body for e in messages_requests(server) if is_main(e)]
    assert user_turn_notices(main[0]) == [[NOTICES[Notice.ENTER]]]
    assert user_turn_notices(main[-1]) == [[NOTICES[Notice.ENTER]], [NOTICES[Notice.EXIT]]]
    last = main[-1]["messages"]
    assert last[-2:] == [
        {"role": "user", "content": "Sum it up"},
        {"role": "system", "content": NOTICES[Notice.EXIT]},
    ]


async def test_totals_match_the_server_request_log(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(OrchestrationScenario(subtasks=3))
    async with opened(tmp_path, server) as session:
        assert (await session.totals()).requests == 0
        await session.turn("Review this")
        live = await session.totals()
    entries = messages_requests(server)
    main = [e for e in entries if is_main(e)]
    subagents = [e for e in entries if not is_main(e)]
    assert (live.main.requests, live.subagents.requests, live.requests) == (3, 9, 12)
    assert len(main) == 3 and len(subagents) == 9
    assert live.main.tokens == tokens_of(main) and live.subagents.tokens == tokens_of(subagents)
    assert live.tokens == tokens_of(entries) > 0
    assert live.main.usage.output_tokens == sum(billed(e).output_tokens for e in main)
    assert live.cost == pytest.approx(cost_of(entries)) and live.cost > 0
    assert live.subagents_launched == 6
    assert sum(is_verifier(e) for e in subagents) == 3
    assert live.describe().startswith(f"{len(entries)} model requests · ")
    # Once closed, the totals are the final ones, read without the store.
    assert await session.totals() == live


async def test_a_closed_session_cannot_run_turns(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(OrchestrationScenario(subtasks=1))
    async with opened(tmp_path, server, mode=False) as session:
        assert not session.closed
        assert (await session.turn("hello")).ok
    assert session.closed
    asked = len(server.log)
    with pytest.raises(orchmode.SessionClosed) as raised:
        await session.turn("hello again")
    message = str(raised.value)
    assert f"session {session.id!r} is closed and cannot run a turn" in message
    assert f"orchmode.open_session(..., session={session.id!r})" in message
    with pytest.raises(orchmode.SessionClosed, match="cannot switch its mode"):
        session.set_mode(True)
    assert isinstance(raised.value, orchmode.OrchmodeError)
    assert len(server.log) == asked


async def test_a_second_turn_while_one_runs_is_refused(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(OrchestrationScenario(subtasks=1, scout_command=None))
    async with opened(tmp_path, server, mode=False) as session:
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_start(event: orchmode.TurnStarted) -> None:
            if not started.done():
                started.set_result(None)

        session.subscribe(on_start, orchmode.TurnStarted)
        first = asyncio.create_task(session.turn("first"))
        await started
        with pytest.raises(orchmode.OrchmodeError, match="already running a turn"):
            await session.turn("second")
        assert (await first).ok
        assert (await session.turn("second")).ok
    user_texts = [
        m["content"] for m in messages_requests(server)[-1].body["messages"] if m["role"] == "user"
    ]
    assert user_texts == ["first", "second"]


async def test_resuming_a_named_session_continues_its_history(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=2, scout_command=None))
    async with opened(tmp_path, server, session="nightly") as session:
        assert session.id == "nightly" and not session.resumed
        assert (await session.turn("Review this")).ok
        session.set_mode(False)
        before = await session.totals()
    # What the first turn's last request held; its answer came after.
    history = [e for e in messages_requests(server) if is_main(e)][-1].body["messages"]
    async with opened(tmp_path, server, session="nightly") as again:
        assert again.id == "nightly" and again.resumed
        assert again.mode is False  # the recorded mode, not the settings' default (on)
        answer = await again.turn("Sum it up")
        after = await again.totals()
    assert answer.text == SUMMARY
    sent = messages_requests(server)[-1].body["messages"]
    assert sent[: len(history)] == history  # the whole first turn, its answer, the new one
    assert sent[len(history)]["role"] == "assistant"
    assert sent[len(history) + 1 :] == [
        {"role": "user", "content": "Sum it up"},
        {"role": "system", "content": NOTICES[Notice.EXIT]},
    ]
    # The resumed session's totals include what it used before.
    assert after.requests == before.requests + 1 == len(messages_requests(server))
    assert after.subagents_launched == before.subagents_launched == 4
    async with opened(tmp_path, server, session="another") as other:
        assert not other.resumed


async def test_opening_in_a_missing_directory_is_a_config_error(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario())
    with pytest.raises(orchmode.ConfigError, match="does not exist"):
        async with orchmode.open_session(
            settings_in(server),
            workdir=tmp_path / "missing",
            credentials=orchmode.Credentials(api_key=API_KEY),
        ):
            pass
    assert server.log == []


def test_every_event_class_is_exported_from_orchmode() -> None:
    from orchmode.core import events

    classes = typing.get_args(events.Event)
    assert len(classes) >= 15
    for cls in classes:
        assert getattr(orchmode, cls.__name__) is cls and cls.__name__ in orchmode.__all__


def test_import_orchmode_loads_no_sdk_until_the_api_is_used() -> None:
    code = (
        "import sys, orchmode\n"
        "assert 'anthropic' not in sys.modules and 'orchmode.session.api' not in sys.modules\n"
        "orchmode.open_session, orchmode.BashDone\n"
        "assert 'orchmode.session.api' in sys.modules\n"
        "print(sorted(set(orchmode.__all__) - set(dir(orchmode))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=base_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# --- the command line is the API's first user ------------------------------------------------


async def _an_unfinished_run(server: ScriptedServer, tmp_path: Path) -> str:
    """A session `orchmode run` left between its two turns: `orchmode resume` finishes it."""
    async with opened(tmp_path, server, session="cut") as session:
        session.conversation.run = RunRecord(task="Review this")
        assert (await session.turn("Review this")).ok
    return "cut"


@pytest.mark.parametrize("command", ["run", "resume", "chat"])
async def test_every_command_starts_its_session_with_the_library_open_session(
    serve: StartServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    """A subscriber added to ``orchmode.open_session`` sees exactly what the command's own
    view printed (its --json lines): the command's views are subscribers of that session,
    so a start-up of its own would leave the subscriber empty."""
    from orchmode.cli import chat, running
    from orchmode.core.settings import Settings
    from orchmode.session import api
    from orchmode.views.display import event_record

    server = await serve(OrchestrationScenario(subtasks=2, scout_command=None))
    settings = Settings(base_url=server.url, max_retries=0)
    credentials = orchmode.Credentials(api_key=API_KEY)
    wanted = await _an_unfinished_run(server, tmp_path) if command == "resume" else None
    capsys.readouterr()
    real = api.open_session
    seen: list[orchmode.Event] = []
    opened_with: list[str | None] = []

    def spy(*args: Any, subscribers: Any = (), **kwargs: Any) -> Any:
        opened_with.append(kwargs.get("session"))
        return real(*args, subscribers=[*subscribers, seen.append], **kwargs)

    monkeypatch.setattr(api, "open_session", spy)
    assert chat.open_session is real  # the public one, bound when the chat was imported
    monkeypatch.setattr(chat, "open_session", spy)
    if command == "run":
        await running._run(settings, "Review this", tmp_path, credentials, display_mode="json")
    elif command == "resume":
        await running._resume(settings, tmp_path, wanted, credentials=credentials,
                               display_mode="json")  # fmt: skip
    else:
        lines = io.StringIO("Review this\n/exit\n")
        await chat.run_chat(settings, tmp_path, credentials, display_mode="json", stdin=lines)
    out = capsys.readouterr()
    printed = [json.loads(line) for line in out.err.splitlines()]
    assert opened_with == [wanted]
    assert seen and [r for r in printed if r["kind"] != "Notice"] == [
        json.loads(json.dumps(event_record(e), ensure_ascii=False, default=str)) for e in seen
    ]
    assert "Synthesis: 2 agents reported; 2 results were confirmed." in out.out
    assert [type(e).__name__ for e in seen].count("TurnDone") == (1 if command == "chat" else 2)


# --- a run, as `orchmode run` does it, from Python ----------------------------------------------


async def test_a_run_answers_its_task_then_its_summary_and_records_itself_done(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=2, scout_command=None))
    answers: list[orchmode.RunAnswer] = []
    async with opened(tmp_path, server) as session:
        result = await session.run("Review this", answers.append)
        assert not await session.interrupted()
        assert session.mode is False  # the summary ran with the mode off, and it stays off
    assert [a.summary for a in answers] == [False, True]
    assert [a.turn for a in answers] == [result.task, result.summary]
    assert result.ok and "Synthesis: 2 agents reported" in result.task.text
    assert result.summary is not None and result.summary.text == SUMMARY
    settings = settings_in(server)
    assert await orchmode.interrupted_run("Review this", settings, workdir=tmp_path) is None


async def test_a_run_stopped_between_its_turns_is_finished_by_resume_with_both_answers(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=2, scout_command=None))
    name = await _an_unfinished_run(server, tmp_path)
    settings = settings_in(server)
    found = await orchmode.resumable(settings, workdir=tmp_path)
    assert found.id == name and found.run == RunRecord(task="Review this", phase=1)
    earlier = await orchmode.interrupted_run("Review this", settings, workdir=tmp_path)
    assert earlier is not None and earlier.id == name
    requests = len(server.log)
    answers: list[orchmode.RunAnswer] = []
    async with opened(tmp_path, server, session=found.id) as session:
        result = await session.resume(answers.append)
        assert not await session.interrupted()
    assert [a.summary for a in answers] == [False, True]
    assert "Synthesis: 2 agents reported" in answers[0].turn.text
    assert result.summary is not None and result.summary.text == SUMMARY
    assert len(server.log) == requests + 1  # the task's answer was recorded: only the summary
    with pytest.raises(orchmode.CannotResume, match="was not interrupted"):
        await orchmode.resumable(settings, workdir=tmp_path, session=name)


async def test_the_budget_report_reads_the_ledger_without_opening_a_session(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=2, scout_command=None))
    async with opened(tmp_path, server, max_subagents=40) as session:
        await session.run("Review this")
        inside = await session.budget()
    totals = await session.totals()
    report = await orchmode.budget(settings_in(server, max_subagents=40), workdir=tmp_path)
    # Read inside the session, the ledger's subagents are final; its use and cost may still
    # have requests' settlements pending (they are written in the background until it
    # closes), so those are compared with the totals read after it closed, below.
    assert (report.session, report.ledger.subagents) == (inside.session, inside.ledger.subagents)
    assert report.session == session.id
    assert report.ledger.subagents == totals.subagents_launched == 4
    assert report.subagents_left == 36
    assert report.used.all == totals.all
    assert report.lines()[:2] == [
        f"session    {session.id}",
        "subagents  4 launched of 40 (36 left)",
    ]
    assert report.describe().startswith("4 of 40 subagents launched; ")


async def test_nothing_recorded_is_said_plainly_by_budget_and_resumable(tmp_path: Path) -> None:
    with pytest.raises(orchmode.OrchmodeError, match="no sessions are recorded"):
        await orchmode.budget(workdir=tmp_path)
    with pytest.raises(orchmode.CannotResume, match="no interrupted session ran in"):
        await orchmode.resumable(workdir=tmp_path)
    assert await orchmode.interrupted_run("anything", workdir=tmp_path) is None
    assert not (tmp_path / ".orchmode").exists()  # no store was made just to look


def test_a_run_record_is_read_back_leniently_and_refused_clearly() -> None:
    assert RunRecord.read({}) is None and RunRecord.read(None) is None
    saved = RunRecord(task="Review this", phase=2).saved()
    assert RunRecord.read(saved) == RunRecord(task="Review this", phase=2)
    assert RunRecord.read({"command": "run", "task": "t", "phase": "done"}) is not None
    for bad in ({"command": "run"}, {"command": "chat", "task": "t"}, {"task": "t", "phase": 3}):
        with pytest.raises(orchmode.OrchmodeError, match="its run record cannot be read"):
            RunRecord.read(bad)


async def test_the_cyclic_collector_runs_slower_only_while_a_session_is_open(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda r: Reply.text("fine"))
    (tmp_path / "other").mkdir()
    before = gc.get_threshold()
    gc.set_threshold(700, *before[1:])  # Python's own pace
    try:
        async with opened(tmp_path, server) as first:
            async with opened(tmp_path / "other", server):
                assert gc.get_threshold()[0] > 700
            assert gc.get_threshold()[0] > 700  # the first session is still open
            await first.run("hello")
        assert gc.get_threshold() == (700, *before[1:])
        gc.set_threshold(1234, *before[1:])  # a program that chose its own pace keeps it
        async with opened(tmp_path, server):
            assert gc.get_threshold()[0] == 1234
    finally:
        gc.set_threshold(*before)
