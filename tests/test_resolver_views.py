"""Resolvers wherever a run is shown: the plain lines, the live view, `orchmode show`, the report.

A change that conflicts with those merged before it goes to a resolver, ``resolver c.i``,
and the resolution to a second verifier that has the same name, ``verifier c.i``, as the
one that checked the worker's change: only the order of the events tells the two apart.
The events go the way a run sends them (see ``test_context_display``): on a bus to every
display and the recorder, then read back from the store; the last test takes them from a
real run whose changes conflict.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from conftest import StartServer, conversation_for, settings_for, store_for
from orchmode.core.events import (
    BashDone,
    BashStarted,
    ChangeSettled,
    ContextCompacted,
    Event,
    EventBus,
    FanoutDone,
    FanoutStarted,
    Role,
    ScriptStarted,
    SubagentDone,
    SubagentStarted,
    TokenUsage,
    TurnDone,
    TurnStarted,
)
from orchmode.core.prompts import RESOLVE_MARKER, VERIFY_MARKER
from orchmode.records.codec import event_row
from orchmode.records.history import AgentRecord, Resolving, SessionHistory, read_session
from orchmode.records.totals import SessionTotals
from orchmode.shell.bwrap import probe
from orchmode.testing.scenario import OrchestrationScenario
from orchmode.views.display import PlainDisplay
from orchmode.views.live import DONE, RUNNING, LiveView
from orchmode.views.report import render_report
from orchmode.views.transcript import plain, transcript
from recorded_runs import orchmode
from test_context_display import SESSION, emit, section
from test_live import Clock, header_of, render, rows_of
from test_report import Dom, assert_self_contained

USAGE = TokenUsage(100, 20, 800, 50)
RESULTS = f".orchmode/results/{SESSION}"
RESOLUTION_CHECK = (
    f"{VERIFY_MARKER} Try hard to refute it.\n\nThe other agent resolved a merge conflict."
)
REFUTATION = "the line from change 2 is lost"

MERGED = ChangeSettled(
    1, 1, "merged", "2 files (+2 −0): part1.txt (+1 −0), shared.txt (+1 −0)", 2, 0, "",
    f"{RESULTS}/patch-111111111111.patch",
)  # fmt: skip
RESOLVED = ChangeSettled(
    1, 2, "merged", "2 files (+2 −0): part2.txt (+1 −0), shared.txt (+1 −0)", 2, 0,
    "after resolving a conflict with change 1", f"{RESULTS}/patch-222222222222.patch",
)  # fmt: skip
UNRESOLVED = ChangeSettled(
    1, 3, "conflict", "2 files (+2 −0): part3.txt (+1 −0), shared.txt (+1 −0)", 2, 0,
    f"shared.txt (its resolution was refuted: {REFUTATION})",
    f"{RESULTS}/patch-333333333333.patch",
)  # fmt: skip


def report(summary: str, *claims: str) -> str:
    findings = [{"claim": c, "evidence": "", "severity": "low"} for c in claims]
    return json.dumps({"summary": summary, "findings": findings})


def bash(agent: str, command: str) -> BashDone:
    return BashDone(agent, command, 0, False, 0.5, "workspace-write")


def agent_events(index: int, role: Role, prompt: str, command: str, **done: object) -> list[Event]:
    """One subagent of call 1: started, its one command, done (finished unless told)."""
    fields: dict[str, object] = {"status": "finished", "turns": 2, "usage": USAGE}
    fields |= {"duration": 1.0, "cost": 0.01, **done}
    return [
        SubagentStarted(1, index, role, prompt.splitlines()[0], prompt),
        bash(f"{role} 1.{index}", command),
        SubagentDone(1, index, role, **fields),  # type: ignore[arg-type]
    ]


def resolution(index: int, verdict: str, why: str) -> list[Event]:
    """Subtask ``index``'s resolver, then the verifier of its resolution."""
    resolver = agent_events(
        index, "resolver", resolver_prompt(index), "sed -i '/^[<=>]/d' shared.txt",
        result=report(f"kept both sides for part {index}"),
    )  # fmt: skip
    check = agent_events(
        index, "verifier", RESOLUTION_CHECK, "grep -c from- shared.txt",
        verdict=verdict, result=report(f"{verdict}: {why}"),
    )  # fmt: skip
    return resolver + check


def first_check(index: int) -> str:
    """The prompt of the verifier that checks subtask ``index``'s worker."""
    return f"{VERIFY_MARKER}\nWrite part {index}"


def resolver_prompt(index: int) -> str:
    return f"{RESOLVE_MARKER}\n\nWrite part {index}"


def a_turn_with_two_conflicts() -> list[Event]:
    """Three workers append to one file: change 1 merges, change 2's resolution is
    confirmed and merged, change 3's is refuted and its conflict kept."""
    events: list[Event] = [TurnStarted("write the parts", ("enter",)), FanoutStarted(1, 3, 0)]
    for i in range(1, 4):
        wrote = report(f"wrote part {i}", f"part {i} is written")
        events += agent_events(i, "worker", f"Write part {i}", f"echo from-{i} >> shared.txt",
                               result=wrote)  # fmt: skip
    for i in range(1, 4):
        checked = report(f"confirmed: part {i} is there")
        events += agent_events(i, "verifier", first_check(i), "cat shared.txt",
                               verdict="confirmed", result=checked)  # fmt: skip
    return [
        *events,
        FanoutDone(1, 5.0),  # the changes are merged after the call's agents
        *resolution(2, "confirmed", "both lines are there"),
        *resolution(3, "refuted", REFUTATION),
        MERGED,
        RESOLVED,
        UNRESOLVED,
        TurnDone("end_turn", 2),
    ]


# --- which verifier is which ---------------------------------------------------------------


def test_a_verifier_checks_a_resolution_only_once_its_subtask_s_resolver_is_heard_of() -> None:
    resolving = Resolving()
    follow = [
        FanoutStarted(1, 3, 0),
        SubagentDone(1, 2, "verifier", "finished", 1, USAGE, 1.0, verdict="confirmed"),
    ]
    for event in follow:
        resolving.follow(event)
    assert not resolving.checks_resolution(1, 2, "verifier")  # the worker's verifier
    resolving.follow(SubagentStarted(1, 2, "resolver", RESOLVE_MARKER))
    assert resolving.checks_resolution(1, 2, "verifier")
    # only that subtask's verifier, in that call; its worker and resolver are themselves
    assert not resolving.checks_resolution(1, 3, "verifier")
    assert not resolving.checks_resolution(2, 2, "verifier")
    assert not resolving.checks_resolution(1, 2, "worker")
    assert not resolving.checks_resolution(1, 2, "resolver")
    # a resolver served from the journal never starts: its end says it all the same
    resolving.follow(SubagentDone(1, 3, "resolver", "finished", 0, USAGE, 0.0, from_journal=True))
    assert resolving.checks_resolution(1, 3, "verifier")
    # the call run again (a resumed run numbers its calls from 1 again) starts afresh
    resolving.follow(FanoutStarted(1, 3, 0))
    assert not resolving.checks_resolution(1, 2, "verifier")
    resolving.follow(SubagentDone(2, 1, "resolver", "finished", 1, USAGE, 1.0))
    resolving.follow(ScriptStarted(2, 10))
    assert not resolving.checks_resolution(2, 1, "verifier")


# --- plain lines ---------------------------------------------------------------------------


async def test_plain_lines_name_the_resolver_and_the_verification_of_its_resolution(
    tmp_path: Path,
) -> None:
    out = await emit(tmp_path, a_turn_with_two_conflicts())
    lines = [line for line in out.plain.splitlines() if " 2: " in line or "change 1.2" in line]
    usage = "(1.0 s, 970 tokens, 84% of input cached, $0.010)"
    assert lines == [
        f"[workflow 1] worker 2: finished after 2 turns {usage}",
        f"[workflow 1] verify 2: confirmed {usage}",
        f"[workflow 1] resolver 2: finished after 2 turns {usage}",
        f"[workflow 1] verify resolution 2: confirmed {usage}",
        "[workflow 1] change 1.2 merged after resolving a conflict with change 1: "
        f"2 files (+2 −0) — patch kept at {RESOLVED.path}",
    ]
    assert f"[workflow 1] verify resolution 3: refuted {usage}" in out.plain.splitlines()
    assert (
        f"[workflow 1] change 1.3 conflict in shared.txt (its resolution was refuted: "
        f"{REFUTATION}): 2 files (+2 −0) — patch kept at {UNRESOLVED.path}"
    ) in out.plain.splitlines()


def test_a_resolution_s_verifier_from_the_journal_or_on_a_node_says_what_it_checked() -> None:
    stream = io.StringIO()
    display = PlainDisplay(stream)
    display(FanoutStarted(4, 2, 0))
    display(SubagentDone(4, 1, "verifier", "finished", 1, USAGE, 1.0, verdict="confirmed"))
    display(SubagentDone(4, 1, "resolver", "finished", 0, USAGE, 0.0, from_journal=True))
    display(SubagentDone(4, 1, "verifier", "finished", 0, USAGE, 0.0, from_journal=True))
    display(SubagentDone(4, 2, "resolver", "finished", 3, USAGE, 1.0, node="10.0.0.2"))
    display(SubagentDone(4, 2, "verifier", "failed", 1, USAGE, 1.0, node="10.0.0.3"))
    lines = stream.getvalue().splitlines()[1:]  # after the fan-out's
    assert lines[0].startswith("[workflow 4] verify 1: confirmed (")
    assert lines[1:3] == [
        "[workflow 4] resolver 1: result taken from the journal",
        "[workflow 4] verify resolution 1: result taken from the journal",
    ]
    assert lines[3].startswith("[workflow 4] resolver 2: finished after 3 turns (")
    assert lines[3].endswith(") on 10.0.0.2")
    # a verifier that failed has no verdict: its status says so
    assert lines[4].startswith("[workflow 4] verify resolution 2: failed (")
    assert lines[4].endswith(") on 10.0.0.3")


# --- the live view -------------------------------------------------------------------------


def cells_of(text: str) -> tuple[list[str], dict[tuple[int, str], list[str]]]:
    """The table's header, and each row's cells by (subtask, role as shown)."""
    rows = rows_of(text)
    cells = {key: [c.strip() for c in line.strip()[1:-1].split("│")] for key, line in rows.items()}
    return header_of(text), cells


async def test_the_live_view_shows_each_resolver_and_its_verdict_under_its_subtask(
    tmp_path: Path,
) -> None:
    out = await emit(tmp_path, a_turn_with_two_conflicts()[:-1])
    text = render(out.live)
    assert "workers 3/3 · verifiers 3/3 · resolvers 2/2 · done in 5.0 s" in text
    header, cells = cells_of(text)
    assert list(cells) == [
        (1, "worker"), (1, "verifier"),
        (2, "worker"), (2, "verifier"), (2, "resolver"), (2, "verifier (resolution)"),
        (3, "worker"), (3, "verifier"), (3, "resolver"), (3, "verifier (resolution)"),
    ]  # fmt: skip
    column = {name: header.index(name) for name in ("subtask", "state", "verdict", "change")}
    for index in (2, 3):
        for role in ("resolver", "verifier (resolution)"):
            row = cells[index, role]
            assert row[column["subtask"]] == f"Write part {index}", row  # not a stock opening
            assert row[column["state"]] == DONE and row[column["change"]] == "", row
        # the worker's verifier keeps the change's verdict; the second judged the resolution
        assert cells[index, "verifier"][column["verdict"]] == "confirmed"
        assert cells[index, "resolver"][column["verdict"]] == ""
    assert cells[2, "verifier (resolution)"][column["verdict"]] == "confirmed"
    assert cells[3, "verifier (resolution)"][column["verdict"]] == "refuted"
    assert [cells[i, "worker"][column["change"]] for i in (1, 2, 3)] == [
        "+2 −0 merged", "+2 −0 merged (resolved)", "+2 −0 conflict (unresolved)",
    ]  # fmt: skip


def test_a_running_resolution_has_rows_of_its_own_and_the_commands_reach_them() -> None:
    clock = Clock()
    view = LiveView(SessionTotals(), clock=clock)
    events = a_turn_with_two_conflicts()
    resolver_starts = events.index(SubagentStarted(1, 2, "resolver", RESOLVE_MARKER,
                                                   resolver_prompt(2)))  # fmt: skip
    for event in events[:resolver_starts]:
        view(event)
    assert "resolver" not in render(view)  # no conflict yet: the table as it always was
    view(events[resolver_starts])
    view(BashStarted("resolver 1.2", "sed -i '/^[<=>]/d' shared.txt"))
    clock.now += 2
    text = render(view)
    assert "resolvers 0/1" in text
    header, cells = cells_of(text)
    state, now = header.index("state"), header.index("now")
    assert cells[2, "resolver"][state] == RUNNING
    assert cells[2, "resolver"][now].startswith("$ sed -i")
    assert cells[2, "resolver"][header.index("elapsed")] == "2.0 s"
    for event in events[resolver_starts + 1 : resolver_starts + 4]:  # its end, then its check
        view(event)
    view(BashStarted("verifier 1.2", "grep -c from- shared.txt"))
    header, cells = cells_of(render(view))
    assert cells[2, "resolver"][state] == DONE
    assert cells[2, "verifier (resolution)"][state] == RUNNING
    assert cells[2, "verifier (resolution)"][now] == "$ grep -c from- shared.txt"
    # the worker's verifier finished long ago: it is neither running again nor overwritten
    assert cells[2, "verifier"][state] == DONE and cells[2, "verifier"][now] == ""
    assert cells[2, "verifier"][header.index("verdict")] == "confirmed"


def a_script_with_a_resolution() -> list[Event]:
    """A script's worker 1 and its verifier 2 (a script numbers its agents apart), then the
    resolver of worker 1's change, with its worker's number, and its resolution's verifier."""
    worker_prompt, worker_result = "Write part 1", report("wrote part 1")
    quoting = f"<subtask>\n{worker_prompt}\n</subtask>\n<result>\n{worker_result}\n</result>"
    return [
        TurnStarted("go", ()),
        ScriptStarted(1, 12),
        SubagentStarted(1, 1, "worker", worker_prompt, worker_prompt),
        SubagentDone(1, 1, "worker", "finished", 1, USAGE, 1.0, result=worker_result),
        SubagentStarted(1, 2, "verifier", VERIFY_MARKER, f"{VERIFY_MARKER}\n{quoting}"),
        SubagentDone(1, 2, "verifier", "finished", 1, USAGE, 1.0, verdict="confirmed"),
        SubagentStarted(1, 1, "resolver", RESOLVE_MARKER, f"{RESOLVE_MARKER}\n{quoting}"),
        SubagentDone(1, 1, "resolver", "finished", 1, USAGE, 1.0),
        SubagentStarted(1, 1, "verifier", VERIFY_MARKER, f"{RESOLUTION_CHECK}\n{quoting}"),
        SubagentDone(1, 1, "verifier", "finished", 1, USAGE, 1.0, verdict="refuted"),
        TurnDone("end_turn", 1),
    ]


def test_a_script_s_resolution_is_drawn_under_its_worker_and_adds_no_empty_rows() -> None:
    view = LiveView(SessionTotals(), clock=Clock())
    for event in a_script_with_a_resolution():
        view(event)
    text = render(view)
    assert "workers 1/1 · verifiers 1/1 · resolvers 1/1" in text
    header, cells = cells_of(text)
    assert list(cells) == [
        (1, "worker"), (1, "resolver"), (1, "verifier (resolution)"), (2, "verifier"),
    ]  # fmt: skip
    subtask, verdict = header.index("subtask"), header.index("verdict")
    assert [row[subtask] for row in cells.values()] == [
        "Write part 1", "Write part 1", "Write part 1", VERIFY_MARKER,
    ]  # fmt: skip
    assert [row[verdict] for row in cells.values()] == ["", "", "refuted", "confirmed"]


# --- the history and `orchmode show` -------------------------------------------------------


def names(agents: list[AgentRecord]) -> list[str]:
    return [agent.label for agent in agents]


async def test_the_history_keeps_the_change_s_verdict_and_lists_each_resolution_after_it(
    tmp_path: Path,
) -> None:
    events = a_turn_with_two_conflicts()
    out = await emit(tmp_path, events)
    history = out.history()
    assert history.skipped == 0
    (fanout,) = history.turns[0].fanouts
    assert names(fanout.agents) == [
        "worker 1.1", "verifier 1.1",
        "worker 1.2", "verifier 1.2", "resolver 1.2", "verifier 1.2 (resolution)",
        "worker 1.3", "verifier 1.3", "resolver 1.3", "verifier 1.3 (resolution)",
    ]  # fmt: skip
    by_label = {agent.label: agent for agent in fanout.agents}
    for index, verdict in [(2, "confirmed"), (3, "refuted")]:
        worker, resolver = by_label[f"worker 1.{index}"], by_label[f"resolver 1.{index}"]
        checked = by_label[f"verifier 1.{index} (resolution)"]
        first = fanout.verifier_of(worker)
        assert first is by_label[f"verifier 1.{index}"] and first.verdict == "confirmed"
        assert fanout.resolution_verifier(resolver) is checked and checked.verdict == verdict
        assert checked.name == f"verifier 1.{index}"  # the name its requests are recorded under
        # each command went to the agent that ran it, though two have one name
        assert [c.command for c in first.commands] == ["cat shared.txt"]
        assert [c.command for c in checked.commands] == ["grep -c from- shared.txt"]
        assert checked.prompt == RESOLUTION_CHECK and resolver.state == "done"
    assert fanout.resolution_verifier(by_label["worker 1.2"]) is None
    assert by_label["worker 1.2"].change is not None
    assert by_label["worker 1.2"].change.what == "merged after resolving a conflict with change 1"
    assert all(a.change is None for a in fanout.agents if a.role != "worker")
    assert len(history.turns[0].agents) == 10


def test_a_script_s_worker_is_not_paired_with_the_verifier_of_its_resolution() -> None:
    events = a_script_with_a_resolution()  # its resolution's verifier quotes the worker too
    history = read_session([event_row(seq, event) for seq, event in enumerate(events)])
    (fanout,) = history.turns[0].fanouts
    assert names(fanout.agents) == [
        "worker 1.1", "resolver 1.1", "verifier 1.1 (resolution)", "verifier 1.2",
    ]  # fmt: skip
    worker, resolver, checked, first = fanout.agents
    assert fanout.verifier_of(worker) is first
    assert fanout.resolution_verifier(resolver) is checked


def test_a_call_run_again_in_its_turn_reads_its_first_verifier_as_the_change_s_again() -> None:
    """A resumed run numbers its calls from 1 again and its events join the cut-off turn."""
    cut_off = a_turn_with_two_conflicts()[:-4]  # killed after resolving change 3
    again: list[Event] = [FanoutStarted(1, 3, 0)] + [
        SubagentDone(1, i, role, "finished", 0, USAGE, 0.0, from_journal=True,
                     verdict="confirmed" if role == "verifier" else None)
        for i in (1, 2, 3) for role in ("worker", "verifier")
    ]  # fmt: skip
    events = [*cut_off, *again, MERGED, RESOLVED, UNRESOLVED, TurnDone("end_turn", 1)]
    history = read_session([event_row(seq, event) for seq, event in enumerate(events)])
    (fanout,) = history.turns[0].fanouts
    by_label = {agent.label: agent for agent in fanout.agents}
    assert len(fanout.agents) == 10  # the same agents: no verifier was read as another
    assert by_label["verifier 1.2"].from_journal and by_label["verifier 1.3"].from_journal
    assert not by_label["verifier 1.3 (resolution)"].from_journal
    assert by_label["verifier 1.3 (resolution)"].verdict == "refuted"


def head_lines(history: SessionHistory) -> list[str]:
    """The transcript's head line of each subagent, in order."""
    pattern = r"^    (?:worker|verifier|resolver) \d+\.\d+.*$"
    return re.findall(pattern, plain(transcript(history)), flags=re.M)


async def test_show_lists_each_resolver_with_its_result_and_verdict_after_its_subtask(
    tmp_path: Path,
) -> None:
    await emit(tmp_path, a_turn_with_two_conflicts())
    shown = orchmode("show", SESSION, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    usage = "2 turns · 970 tokens · $0.0100 · 1.0 s"
    heads = [line for line in out.splitlines() if re.match(r"^    \w+ 1\.[23]\b", line)]
    assert heads == [
        f"    worker 1.2 · Write part 2 · done · {usage}",
        f"    verifier 1.2 · confirmed · done · {usage}",
        f"    resolver 1.2 · resolution confirmed · done · {usage}",
        f"    verifier 1.2 (resolution) · confirmed · done · {usage}",
        f"    worker 1.3 · Write part 3 · done · {usage}",
        f"    verifier 1.3 · confirmed · done · {usage}",
        f"    resolver 1.3 · resolution refuted · done · {usage}",
        f"    verifier 1.3 (resolution) · refuted · done · {usage}",
    ]
    worker = section(out, "    worker 1.2 · ", "      patch ")
    assert worker[-2] == (
        f"      change merged after resolving a conflict with change 1: {RESOLVED.files}"
    )
    resolver = section(out, "    resolver 1.3 · ", "    verifier 1.3 (resolution) · ")
    assert resolver[1:-1] == [
        "      $ sed -i '/^[<=>]/d' shared.txt  exit 0 · 0.5 s",
        "      summary kept both sides for part 3",
    ]
    checked = section(out, "    verifier 1.3 (resolution) · ", "      summary ")
    assert checked[1:] == [
        "      $ grep -c from- shared.txt  exit 0 · 0.5 s",
        f"      summary refuted: {REFUTATION}",
    ]
    unresolved = section(out, "    worker 1.3 · ", "      change ")
    assert unresolved[-1] == (
        f"      change conflict in shared.txt (its resolution was refuted: {REFUTATION}): "
        f"{UNRESOLVED.files}"
    )


def test_a_resolver_with_no_verdict_on_its_resolution_shows_none() -> None:
    events: list[Event] = [
        TurnStarted("go", ()),
        FanoutStarted(1, 1, 0),
        SubagentDone(1, 1, "worker", "finished", 1, USAGE, 1.0),
        SubagentDone(1, 1, "verifier", "finished", 1, USAGE, 1.0, verdict="confirmed"),
        # the budget was used up: no resolver ran, so nothing checked a resolution
        SubagentDone(1, 1, "resolver", "skipped", 0, TokenUsage(), 0.0),
        TurnDone("end_turn", 1),
    ]
    history = read_session([event_row(seq, event) for seq, event in enumerate(events)])
    assert head_lines(history)[2].startswith("    resolver 1.1 · skipped by budget")
    assert "resolution" not in plain(transcript(history))


# --- the HTML report -----------------------------------------------------------------------


def details_of(dom: Dom, name: str) -> list[dict[str, str]]:
    return dom.find("details", data_agent=name)


async def test_the_report_shows_each_resolver_and_both_verdicts_apart(tmp_path: Path) -> None:
    events = a_turn_with_two_conflicts()
    # both verifiers of change 3 ran out of room: each compaction is its own verifier's
    at = events.index(SubagentStarted(1, 3, "verifier", RESOLUTION_CHECK.splitlines()[0],
                                      RESOLUTION_CHECK))  # fmt: skip
    events.insert(at + 1, ContextCompacted("verifier 1.3", "api", 9_000, 4_000))
    at = events.index(SubagentStarted(1, 3, "verifier", VERIFY_MARKER, first_check(3)))
    events.insert(at + 1, ContextCompacted("verifier 1.3", "api", 8_000, 3_000))
    await emit(tmp_path, events)
    made = orchmode("report", SESSION, "-o", "-", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    html = made.stdout
    assert_self_contained(html)
    dom = Dom(html)
    ids = [v["id"] for _, v in dom.elements if v.get("id", "").startswith("agent-")]
    assert len(ids) == len(set(ids)) == 10
    first, checked = details_of(dom, "verifier 1.3")
    assert "data-checks" not in first and checked["data-checks"] == "resolution"
    assert checked["id"] == "agent-t1-1-3-verifier-resolution"
    assert first["id"] == "agent-t1-1-3-verifier"  # the anchor it always had
    summary = dom.text[checked["id"]].split("status", 1)[0]
    assert summary.startswith("verifier 1.3 (resolution)") and "refuted" in summary
    assert "confirmed" in dom.text[first["id"]].split("status", 1)[0]
    (resolver,) = details_of(dom, "resolver 1.3")
    assert (resolver["data-role"], resolver["id"]) == ("resolver", "agent-t1-1-3-resolver")
    resolver_summary = dom.text[resolver["id"]].split("status", 1)[0]
    assert "resolution refuted" in resolver_summary
    assert "kept both sides for part 3" in dom.text[resolver["id"]]
    badges = [v for v in dom.find("span") if v.get("class") == "badge verdict-refuted"]
    assert len(badges) == 2  # the resolution's verifier, and its resolver beside it
    # every worker's finding keeps the verdict of the verifier that checked its change
    findings = dom.find("li", class_="finding")
    assert [(f["data-agent"], f["data-verdict"]) for f in findings] == [
        (f"worker 1.{i}", "confirmed") for i in (1, 2, 3)
    ]
    # one bar per agent on the timeline, resolvers drawn apart
    bars = dom.find("a", class_="bar role-resolver state-done")
    assert [b["data-agent"] for b in bars] == ["resolver 1.2", "resolver 1.3"]
    assert [b["href"] for b in dom.find("a") if b.get("data-checks") == "resolution"] == [
        "#agent-t1-1-2-verifier-resolution", "#agent-t1-1-3-verifier-resolution",
    ]  # fmt: skip
    assert 'class="swatch role-resolver state-done"' in html  # and in the legend
    # each compaction links to the verifier it happened to, not to its namesake
    links = [a["href"] for a in Dom(html.split('id="turns"', 1)[1]).find("a") if "class" not in a]
    assert links[:2] == ["#agent-t1-1-3-verifier", "#agent-t1-1-3-verifier-resolution"], links
    for details in (first, checked):
        assert "compactions1" in dom.text[details["id"]]
    assert "8,000 → 3,000" in dom.text[first["id"]] and "9,000" not in dom.text[first["id"]]
    assert "9,000 → 4,000" in dom.text[checked["id"]]


def test_an_older_record_without_resolvers_reads_and_renders_as_before() -> None:
    events: list[Event] = [
        TurnStarted("go", ()),
        FanoutStarted(1, 1, 0),
        SubagentStarted(1, 1, "worker", "Check item 1", "Check item 1"),
        SubagentDone(1, 1, "worker", "finished", 1, USAGE, 1.0),
        SubagentStarted(1, 1, "verifier", VERIFY_MARKER, VERIFY_MARKER),
        SubagentDone(1, 1, "verifier", "finished", 1, USAGE, 1.0, verdict="confirmed"),
        TurnDone("end_turn", 1),
    ]
    history = read_session([event_row(seq, event) for seq, event in enumerate(events)])
    assert names(history.agents) == ["worker 1.1", "verifier 1.1"]
    assert "resolution" not in plain(transcript(history))
    html = render_report(history)
    assert "data-checks" not in html and 'data-role="resolver"' not in html
    view = LiveView(SessionTotals(), clock=Clock())
    for event in events:
        view(event)
    text = render(view)
    assert "resolver" not in text and "resolution" not in text


# --- a real run whose changes conflict -----------------------------------------------------


def _repo(root: Path) -> Path:
    root.mkdir()
    (root / "shared.txt").write_text("head\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "start"], cwd=root, check=True)
    return root


def _refute_the_third_resolution(prompt: str) -> str:
    resolving = "The other agent resolved a merge conflict." in prompt
    return "refuted" if resolving and "Write part 3" in prompt else "confirmed"


async def test_a_real_run_s_resolvers_are_drawn_in_every_view(
    serve: StartServer, tmp_path: Path
) -> None:
    problem = probe().problem
    if problem is not None:
        pytest.fail(problem)
    workdir = _repo(tmp_path / "work")
    subtasks = [f"Write part {i} $ echo from-{i} >> shared.txt" for i in (1, 2, 3)]
    scenario = OrchestrationScenario(
        subtasks=subtasks,
        scout_command=None,
        worker_command=lambda subtask: subtask.split("$ ", 1)[1],
        verdict=_refute_the_third_resolution,
        delay=0.05,
    )
    server = await serve(scenario)
    settings = settings_for(server, tmp_path, workdir=workdir)
    bus, plain_out = EventBus(), io.StringIO()
    seen: list[Event] = []
    view = LiveView(SessionTotals(), clock=Clock())
    for subscriber in (seen.append, PlainDisplay(plain_out), view):
        bus.subscribe(subscriber)
    session = await conversation_for(settings, events=bus, store=store_for(tmp_path))
    try:
        assert (await session.turn("write the parts")).ok
    finally:
        await session.close()
    settled = [e for e in seen if isinstance(e, ChangeSettled)]
    assert [(e.index, e.fate) for e in settled] == [(1, "merged"), (2, "merged"),
                                                    (3, "conflict")]  # fmt: skip
    # plain lines
    lines = plain_out.getvalue().splitlines()
    for index, verdict in [(2, "confirmed"), (3, "refuted")]:
        assert any(line.startswith(f"[workflow 1] resolver {index}: finished") for line in lines)
        assert any(
            line.startswith(f"[workflow 1] verify resolution {index}: {verdict} (")
            for line in lines
        ), lines
        assert any(line.startswith(f"[workflow 1] verify {index}: confirmed (") for line in lines)
    # the live view
    # wide enough for the subtasks, which hold their commands, to leave the index column be
    console = Console(file=io.StringIO(), width=220, force_terminal=True, color_system=None)
    console.print(view.renderable())
    header, cells = cells_of(console.file.getvalue())  # type: ignore[attr-defined]
    verdict, change = header.index("verdict"), header.index("change")
    assert cells[2, "verifier"][verdict] == cells[3, "verifier"][verdict] == "confirmed"
    assert cells[2, "verifier (resolution)"][verdict] == "confirmed"
    assert cells[3, "verifier (resolution)"][verdict] == "refuted"
    assert cells[2, "worker"][change].endswith("merged (resolved)")
    assert cells[3, "worker"][change].endswith("conflict (unresolved)")
    assert (1, "resolver") not in cells
    # the history, as `orchmode show` and the report read it
    history = read_session([event_row(seq, event) for seq, event in enumerate(seen)])
    heads = [line for line in head_lines(history) if re.match(r"^    \w+ 1\.3\b", line)]
    assert [line.split(" · ")[:2] for line in heads] == [
        ["    worker 1.3", "Write part 3 $ echo from-3 >> shared.txt"],
        ["    verifier 1.3", "confirmed"],
        ["    resolver 1.3", "resolution refuted"],
        ["    verifier 1.3 (resolution)", "refuted"],
    ]
    dom = Dom(render_report(history))
    assert len(dom.find("details", data_role="resolver")) == 2
    assert len([d for d in dom.find("details") if d.get("data-checks") == "resolution"]) == 2
