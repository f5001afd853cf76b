"""Every setting's field, with its type, default, help text and trust, grouped by what it governs.

:class:`~orchmode.core.settings.Settings` is made of these groups, in this order; the flags,
variables, TOML keys and the documented table follow the fields' order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from .pricing import ModelPrice, default_prices
from .secrets import DEFAULT_SECRET_FILES

Effort = Literal["low", "medium", "high", "xhigh", "max"]
#: Where model-written bash runs; see :mod:`orchmode.shell.sandbox`.
SandboxMode = Literal["workspace-write", "read-only", "off"]
NoticeDelivery = Literal["system", "user-text"]
#: Who makes room in a conversation that nears its window: the API first, or only orchmode.
ContextManagement = Literal["auto", "harness"]
#: Where subagents run: in this process, or on a Ray cluster's nodes.
ExecutorKind = Literal["local", "ray"]
#: Where a worker changes files: in the one working directory, or in a copy of its own.
Isolation = Literal["worktree", "shared"]
#: Which workers' changes are merged into the working directory.
MergePolicy = Literal["verified", "all", "none"]
#: What becomes of a change that conflicts: resolved by an agent, or kept as a patch.
ResolvePolicy = Literal["agent", "keep"]
#: What an agent's workspace is: an overlay where one can be made, or always a full copy.
WorkspaceKind = Literal["auto", "copy"]
#: Who serves the model: Anthropic's Messages API, Amazon Bedrock or Google Vertex AI.
Provider = Literal["anthropic", "bedrock", "vertex"]


#: How far a project's own ``orchmode.toml`` is believed for a setting when the user has not
#: trusted its directory; every field carries one (``json_schema_extra``), and
#: ``tests/test_trust.py`` fails for a field that does not.
TrustKind = Literal["safe", "protected", "cap"]
#: Which way a cap is stricter: a lower number (``None``, no limit, is the loosest; ``false``
#: is stricter than ``true``), a higher one, or more entries (a superset).
Stricter = Literal["lower", "higher", "more"]
#: Cannot weaken safety or spend more: read from any project, as before.
SAFE: dict[str, Any] = {"trust": "safe"}
#: Weakens the sandbox, runs a program, widens what agents reach, or sends the conversation
#: or a credential somewhere: read from a project only when its directory is trusted.
PROTECTED: dict[str, Any] = {"trust": "protected"}
#: A limit: from an untrusted project only where it is stricter than the user's own.
CAP: dict[str, Any] = {"trust": "cap", "stricter": "lower"}
CAP_HIGHER: dict[str, Any] = {"trust": "cap", "stricter": "higher"}
CAP_MORE: dict[str, Any] = {"trust": "cap", "stricter": "more"}


class ModelRequestKnobs(BaseModel):
    """The model each role runs on and how its requests are sent and retried."""

    model: str = Field(
        default="claude-opus-5-5",
        description="Model for the main agent, and for each role not given its own below "
        "(an ID, or `opus`, `sonnet`, `haiku` for the current one of each).",
        json_schema_extra=SAFE,
    )
    effort: Effort = Field(
        default="xhigh",
        description="`output_config.effort` sent on every request of a role not given its own.",
        json_schema_extra=SAFE,
    )
    worker_model: str | None = Field(
        default=None,
        description="Model for the workers (default: `model`).",
        json_schema_extra=SAFE,
    )
    verifier_model: str | None = Field(
        default=None,
        description="Model for the verifiers (default: `model`).",
        json_schema_extra=SAFE,
    )
    resolver_model: str | None = Field(
        default=None,
        description="Model for the conflict resolvers (default: `model`).",
        json_schema_extra=SAFE,
    )
    worker_effort: Effort | None = Field(
        default=None,
        description="`output_config.effort` of the workers (default: `effort`).",
        json_schema_extra=SAFE,
    )
    verifier_effort: Effort | None = Field(
        default=None,
        description="`output_config.effort` of the verifiers (default: `effort`).",
        json_schema_extra=SAFE,
    )
    max_tokens: int = Field(
        default=64000,
        gt=0,
        description="`max_tokens` of every model request.",
        json_schema_extra=CAP,
    )
    request_timeout: float = Field(
        default=600.0,
        gt=0,
        description="Seconds one model request may take.",
        json_schema_extra=SAFE,
    )
    max_retries: int = Field(
        default=2,
        ge=0,
        description="Retries of a model request that fails (5xx, timeout, connection).",
        json_schema_extra=SAFE,
    )
    overload_patience: float = Field(
        default=900.0,
        gt=0,
        description="Seconds a request keeps retrying while the API answers 429 or 529.",
        json_schema_extra=SAFE,
    )
    stream_retries: int = Field(
        default=3,
        ge=0,
        description="Retries of a response stream that breaks off part-way.",
        json_schema_extra=SAFE,
    )


class ShellKnobs(BaseModel):
    """bash and its sandbox: limits, network, permission rules, approvals, disk."""

    bash_timeout: float = Field(
        default=60.0, gt=0, description="Seconds one bash command may run.", json_schema_extra=CAP
    )
    output_limit: int = Field(
        default=8000,
        gt=0,
        description="Characters of tool output sent back.",
        json_schema_extra=CAP,
    )
    sandbox: SandboxMode = Field(
        default="workspace-write",
        description="Where bash runs: `workspace-write` is a bubblewrap sandbox (the host "
        "read-only, the working directory writable, a private /tmp and an empty home, no "
        "network); `read-only` makes the working directory read-only too; `off` runs "
        "commands unsandboxed with your own permissions.",
        json_schema_extra=PROTECTED,
    )
    allow_network: bool = Field(
        default=False,
        description="Give sandboxed commands the host's network (DNS, internet, loopback).",
        json_schema_extra=CAP,
    )
    network_allow: tuple[str, ...] = Field(
        default=(),
        description="Domains sandboxed commands may reach through orchmode's filtering proxy: "
        "names (`pypi.org`), wildcards (`*.pythonhosted.org`) or presets (`@python`, `@npm`, "
        "`@github`, `@rust`, `@go`); a list in `orchmode.toml` or separated by commas. Every "
        "domain not named is refused with an HTTP 403 naming this setting.",
        json_schema_extra=PROTECTED,
    )
    network_ask: tuple[str, ...] = Field(
        default=(),
        description="Domains a sandboxed command may reach once you approve (the agent waits, "
        "the others go on): the same patterns as `network_allow`.",
        json_schema_extra=CAP_MORE,
    )
    network_deny: tuple[str, ...] = Field(
        default=(),
        description="Domains never reached, whatever else allows them: the same patterns as "
        "`network_allow`.",
        json_schema_extra=CAP_MORE,
    )
    network_resolve: tuple[str, ...] = Field(
        default=(),
        description="Names the proxy resolves to a fixed address, `name=address` (as curl's "
        "`--resolve`): a package mirror on your network, or a test server.",
        json_schema_extra=PROTECTED,
    )
    permissions_allow: tuple[str, ...] = Field(
        default=(),
        description="Permission rules in Claude Code's format that allow without asking "
        "(`Bash(npm test:*)`, `WebFetch(domain:docs.python.org)`, `mcp__github__get_issue`), "
        "added to those of `.claude/settings.json`.",
        json_schema_extra=PROTECTED,
    )
    permissions_ask: tuple[str, ...] = Field(
        default=(),
        description="Permission rules whose matches wait for your approval (the same format).",
        json_schema_extra=CAP_MORE,
    )
    permissions_deny: tuple[str, ...] = Field(
        default=(),
        description="Permission rules whose matches are refused, whatever allows them.",
        json_schema_extra=CAP_MORE,
    )
    approvals: Literal["ask", "deny", "allow"] = Field(
        default="ask",
        description="What an `ask` rule does: wait for your answer (`ask`; the agent is parked, "
        "the others go on), refuse at once (`deny`, for runs nobody watches), or allow.",
        json_schema_extra=PROTECTED,
    )
    approval_timeout: float = Field(
        default=600.0,
        gt=0,
        description="Seconds an approval waits for an answer before it counts as denied.",
        json_schema_extra=CAP,
    )
    sandbox_cpu_seconds: int = Field(
        default=300,
        gt=0,
        description="CPU seconds each process in the sandbox may use (RLIMIT_CPU); the shell "
        "itself counts too, so a shell that used them up is restarted.",
        json_schema_extra=CAP,
    )
    sandbox_memory_mb: int = Field(
        default=4096,
        gt=0,
        description="Megabytes of memory one sandboxed shell may use with everything it runs "
        "(a cgroup where orchmode can make one, else each process's RLIMIT_DATA); its "
        "private /tmp holds half as much.",
        json_schema_extra=CAP,
    )
    sandbox_processes: int = Field(
        default=512,
        ge=8,
        description="Processes and threads one sandboxed shell may run at once (a cgroup's "
        "pids.max where orchmode can make one, else RLIMIT_NPROC in the sandbox's user "
        "namespace).",
        json_schema_extra=CAP,
    )
    sandbox_bwrap: str = Field(
        default="bwrap",
        description="The bubblewrap binary: a name looked up on PATH, or a path.",
        json_schema_extra=PROTECTED,
    )
    sandbox_unix_sockets: tuple[str, ...] | Literal["all"] = Field(
        default=(),
        description="Unix sockets sandboxed commands may connect to (paths, a list in "
        "`orchmode.toml` or separated by commas), such as a test database's; every other is "
        "refused by the sandbox's seccomp filter. `all` lifts the block on Unix sockets.",
        json_schema_extra=PROTECTED,
    )
    agent_write_mb: int = Field(
        default=2048,
        gt=0,
        description="Megabytes one agent may write in its workspace (what it adds or changes, "
        "not the tree it starts from); past it the agent is stopped with a clear result and "
        "what it did so far is kept.",
        json_schema_extra=CAP,
    )
    min_free_disk_mb: int = Field(
        default=1024,
        ge=0,
        description="Megabytes of free disk below which agents writing to their workspaces "
        "are stopped, with a clear result, before the disk fills.",
        json_schema_extra=CAP_HIGHER,
    )
    change_file_max_mb: int = Field(
        default=100,
        gt=0,
        description="Megabytes one file in an agent's change may hold; a larger file is left "
        "out of the change and named in the worker's result (the rest is kept).",
        json_schema_extra=CAP,
    )


class FanoutKnobs(BaseModel):
    """The fan-out: concurrency, turns, the mode, verification, merging, scripts."""

    max_concurrent: int = Field(
        default=10,
        gt=0,
        description="Subagents in flight at once, and the ceiling of model requests in "
        "flight (lowered automatically while the API answers 429 or 529).",
        json_schema_extra=CAP,
    )
    max_subtasks: int = Field(
        default=200, gt=0, description="Subtasks run per Workflow call.", json_schema_extra=CAP
    )
    subagent_turns: int = Field(
        default=15, gt=0, description="Model turns per subagent.", json_schema_extra=CAP
    )
    main_turns: int = Field(
        default=30, gt=0, description="Model calls per main-agent user turn.", json_schema_extra=CAP
    )
    refresh_every: int = Field(
        default=10, gt=0, description="User turns between mode refreshers.", json_schema_extra=SAFE
    )
    mode: bool = Field(
        default=True,
        description="Start sessions with orchestration mode on.",
        json_schema_extra=SAFE,
    )
    verify: bool = Field(
        default=True, description="Run the adversarial verification wave.", json_schema_extra=SAFE
    )
    isolation: Isolation = Field(
        default="worktree",
        description="Where workers change files under `--sandbox workspace-write`: "
        "`worktree` gives each its own copy of the tree and merges its change back as a "
        "patch; `shared` lets them all write the working directory at once. A Workflow "
        "call may choose for itself.",
        json_schema_extra=SAFE,
    )
    merge: MergePolicy = Field(
        default="verified",
        description="With `worktree` isolation, whose changes are merged into the working "
        "directory: `verified` only those their verifier confirmed, `all` every one that "
        "applies, `none` no one (every patch is kept as a file).",
        json_schema_extra=SAFE,
    )
    resolve: ResolvePolicy = Field(
        default="agent",
        description="With `worktree` isolation, what becomes of a change to be merged that "
        "conflicts with those merged before it or with your edits: `agent` gives it to a "
        "resolver agent, whose resolution is verified again and merged only if confirmed; "
        "`keep` keeps it as a patch file.",
        json_schema_extra=SAFE,
    )
    workspaces: WorkspaceKind = Field(
        default="auto",
        description="What each agent's copy of the tree is under `worktree` isolation: "
        "`auto` a copy-on-write overlay on one checkout of the tree where the kernel allows "
        "it (else full copies, said once); `copy` always a full copy.",
        json_schema_extra=SAFE,
    )
    notice_delivery: NoticeDelivery = Field(
        default="system",
        description="How mode notices reach the model: `system` messages in the conversation "
        "(the Messages API), or `user-text`, a marked block in the user's turn, for "
        "compatible endpoints that refuse mid-conversation system messages.",
        json_schema_extra=SAFE,
    )
    script_timeout: float = Field(
        default=3600.0,
        gt=0,
        description="Wall-clock seconds a Workflow script may take in all, its agents' work "
        "included; past it the agents still running are stopped.",
        json_schema_extra=CAP,
    )
    script_cpu_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Seconds a Workflow script's own code may run, time spent waiting on its "
        "agents not counted; stops a loop that never ends.",
        json_schema_extra=CAP,
    )
    script_memory_mb: int = Field(
        default=64,
        gt=0,
        description="Megabytes of memory a Workflow script's interpreter may use.",
        json_schema_extra=CAP,
    )
    script_recursion_limit: int = Field(
        default=200,
        gt=0,
        description="How deeply a Workflow script's function calls may nest.",
        json_schema_extra=CAP,
    )
    script_max_agents: int = Field(
        default=100,
        gt=0,
        description="Agents one Workflow script may start (each agent, verify and parallel "
        "prompt counts, journal hits included, so a rerun takes the same path).",
        json_schema_extra=CAP,
    )


class RunKnobs(BaseModel):
    """The run's store, budget caps, context window and prices."""

    store: str | None = Field(
        default=None,
        description="Where results, claims and the budget live: `sqlite:///path` or "
        "`postgresql://user:password@host/db` (default: the journal file below).",
        json_schema_extra=PROTECTED,
    )
    journal: Path | None = Field(
        default=None,
        description="SQLite journal file when no store is given (default "
        "`.orchmode/journal.db` in the working directory; `ORCH_JOURNAL` also works).",
        json_schema_extra=PROTECTED,
    )
    session: str | None = Field(
        default=None,
        description="Session name: its budget ledger is kept under it (default: a new one).",
        json_schema_extra=SAFE,
    )
    max_subagents: int = Field(
        default=500,
        gt=0,
        description="Subagents a session may launch, workers and verifiers both.",
        json_schema_extra=CAP,
    )
    max_session_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Tokens a session may use in all (input, output and cache).",
        json_schema_extra=CAP,
    )
    max_cost: float | None = Field(
        default=None,
        gt=0,
        description="Dollars a session may spend, at the prices below.",
        json_schema_extra=CAP,
    )
    context_window: int | None = Field(
        default=None,
        ge=1000,
        description="Tokens the model's context window holds (default: the model's, from the "
        "table next to the prices; 200000 for current models).",
        json_schema_extra=SAFE,
    )
    workflow_result_tokens: int | None = Field(
        default=None,
        gt=0,
        description="The most tokens one Workflow result may take in the conversation "
        "(default: a quarter of the context window); never more than the room left in the "
        "window. A larger result is condensed; every full report stays on disk.",
        json_schema_extra=SAFE,
    )
    verify_quote_tokens: int | None = Field(
        default=None,
        gt=0,
        description="The most tokens of a worker's result that its verifier's prompt quotes "
        "(default: a twentieth of the context window); the rest is read from its file.",
        json_schema_extra=SAFE,
    )
    compact_at: float = Field(
        default=0.8,
        gt=0,
        lt=1,
        description="Share of the context window past which a conversation is compacted "
        "before its next request.",
        json_schema_extra=SAFE,
    )
    compact_to: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description="Share of the context window a compaction brings the conversation down to "
        "(far below `compact_at`, so compactions are rare and the cached prefix is rebuilt "
        "seldom).",
        json_schema_extra=SAFE,
    )
    context_management: ContextManagement = Field(
        default="auto",
        description="Who makes room before the window overflows: `auto` asks the API's "
        "context editing (beta `clear_tool_uses_20250919`) first and falls back to "
        "orchmode's own compaction where an endpoint refuses the beta; `harness` never "
        "sends the beta.",
        json_schema_extra=SAFE,
    )
    prices: dict[str, ModelPrice] = Field(
        default_factory=default_prices,
        description="Dollars per million tokens per model: input, output, cache_write, "
        "cache_read (defaults for current models; in a TOML file only).",
        json_schema_extra={"flag": False, **PROTECTED},
    )


class ServiceKnobs(BaseModel):
    """Where agents run and what they reach: executor, provider, MCP, tracing, secrets."""

    executor: ExecutorKind = Field(
        default="local",
        description="Where subagents run: `local` (this process) or `ray` (async actors on "
        "a Ray cluster's nodes; needs `pip install 'orchmode[ray]'` and a PostgreSQL store).",
        json_schema_extra=PROTECTED,
    )
    ray_address: str = Field(
        default="auto",
        description="The Ray cluster to join: `auto` (the one `ray start` began on this "
        "machine, or `RAY_ADDRESS`) or `host:port` of its head node.",
        json_schema_extra=PROTECTED,
    )
    ray_actors: int = Field(
        default=1,
        gt=0,
        description="Ray actors per node; each runs many subagents as coroutines.",
        json_schema_extra=SAFE,
    )
    ray_max_per_actor: int = Field(
        default=500,
        gt=0,
        description="Subagents one Ray actor runs at once.",
        json_schema_extra=SAFE,
    )
    ray_max_upload_mb: float = Field(
        default=100.0,
        gt=0,
        description="Megabytes of working directory (after `.gitignore`) shipped to the "
        "Ray nodes; a larger one is refused before anything runs.",
        json_schema_extra=CAP,
    )
    claim_lease: float = Field(
        default=30.0,
        gt=0,
        description="Seconds a claim on a running subtask lasts unless renewed; a crashed "
        "holder's subtasks are taken over after this.",
        json_schema_extra=SAFE,
    )
    fresh: bool = Field(
        default=False,
        description="Ignore recorded results; recompute every subagent.",
        json_schema_extra=CAP,
    )
    provider: Provider = Field(
        default="anthropic",
        description="Who serves the model: `anthropic` (the Messages API), `bedrock` (Amazon "
        "Bedrock; region and credentials from the AWS chain) or `vertex` (Google Vertex AI; "
        "project, region and credentials from Google's). Needs `orchmode[bedrock]` or "
        "`orchmode[vertex]`.",
        json_schema_extra=PROTECTED,
    )
    base_url: str | None = Field(
        default=None,
        description="Messages API endpoint (default: `ANTHROPIC_BASE_URL` or Anthropic's).",
        json_schema_extra=PROTECTED,
    )
    mcp_config: Path | None = Field(
        default=None,
        description="A JSON file of MCP servers in the shape of `.mcp.json` (`mcpServers`); "
        "their tools are offered to the agents. Never read unless named here.",
        json_schema_extra=PROTECTED,
    )
    agents_dir: Path | None = Field(
        default=None,
        description="A directory of agent definitions (`*.md` in Claude Code's format) read "
        "besides `.claude/agents/` and `~/.claude/agents/`; on a name clash its own win. "
        "Relative to the working directory.",
        json_schema_extra=PROTECTED,
    )
    mcp_timeout: float = Field(
        default=120.0,
        gt=0,
        description="Seconds one MCP tool call (or a server's start) may take.",
        json_schema_extra=SAFE,
    )
    otlp_endpoint: str | None = Field(
        default=None,
        description="Export OpenTelemetry traces over OTLP/HTTP to this endpoint (its base, "
        "e.g. `http://localhost:4318`; `/v1/traces` is added). Without it, traces are on "
        "when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set. "
        "Needs `orchmode[otel]`.",
        json_schema_extra=PROTECTED,
    )
    trace_content: bool = Field(
        default=False,
        description="Put prompts, replies and command output in trace spans (secrets masked); "
        "without it spans hold names, sizes, tokens and timings only.",
        json_schema_extra=CAP,
    )
    secret_files: tuple[str, ...] = Field(
        default=DEFAULT_SECRET_FILES,
        description="Files withheld from every agent (a note in their place; never in a "
        "snapshot, a change or the journal) and whose values are masked in all that reaches "
        "the model: `.gitignore`-style patterns, a list in `orchmode.toml` or separated by "
        "commas; empty (`[]`) withholds nothing.",
        json_schema_extra=CAP_MORE,
    )
    workdir: Path | None = Field(
        default=None,
        description="Directory bash runs in (default: the current directory).",
        json_schema_extra=PROTECTED,
    )
    test_mode: bool = Field(
        default=False,
        description="Small limits (2 subtasks, 1 turn each) in a throw-away fixture directory.",
        json_schema_extra=SAFE,
    )
