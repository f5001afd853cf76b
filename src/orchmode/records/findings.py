"""A subagent's ``report_findings`` JSON read back: its summary, its findings, their severity order.

The session history, the transcript and the HTML report all show findings; parsing them is
apart from the event rows because a finding lives inside one event's ``result`` text.
These are not :class:`orchmode.core.results.Report` and its ``Finding``, which check the
model's input strictly: what is read back here was recorded, perhaps by an older version or
cut short, so it is read leniently and shown as far as it goes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..core.prompts import SEVERITIES  # the order a reader wants; anything else sorts after


@dataclass(frozen=True)
class RecordedFinding:
    claim: str
    evidence: str
    severity: str


@dataclass(frozen=True)
class RecordedReport:
    """What a subagent handed in through report_findings."""

    summary: str
    findings: tuple[RecordedFinding, ...]


def read_report(result: str) -> RecordedReport | None:
    """A subagent's ``report_findings`` JSON; None for anything else (an error, a limit note)."""
    try:
        data = json.loads(result)
    except (ValueError, TypeError):
        return None
    if not isinstance(data, dict):
        return None
    summary = data.get("summary")
    raw = data.get("findings")
    if not isinstance(summary, str) and not isinstance(raw, list):
        return None
    findings = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("claim"), str):
            continue
        evidence = item.get("evidence")
        severity = item.get("severity")
        findings.append(
            RecordedFinding(
                claim=item["claim"],
                evidence=evidence if isinstance(evidence, str) else "",
                severity=severity.strip().lower() if isinstance(severity, str) else "info",
            )
        )
    return RecordedReport(summary if isinstance(summary, str) else "", tuple(findings))


def severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)
