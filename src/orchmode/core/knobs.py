"""Every setting's field, with its type, default, help text and trust, grouped by what it governs.

:class:`~orchmode.core.settings.Settings` is made of these groups, in this order; the flags,
variables, TOML keys and the documented table follow the fields' order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
#: Whose requests go through the Message Batches API: none, the verifiers', or every subagent's.
BatchMode = Literal["off", "verifiers", "subagents"]
#: Who serves the model: Anthropic's Messages API, Amazon Bedrock or Google Vertex AI.
Provider = Literal["anthropic", "bedrock", "vertex"]


#: How far a project's own ``orchmode.toml`` is believed for a setting when the user has not
#: trusted its directory; every field carries one (``json_schema_extra``), and
#: ``tests/test_trust.py`` fails for a field that does not.
TrustKind = Literal["safe", "protected", "cap"]
#: Which way a cap is stricter: a lower number (``None``, no limit, is the loosest; ``false``
#: is stricter than ``true``), a higher one, or more entries (a superset).
Stricter = Literal["lower", "higher", "more"]


def safe(default: Any, *, bare: str | None = None, **limits: Any) -> Any:
    """A setting that cannot weaken safety or spend more: read from any project.

    ``bare`` is the value its flag takes when given without one (``--batch``)."""
    extra: dict[str, Any] = {"trust": "safe"}
    if bare is not None:
        extra["bare"] = bare
    return Field(default, json_schema_extra=extra, **limits)


def protected(default: Any, **limits: Any) -> Any:
    """A setting that weakens the sandbox, runs a program, widens what agents reach, or sends
    the conversation or a credential somewhere: read from a project only once it is trusted."""
    return Field(default, json_schema_extra={"trust": "protected"}, **limits)


def cap(default: Any, stricter: Stricter = "lower", **limits: Any) -> Any:
    """A limit: read from an untrusted project only where it is stricter than the user's own."""
    return Field(default, json_schema_extra={"trust": "cap", "stricter": stricter}, **limits)


class Knobs(BaseModel):
    """A group of settings; each field's help text is the docstring under it."""

    model_config = ConfigDict(use_attribute_docstrings=True)


class ModelRequestKnobs(Knobs):
    """The model each role runs on and how its requests are sent and retried."""

    model: str = safe("claude-opus-5-5")
    """Model for the main agent, and for each role not given its own below (an ID, or
    `opus`, `sonnet`, `haiku` for the current one of each)."""
    effort: Effort = safe("xhigh")
    """`output_config.effort` sent on every request of a role not given its own."""
    worker_model: str | None = safe(None)
    """Model for the workers (default: `model`)."""
    verifier_model: str | None = safe(None)
    """Model for the verifiers (default: `model`)."""
    resolver_model: str | None = safe(None)
    """Model for the conflict resolvers (default: `model`)."""
    worker_effort: Effort | None = safe(None)
    """`output_config.effort` of the workers (default: `effort`)."""
    verifier_effort: Effort | None = safe(None)
    """`output_config.effort` of the verifiers (default: `effort`)."""
    max_tokens: int = cap(64000, gt=0)
    """`max_tokens` of every model request."""
    request_timeout: float = safe(600.0, gt=0)
    """Seconds one model request may take."""
    max_retries: int = safe(2, ge=0)
    """Retries of a model request that fails (5xx, timeout, connection)."""
    overload_patience: float = safe(900.0, gt=0)
    """Seconds a request keeps retrying while the API answers 429 or 529."""
    stream_retries: int = safe(3, ge=0)
    """Retries of a response stream that breaks off part-way."""
    batch: BatchMode = safe("off", bare="subagents")
    """Send subagents' requests through the Message Batches API, at half the price, each
    turn waiting for its batch to end (minutes; up to a day): `off`, `verifiers`, or
    `subagents` (workers, verifiers and resolvers; what `--batch` alone means). The main
    agent is always answered at once."""
    batch_window: float = safe(2.0, gt=0)
    """Seconds the requests that become ready after the first are gathered into its batch."""
    batch_max_requests: int = safe(10000, gt=0, le=100_000)
    """Requests in one batch at the most (the API takes up to 100,000, and 256 MB)."""
    batch_poll: float = safe(5.0, gt=0)
    """Seconds before a batch is first looked at; later looks come a twentieth of its age
    apart (a minute at the most), so an ended batch is seen within a twentieth of its run."""
    batch_timeout: float = cap(86400.0, gt=0, stricter="higher")
    """Seconds a turn waits on its batch before it is asked interactively instead, at the
    full price (a request still in its batch may then be paid for twice)."""


class ShellKnobs(Knobs):
    """bash and its sandbox: limits, network, permission rules, approvals, disk."""

    bash_timeout: float = cap(60.0, gt=0)
    """Seconds one bash command may run."""
    output_limit: int = cap(8000, gt=0)
    """Characters of tool output sent back."""
    sandbox: SandboxMode = protected("workspace-write")
    """Where bash runs: `workspace-write` is a bubblewrap sandbox (the host read-only, the
    working directory writable, a private /tmp and an empty home, no network); `read-only`
    makes the working directory read-only too; `off` runs commands unsandboxed with your own
    permissions."""
    allow_network: bool = cap(False)
    """Give sandboxed commands the host's network (DNS, internet, loopback)."""
    network_allow: tuple[str, ...] = protected(())
    """Domains sandboxed commands may reach through orchmode's filtering proxy: names
    (`pypi.org`), wildcards (`*.pythonhosted.org`) or presets (`@python`, `@npm`, `@github`,
    `@rust`, `@go`); a list in `orchmode.toml` or separated by commas. Every domain not
    named is refused with an HTTP 403 naming this setting."""
    network_ask: tuple[str, ...] = cap((), stricter="more")
    """Domains a sandboxed command may reach once you approve (the agent waits, the others
    go on): the same patterns as `network_allow`."""
    network_deny: tuple[str, ...] = cap((), stricter="more")
    """Domains never reached, whatever else allows them: the same patterns as
    `network_allow`."""
    network_resolve: tuple[str, ...] = protected(())
    """Names the proxy resolves to a fixed address, `name=address` (as curl's `--resolve`):
    a package mirror on your network, or a test server."""
    permissions_allow: tuple[str, ...] = protected(())
    """Permission rules in Claude Code's format that allow without asking (`Bash(npm
    test:*)`, `WebFetch(domain:docs.python.org)`, `mcp__github__get_issue`), added to those
    of `.claude/settings.json`."""
    permissions_ask: tuple[str, ...] = cap((), stricter="more")
    """Permission rules whose matches wait for your approval (the same format)."""
    permissions_deny: tuple[str, ...] = cap((), stricter="more")
    """Permission rules whose matches are refused, whatever allows them."""
    approvals: Literal["ask", "deny", "allow"] = protected("ask")
    """What an `ask` rule does: wait for your answer (`ask`; the agent is parked, the others
    go on), refuse at once (`deny`, for runs nobody watches), or allow."""
    approval_timeout: float = cap(600.0, gt=0)
    """Seconds an approval waits for an answer before it counts as denied."""
    sandbox_cpu_seconds: int = cap(300, gt=0)
    """CPU seconds each process in the sandbox may use (RLIMIT_CPU); the shell itself counts
    too, so a shell that used them up is restarted."""
    sandbox_memory_mb: int = cap(4096, gt=0)
    """Megabytes of memory one sandboxed shell may use with everything it runs (a cgroup
    where orchmode can make one, else each process's RLIMIT_DATA); its private /tmp holds
    half as much."""
    sandbox_processes: int = cap(512, ge=8)
    """Processes and threads one sandboxed shell may run at once (a cgroup's pids.max where
    orchmode can make one, else RLIMIT_NPROC in the sandbox's user namespace)."""
    sandbox_bwrap: str = protected("bwrap")
    """The bubblewrap binary: a name looked up on PATH, or a path."""
    sandbox_unix_sockets: tuple[str, ...] | Literal["all"] = protected(())
    """Unix sockets sandboxed commands may connect to (paths, a list in `orchmode.toml` or
    separated by commas), such as a test database's; every other is refused by the sandbox's
    seccomp filter. `all` lifts the block on Unix sockets."""
    agent_write_mb: int = cap(2048, gt=0)
    """Megabytes one agent may write in its workspace (what it adds or changes, not the tree
    it starts from); past it the agent is stopped with a clear result and what it did so far
    is kept."""
    min_free_disk_mb: int = cap(1024, ge=0, stricter="higher")
    """Megabytes of free disk below which agents writing to their workspaces are stopped,
    with a clear result, before the disk fills."""
    change_file_max_mb: int = cap(100, gt=0)
    """Megabytes one file in an agent's change may hold; a larger file is left out of the
    change and named in the worker's result (the rest is kept)."""


class FanoutKnobs(Knobs):
    """The fan-out: concurrency, turns, the mode, verification, merging, scripts."""

    max_concurrent: int = cap(10, gt=0)
    """Subagents in flight at once, and the ceiling of model requests in flight (lowered
    automatically while the API answers 429 or 529)."""
    max_subtasks: int = cap(1000, gt=0)
    """Subtasks run per Workflow call; the session's `max_subagents` caps what they launch
    (a subtask with a verifier is two)."""
    max_depth: int = cap(2, gt=0)
    """How deep a tree of agents may grow: 1 lets only the main agent call Workflow; 2 lets
    its workers fan out once more, and so on. Not on the Ray executor (always 1 there)."""
    subagent_turns: int = cap(15, gt=0)
    """Model turns per subagent."""
    agent_max_tokens: int | None = cap(None, gt=0)
    """Tokens each subagent may use (input, output and cache), unless its subtask gives it
    a budget; an agent that reaches it stops with what it has (status `budget`)."""
    agent_max_cost: float | None = cap(None, gt=0)
    """Dollars each subagent may spend, at the prices below, unless its subtask gives it a
    budget."""
    main_turns: int = cap(30, gt=0)
    """Model calls per main-agent user turn."""
    refresh_every: int = safe(10, gt=0)
    """User turns between mode refreshers."""
    mode: bool = safe(True)
    """Start sessions with orchestration mode on."""
    verify: bool = safe(True)
    """Run the adversarial verification wave."""
    isolation: Isolation = safe("worktree")
    """Where workers change files under `--sandbox workspace-write`: `worktree` gives each
    its own copy of the tree and merges its change back as a patch; `shared` lets them all
    write the working directory at once. A Workflow call may choose for itself."""
    merge: MergePolicy = safe("verified")
    """With `worktree` isolation, whose changes are merged into the working directory:
    `verified` only those their verifier confirmed, `all` every one that applies, `none` no
    one (every patch is kept as a file)."""
    resolve: ResolvePolicy = safe("agent")
    """With `worktree` isolation, what becomes of a change to be merged that conflicts with
    those merged before it or with your edits: `agent` gives it to a resolver agent, whose
    resolution is verified again and merged only if confirmed; `keep` keeps it as a patch
    file."""
    workspaces: WorkspaceKind = safe("auto")
    """What each agent's copy of the tree is under `worktree` isolation: `auto` a
    copy-on-write overlay on one checkout of the tree where the kernel allows it (else full
    copies, said once); `copy` always a full copy."""
    notice_delivery: NoticeDelivery = safe("system")
    """How mode notices reach the model: `system` messages in the conversation (the Messages
    API), or `user-text`, a marked block in the user's turn, for compatible endpoints that
    refuse mid-conversation system messages."""
    script_timeout: float = cap(3600.0, gt=0)
    """Wall-clock seconds a Workflow script may take in all, its agents' work included; past
    it the agents still running are stopped."""
    script_cpu_seconds: float = cap(10.0, gt=0)
    """Seconds a Workflow script's own code may run, time spent waiting on its agents not
    counted; stops a loop that never ends."""
    script_memory_mb: int = cap(64, gt=0)
    """Megabytes of memory a Workflow script's interpreter may use."""
    script_recursion_limit: int = cap(200, gt=0)
    """How deeply a Workflow script's function calls may nest."""
    script_max_agents: int = cap(100, gt=0)
    """Agents one Workflow script may start (each agent, verify and parallel prompt counts,
    journal hits included, so a rerun takes the same path)."""


class RunKnobs(Knobs):
    """The run's store, budget caps, context window and prices."""

    store: str | None = protected(None)
    """Where results, claims and the budget live: `sqlite:///path` or
    `postgresql://user:password@host/db` (default: the journal file below)."""
    journal: Path | None = protected(None)
    """SQLite journal file when no store is given (default `.orchmode/journal.db` in the
    working directory; `ORCH_JOURNAL` also works)."""
    session: str | None = safe(None)
    """Session name: its budget ledger is kept under it (default: a new one)."""
    max_subagents: int = cap(500, gt=0)
    """Subagents a session may launch, workers and verifiers both."""
    max_session_tokens: int | None = cap(None, gt=0)
    """Tokens a session may use in all (input, output and cache)."""
    max_cost: float | None = cap(None, gt=0)
    """Dollars a session may spend, at the prices below."""
    context_window: int | None = safe(None, ge=1000)
    """Tokens the model's context window holds (default: the model's, from the table next to
    the prices; 200000 for current models)."""
    workflow_result_tokens: int | None = safe(None, gt=0)
    """The most tokens one Workflow result may take in the conversation (default: a quarter
    of the context window); never more than the room left in the window. A larger result is
    condensed; every full report stays on disk."""
    verify_quote_tokens: int | None = safe(None, gt=0)
    """The most tokens of a worker's result that its verifier's prompt quotes (default: a
    twentieth of the context window); the rest is read from its file."""
    compact_at: float = safe(0.8, gt=0, lt=1)
    """Share of the context window past which a conversation is compacted before its next
    request."""
    compact_to: float = safe(0.5, gt=0, lt=1)
    """Share of the context window a compaction brings the conversation down to (far below
    `compact_at`, so compactions are rare and the cached prefix is rebuilt seldom)."""
    context_management: ContextManagement = safe("auto")
    """Who makes room before the window overflows: `auto` asks the API's context editing
    (beta `clear_tool_uses_20250919`) first and falls back to orchmode's own compaction
    where an endpoint refuses the beta; `harness` never sends the beta."""
    prices: dict[str, ModelPrice] = Field(
        default_factory=default_prices, json_schema_extra={"flag": False, "trust": "protected"}
    )
    """Dollars per million tokens per model: input, output, cache_write, cache_read, and per
    thousand web searches, web_search (defaults for current models; in a TOML file only)."""


class ServiceKnobs(Knobs):
    """Where agents run and what they reach: executor, provider, MCP, tracing, secrets."""

    executor: ExecutorKind = protected("local")
    """Where subagents run: `local` (this process) or `ray` (async actors on a Ray cluster's
    nodes; needs `pip install 'orchmode[ray]'` and a PostgreSQL store)."""
    ray_address: str = protected("auto")
    """The Ray cluster to join: `auto` (the one `ray start` began on this machine, or
    `RAY_ADDRESS`) or `host:port` of its head node."""
    ray_actors: int = safe(1, gt=0)
    """Ray actors per node; each runs many subagents as coroutines."""
    ray_max_per_actor: int = safe(500, gt=0)
    """Subagents one Ray actor runs at once."""
    ray_max_upload_mb: float = cap(100.0, gt=0)
    """Megabytes of working directory (after `.gitignore`) shipped to the Ray nodes; a
    larger one is refused before anything runs."""
    claim_lease: float = safe(30.0, gt=0)
    """Seconds a claim on a running subtask lasts unless renewed; a crashed holder's
    subtasks are taken over after this."""
    fresh: bool = cap(False)
    """Ignore recorded results; recompute every subagent."""
    provider: Provider = protected("anthropic")
    """Who serves the model: `anthropic` (the Messages API), `bedrock` (Amazon Bedrock;
    region and credentials from the AWS chain) or `vertex` (Google Vertex AI; project,
    region and credentials from Google's). Needs `orchmode[bedrock]` or `orchmode[vertex]`."""
    base_url: str | None = protected(None)
    """Messages API endpoint (default: `ANTHROPIC_BASE_URL` or Anthropic's)."""
    mcp_config: Path | None = protected(None)
    """A JSON file of MCP servers in the shape of `.mcp.json` (`mcpServers`); their tools
    are offered to the agents. Never read unless named here."""
    agents_dir: Path | None = protected(None)
    """A directory of agent definitions (`*.md` in Claude Code's format) read besides
    `.claude/agents/` and `~/.claude/agents/`; on a name clash its own win. Relative to the
    working directory."""
    main_web_tools: tuple[str, ...] = protected(())
    """Anthropic's server-side web tools the main agent is offered, by Claude Code's names:
    `WebSearch`, `WebFetch` (a role is offered those its `tools` name). They run on the
    API's side, within the domains of `network_allow`/`network_deny` and the
    `WebFetch(domain:...)` rules; each search is billed (see `prices`)."""
    web_max_uses: int = cap(5, gt=0)
    """Searches or fetches one model request may make with each web tool (`max_uses`)."""
    mcp_timeout: float = safe(120.0, gt=0)
    """Seconds one MCP tool call (or a server's start) may take."""
    otlp_endpoint: str | None = protected(None)
    """Export OpenTelemetry traces over OTLP/HTTP to this endpoint (its base, e.g.
    `http://localhost:4318`; `/v1/traces` is added). Without it, traces are on when
    `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set. Needs
    `orchmode[otel]`."""
    trace_content: bool = cap(False)
    """Put prompts, replies and command output in trace spans (secrets masked); without it
    spans hold names, sizes, tokens and timings only."""
    secret_files: tuple[str, ...] = cap(DEFAULT_SECRET_FILES, stricter="more")
    """Files withheld from every agent (a note in their place; never in a snapshot, a change
    or the journal) and whose values are masked in all that reaches the model:
    `.gitignore`-style patterns, a list in `orchmode.toml` or separated by commas; empty
    (`[]`) withholds nothing."""
    workdir: Path | None = protected(None)
    """Directory bash runs in (default: the current directory)."""
    test_mode: bool = safe(False)
    """Small limits (2 subtasks, 1 turn each) in a throw-away fixture directory."""
