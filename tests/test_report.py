"""The HTML report: escaping and self-containment, then a real run rendered in real Chromium."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import sqlite3
import struct
import subprocess
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from conftest import StartServer
from network_runs import (
    APPROVAL_ID,
    ASK_WHY,
    ASKED,
    DENY_RULE,
    FILES,
    INDEX,
    REFUSED,
    networked_turn,
)
from orchmode.records.history import read_session
from orchmode.store import EventRow
from orchmode.testing import Fault, Reply, ScriptedRequest
from orchmode.testing.scenario import OrchestrationScenario, first_user_text, role_of
from orchmode.views.report import render_report
from recorded_runs import (
    FindingsScenario,
    agents_done,
    events,
    orchmode,
    refute_item_two,
    run,
    scripted_server,
    store_path,
)

ROOT = Path(__file__).resolve().parent
ARTIFACTS = ROOT / "artifacts"
#: Model and user text that would run script, load a remote image, or break out of markup.
PAYLOAD = (
    '</pre></code>"><script>document.body.dataset.pwned = "script"</script>'
    '<img src="https://example.invalid/x.png" onerror="document.body.dataset.pwned=\'img\'">'
)


class Dom(HTMLParser):
    """Every element's tag and attributes, and the text inside elements that have an id."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: dict[str, str] = {}
        self._open: list[str | None] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        self.elements.append((tag, values))
        if tag not in {"meta", "link", "input", "br", "img", "hr"}:
            self._open.append(values.get("id"))
            if values.get("id"):
                self.text[values["id"]] = ""

    def handle_endtag(self, tag: str) -> None:
        if self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for element_id in self._open:
            if element_id:
                self.text[element_id] += data

    def find(self, tag: str | None = None, **attrs: str) -> list[dict[str, str]]:
        found = []
        for name, values in self.elements:
            if tag is not None and name != tag:
                continue
            if all(values.get(k.rstrip("_").replace("_", "-")) == v for k, v in attrs.items()):
                found.append(values)
        return found

    def by_id(self, element_id: str) -> dict[str, str]:
        (element,) = [v for _, v in self.elements if v.get("id") == element_id]
        return element


EXTERNAL = re.compile(
    r"""(?:src|href|action|srcset)\s*=\s*["']?\s*(?:https?:|ftp:)?//|url\(|@import"""
)


def assert_self_contained(html: str) -> None:
    assert not EXTERNAL.search(html), EXTERNAL.search(html)
    assert "http://" not in re.sub(r"&[a-z]+;", "", html).split("<body", 1)[0]


# --- without a browser ---------------------------------------------------------------------


def injected_history() -> Any:
    usage = {"input_tokens": 1, "output_tokens": 1, "cache_read_tokens": 0, "cache_write_tokens": 0}
    result = json.dumps(
        {
            "summary": PAYLOAD,
            "findings": [{"claim": PAYLOAD, "evidence": PAYLOAD, "severity": PAYLOAD}],
        }
    )
    rows = [
        ("TurnStarted", {"text": PAYLOAD, "notices": [PAYLOAD]}),
        (
            "BashDone",
            {
                "agent": "main",
                "command": PAYLOAD,
                "exit_code": 1,
                "timed_out": False,
                "duration": 1.0,
                "sandbox": PAYLOAD,
            },
        ),
        ("FanoutStarted", {"call": 1, "subtasks": 1, "not_run": 0}),
        (
            "SubagentStarted",
            {
                "call": 1,
                "index": 1,
                "role": "worker",
                "title": PAYLOAD,
                "prompt": PAYLOAD,
                "node": PAYLOAD,
            },
        ),
        (
            "SubagentDone",
            {
                "call": 1,
                "index": 1,
                "role": "worker",
                "status": "finished",
                "turns": 1,
                "usage": usage,
                "duration": 1.0,
                "result": result,
            },
        ),
        (
            "SubagentDone",
            {
                "call": 1,
                "index": 1,
                "role": "verifier",
                "status": PAYLOAD,
                "turns": 1,
                "duration": 1.0,
                "verdict": PAYLOAD,
                "result": PAYLOAD,
            },
        ),
        (
            "NetworkConnection",
            {"agent": "worker 1.1", "domain": PAYLOAD, "port": 443, "decision": PAYLOAD,
             "rule": PAYLOAD},
        ),
        (
            "ApprovalRequested",
            {"id": 1, "agent": PAYLOAD, "kind": PAYLOAD, "what": PAYLOAD, "why": PAYLOAD},
        ),
        ("ApprovalAnswered", {"id": 1, "agent": PAYLOAD, "answer": PAYLOAD, "reason": PAYLOAD}),
        ("TurnDone", {"stop": PAYLOAD, "model_calls": 1}),
    ]  # fmt: skip
    events = [EventRow(i, 100.0 + i, kind, json.dumps(d)) for i, (kind, d) in enumerate(rows)]
    state = json.dumps({"history": [{"role": "user", "content": "x"},
                                    {"role": "assistant", "content": PAYLOAD}]})  # fmt: skip
    return read_session(events, session=PAYLOAD, workdir=PAYLOAD, state=state)


def test_everything_from_the_model_and_user_is_escaped() -> None:
    html = render_report(injected_history())
    dom = Dom(html)
    assert len(dom.find("script")) == 1  # ours
    assert dom.find("img") == []
    for _, attrs in dom.elements:
        assert not [name for name in attrs if name.startswith("on")], attrs
    assert html.count(PAYLOAD) == 0
    assert html.count(escape(PAYLOAD)) > 5  # shown, as text
    assert [d["data-node"] for d in dom.find("details") if "data-node" in d] == [PAYLOAD]
    assert [d["data-domain"] for d in dom.find("tr", class_="reach")] == [PAYLOAD]
    (approval,) = dom.find("tr", class_="approval")
    assert approval["data-agent"] == approval["data-kind"] == approval["data-answer"] == PAYLOAD
    assert_self_contained(html)


def node_history(*nodes: tuple[str, str]) -> Any:
    """One fan-out whose worker i starts on nodes[i][0] and ends on nodes[i][1] ("" = local)."""
    usage = {
        "input_tokens": 10,
        "output_tokens": 5,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }
    rows: list[tuple[str, dict[str, Any]]] = [
        ("TurnStarted", {"text": "go", "notices": []}),
        ("FanoutStarted", {"call": 1, "subtasks": len(nodes), "not_run": 0}),
    ]
    for index, (started, done) in enumerate(nodes, 1):
        agent = {"call": 1, "index": index, "role": "worker"}
        rows.append(("SubagentStarted", {**agent, "title": f"Check item {index}", "prompt": "p",
                                         "node": started}))  # fmt: skip
        rows.append(("SubagentDone", {**agent, "status": "finished", "turns": 1, "usage": usage,
                                      "duration": 1.0, "node": done}))  # fmt: skip
    rows += [("FanoutDone", {"call": 1, "duration": 3.0}), ("TurnDone", {"stop": "end_turn"})]
    events = [EventRow(i, 100.0 + i, kind, json.dumps(d)) for i, (kind, d) in enumerate(rows)]
    return read_session(events, session="s")


def test_the_report_shows_the_node_each_agent_ran_on() -> None:
    # worker 2 lost its first node and finished on another; worker 3 was never placed
    html = render_report(
        node_history(("127.0.0.2", "127.0.0.2"), ("127.0.0.2", "127.0.0.3"), ("", ""))
    )
    dom = Dom(html)
    expected = {"worker 1.1": "127.0.0.2", "worker 1.2": "127.0.0.3", "worker 1.3": ""}
    texts = {}
    for name, node in expected.items():
        (bar,) = dom.find("a", data_agent=name)
        (details,) = dom.find("details", data_agent=name)
        texts[name] = text = " ".join(dom.text[details["id"]].split())
        assert bar.get("data-node", "") == node and details.get("data-node", "") == node
        if node:
            assert f" · node {node} · " in bar["title"], bar["title"]
            # in the summary line, and as a fact (<dt>node</dt><dd>…</dd>) before the turns
            assert f"node {node} · 15 tokens" in text and f"node{node}turns" in text, text
        else:
            assert "node" not in bar["title"]
            assert "node—turns" in text, text  # the facts name no node rather than a wrong one
    assert "127.0.0.2" not in texts["worker 1.2"]  # where it finished, not where it began
    assert_self_contained(html)


def test_a_local_run_s_report_has_no_node() -> None:
    html = render_report(node_history(("", ""), ("", "")))
    dom = Dom(html)
    assert len(dom.find("details", class_="agent")) == 2
    assert "node" not in html
    assert not [attrs for _, attrs in dom.elements if "data-node" in attrs]


async def test_the_network_and_approvals_sections_show_a_real_run_s_connections_and_answers(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=2))
    _, session = await networked_turn(server, tmp_path, sandbox="off")
    result = orchmode("report", session, "-o", "-", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    dom = Dom(result.stdout)
    reached = {
        (r["data-agent"], r["data-domain"], r["data-decision"]): (
            int(r["data-connections"]), int(r["data-bytes-received"]), int(r["data-bytes-sent"]))
        for r in dom.find("tr", class_="reach")
    }  # fmt: skip
    domain = ASKED.split(":")[0]
    assert reached == {
        ("worker 1.1", INDEX, "allowed"): (30, sum(40_000 + n for n in range(30)), 30 * 900),
        ("worker 1.1", FILES, "allowed"): (2, 4_000_000, 2400),
        ("worker 1.1", REFUSED, "denied"): (3, 0, 0),
        ("worker 1.2", domain, "approved"): (1, 5_000, 300),
    }
    assert DENY_RULE in dom.text["network"] and "5.2 MB in" in dom.text["network"]
    # each agent's name links to its details
    links = {a["href"] for a in dom.find("a") if a.get("href", "").startswith("#agent-t1-1-")}
    assert {"#agent-t1-1-1-worker", "#agent-t1-1-2-worker"} <= links
    (approval,) = dom.find("tr", class_="approval")
    db = sqlite3.connect(store_path(tmp_path))
    try:
        asked, answered = [at for (at,) in db.execute(
            "SELECT at FROM events WHERE session = ? AND kind LIKE 'Approval%' ORDER BY seq",
            (session,))]  # fmt: skip
    finally:
        db.close()
    assert float(approval["data-waited"]) == pytest.approx(answered - asked)
    assert (approval["data-id"], approval["data-answer"], approval["data-always"]) == (
        str(APPROVAL_ID), "approved", "yes")  # fmt: skip
    text = " ".join(dom.text["approvals"].split())
    assert ASKED in text and ASK_WHY in text and "user, remembered for this directory" in text


def test_a_run_without_connections_says_so_in_both_sections() -> None:
    dom = Dom(render_report(node_history(("", ""))))
    assert "No connections through the network proxy" in dom.text["network"]
    assert "No agent asked for approval" in dom.text["approvals"]


def test_the_content_security_policy_allows_only_the_page_s_own_script() -> None:
    html = render_report(injected_history())
    (meta,) = Dom(html).find("meta", http_equiv="Content-Security-Policy")
    policy = dict(part.strip().split(" ", 1) for part in meta["content"].split(";"))
    assert policy["default-src"] == "'none'"
    script = re.search(r"<script>(.*?)</script>", html, flags=re.S)
    assert script is not None
    digest = base64.b64encode(hashlib.sha256(script[1].encode()).digest()).decode()
    assert policy["script-src"] == f"'sha256-{digest}'"


# --- in Chromium ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        if os.environ.get("ORCHMODE_TEST_BROWSER") == "required":
            pytest.fail("chromium is not installed (ORCHMODE_TEST_BROWSER=required)")
        pytest.skip("chromium is not installed")
    return found


def browse(
    chromium: str, page: Path, profile: Path, *flags: str, fragment: str = ""
) -> subprocess.CompletedProcess[str]:
    """Load ``page`` (at ``#fragment``, if given) in headless Chromium, with a net log of
    every request it made."""
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", "--hide-scrollbars",
         f"--log-net-log={profile / 'net.json'}", *flags,
         page.as_uri() + (f"#{fragment}" if fragment else "")],
        capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def page_requests(net_log: Path) -> list[str]:
    """The URLs the page itself asked for (the browser's own housekeeping is left out)."""
    log = json.loads(net_log.read_text(encoding="utf-8"))
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [
        event["params"]["url"]
        for event in log["events"]
        if event["type"] == start
        and "url" in event.get("params", {})
        and event["params"].get("initiator") != "not an origin"
    ]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def worker_five_fails(scenario: FindingsScenario) -> Any:
    def respond(request: ScriptedRequest) -> Reply | Fault:
        if role_of(request.body) != "main" and first_user_text(request) == "Check item 5":
            return Fault("server_error")
        return scenario(request)

    return respond


def store_totals(workdir: Path, session: str) -> dict[str, float]:
    requests = [d for _, kind, d in events(workdir, session) if kind == "ModelRequestDone"]
    usage = [r["usage"] for r in requests]
    total_input = sum(
        u["input_tokens"] + u["cache_read_tokens"] + u["cache_write_tokens"] for u in usage
    )
    db = sqlite3.connect(store_path(workdir))
    try:
        first, last = db.execute(
            "SELECT MIN(at), MAX(at) FROM events WHERE session = ?", (session,)
        ).fetchone()
    finally:
        db.close()
    return {
        "cost": sum(r["cost"] for r in requests),
        "input": total_input,
        "output": sum(u["output_tokens"] for u in usage),
        "cache_hit": sum(u["cache_read_tokens"] for u in usage) / total_input,
        "requests": len(requests),
        "elapsed": last - first,
    }


def test_a_real_run_renders_offline_in_chromium_with_one_bar_per_agent(
    chromium: str, tmp_path: Path
) -> None:
    # Session a records items 1 and 2 in the journal. Session b asks for items 1-5: 1 and 2
    # (and their verifiers) are journal hits, 5's worker fails, and a budget of three
    # launches leaves no room for the verifiers of 3 and 4.
    with scripted_server(FindingsScenario(subtasks=2, verdict=refute_item_two)) as server:
        run(server, tmp_path, "first pass", "--session", "a")
    scenario = FindingsScenario(subtasks=5, verdict=refute_item_two)
    scenario.payload = PAYLOAD
    with scripted_server(worker_five_fails(scenario)) as server:
        run(server, tmp_path, f"second pass {PAYLOAD}", "--session", "b",
            "--max-subagents", "3", "--max-retries", "0")  # fmt: skip
    recorded = agents_done(tmp_path, "b")
    assert len(recorded) == 9
    page = tmp_path / "report.html"
    made = orchmode("report", "b", "-o", str(page), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    html = page.read_text(encoding="utf-8")
    assert_self_contained(html)

    loaded = browse(chromium, page, tmp_path / "profile", "--dump-dom")
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    dom = Dom(loaded.stdout)
    (body,) = dom.find("body")
    assert body.get("data-ready") == "yes"  # our script ran under the page's own policy
    assert "data-pwned" not in body  # and nothing injected did
    assert page_requests(tmp_path / "profile" / "net.json") == []

    bars = dom.find("a", data_turn="1")
    bars = [b for b in bars if "bar" in b.get("class", "").split()]
    assert len(bars) == len(recorded) == 9
    names = sorted((b["data-agent"], b["data-role"]) for b in bars)
    assert names == sorted((f"{d['role']} 1.{d['index']}", d["role"]) for d in recorded)
    states = sorted(b["data-state"] for b in bars)
    assert states == sorted(["journal"] * 4 + ["done"] * 2 + ["failed"] + ["skipped"] * 2)
    for bar in bars:
        assert re.fullmatch(r"left:[\d.]+%;width:[\d.]+%", bar["style"]), bar

    expected = store_totals(tmp_path, "b")
    assert float(dom.by_id("total-cost")["data-value"]) == pytest.approx(expected["cost"])
    assert dom.text["total-cost"] == f"${expected['cost']:.4f}"
    assert dom.text["total-input-tokens"] == f"{expected['input']:,}"
    assert dom.text["total-output-tokens"] == f"{expected['output']:,}"
    assert dom.text["total-requests"] == str(expected["requests"])
    assert dom.text["total-agents"] == "9"
    assert dom.text["total-cache-hit"] == f"{expected['cache_hit']:.1%}"
    assert float(dom.by_id("total-elapsed")["data-value"]) == pytest.approx(expected["elapsed"])

    findings = {(f["data-severity"], f["data-verdict"]) for f in dom.find("li", class_="finding")}
    assert findings == {
        ("high", "confirmed"),
        ("medium", "refuted"),
        ("low", "verifier skipped by budget"),
        ("info", "verifier skipped by budget"),
    }
    details = {d["data-agent"]: d["data-state"] for d in dom.find("details")}
    assert details == {b["data-agent"]: b["data-state"] for b in bars}

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    taken = browse(chromium, page, tmp_path / "profile-shot",
                   f"--screenshot={shot}", "--window-size=1400,1000")  # fmt: skip
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert png_size(shot) == (1400, 1000) and shot.stat().st_size > 20_000
    shutil.copy(page, ARTIFACTS / "report.html")
    print(f"report screenshot: {shot}")


def test_the_net_log_check_does_see_a_page_that_reaches_out(chromium: str, tmp_path: Path) -> None:
    """The control for the test above: an empty request list must mean something."""
    page = tmp_path / "leaky.html"
    page.write_text('<img src="http://127.0.0.1:9/pixel.png">', encoding="utf-8")
    loaded = browse(chromium, page, tmp_path / "profile", "--dump-dom")
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert page_requests(tmp_path / "profile" / "net.json") == ["http://127.0.0.1:9/pixel.png"]
