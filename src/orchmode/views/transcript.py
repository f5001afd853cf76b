"""One session's transcript as styled lines: turns, commands, fan-outs, findings, totals.

``orchmode show`` prints it; the lines carry Rich styles that plain text drops, so a pipe
or a test reads the same words a terminal does.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import IO

from ..core.results import severity_rank
from ..records.batches import BatchLog
from ..records.history import STATE_LABELS, AgentRecord, Fanout, SessionHistory, Turn
from ..records.network import NetworkLog, connection_text, question_text, size
from ..records.steps import Command, Compaction, CondensedResult
from ..records.totals import web_uses
from .escape import visible
from .formatting import clip, money, plural, seconds, when
from .progress import CHANGE_STYLES

NOTICE_LABELS = {
    "enter": "orchestration mode ON",
    "refresh": "orchestration mode still ON (reminder)",
    "exit": "orchestration mode OFF",
}


#: A line of output: (text, style) pieces; the style is a Rich style, ignored in plain text.
Line = tuple[tuple[str, str], ...]

_STATE_STYLES = {
    "done": "green",
    "journal": "cyan",
    "skipped": "yellow",
    "budget": "yellow",
    "failed": "red",
    "interrupted": "magenta",
    "finished": "green",
    "confirmed": "green",
    "refuted": "red",
    "unclear": "yellow",
}
_DECISION_STYLES = {"allowed": "green", "approved": "cyan", "failed": "yellow", "denied": "red"}
_ANSWER_STYLES = {"approved": "green", "denied": "red", "timed out": "magenta"}
_SEVERITY_STYLES = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}


def _line(*pieces: tuple[str, str] | str) -> Line:
    return tuple(p if isinstance(p, tuple) else (p, "") for p in pieces)


def _block(label: str, text: str, indent: str, style: str = "") -> list[Line]:
    """``label`` then ``text``, its later lines indented under the first."""
    lines = visible(text).splitlines() or [""]  # a \r is shown, not taken for a line break
    label = label.ljust(7)
    pad = " " * (len(label) + 1)
    out = [_line(indent, (label, "bold"), " ", (lines[0], style))]
    out.extend(_line(indent, pad, (line, style)) for line in lines[1:])
    return out


def _usage_text(agent: AgentRecord, subtree: float | None = None) -> str:
    """Its turns, tokens, cost and time; with ``subtree`` (it made calls), both costs."""
    cost = money(agent.cost)
    if subtree is not None:
        cost = f"own {cost} · subtree {money(subtree)}"
    return (
        f"{plural(agent.turns, 'turn')} · {plural(agent.tokens, 'token')} · "
        f"{cost} · {seconds(agent.duration)}"
    )


def _fanout_lines(turn: Turn, fanout: Fanout, indent: str) -> list[Line]:
    """A Workflow call and its agents, each worker followed by the calls it made, indented."""
    lines = [_line(indent, (fanout.describe(), "bold"))]
    inner = indent + "  "
    if fanout.script_error:
        lines.append(_line(inner, ("script error: ", "red"), fanout.script_error))
    for agent in fanout.agents:
        nested = turn.nested(agent)
        subtree = turn.subtree_cost(agent) if nested else None
        lines.extend(_agent_lines(agent, inner, fanout.resolution_verifier(agent), subtree))
        for call in nested:
            lines.extend(_fanout_lines(turn, call, inner + "  "))
    if fanout.condensed is not None:  # the model got this call's result condensed
        lines.append(_condensed_line(fanout.condensed, inner))
    return lines


def _agent_lines(
    agent: AgentRecord,
    indent: str,
    checked: AgentRecord | None = None,
    subtree: float | None = None,
) -> list[Line]:
    """An agent's lines; ``checked``: for a resolver, the verifier of its resolution;
    ``subtree``: what it and the agents of the calls it made cost, when it made any."""
    state = agent.state
    head: list[tuple[str, str] | str] = [indent, (agent.label, "bold")]
    if agent.title and agent.role == "worker":  # the others' titles are their stock openings
        head += [" · ", clip(agent.title, 80)]
    if agent.verdict:
        head += [" · ", (agent.verdict, _STATE_STYLES.get(agent.verdict, ""))]
    if checked is not None and checked.verdict:  # what became of the resolution
        head += [" · ", (f"resolution {checked.verdict}", _STATE_STYLES.get(checked.verdict, ""))]
    label = f"failed ({agent.status})" if state == "failed" else STATE_LABELS[state]
    head += [" · ", (label, _STATE_STYLES[state])]
    if agent.node:  # only runs on a cluster have nodes: a local run reads as it always has
        head += [" · ", (f"node {agent.node}", "blue")]
    if agent.status is not None and not agent.from_journal:
        head += [f" · {_usage_text(agent, subtree)}"]
    elif subtree is not None:  # still running, or served from the journal: what is known
        head += [f" · own {money(agent.spent)} · subtree {money(subtree)}"]
    if agent.batched:  # after its cost: the first dollar figure stays what it paid
        batched = f"batched {agent.batched} of {plural(agent.requests, 'request')}"
        head += [" · ", (f"{batched}, saved {money(agent.saved)}", "cyan")]
    lines = [_line(*head)]
    inner = indent + "  "
    for step in agent.activity:  # commands and compactions, as they happened
        if isinstance(step, Command):
            lines.append(_command_line(step, inner))
        else:
            lines.append(_compaction_line(step, inner, named=False))
    report = agent.report
    if report is not None:
        lines.extend(_block("summary", report.summary, inner))
        for finding in sorted(report.findings, key=lambda f: severity_rank(f.severity)):
            label = f"[{finding.severity}]"
            lines.extend(
                _block(label, finding.claim, inner, _SEVERITY_STYLES.get(finding.severity, ""))
            )
            if finding.evidence:
                lines.extend(_block("evidence", finding.evidence, inner + " " * 8, "dim"))
    elif agent.result:
        lines.extend(_block("result", agent.result, inner))
    if agent.report_path:  # the whole of it, whatever the model was shown
        lines.append(_line(inner, ("full result ", "bold"), agent.report_path))
    if agent.change is not None:  # only a worker with its own copy of the tree has one
        style = CHANGE_STYLES.get(agent.change.fate, "")
        lines.append(_line(inner, ("change ", "bold"), (agent.change.describe(), style)))
        if agent.change.path:
            lines.append(_line(inner, ("patch ", "bold"), agent.change.path))
        if agent.change.event.left_out:
            left_out = f"too big for a patch: {agent.change.event.left_out}"
            lines.append(_line(inner, ("left out ", "bold"), (left_out, "yellow")))
    return lines


def _compaction_line(compaction: Compaction, indent: str, *, named: bool) -> Line:
    """``named`` for a line that is not already under the agent it happened to."""
    who = f"{compaction.agent}: " if named else ""
    return _line(indent, ("context ", "bold"), (who + compaction.describe(), "yellow"))


def _condensed_line(condensed: CondensedResult, indent: str) -> Line:
    return _line(indent, (condensed.describe(), "yellow"))  # it reads "result condensed to …"


def _command_line(command: Command, indent: str) -> Line:
    style = "green" if command.ok else "red"
    return _line(
        indent,
        ("$ " if command.kind == "bash" else "", "bold"),
        clip(command.command, 100),
        "  ",
        (command.outcome, style),
        f" · {seconds(command.duration)}",
    )


def transcript(history: SessionHistory) -> list[Line]:
    """The session as a reader wants it: turns, commands, fan-outs, findings, verdicts, totals."""
    lines: list[Line] = [
        _line(("session ", "bold"), (history.id, "bold"),
              f" · {history.workdir or 'workdir not recorded'} · "
              f"{plural(len(history.turns), 'turn')}"),
    ]  # fmt: skip
    for turn in history.turns:
        lines.append(_line())
        lines.append(
            _line(
                (f"turn {turn.number}", "bold underline"),
                f" · {when(turn.started_at)} · ",
                (turn.status_text, _STATE_STYLES.get(turn.status, "")),
                f" · {plural(turn.requests, 'model request')} · "
                f"{plural(len(turn.agents), 'agent')} · {money(turn.cost)}",
            )
        )
        lines.extend(_block("user", turn.text, "  ", "bold"))
        for notice in turn.notices:
            label = NOTICE_LABELS.get(notice, notice)
            lines.append(_line("  ", ("mode   ", "bold"), " ", (f"{notice}: {label}", "cyan")))
        for step in turn.steps:
            if isinstance(step, Command):
                lines.append(_command_line(step, "  "))
                continue
            if isinstance(step, Compaction):
                lines.append(_compaction_line(step, "  ", named=True))
                continue
            if turn.maker(step) is None:  # a nested call is drawn under its maker
                lines.extend(_fanout_lines(turn, step, "  "))
        if turn.network:
            lines.extend(network_lines(turn.network, "  "))
        if turn.answer:
            lines.extend(_block("answer", turn.answer, "  "))
    if history.turns and history.turns[-1].status == "interrupted":
        lines.append(_line())
        lines.append(
            _line(
                ("interrupted", _STATE_STYLES["interrupted"]),
                f" — continue it from its last recorded step with `orchmode resume {history.id}`",
            )
        )
    lines.extend(batch_lines(history.batches))
    lines.append(_line())
    lines.append(_line(("totals", "bold"), " ", totals_text(history)))
    if batched := history.totals.all.describe_batched():
        lines.append(_line(("batched", "bold"), " ", batched))
    if models := history.totals.describe_models():
        lines.append(_line(("models", "bold"), " ", models))
    if history.skipped:
        lines.append(_line((f"{history.skipped} unreadable event rows were left out", "yellow")))
    return lines


def network_lines(network: NetworkLog, indent: str) -> list[Line]:
    """A turn's connections, per agent and domain, and its approvals: asked, answered, waited."""
    lines: list[Line] = []
    inner = indent + "  "
    for traffic in network.traffic():
        lines.append(_line(indent, ("network ", "bold"), f"{traffic.agent}: {traffic.summary()}"))
        for reach in traffic.reaches:
            moved = ""
            if reach.bytes_sent or reach.bytes_received:
                moved = f" · {size(reach.bytes_received)} in, {size(reach.bytes_sent)} out"
            text = clip(connection_text(reach), 120)
            lines.append(_line(inner, (text, _DECISION_STYLES.get(reach.decision, "")), moved))
    for approval in network.approvals.values():
        answer = approval.answer or "pending"
        lines.append(
            _line(
                indent,
                (f"approval {approval.id} ", "bold"),
                f"{approval.agent}: {clip(question_text(approval), 120)} · ",
                (clip(approval.outcome(), 100), _ANSWER_STYLES.get(answer, "yellow")),
            )
        )
    return lines


def batch_lines(batches: BatchLog) -> list[Line]:
    """The session's Message Batches: requests, state, how long each ran, who waited on it."""
    if not batches:
        return []
    lines: list[Line] = [_line(), _line(("batches", "bold"))]
    now = time.time()
    for batch in batches.batches.values():
        state = batch.state
        style = "yellow" if batch.ended is None else "green"
        if batch.ended is not None and batch.ended.succeeded < batch.ended.requests:
            style = "red"
        held = plural(batch.requests, "request") if batch.requests else "sent before"
        lines.append(
            _line(
                "  ",
                (batch.batch_id, "bold"),
                f" · {held} · ",
                (state, style),
                f" · {seconds(batch.age(now))}",
            )
        )
        if batch.agents:
            lines.append(_line("    ", "waited on by ", clip(", ".join(batch.agents), 200)))
    return lines


def totals_text(history: SessionHistory) -> str:
    total = history.totals.all
    return (
        f"{plural(total.requests, 'model request')} · {total.usage.total_input:,} input tokens "
        f"({total.usage.cache_hit:.0%} read from cache) · {total.usage.output_tokens:,} output "
        f"· {web + ' · ' if (web := web_uses(total.usage)) else ''}"
        f"{money(total.cost)} · {plural(len(history.agents), 'agent')} · "
        f"{seconds(history.elapsed)} elapsed"
    )


def plain(lines: Iterable[Line]) -> str:
    return "\n".join("".join(text for text, _ in line).rstrip() for line in lines)


def print_lines(lines: Iterable[Line], stream: IO[str]) -> None:
    """Styled through Rich on a terminal; plain text into a pipe or a file. Either way every
    piece is shown with its control characters escaped: most came from agents."""
    lines = [tuple((visible(text), style) for text, style in line) for line in lines]
    if not stream.isatty():
        print(plain(lines), file=stream)
        return
    from rich.console import Console
    from rich.text import Text

    console = Console(file=stream, highlight=False)
    for line in lines:
        console.print(Text.assemble(*line), soft_wrap=True)
