"""Every text and tool schema the model sees, in one place.

The main system prompt is static for a whole session so the cached prompt prefix stays
valid; the behaviour of orchestration mode lives in short mode notices and in the
Workflow tool's description.
"""

from __future__ import annotations

from typing import Any

from .mode import Notice

MAIN_SYSTEM = """\
You are a careful software engineering agent working in the user's directory through a \
bash shell. Check facts with commands instead of guessing, and say what you verified. \
You also have a Workflow tool that runs independent subtasks as parallel agents; its \
description says when you may use it. System messages inside the conversation tell you \
whether orchestration mode is on: follow the latest one. Finish each turn with a clear, \
well-organised answer for the user."""

NOTICES: dict[Notice, str] = {
    Notice.ENTER: (
        "Orchestration mode is ON. Aim for the most exhaustive correct answer, not the "
        "fastest one. Use the Workflow tool on every substantive task, sized to the task's "
        "natural decomposition rather than to the tool's maximum; the tool's description "
        "holds your standing consent, granularity guidance and quality patterns. Work alone "
        "only on conversational or trivial turns."
    ),
    Notice.REFRESH: (
        "Orchestration mode is still ON: use the Workflow tool (see the standing-consent "
        "part of its description)."
    ),
    Notice.EXIT: (
        "Orchestration mode is OFF. The Workflow tool's ordinary opt-in rule applies again: "
        "use it only when the user explicitly asks for a workflow."
    ),
}

WORKFLOW_DESCRIPTION = """\
Runs a list of independent subtasks as parallel agents and returns every agent's result.

Purpose: split a large task into independent subtasks; each runs as its own agent with a \
bash shell in the same directory and reports structured findings. Each result is then \
checked by a second agent that tries to refute it, and you receive, per subtask, the \
result followed by that verdict.

Opt-in rule: use this tool only when the user explicitly asks for a workflow, or when a \
system message in the conversation confirms that orchestration mode is on.

Quality patterns:
- Adversarial verification: a second wave tries to refute each result; weigh a refuted \
result accordingly and re-check it yourself if it matters.
- Completeness critic: add a subtask whose only job is to hunt for what the other subtasks \
are likely to miss.
- Multiphase sequencing: for larger work run separate calls for understanding, design, \
implementation and review, reading the results of one phase before starting the next.
- Hybrid by default: scout the task inline with bash first, then fan out over the \
work-list you discovered.

Granularity: one distinct concern, component or question per subtask — never one per line \
or per file section. A focused review of a module of a few hundred lines rarely needs more \
than about ten subtasks; a broad audit of a large codebase can justify more. Write each \
subtask as a self-contained prompt: the agent sees nothing else.

Standing consent: while a system message confirms that orchestration mode is on, the \
opt-in is standing — author and run a workflow for every substantive task by default and \
lean toward adversarial verification; work alone only on conversational turns or trivial \
mechanical edits. When a system message says the mode is off, the opt-in rule above \
applies again."""

WORKFLOW_TOOL: dict[str, Any] = {
    "name": "Workflow",
    "description": WORKFLOW_DESCRIPTION,
    "input_schema": {
        "type": "object",
        "properties": {
            "subtasks": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Independent subtask prompts, one per parallel agent.",
            }
        },
        "required": ["subtasks"],
    },
}

BASH_TOOL: dict[str, Any] = {"type": "bash_20250124", "name": "bash"}

SEVERITIES = ("high", "medium", "low", "info")

REPORT_FINDINGS_TOOL: dict[str, Any] = {
    "name": "report_findings",
    "description": (
        "Report the result of your subtask. Call it exactly once, when you are done: it ends "
        "your subtask. Give findings you verified, not a narration of what you did."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "summary": {
                "type": "string",
                "description": "Two or three sentences: the answer to your subtask.",
            },
            "findings": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "claim": {"type": "string", "description": "One sentence."},
                        "evidence": {
                            "type": "string",
                            "description": "The file and line, or command output, that "
                            "verified the claim.",
                        },
                        "severity": {"type": "string", "enum": list(SEVERITIES)},
                    },
                    "required": ["claim", "evidence", "severity"],
                },
            },
        },
        "required": ["summary", "findings"],
    },
}

MAIN_TOOLS: list[dict[str, Any]] = [WORKFLOW_TOOL, BASH_TOOL]
SUBAGENT_TOOLS: list[dict[str, Any]] = [BASH_TOOL, REPORT_FINDINGS_TOOL]

SUBAGENT_SYSTEM = """\
You are one agent in a larger parallel fan-out, and you have been given a single subtask. \
Investigate it directly in the shared working directory: check facts with bash instead of \
guessing, and cite the file and line or the command output behind each claim. Do not \
attempt work outside your subtask. Finish by calling report_findings exactly once; that \
call ends your subtask. Return findings, not narration."""

#: First words of every verification prompt; lets logs and scripted tests tell the waves apart.
VERIFY_MARKER = "Verify another agent's result."


def verify_prompt(subtask: str, result: str) -> str:
    """The second wave's prompt: try to refute one result."""
    return f"""{VERIFY_MARKER} Try hard to refute it.

The other agent was given this subtask:
<subtask>
{subtask}
</subtask>

It reported:
<result>
{result}
</result>

Re-derive its claims yourself with bash and look for evidence that contradicts them. When \
you cannot confirm a claim, count it as refuted. Call report_findings once: begin the \
summary with `confirmed: <why>` or `refuted: <why>`, citing file:line or command output, \
and list each claim you checked as a finding."""


DEFAULT_TASK = (
    "Explore the current directory and review it thoroughly: what it does, its code-quality "
    "issues, and concrete improvements."
)

SUMMARY_TASK = (
    "Now give a brief summary of your answer above in a few short paragraphs. "
    "Do not start a workflow for this."
)


def turn_limit_note(limit: int) -> str:
    return f"[orchmode: stopped after {limit} model calls in this turn, the configured limit]"


MAX_TOKENS_NOTE = "[orchmode: the reply was cut off at max_tokens and may be incomplete]"
