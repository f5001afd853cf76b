"""Sessions that stay inside the window: real HTTP, real sizes, the scripted server strict.

The server here holds a context window and answers the API's own 400 ("prompt is too
long") above it; its workers send reports the size real ones are.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from conftest import StartServer, conversation_for, settings_for, store_for
from orchmode.core.events import ContextCompacted, EventBus, ResultCondensed, SubagentDone
from orchmode.core.prompts import VERIFY_MARKER
from orchmode.model.context import estimate_tokens
from orchmode.session.agent import Conversation as Session
from orchmode.testing import Fault, Reply, ScriptedRequest, ScriptedServer
from orchmode.testing.cache import prompt_tokens as prompt_tokens_of
from orchmode.testing.scenario import (
    OrchestrationScenario,
    first_user_text,
    report,
    role_of,
    tool_call,
    turn_messages,
)
from orchmode.testing.server import COUNT_TOKENS_PATH
from recorded_runs import API_KEY, orchmode

WINDOW = 200_000


def main_requests(server: ScriptedServer) -> list[Any]:
    """The main agent's requests the server answered."""
    return [
        e
        for e in server.log
        if e.status == 200 and e.path == "/v1/messages" and role_of(e.body) == "main"
    ]


def prompt_tokens(entry: Any) -> int:
    usage = entry.usage
    return int(
        usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    )


def refused(server: ScriptedServer) -> list[str]:
    return [e.outcome for e in server.log if e.status == 400]


_sessions: list[Session] = []


@pytest.fixture(autouse=True)
async def _close_sessions() -> AsyncIterator[None]:
    yield
    while _sessions:
        await _sessions.pop().close()


async def session_for(
    server: ScriptedServer, tmp_path: Path, events: EventBus | None = None, **overrides: Any
) -> Session:
    """A session on the scripted server; its shells are closed when the test ends."""
    settings = settings_for(server, tmp_path, **overrides)
    events = events or EventBus()
    session = await conversation_for(settings, events=events, store=store_for(tmp_path))
    _sessions.append(session)
    return session


def tool_results(session: Session) -> list[str]:
    """The text of every tool result in the session's conversation, oldest first."""
    return [
        b["content"]
        for m in session.history
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]


def collect(events: EventBus) -> list[Any]:
    seen: list[Any] = []
    events.subscribe(seen.append)
    return seen


# --------------------------------------------------------------------------- the wide fan-out


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_a_150_subtask_fanout_of_6kb_reports_fits_a_200k_window(tmp_path: Path) -> None:
    scenario = OrchestrationScenario(subtasks=150, report_bytes=6000, worker_command=None)
    server = ScriptedServer(scenario, api_key=API_KEY, context_window=WINDOW)
    with server.in_thread():
        result = orchmode(
            "run",
            "review this",
            "--base-url",
            server.url,
            "--max-concurrent",
            "50",
            cwd=tmp_path,
            timeout=540,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    assert refused(server) == []
    assert "Synthesis: 150 agents reported; 150 results were confirmed." in result.stdout
    assert "In brief:" in result.stdout
    mains = main_requests(server)
    assert max(prompt_tokens(e) for e in mains) <= 0.9 * WINDOW
    synthesis = mains[2].body["messages"][-1]["content"][0]["content"]
    for i in range(1, 151):
        assert f"[agent {i}: Check item {i}]" in synthesis
        assert f"Finished: Check item {i}" in synthesis  # every summary
        assert re.search(rf"^\[verify {i}\].*\nconfirmed: ", synthesis, flags=re.M)
    assert "findings not shown" in synthesis
    assert "result condensed" in result.stderr
    # every agent's full report is on disk, whole
    results = next((tmp_path / ".orchmode" / "results").iterdir())
    workers = sorted(results.glob("worker-*.json"))
    assert len(workers) == 150 and len(list(results.glob("verifier-*.json"))) == 150
    record = json.loads(workers[0].read_text())
    assert len(json.dumps(record["report"])) >= 5400
    assert API_KEY not in "".join(p.read_text() for p in results.iterdir())


# --------------------------------------------------------------------------- a long chat


def chat_scenario(**kwargs: Any) -> OrchestrationScenario:
    """Each turn fans out 20 subtasks of its own (named after the turn's text)."""

    class PerTurn(OrchestrationScenario):
        def subtask_list(self, request: ScriptedRequest | None = None) -> list[str]:
            turn = _turn_text(request) if request is not None else ""
            return [f"{turn}: check item {i}" for i in range(1, 21)]

        def main(self, request: ScriptedRequest) -> Reply:
            step = sum(1 for m in turn_messages(request.messages) if m.get("role") == "assistant")
            if step == 0:
                return tool_call("Workflow", {"subtasks": self.subtask_list(request)})
            return Reply.text(f"Turn done: {request.last_user_text.count('[agent ')} agents.")

    return PerTurn(report_bytes=6000, worker_command=None, **kwargs)


def _turn_text(request: ScriptedRequest) -> str:
    for message in reversed(request.messages):
        if message["role"] == "user" and isinstance(message["content"], str):
            return message["content"]
    return ""


@pytest.mark.slow
async def test_six_turns_of_20_subtask_fanouts_all_complete_with_no_request_refused(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(chat_scenario(), context_window=WINDOW, context_management=False)
    events = EventBus()
    seen = collect(events)
    session = await session_for(server, tmp_path, events, max_concurrent=40)
    for turn in range(1, 7):
        result = await session.turn(f"turn {turn}")
        assert result.stop == "end_turn", result.text
        assert result.text == "Turn done: 20 agents."
    beta_refusals = [o for o in refused(server) if "context_management" in o]
    assert len(beta_refusals) == 1  # asked once, then never again
    assert [o for o in refused(server) if "too long" in o] == []
    assert max(prompt_tokens(e) for e in main_requests(server)) <= 0.9 * WINDOW
    compactions = [e for e in seen if isinstance(e, ContextCompacted)]
    assert compactions and all(e.how == "stubbed" for e in compactions)
    assert len(compactions) <= 2  # rare, and in large steps
    stub = next(text for text in tool_results(session) if text.startswith("[orchmode: this tool"))
    saved = re.search(r"saved at (\S+) ", stub)
    assert saved is not None and "[agent 1: turn 1: check item 1]" in Path(saved[1]).read_text()


@pytest.mark.slow
async def test_the_apis_context_editing_clears_old_results_where_the_endpoint_takes_it(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(chat_scenario(), context_window=WINDOW)
    events = EventBus()
    seen = collect(events)
    session = await session_for(server, tmp_path, events, max_concurrent=40)
    for turn in range(1, 7):
        result = await session.turn(f"turn {turn}")
        assert result.text == "Turn done: 20 agents.", result.text
    assert refused(server) == []
    mains = main_requests(server)
    assert all("context_management" in e.body for e in mains)
    assert max(prompt_tokens(e) for e in mains) <= 0.9 * WINDOW
    compactions = [e for e in seen if isinstance(e, ContextCompacted)]
    # The API cleared once, and orchmode took the same room into its own history at once,
    # so the requests after it are below the trigger and the edit does not repeat.
    assert [e.how for e in compactions] == ["api", "stubbed"]
    applied = [e.context_management["applied_edits"] for e in mains]
    assert sum(1 for edits in applied if edits) == 1


async def test_a_request_refused_as_too_long_is_compacted_and_sent_again(
    serve: StartServer, tmp_path: Path
) -> None:
    # The harness believes in a larger window than the endpoint has.
    server = await serve(chat_scenario(), context_window=60_000, context_management=False)
    events = EventBus()
    seen = collect(events)
    session = await session_for(server, tmp_path, events, max_concurrent=40, context_window=120_000)
    results = [await session.turn(f"turn {turn}") for turn in range(1, 4)]
    assert [r.text for r in results] == ["Turn done: 20 agents."] * 3
    too_long = [o for o in refused(server) if "prompt is too long" in o]
    assert too_long, "the endpoint never refused: the test did not test anything"
    retried = [e for e in seen if isinstance(e, ContextCompacted) and e.refused]
    assert len(retried) == len(too_long)


async def test_a_turn_that_cannot_fit_ends_clearly_and_the_next_one_works(
    serve: StartServer, tmp_path: Path
) -> None:
    def respond(request: ScriptedRequest) -> Reply:
        text = _turn_text(request)
        if text.startswith("huge"):
            return Reply.text("unreachable")
        return Reply.text(f"answer to {text}")

    server = await serve(respond, context_window=5_000, context_management=False)
    session = await session_for(server, tmp_path, context_window=50_000)
    first = await session.turn("huge " + "word " * 20_000)
    assert first.stop == "context_exceeded"
    assert "does not fit the model's context window" in first.text
    second = await session.turn("small question")
    assert second.text == "answer to small question"
    saved = re.search(r"saved at (\S+)\]", json.dumps(session.history))
    assert saved is not None


# --------------------------------------------------------------------------- the saved reports


async def test_the_main_agents_sandbox_reads_the_saved_reports_and_cannot_write_them(
    serve: StartServer, tmp_path: Path
) -> None:
    outputs: list[str] = []

    def respond(request: ScriptedRequest) -> Reply:
        if role_of(request.body) != "main":
            return report("a finding", [{"claim": "c", "evidence": "e", "severity": "low"}])
        step = sum(1 for m in turn_messages(request.messages) if m["role"] == "assistant")
        if step == 0:
            return tool_call("Workflow", {"subtasks": ["look"]})
        if step == 1:
            directory = session.results.directory
            return tool_call(
                "bash",
                {
                    "command": f"cat {directory}/worker-*.json | head -c 300; "
                    f"touch {directory}/mine; echo overwrite > {directory}/worker-x.json; "
                    f"rm -f {directory}/verifier-*.json; ls {directory} | wc -l; "
                    f"cat {tmp_path}/.orchmode/state.txt"
                },
            )
        outputs.append(request.last_user_text)
        return Reply.text("done")

    server = await serve(respond)
    (tmp_path / ".orchmode").mkdir()
    (tmp_path / ".orchmode" / "state.txt").write_text("orchmode's own, hidden")
    session = await session_for(server, tmp_path, verify=True)
    await session.turn("go")
    (output,) = outputs
    assert '"summary": "a finding"' in output
    assert output.count("Read-only file system") >= 2
    assert "hidden" not in output and "state.txt: No such file" in output  # the rest stays hidden
    directory = next((tmp_path / ".orchmode" / "results").iterdir())
    assert not (directory / "mine").exists()
    assert len(list(directory.glob("verifier-*.json"))) == 1


async def test_every_agents_full_result_is_a_file_named_on_its_event(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=3, report_bytes=3000))
    events = EventBus()
    seen = collect(events)
    session = await session_for(server, tmp_path, events)
    await session.turn("go")
    done = [e for e in seen if isinstance(e, SubagentDone)]
    assert len(done) == 6
    for event in done:
        record = json.loads(Path(event.report_path).read_text())
        assert record["text"] == event.result
        assert record["role"] == event.role
        assert Path(event.report_path).stat().st_mode & 0o222 == 0  # read-only


async def test_a_condensed_result_is_byte_identical_on_a_journal_rerun(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=30, report_bytes=6000))
    texts = []
    for run in range(2):
        events = EventBus()
        seen = collect(events)
        session = await session_for(
            server, tmp_path, events, workflow_result_tokens=8000, session="same"
        )
        await session.turn("go")
        texts.append(next(e for e in seen if isinstance(e, ResultCondensed)))
        tool_result = next(text for text in tool_results(session) if "[agent 1:" in text)
        texts.append(tool_result)
        if run == 1:
            assert all(e.from_journal for e in seen if isinstance(e, SubagentDone))
    first, second = texts[1], texts[3]
    assert "condensed to fit its budget of 8,000 tokens" in first
    # the last line is the live budget status; everything before it is the same bytes
    assert first.rsplit("\n\n", 1)[0] == second.rsplit("\n\n", 1)[0]


async def test_a_condensed_result_names_only_report_files_that_were_written(
    serve: StartServer, tmp_path: Path
) -> None:
    """Subtask 2's worker fails, so its verifier never runs: the result names no file for
    it, and every file it names for the others is there."""
    scenario = OrchestrationScenario(subtasks=12, report_bytes=6000)

    def respond(request: ScriptedRequest) -> Reply | Fault:
        if first_user_text(request) == "Check item 2":
            return Fault("server_error")
        return scenario(request)

    server = await serve(respond)
    session = await session_for(server, tmp_path, workflow_result_tokens=4000, max_retries=0)
    await session.turn("go")
    result = next(text for text in tool_results(session) if "[agent 1:" in text)
    assert "condensed to fit its budget" in result
    named = re.findall(r"^\[(agent|verify) (\d+)[^\n]*?(?: \(report: ([^)]+)\))?$", result, re.M)
    assert len(named) == 24
    directory = session.results.directory
    for label, index, file in named:
        if (label, index) == ("verify", "2"):
            assert file == ""
            continue
        assert file, f"{label} {index} names no report"
        record = json.loads((directory / file).read_text())
        assert record["role"] == ("worker" if label == "agent" else "verifier")


async def test_a_verify_prompt_of_a_100kb_worker_result_stays_within_its_budget(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=1, report_bytes=100_000))
    session = await session_for(server, tmp_path, verify_quote_tokens=5_000)
    await session.turn("go")
    verifier = next(e for e in server.log if role_of(e.body) == "verifier")
    prompt = first_user_text(ScriptedRequest(0, verifier.body, {}))
    assert len(prompt) <= 5_000 * 3 + 2_000
    path = re.search(r"The whole result is in (\S+): read it", prompt)
    assert path is not None
    assert len(json.loads(Path(path[1]).read_text())["text"]) >= 90_000


# --------------------------------------------------------------------------- a subagent's turns


async def test_a_subagents_long_conversation_stays_inside_the_window(
    serve: StartServer, tmp_path: Path
) -> None:
    def respond(request: ScriptedRequest) -> Reply:
        if role_of(request.body) == "main":
            step = sum(1 for m in turn_messages(request.messages) if m["role"] == "assistant")
            if step == 0:
                return tool_call("Workflow", {"subtasks": ["dig deep"]})
            return Reply.text("done")
        if first_user_text(request).startswith(VERIFY_MARKER):
            return report("confirmed: fine", [])
        turns = sum(1 for m in request.messages if m["role"] == "assistant")
        if turns < 14:
            return tool_call(
                "bash", {"command": f"head -c 8000 /dev/zero | tr '\\0' '{turns % 10}'"}
            )
        return report("dug", [{"claim": "deep", "evidence": "15 commands", "severity": "info"}])

    server = await serve(respond, context_window=20_000, context_management=False)
    events = EventBus()
    seen = collect(events)
    session = await session_for(
        server, tmp_path, events, context_window=20_000, context_management="harness"
    )
    result = await session.turn("go")
    assert result.text == "done"
    assert refused(server) == []
    worker = next(e for e in seen if isinstance(e, SubagentDone) and e.role == "worker")
    assert worker.status == "finished" and worker.turns == 15
    assert any(isinstance(e, ContextCompacted) and e.agent.startswith("worker") for e in seen)


def test_context_settings_are_in_help() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "orchmode", "run", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    for flag in ("--context-window", "--workflow-result-tokens", "--context-management"):
        assert flag in result.stdout


async def test_a_size_past_the_point_only_by_the_estimates_slack_is_counted_by_the_api(
    serve: StartServer, tmp_path: Path
) -> None:
    window = 10_000
    point = int(window * 0.8)

    def respond(request: ScriptedRequest) -> Reply:
        step = sum(1 for m in turn_messages(request.messages) if m["role"] == "assistant")
        if step == 0:
            # An output whose high estimate passes the point by a little, and whose real
            # size does not: only the API's own count can tell.
            room = point - prompt_tokens_of(request.body) - 100
            chars = int(3 * room * 1.15)
            return tool_call("bash", {"command": f"head -c {chars} /dev/zero | tr '\\0' 'a'"})
        return Reply.text("fits")

    server = await serve(respond, context_window=window)
    events = EventBus()
    seen = collect(events)
    session = await session_for(
        server,
        tmp_path,
        events,
        context_window=window,
        context_management="harness",
        output_limit=30_000,
    )
    result = await session.turn("go")
    assert result.text == "fits"
    counts = [e for e in server.log if e.path == COUNT_TOKENS_PATH]
    assert len(counts) == 1 and counts[0].status == 200
    assert not [e for e in seen if isinstance(e, ContextCompacted)]
    assert refused(server) == []


async def test_a_scripts_value_is_held_to_the_result_budget_and_saved_whole(
    serve: StartServer, tmp_path: Path
) -> None:
    script = 'found = parallel(["Review area " + str(i) for i in range(30)])\nfound'
    server = await serve(OrchestrationScenario(script=script, report_bytes=6000))
    events = EventBus()
    seen = collect(events)
    session = await session_for(server, tmp_path, events, workflow_result_tokens=6000)
    await session.turn("go")
    result = next(text for text in tool_results(session) if "Review area" in text)
    assert estimate_tokens(result) <= 6000
    assert "the script's value was over its budget of" in result
    (condensed,) = [e for e in seen if isinstance(e, ResultCondensed)]
    whole = json.loads(Path(condensed.path).read_text())
    assert [r["summary"].split(".")[0] for r in whole] == [
        f"Finished: Review area {i}" for i in range(30)
    ]
    assert condensed.path in result
