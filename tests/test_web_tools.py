"""WebSearch and WebFetch as the API's server tools: offered to the roles that name them, within
the network rules' domains, priced per search in the ledger, and their reply blocks sent back
as they came — over real HTTP against the scripted server."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import anthropic
import pytest

from conftest import API_KEY, StartServer
from orchmode.core.domains import Pattern
from orchmode.core.events import TokenUsage
from orchmode.core.pricing import ModelPrice
from orchmode.core.settings import Settings
from orchmode.core.web_tools import WebDomains, web_domains, web_tool_notes, web_tool_schemas
from orchmode.testing import Reply, ScriptedRequest, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, role_of
from orchmode.testing.web import web_fetch, web_search
from recorded_runs import base_env, kill_run_when, orchmode
from test_agent_roles import define, first_requests, run_turn, tool_names

RESEARCHER = """\
---
name: researcher
description: Looks things up on the web.
tools: Read, WebSearch, WebFetch
---
Search first, then read the best page.
"""

SEARCHER = """\
---
name: searcher
description: Searches only.
tools: [Bash, WebSearch]
---
Search.
"""


def looks_up(subtask: str) -> list[Any]:
    return [*web_search(f"about {subtask}"), *web_fetch("https://docs.python.org/3/")]


def web_tools_of(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in body["tools"] if t.get("type", "").startswith("web_")}


def scenario(**extra: Any) -> OrchestrationScenario:
    return OrchestrationScenario(
        subtasks=[
            "plain work",
            {"prompt": "look it up", "agent": "researcher"},
            {"prompt": "search it", "agent": "searcher"},
        ],
        **{"web": looks_up, **extra},
    )


def patterns(*texts: str) -> list[Pattern]:
    return [Pattern(text, "network_allow") for text in texts]


# ---------------------------------------------------------------- domains, pure


def test_deny_rules_become_blocked_domains_and_wildcards_their_names() -> None:
    domains = web_domains([], patterns("evil.example", "*.tracker.net", "@github"))
    assert domains.allowed is None
    assert domains.blocked is not None
    assert domains.blocked[:2] == ("evil.example", "tracker.net")
    assert "github.com" in domains.blocked and "githubusercontent.com" in domains.blocked


def test_allow_rules_become_allowed_domains_less_what_a_deny_rule_touches() -> None:
    domains = web_domains(
        patterns("docs.python.org", "*.example.com", "10.0.0.0/8"), patterns("secret.example.com")
    )
    assert domains.blocked is None
    assert domains.allowed == ("docs.python.org",)
    notes = "\n".join(domains.notes)
    assert "example.com is allowed but secret.example.com is denied" in notes
    assert "10.0.0.0/8" in notes and "names only" in notes
    assert "covers example.com itself" in notes


def test_no_rules_no_limits() -> None:
    assert web_domains([], []) == web_domains([], [])
    assert web_domains([], []).allowed is None and web_domains([], []).blocked is None


def test_a_search_is_priced_per_use_on_top_of_its_tokens() -> None:
    price = ModelPrice(input=1, output=1, cache_write=1, cache_read=1)
    plain = price.cost(TokenUsage(1000, 1000))
    assert price.cost(TokenUsage(1000, 1000, web_search_requests=3)) == pytest.approx(plain + 0.03)
    assert price.cost(TokenUsage(1000, 1000, web_fetch_requests=3)) == plain  # tokens only
    assert price.batched().web_search == price.web_search


# ---------------------------------------------------------------- over HTTP


async def test_a_role_naming_the_web_tools_is_sent_them_and_others_are_not(
    serve: StartServer, work: Path
) -> None:
    define(work, RESEARCHER, SEARCHER)
    server = await serve(scenario())
    warnings: list[str] = []
    await run_turn(server, work, warnings)
    assert not any("WebSearch" in line for line in warnings), warnings
    workers = first_requests(server, "worker")
    assert "web_search" not in tool_names(workers["plain work"])
    researcher = web_tools_of(workers["look it up"])
    assert set(researcher) == {"web_search", "web_fetch"}
    assert researcher["web_search"]["type"] == "web_search_20250305"
    assert researcher["web_fetch"]["type"] == "web_fetch_20250910"
    for tool in researcher.values():  # no rules: no domain limits
        assert "allowed_domains" not in tool and "blocked_domains" not in tool
        assert tool["max_uses"] == 5
    assert set(web_tools_of(workers["search it"])) == {"web_search"}
    mains = [e.body for e in server.log if role_of(e.body) == "main"]
    assert all("web_search" not in tool_names(body) for body in mains)


async def test_a_reply_with_server_tool_blocks_goes_back_exactly_as_it_came(
    serve: StartServer, work: Path
) -> None:
    define(work, RESEARCHER, SEARCHER)
    server = await serve(scenario())
    await run_turn(server, work)
    entries = [
        e
        for e in server.log
        if role_of(e.body) == "worker" and e.body["messages"][0]["content"] == "look it up"
    ]
    first, second = entries[0], entries[1]
    assert first.reply is not None
    kinds = [block["type"] for block in first.reply.content]
    assert kinds[:4] == [
        "server_tool_use",
        "web_search_tool_result",
        "server_tool_use",
        "web_fetch_tool_result",
    ]
    sent_back = second.body["messages"][1]
    assert sent_back["role"] == "assistant"
    assert sent_back["content"] == first.reply.content  # every field, as it was streamed


async def test_deny_rules_go_as_blocked_domains(serve: StartServer, work: Path) -> None:
    define(work, RESEARCHER, SEARCHER)
    server = await serve(scenario())
    await run_turn(
        server,
        work,
        network_deny=("*.tracker.net",),
        permissions_deny=("WebFetch(domain:evil.example)",),
    )
    tools = web_tools_of(first_requests(server, "worker")["look it up"])
    for tool in tools.values():
        assert "allowed_domains" not in tool
        assert set(tool["blocked_domains"]) == {"tracker.net", "evil.example"}


async def test_allow_rules_go_as_allowed_domains(serve: StartServer, work: Path) -> None:
    define(work, RESEARCHER, SEARCHER)
    server = await serve(scenario())
    warnings: list[str] = []
    await run_turn(
        server,
        work,
        warnings,
        network_allow=("docs.python.org", "*.example.com"),
        network_deny=("secret.example.com",),
        permissions_allow=("WebFetch(domain:pypi.org)",),
    )
    tools = web_tools_of(first_requests(server, "worker")["look it up"])
    for tool in tools.values():
        assert "blocked_domains" not in tool
        assert tool["allowed_domains"] == ["docs.python.org", "pypi.org"]
    assert any("secret.example.com is denied" in line for line in warnings), warnings


async def test_the_main_agent_is_offered_what_main_web_tools_names(
    serve: StartServer, work: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=1))
    await run_turn(server, work, main_web_tools=("WebFetch",))
    mains = [e.body for e in server.log if role_of(e.body) == "main"]
    assert mains and all(set(web_tools_of(body)) == {"web_fetch"} for body in mains)


async def test_every_search_is_in_the_ledger_at_its_price(serve: StartServer, work: Path) -> None:
    define(work, RESEARCHER, SEARCHER)
    server = await serve(scenario())
    free_tokens = ModelPrice(input=0, output=0, cache_write=0, cache_read=0, web_search=10)
    await run_turn(server, work, session="web-ledger", prices={"claude-opus-5-5": free_tokens})
    searches = sum(
        1
        for e in server.log
        for block in (e.reply.content if e.reply is not None else [])
        if block.get("type") == "server_tool_use" and block.get("name") == "web_search"
    )
    assert searches == 2  # the researcher's and the searcher's; fetches cost only tokens
    assert await ledger_cost(work, "web-ledger") == pytest.approx(2 * 10 / 1000)


async def ledger_cost(work: Path, session: str) -> float:
    from orchmode.store import open_store

    store = await open_store(f"sqlite:///{work / 'journal.db'}")
    try:
        return (await store.budget(session)).cost
    finally:
        await store.close()


async def test_the_server_refuses_both_domain_lists_as_the_api_does(serve: StartServer) -> None:
    server = await serve(OrchestrationScenario())
    client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=server.url, max_retries=0)
    tool: Any = {
        "type": "web_search_20250305",
        "name": "web_search",
        "allowed_domains": ["a.org"],
        "blocked_domains": ["b.org"],
    }
    with pytest.raises(anthropic.BadRequestError, match="both allowed_domains and blocked"):
        await client.messages.create(
            model="claude-opus-5-5",
            max_tokens=100,
            messages=[{"role": "user", "content": "hi"}],
            tools=[tool],
        )
    bad_name: Any = {"type": "web_fetch_20250910", "name": "fetch"}
    with pytest.raises(anthropic.BadRequestError, match="name"):
        await client.messages.create(
            model="claude-opus-5-5",
            max_tokens=100,
            messages=[{"role": "user", "content": "hi"}],
            tools=[bad_name],
        )
    await client.close()


@pytest.mark.slow
def test_a_reply_with_server_tool_blocks_survives_a_kill_and_resume(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    scenario = OrchestrationScenario(
        subtasks=1, scout_command="touch scouting && sleep 60", web=looks_up
    )
    server = scripted(scenario)
    flags = ("--base-url", server.url, "--main-web-tools", "WebSearch,WebFetch")
    kill_run_when(lambda: (tmp_path / "scouting").exists(), "look it up", *flags, cwd=tmp_path)
    (tmp_path / "scouting").unlink()
    paused = server.log[0].reply
    assert paused is not None and paused.content[0]["type"] == "server_tool_use"
    since = len(server.log)
    result = orchmode("resume", *flags, "--claim-lease", "2", cwd=tmp_path, env=base_env())
    assert result.returncode == 0, result.stderr
    first = server.log[since].body
    replies = [m for m in first["messages"] if m["role"] == "assistant"]
    assert replies[0] == {"role": "assistant", "content": paused.content}  # as it came
    assert set(web_tools_of(first)) == {"web_search", "web_fetch"}


@pytest.mark.slow
def test_the_run_lines_show_and_budget_say_the_uses_and_their_cost(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    define(tmp_path, RESEARCHER, SEARCHER)
    server = scripted(scenario())
    config = tmp_path / "prices.toml"
    config.write_text(
        '[prices."claude-opus-5-5"]\n'
        "input = 0\noutput = 0\ncache_write = 0\ncache_read = 0\nweb_search = 10\n"
    )
    flags = ("--base-url", server.url, "--config", str(config))
    result = orchmode("run", "look it up", *flags, cwd=tmp_path, env=base_env())
    assert result.returncode == 0, result.stderr
    # each worker that used them says so, and so does the session's last line
    assert "1 web search, 1 web fetch, $0.010" in result.stderr
    assert "1 web search, $0.010" in result.stderr
    assert "2 web searches, 1 web fetch · $0.02" in result.stderr
    shown = orchmode("show", "--config", str(config), cwd=tmp_path, env=base_env())
    assert shown.returncode == 0, shown.stderr
    assert "2 web searches, 1 web fetch · $0.02" in shown.stdout
    ledger = orchmode("budget", "--config", str(config), cwd=tmp_path, env=base_env())
    assert ledger.returncode == 0, ledger.stderr
    assert "cost       $0.02 spent" in ledger.stdout
    assert "web        2 web searches ($0.0200), 1 web fetch" in ledger.stdout
    page = tmp_path / "report.html"
    written = orchmode("report", "-o", str(page), "--config", str(config), cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    html = page.read_text()
    assert '<dd id="total-web-searches" data-value="2">2</dd>' in html
    assert '<dd id="total-web-fetches" data-value="1">1</dd>' in html
    assert "2 web searches, 1 web fetch · $0.02" in html  # the turn's line
    uses = sorted(re.findall(r'<dd class="web-uses">([^<]+)</dd>', html))
    assert uses == ["1 web search", "1 web search, 1 web fetch"]  # each agent's own


async def test_a_request_that_used_the_web_tools_says_so_in_its_trace(
    serve: StartServer, work: Path
) -> None:
    from test_traces import named, traced_run

    define(work, RESEARCHER, SEARCHER)
    server = await serve(scenario())
    spans, _ = await traced_run(server, work)
    uses = sorted(
        (
            (s.attributes or {}).get("orchmode.web_search_requests"),
            (s.attributes or {}).get("orchmode.web_fetch_requests"),
        )
        for s in named(spans, "chat ")
        if "orchmode.web_search_requests" in (s.attributes or {})
    )
    assert uses == [(1, 0), (1, 1)]  # the searcher's first request, the researcher's


async def test_a_turn_paused_after_a_search_is_sent_back_as_it_is_and_goes_on(
    serve: StartServer, work: Path
) -> None:
    define(work, RESEARCHER, SEARCHER)
    inner = scenario(web=None)
    paused: list[Reply] = []

    def responder(request: ScriptedRequest) -> Reply:
        asked = request.messages[0]["content"] == "look it up"
        if asked and len(request.messages) == 1:
            paused.append(Reply(cast(Any, web_search("long")), stop_reason="pause_turn"))
            return paused[-1]
        return inner(request)

    server = await serve(responder)
    await run_turn(server, work)
    bodies = [e.body for e in server.log if e.body["messages"][0]["content"] == "look it up"]
    resent = bodies[1]["messages"]
    assert [m["role"] for m in resent] == ["user", "assistant"]  # nothing added after it
    kinds = [block["type"] for block in resent[1]["content"]]
    assert kinds == ["server_tool_use", "web_search_tool_result"]
    assert "[agent 2:" in str(server.log[-1].body["messages"])  # the researcher finished


@pytest.mark.parametrize("provider", ["bedrock", "vertex"])
def test_bedrock_and_vertex_are_sent_no_web_tools_and_it_is_said_once(provider: str) -> None:
    settings = Settings(provider=provider)  # type: ignore[arg-type]
    assert web_tool_schemas(settings, WebDomains()) == []
    (note,) = web_tool_notes(settings, None)
    assert note.startswith(f"{provider} does not offer Anthropic's web search")
    anthropic_settings = Settings(network_deny=("evil.example",))
    (search, fetch) = web_tool_schemas(anthropic_settings, web_domains([], patterns("x.org")))
    assert search["name"] == "web_search" and fetch["name"] == "web_fetch"


async def test_a_metered_session_reserves_the_searches_a_request_may_make(tmp_path: Path) -> None:
    from orchmode.model.budget import SessionBudget
    from orchmode.store import open_store

    store = await open_store(f"sqlite:///{tmp_path / 'j.db'}")
    free = ModelPrice(input=0, output=0, cache_write=0, cache_read=0, web_search=10)
    settings = Settings(max_cost=1.0, prices={"claude-opus-5-5": free}, web_max_uses=7)
    budget = SessionBudget(store, "s", settings)
    tools = web_tool_schemas(settings, WebDomains())
    try:
        reservation = await budget.before_request("", [], tools, "claude-opus-5-5")
        assert reservation is not None and reservation.cost == pytest.approx(7 * 10 / 1000)
        plain = await budget.before_request("", [], [], "claude-opus-5-5")
        assert plain is not None and plain.cost == 0
    finally:
        await store.close()


async def test_the_scripted_server_streams_the_blocks_and_their_usage_as_the_sdk_reads_them(
    serve: StartServer,
) -> None:
    def responder(request: ScriptedRequest) -> Reply:
        blocks = [*web_search("q"), *web_fetch("https://a.org/"), {"type": "text", "text": "ok"}]
        return Reply(cast(Any, blocks))

    server = await serve(responder)
    client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=server.url, max_retries=0)
    tools: Any = [
        {"type": "web_search_20250305", "name": "web_search", "blocked_domains": ["b.org"]},
        {"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 2},
    ]
    ask: Any = {"model": "claude-opus-5-5", "max_tokens": 100, "tools": tools}
    ask["messages"] = [{"role": "user", "content": "hi"}]
    async with client.messages.stream(**ask) as stream:
        streamed = await stream.get_final_message()
    whole = await client.messages.create(**ask)
    await client.close()
    for message in (streamed, whole):
        assert [b.type for b in message.content] == [
            "server_tool_use",
            "web_search_tool_result",
            "server_tool_use",
            "web_fetch_tool_result",
            "text",
        ]
        uses = message.usage.server_tool_use
        assert uses is not None and (uses.web_search_requests, uses.web_fetch_requests) == (1, 1)
        assert message.stop_reason == "end_turn"
    first, result = streamed.content[0], streamed.content[1]
    assert first.type == "server_tool_use" and first.input == {"query": "q"}
    assert result.type == "web_search_tool_result" and result.tool_use_id == first.id


def test_a_role_gets_the_web_tools_only_by_naming_them() -> None:
    from orchmode.core.agents import AgentDefinition

    tools: list[Any] = [{"name": "bash"}, {"name": "report_findings"}]
    web = web_tool_schemas(Settings(), WebDomains())

    def offered(entries: tuple[str, ...] | None) -> list[str]:
        role = AgentDefinition(
            name="r",
            description="d",
            tools=entries,
            model=None,
            effort=None,
            isolation=None,
            instructions="",
            path=Path("r.md"),
        )
        return [str(t["name"]) for t in role.offered([*tools, *web])]

    assert offered(None) == ["bash", "report_findings"]  # every tool but the billed ones
    assert offered(("Bash", "Web*")) == ["bash", "report_findings", "web_search", "web_fetch"]
    assert offered(("webfetch",)) == ["report_findings", "web_fetch"]


async def test_an_agents_budget_holds_room_for_the_searches_a_request_may_make() -> None:
    from orchmode.core.errors import AllowanceSpent
    from orchmode.model.allowance import AgentLimits, Allowance

    price = ModelPrice(input=0, output=1, cache_write=0, cache_read=0, web_search=10)
    agent = Allowance(AgentLimits(usd=0.05), name="worker 1.1")
    hold = await agent.reserve(100, 1000, price, searches=3)  # $0.03 of searches
    assert hold.usd == pytest.approx(0.03 + 1000 / 1_000_000)
    hold.settle(0, 0.0)
    with pytest.raises(AllowanceSpent):  # 5 searches cost all of it: no room for output
        await agent.reserve(100, 1000, price, searches=5)


async def test_a_bare_webfetch_deny_rule_withholds_web_fetch(
    serve: StartServer, work: Path
) -> None:
    define(work, RESEARCHER, SEARCHER)
    server = await serve(scenario())
    await run_turn(server, work, permissions_deny=("WebFetch",))
    assert set(web_tools_of(first_requests(server, "worker")["look it up"])) == {"web_search"}
