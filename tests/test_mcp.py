"""The user's MCP servers as tools: real servers written with the official SDK (stdio and
streamable HTTP), real HTTP to the scripted model, real sessions and a real journal."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import StartServer, conversation_for, settings_for, store_for
from mcp_servers import http_server, value_of
from orchmode.core.errors import ConfigError
from orchmode.core.events import Event, EventBus, McpCallDone, McpServerFailed, SubagentDone
from orchmode.core.permissions import Rules
from orchmode.session.agent import Conversation as Session
from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, role_of
from orchmode.tools.mcpconfig import MAX_TOOL_NAME, expand, parse, tool_name
from recorded_runs import base_env, orchmode

SERVERS = Path(__file__).with_name("mcp_servers.py")
TOKEN = "tok-5ecret-7f3a9c1e"


def stdio(name: str = "demo", **extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(SERVERS), name], **extra}


def write_config(path: Path, servers: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def offered(server: ScriptedServer, role: str) -> set[str]:
    """The MCP tools the requests of ``role`` offered."""
    names: set[str] = set()
    for entry in server.log:
        if role_of(entry.body) == role:
            names.update(t["name"] for t in entry.body.get("tools", []))
    return {n for n in names if n.startswith("mcp__")}


def tool_results(server: ScriptedServer, role: str) -> list[dict[str, Any]]:
    """Every tool_result block the requests of ``role`` carried, each once."""
    seen: dict[str, dict[str, Any]] = {}
    for entry in server.log:
        if role_of(entry.body) != role:
            continue
        for message in entry.body["messages"]:
            content = message.get("content")
            if isinstance(content, list):
                for block in content:
                    if block.get("type") == "tool_result":
                        seen[block["tool_use_id"]] = block
    return list(seen.values())


def result_texts(server: ScriptedServer, role: str) -> list[str]:
    return [str(b["content"]) for b in tool_results(server, role)]


def lookup_of(subtask: str) -> tuple[str, dict[str, Any]]:
    return "mcp__web__lookup", {"key": subtask}


async def run_session(
    serve: StartServer,
    tmp_path: Path,
    scenario: OrchestrationScenario,
    servers: dict[str, Any],
    window: int | None = None,
    **overrides: Any,
) -> tuple[ScriptedServer, list[Event], Session]:
    server = await serve(scenario, context_window=window)
    if window is not None:
        overrides.setdefault("context_window", window)
    config = write_config(tmp_path / "mcp.json", servers)
    overrides.setdefault("sandbox", "off")
    settings = settings_for(server, tmp_path, mcp_config=config, **overrides)
    events: list[Event] = []
    bus = EventBus()
    bus.subscribe(events.append)
    session = await conversation_for(settings, events=bus, store=store_for(tmp_path))
    try:
        result = await session.turn("look into the project")
    finally:
        await session.close()
    assert result.ok, result.text
    return server, events, session


@pytest.fixture
def web() -> Iterator[str]:
    with http_server("web") as url:
        yield url


# --------------------------------------------------------------------------- the config


def test_a_config_in_the_shape_of_mcp_json_is_read_with_its_variables_filled() -> None:
    text = json.dumps(
        {
            "mcpServers": {
                "gh": {
                    "command": "npx",
                    "args": ["-y", "server-github"],
                    "env": {"GITHUB_TOKEN": "${GH_TOKEN}", "LEVEL": "${LEVEL:-info}"},
                },
                "docs": {"type": "http", "url": "https://example.com/mcp",
                         "headers": {"Authorization": "Bearer ${DOCS_KEY}"}},
                "plain": {"url": "http://127.0.0.1:9/mcp", "agents": ["worker"],
                          "deny": ["delete_*"]},
            }
        }
    )  # fmt: skip
    config = parse(text, {"GH_TOKEN": "ghp-abc123456", "DOCS_KEY": "k-98765432"}, "x.json")
    gh = config.servers["gh"]
    assert gh.type == "stdio" and gh.env == {"GITHUB_TOKEN": "ghp-abc123456", "LEVEL": "info"}
    assert config.servers["plain"].type == "http"  # a url alone means streamable HTTP
    assert config.for_role("main") == ["docs", "gh"]
    assert config.for_role("worker") == ["docs", "gh", "plain"]
    assert not config.servers["plain"].offers("delete_repo")
    assert config.servers["plain"].offers("search")
    assert set(config.secrets) == {"ghp-abc123456", "Bearer k-98765432"}  # not "info"
    assert "ghp-abc123456" not in repr(config) and "k-98765432" not in repr(config)


@pytest.mark.parametrize(
    ("servers", "needle"),
    [
        ({"a b": {"command": "x"}}, "server name 'a b'"),
        ({"a": {"args": []}}, "mcpServers.a.command: Field required"),
        ({"a": {"type": "sse", "url": "http://h/sse"}}, "old SSE transport"),
        ({"a": {"command": "x", "agents": ["boss"]}}, "mcpServers.a.agents.0"),
        ({"a": {"command": "x", "colour": "red"}}, "mcpServers.a.colour"),
        ({"a": {"command": "x", "env": {"T": "${MISSING}"}}}, "${MISSING}, which is not set"),
        ({"a": {"type": "http", "url": "ftp://h"}}, "mcpServers.a.url"),
    ],
)
def test_a_bad_config_is_a_clear_error_naming_the_place(
    servers: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(json.dumps({"mcpServers": servers}), {}, "cfg.json")
    assert needle in str(caught.value)
    assert str(caught.value).startswith("cfg.json")


@pytest.mark.parametrize("text", ["", "[]", '{"servers": {}}', "{not json"])
def test_a_file_that_is_no_mcp_config_says_what_it_should_be(text: str) -> None:
    with pytest.raises(ConfigError, match=r"cfg\.json"):
        parse(text, {}, "cfg.json")


@given(
    st.lists(
        st.tuples(st.from_regex(r"[A-Za-z0-9_-]{1,32}", fullmatch=True), st.text(min_size=1)),
        min_size=1,
        max_size=20,
        unique=True,
    )
)
def test_tool_names_are_valid_for_the_api_and_never_collide(pairs: list[tuple[str, str]]) -> None:
    taken: set[str] = set()
    for server, tool in pairs:
        name = tool_name(server, tool, taken)
        assert name not in taken
        assert 1 <= len(name) <= MAX_TOOL_NAME
        assert all(c.isascii() and (c.isalnum() or c in "_-") for c in name)
        taken.add(name)


@given(st.text().filter(lambda s: "${" not in s))
def test_text_without_variables_is_left_as_it_is(text: str) -> None:
    assert expand(text, {}, "here") == text


# --------------------------------------------------------------------------- in sessions


async def test_the_main_agent_and_workers_call_stdio_and_http_tools(
    serve: StartServer, tmp_path: Path, web: str
) -> None:
    subtasks = ["alpha module", "beta module", "gamma module"]
    scenario = OrchestrationScenario(
        subtasks=subtasks,
        scout_call=("mcp__demo__lookup", {"key": "layout", "size": 6000}),
        worker_call=lookup_of,
        report_bytes=6000,  # reports the size a real model writes
        verifier_report_bytes=2500,
    )
    server, events, _ = await run_session(
        serve,
        tmp_path,
        scenario,
        window=200_000,  # the server refuses, as the API does, what does not fit
        servers={
            "demo": stdio("demo", agents=["main"]),
            "web": {"type": "http", "url": web, "agents": ["worker"], "allow": ["lookup"]},
        },
    )
    assert {e.outcome for e in server.log} == {"ok"}
    assert offered(server, "main") == {
        f"mcp__demo__{t}"
        for t in ("lookup", "add", "whoami", "whereami", "picture", "broken", "hang", "crash",
                  "delete_everything")
    }  # fmt: skip
    assert offered(server, "worker") == {"mcp__web__lookup"}  # allow-listed, workers only
    assert offered(server, "verifier") == set()
    assert result_texts(server, "main")[0] == value_of("layout", 6000).strip()
    worker_results = result_texts(server, "worker")
    for subtask in subtasks:
        assert value_of(subtask) in worker_results
    calls = [e for e in events if isinstance(e, McpCallDone)]
    assert sorted((c.server, c.tool, c.ok) for c in calls) == [
        ("demo", "lookup", True),
        *[("web", "lookup", True)] * 3,
    ]
    assert {c.agent for c in calls if c.server == "web"} == {
        "worker 1.1",
        "worker 1.2",
        "worker 1.3",
    }
    done = [e for e in events if isinstance(e, SubagentDone) and e.role == "worker"]
    assert all(e.status == "finished" for e in done)


async def test_a_denied_tool_is_not_offered_and_a_call_to_it_is_refused(
    serve: StartServer, tmp_path: Path
) -> None:
    scenario = OrchestrationScenario(
        subtasks=1, scout_call=("mcp__demo__delete_everything", {}), worker_command=None
    )
    server, events, _ = await run_session(
        serve, tmp_path, scenario, {"demo": stdio(deny=["delete_*", "crash"])}
    )
    names = offered(server, "main")
    assert "mcp__demo__delete_everything" not in names and "mcp__demo__crash" not in names
    assert "mcp__demo__lookup" in names
    refused = tool_results(server, "main")[0]
    assert refused.get("is_error") is True
    assert "no MCP tool named 'mcp__demo__delete_everything'" in str(refused["content"])
    assert not [e for e in events if isinstance(e, McpCallDone)]  # nothing reached the server


async def test_permission_rules_and_annotations_decide_each_call(
    serve: StartServer, tmp_path: Path
) -> None:
    """A deny rule refuses a tool, a destructive one asks (and unattended, is refused at
    once), a read-only one runs though its server says it reaches the world, and one with
    no annotations runs as it always has."""
    calls = {
        "who am I": ("mcp__demo__whoami", {}),
        "clean up": ("mcp__demo__delete_everything", {}),
        "sum it": ("mcp__demo__add", {"a": 2, "b": 3}),
        "look it up": ("mcp__demo__lookup", {"key": "layout"}),
    }

    def call_of(subtask: str) -> tuple[str, dict[str, Any]]:
        return next(call for name, call in calls.items() if name in subtask)

    scenario = OrchestrationScenario(subtasks=list(calls), worker_call=call_of, worker_command=None)
    settings_rules = {"permissions_deny": ("mcp__demo__whoami",), "approvals": "deny"}
    server = await serve(scenario)
    config = write_config(tmp_path / "mcp.json", {"demo": stdio(agents=["worker"])})
    settings = settings_for(
        server, tmp_path, mcp_config=config, sandbox="off", max_concurrent=1, **settings_rules
    )
    events: list[Event] = []
    bus = EventBus()
    bus.subscribe(events.append)
    rules, warnings = Rules.load(settings, tmp_path, {"HOME": str(tmp_path)})
    assert not warnings
    session = await conversation_for(
        settings,
        events=bus,
        store=store_for(tmp_path),
        rules=rules,
    )
    try:
        assert (await session.turn("look into the project")).ok
    finally:
        await session.close()
    texts = " | ".join(result_texts(server, "worker"))
    assert "demo/whoami was not called" in texts and "mcp__demo__whoami" in texts
    assert "demo/delete_everything was not called" in texts and "--approvals deny" in texts
    assert "5" in result_texts(server, "worker") and value_of("layout") in texts
    reached = sorted(e.tool for e in events if isinstance(e, McpCallDone))
    assert reached == ["add", "lookup"]  # nothing refused reached the server


async def test_results_are_cut_like_bash_output_and_pictures_are_described(
    serve: StartServer, tmp_path: Path
) -> None:
    def call(subtask: str) -> tuple[str, dict[str, Any]]:
        if subtask == "picture":
            return "mcp__demo__picture", {}
        return "mcp__demo__lookup", {"key": subtask, "size": 50_000}

    scenario = OrchestrationScenario(subtasks=["big", "picture"], worker_call=call)
    server, _, _ = await run_session(
        serve, tmp_path, scenario, {"demo": stdio()}, output_limit=8000
    )
    texts = result_texts(server, "worker")
    big = next(t for t in texts if "value of big" in t)
    assert big.startswith(value_of("big", 8000))
    assert "[output truncated: 8000 of 50000 characters shown]" in big
    assert len(big) < 8200
    assert any(t.startswith("[image content: image/png") and "not shown" in t for t in texts)


async def test_a_server_that_fails_to_start_gives_one_warning_and_the_run_goes_on(
    serve: StartServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scenario = OrchestrationScenario(
        subtasks=3, scout_call=("mcp__broken__lookup", {"key": "x"}), worker_call=lookup_of
    )
    caplog.set_level(logging.WARNING, logger="orchmode")
    server, events, _ = await run_session(
        serve,
        tmp_path,
        scenario,
        {"broken": stdio("broken", env={"MCP_TEST_START": "fail"}), "web": stdio("web")},
    )
    assert offered(server, "main") and all(
        n.startswith("mcp__web__") for n in offered(server, "main")
    )
    main = tool_results(server, "main")[0]
    assert main.get("is_error") is True
    assert "MCP server 'broken' is unavailable" in str(main["content"])
    warnings = [r.getMessage() for r in caplog.records if "'broken'" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "could not start" in warnings[0] and "cannot open the index" in warnings[0]
    assert len([e for e in events if isinstance(e, McpServerFailed)]) == 1
    assert sum(value_of(s) in result_texts(server, "worker") for s in scenario.subtask_list()) == 3


async def test_a_server_named_by_command_is_never_the_repositorys_program_of_that_name(
    serve: StartServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server configured as ``python …`` starts in the working directory: under a PATH
    whose first entry is empty, the repository's own ``python`` would be the one run, on
    the host. It is looked up on PATH's absolute directories instead."""
    marks = tmp_path / "marks"
    marks.mkdir()
    fake = tmp_path / "python"  # the working directory is tmp_path
    fake.write_text(f"#!/bin/sh\necho python >> {marks}/python\nexit 97\n")
    fake.chmod(0o755)
    here = os.path.dirname(sys.executable)  # the Python the test server needs
    monkeypatch.setenv("PATH", os.pathsep.join(["", here, os.environ["PATH"]]))
    scenario = OrchestrationScenario(subtasks=1, scout_call=("mcp__demo__lookup", {"key": "k"}))
    demo = {"command": "python", "args": [str(SERVERS), "demo"], "agents": ["main"]}
    server, _, _ = await run_session(serve, tmp_path, scenario, {"demo": demo})
    assert result_texts(server, "main")[0] == value_of("k").strip()
    assert list(marks.iterdir()) == []


@pytest.mark.slow
async def test_a_server_that_hangs_at_start_or_in_a_call_times_out(
    serve: StartServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def call(subtask: str) -> tuple[str, dict[str, Any]]:
        return ("mcp__slow__hang", {}) if subtask == "wait" else lookup_of(subtask)

    scenario = OrchestrationScenario(
        subtasks=["wait", "one", "two"], scout_call=("mcp__mute__lookup", {"key": "x"}),
        worker_call=call,
    )  # fmt: skip
    caplog.set_level(logging.WARNING, logger="orchmode")
    server, events, _ = await run_session(
        serve,
        tmp_path,
        scenario,
        {
            "mute": stdio("mute", env={"MCP_TEST_START": "hang"}, start_timeout=1.5),
            "slow": stdio("slow", timeout=1.5, agents=["worker"]),
            "web": stdio("web", agents=["worker"]),
        },
    )
    said = "'mute' could not start: it did not answer within 1.5 s of starting"
    assert any(said in r.getMessage() for r in caplog.records)
    timed_out = [e for e in events if isinstance(e, McpCallDone) and e.tool == "hang"]
    assert len(timed_out) == 1 and not timed_out[0].ok
    assert "no answer within 1.5 s" in timed_out[0].error
    assert 1.4 < timed_out[0].duration < 10
    texts = result_texts(server, "worker")
    assert any("mcp__slow__hang timed out" in t for t in texts)
    assert value_of("one") in texts and value_of("two") in texts
    done = [e for e in events if isinstance(e, SubagentDone) and e.role == "worker"]
    assert len(done) == 3  # the fan-out did not hang


async def test_a_server_that_exits_mid_run_answers_every_later_call_with_an_error(
    serve: StartServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scenario = OrchestrationScenario(
        subtasks=["a", "b"],
        scout_call=("mcp__demo__crash", {}),
        worker_call=lambda s: ("mcp__demo__lookup", {"key": s}),
    )
    caplog.set_level(logging.WARNING, logger="orchmode")
    server, events, _ = await run_session(serve, tmp_path, scenario, {"demo": stdio()})
    crashed = tool_results(server, "main")[0]
    assert crashed.get("is_error") is True and "mcp__demo__crash failed" in str(crashed["content"])
    for text in result_texts(server, "worker"):  # asked for after it died: not offered
        assert "MCP server 'demo' is unavailable: it stopped" in text
    assert offered(server, "worker") == set()
    assert len([r for r in caplog.records if "'demo'" in r.getMessage()]) == 1
    assert [e.ok for e in events if isinstance(e, McpCallDone)] == [False]


async def test_a_servers_secrets_reach_no_record(
    serve: StartServer, tmp_path: Path, web: str
) -> None:
    def call(subtask: str) -> tuple[str, dict[str, Any]]:
        return f"mcp__demo__{subtask}", {}

    scenario = OrchestrationScenario(
        subtasks=["whoami", "broken"], scout_call=("mcp__demo__whoami", {}), worker_call=call
    )
    server, events, session = await run_session(
        serve, tmp_path, scenario, {"demo": stdio(env={"DEMO_TOKEN": TOKEN})}
    )
    texts = result_texts(server, "main") + result_texts(server, "worker")
    assert "my token is ***" in texts
    assert any("the index is corrupt (token ***)" in t for t in texts)
    assert TOKEN not in json.dumps([e.body for e in server.log])  # what the model saw
    assert TOKEN not in repr(events)
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.name != "mcp.json":
            assert TOKEN.encode() not in path.read_bytes(), path
    assert TOKEN not in json.dumps(session.history)


@pytest.mark.slow
async def test_mcp_tools_are_part_of_a_subagents_journal_key(
    serve: StartServer, tmp_path: Path
) -> None:
    scenario = OrchestrationScenario(
        subtasks=2, worker_call=lambda s: ("mcp__demo__add", {"a": 1, "b": 2})
    )
    server = await serve(scenario)

    async def once(deny: list[str]) -> list[SubagentDone]:
        config = write_config(tmp_path / "mcp.json", {"demo": stdio(deny=deny)})
        settings = settings_for(server, tmp_path, mcp_config=config, sandbox="off")
        done: list[SubagentDone] = []
        bus = EventBus()
        bus.subscribe(lambda e: done.append(e) if isinstance(e, SubagentDone) else None)
        session = await conversation_for(settings, events=bus, store=store_for(tmp_path))
        try:
            assert (await session.turn("check")).ok
        finally:
            await session.close()
        return done

    first = await once([])
    again = await once([])
    other_tools = await once(["hang"])
    assert not any(e.from_journal for e in first)
    assert all(e.from_journal for e in again) and len(again) == len(first)
    assert not any(e.from_journal for e in other_tools)


# --------------------------------------------------------------------------- the command line


@pytest.mark.slow
def test_orchmode_run_shows_mcp_calls_in_lines_show_and_report(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    marker = tmp_path / "started-by-the-repository"
    # A repository's own .mcp.json must never start anything: orchmode reads only --mcp-config.
    (work / ".mcp.json").write_text(json.dumps({"mcpServers": {"evil": {
        "command": "sh", "args": ["-c", f"touch {marker}"]}}}))  # fmt: skip
    config = write_config(tmp_path / "mcp.json", {"demo": stdio(env={"DEMO_TOKEN": TOKEN})})
    server = scripted(
        OrchestrationScenario(subtasks=2, worker_call=lambda s: ("mcp__demo__lookup", {"key": s}))
    )
    env = base_env()
    run = orchmode(
        "run", "look", "--base-url", server.url, "--sandbox", "off", "--mcp-config",
        str(config), "--plain", cwd=work, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "[worker 1.1] mcp demo/lookup  (" in run.stderr and ", ok)" in run.stderr
    assert not marker.exists()
    shown = orchmode("show", cwd=work, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "mcp demo/lookup  ok" in shown.stdout, shown.stdout
    report = orchmode("report", "-o", str(tmp_path / "r.html"), cwd=work, env=env)
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "r.html").read_text()
    assert "mcp demo/lookup" in html and "an MCP server, with your rights" in html
    for text in (run.stdout, run.stderr, shown.stdout, html):
        assert TOKEN not in text


def test_a_bad_mcp_config_stops_the_run_before_anything_starts(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = scripted(OrchestrationScenario(subtasks=1))
    config = tmp_path / "mcp.json"
    config.write_text('{"mcpServers": {"x": {"type": "sse", "url": "http://h"}}}')
    run = orchmode(
        "run", "look", "--base-url", server.url, "--sandbox", "off", "--mcp-config",
        str(config), cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode != 0
    assert "old SSE transport" in run.stderr and "Traceback" not in run.stderr
    assert not server.log
