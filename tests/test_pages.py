"""The pages' templates: hostile text in every slot stays text, a transcript renders alone."""

from __future__ import annotations

import json
import re
from html import escape
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest

from orchmode.records.history import SessionHistory, read_session
from orchmode.store import EventRow
from orchmode.views import report
from orchmode.views.pages import agent_transcript, render_report, run_sections
from test_report import Dom

#: Markup that would run script or load an image, and template syntax that would be evaluated
#: were model text ever rendered as a template (``zq`` ``xw`` joined only by evaluation).
HOSTILE = (
    '</pre>"><script>document.body.dataset.pwned = 1</script>'
    "<img src=x onerror=\"document.body.dataset.pwned='img'\">"
    '{{ "zq" ~ "xw" }}{% if true %}yes{% endif %}{# c #}\x1b]0;title\x07'
)
USAGE = {"input_tokens": 5, "output_tokens": 2, "cache_read_tokens": 0, "cache_write_tokens": 0}
TEMPLATES = Path(str(files("orchmode.views") / "templates"))


def hostile_history() -> SessionHistory:
    """A session with the hostile text in every field a model, user, command or file names."""
    report_text = json.dumps(
        {"summary": HOSTILE, "findings": [{"claim": HOSTILE, "evidence": HOSTILE,
                                           "severity": HOSTILE}]}
    )  # fmt: skip
    worker = {"call": 1, "index": 1, "role": "worker"}
    rows: list[tuple[str, dict[str, Any]]] = [
        ("TurnStarted", {"text": HOSTILE, "notices": [HOSTILE]}),
        ("BashDone", {"agent": "main", "command": HOSTILE, "exit_code": 1, "timed_out": False,
                      "duration": 1.0, "sandbox": HOSTILE}),
        ("ScriptStarted", {"call": 1, "lines": 3, "parent": ""}),
        ("SubagentStarted", {**worker, "title": HOSTILE, "prompt": HOSTILE, "node": HOSTILE}),
        ("BatchWaiting", {"agent": "worker 1.1", "batch_id": HOSTILE}),
        ("BashDone", {"agent": "worker 1.1", "command": HOSTILE, "exit_code": 0,
                      "timed_out": False, "duration": 1.0, "sandbox": HOSTILE}),
        ("ContextCompacted", {"agent": "worker 1.1", "how": HOSTILE, "tokens_before": 9,
                              "tokens_after": 3, "detail": HOSTILE}),
        ("SubagentDone", {**worker, "status": "finished", "turns": 1, "usage": USAGE,
                          "duration": 1.0, "result": report_text, "report_path": HOSTILE}),
        ("ChangeSettled", {**worker, "fate": HOSTILE, "files": HOSTILE, "added": 1, "removed": 2,
                           "detail": HOSTILE, "path": HOSTILE}),
        ("SubagentDone", {"call": 1, "index": 1, "role": "verifier", "status": HOSTILE,
                          "turns": 1, "duration": 1.0, "verdict": HOSTILE, "result": HOSTILE}),
        ("ScriptDone", {"call": 1, "duration": 2.0, "agents": 2, "error": HOSTILE}),
        ("ResultCondensed", {"call": 1, "tokens_full": 9, "tokens_shown": 3, "budget": 3,
                             "omitted": HOSTILE, "path": HOSTILE}),
        ("NetworkConnection", {"agent": "worker 1.1", "domain": HOSTILE, "port": 443,
                               "decision": HOSTILE, "rule": HOSTILE}),
        ("ApprovalRequested", {"id": 1, "agent": HOSTILE, "kind": HOSTILE, "what": HOSTILE,
                               "why": HOSTILE}),
        ("ApprovalAnswered", {"id": 1, "agent": HOSTILE, "answer": HOSTILE, "reason": HOSTILE}),
        ("TurnDone", {"stop": HOSTILE, "model_calls": 1}),
    ]  # fmt: skip
    events = [EventRow(i, 100.0 + i, kind, json.dumps(d)) for i, (kind, d) in enumerate(rows)]
    state = json.dumps({"history": [{"role": "user", "content": "x"},
                                    {"role": "assistant", "content": HOSTILE}]})  # fmt: skip
    return read_session(events, session=HOSTILE, workdir=HOSTILE, state=state)


def assert_inert(html: str) -> None:
    """Nothing of the hostile text is markup, nothing was evaluated, and it shows as text."""
    dom = Dom(html)
    assert dom.find("img") == []
    assert all(not name.startswith("on") for _, attrs in dom.elements for name in attrs)
    assert "<script>document" not in html and "\x1b" not in html and "\x07" not in html
    assert "zqxw" not in html
    assert '{{ "zq" ~ "xw" }}' in html.replace("&quot;", '"')
    assert "\\x1b]0;title\\x07" in html  # the control characters shown, as on a terminal


def test_hostile_text_in_every_slot_of_the_report_stays_text() -> None:
    html = render_report(hostile_history())
    assert_inert(html)
    assert len(Dom(html).find("script")) == 1  # the page's own
    plain = escape(HOSTILE.replace("\x1b", "\\x1b").replace("\x07", "\\x07"))
    assert html.count(plain) >= 20  # shown in every slot that is not Markdown
    for slot in ("data-node", "data-domain", "data-decision", "data-kind", "data-answer",
                 "data-fate", "data-batch", "data-how", "data-notice"):  # fmt: skip
        assert f'{slot}="{plain}"' in html, slot


def test_hostile_text_in_a_transcript_rendered_alone_stays_text() -> None:
    transcript = agent_transcript(hostile_history(), "agent-t1-1-1-worker")
    assert transcript is not None
    assert_inert(transcript)
    assert "<script" not in transcript
    for part in ("prompt", "summary", "full result", "change", "commands", "context"):
        assert f"<h4>{part}</h4>" in transcript, part


def test_a_transcript_alone_is_what_the_report_shows_inline() -> None:
    history = hostile_history()
    for anchor in ("agent-t1-1-1-worker", "agent-t1-1-1-verifier"):
        transcript = agent_transcript(history, anchor)
        assert transcript
        details = re.search(
            rf'<details class="agent" id="{anchor}"[^>]*>.*?<div class="agent-body">(.*?)</div>'
            r"</details>",
            render_report(history),
            re.S,
        )
        assert details is not None and details[1] == transcript
    assert agent_transcript(history, "agent-t1-1-9-worker") is None
    assert agent_transcript(history, "<script>") is None


def test_the_console_sections_hold_a_placeholder_for_each_transcript() -> None:
    history = hostile_history()
    full = Dom(run_sections(history))
    lazy_html = run_sections(history, transcripts=False)
    lazy = Dom(lazy_html)
    every = [(d["id"], d["data-agent"], d["data-state"]) for d in full.find("details")]
    assert every and every == [
        (d["id"], d["data-agent"], d["data-state"]) for d in lazy.find("details")
    ]
    assert [d["data-transcript"] for d in lazy.find("div", class_="transcript")] == [
        anchor for anchor, _, _ in every
    ]
    assert 'class="prompt"' not in lazy_html and "<h4>commands</h4>" not in lazy_html
    assert_inert(lazy_html)
    assert report.run_sections(history) == run_sections(history)


def test_the_templates_mark_nothing_safe_and_escape_by_default() -> None:
    """Only Python marks the Markdown sanitiser's HTML safe; no template can opt out."""
    sources = {path: path.read_text() for path in TEMPLATES.rglob("*.j2")}
    assert len(sources) >= 12
    for path, source in sources.items():
        assert not re.search(r"\|\s*safe|Markup|autoescape\s+false", source), path


@pytest.mark.parametrize("name", ["report.html.j2", "sections/agents.html.j2", "macros.html.j2"])
def test_every_template_escapes_what_it_prints(name: str) -> None:
    """Autoescaping is on for the templates, beneath the escaping every printed value gets."""
    from orchmode.views.pages import _environment

    environment = _environment()
    assert environment.get_template(name).name == name
    assert callable(environment.autoescape) and environment.autoescape(name) is True


def test_an_agents_bar_and_its_details_carry_the_same_data() -> None:
    """The console's live updates find an agent's bar and entry by the same attributes."""
    dom = Dom(render_report(hostile_history()))
    keys = ("data-agent", "data-role", "data-state", "data-turn", "data-call", "data-index",
            "data-node")  # fmt: skip
    bars = {
        bar["href"][1:]: [bar.get(k) for k in keys]
        for bar in dom.find("a")
        if bar.get("class", "").startswith("bar ")
    }
    details = {d["id"]: [d.get(k) for k in keys] for d in dom.find("details", class_="agent")}
    assert bars == details and len(details) == 2
    assert details["agent-t1-1-1-worker"][:6] == ["worker 1.1", "worker", "done", "1", "1", "1"]
