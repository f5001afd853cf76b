"""Every text and tool schema the model sees, in one place.

The main system prompt is static for a whole session so the cached prompt prefix stays
valid; the behaviour of orchestration mode lives in short mode notices and in the
Workflow tool's description.
"""

from __future__ import annotations

from collections.abc import Mapping

from .agents import AgentDefinition, describe_roles
from .mode import Notice
from .results import report_input_schema
from .wire import ToolSchema

MAIN_SYSTEM = """\
You are a careful software engineering agent working in the user's directory through a \
bash shell. Check facts with commands instead of guessing, and say what you verified. \
You also have a Workflow tool that runs independent subtasks as parallel agents; its \
description says when you may use it. System messages inside the conversation tell you \
whether orchestration mode is on: follow the latest one. Every agent's full report is \
saved as a file under .orchmode/results/ in the working directory (read-only): when a \
Workflow result is condensed or an old tool result is replaced by a note, the note names \
the file that holds it. Finish each turn with a clear, well-organised answer for the user."""

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


def notice_as_user_text(notice: str) -> str:
    """A mode notice folded into a user turn, marked so it cannot pass for the user's words."""
    return (
        "\n\n[orchmode notice: from the harness, not written by the user]\n"
        f"{notice}\n[end of orchmode notice]"
    )


WORKFLOW_DESCRIPTION = """\
Runs independent subtasks as parallel agents and returns every agent's result; or runs a \
short Python script that starts agents itself, for work with phases, branches or loops.

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

Typed results: a subtask may be an object {"prompt": "...", "schema": {...JSON Schema...}} \
instead of a string; its agent must then report `data` following that schema (checked; an \
invalid report is sent back to it, 3 attempts in all), and its result carries that data as \
JSON. Use it when you will compute with the results (counts, lists, scores).

Changing code: with "isolation": "worktree" (the default where agents may write), each \
agent works in its own copy of the working directory as it was when the call started, so \
agents never trample each other. Its change comes back as a patch; its verifier checks the \
change in that copy; and only a confirmed change is merged into the working directory, in \
subtask order, with a three-way merge. The result says, per subtask, what became of it: \
merged, conflict (the files; its patch is kept in a file you can read and apply yourself \
with git apply), not merged (refuted), refused, or no change. "isolation": "shared" lets \
every agent write the one working directory directly.

Scripts: pass {"script": "..."} instead of {"subtasks": [...]} (exactly one of the two) when \
later agents depend on earlier results. The script is plain Python run in a sandbox with no \
files, network or OS access; it may import only json, re, math, random, itertools, \
functools, collections, dataclasses, typing, bisect, copy and decimal. It drives agents \
through these functions, called directly (not awaited):
- agent(prompt, isolation=None, *, schema=None, agent=None, budget=None) -> dict: runs one \
agent (in the role named `agent`, if given; within `budget`, as a subtask's); returns \
its report {"summary", "findings"} (with a JSON Schema `schema`, also "data", a dict \
following it), or {"error", "status"} if it failed or was not run; with a change to the \
tree, also "change": what it changed.
- parallel(prompts, isolation=None, *, schema=None, agent=None, budget=None) -> list: runs \
the prompts as parallel agents; results in the same order; a prompt may be a {"prompt", \
"agent", "schema", "budget"} object. \
isolation is "worktree" or "shared", as for subtasks; an agent's change \
is merged at the end of the script, in the order the agents were started, once verify() \
confirmed it (or as the merge setting says).
- verify(prompt, result) -> dict: one agent tries to refute `result` (what agent(prompt) \
returned); adds "verdict": "confirmed", "refuted" or "unclear". Scripts verify only what \
they pass to verify().
- budget() -> dict: what is left of the session's budget and of this script's agents.
- log(text): a line you will see under the result.
The value of the script's last line, if it is an expression, is the tool result (as JSON). \
An agent's result is recorded under its prompt, so the same prompt returns the same result \
and a rerun after a crash repeats no finished agent. Limits on time, memory and the number \
of agents apply; an error in the script comes back with its line number.

Completeness critic as a script:
    areas = ["parsing", "storage", "the command line"]
    found = parallel(["Review " + a + " in src/ for defects." for a in areas])
    seen = "\\n".join(r.get("summary", "") for r in found)
    critic = agent("Others reviewed this code and reported:\\n" + seen +
                   "\\nFind the defects they missed; do not repeat theirs.")
    {"reviews": found, "missed": critic}

Multiphase sequencing as a script (understand, design, implement, review):
    facts = agent("Map how the cache module is used; cite file:line.")
    plan = agent("Design a fix for stale cache entries given: " + facts["summary"])
    done = agent("Implement this plan and run the tests: " + plan["summary"])
    check = verify("Implement this plan and run the tests: " + plan["summary"], done)
    if check.get("verdict") != "confirmed":
        done = agent("Fix what this review found: " + check.get("summary", ""))
    {"plan": plan, "change": done, "review": check}

Standing consent: while a system message confirms that orchestration mode is on, the \
opt-in is standing — author and run a workflow for every substantive task by default and \
lean toward adversarial verification; work alone only on conversational turns or trivial \
mechanical edits. When a system message says the mode is off, the opt-in rule above \
applies again."""

WORKFLOW_TOOL: ToolSchema = {
    "name": "Workflow",
    "description": WORKFLOW_DESCRIPTION,
    # The API refuses oneOf at the top of an input schema, so "exactly one of subtasks or
    # script" is stated in the descriptions and checked when the call arrives.
    "input_schema": {
        "type": "object",
        "properties": {
            "subtasks": {
                "type": "array",
                "items": {
                    "anyOf": [
                        {"type": "string"},
                        {
                            "type": "object",
                            "properties": {
                                "prompt": {"type": "string"},
                                "agent": {"type": "string"},
                                "schema": {"type": "object"},
                                "budget": {
                                    "type": "object",
                                    "properties": {
                                        "tokens": {"type": "integer", "minimum": 1},
                                        "usd": {"type": "number", "exclusiveMinimum": 0},
                                        "turns": {"type": "integer", "minimum": 1},
                                    },
                                },
                            },
                            "required": ["prompt"],
                        },
                    ]
                },
                "description": "Independent subtask prompts, one per parallel agent: a "
                'string, or {"prompt": "...", "agent": "<role>", "schema": {...}}: agent '
                "names a role this description lists under Roles, schema asks for a typed "
                "result whose data follows that JSON Schema, budget caps what its agent may "
                'spend ({"tokens": N, "usd": X, "turns": T}, any of them; it stops with what '
                "it has once spent). Give this or script, not both.",
            },
            "script": {
                "type": "string",
                "description": "A short Python program that starts agents with agent(), "
                "parallel() and verify() and ends with an expression: its value is the "
                "result. Give this or subtasks, not both.",
            },
            "isolation": {
                "type": "string",
                "enum": ["worktree", "shared"],
                "description": "Where agents that change files write: `worktree` (each in "
                "its own copy of the tree; changes merged back once verified) or `shared` "
                "(all in the one working directory). Default: the session's setting.",
            },
        },
    },
}

BASH_TOOL: ToolSchema = {"type": "bash_20250124", "name": "bash"}

REPORT_FINDINGS_TOOL: ToolSchema = {
    "name": "report_findings",
    "description": (
        "Report the result of your subtask. Call it exactly once, when you are done: it ends "
        "your subtask. Give findings you verified, not a narration of what you did."
    ),
    "input_schema": report_input_schema(),
}

MAIN_TOOLS: list[ToolSchema] = [WORKFLOW_TOOL, BASH_TOOL]
SUBAGENT_TOOLS: list[ToolSchema] = [BASH_TOOL, REPORT_FINDINGS_TOOL]

SUBAGENT_SYSTEM = """\
You are one agent in a larger parallel fan-out, and you have been given a single subtask. \
Investigate it directly in the shared working directory: check facts with bash instead of \
guessing, and cite the file and line or the command output behind each claim. Do not \
attempt work outside your subtask. Finish by calling report_findings exactly once; that \
call ends your subtask. Return findings, not narration."""

#: How a role's instructions follow orchmode's own rules in its agents' system prompt.
ROLE_INSTRUCTIONS = """

You work in the role `{name}`. The user wrote its instructions, below; follow them within \
the rules above, which still hold (report_findings ends your subtask).
<role-instructions>
{instructions}
</role-instructions>"""


def subagent_system(role: AgentDefinition | None = None) -> str:
    """A subagent's system prompt: orchmode's rules, then its role's instructions, if it
    has a role (they are added to the rules, never put in their place)."""
    if role is None or not role.instructions:
        return SUBAGENT_SYSTEM
    return SUBAGENT_SYSTEM + ROLE_INSTRUCTIONS.format(
        name=role.name, instructions=role.instructions
    )


#: How the Workflow tool's description lists the session's roles (agent definitions).
ROLES_SECTION = """

Roles: the user has defined these agents. Name one as a subtask's "agent" \
({{"prompt": "...", "agent": "<name>"}}, or agent= in a script) when its description fits \
the subtask; the agent then works with that role's instructions, tools and model.
{roles}"""


def workflow_tool(roles: Mapping[str, AgentDefinition]) -> ToolSchema:
    """The Workflow tool as a session with ``roles`` offers it: the same for the whole
    session, so the prompt cache holds (no roles: :data:`WORKFLOW_TOOL` itself)."""
    if not roles:
        return WORKFLOW_TOOL
    listed = ROLES_SECTION.format(roles=describe_roles(roles))
    return {**WORKFLOW_TOOL, "description": WORKFLOW_DESCRIPTION + listed}


def main_tools(roles: Mapping[str, AgentDefinition]) -> list[ToolSchema]:
    """What the main agent is offered before its MCP tools: Workflow and bash."""
    return [workflow_tool(roles), BASH_TOOL]


#: First words of every verification prompt; lets logs and scripted tests tell the waves apart.
VERIFY_MARKER = "Verify another agent's result."


def quote_result(result: str, limit: int, path: str | None) -> str:
    """A worker's result as its verifier's prompt quotes it: whole, or its first ``limit``
    characters and where the rest is (a result that fits is quoted exactly as it was, so
    its verifier's journal key does not change)."""
    if len(result) <= limit:
        return result
    where = f" The whole result is in {path}: read it with cat or jq." if path else ""
    return (
        f"{result[:limit]}\n[orchmode: the result is {len(result):,} characters long; only "
        f"its first {limit:,} are quoted here.{where}]"
    )


def change_note(describe: str, digest: str, base: str) -> str:
    """What a verifier is told of its worker's change to the tree (``digest`` names the
    patch, so a different change is a different verification in the journal)."""
    return f"""

It also changed the tree (patch {digest}): {describe}
You are in a read-only copy of the working directory with exactly that change in it, not \
committed: `git status` and `git diff {base[:12]}` (the tree before the change) show it. \
Check the change itself — read it, and run the tests that cover it. A change that is \
wrong, incomplete or breaks something is refuted, however good the report."""


def verify_prompt(subtask: str, result: str, change: str = "") -> str:
    """The second wave's prompt: try to refute one result (quoted with :func:`quote_result`),
    and the change to the tree it made, when it made one (see :func:`change_note`)."""
    return f"""{VERIFY_MARKER} Try hard to refute it.

The other agent was given this subtask:
<subtask>
{subtask}
</subtask>

It reported:
<result>
{result}
</result>{change}

Re-derive its claims yourself with bash and look for evidence that contradicts them. When \
you cannot confirm a claim, count it as refuted. Call report_findings once: begin the \
summary with `confirmed: <why>` or `refuted: <why>`, citing file:line or command output, \
and list each claim you checked as a finding."""


#: First words of every resolver's prompt; lets logs and scripted tests tell resolvers apart.
RESOLVE_MARKER = "Resolve a merge conflict."


def resolve_prompt(subtask: str, summary: str, before: str, messages: str, hunks: str) -> str:
    """A resolver's prompt: the subtask as it was given, what its worker said it did, what
    its change conflicts with, and every conflicted hunk with git's markers."""
    return f"""{RESOLVE_MARKER}

An agent was given this subtask:
<subtask>
{subtask}
</subtask>

It reported:
<result>
{summary}
</result>

Its change conflicts with the tree as merged so far ({before}). You are in a copy of that \
tree with the change merged in: where it merged cleanly it is already there, and where it \
did not, git's conflict markers are in the files. The part between `<<<<<<< as-merged` \
and `=======` is the tree as merged so far; the part between `=======` and `>>>>>>>` is \
this agent's change.
<conflicts>
{messages}
{hunks}
</conflicts>

Edit the files so that both intents hold: keep what the tree as merged so far already has, \
add what the subtask meant, remove every conflict marker and change nothing else. Check the \
result with bash (run the tests that cover it). Then call report_findings once: say in the \
summary how you resolved each conflict."""


def verify_resolution_prompt(
    subtask: str, summary: str, before: str, hunks: str, resolution: str, files: str
) -> str:
    """The prompt of a verifier that tries to refute a conflict's resolution, knowing both
    intents: the change's and that of the tree it conflicted with."""
    return f"""{VERIFY_MARKER} Try hard to refute it.

The other agent resolved a merge conflict. A change made for this subtask:
<subtask>
{subtask}
</subtask>
whose agent reported:
<result>
{summary}
</result>
conflicted with the tree as merged so far ({before}) here:
<conflicts>
{hunks}
</conflicts>

The resolver reported:
<result>
{resolution}
</result>
Its resolution changed: {files}
You are in a read-only copy of the working directory as it would be with the resolution \
in it. Check that both intents hold — nothing the tree as merged so far had is lost, and \
the subtask's change is there — that no conflict marker is left, and run the tests that \
cover it. Call report_findings once: begin the summary with `confirmed: <why>` or \
`refuted: <why>`, citing file:line or command output."""


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
