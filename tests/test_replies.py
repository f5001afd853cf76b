"""Replies of every shape: each recorded stream, as the main agent's reply and as a worker's.

Every fixture under ``tests/fixtures/streams`` is replayed by the scripted server (event for
event) through ``orchmode run`` and through the library, against the server's strict
request validation. What must hold: the run ends with exit 0 or a named reason and its
documented exit code; no traceback; no 400 caused by what orchmode sent back; a kept reply
goes back in the next request exactly as the API sent it (assembled here by a reference
reading of the events, independently of the gateway); a dropped one does not go back.
"""

from __future__ import annotations

import io
import itertools
import json
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic
import pytest
from anthropic.types.beta import BetaRawMessageStreamEvent
from anthropic.types.beta.beta_content_block import BetaContentBlock
from anthropic.types.content_block import ContentBlock
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

import orchmode
from conftest import API_KEY, StartServer, gateway_for, settings_for
from orchmode.core.errors import ModelRequestError, StreamInterrupted
from orchmode.core.events import (
    EventBus,
    ModelRefused,
    ModelRequestRetried,
    TurnDone,
    TurnStarted,
)
from orchmode.core.wire import Block
from orchmode.fanout.condense import SUMMARY_CAP, AgentEntry, SubtaskEntry, fit_result
from orchmode.model.reply import ReplyBuilder
from orchmode.records.totals import SessionTotals
from orchmode.testing import LoggedRequest, Recorded, ScriptedRequest, ScriptedServer
from orchmode.testing.replies import Answer
from orchmode.testing.scenario import OrchestrationScenario, first_user_text, role_of
from orchmode.testing.validate import InvalidRequest, block_shapes, validate_request
from orchmode.views.live import LiveView
from orchmode.views.progress import StderrProgress
from recorded_runs import orchmode as run_orchmode

#: A ``message_start``'s message, before any content.
MESSAGE: dict[str, Any] = {
    "id": "msg_every_block",
    "type": "message",
    "role": "assistant",
    "content": [],
    "model": "claude-opus-5-5",
    "stop_reason": None,
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 1},
}
FIXTURES = sorted((Path(__file__).parent / "fixtures" / "streams").glob("*.sse"))
DROPPED = {"max_tokens", "refusal", "model_context_window_exceeded"}
#: What the error says of each recording that is not a whole response.
BROKEN = {
    "error_mid_stream": "reported an error: Overloaded",
    "stop_without_message_delta": "ended without a message_delta (no stop reason or final usage)",
    "block_never_stopped": "ended inside content block 1 (text), before its content_block_stop",
}
SUBTASKS = 2


# --------------------------------------------------------------------------- reading a fixture


def assembled(recorded: Recorded) -> list[Block]:
    """The reply's blocks as the API means them, read plainly from the events: the
    reference the gateway's assembly is held to. Whitespace-only text is left out (the
    API refuses it in a request)."""
    blocks: dict[int, Block] = {}
    parts: dict[int, str] = {}
    for name, data in recorded.events:
        if not isinstance(data, dict):
            continue
        if name == "content_block_start":
            blocks[data["index"]] = json.loads(json.dumps(data["content_block"]))
        elif name == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            kind = delta["type"]
            if kind == "text_delta":
                block["text"] += delta["text"]
            elif kind == "input_json_delta":
                parts[data["index"]] = parts.get(data["index"], "") + delta["partial_json"]
            elif kind == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif kind == "signature_delta":
                block["signature"] = delta["signature"]
            elif kind == "citations_delta":
                block["citations"] = [*(block.get("citations") or []), delta["citation"]]
            elif kind == "compaction_delta":
                if delta.get("content") is not None:
                    block["content"] = (block.get("content") or "") + delta["content"]
                if delta.get("encrypted_content") is not None:
                    block["encrypted_content"] = delta["encrypted_content"]
        elif name == "content_block_stop" and data["index"] in parts:
            raw = parts.pop(data["index"])
            try:
                blocks[data["index"]]["input"] = json.loads(raw)
            except ValueError:  # cut off by max_tokens: such a reply is dropped anyway
                blocks[data["index"]]["input"] = raw
    return [
        b
        for _, b in sorted(blocks.items())
        if not (b.get("type") == "text" and not b["text"].strip())
    ]


def stop_of(recorded: Recorded) -> str | None:
    """The stop reason the recording ends with; None for a stream that breaks off."""
    names = [name for name, _ in recorded.events]
    if "error" in names:
        return None
    for name, data in recorded.events:
        if name == "message_delta" and isinstance(data, dict):
            return str(data["delta"]["stop_reason"])
    return None


def refusal_of(recorded: Recorded) -> dict[str, Any] | None:
    for name, data in recorded.events:
        if name == "message_delta" and isinstance(data, dict):
            details = data["delta"].get("stop_details")
            return details if isinstance(details, dict) else None
    return None


# --------------------------------------------------------------------------- the responder


@dataclass
class Replaying:
    """The recording answers ``role``'s first request (every one of its requests when
    ``always``); the scripted orchestration answers everything else."""

    recorded: Recorded
    role: str
    always: bool = False
    scenario: OrchestrationScenario = field(
        default_factory=lambda: OrchestrationScenario(subtasks=SUBTASKS)
    )
    #: The first user text of the agent the recording answered (the worker's subtask).
    target: str | None = None

    def __call__(self, request: ScriptedRequest) -> Answer:
        if role_of(request.body) == self.role:
            first = first_user_text(request)
            if self.target is None:
                self.target = first
                return self.recorded
            if self.always and first == self.target:
                return self.recorded
        return self.scenario(request)


def bodies_of(server: ScriptedServer, role: str, target: str | None) -> list[dict[str, Any]]:
    """The request bodies the agent the recording answered sent, in order."""
    return [
        e.body
        for e in server.log
        if e.path == "/v1/messages"
        and role_of(e.body) == role
        and (role == "main" or first_user_text(_scripted(e)) == target)
    ]


def _scripted(entry: LoggedRequest) -> ScriptedRequest:
    return ScriptedRequest(entry.index, entry.body, entry.headers)


def assistant_turns(body: dict[str, Any]) -> list[Any]:
    return [m["content"] for m in body["messages"] if m["role"] == "assistant"]


def check_sent_back(
    server: ScriptedServer, recorded: Recorded, role: str, target: str | None
) -> None:
    """Nothing orchmode sent was refused; a kept reply went back exactly as it came, a
    dropped one did not go back at all."""
    refused = [e.outcome for e in server.log if e.status == 400]
    assert not refused, refused
    expected = assembled(recorded)
    later = bodies_of(server, role, target)[1:]
    sent_back = [turn for body in later for turn in assistant_turns(body)]
    stop = stop_of(recorded)
    if stop in DROPPED or stop is None:
        assert expected not in sent_back
    elif later:  # a worker that ended with its text sends nothing more
        assert expected in sent_back, (expected, later[0]["messages"])
    else:
        assert role == "worker" and stop == "end_turn"


# ----------------------------------------------------------------- through `orchmode run`


#: The fixtures whose `orchmode run` cases stay in the quick lane (a process each, about
#: 6 s); the library runs every one of them in the quick lane.
QUICK_RUNS = {"refusal_stop_details", "fallback_block", "stop_without_message_delta"}
RUN_CASES = [
    pytest.param(f, id=f.stem, marks=() if f.stem in QUICK_RUNS else (pytest.mark.slow,))
    for f in FIXTURES
]


@pytest.mark.parametrize("role", ["main", "worker"])
@pytest.mark.parametrize("fixture", RUN_CASES)
def test_every_recorded_reply_runs_through_orchmode_run(
    fixture: Path, role: str, scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    recorded = Recorded.load(fixture)
    stop = stop_of(recorded)
    # A stream that breaks off is replayed on every try, so its reason must surface.
    replaying = Replaying(recorded, role, always=stop is None)
    server = scripted(replaying)
    result = run_orchmode(
        "run", "review this", "--base-url", server.url, "--stream-retries", "0", cwd=tmp_path
    )
    assert "Traceback" not in result.stderr
    check_sent_back(server, recorded, role, replaying.target)
    if stop is None and role == "main":
        # The documented exit code of an endpoint that keeps failing, and what it lacked.
        assert result.returncode == 4, result.stderr
        line = result.stderr.strip().splitlines()[-1]
        assert line.startswith("orchmode: the response stream from ")
        assert BROKEN[fixture.stem] in line, line
        return
    assert result.returncode == 0, result.stderr
    details = refusal_of(recorded)
    if stop == "refusal" and details is not None:
        said = f"[{role if role == 'main' else 'worker 1.1'}] refused by the model"
        assert f"{said} ({details['category']}): {details['explanation']}" in result.stderr
        if role == "main":
            assert details["explanation"] in result.stdout
            assert "no summary turn" in result.stderr
            assert len(bodies_of(server, "main", None)) == 1  # no summary turn was asked for
        else:
            verifiers = [e for e in server.log if role_of(e.body) == "verifier"]
            assert len(verifiers) == SUBTASKS - 1  # the refused worker's is not run
            synthesis = bodies_of(server, "main", None)[2]
            result_text = json.dumps(synthesis["messages"][-1])
            assert details["explanation"] in result_text and "category cyber" in result_text
            assert "nothing to verify" in result_text


# --------------------------------------------------------------------------- through the library


@pytest.mark.parametrize("role", ["main", "worker"])
@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
async def test_every_recorded_reply_runs_through_the_library(
    fixture: Path, role: str, serve: StartServer, tmp_path: Path
) -> None:
    recorded = Recorded.load(fixture)
    replaying = Replaying(recorded, role)
    server = await serve(replaying)
    retried: list[ModelRequestRetried] = []
    refusals: list[ModelRefused] = []
    settings = orchmode.Settings(base_url=server.url, journal=tmp_path / "journal.db")
    credentials = orchmode.Credentials(api_key=API_KEY)
    async with orchmode.open_session(settings, workdir=tmp_path, credentials=credentials) as s:
        s.subscribe(retried.append, ModelRequestRetried)
        s.subscribe(refusals.append, ModelRefused)
        s.set_mode(True)
        first = await s.turn("review this")
        s.set_mode(False)
        second = await s.turn("sum it up")
    assert first.ok and second.ok, (first.text, second.text)
    check_sent_back(server, recorded, role, replaying.target)
    stop = stop_of(recorded)
    if stop is None:  # tried again, and the retry says what the stream lacked
        (retry,) = [r for r in retried if r.reason == "interrupted"]
        assert BROKEN[fixture.stem] in retry.detail
    details = refusal_of(recorded)
    if stop == "refusal" and details is not None:
        (refusal,) = refusals
        assert (refusal.category, refusal.explanation) == (
            details["category"],
            details["explanation"],
        )
        if role == "main":
            assert first.stop == "refusal" and details["explanation"] in first.text


# ------------------------------------------------------------- every block the SDK declares


def _members(union: object) -> tuple[type[pydantic.BaseModel], ...]:
    inner = typing.get_args(union)[0] if hasattr(union, "__metadata__") else union
    return typing.get_args(inner)


def _sample(hint: Any, depth: int = 0) -> Any:
    """A value of ``hint`` with every optional field filled in: the widest block the API
    could send of that type."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hasattr(hint, "__metadata__"):
        return _sample(args[0], depth)
    if origin is typing.Literal:
        return args[0]
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        real = [a for a in args if a is not type(None)]
        return _sample(real[0], depth) if real else None
    if origin is list:
        return [_sample(args[0], depth + 1)] if depth < 4 else []
    if origin is dict:
        return {"key": "value"}
    if isinstance(hint, type) and issubclass(hint, pydantic.BaseModel):
        return {
            (info.alias or name): _sample(info.annotation, depth + 1)
            for name, info in hint.model_fields.items()
        }
    return {str: "s", int: 7, float: 0.5, bool: True}.get(hint, {"any": "object"})


SDK_BLOCKS = sorted(
    {m for union in (ContentBlock, BetaContentBlock) for m in _members(union)},
    key=lambda m: m.__name__,
)


def _stream_of(blocks: list[Block], stop: str = "end_turn") -> Recorded:
    """A stream that sends each block whole in its ``content_block_start`` (no deltas)."""
    events: list[tuple[str, dict[str, Any] | str]] = [
        (
            "message_start",
            {"type": "message_start", "message": MESSAGE},
        )
    ]
    for i, block in enumerate(blocks):
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": i, "content_block": block},
            )
        )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    delta = {"stop_reason": stop, "stop_sequence": None}
    events.append(
        ("message_delta", {"type": "message_delta", "delta": delta, "usage": {"output_tokens": 5}})
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return Recorded(events, name="every block")


def test_the_recordings_cover_every_shape_and_each_broken_one_names_its_reason() -> None:
    recordings = [Recorded.load(f) for f in FIXTURES]
    stops = {stop_of(r) for r in recordings}
    assert {"end_turn", "tool_use", "pause_turn", "compaction", None} | DROPPED <= stops
    assert {r.name for r in recordings if stop_of(r) is None} == set(BROKEN)
    kinds = {b["type"] for r in recordings for b in assembled(r)}
    assert {"fallback", "compaction", "mcp_tool_use", "web_fetch_tool_result"} <= kinds
    assert "hologram" in kinds  # a block type no SDK declares


def test_the_round_trip_covers_every_block_type_the_sdk_declares() -> None:
    kinds = {_sample(m.model_fields["type"].annotation) for m in SDK_BLOCKS}
    assert {"fallback", "compaction", "mcp_tool_use", "container_upload"} <= kinds
    assert kinds <= set(block_shapes())  # each can be sent back: the API takes it in a request


@pytest.mark.parametrize("model", SDK_BLOCKS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("beta", [False, True], ids=["messages", "beta.messages"])
async def test_every_block_type_the_sdk_declares_goes_back_exactly_as_sent(
    model: type[pydantic.BaseModel], beta: bool, serve: StartServer, tmp_path: Path
) -> None:
    """The widest block of each type, with a null and an unknown field of a newer API, comes
    back field for field (``from``, not ``from_``), through the plain and the beta endpoint."""
    block = _sample(model)
    block["sent_by_a_newer_api"] = {"nested": [1, None]}
    if block["type"] == "text":
        block["citations"] = None  # an explicit null goes back as the null it was
    stream = _stream_of([block, {"type": "text", "text": "after it"}])
    server = await serve(lambda _request: stream)
    gateway = gateway_for(settings_for(server, tmp_path))
    edits = [{"type": "clear_tool_uses_20250919"}] if beta else None
    messages: list[Any] = [{"role": "user", "content": "go"}]
    reply = await gateway.complete(
        agent="main", system="s", messages=messages, tools=[], context_edits=edits
    )
    assert reply.content == [block, {"type": "text", "text": "after it"}]
    # Sent back, the strict server takes it (it learnt the field the stream sent).
    answer: Any = "on"
    if block["type"] == "tool_use":  # the API wants its result in the very next message
        answer = [{"type": "tool_result", "tool_use_id": block["id"], "content": "ok"}]
    messages += [
        {"role": "assistant", "content": reply.content},
        {"role": "user", "content": answer},
    ]
    again = await gateway.complete(agent="main", system="s", messages=messages, tools=[])
    assert again.content
    assert server.log[-1].body["messages"][1]["content"][0] == block


def test_a_block_sent_back_under_the_sdks_python_name_is_refused_as_the_api_refuses_it() -> None:
    fallback = {"type": "fallback", "from_": {"model": "a"}, "to": {"model": "b"}}
    hello: dict[str, Any] = {"role": "user", "content": "hi"}
    body: dict[str, Any] = {
        "model": "m",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [fallback]},
            {"role": "user", "content": "go on"},
        ],
    }
    with pytest.raises(InvalidRequest, match=r"messages\.1\.content\.0\.fallback\.from_: Extra"):
        validate_request(body)
    fallback["from"] = fallback.pop("from_")
    validate_request(body)
    with pytest.raises(InvalidRequest, match="'hologram' found using 'type' does not match"):
        validate_request(
            {
                **body,
                "messages": [
                    hello,
                    {"role": "assistant", "content": [{"type": "hologram"}]},
                ],
            }
        )


# --------------------------------------------------------------------------- 400s and the beta


async def test_a_400_that_names_the_beta_turns_context_editing_off_and_the_retry_goes_through(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda _r: OrchestrationScenario().main(_r), context_management=False)
    gateway = gateway_for(settings_for(server, tmp_path))
    edits = [{"type": "clear_tool_uses_20250919"}]
    reply = await gateway.complete(
        agent="main",
        system="s",
        messages=[{"role": "user", "content": "hi"}],
        tools=[],
        context_edits=edits,
    )
    assert reply.content and gateway.context_editing is False
    assert [e.status for e in server.log] == [400, 200]
    assert "context_management" not in server.log[1].body


async def test_any_other_400_is_reported_as_the_api_worded_it_and_context_editing_stays_on(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda _r: OrchestrationScenario().main(_r))
    gateway = gateway_for(settings_for(server, tmp_path))
    bad = {"type": "fallback", "from_": {"model": "a"}, "to": {"model": "b"}}
    with pytest.raises(ModelRequestError) as caught:
        await gateway.complete(
            agent="main",
            system="s",
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [bad]},
                {"role": "user", "content": "on"},
            ],
            tools=[],
            context_edits=[{"type": "clear_tool_uses_20250919"}],
        )
    assert str(caught.value) == (
        "the API rejected a request (400): "
        "messages.1.content.0.fallback.from_: Extra inputs are not permitted"
    )
    assert gateway.context_editing is True
    assert [e.status for e in server.log] == [400]  # not sent again without the beta


# --------------------------------------------------------------------------- incomplete streams


@pytest.mark.parametrize(
    ("events", "missing"),
    [
        ([], "ended without a message_start (no message id)"),
        (["message_start"], "ended without a message_delta or message_stop (no stop reason"),
        (["message_start", "message_stop"], "ended without a message_delta (no stop reason or"),
        (["message_start", "content_block_start"], "ended inside content block 0 (text), before"),
        (["message_start", "content_block_delta"], "a delta for content block 0, which it never"),
    ],
)
async def test_an_incomplete_stream_says_what_it_lacked(
    events: list[str], missing: str, serve: StartServer, tmp_path: Path
) -> None:
    whole = Recorded.load(FIXTURES[0].parent / "text_only.sse")
    # The first event of each kind named, in the recorded order: a stream cut there.
    cut = [next(e for e in whole.events if e[0] == name) for name in events]
    server = await serve(lambda _r: Recorded(cut))
    gateway = gateway_for(settings_for(server, tmp_path, stream_retries=0), EventBus())
    with pytest.raises(StreamInterrupted, match=re.escape(missing)):
        await gateway.complete(
            agent="main", system="s", messages=[{"role": "user", "content": "hi"}], tools=[]
        )


# --------------------------------------------------------------------------- the refusal line


def test_a_refusal_is_one_plain_line_naming_the_agent_category_and_explanation() -> None:
    refused = ModelRefused("worker 1.2", "cyber", "The request asks for exploit code.")
    line = StderrProgress.describe(refused)
    assert line == "[worker 1.2] refused by the model (cyber): The request asks for exploit code."
    assert StderrProgress.describe(ModelRefused("main", "", "")) == "[main] refused by the model"


def test_the_live_view_prints_a_refusal_above_its_region() -> None:
    stream = io.StringIO()
    console = Console(file=stream, width=160, force_terminal=True, color_system=None)
    view = LiveView(SessionTotals(), console)
    view(TurnStarted("review", ()))
    view(ModelRefused("worker 1.1", "bio", "Lab methods."))
    view(TurnDone("end_turn", 3))
    assert "[worker 1.1] refused by the model (bio): Lab methods." in stream.getvalue()


# --------------------------------------------------------------------------- assembly, any split


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


_EVENTS = pydantic.TypeAdapter(BetaRawMessageStreamEvent)


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(min_size=1, max_size=40).filter(str.strip),
    tool_input=st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8)),
    summary=st.text(max_size=30),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=6),
)
def test_the_gateway_assembles_a_reply_as_the_events_mean_it_however_they_are_split(
    text: str, tool_input: dict[str, Any], summary: str, cuts: list[int]
) -> None:
    """Text, a tool call's JSON and a compaction summary cut into any pieces come back
    whole, and equal to the reference reading of the same events."""
    start = {"type": "message_start", "message": {**MESSAGE, "id": "msg_split"}}
    events: list[tuple[str, dict[str, Any] | str]] = [("message_start", start)]

    def block(i: int, opening: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": i, "content_block": opening},
            )
        )
        for d in deltas:
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d})
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))

    block(
        0,
        {"type": "compaction", "content": None, "encrypted_content": None},
        [
            {"type": "compaction_delta", "content": p, "encrypted_content": None}
            for p in _split(summary, cuts)
        ]
        + [{"type": "compaction_delta", "encrypted_content": "e"}],
    )
    block(
        1,
        {"type": "text", "text": ""},
        [{"type": "text_delta", "text": p} for p in _split(text, cuts)],
    )
    block(
        2,
        {"type": "tool_use", "id": "toolu_split", "name": "bash", "input": {}},
        [
            {"type": "input_json_delta", "partial_json": p}
            for p in _split(json.dumps(tool_input), cuts)
        ],
    )
    delta = {"stop_reason": "tool_use", "stop_sequence": None}
    events.append(
        ("message_delta", {"type": "message_delta", "delta": delta, "usage": {"output_tokens": 3}})
    )
    events.append(("message_stop", {"type": "message_stop"}))
    builder = ReplyBuilder()
    for _, data in events:
        builder.feed(_EVENTS.validate_python(data))
    assert builder.missing() is None
    reply = builder.reply()
    assert reply.content == assembled(Recorded(events))
    assert reply.content[1]["text"] == text and reply.content[2]["input"] == tool_input


def test_a_condensed_workflow_result_keeps_a_refused_workers_reasons_whole() -> None:
    note = "[orchmode: the model declined to continue (refusal, category bio): Lab methods.]"
    refused = SubtaskEntry("Check item 1", AgentEntry("x" * 5000 + "\n" + note, "w1.md"))
    others = [SubtaskEntry(f"Check item {i}", AgentEntry("y" * 5000)) for i in (2, 3)]
    done = fit_result([], [refused, *others], [], 900, saved_at="r.md", directory="d")
    assert done.condensed and note in done.text
    assert "x" * (SUMMARY_CAP + 1) not in done.text  # the text before it is still cut
