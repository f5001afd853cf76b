"""HTML the report's sections share: escaping, model-written Markdown, anchors, times, steps.

Every value that came from a user or a model goes through :func:`e` or :func:`md_block`.
"""

from __future__ import annotations

from html import escape

from ..records.history import AgentRecord, Turn
from ..records.steps import Command, Compaction
from .escape import visible
from .formatting import seconds, when
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


def role_attributes(agent: AgentRecord) -> str:
    """``data-agent`` (the name its requests are recorded under), ``data-role``, and
    ``data-checks="resolution"`` on the verifier of a resolution."""
    checks = ' data-checks="resolution"' if agent.resolution else ""
    return f'data-agent="{e(agent.name)}" data-role="{agent.role}"{checks}'


def node_attribute(agent: AgentRecord) -> str:
    """``data-node`` for an agent placed on a cluster node; nothing for one run locally."""
    return f' data-node="{e(agent.node)}"' if agent.node else ""


def commands_table(commands: list[Command]) -> str:
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


def compaction_item(
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
