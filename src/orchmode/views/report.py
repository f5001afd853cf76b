"""A session as one self-contained HTML file: timeline, findings, agents, totals.

The file must open anywhere, offline, years later, so it carries its own CSS and a few lines
of JavaScript and loads nothing. Everything in it that came from a user or a model is
untrusted: it goes through :func:`html.escape`, or — the answers, and the findings' claims,
evidence and summaries, which are Markdown — through :mod:`orchmode.views.markdown`, which shows
any HTML as text, keeps only http, https and mailto links and loads no image. A
Content-Security-Policy allows only the page's own script (by hash) and no fetches at all,
so even a missed escape could not run injected code or call out. Control characters and
bidirectional overrides are shown as their escapes (:func:`orchmode.views.escape.visible`),
as on a terminal: an override would reorder the page's text as it reorders a terminal's.
The page is complete without JavaScript; the script only opens an agent's details from its
timeline bar and lets the legend hide states.
"""

from __future__ import annotations

import base64
import hashlib
import math

from ..core.results import SEVERITIES, Finding, severity_rank
from ..records.history import AGENT_STATES, STATE_LABELS, AgentRecord, Fanout, SessionHistory, Turn
from ..records.network import ApprovalRecord, Reach
from ..records.network import size as byte_size
from ..records.steps import Command, Compaction, CondensedResult
from .formatting import money, seconds
from .report_agents import agents_section
from .report_assets import SCRIPT, STYLE
from .report_batches import batches_section
from .report_html import (
    agent_id,
    clock,
    commands_table,
    compaction_item,
    e,
    md_block,
    md_inline,
    node_attribute,
    role_attributes,
)


def render_report(history: SessionHistory) -> str:
    """The whole HTML document for one session."""
    script_hash = base64.b64encode(hashlib.sha256(SCRIPT.encode("utf-8")).digest()).decode()
    csp = (
        "default-src 'none'; style-src 'unsafe-inline'; "
        f"script-src 'sha256-{script_hash}'; base-uri 'none'; form-action 'none'"
    )
    body = run_sections(history)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{e(csp)}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="referrer" content="no-referrer">\n'
        f"<title>orchmode run {e(history.id)}</title>\n"
        f"<style>{STYLE}</style>\n</head>\n<body>\n{body}\n"
        f"<script>{SCRIPT}</script>\n</body>\n</html>\n"
    )


def run_sections(history: SessionHistory) -> str:
    """A session's content, every section of the report: the report file wraps it in a
    self-contained page, the web console in its own."""
    return "\n".join(
        [
            _header(history),
            _totals(history),
            _timeline(history),
            _findings(history),
            _network(history),
            _approvals(history),
            batches_section(history),
            _turns(history),
            agents_section(history),
        ]
    )


def _header(history: SessionHistory) -> str:
    status = history.turns[-1].status if history.turns else "interrupted"
    skipped = (
        f'<p class="warn">{history.skipped} unreadable event rows were left out.</p>'
        if history.skipped
        else ""
    )
    return (
        "<header>\n"
        f'<h1>orchmode run <code id="session-id">{e(history.id)}</code></h1>\n'
        f'<p class="meta">{e(history.workdir or "working directory not recorded")} · '
        f"started {e(clock(history.first_at))} · {len(history.turns)} turns · "
        f'<span class="badge state-{e(status)}">{e(status)}</span></p>\n'
        f"{skipped}</header>"
    )


def _totals(history: SessionHistory) -> str:
    total = history.totals.all
    usage = total.usage
    items = [
        ("total-cost", "dollars", money(total.cost), repr(total.cost)),
        ("total-input-tokens", "input tokens", f"{usage.total_input:,}", str(usage.total_input)),
        ("total-output-tokens", "output tokens", f"{usage.output_tokens:,}", None),
        ("total-cache-hit", "input read from cache", f"{usage.cache_hit:.1%}", None),
        ("total-cache-read-tokens", "cache reads", f"{usage.cache_read_tokens:,}", None),
        ("total-cache-write-tokens", "cache writes", f"{usage.cache_write_tokens:,}", None),
        ("total-requests", "model requests", f"{total.requests:,}", None),
        ("total-agents", "agents", str(len(history.agents)), None),
        ("total-elapsed", "elapsed", seconds(history.elapsed), None),
    ]
    values = {
        "total-output-tokens": str(usage.output_tokens),
        "total-cache-hit": repr(usage.cache_hit),
        "total-cache-read-tokens": str(usage.cache_read_tokens),
        "total-cache-write-tokens": str(usage.cache_write_tokens),
        "total-requests": str(total.requests),
        "total-agents": str(len(history.agents)),
        "total-elapsed": repr(history.elapsed),
    }
    cells = "\n".join(
        f'<div class="total"><dt>{e(label)}</dt>'
        f'<dd id="{key}" data-value="{e(value or values[key])}">{e(shown)}</dd></div>'
        for key, label, shown, value in items
    )
    split = (
        f"main agent {money(history.totals.main.cost)} in {history.totals.main.requests} "
        f"requests · subagents {money(history.totals.subagents.cost)} in "
        f"{history.totals.subagents.requests} requests"
    )
    if models := history.totals.describe_models():
        split += f" · by model: {models}"
    return (
        '<section id="totals"><h2>Totals</h2>\n'
        f'<dl class="totals">\n{cells}\n</dl>\n<p class="meta">{e(split)}</p></section>'
    )


# --- the timeline -------------------------------------------------------------------------


def _tick_step(span: float) -> float:
    """A round step that puts at most about eight ticks on the axis."""
    steps = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800)
    for step in (*steps, 3600):
        if span / step <= 8:
            return float(step)
    return 3600.0 * math.ceil(span / 3600 / 8)


def _bounds(turn: Turn, fanout: Fanout) -> tuple[float, float]:
    starts = [a.started_at for a in fanout.agents if a.started_at is not None]
    start = min([fanout.started_at, *starts])
    ends = [a.done_at if a.done_at is not None else turn.last_at for a in fanout.agents]
    end = max([start, *ends])
    if fanout.duration is not None:
        end = max(end, fanout.started_at + fanout.duration)
    return start, end


def _bar(turn: Turn, fanout: Fanout, agent: AgentRecord, start: float, span: float) -> str:
    began = agent.started_at if agent.started_at is not None else start
    ended = agent.done_at if agent.done_at is not None else turn.last_at
    left = (began - start) / span * 100
    width = max(0.0, ended - began) / span * 100
    state = agent.state
    verdict = f" · {agent.verdict}" if agent.verdict else ""
    node = f" · node {agent.node}" if agent.node else ""
    tip = (
        f"{agent.label} · {STATE_LABELS[state]}{verdict}{node} · "
        f"{seconds(max(0.0, ended - began))} · {agent.tokens:,} tokens · {money(agent.cost)}"
    )
    return (
        f'<a class="bar role-{agent.role} state-{state}" href="#{agent_id(turn, agent)}" '
        f'{role_attributes(agent)} data-state="{state}" '
        f'data-turn="{turn.number}" data-call="{fanout.call}" data-index="{agent.index}"'
        f"{node_attribute(agent)} "
        f'style="left:{left:.3f}%;width:{width:.3f}%" title="{e(tip)}"></a>'
    )


def _fanout_timeline(turn: Turn, fanout: Fanout) -> str:
    start, end = _bounds(turn, fanout)
    span = max(end - start, 1e-3)
    step = _tick_step(span)
    ticks = "".join(
        f'<span class="tick" style="left:{t / span * 100:.3f}%">{e(_tick_label(t))}</span>'
        for t in (step * i for i in range(int(span / step) + 1))
    )
    made_by = f" · made by worker {e(fanout.parent)}" if fanout.parent else ""
    lanes: dict[int, list[AgentRecord]] = {}
    for agent in fanout.agents:
        lanes.setdefault(agent.index, []).append(agent)
    rows = []
    for index, agents in sorted(lanes.items()):
        label = next((a.title for a in agents if a.role == "worker" and a.title), "")
        if not label:
            label = next((a.title for a in agents if a.title), "") if len(agents) == 1 else ""
        bars = "".join(_bar(turn, fanout, agent, start, span) for agent in agents)
        rows.append(
            f'<div class="lane"><span class="lane-label" title="{e(label)}">#{index} '
            f'{e(label)}</span><div class="track">{bars}</div></div>'
        )
    return (
        f'<figure class="fanout" data-turn="{turn.number}" data-call="{fanout.call}">\n'
        f"<figcaption>turn {turn.number} · {e(fanout.describe())}{made_by}</figcaption>\n"
        f'<div class="lane axis"><span class="lane-label">seconds</span>'
        f'<div class="track">{ticks}</div></div>\n' + "\n".join(rows) + "\n</figure>"
    )


def _tick_label(value: float) -> str:
    if value >= 60:
        minutes, rest = divmod(round(value), 60)
        return f"{minutes}:{rest:02d}"
    return f"{value:g}"


def _timeline(history: SessionHistory) -> str:
    figures = [
        _fanout_timeline(turn, fanout)
        for turn in history.turns
        for fanout in turn.fanouts
        if fanout.agents
    ]
    shown = {agent.state for agent in history.agents}
    legend = "".join(
        f'<label class="legend-item"><input type="checkbox" checked data-toggle="{state}">'
        f'<span class="swatch state-{state}"></span>{e(STATE_LABELS[state])}</label>'
        for state in AGENT_STATES
        if state != "budget" or state in shown  # a state newer than most runs: when it came
    )
    legend += (
        '<span class="legend-item"><span class="swatch role-verifier state-done"></span>'
        "verifier (striped)</span>"
        '<span class="legend-item"><span class="swatch role-resolver state-done"></span>'
        "resolver of a conflict (barred)</span>"
    )
    content = "\n".join(figures) if figures else '<p class="meta">No subagents ran.</p>'
    return (
        '<section id="timeline"><h2>Timeline</h2>\n'
        f'<div class="legend">{legend}</div>\n{content}\n</section>'
    )


# --- findings -----------------------------------------------------------------------------


def _finding_item(
    turn: Turn, worker: AgentRecord, verifier: AgentRecord | None, finding: Finding
) -> str:
    if verifier is None:
        verdict = "not verified"
    elif verifier.verdict:
        verdict = verifier.verdict
    else:
        verdict = f"verifier {STATE_LABELS[verifier.state]}"
    verdict_class = verdict if verdict in ("confirmed", "refuted", "unclear") else "none"
    evidence = md_block(finding.evidence, "evidence", breaks=True) if finding.evidence else ""
    return (
        f'<li class="finding" data-severity="{e(finding.severity)}" '
        f'data-verdict="{e(verdict)}" data-agent="{e(worker.name)}">'
        f'<span class="badge verdict-{verdict_class}">{e(verdict)}</span> '
        f"{md_inline(finding.claim, 'claim')}{evidence}"
        f'<span class="source">— <a href="#{agent_id(turn, worker)}">{e(worker.name)}</a>'
        f"{' · ' + e(worker.title) if worker.title else ''}</span></li>"
    )


def _findings(history: SessionHistory) -> str:
    groups: dict[str, list[tuple[int, str]]] = {}
    for turn in history.turns:
        for fanout in turn.fanouts:
            for agent in fanout.agents:
                report = agent.report
                if agent.role != "worker" or report is None:
                    continue
                verifier = fanout.verifier_of(agent)
                for finding in report.findings:
                    item = _finding_item(turn, agent, verifier, finding)
                    groups.setdefault(finding.severity, []).append((turn.number, item))
    if not groups:
        return (
            '<section id="findings"><h2>Findings</h2><p class="meta">None reported.</p></section>'
        )
    order = sorted(groups, key=lambda s: (severity_rank(s), s))
    parts = []
    for severity in order:
        items = "\n".join(item for _, item in groups[severity])
        known = severity if severity in SEVERITIES else "other"
        parts.append(
            f'<div class="severity-group" data-severity="{e(severity)}">'
            f'<h3><span class="badge severity-{known}">{e(severity)}</span> '
            f"{len(groups[severity])}</h3>\n<ul>\n{items}\n</ul></div>"
        )
    return '<section id="findings"><h2>Findings</h2>\n' + "\n".join(parts) + "\n</section>"


# --- network and approvals ----------------------------------------------------------------

#: A connection's decision, an approval's answer, as a badge's class.
_DECISION_CLASSES = {
    "allowed": "allowed",
    "approved": "approved",
    "failed": "failed",
    "denied": "denied",
    "timed out": "timed-out",
}


def _decision_badge(decision: str) -> str:
    known = _DECISION_CLASSES.get(decision, "other")
    return f'<span class="badge decision-{known}">{e(decision)}</span>'


def _agent_link(turn: Turn, name: str) -> str:
    """The agent's name, linked to its details when it is a subagent of this turn."""
    agent = next((a for a in turn.agents if a.name == name and not a.resolution), None)
    if agent is None:
        return e(name)
    return f'<a href="#{agent_id(turn, agent)}">{e(name)}</a>'


def _reach_row(turn: Turn, reach: Reach) -> str:
    return (
        f'<tr class="reach" data-turn="{turn.number}" data-agent="{e(reach.agent)}" '
        f'data-domain="{e(reach.domain)}" data-port="{reach.port}" '
        f'data-decision="{e(reach.decision)}" data-connections="{reach.connections}" '
        f'data-bytes-sent="{reach.bytes_sent}" data-bytes-received="{reach.bytes_received}">'
        f"<td>{turn.number}</td><td>{_agent_link(turn, reach.agent)}</td>"
        f"<td><code>{e(reach.where)}</code></td><td>{_decision_badge(reach.decision)}</td>"
        f'<td class="rule">{e(reach.rule_text or "—")}</td><td>{reach.connections}</td>'
        f"<td>{e(byte_size(reach.bytes_received))}</td><td>{e(byte_size(reach.bytes_sent))}</td>"
        "</tr>"
    )


def _network(history: SessionHistory) -> str:
    """Per agent, the domains its commands reached or were refused, with the rule and bytes."""
    rows = []
    for turn in history.turns:
        for traffic in turn.network.traffic():
            rows.append(
                f'<tr class="traffic" data-turn="{turn.number}" data-agent="{e(traffic.agent)}">'
                f'<th colspan="8">turn {turn.number} · {_agent_link(turn, traffic.agent)}: '
                f"{e(traffic.summary())}</th></tr>"
            )
            rows.extend(_reach_row(turn, reach) for reach in traffic.reaches)
    if not rows:
        return (
            '<section id="network"><h2>Network</h2><p class="meta">No connections through the '
            "network proxy were recorded.</p></section>"
        )
    head = "".join(
        f"<th>{name}</th>"
        for name in ("turn", "agent", "domain", "decision", "rule", "connections", "in", "out")
    )
    return (
        '<section id="network"><h2>Network</h2>\n<table class="network">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></section>"
    )


def _approval_row(turn: Turn, approval: ApprovalRecord) -> str:
    answer = approval.answer or "pending"
    waited = approval.waited()
    return (
        f'<tr class="approval" data-id="{approval.id}" data-turn="{turn.number}" '
        f'data-agent="{e(approval.agent)}" data-kind="{e(approval.kind)}" '
        f'data-answer="{e(answer)}" data-always="{"yes" if approval.always else "no"}"'
        + (f' data-waited="{waited!r}"' if waited is not None else "")
        + f"><td>{approval.id}</td><td>{turn.number}</td>"
        f"<td>{_agent_link(turn, approval.agent)}</td><td>{e(approval.kind)}</td>"
        f'<td><code class="what">{e(approval.what)}</code></td>'
        f'<td class="why">{e(approval.why)}</td>'
        f"<td>{clock(approval.asked_at)}</td><td>{_decision_badge(answer)}</td>"
        f"<td>{e(approval.answered_by or '—')}</td>"
        f"<td>{e(seconds(waited) if waited is not None else '—')}</td>"
        f'<td class="reason">{e(approval.reason)}</td></tr>'
    )


def _approvals(history: SessionHistory) -> str:
    """Every question an agent asked the user: what, why, the answer and how long it waited."""
    rows = [
        _approval_row(turn, approval)
        for turn in history.turns
        for approval in turn.network.approvals.values()
    ]
    if not rows:
        return (
            '<section id="approvals"><h2>Approvals</h2><p class="meta">No agent asked for '
            "approval.</p></section>"
        )
    names = ("id", "turn", "agent", "kind", "what", "why", "asked", "answer", "by", "waited",
             "reason")  # fmt: skip
    head = "".join(f"<th>{name}</th>" for name in names)
    return (
        '<section id="approvals"><h2>Approvals</h2>\n<table class="approvals">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></section>"
    )


# --- turns ----------------------------------------------------------------------------------


def _condensed(condensed: CondensedResult) -> str:
    event = condensed.event
    return (
        f'<p class="condensed" data-call="{event.call}" data-tokens-full="{event.tokens_full}" '
        f'data-tokens-shown="{event.tokens_shown}" data-budget="{event.budget}">'
        f'<span class="badge context">condensed</span> {e(condensed.describe())}</p>'
    )


def _fanout_step(turn: Turn, fanout: Fanout) -> str:
    """A Workflow call in its turn: what it ran, its agents' compactions, a condensed result."""
    error = (
        f' <span class="warn">script error: {e(fanout.script_error)}</span>'
        if fanout.script_error
        else ""
    )
    maker = f' <span class="meta">made by worker {e(fanout.parent)}</span>' if fanout.parent else ""
    html = f'<p class="step">{e(fanout.describe())}{maker}{error}</p>'
    # by the compaction, not the name: a resolution's verifier has its subtask's verifier's
    owners = {id(c): agent for agent in fanout.agents for c in agent.compactions}
    if fanout.compactions:
        items = "".join(compaction_item(turn, c, owners.get(id(c))) for c in fanout.compactions)
        html += f'<ul class="compactions">{items}</ul>'
    if fanout.condensed is not None:
        html += _condensed(fanout.condensed)
    return html


def _turns(history: SessionHistory) -> str:
    parts = []
    for turn in history.turns:
        notices = "".join(
            f'<li class="notice" data-notice="{e(n)}">mode notice: {e(n)}</li>'
            for n in turn.notices
        )
        steps = []
        for step in turn.steps:
            if isinstance(step, Command):
                steps.append(commands_table([step]))
            elif isinstance(step, Compaction):
                steps.append(f'<ul class="compactions">{compaction_item(turn, step)}</ul>')
            else:
                steps.append(_fanout_step(turn, step))
        answer = f"<h4>answer</h4>{md_block(turn.answer, 'answer')}" if turn.answer else ""
        parts.append(
            f'<article class="turn" data-turn="{turn.number}" data-status="{turn.status}">'
            f'<h3>turn {turn.number} <span class="badge state-{turn.status}">'
            f'{e(turn.status_text)}</span> <span class="meta">{e(clock(turn.started_at))} · '
            f"{turn.requests} model requests · {len(turn.agents)} agents · "
            f"{e(money(turn.cost))}</span></h3>"
            f'<pre class="user">{e(turn.text)}</pre><ul class="notices">{notices}</ul>'
            + "".join(steps)
            + f"{answer}</article>"
        )
    content = "\n".join(parts) or '<p class="meta">No turns recorded.</p>'
    return f'<section id="turns"><h2>Turns</h2>\n{content}\n</section>'
