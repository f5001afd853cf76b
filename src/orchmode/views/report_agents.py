"""The report's Agents section: each agent's facts, prompt, report, change and commands.

A worker that made Workflow calls of its own holds their agents inside its ``<details>``,
so the section folds as the tree of agents does.
"""

from __future__ import annotations

from ..core.results import SEVERITIES, severity_rank
from ..records.history import STATE_LABELS, AgentRecord, Fanout, SessionHistory, Turn
from ..records.steps import SettledChange
from ..records.wording import status_words
from .formatting import money, seconds
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

#: A settled change's fate as a CSS class (anything a newer orchmode records reads "other").
_CHANGE_CLASSES = {
    "merged": "merged",
    "conflict": "conflict",
    "refused": "refused",
    "not merged": "not-merged",
    "kept": "kept",
}


def _batched(agent: AgentRecord) -> str:
    """``2 of 3 requests, saved $0.0040 (msgbatch_…, msgbatch_…)``."""
    batches = f" ({', '.join(agent.batches)})" if agent.batches else ""
    return f"{agent.batched} of {agent.requests} requests, saved {money(agent.saved)}{batches}"


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


def _facts(agent: AgentRecord, nodes: bool, subtree: float | None = None) -> str:
    """The agent's numbers as a definition list; its node only when the run had nodes, its
    subtree's cost only when it made calls of its own."""
    usage = agent.usage
    facts = [
        ("status", status_words(agent.status) if agent.status else "never finished"),
        *([("node", agent.node or "—")] if nodes else []),
        ("turns", str(agent.turns)),
        ("model requests", str(agent.requests)),
        ("input tokens", f"{usage.input_tokens:,}"),
        ("output tokens", f"{usage.output_tokens:,}"),
        ("cache reads", f"{usage.cache_read_tokens:,}"),
        ("cache writes", f"{usage.cache_write_tokens:,}"),
        ("read from cache", f"{usage.cache_hit:.0%}"),
        ("cost", money(agent.cost)),
        *([("subtree cost", money(subtree))] if subtree is not None else []),
        *([("batched", _batched(agent))] if agent.batched else []),
        ("duration", seconds(agent.duration)),
        ("started", clock(agent.started_at)),
        ("ended", clock(agent.done_at)),
        *([("compactions", str(len(agent.compactions)))] if agent.compactions else []),
    ]
    return (
        '<dl class="facts">'
        + "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in facts)
        + "</dl>"
    )


def _prompt(agent: AgentRecord) -> str:
    if agent.prompt:
        return f'<h4>prompt</h4><pre class="prompt">{e(agent.prompt)}</pre>'
    return (
        '<p class="meta">No prompt recorded (the agent never started: the budget '
        "skipped it, or it is a journal hit in a record older than this orchmode).</p>"
    )


def _result(agent: AgentRecord) -> str:
    """Its report (summary, then findings, most severe first), else its result text as is."""
    report = agent.report
    if report is None:
        return f'<h4>result</h4><pre class="result">{e(agent.result)}</pre>' if agent.result else ""
    items = "".join(
        f'<li data-severity="{e(f.severity)}"><span class="badge severity-'
        f'{e(f.severity if f.severity in SEVERITIES else "other")}">{e(f.severity)}</span> '
        f"{md_inline(f.claim, 'claim')}"
        + (md_block(f.evidence, "evidence", breaks=True) if f.evidence else "")
        + "</li>"
        for f in sorted(report.findings, key=lambda f: severity_rank(f.severity))
    )
    return (
        f"<h4>summary</h4>{md_block(report.summary, 'summary')}"
        f'<ul class="agent-findings">{items}</ul>'
    )


def _extras(turn: Turn, agent: AgentRecord) -> str:
    """Where its full result is saved, its change, its commands and its compactions."""
    saved = (
        f'<h4>full result</h4><p><code class="report-path">{e(agent.report_path)}</code></p>'
        if agent.report_path
        else ""
    )
    commands = commands_table(agent.commands)
    context = (
        '<h4>context</h4><ul class="compactions">'
        + "".join(compaction_item(turn, c, named=False) for c in agent.compactions)
        + "</ul>"
        if agent.compactions
        else ""
    )
    return (
        saved
        + (_change(agent.change) if agent.change is not None else "")
        + (f"<h4>commands</h4>{commands}" if commands else "")
        + context
    )


def _agent_details(
    turn: Turn,
    agent: AgentRecord,
    nodes: bool = False,
    checked: AgentRecord | None = None,
) -> str:
    """One agent's details; ``nodes`` when the run had agents on cluster nodes; ``checked``,
    for a resolver, the verifier of its resolution (its verdict is shown beside it). The
    calls it made sit in its body, each with its agents."""
    state = agent.state
    verdict = _verdict_badge(agent.verdict)
    if checked is not None:
        verdict += _verdict_badge(checked.verdict, "resolution ")
    node = f"node {e(agent.node)} · " if agent.node else ""
    change = agent.change
    changed = (
        " " + _change_badge(change, f"+{change.event.added} −{change.event.removed} {change.fate}")
        if change is not None
        else ""
    )
    nested = turn.nested(agent)
    subtree = turn.subtree_cost(agent) if nested else None
    cost = e(money(agent.cost))
    tree = ""
    if subtree is not None:
        cost = f"own {e(money(agent.spent))} · subtree {e(money(subtree))}"
        tree = f' data-own="{agent.spent:.6f}" data-subtree="{subtree:.6f}"'
    children = "".join(_call_details(turn, call, nodes) for call in nested)
    return (
        f'<details class="agent" id="{agent_id(turn, agent)}" {role_attributes(agent)} '
        f'data-state="{state}"{node_attribute(agent)}{tree}>'
        f'<summary><span class="swatch state-{state} role-{agent.role}"></span>'
        f"<b>{e(agent.label)}</b> {e(agent.title if agent.role == 'worker' else '')} "
        f'<span class="badge state-{state}">{e(STATE_LABELS[state])}</span>{verdict}{changed} '
        f'<span class="meta">{node}{agent.tokens:,} tokens · {cost} · '
        f"{e(seconds(agent.duration))}</span></summary>"
        f'<div class="agent-body">{_facts(agent, nodes, subtree)}{_prompt(agent)}'
        f"{_result(agent)}{_extras(turn, agent)}{children}</div></details>"
    )


def _call_details(turn: Turn, fanout: Fanout, nodes: bool) -> str:
    """A call a worker made: its line, then its agents, each holding the calls it made."""
    agents = "".join(
        _agent_details(turn, agent, nodes, fanout.resolution_verifier(agent))
        for agent in fanout.agents
    )
    return (
        f'<div class="nested-call" data-call="{fanout.call}" data-parent="{e(fanout.parent)}" '
        f'data-depth="{fanout.depth}"><h4>{e(fanout.describe())}</h4>{agents}</div>'
    )


def agents_section(history: SessionHistory) -> str:
    nodes = any(agent.node for agent in history.agents)  # a run on a cluster shows where
    parts = [
        _agent_details(turn, agent, nodes, fanout.resolution_verifier(agent))
        for turn in history.turns
        for fanout in turn.top_fanouts
        for agent in fanout.agents
    ]
    content = "\n".join(parts) or '<p class="meta">No subagents ran.</p>'
    return f'<section id="agents"><h2>Agents</h2>\n{content}\n</section>'
