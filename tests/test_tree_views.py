"""Nested runs wherever a run is shown: the plain lines, the live view, `orchmode show`, the report.

Worker 1.1 makes call 2; worker 2.2 makes call 3. The events go on a bus to every display
and the recorder, in an order a run sends them (see ``tree_events``), then are read back
from the store. Each agent's cost is a distinct power of two in cents, so a roll-up that
missed or doubled any agent shows a different sum.
"""

from __future__ import annotations

import re
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest

from orchmode.core.events import Event, ModelRequestDone, Role, SubagentDone
from orchmode.views.live import BUDGET
from orchmode.views.report import render_report
from orchmode.views.transcript import plain, transcript
from test_context_display import emit
from test_live import render
from test_report import assert_self_contained, browse, chromium  # noqa: F401  (chromium: a fixture)
from tree_events import in_order, plan_tree, play, shuffled, subtree_cost

CALLS = plan_tree([[2, 1], [2, 0, 1], [1]])
#: the report's anchors of the two workers that made calls, and of an agent two levels down
W11, W22, NESTED = "agent-t1-1-1-worker", "agent-t1-2-2-worker", "agent-t1-3-1-verifier"
#: worker 1.1's subtree: itself and all of calls 2 and 3; worker 2.2's: itself and call 3
SUBTREE_1_1 = "$10.090"
SUBTREE_2_2 = "$8.320"


def nested_run() -> list[Event]:
    return play(CALLS, in_order)


def stopped_by_budget(events: list[Event]) -> list[Event]:
    """The same run, but worker 3.1 reached its budget and ended with what it had."""
    return [
        replace(e, status="budget", result="partial: stopped at its 20,000-token budget")
        if isinstance(e, SubagentDone) and (e.call, e.index, e.role) == (3, 1, "worker")
        else e
        for e in events
    ]


async def test_plain_lines_say_where_a_nested_call_is_and_roll_up_a_parent_s_cost(
    tmp_path: Path,
) -> None:
    lines = (await emit(tmp_path, nested_run())).plain.splitlines()
    assert "[worker 1.1 › workflow 2] fanning out 2 subtasks" in lines
    assert "[worker 1.1 › worker 2.2 › workflow 3] done in 1.0 s" in lines
    ended = [line for line in lines if " worker 2: " in line or " worker 1: " in line]
    assert ended == [  # in the order this run ended them: each parent after its calls
        "[workflow 1] worker 2: finished after 1 turns (1.0 s, 120 tokens, 0% of input cached, "
        "$0.040)",
        "[worker 1.1 › workflow 2] worker 1: finished after 1 turns "
        "(1.0 s, 120 tokens, 0% of input cached, $0.160)",
        "[worker 1.1 › worker 2.2 › workflow 3] worker 1: finished after 1 turns "
        "(1.0 s, 120 tokens, 0% of input cached, $2.560)",
        "[worker 1.1 › workflow 2] worker 2: finished after 1 turns (1.0 s, 120 tokens, 0% of "
        f"input cached, $0.640) · own $0.640 · subtree {SUBTREE_2_2}",
        "[workflow 1] worker 1: finished after 1 turns (1.0 s, 120 tokens, 0% of input cached, "
        f"$0.010) · own $0.010 · subtree {SUBTREE_1_1}",
    ]
    assert f"· own $0.640 · subtree {SUBTREE_2_2}" in "\n".join(lines)
    assert f"· own $0.010 · subtree {SUBTREE_1_1}" in "\n".join(lines)
    assert sum("subtree" in line for line in lines) == 2  # only workers that made calls


def _rows(rendered: str) -> list[str]:
    return [line for line in rendered.splitlines() if line.startswith("│")]


async def test_the_live_view_draws_nested_agents_under_their_maker(tmp_path: Path) -> None:
    out = await emit(tmp_path, nested_run())
    rendered = render(out.live)
    assert "Workflow 2" not in rendered.split("┏")[0]  # one table: call 1's, the rest inside
    assert rendered.count("┏") == 1
    rows = [" ".join(row.replace("│", " ").split()) for row in _rows(rendered)]
    first = [row.split(" ")[0] for row in rows]
    assert first == ["1", "›", "2.1", "2.1", "2.2", "›", "3.1", "3.1", "2.2", "1", "2", "2"]
    assert f"own $0.010 · subtree {SUBTREE_1_1}" in rows[0]
    assert f"own $0.640 · subtree {SUBTREE_2_2}" in rows[4]
    subtask = [row.split("│")[2] for row in _rows(rendered)]
    assert [len(cell) - len(cell.lstrip()) for cell in subtask] == [
        1,
        3,
        3,
        3,
        3,
        5,
        5,
        5,
        3,
        1,
        1,
        1,
    ]


@pytest.mark.parametrize("seed", range(8))
async def test_a_running_parent_s_line_counts_what_its_subtree_has_spent_so_far(
    tmp_path: Path, seed: int
) -> None:
    events = play(CALLS, shuffled(seed))
    cut = next(
        n
        for n, e in enumerate(events)
        if isinstance(e, ModelRequestDone) and e.agent.startswith(("worker 3.", "verifier 3."))
    )
    events = events[: cut + 1]
    asked = {e.agent for e in events if isinstance(e, ModelRequestDone)}

    def spent(call: int, index: int, role: Role) -> bool:
        return f"{role} {call}.{index}" in asked

    rendered = render((await emit(tmp_path, events)).live)
    row = next(r for r in _rows(rendered) if r.split("│")[1].strip() == "1")
    assert f"subtree ${subtree_cost(CALLS, 1, 1, spent):.3f}" in row


async def test_show_indents_the_tree_and_gives_a_parent_both_costs(tmp_path: Path) -> None:
    history = (await emit(tmp_path, nested_run())).history()
    text = plain(transcript(history))
    lines = text.splitlines()

    def at(start: str) -> tuple[int, str]:
        (found,) = [(n, line) for n, line in enumerate(lines) if line.strip().startswith(start)]
        return len(found[1]) - len(found[1].lstrip()), found[1]

    assert at("workflow 1:")[0] == 2
    assert at("worker 1.1 ·")[0] == 4 and "own $0.0100 · subtree $10.09" in at("worker 1.1 ·")[1]
    assert at("workflow 2:")[0] == 6 and at("worker 2.1 ·")[0] == 8
    assert at("worker 2.2 ·")[0] == 8 and "own $0.6400 · subtree $8.32" in at("worker 2.2 ·")[1]
    assert at("workflow 3:")[0] == 10 and at("verifier 3.1 ·")[0] == 12
    assert at("worker 1.2 ·")[0] == 4 and "subtree" not in at("worker 1.2 ·")[1]
    assert text.count("workflow 3:") == 1  # under its maker only, not again at the top


class DetailsTree(HTMLParser):
    """Each agent's ``<details>`` id, with the ids of the agents' details it sits inside."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.inside: dict[str, list[str]] = {}
        self.attrs: dict[str, dict[str, str]] = {}
        self._open: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "details":
            values = {k: v or "" for k, v in attrs}
            self.inside[values["id"]] = list(self._open)
            self.attrs[values["id"]] = values
            self._open.append(values["id"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "details":
            self._open.pop()


async def test_the_report_folds_each_nested_call_inside_its_maker(tmp_path: Path) -> None:
    html = render_report((await emit(tmp_path, nested_run())).history())
    assert_self_contained(html)
    tree = DetailsTree(html)

    def agent(name: str) -> str:
        return f"agent-t1-{name.replace('.', '-')}"

    w11, w22 = agent("1.1-worker"), agent("2.2-worker")
    assert tree.inside[agent("1.2-worker")] == []
    assert tree.inside[agent("2.1-verifier")] == [w11]
    assert tree.inside[agent("3.1-worker")] == [w11, w22]
    assert tree.inside[agent("3.1-verifier")] == [w11, w22]
    assert len(tree.inside) == 10  # each agent once
    assert float(tree.attrs[w11]["data-subtree"]) == pytest.approx(10.09)
    assert float(tree.attrs[w22]["data-subtree"]) == pytest.approx(8.32)
    assert float(tree.attrs[w22]["data-own"]) == pytest.approx(0.64)
    assert "data-subtree" not in tree.attrs[agent("1.2-worker")]
    summary = re.search(rf'id="{w22}".*?</summary>', html, re.S)
    assert summary and "own $0.6400 · subtree $8.32" in summary[0]
    assert re.search(r"<dt>subtree cost</dt><dd>\$10.09</dd>", html)
    assert "made by worker 2.2</span>" in html  # the call, in its turn's steps
    assert "· workflow 3: 1 subtasks · 1.0 s · made by worker 2.2</figcaption>" in html


async def test_a_link_to_a_nested_agent_opens_every_entry_around_it(
    tmp_path: Path,
    chromium: str,  # noqa: F811
) -> None:
    """Chromium opens the entries around a fragment's target itself; the page's script does
    it for browsers that do not. Either way the entries must hold one another."""
    page = tmp_path / "report.html"
    page.write_text(render_report((await emit(tmp_path, nested_run())).history()))
    loaded = browse(chromium, page, tmp_path / "profile", "--dump-dom", fragment=NESTED)
    assert 'data-ready="yes"' in loaded.stdout, loaded.stderr[-2000:]
    tree = DetailsTree(loaded.stdout)
    opened = {agent for agent, attrs in tree.attrs.items() if "open" in attrs}
    assert opened == {NESTED, *tree.inside[NESTED]} == {NESTED, W11, W22}


async def test_an_agent_stopped_by_its_budget_says_so_everywhere(tmp_path: Path) -> None:
    out = await emit(tmp_path, stopped_by_budget(nested_run()))
    assert "workflow 3] worker 1: stopped by its budget after 1 turns" in out.plain
    assert f"│ {BUDGET} " in render(out.live)
    history = out.history()
    (stopped,) = [a for a in history.agents if a.status == "budget"]
    assert stopped.state == "budget"
    shown = plain(transcript(history))
    assert "worker 3.1 · worker 3.1 · stopped by its budget · 1 turn" in shown
    assert "partial: stopped at its 20,000-token budget" in shown
    html = render_report(history)
    assert '<span class="badge state-budget">stopped by its budget</span>' in html
    assert "<dt>status</dt><dd>stopped by its budget</dd>" in html
    assert 'data-toggle="budget"' in html  # its legend item, only when a run has one
    flat = render_report(
        (await emit(tmp_path / "flat", play(plan_tree([[2]]), in_order))).history()
    )
    assert 'data-toggle="budget"' not in flat


async def test_a_flat_run_shows_no_tree(tmp_path: Path) -> None:
    out = await emit(tmp_path, play(plan_tree([[2], [1]]), in_order))
    shown = plain(transcript(out.history()))
    html = render_report(out.history())
    for text in (out.plain, render(out.live), shown, html):
        assert "subtree" not in text and "›" not in text and 'nested-call"' not in text
    assert render(out.live).count("┏") == 2  # a table per call, as before


def test_a_nested_call_s_span_is_a_child_of_its_maker_s_span(tmp_path: Path) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from orchmode.core.settings import Settings
    from orchmode.telemetry.tracing import start_tracing

    memory = InMemorySpanExporter()
    settings = Settings(workdir=tmp_path, journal=tmp_path / "journal.db")
    traces = start_tracing(settings, environ={}, processor=SimpleSpanProcessor(memory))
    for event in play(CALLS, shuffled(3)):
        traces(event)
    traces.close()
    spans = memory.get_finished_spans()
    by_id = {span.context.span_id: span for span in spans}

    def chain(name: str, call: int | None = None) -> list[str]:
        """The names of the spans above ``name`` (of Workflow ``call``), nearest first."""
        (span,) = [
            s
            for s in spans
            if s.name == name and (call is None or s.attributes["orchmode.workflow.call"] == call)
        ]
        names = []
        while span.parent is not None:
            span = by_id[span.parent.span_id]
            names.append(span.name)
        return names

    workflow = "execute_tool Workflow"
    assert chain(workflow, 1) == ["invoke_agent main"]
    assert chain(workflow, 2) == ["invoke_agent worker 1.1", workflow, "invoke_agent main"]
    assert chain("invoke_agent verifier 3.1") == [
        workflow,
        "invoke_agent worker 2.2",
        workflow,
        "invoke_agent worker 1.1",
        workflow,
        "invoke_agent main",
    ]
    (nested,) = [s for s in spans if s.attributes.get("orchmode.workflow.call") == 3
                 and s.name == workflow]  # fmt: skip
    assert nested.attributes["orchmode.workflow.parent"] == "2.2"
    assert nested.attributes["orchmode.depth"] == 3
    assert not nested.attributes.get("orchmode.interrupted")  # it ended before its maker
