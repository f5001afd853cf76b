"""Workflow results that fit their token budget, condensed the same way every time.

Below its budget a Workflow result is exactly what it always was. Above it, every subtask
keeps its ``[agent i: …]`` header with the worker's summary (and a typed result's ``data``,
whole while the budget allows: it is what the caller asked for) and its ``[verify i]``
verdict; then findings are added by severity (all high ones first, in subtask order, then
medium, …) while the budget allows; what was left out is named per agent, with the file
holding its full report. Nothing here reads a clock or a set's order, so a rerun gives the
same bytes and the prompt cache still hits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.results import SEVERITIES, Finding, read_report
from ..model.context import CHARS_PER_TOKEN, estimate_tokens

#: Characters of a summary, verdict or plain-text result kept in a condensed result.
SUMMARY_CAP = 1200
#: Characters of a finding's evidence kept in a condensed result.
EVIDENCE_CAP = 160


@dataclass(frozen=True)
class AgentEntry:
    """One agent's result as the tool result shows it, and the file with all of it."""

    text: str
    path: str = ""


@dataclass(frozen=True)
class SubtaskEntry:
    title: str
    worker: AgentEntry
    verifier: AgentEntry | None = None
    #: What became of the worker's change to the tree, ``[change i] merged: …`` ("" for none).
    change: str = ""


@dataclass(frozen=True)
class Condensed:
    text: str
    tokens_full: int
    tokens_shown: int
    #: e.g. "31 low and 12 info findings not shown" ("" when nothing was left out)
    omitted: str
    condensed: bool


def full_text(head: Sequence[str], entries: Sequence[SubtaskEntry], tail: Sequence[str]) -> str:
    """The Workflow result as it is when it fits: every result whole, in the spec's order."""
    sections = list(head)
    for i, entry in enumerate(entries, start=1):
        sections.append(f"[agent {i}: {entry.title}]\n{entry.worker.text}")
        if entry.verifier is not None:
            sections.append(f"[verify {i}]\n{entry.verifier.text}")
        if entry.change:
            sections.append(entry.change)
    sections.extend(tail)
    return "\n\n".join(sections)


def fit_result(
    head: Sequence[str],
    entries: Sequence[SubtaskEntry],
    tail: Sequence[str],
    budget: int,
    *,
    saved_at: str,
    directory: str,
) -> Condensed:
    """The whole result if it fits ``budget`` tokens, else its condensed form."""
    whole = full_text(head, entries, tail)
    tokens = estimate_tokens(whole)
    if tokens <= budget:
        return Condensed(whole, tokens, tokens, "", condensed=False)
    return _condense(head, entries, tail, budget, tokens, saved_at, directory)


@dataclass
class _Agent:
    """One agent's result taken apart: the part always kept, and its findings."""

    label: str
    file: str
    kept: str
    findings: list[Finding] = field(default_factory=list)
    shown: list[bool] = field(default_factory=list)
    #: A typed result's data as compact JSON ("" for none): kept whole unless the summaries
    #: and data of all agents together do not fit the budget.
    data: str = ""

    def omitted(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for finding, shown in zip(self.findings, self.shown, strict=True):
            if not shown:
                counts[finding.severity] = counts.get(finding.severity, 0) + 1
        return counts


def _condense(
    head: Sequence[str],
    entries: Sequence[SubtaskEntry],
    tail: Sequence[str],
    budget: int,
    tokens_full: int,
    saved_at: str,
    directory: str,
) -> Condensed:
    agents: list[_Agent] = []
    #: The agents and each subtask's change line, in the order they are shown.
    order: list[_Agent | str] = []
    for i, entry in enumerate(entries, start=1):
        agents.append(_take_apart(f"[agent {i}: {entry.title}]", entry.worker))
        order.append(agents[-1])
        if entry.verifier is not None:
            agents.append(_take_apart(f"[verify {i}]", entry.verifier))
            order.append(agents[-1])
        if entry.change:  # like a verdict, always kept
            order.append(entry.change)
    # The note's wording does not depend on what was shown, so its size is known first.
    note_size = estimate_tokens(_note(budget, tokens_full, "x" * 60, saved_at, directory))
    fixed = note_size + sum(estimate_tokens(s) for s in [*head, *tail])
    fixed += sum(estimate_tokens(line) for line in order if isinstance(line, str))
    _cut_data(agents, budget - fixed - sum(estimate_tokens(_render(a, data=False)) for a in agents))
    fixed += sum(estimate_tokens(_render(a)) for a in agents)
    room = budget - fixed
    for severity in SEVERITIES:  # high first; the first finding that does not fit ends it
        for agent in agents:
            for n, finding in enumerate(agent.findings):
                if finding.severity != severity:
                    continue
                cost = estimate_tokens(_finding_line(finding)) + 1
                if cost > room:
                    room = -1
                    break
                agent.shown[n] = True
                room -= cost
            if room < 0:
                break
        if room < 0:
            break
    totals: dict[str, int] = {}
    for agent in agents:
        for severity, count in agent.omitted().items():
            totals[severity] = totals.get(severity, 0) + count
    omitted = _counts(totals)
    note = _note(budget, tokens_full, omitted, saved_at, directory)
    body = [x if isinstance(x, str) else _render(x) for x in order]
    text = "\n\n".join([note, *head, *body, *tail])
    return Condensed(text, tokens_full, estimate_tokens(text), omitted, condensed=True)


def _take_apart(label: str, entry: AgentEntry) -> _Agent:
    file = Path(entry.path).name if entry.path else ""
    report = read_report(entry.text)
    if report is None:
        # orchmode's closing note (a refusal's reasons, a cut reply) is kept whole.
        body, _, note = entry.text.strip().rpartition("\n")
        if not (note.startswith("[orchmode: ") and note.endswith("]")):
            body, note = entry.text.strip(), ""
        kept = _cap(body, SUMMARY_CAP) + (f"\n{note}" if note else "")
        return _Agent(label, file, kept.strip())
    findings = [f for f in report.findings if f.severity in SEVERITIES]
    data = ""
    if "data" in report.model_fields_set:
        data = json.dumps(report.data, ensure_ascii=False, sort_keys=True)
    summary = _cap(report.summary, SUMMARY_CAP)
    return _Agent(label, file, summary, findings, [False] * len(findings), data)


def _cut_data(agents: Sequence[_Agent], room: int) -> None:
    """Cut typed data only when all of it does not fit the ``room`` left once everything
    else always kept is in: each agent's data gets an equal share, and a cut one names
    the file with the whole of it."""
    typed = [a for a in agents if a.data]
    if not typed or sum(estimate_tokens(f"data: {a.data}") for a in typed) <= room:
        return
    share = max(0, room // len(typed) - 40) * CHARS_PER_TOKEN
    for agent in typed:
        if len(agent.data) > share:
            where = f"; the whole of it is in {agent.file}" if agent.file else ""
            agent.data = (
                f"{agent.data[:share]}… [orchmode: data cut after {share:,} of "
                f"{len(agent.data):,} characters to fit the budget{where}]"
            )


def _render(agent: _Agent, *, data: bool = True) -> str:
    label = f"{agent.label} (report: {agent.file})" if agent.file else agent.label
    lines = [label, agent.kept]
    if data and agent.data:
        lines.append(f"data: {agent.data}")
    lines.extend(
        _finding_line(f) for f, shown in zip(agent.findings, agent.shown, strict=True) if shown
    )
    omitted = _counts(agent.omitted())
    if omitted:
        where = f" — all of them in {agent.file}" if agent.file else ""
        lines.append(f"({omitted}{where})")
    return "\n".join(lines)


def _finding_line(finding: Finding) -> str:
    claim = " ".join(finding.claim.split())
    evidence = _cap(" ".join(finding.evidence.split()), EVIDENCE_CAP, note="")
    return f"- [{finding.severity}] {claim} (evidence: {evidence})"


def _cap(text: str, limit: int, note: str = " [cut; the whole text is in the report file]") -> str:
    if len(text) <= limit:
        return text
    return text[: limit - 1].rstrip() + "…" + note


def _counts(counts: dict[str, int]) -> str:
    """``4 low and 2 info findings not shown``, in severity order."""
    parts = [f"{counts[s]} {s}" for s in SEVERITIES if counts.get(s)]
    if not parts:
        return ""
    total = sum(counts.values())
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"{listed} {'finding' if total == 1 else 'findings'} not shown"


def _note(budget: int, tokens_full: int, omitted: str, saved_at: str, directory: str) -> str:
    left_out = f" — {omitted}" if omitted else ""
    return (
        f"[orchmode: this Workflow result is condensed to fit its budget of {budget:,} tokens "
        f"(the whole of it is about {tokens_full:,}): every subtask's summary and verdict are "
        f"kept, then findings by severity, high first, while the budget allowed{left_out}. "
        f"The whole result is saved at {saved_at}, and each agent's full report is a JSON "
        f"file in {directory}/ named on its line below: read what you need with cat, grep "
        "or jq.]"
    )


# --------------------------------------------------------------------------- scripts


def fit_value(text: str, budget: int, saved_at: str | None) -> tuple[str, str]:
    """A script's JSON value within ``budget`` tokens, and a note of what was left out.

    Findings are dropped from the reports inside the value, least severe first; if that is
    not enough the text is cut, and the note says where the whole value is saved.
    """
    if estimate_tokens(text) <= budget:
        return text, ""
    try:
        value: Any = json.loads(text)
    except ValueError:
        value = None
    dropped: list[str] = []
    if value is not None:
        for severity in reversed(SEVERITIES):
            count = _drop_findings(value, severity)
            if count:
                dropped.append(f"{count} {severity}")
                text = json.dumps(value, ensure_ascii=False)
                if estimate_tokens(text) <= budget:
                    break
    where = f"; the whole value is saved at {saved_at}" if saved_at else ""
    notes = []
    if dropped:
        notes.append(f"left out {' and '.join(reversed(dropped))} findings of its reports")
    if estimate_tokens(text) > budget:
        keep = max(0, budget * 3 - 400)
        notes.append(f"cut it after {keep:,} of {len(text):,} characters")
        text = text[:keep]
    return text, f"[orchmode: the script's value was over its budget of {budget:,} tokens, so " + (
        "; ".join(notes) + f"{where}]"
    )


def _drop_findings(value: Any, severity: str) -> int:
    """Remove findings of ``severity`` from every report inside ``value``; how many."""
    count = 0
    if isinstance(value, dict):
        findings = value.get("findings")
        if isinstance(value.get("summary"), str) and isinstance(findings, list):
            kept = [
                f for f in findings if not (isinstance(f, dict) and f.get("severity") == severity)
            ]
            count += len(findings) - len(kept)
            value["findings"] = kept
        for key, item in value.items():
            if key == "data" and "summary" in value:  # a typed result's data is kept whole
                continue
            count += _drop_findings(item, severity)
    elif isinstance(value, list):
        for item in value:
            count += _drop_findings(item, severity)
    return count
