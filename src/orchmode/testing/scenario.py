"""Scripted model behaviour for tests, benchmarks and ``orchmode demo`` — never a real model.

:class:`OrchestrationScenario` plays every role of a session, deciding each reply from the
request alone (so it survives a killed and restarted client):

- main agent, mode on: scout with bash, call Workflow with N subtasks (or with ``script``,
  when one is set), then summarise;
- main agent, mode off: answer briefly in text;
- worker: run one bash command, then report_findings (with ``data`` when the report_findings
  it is offered asks for it: an instance of that schema, see :func:`schema_instance`); a
  worker offered Workflow whose subtask says ``fan out into 5x3`` calls it first, with 5
  subtasks that each say ``fan out into 3`` (see :func:`nested_plan`);
- verifier: report_findings with a ``confirmed:`` (or ``refuted:``) summary;
- resolver (a conflict to resolve): edit the conflicted files with bash — by default, keep
  both sides of every conflict, as a model adding entries to one list would — then report.

By default reports are tiny. ``report_bytes`` / ``verifier_report_bytes`` make them the
size real ones are (a few KB of findings with file:line evidence), generated from the
subtask alone, so a rerun or a cache test sees the very same bytes.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.mode import Notice
from ..core.prompts import NOTICES, RESOLVE_MARKER, VERIFY_MARKER
from ..core.wire import ApiObject, JsonSchema, Message, ToolInput
from .replies import Reply, ScriptedBlock, ScriptedRequest
from .web import with_web


def text(value: str, **kwargs: Any) -> Reply:
    return Reply([{"type": "text", "text": value}], **kwargs)


def tool_call(name: str, tool_input: ToolInput, *, say: str = "", **kwargs: Any) -> Reply:
    content: list[ScriptedBlock] = [{"type": "text", "text": say}] if say else []
    content.append({"type": "tool_use", "name": name, "input": tool_input})
    return Reply(content, **kwargs)


def report(summary: str, findings: list[dict[str, str]], **kwargs: Any) -> Reply:
    return tool_call("report_findings", {"summary": summary, "findings": findings}, **kwargs)


def first_user_text(request: ScriptedRequest) -> str:
    return _first_text(request.body)


def _first_text(body: Mapping[str, Any]) -> str:
    messages = body.get("messages") or []
    content = messages[0].get("content") if messages else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


def role_of(body: Mapping[str, Any]) -> str:
    """Which of orchmode's agents sent a request: ``main`` (it offers the Workflow tool and
    no report_findings: a worker that may fan out is offered both), ``verifier``,
    ``resolver`` (their prompts' markers) or ``worker``."""
    names = {t.get("name") for t in body.get("tools") or []}
    if "Workflow" in names and "report_findings" not in names:
        return "main"
    first = _first_text(body)
    if first.startswith(VERIFY_MARKER):
        return "verifier"
    return "resolver" if first.startswith(RESOLVE_MARKER) else "worker"


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
        content = message["content"]
        if message["role"] == "system" and isinstance(content, str) and content in texts:
            return texts[content] is not Notice.EXIT
    return False


def last_tool_result_text(messages: list[Message]) -> str:
    for message in reversed(messages):
        blocks = message["content"]
        if _is_tool_results(message) and isinstance(blocks, list):
            parts = []
            for block in blocks:
                content = block.get("content")
                if isinstance(content, str):
                    parts.append(content)
                elif isinstance(content, list):
                    parts.extend(b.get("text", "") for b in content if isinstance(b, dict))
            return "\n".join(parts)
    return ""


_FAN_OUT = re.compile(r"fan out into (\d+)((?:x\d+)*)")


def nested_plan(subtask: str, plan: int) -> list[str] | None:
    """The subtasks a worker asked to ``fan out into 5x3`` gives its Workflow call: 5 that
    each say ``fan out into 3`` (leaves once no ``xN`` is left), named under the worker's
    own subtask and carrying ``plan`` (the request's number), so that another request
    plans other subtasks, as a real model's would. None: it is not asked to fan out."""
    match = _FAN_OUT.search(subtask)
    if match is None:
        return None
    count, rest = int(match.group(1)), match.group(2).lstrip("x")
    stem = subtask.split(" (plan", 1)[0].split(":", 1)[0].strip()
    below = f": fan out into {rest}" if rest else ""
    return [f"{stem}.{i} (plan {plan}){below}" for i in range(1, count + 1)]


def confirm_all(_subtask_prompt: str) -> str:
    return "confirmed"


_CONFLICTED_FILE = re.compile(r"^--- (.+)$", re.M)


def conflicted_files(resolve_prompt: str) -> list[str]:
    """The files a resolver's prompt shows conflicts in (its ``--- <file>`` lines)."""
    conflicts = resolve_prompt.split("<conflicts>", 1)[-1].split("</conflicts>", 1)[0]
    return [m.split(": ", 1)[0] for m in _CONFLICTED_FILE.findall(conflicts)]


def keep_both_sides(resolve_prompt: str) -> str | None:
    """A resolver's command that keeps both sides of every conflict, in order: what an
    agent does when each change adds an entry to one list (a registry, a changelog)."""
    files = conflicted_files(resolve_prompt)
    if not files:
        return None
    quoted = " ".join("'" + f.replace("'", "'\\''") + "'" for f in files)
    return f"sed -i -e '/^<<<<<<< /d' -e '/^=======$/d' -e '/^>>>>>>> /d' {quoted}"


#: A verdict in a condensed Workflow result: ``[verify i]`` (possibly more on that line,
#: such as where the report is saved), then ``confirmed`` on the same or the next line.
_CONDENSED_CONFIRMED = re.compile(r"^\[verify \d+\](?:[ \t]+|[^\n]*\n[ \t]*)confirmed", re.M)


def count_confirmed(result: str) -> int:
    """Confirmed verdicts in a Workflow result, whether verdicts are JSON or condensed."""
    return result.count('"summary": "confirmed') + len(_CONDENSED_CONFIRMED.findall(result))


_SUBTASK_IN_PROMPT = re.compile(r"<subtask>\n(.*?)\n</subtask>", re.S)


def subtask_of(verify_prompt: str) -> str:
    """The subtask a verification prompt quotes (the whole prompt if it quotes none)."""
    match = _SUBTASK_IN_PROMPT.search(verify_prompt)
    return match.group(1) if match else verify_prompt


# --------------------------------------------------------------------------- sized reports

_PATHS = (
    "src/app/config.py",
    "src/app/cache.py",
    "src/app/http/client.py",
    "src/app/storage/sqlite.py",
    "src/app/cli.py",
    "src/app/jobs/queue.py",
    "src/app/auth/tokens.py",
    "src/app/util/retry.py",
    "src/app/api/routes.py",
    "src/app/render/templates.py",
)
_FUNCTIONS = (
    "load_settings",
    "retry_request",
    "open_pool",
    "parse_header",
    "flush_queue",
    "render_page",
    "read_chunk",
    "refresh_token",
    "close_session",
    "merge_results",
    "schedule_job",
    "validate_payload",
)
_PROBLEMS = {
    "high": (
        "swallows the OSError from open() and returns an empty config",
        "builds its SQL query by string formatting from request input",
        "holds the pool lock across an await, so two concurrent callers deadlock",
        "compares the token with == instead of a constant-time comparison",
    ),
    "medium": (
        "retries without a cap on the backoff, so a dead upstream is hammered forever",
        "leaks a file descriptor whenever the parser raises",
        "reads the whole response into memory before checking its size",
        "catches Exception around the write and loses the traceback",
    ),
    "low": (
        "duplicates the parsing logic that already lives in the shared helper",
        "has no test for the empty-input case",
        "logs an expected condition at error level",
        "recompiles the same regular expression on every call",
    ),
    "info": (
        "is only called from one module, so it could be private",
        "uses an API deprecated in the pinned version, which still works",
        "documents a default that the code no longer uses",
        "could reuse the existing session instead of opening a new one",
    ),
}
_CODE = (
    "    result = {fn}(payload)",
    "    except Exception:",
    "        return {{}}",
    "    with self._lock:",
    "        await self._flush()",
    "    for attempt in range(retries):",
    "        time.sleep(delay * 2 ** attempt)",
    "    data = response.read()",
    "    query = f'SELECT * FROM jobs WHERE id = {{job_id}}'",
    "    if token == expected:",
    "    log.error('cache miss for %s', key)",
    "    pattern = re.compile(raw)",
    "    handle = open(path)",
    "    return {fn}(items, strict=False)",
)


def _severities(rng: random.Random) -> Iterator[str]:
    """Roughly one high, two medium, then low and info: the mix real reviews have."""
    yield from ["high"] * rng.choice((0, 1, 1, 1, 2))
    yield from ["medium"] * rng.choice((1, 2, 2, 3))
    while True:
        yield rng.choice(("low", "low", "info"))


def _output_lines(rng: random.Random, fn: str, line: int) -> Iterator[str]:
    """Endless grep-like output: numbered source lines."""
    while True:
        yield f"{line}:{rng.choice(_CODE).format(fn=fn)}"
        line += rng.randint(1, 3)


def _finding(rng: random.Random, severity: str) -> tuple[dict[str, str], Iterator[str]]:
    """One finding, plus more output lines should its evidence need to grow to fit."""
    path, fn = rng.choice(_PATHS), rng.choice(_FUNCTIONS)
    line = rng.randint(12, 480)
    claim = f"`{fn}` in {path} {rng.choice(_PROBLEMS[severity])}."
    command = rng.choice(
        (
            f"grep -n '{fn}' {path}",
            f"sed -n '{line},{line + 8}p' {path}",
            f"rg -n --no-heading '{fn}' src/app",
        )
    )
    more = _output_lines(rng, fn, line)
    output = [next(more) for _ in range(rng.randint(2, 5))]
    evidence = "\n".join([f"{path}:{line}", f"$ {command}", *output])
    return {"claim": claim, "evidence": evidence, "severity": severity}, more


def _size(findings: list[dict[str, str]]) -> int:
    return len(json.dumps(findings))


def _encoded_prefix(text: str, room: int) -> str:
    """The longest prefix of ``text`` whose JSON string body fits in ``room`` bytes."""
    used = 0
    for n, char in enumerate(text):
        used += len(json.dumps(char)) - 2
        if used > room:
            return text[:n]
    return text


def sized_findings(seed: str, target: int) -> list[dict[str, str]]:
    """Findings whose JSON is ``target`` bytes (a few under at most), the same for a seed.

    Whole findings are added while they fit; the last one's evidence then grows or is
    cut so the total lands on the target.
    """
    digest = hashlib.sha256(seed.encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    severities = _severities(rng)
    findings: list[dict[str, str]] = []
    growers: list[Iterator[str]] = []
    while True:
        finding, more = _finding(rng, next(severities))
        if _size([*findings, finding]) > target:
            break
        findings.append(finding)
        growers.append(more)
    if findings and target - _size(findings) < 160:
        # Too little room for another finding: let the last one's evidence grow instead.
        finding, more = findings.pop(), growers.pop()
    room = target - _size([*findings, {**finding, "evidence": ""}])
    evidence = finding["evidence"]
    while len(evidence) < room:
        evidence += "\n" + next(more)
    head = evidence.split("\n", 1)[0]  # file:line stays, however small the target
    finding["evidence"] = _encoded_prefix(evidence, max(room, len(head))).rstrip()
    return [*findings, finding]


def _counts(findings: list[dict[str, str]]) -> str:
    counts = {s: sum(1 for f in findings if f["severity"] == s) for s in _PROBLEMS}
    return (
        f"{counts['high']} high, {counts['medium']} medium, {counts['low']} low"
        f" and {counts['info']} informational findings"
    )


def offered_data_schema(request: ScriptedRequest) -> JsonSchema | None:
    """The schema of ``data`` in the report_findings tool the request offers, if it asks
    for one (a typed subtask)."""
    for tool in request.tools:
        if tool.get("name") == "report_findings":
            data = tool.get("input_schema", {}).get("properties", {}).get("data")
            return data if isinstance(data, dict) else None
    return None


def schema_instance(schema: object, root: object = None) -> Any:
    """A small value that follows ``schema``: the first of an ``enum``, every property of an
    object, the fewest items an array may have, the least number allowed, ``"x"`` strings.

    Enough for the schemas tests offer (no ``pattern``, ``not`` or ``if``); ``#`` pointers
    resolve against ``root`` (the report tool's input schema, where the data schema sits).
    """
    if not isinstance(schema, dict):
        return None
    root = schema if root is None else root
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        target: Any = root
        for part in [p for p in ref[1:].split("/") if p]:
            target = target.get(part.replace("~1", "/").replace("~0", "~"), {})
        return schema_instance(target, root)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema_instance(schema[key][0], root)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[0] if kind else None
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "null"
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: schema_instance(sub, root) for name, sub in properties.items()}
    if kind == "array":
        return [schema_instance(schema.get("items"), root)] * int(schema.get("minItems", 0))
    if kind == "string":
        return "x" * max(1, int(schema.get("minLength", 1)))
    if kind in ("number", "integer"):
        least = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        return int(least or 0) + (1 if "exclusiveMinimum" in schema else 0)
    if kind == "boolean":
        return True
    return None


def _not_an_instance(schema: JsonSchema) -> Any:
    """A value of the wrong type for ``schema``: what a careless report sends."""
    return "not what was asked" if schema.get("type") != "string" else {"wrong": True}


def _command(command: str | Callable[[str], str | None] | None, prompt: str) -> str | None:
    return command(prompt) if callable(command) else command


@dataclass
class OrchestrationScenario:
    """A whole orchestrated session, scripted."""

    #: the subtasks of the Workflow call: a count, or the list (strings or
    #: ``{"prompt", "schema"}`` objects)
    subtasks: int | list[Any] = 3
    scout_command: str | None = "ls"
    #: the worker's one bash command; a function of the subtask gives each its own (None:
    #: no command), as an agent that edits files would
    worker_command: str | Callable[[str], str | None] | None = "pwd"
    #: the verifier's, likewise (a function of its prompt)
    verifier_command: str | Callable[[str], str | None] | None = None
    #: a resolver's, likewise (by default it keeps both sides of every conflict)
    resolver_command: str | Callable[[str], str | None] | None = keep_both_sides
    #: a worker's first call when it is not bash: (tool name, input) from the subtask, e.g.
    #: an MCP tool's (None: the worker runs its command, if it has one)
    worker_call: Callable[[str], tuple[str, ToolInput] | None] | None = None
    #: the main agent's scouting call when it is not bash (taken before ``scout_command``)
    scout_call: tuple[str, ToolInput] | None = None
    verdict: Callable[[str], str] = confirm_all
    delay: float = 0.0
    summary: str = "In brief: the workflow ran and every result was checked."
    subtask_prefix: str = "Check item"
    #: when set, the main agent calls Workflow with this orchestration script instead
    script: str | None = None
    #: more fields of the Workflow call's input, e.g. ``{"isolation": "worktree"}``
    workflow_input: ToolInput = field(default_factory=dict)
    #: > 0: each worker reports findings of about this many bytes of JSON (see
    #: :func:`sized_findings`), the same for the same subtask; 0 keeps reports tiny
    report_bytes: int = 0
    #: the same for verifiers (their summary still starts with the verdict)
    verifier_report_bytes: int = 0
    #: a typed worker's ``data`` from its subtask and the schema it is offered (default:
    #: :func:`schema_instance`)
    worker_data: Callable[[str, JsonSchema], Any] | None = None
    #: how many invalid reports (data of the wrong type) a typed worker sends before a
    #: valid one
    invalid_reports: int = 0
    #: more fields of a worker's nested Workflow call (see :func:`nested_plan`)
    nested_input: ToolInput = field(default_factory=dict)
    #: a worker asked to fan out calls Workflow even when it is not offered the tool
    fan_out_regardless: bool = False
    #: a worker (or the main agent) offered the API's web tools opens its first reply with
    #: these blocks, made from its first message (a ``server_tool_use`` and its result: see
    #: :mod:`.web`); only those of the tools it is offered are sent
    web: Callable[[str], list[ApiObject]] | None = None
    stats: dict[str, int] = field(default_factory=dict)

    def subtask_list(self) -> list[Any]:
        if isinstance(self.subtasks, list):
            return self.subtasks
        return [f"{self.subtask_prefix} {i}" for i in range(1, self.subtasks + 1)]

    def __call__(self, request: ScriptedRequest) -> Reply:
        role = role_of(request.body)
        answer = {
            "main": self.main,
            "verifier": self.verifier,
            "resolver": self.resolver,
            "worker": self.worker,
        }[role]
        reply = answer(request)
        if role in ("main", "worker") and self.web is not None:
            reply = with_web(reply, request, self.web(first_user_text(request)))
        self.stats[role] = self.stats.get(role, 0) + 1
        reply.delay = max(reply.delay, self.delay)
        return reply

    def main(self, request: ScriptedRequest) -> Reply:
        messages = request.messages
        if not mode_is_on(messages):
            return text(self.summary)
        step = sum(1 for m in turn_messages(messages) if m.get("role") == "assistant")
        if self.scout_call is not None and step == 0:
            return tool_call(*self.scout_call, say="Scouting first.")
        if self.scout_command is None and self.scout_call is None:
            step += 1
        elif step == 0:
            return tool_call("bash", {"command": self.scout_command}, say="Scouting first.")
        if step == 1:
            extra = self.workflow_input
            if self.script is not None:
                return tool_call(
                    "Workflow", {"script": self.script, **extra}, say="Running a script."
                )
            return tool_call(
                "Workflow", {"subtasks": self.subtask_list(), **extra}, say="Fanning out."
            )
        result = last_tool_result_text(messages)
        agents = result.count("[agent ")
        confirmed = count_confirmed(result)
        return text(f"Synthesis: {agents} agents reported; {confirmed} results were confirmed.")

    def worker(self, request: ScriptedRequest) -> Reply:
        subtask = first_user_text(request)
        steps = sum(1 for m in request.messages if m.get("role") == "assistant")
        call = self.worker_call(subtask) if self.worker_call is not None else None
        if steps == 0 and call is None:
            call = self._nested_call(request, subtask)
        if steps == 0 and call is not None:
            return tool_call(*call)
        command = _command(self.worker_command, subtask)
        if steps == 0 and command and "bash" in request.tool_names:  # a role may have none
            return tool_call("bash", {"command": command})
        if self.report_bytes > 0:
            findings = sized_findings(subtask, self.report_bytes)
            worst = findings[0]["evidence"].split(":", 1)[0]
            summary = (
                f"Finished: {subtask.rstrip('.')}. {_counts(findings)}; the worst is in {worst}."
            )
        else:
            evidence = last_tool_result_text(request.messages) or "no command was needed"
            summary = f"Finished: {subtask}"
            findings = [
                {"claim": f"{subtask} holds", "evidence": evidence[:200], "severity": "info"}
            ]
        schema = offered_data_schema(request)
        if schema is None:
            return report(summary, findings)
        reports = sum(
            1
            for m in request.messages
            if m.get("role") == "assistant"
            and isinstance(m.get("content"), list)
            and any(
                isinstance(b, dict) and b.get("name") == "report_findings" for b in m["content"]
            )
        )
        if reports < self.invalid_reports:
            data = _not_an_instance(schema)
        elif self.worker_data is not None:
            data = self.worker_data(subtask, schema)
        else:
            report_schema = next(
                t["input_schema"] for t in request.tools if t.get("name") == "report_findings"
            )
            data = schema_instance(schema, report_schema)
        return tool_call(
            "report_findings",
            {"summary": summary, "findings": findings, "data": data},
        )

    def _nested_call(self, request: ScriptedRequest, subtask: str) -> tuple[str, ToolInput] | None:
        """A worker's Workflow call, when it is asked to fan out (and may, or insists)."""
        if "Workflow" not in request.tool_names and not self.fan_out_regardless:
            return None
        plan = nested_plan(subtask, request.index)
        if plan is None:
            return None
        self.stats["plans"] = self.stats.get("plans", 0) + 1
        return "Workflow", {"subtasks": plan, **self.nested_input}

    def verifier(self, request: ScriptedRequest) -> Reply:
        prompt = first_user_text(request)
        steps = sum(1 for m in request.messages if m.get("role") == "assistant")
        command = _command(self.verifier_command, prompt)
        if steps == 0 and command:
            return tool_call("bash", {"command": command})
        verdict = self.verdict(prompt)
        if self.verifier_report_bytes > 0:
            seed = f"verify:{subtask_of(prompt)}"
            findings = sized_findings(seed, self.verifier_report_bytes)
            return report(f"{verdict}: re-checked the claim", findings)
        return report(
            f"{verdict}: re-checked the claim",
            [{"claim": "the result was re-derived", "evidence": "scripted", "severity": "info"}],
        )

    def resolver(self, request: ScriptedRequest) -> Reply:
        prompt = first_user_text(request)
        steps = sum(1 for m in request.messages if m.get("role") == "assistant")
        command = _command(self.resolver_command, prompt)
        if steps == 0 and command:
            return tool_call("bash", {"command": command})
        files = ", ".join(conflicted_files(prompt)) or "the conflicted files"
        evidence = last_tool_result_text(request.messages) or "no command was needed"
        return report(
            f"Resolved the conflicts in {files}: kept both sides, in order.",
            [
                {
                    "claim": f"{files} hold both changes",
                    "evidence": evidence[:200],
                    "severity": "info",
                }
            ],
        )


#: The default responder of ``python -m orchmode.testing``: a small orchestrated session.
demo_responder = OrchestrationScenario(subtasks=4, delay=0.05)
