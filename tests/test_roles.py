"""A model and an effort per role: each agent's requests, its cost, and its journal key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import API_KEY, StartServer, settings_for
from orchmode.core.events import Event, EventBus, ModelRequestDone, SubagentDone
from orchmode.core.pricing import MODEL_ALIASES, default_prices
from orchmode.core.settings import Settings
from orchmode.model.providers import Credentials
from orchmode.session.agent import open_conversation
from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, role_of
from recorded_runs import orchmode

ROLES = ("main", "worker", "verifier", "resolver")


async def run_session(server: ScriptedServer, tmp_path: Path, **overrides: Any) -> list[Event]:
    """One orchestrated turn with ``overrides``; every event it emitted."""
    settings = settings_for(server, tmp_path, **overrides)
    events = EventBus()
    seen: list[Event] = []
    events.subscribe(seen.append)
    async with open_conversation(settings, Credentials(api_key=API_KEY), events=events) as session:
        await session.turn("review it")
    return seen


def requests_by_role(server: Any) -> dict[str, set[tuple[str, str]]]:
    """(model, effort) of every request the server saw, by the role that sent it."""
    found: dict[str, set[tuple[str, str]]] = {}
    for entry in server.log:
        effort = (entry.body.get("output_config") or {}).get("effort", "")
        found.setdefault(role_of(entry.body), set()).add((entry.body["model"], effort))
    return found


async def test_workers_and_verifiers_run_on_their_own_models_and_the_main_agent_on_model(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=4))
    events = await run_session(
        server,
        tmp_path,
        worker_model="haiku",
        verifier_model="claude-sonnet-5-5",
        verifier_effort="low",
    )
    assert requests_by_role(server) == {
        "main": {("claude-opus-5-5", "xhigh")},
        "worker": {("claude-haiku-4-5", "xhigh")},
        "verifier": {("claude-sonnet-5-5", "low")},
    }
    # each request is recorded with its model, and each agent costs its own model's price
    done = [e for e in events if isinstance(e, ModelRequestDone)]
    assert {e.model for e in done if e.agent == "main"} == {"claude-opus-5-5"}
    assert {e.model for e in done if e.agent.startswith("worker")} == {"claude-haiku-4-5"}
    prices = default_prices()
    agents = [e for e in events if isinstance(e, SubagentDone)]
    assert len(agents) == 8
    for agent in agents:
        model = "claude-haiku-4-5" if agent.role == "worker" else "claude-sonnet-5-5"
        assert agent.cost == pytest.approx(prices[model].cost(agent.usage))
        assert agent.cost > 0


async def test_a_changed_worker_model_misses_the_journal_and_an_unchanged_one_hits(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=3))
    await run_session(server, tmp_path, worker_model="haiku")
    seen = len(server.log)
    await run_session(server, tmp_path, worker_model="haiku")
    assert {role_of(e.body) for e in server.log[seen:]} == {"main"}  # every agent served
    seen = len(server.log)
    await run_session(server, tmp_path, worker_model="sonnet")
    started = [role_of(e.body) for e in server.log[seen:] if len(e.body["messages"]) == 1]
    # the workers ran again, on the new model; their verifiers, shown the same reports as
    # before by this script, were served from the journal
    assert started == ["worker", "worker", "worker"]
    assert {e.body["model"] for e in server.log[seen:] if role_of(e.body) == "worker"} == {
        "claude-sonnet-5-5"
    }


def test_a_cost_cap_needs_a_price_for_every_model_the_agents_may_use() -> None:
    priced = Settings(max_cost=5.0, worker_model="haiku")
    assert priced.unpriced() is None
    unpriced = Settings(max_cost=5.0, verifier_model="claude-some-new-model")
    assert unpriced.unpriced() == "claude-some-new-model"


@given(
    st.sampled_from([*MODEL_ALIASES, *(a.upper() for a in MODEL_ALIASES), "claude-x-1", " opus "]),
    st.sampled_from(ROLES),
    st.one_of(st.none(), st.sampled_from(["haiku", "claude-y-2"])),
)
def test_each_role_has_its_own_model_or_falls_back_to_model(
    model: str, role: Any, own: str | None
) -> None:
    settings = Settings(model=model, **({f"{role}_model": own} if own and role != "main" else {}))
    expected_main = MODEL_ALIASES.get(model.strip().lower(), model.strip())
    assert settings.model == expected_main
    chosen = settings.model_for(role)
    if own and role != "main":
        assert chosen == MODEL_ALIASES.get(own, own)
    else:
        assert chosen == expected_main
    assert settings.models()[0] == expected_main and chosen in settings.models()


def test_an_empty_model_name_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be empty"):
        Settings(worker_model="  ")


@pytest.mark.slow
def test_budget_show_and_report_split_tokens_and_dollars_by_model(
    scripted: Any, tmp_path: Path
) -> None:
    server = scripted(OrchestrationScenario(subtasks=3))
    run = orchmode(
        "run", "review it", "--base-url", server.url, "--sandbox", "off",
        "--worker-model", "haiku", "--verifier-model", "sonnet", "--plain",
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    # what each model was asked, from the server's own log, priced by the table
    prices = default_prices()
    spent: dict[str, float] = {}
    for entry in server.log:
        usage = entry.billed
        if entry.outcome != "ok" or usage is None:
            continue
        model = entry.body["model"]
        spent[model] = spent.get(model, 0.0) + prices[model].cost(usage)
    assert set(spent) == {"claude-opus-5-5", "claude-haiku-4-5", "claude-sonnet-5-5"}

    budget = orchmode("budget", cwd=tmp_path)
    assert budget.returncode == 0, budget.stderr
    line = next(x for x in budget.stdout.splitlines() if x.startswith("models "))
    shown = dict(re.findall(r"(claude-[\w-]+) \d+% \(\$([\d.]+),", line))
    assert set(shown) == set(spent)
    for model, dollars in shown.items():
        assert float(dollars) == pytest.approx(spent[model], abs=0.006)
    # dearest first
    assert list(shown) == sorted(shown, key=lambda m: -spent[m])

    show = orchmode("show", cwd=tmp_path)
    assert show.returncode == 0, show.stderr
    assert line.split(None, 1)[1] in show.stdout
    report = orchmode("report", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    page = (tmp_path / report.stdout.strip()).read_text()
    assert "by model: claude-opus-5-5" in page
    # by role: here each subagent role had its own model, so each role's dollars are its model's
    split = page.split("by role: ")[1].split(" · ")[0]
    roles = {role: float(dollars) for role, dollars in re.findall(r"(\w+) \$([\d.]+)", split)}
    assert list(roles) == ["worker", "verifier"]
    assert roles["worker"] == pytest.approx(spent["claude-haiku-4-5"], abs=0.0001)
    assert roles["verifier"] == pytest.approx(spent["claude-sonnet-5-5"], abs=0.0001)
