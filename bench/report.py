"""How long a session's report takes to render, and whether it grows linearly with its agents.

A recorded session is made up of event rows (no model, no store): one Workflow call whose
subtasks each have a worker (a prompt, three commands, a report with two findings in
Markdown, model requests) and a verifier. The report file (every transcript inline) and the
console's run page (transcripts loaded when opened) are rendered at 100 and at 1,000 agents;
printed: the best time of a few renderings, the time per agent, and the ratio of the time per
agent at 1,000 to that at 100 (flat is 1.0). The console needs a 1,000-agent page to paint in
two seconds, so its rendering should take well under one.

    .venv/bin/python bench/report.py [--agents 100 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from orchmode.records.history import SessionHistory, read_session
from orchmode.store import EventRow
from orchmode.views.pages import agent_transcript, render_report, run_sections

USAGE = {"input_tokens": 1200, "output_tokens": 300, "cache_read_tokens": 900,
         "cache_write_tokens": 100}  # fmt: skip


def _subtask(index: int) -> list[tuple[str, dict[str, Any]]]:
    """A worker that runs three commands and reports two findings, then its verifier."""
    report = {
        "summary": f"Checked **module {index}**: two problems, see below.\n\n- one\n- two",
        "findings": [
            {"claim": f"`parse()` drops the last line of file {index}", "severity": "high",
             "evidence": "```\nline 1\nline 2\n```"},
            {"claim": f"A typo in *docs/{index}.md*", "severity": "low", "evidence": ""},
        ],
    }  # fmt: skip
    worker = {"call": 1, "index": index, "role": "worker"}
    verifier = {"call": 1, "index": index, "role": "verifier"}
    rows: list[tuple[str, dict[str, Any]]] = [
        ("SubagentStarted", {**worker, "title": f"module {index}",
                             "prompt": f"Review module {index} <for> bugs & typos."}),
    ]  # fmt: skip
    for command in ("ls -la", f"grep -n parse src/m{index}.py", "pytest -q"):
        rows.append(
            ("BashDone", {"agent": f"worker 1.{index}", "command": command, "exit_code": 0,
                          "timed_out": False, "duration": 0.4, "sandbox": "bwrap"})
        )  # fmt: skip
    for agent in (f"worker 1.{index}", f"verifier 1.{index}"):
        rows.append(
            (
                "ModelRequestDone",
                {
                    "agent": agent,
                    "message_id": "msg",
                    "usage": USAGE,
                    "duration": 1.0,
                    "cost": 0.002,
                },
            )
        )
    rows += [
        ("SubagentDone", {**worker, "status": "finished", "turns": 3, "usage": USAGE,
                          "duration": 12.0, "result": json.dumps(report), "cost": 0.004}),
        ("SubagentStarted", {**verifier, "title": f"module {index}", "prompt": "Check it."}),
        ("SubagentDone", {**verifier, "status": "finished", "turns": 1, "usage": USAGE,
                          "duration": 3.0, "verdict": "confirmed", "result": "Confirmed.",
                          "cost": 0.002}),
    ]  # fmt: skip
    return rows


def session(agents: int) -> SessionHistory:
    """A recorded session with ``agents`` subagents (half workers, half their verifiers)."""
    subtasks = agents // 2
    rows: list[tuple[str, dict[str, Any]]] = [
        ("TurnStarted", {"text": "Review every module.", "notices": []}),
        ("FanoutStarted", {"call": 1, "subtasks": subtasks, "not_run": 0}),
    ]
    for index in range(1, subtasks + 1):
        rows += _subtask(index)
    rows += [
        ("FanoutDone", {"call": 1, "duration": 60.0}),
        ("TurnDone", {"stop": "end_turn", "model_calls": 2}),
    ]
    events = [
        EventRow(seq, 1000.0 + seq * 0.01, kind, json.dumps(data))
        for seq, (kind, data) in enumerate(rows)
    ]
    return read_session(events, session="bench", workdir="/tmp/bench")


def best_of(
    repeat: int, render: Callable[[SessionHistory], object], history: SessionHistory
) -> float:
    """The shortest of ``repeat`` renderings: the machine's other work only ever adds."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        render(history)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--agents", type=int, nargs=2, default=(100, 1000))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    small, large = (session(n) for n in args.agents)
    render_report(small)  # the templates compile once, outside the timings
    pages: dict[str, Callable[[SessionHistory], object]] = {
        "report file": render_report,
        "console page": lambda history: run_sections(history, transcripts=False),
    }
    for name, render in pages.items():
        per_agent = []
        for history in (small, large):
            took = best_of(args.repeat, render, history)
            agents = len(history.agents)
            per_agent.append(took / agents)
            print(f"{name:>12}: {agents:>5} agents in {took:.3f} s, "
                  f"{took / agents * 1000:.3f} ms per agent")  # fmt: skip
        print(f"{name:>12}: per-agent time at {args.agents[1]} / at {args.agents[0]} "
              f"= {per_agent[1] / per_agent[0]:.2f}")  # fmt: skip
    last = f"agent-t1-1-{len(large.agents) // 2}-verifier"
    took = best_of(args.repeat, lambda history: agent_transcript(history, last), large)
    print(f"  transcript: the last of {len(large.agents)} agents' alone in {took * 1000:.2f} ms")


if __name__ == "__main__":
    main()
