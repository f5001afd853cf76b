"""Scripted model behaviour for tests, benchmarks and ``orchmode demo`` — never a real model.

:class:`OrchestrationScenario` plays every role of a session, deciding each reply from the
request alone (so it survives a killed and restarted client):

- main agent, mode on: scout with bash, call Workflow with N subtasks (or with ``script``,
  when one is set), then summarise;
- main agent, mode off: answer briefly in text;
- worker: run one bash command, then report_findings;
- verifier: report_findings with a ``confirmed:`` (or ``refuted:``) summary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..mode import Notice
from ..prompts import NOTICES, VERIFY_MARKER
from .server import Reply, ScriptedRequest

Message = dict[str, Any]


def text(value: str, **kwargs: Any) -> Reply:
    return Reply([{"type": "text", "text": value}], **kwargs)


def tool_call(name: str, tool_input: dict[str, Any], *, say: str = "", **kwargs: Any) -> Reply:
    content: list[dict[str, Any]] = [{"type": "text", "text": say}] if say else []
    content.append({"type": "tool_use", "name": name, "input": tool_input})
    return Reply(content, **kwargs)


def report(summary: str, findings: list[dict[str, str]], **kwargs: Any) -> Reply:
    return tool_call("report_findings", {"summary": summary, "findings": findings}, **kwargs)


def first_user_text(request: ScriptedRequest) -> str:
    content = request.messages[0].get("content") if request.messages else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


def turn_messages(messages: list[Message]) -> list[Message]:
    """The messages of the current user turn: after the last plain-text user message."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if message.get("role") == "user" and not _is_tool_results(message):
            return messages[i + 1 :]
    return messages


def _is_tool_results(message: Message) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def mode_is_on(messages: list[Message]) -> bool:
    """What the latest mode notice in the history says."""
    texts = {v: k for k, v in NOTICES.items()}
    for message in reversed(messages):
        if message.get("role") == "system" and message.get("content") in texts:
            return texts[message["content"]] is not Notice.EXIT
    return False


def last_tool_result_text(messages: list[Message]) -> str:
    for message in reversed(messages):
        if _is_tool_results(message):
            parts = []
            for block in message["content"]:
                content = block.get("content")
                if isinstance(content, str):
                    parts.append(content)
                elif isinstance(content, list):
                    parts.extend(b.get("text", "") for b in content if isinstance(b, dict))
            return "\n".join(parts)
    return ""


def confirm_all(_subtask_prompt: str) -> str:
    return "confirmed"


@dataclass
class OrchestrationScenario:
    """A whole orchestrated session, scripted."""

    subtasks: int | list[str] = 3
    scout_command: str | None = "ls"
    worker_command: str | None = "pwd"
    verifier_command: str | None = None
    verdict: Callable[[str], str] = confirm_all
    delay: float = 0.0
    summary: str = "In brief: the workflow ran and every result was checked."
    subtask_prefix: str = "Check item"
    #: when set, the main agent calls Workflow with this orchestration script instead
    script: str | None = None
    stats: dict[str, int] = field(default_factory=dict)

    def subtask_list(self) -> list[str]:
        if isinstance(self.subtasks, list):
            return self.subtasks
        return [f"{self.subtask_prefix} {i}" for i in range(1, self.subtasks + 1)]

    def __call__(self, request: ScriptedRequest) -> Reply:
        if "Workflow" in request.tool_names:
            role, reply = "main", self.main(request)
        elif first_user_text(request).startswith(VERIFY_MARKER):
            role, reply = "verifier", self.verifier(request)
        else:
            role, reply = "worker", self.worker(request)
        self.stats[role] = self.stats.get(role, 0) + 1
        reply.delay = max(reply.delay, self.delay)
        return reply

    def main(self, request: ScriptedRequest) -> Reply:
        messages = request.messages
        if not mode_is_on(messages):
            return text(self.summary)
        step = sum(1 for m in turn_messages(messages) if m.get("role") == "assistant")
        if self.scout_command is None:
            step += 1
        elif step == 0:
            return tool_call("bash", {"command": self.scout_command}, say="Scouting first.")
        if step == 1:
            if self.script is not None:
                return tool_call("Workflow", {"script": self.script}, say="Running a script.")
            return tool_call("Workflow", {"subtasks": self.subtask_list()}, say="Fanning out.")
        result = last_tool_result_text(messages)
        agents = result.count("[agent ")
        confirmed = result.count('"summary": "confirmed')
        return text(f"Synthesis: {agents} agents reported; {confirmed} results were confirmed.")

    def worker(self, request: ScriptedRequest) -> Reply:
        subtask = first_user_text(request)
        steps = sum(1 for m in request.messages if m.get("role") == "assistant")
        if steps == 0 and self.worker_command:
            return tool_call("bash", {"command": self.worker_command})
        evidence = last_tool_result_text(request.messages) or "no command was needed"
        return report(
            f"Finished: {subtask}",
            [{"claim": f"{subtask} holds", "evidence": evidence[:200], "severity": "info"}],
        )

    def verifier(self, request: ScriptedRequest) -> Reply:
        prompt = first_user_text(request)
        steps = sum(1 for m in request.messages if m.get("role") == "assistant")
        if steps == 0 and self.verifier_command:
            return tool_call("bash", {"command": self.verifier_command})
        verdict = self.verdict(prompt)
        return report(
            f"{verdict}: re-checked the claim",
            [{"claim": "the result was re-derived", "evidence": "scripted", "severity": "info"}],
        )


#: The default responder of ``python -m orchmode.testing``: a small orchestrated session.
demo_responder = OrchestrationScenario(subtasks=4, delay=0.05)
