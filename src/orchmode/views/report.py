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
from html import escape

from ..core.results import SEVERITIES, Finding, severity_rank
from ..records.history import (
    AGENT_STATES,
    STATE_LABELS,
    AgentRecord,
    Command,
    Compaction,
    CondensedResult,
    Fanout,
    SessionHistory,
    SettledChange,
    Turn,
)
from ..records.network import ApprovalRecord, Reach
from ..records.network import size as byte_size
from .escape import visible
from .formatting import money, seconds, when
from .markdown import to_html, to_inline_html


def e(value: object) -> str:
    """Escaped for both text and double-quoted attributes, control characters shown."""
    return escape(visible(str(value)), quote=True)


def md_block(text: str, name: str, *, breaks: bool = False) -> str:
    """Model-written Markdown as sanitised HTML in ``<div class="NAME md">``; ``breaks``
    keeps each line break (evidence quotes lines of code and output)."""
    return f'<div class="{name} md">{to_html(visible(text), breaks=breaks)}</div>'


def md_inline(text: str, name: str) -> str:
    """Like :func:`md_block`, but a single paragraph stays inline (a claim beside its badge)."""
    inline = to_inline_html(visible(text))
    if inline is None:
        return md_block(text, name)
    return f'<span class="{name} md">{inline}</span>'


def clock(at: float | None) -> str:
    return when(at, "%Y-%m-%d %H:%M:%S")


def agent_id(turn: Turn, agent: AgentRecord) -> str:
    """A unique anchor: call numbers restart when a session is resumed in a new process, and
    a resolution's verifier has its subtask's verifier's name."""
    resolution = "-resolution" if agent.resolution else ""
    return f"agent-t{turn.number}-{agent.call}-{agent.index}-{agent.role}{resolution}"


def _role_attributes(agent: AgentRecord) -> str:
    """``data-agent`` (the name its requests are recorded under), ``data-role``, and
    ``data-checks="resolution"`` on the verifier of a resolution."""
    checks = ' data-checks="resolution"' if agent.resolution else ""
    return f'data-agent="{e(agent.name)}" data-role="{agent.role}"{checks}'


def render_report(history: SessionHistory) -> str:
    """The whole HTML document for one session."""
    script_hash = base64.b64encode(hashlib.sha256(SCRIPT.encode("utf-8")).digest()).decode()
    csp = (
        "default-src 'none'; style-src 'unsafe-inline'; "
        f"script-src 'sha256-{script_hash}'; base-uri 'none'; form-action 'none'"
    )
    body = "\n".join(
        [
            _header(history),
            _totals(history),
            _timeline(history),
            _findings(history),
            _network(history),
            _approvals(history),
            _turns(history),
            _agents(history),
        ]
    )
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
        f'{_role_attributes(agent)} data-state="{state}" '
        f'data-turn="{turn.number}" data-call="{fanout.call}" data-index="{agent.index}"'
        f"{_node_attribute(agent)} "
        f'style="left:{left:.3f}%;width:{width:.3f}%" title="{e(tip)}"></a>'
    )


def _node_attribute(agent: AgentRecord) -> str:
    """``data-node`` for an agent placed on a cluster node; nothing for one run locally."""
    return f' data-node="{e(agent.node)}"' if agent.node else ""


def _fanout_timeline(turn: Turn, fanout: Fanout) -> str:
    start, end = _bounds(turn, fanout)
    span = max(end - start, 1e-3)
    step = _tick_step(span)
    ticks = "".join(
        f'<span class="tick" style="left:{t / span * 100:.3f}%">{e(_tick_label(t))}</span>'
        for t in (step * i for i in range(int(span / step) + 1))
    )
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
        f"<figcaption>turn {turn.number} · {e(fanout.describe())}</figcaption>\n"
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
    legend = "".join(
        f'<label class="legend-item"><input type="checkbox" checked data-toggle="{state}">'
        f'<span class="swatch state-{state}"></span>{e(STATE_LABELS[state])}</label>'
        for state in AGENT_STATES
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


# --- turns and agents ---------------------------------------------------------------------


def _commands(commands: list[Command]) -> str:
    if not commands:
        return ""
    rows = "".join(
        f'<tr class="{"ok" if c.ok else "bad"}"><td><code>{e(c.command)}</code></td>'
        f"<td>{e(c.outcome)}</td><td>{e(seconds(c.duration))}</td>"
        f"<td>{e(c.sandbox or '—')}</td></tr>"
        for c in commands
    )
    return (
        '<table class="commands"><thead><tr><th>command</th><th>outcome</th><th>time</th>'
        f"<th>sandbox</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _compaction(
    turn: Turn, compaction: Compaction, agent: AgentRecord | None = None, *, named: bool = True
) -> str:
    """One compaction, naming the agent it happened to (linked to it when ``agent`` is given)
    unless it is listed under that agent (``named=False``)."""
    event = compaction.event
    if agent is not None:
        who = f'<a href="#{agent_id(turn, agent)}">{e(agent.name)}</a>: '
    else:
        who = f"{e(event.agent)}: " if named else ""
    return (
        f'<li class="compaction" data-agent="{e(event.agent)}" data-how="{e(event.how)}" '
        f'data-refused="{"yes" if event.refused else "no"}" '
        f'data-tokens-before="{event.tokens_before}" data-tokens-after="{event.tokens_after}">'
        f'<span class="badge context">context</span> {who}{e(compaction.describe())} '
        f'<span class="meta">{e(when(compaction.at, "%H:%M:%S"))}</span></li>'
    )


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
    html = f'<p class="step">{e(fanout.describe())}{error}</p>'
    # by the compaction, not the name: a resolution's verifier has its subtask's verifier's
    owners = {id(c): agent for agent in fanout.agents for c in agent.compactions}
    if fanout.compactions:
        items = "".join(_compaction(turn, c, owners.get(id(c))) for c in fanout.compactions)
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
                steps.append(_commands([step]))
            elif isinstance(step, Compaction):
                steps.append(f'<ul class="compactions">{_compaction(turn, step)}</ul>')
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


#: A settled change's fate as a CSS class (anything a newer orchmode records reads "other").
_CHANGE_CLASSES = {
    "merged": "merged",
    "conflict": "conflict",
    "refused": "refused",
    "not merged": "not-merged",
    "kept": "kept",
}


def _change_badge(change: SettledChange, text: str) -> str:
    known = _CHANGE_CLASSES.get(change.fate, "other")
    return f'<span class="badge change-{known}">{e(text)}</span>'


def _change(change: SettledChange) -> str:
    """A worker's change: its fate and why, its lines added and removed, its files, its patch."""
    event = change.event
    patch = (
        f'<p>patch kept at <code class="patch-path">{e(event.path)}</code></p>'
        if event.path
        else ""
    )
    return (
        f'<h4>change</h4><p class="change" data-fate="{e(event.fate)}" '
        f'data-added="{event.added}" data-removed="{event.removed}">'
        f"{_change_badge(change, change.what)} "
        f'<span class="lines">+{event.added} −{event.removed}</span> '
        f'<span class="files">{e(event.files)}</span></p>{patch}'
    )


def _verdict_badge(verdict: str | None, label: str = "") -> str:
    """A verdict as a badge (nothing without one); ``label`` says whose it is."""
    if not verdict:
        return ""
    return f' <span class="badge verdict-{e(verdict)}">{e(label + verdict)}</span>'


def _agent_details(
    turn: Turn, agent: AgentRecord, nodes: bool = False, checked: AgentRecord | None = None
) -> str:
    """One agent's details; ``nodes`` when the run had agents on cluster nodes; ``checked``,
    for a resolver, the verifier of its resolution (its verdict is shown beside it)."""
    usage = agent.usage
    state = agent.state
    verdict = _verdict_badge(agent.verdict)
    if checked is not None:
        verdict += _verdict_badge(checked.verdict, "resolution ")
    facts = [
        ("status", agent.status or "never finished"),
        *([("node", agent.node or "—")] if nodes else []),
        ("turns", str(agent.turns)),
        ("model requests", str(agent.requests)),
        ("input tokens", f"{usage.input_tokens:,}"),
        ("output tokens", f"{usage.output_tokens:,}"),
        ("cache reads", f"{usage.cache_read_tokens:,}"),
        ("cache writes", f"{usage.cache_write_tokens:,}"),
        ("read from cache", f"{usage.cache_hit:.0%}"),
        ("cost", money(agent.cost)),
        ("duration", seconds(agent.duration)),
        ("started", clock(agent.started_at)),
        ("ended", clock(agent.done_at)),
        *([("compactions", str(len(agent.compactions)))] if agent.compactions else []),
    ]
    dl = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in facts)
    saved = (
        f'<h4>full result</h4><p><code class="report-path">{e(agent.report_path)}</code></p>'
        if agent.report_path
        else ""
    )
    context = (
        '<h4>context</h4><ul class="compactions">'
        + "".join(_compaction(turn, c, named=False) for c in agent.compactions)
        + "</ul>"
        if agent.compactions
        else ""
    )
    prompt = (
        f'<h4>prompt</h4><pre class="prompt">{e(agent.prompt)}</pre>'
        if agent.prompt
        else '<p class="meta">No prompt recorded (the agent never started: the budget '
        "skipped it, or it is a journal hit in a record older than this orchmode).</p>"
    )
    report = agent.report
    if report is not None:
        items = "".join(
            f'<li data-severity="{e(f.severity)}"><span class="badge severity-'
            f'{e(f.severity if f.severity in SEVERITIES else "other")}">{e(f.severity)}</span> '
            f"{md_inline(f.claim, 'claim')}"
            + (md_block(f.evidence, "evidence", breaks=True) if f.evidence else "")
            + "</li>"
            for f in sorted(report.findings, key=lambda f: severity_rank(f.severity))
        )
        result = (
            f"<h4>summary</h4>{md_block(report.summary, 'summary')}"
            f'<ul class="agent-findings">{items}</ul>'
        )
    elif agent.result:
        result = f'<h4>result</h4><pre class="result">{e(agent.result)}</pre>'
    else:
        result = ""
    commands = _commands(agent.commands)
    node = f"node {e(agent.node)} · " if agent.node else ""
    change = agent.change
    changed = (
        " " + _change_badge(change, f"+{change.event.added} −{change.event.removed} {change.fate}")
        if change is not None
        else ""
    )
    return (
        f'<details class="agent" id="{agent_id(turn, agent)}" {_role_attributes(agent)} '
        f'data-state="{state}"{_node_attribute(agent)}>'
        f'<summary><span class="swatch state-{state} role-{agent.role}"></span>'
        f"<b>{e(agent.label)}</b> {e(agent.title if agent.role == 'worker' else '')} "
        f'<span class="badge state-{state}">{e(STATE_LABELS[state])}</span>{verdict}{changed} '
        f'<span class="meta">{node}{agent.tokens:,} tokens · {e(money(agent.cost))} · '
        f"{e(seconds(agent.duration))}</span></summary>"
        f'<div class="agent-body"><dl class="facts">{dl}</dl>{prompt}{result}{saved}'
        + (_change(change) if change is not None else "")
        + (f"<h4>commands</h4>{commands}" if commands else "")
        + context
        + "</div></details>"
    )


def _agents(history: SessionHistory) -> str:
    nodes = any(agent.node for agent in history.agents)  # a run on a cluster shows where
    parts = [
        _agent_details(turn, agent, nodes, fanout.resolution_verifier(agent))
        for turn in history.turns
        for fanout in turn.fanouts
        for agent in fanout.agents
    ]
    content = "\n".join(parts) or '<p class="meta">No subagents ran.</p>'
    return f'<section id="agents"><h2>Agents</h2>\n{content}\n</section>'


STYLE = """
:root { --done:#2f9e5b; --failed:#d64545; --journal:#3b82c4; --skipped:#d99a1e;
  --interrupted:#8e5cc9; --ink:#1d2430; --muted:#667085; --line:#e4e7ec; --bg:#fbfbfc; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink);
  background: var(--bg); margin: 0 auto; padding: 24px 32px 64px; max-width: 1400px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 32px 0 10px;
  border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 14px 0 6px; }
h4 { font-size: 13px; margin: 12px 0 4px; color: var(--muted); text-transform: uppercase;
  letter-spacing: .04em; }
code, pre { font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
pre { white-space: pre-wrap; word-break: break-word; background: #f2f4f7; padding: 8px 10px;
  border-radius: 6px; margin: 4px 0; max-height: 360px; overflow: auto; }
.meta { color: var(--muted); } .warn { color: var(--failed); }
.badge { display: inline-block; padding: 0 7px; border-radius: 9px; font-size: 12px;
  background: #eef0f3; color: var(--ink); white-space: nowrap; }
.badge.state-done, .badge.state-finished, .badge.verdict-confirmed {
  background: #dcf3e5; color: #1c6b3c; }
.badge.state-failed, .badge.verdict-refuted { background: #fbe0e0; color: #9b2323; }
.badge.state-journal { background: #deebf7; color: #1f5a91; }
.badge.state-skipped, .badge.verdict-unclear { background: #fbefd6; color: #8a5a00; }
.badge.state-interrupted { background: #ece3f7; color: #5e3591; }
.badge.severity-high { background: var(--failed); color: #fff; }
.badge.severity-medium { background: var(--skipped); color: #fff; }
.badge.severity-low { background: var(--journal); color: #fff; }
.badge.severity-info, .badge.severity-other { background: #d0d5dd; }
dl.totals { display: grid; grid-template-columns: repeat(auto-fill, minmax(128px, 1fr));
  gap: 10px; margin: 0; }
.total { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 8px 12px; }
.total dt { color: var(--muted); font-size: 12px; } .total dd { margin: 0; font-size: 19px;
  font-weight: 600; font-variant-numeric: tabular-nums; }
.legend { display: flex; flex-wrap: wrap; gap: 14px; margin-bottom: 8px; }
.legend-item { display: inline-flex; align-items: center; gap: 5px; cursor: pointer; }
.swatch { display: inline-block; width: 14px; height: 10px; border-radius: 2px; }
.state-done.swatch, .bar.state-done { background-color: var(--done); }
.state-failed.swatch, .bar.state-failed { background-color: var(--failed); }
.state-journal.swatch, .bar.state-journal { background-color: var(--journal); }
.state-skipped.swatch, .bar.state-skipped { background-color: var(--skipped); }
.state-interrupted.swatch, .bar.state-interrupted { background-color: var(--interrupted); }
.role-verifier.swatch, .bar.role-verifier { background-image: repeating-linear-gradient(135deg,
  rgba(255,255,255,.45) 0 3px, transparent 3px 7px); }
.role-resolver.swatch, .bar.role-resolver { background-image: repeating-linear-gradient(90deg,
  rgba(0,0,0,.3) 0 2px, transparent 2px 5px); }
figure.fanout { margin: 0 0 18px; background: #fff; border: 1px solid var(--line);
  border-radius: 8px; padding: 8px 12px; }
figcaption { font-weight: 600; margin-bottom: 6px; }
.lane { display: flex; align-items: center; height: 16px; }
.lane-label { flex: 0 0 240px; overflow: hidden; white-space: nowrap; text-overflow: ellipsis;
  font-size: 12px; color: var(--muted); padding-right: 8px; }
.track { position: relative; flex: 1; height: 100%; border-left: 1px solid var(--line); }
.lane:not(.axis) .track {
  background: linear-gradient(var(--line), var(--line)) 0 50% / 100% 1px no-repeat; }
.axis { height: 18px; } .tick { position: absolute; top: 0; font-size: 11px; color: var(--muted);
  border-left: 1px solid var(--line); padding-left: 3px; height: 100%; }
.bar { position: absolute; top: 3px; height: 10px; min-width: 3px; border-radius: 2px; }
.bar:hover, .bar:focus { outline: 2px solid var(--ink); z-index: 1; }
.hide-done .bar.state-done, .hide-failed .bar.state-failed, .hide-journal .bar.state-journal,
.hide-skipped .bar.state-skipped, .hide-interrupted .bar.state-interrupted { visibility: hidden; }
.severity-group ul, ul.agent-findings, ul.notices { list-style: none; padding: 0; margin: 0; }
.finding { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 6px 10px;
  margin: 4px 0; } .finding .source { display: block; color: var(--muted); font-size: 12px; }
.claim { font-weight: 500; }
article.turn { background: #fff; border: 1px solid var(--line); border-radius: 8px;
  padding: 4px 14px 10px; margin-bottom: 12px; }
.notice { color: var(--journal); } .step { margin: 6px 0; font-weight: 500; }
ul.compactions { list-style: none; padding: 0; margin: 4px 0; }
.compaction, .condensed { margin: 3px 0; color: #8a5a00; }
.badge.context { background: #fbefd6; color: #8a5a00; }
code.report-path, code.patch-path { word-break: break-all; }
.badge.change-merged { background: #dcf3e5; color: #1c6b3c; }
.badge.change-conflict, .badge.change-refused { background: #fbe0e0; color: #9b2323; }
.badge.change-not-merged { background: #fbefd6; color: #8a5a00; }
.badge.change-kept { background: #deebf7; color: #1f5a91; }
.change .lines { font-variant-numeric: tabular-nums; }
table.commands { border-collapse: collapse; width: 100%; margin: 4px 0; }
table.commands td, table.commands th { border-bottom: 1px solid var(--line); padding: 3px 8px;
  text-align: left; vertical-align: top; }
table.commands th { color: var(--muted); font-weight: 500; }
table.commands tr.bad td:nth-child(2) { color: var(--failed); }
table.network, table.approvals { border-collapse: collapse; width: 100%; margin: 4px 0;
  background: #fff; } table.network td, table.network th, table.approvals td,
table.approvals th { border-bottom: 1px solid var(--line); padding: 3px 8px; text-align: left;
  vertical-align: top; } tr.traffic th { font-weight: 500; background: #f7f8fa; }
table.network td:nth-child(n+6) { font-variant-numeric: tabular-nums; }
code.what { word-break: break-all; }
.badge.decision-allowed, .badge.decision-approved { background: #dcf3e5; color: #1c6b3c; }
.badge.decision-denied { background: #fbe0e0; color: #9b2323; }
.badge.decision-failed, .badge.decision-other { background: #fbefd6; color: #8a5a00; }
.badge.decision-timed-out { background: #ece3f7; color: #5e3591; }
details.agent { background: #fff; border: 1px solid var(--line); border-radius: 6px;
  margin: 4px 0; padding: 4px 10px; } details.agent[open] { padding-bottom: 10px; }
details.agent summary { cursor: pointer; }
details.agent:target { outline: 2px solid var(--journal); }
dl.facts { display: grid; grid-template-columns: repeat(auto-fill, minmax(140px, 1fr));
  gap: 2px 12px; } dl.facts dt { color: var(--muted); font-size: 12px; } dl.facts dd { margin: 0; }
.md { overflow-wrap: anywhere; } div.md > :first-child { margin-top: 0; }
div.md > :last-child { margin-bottom: 0; } .md p { margin: 4px 0 8px; }
div.md h1, div.md h2, div.md h3, div.md h4, div.md h5, div.md h6 { color: var(--ink);
  text-transform: none; letter-spacing: normal; border: 0; padding: 0; margin: 12px 0 4px; }
div.md h1 { font-size: 17px; } div.md h2 { font-size: 15.5px; } div.md h3 { font-size: 14.5px; }
div.md h4, div.md h5, div.md h6 { font-size: 14px; }
div.md ul, div.md ol { margin: 4px 0 8px; padding-left: 24px; } div.md ul { list-style: disc; }
div.md ol { list-style: decimal; } div.md li { margin: 2px 0; }
.md code { background: #f2f4f7; border-radius: 4px; padding: 0 3px; }
.md pre code { background: none; padding: 0; }
.md blockquote { margin: 4px 0; padding: 2px 12px; border-left: 3px solid var(--line);
  color: var(--muted); }
.md hr { border: 0; border-top: 1px solid var(--line); }
.md table { border-collapse: collapse; margin: 6px 0; display: block; max-width: 100%;
  overflow-x: auto; }
.md th, .md td { border: 1px solid var(--line); padding: 3px 8px; text-align: left;
  vertical-align: top; } .md th { background: #f2f4f7; font-weight: 600; }
.md a { color: var(--journal); } .md-image { color: var(--muted); }
div.evidence { background: #f7f8fa; border-left: 3px solid var(--line); padding: 4px 10px;
  margin: 4px 0; border-radius: 0 6px 6px 0; }
div.answer { margin: 4px 0; } .claim.md p { margin: 2px 0; }
"""

SCRIPT = """
(function () {
  "use strict";
  function openTarget() {
    var id = decodeURIComponent(location.hash.slice(1));
    var target = id && document.getElementById(id);
    if (target && target.tagName === "DETAILS") { target.open = true; }
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();
  var timeline = document.getElementById("timeline");
  document.querySelectorAll("input[data-toggle]").forEach(function (box) {
    box.addEventListener("change", function () {
      timeline.classList.toggle("hide-" + box.dataset.toggle, !box.checked);
    });
  });
  document.body.dataset.ready = "yes";
})();
"""
