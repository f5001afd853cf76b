"""Every knob with its default, in one definition, and the layers that set it.

flags > ``ORCHMODE_*`` environment > the project's ``orchmode.toml`` (as far as it is trusted)
> the user's own ``config.toml`` > defaults.

The command-line flags, the ``ORCHMODE_*`` variables, the TOML keys, the settings table of
docs/configuration.md and ``--help`` are all derived from the fields of :class:`Settings`, so
they cannot drift apart. So is how far a project's own ``orchmode.toml`` is believed for each
setting (its ``trust`` marker): a repository under review must not be able to loosen the
sandbox, start programs, send the conversation or a key elsewhere, or spend more, unless the
user trusted its directory (``orchmode trust``, :mod:`orchmode.core.trust`).
"""

from __future__ import annotations

import os
import shlex
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ConfigError
from .events import Role
from .pricing import ModelPrice, context_window_of, default_prices, model_id
from .secrets import DEFAULT_SECRET_FILES
from .trust import Verdict, digest, fingerprint, read_records, verdict
from .wording import listed

#: A project's own settings file, in the directory orchmode runs in.
CONFIG_FILE = "orchmode.toml"
#: The user's own settings file, in :func:`user_config_dir`.
USER_CONFIG_FILE = "config.toml"
ENV_PREFIX = "ORCHMODE_"
#: Older name for the journal path, honoured for compatibility with the original design.
LEGACY_JOURNAL_ENV = "ORCH_JOURNAL"

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


class Settings(BaseModel):
    """The effective configuration of one orchmode process."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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

    @field_validator(
        "network_allow",
        "network_ask",
        "network_deny",
        "network_resolve",
        "permissions_allow",
        "permissions_ask",
        "permissions_deny",
        mode="before",
    )
    @classmethod
    def _listed(cls, value: Any) -> Any:
        """A flag or variable gives a list as one string, separated by commas."""
        if isinstance(value, str):
            return tuple(p.strip() for p in value.split(",") if p.strip())
        return value

    @field_validator("secret_files", mode="before")
    @classmethod
    def _patterns(cls, value: Any) -> Any:
        """A flag or variable gives the patterns as one string, separated by commas."""
        if isinstance(value, str):
            return tuple(p.strip() for p in value.split(",") if p.strip())
        return value

    @field_validator("sandbox_unix_sockets", mode="before")
    @classmethod
    def _socket_paths(cls, value: Any) -> Any:
        """A flag or variable gives the paths as one string, separated by commas."""
        if isinstance(value, str) and value.strip() != "all":
            return tuple(p.strip() for p in value.split(",") if p.strip())
        if isinstance(value, str):
            return "all"
        return value

    @field_validator("sandbox_unix_sockets")
    @classmethod
    def _absolute_sockets(cls, value: tuple[str, ...] | str) -> tuple[str, ...] | str:
        if isinstance(value, str):
            return value
        for path in value:
            if not path.startswith("/") or "\0" in path:
                raise ValueError(f"{path!r} is not an absolute path (or `all`)")
        return value

    @field_validator("secret_files")
    @classmethod
    def _valid_patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            if not pattern.strip("/") or "\0" in pattern:
                raise ValueError(f"{pattern!r} is not a file pattern")
        return value

    @field_validator("model", "worker_model", "verifier_model", "resolver_model")
    @classmethod
    def _model_ids(cls, value: str | None) -> str | None:
        """An alias (``opus``, ``sonnet``, ``haiku``) becomes the model ID it stands for."""
        if value is None:
            return None
        if not value.strip():
            raise ValueError("a model name cannot be empty")
        return model_id(value)

    @model_validator(mode="after")
    def _compaction_goes_down(self) -> Settings:
        if self.compact_to >= self.compact_at:
            raise ValueError(
                f"compact_to ({self.compact_to:g}) must be below compact_at ({self.compact_at:g})"
            )
        return self

    def model_for(self, role: Role) -> str:
        """The model an agent of ``role`` runs on: its role's setting, else ``model``."""
        own = {
            "worker": self.worker_model,
            "verifier": self.verifier_model,
            "resolver": self.resolver_model,
        }.get(role)
        return own or self.model

    def effort_for(self, role: Role) -> Effort:
        """The effort an agent of ``role`` asks for: its role's setting, else ``effort``."""
        own = {"worker": self.worker_effort, "verifier": self.verifier_effort}.get(role)
        return own or self.effort

    def models(self) -> list[str]:
        """Every model the session's agents may run on, the main agent's first."""
        found = [self.model]
        for role in ("worker", "verifier", "resolver"):
            if (chosen := self.model_for(role)) not in found:
                found.append(chosen)
        return found

    def unpriced(self) -> str | None:
        """The first model the agents may run on that has no price, if any."""
        return next((m for m in self.models() if m not in self.prices), None)

    def price(self, model: str | None = None) -> ModelPrice | None:
        """The price of ``model`` (default: the main agent's), or None if it has none."""
        return self.prices.get(model or self.model)

    @property
    def window(self) -> int:
        """The main agent's context window in tokens: the setting, else the model's."""
        return self.window_of(self.model)

    def window_of(self, model: str) -> int:
        """A model's context window in tokens: the setting, else the model's own."""
        return self.context_window or context_window_of(model)

    def with_test_limits(self) -> Settings:
        """The spec's small-limits mode: it wins over every other source."""
        return self.model_copy(update={"max_subtasks": 2, "subagent_turns": 1, "main_turns": 1})

    def store_url(self, workdir: Path) -> str:
        """The store to open: ``store``, else the SQLite journal file."""
        if self.store:
            return self.store
        return "sqlite://" + str(self.journal or workdir / ".orchmode" / "journal.db")


def setting_names() -> list[str]:
    return list(Settings.model_fields)


def flag_names() -> list[str]:
    """Settings that have a flag and an environment variable (a table has neither)."""
    return [
        name
        for name, field in Settings.model_fields.items()
        if not (
            isinstance(field.json_schema_extra, dict)
            and field.json_schema_extra.get("flag") is False
        )
    ]


def env_var(name: str) -> str:
    return ENV_PREFIX + name.upper()


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _from_env(env: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {}
    if env.get(LEGACY_JOURNAL_ENV):
        found["journal"] = (env[LEGACY_JOURNAL_ENV], LEGACY_JOURNAL_ENV)
    for name in flag_names():
        value = env.get(env_var(name))
        if value is not None and value != "":
            found[name] = (value, env_var(name))
    return found


def _from_toml(path: Path) -> dict[str, tuple[Any, str]]:
    return _parsed(_read(path), path)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc


def _parsed(content: bytes, path: Path) -> dict[str, tuple[Any, str]]:
    try:
        data = tomllib.loads(content.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    found: dict[str, tuple[Any, str]] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in Settings.model_fields:
            raise ConfigError(
                f"unknown setting {key!r} in {path} — known settings: {', '.join(setting_names())}"
            )
        found[name] = (value, f"{path} key {key!r}")
    return found


def user_config_dir(env: Mapping[str, str]) -> Path:
    """The user's own orchmode configuration directory: ``$XDG_CONFIG_HOME/orchmode``, else
    ``~/.config/orchmode`` (an empty or relative ``XDG_CONFIG_HOME`` is ignored, as the XDG
    specification says)."""
    xdg = env.get("XDG_CONFIG_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "orchmode"
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    return home / ".config" / "orchmode"


def trust_of(name: str) -> tuple[TrustKind, Stricter]:
    """How far an untrusted project is believed for setting ``name`` (and which way its cap is
    stricter)."""
    return trust_marks(Settings.model_fields[name].json_schema_extra)


def trust_marks(extra: object) -> tuple[TrustKind, Stricter]:
    """A field's trust marker read; a field without one (or with a wrong one) counts as
    protected, so forgetting to mark a new setting errs on the safe side."""
    marks = extra if isinstance(extra, dict) else {}
    kind, stricter = marks.get("trust"), marks.get("stricter", "lower")
    if kind == "safe":
        return "safe", "lower"
    if kind == "cap" and stricter == "higher":
        return "cap", "higher"
    if kind == "cap" and stricter == "more":
        return "cap", "more"
    if kind == "cap":
        return "cap", "lower"
    return "protected", "lower"


def needs_trust(name: str) -> bool:
    """Whether a project may set ``name`` only when trusted (caps may still restrict)."""
    return trust_of(name)[0] != "safe"


def stricter_or_same(stricter: Stricter, value: Any, baseline: Any) -> bool:
    """Whether a cap's ``value`` holds a run at least as tightly as ``baseline`` does."""
    if stricter == "more":
        return set(value or ()) >= set(baseline or ())
    if value is None:  # no limit: the loosest there is
        return baseline is None
    if baseline is None:
        return True
    return bool(value <= baseline if stricter == "lower" else value >= baseline)


def admitted(name: str, value: Any, baseline: Settings) -> bool:
    """Whether an untrusted project's ``value`` for ``name`` counts, over ``baseline`` (what
    the user's own configuration and the defaults give). The value the user has anyway
    counts: it changes nothing, so it is not worth a word."""
    kind, stricter = trust_of(name)
    if kind == "safe" or value == getattr(baseline, name):
        return True
    if kind == "protected":
        return False
    return stricter_or_same(stricter, value, getattr(baseline, name))


def named_files(values: Mapping[str, Any]) -> dict[str, Path]:
    """The files a project's settings name that orchmode reads or runs, by setting, hashed
    with its settings files when the directory is trusted: the MCP config (its servers are
    programs run as you) and a bubblewrap given as a path."""
    named: dict[str, Path] = {}
    if isinstance(mcp := values.get("mcp_config"), str | Path):
        named["mcp_config"] = Path(mcp)
    if isinstance(bwrap := values.get("sandbox_bwrap"), str) and "/" in bwrap:
        named["sandbox_bwrap"] = Path(bwrap)
    return named


def project_settings(directory: Path) -> dict[str, Any]:
    """The settings a directory's own ``orchmode.toml`` sets, as written (none without one)."""
    path = directory / CONFIG_FILE
    if not path.is_file():
        return {}
    return {name: value for name, (value, _source) in _from_toml(path).items()}


def project_verdict(
    directory: Path, values: Mapping[str, Any], config_dir: Path, read: bytes | None = None
) -> Verdict:
    """Whether the user trusts ``directory``'s settings files as they are now; ``read``: the
    ``orchmode.toml`` the settings were parsed from, so what is checked is what was read."""
    seen = {CONFIG_FILE: digest(read)} if read is not None else {}
    now = fingerprint(directory, named_files(values).values(), seen=seen)
    return verdict(read_records(config_dir), directory, now)


def ignored_line(ignored: list[str], found: Verdict) -> str:
    """The one line that says which of a project's settings were ignored, and how to trust it."""
    command = f"`orchmode trust {shlex.quote(str(found.directory))}`"
    names = ", ".join(ignored)
    if found.known:
        return (
            f"ignoring {CONFIG_FILE}'s {names}: its settings files changed since you trusted "
            f"this directory ({listed(list(found.changed))}) — review them and run {command} "
            "again if you trust them"
        )
    return (
        f"ignoring {CONFIG_FILE}'s {names}: this directory is not trusted — run {command} if "
        "you trust its settings"
    )


def _validated(layers: Mapping[str, tuple[Any, str]]) -> Settings:
    """The settings the layers make, validated once, naming the source of any bad value."""
    values = {name: value for name, (value, _source) in layers.items()}
    try:
        return Settings(**values)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else "?"
        source = layers.get(name, (None, name))[1]
        raise ConfigError(f"{source}: {error['msg']} (got {error.get('input')!r})") from exc


_INVALID = object()


def _as_setting(name: str, value: Any, below: Mapping[str, tuple[Any, str]]) -> Any:
    """``value`` as setting ``name`` holds it (``_INVALID`` when it is not a valid one)."""
    values = {k: v for k, (v, _source) in below.items()}
    try:
        return getattr(Settings(**{**values, name: value}), name)
    except ValidationError:
        return _INVALID


def _project_layer(
    cwd: Path,
    below: Mapping[str, tuple[Any, str]],
    config_dir: Path,
    warn: Callable[[str], object] | None,
    overridden: Iterable[str] = (),
) -> dict[str, tuple[Any, str]]:
    """The project's ``orchmode.toml``, less what it may not set unless trusted.

    Settings the environment or a flag sets (``overridden``) are not the project's to give
    either way, so they are not named as ignored.
    """
    content = _read(cwd / CONFIG_FILE)
    project = _parsed(content, cwd / CONFIG_FILE)
    theirs = set(overridden)
    ruled = [name for name in project if needs_trust(name) and name not in theirs]
    if not ruled:
        return project
    raw = {name: value for name, (value, _source) in project.items()}
    found = project_verdict(cwd, raw, config_dir, read=content)
    if found.trusted:
        return project
    baseline = _validated(below)
    ignored = []
    for name in ruled:
        value = _as_setting(name, raw[name], below)
        # a value that is no valid setting is kept, so the error names this file
        if value is not _INVALID and not admitted(name, value, baseline):
            ignored.append(name)
    if ignored and warn is not None:
        warn(ignored_line(ignored, found))
    return {name: source for name, source in project.items() if name not in ignored}


def load_settings(
    flags: Mapping[str, Any],
    *,
    env: Mapping[str, str],
    cwd: Path,
    config_file: Path | None = None,
    config_dir: Path | None = None,
    warn: Callable[[str], object] | None = None,
) -> Settings:
    """Layer the sources and validate once, naming the source of any bad value.

    flags > ``env`` > the project's ``orchmode.toml`` in ``cwd`` (what needs trust only when
    the user trusts the directory; each ignored key named in one line to ``warn``) > the
    user's ``config.toml`` in ``config_dir`` (default :func:`user_config_dir`) > defaults.
    A ``config_file`` the user names takes the project file's place and is believed in full:
    the user chose it.
    """
    config_dir = config_dir or user_config_dir(env)
    above: dict[str, tuple[Any, str]] = dict(_from_env(env))
    above.update({k: (v, flag(k)) for k, v in flags.items() if v is not None})
    layers: dict[str, tuple[Any, str]] = {}
    if (user_file := config_dir / USER_CONFIG_FILE).is_file():
        layers.update(_from_toml(user_file))
    if config_file is not None:
        layers.update(_from_toml(config_file))
    elif (cwd / CONFIG_FILE).is_file():
        layers.update(_project_layer(cwd, layers, config_dir, warn, overridden=above))
    layers.update(above)
    settings = _validated(layers)
    return settings.with_test_limits() if settings.test_mode else settings


def settings_table() -> str:
    """The settings table of docs/configuration.md, made so that it always matches the code.

    ``scripts/settings_table.py --write`` puts it into the page; the tests check it is there.
    """
    rows = [
        "| setting | flag | environment | default | untrusted project | meaning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, field in Settings.model_fields.items():
        default = field.default
        project = untrusted_project(name)
        if name not in flag_names():
            rows.append(f"| `{name}` | — | — | (see below) | {project} | {field.description} |")
            continue
        if default is None:
            shown = "—"
        elif isinstance(default, bool):
            shown = f"`{str(default).lower()}`"
        elif isinstance(default, tuple):
            shown = ", ".join(f"`{item}`" for item in default) or "—"
        else:
            shown = f"`{default}`"
        rows.append(
            f"| `{name}` | `{flag(name)}` | `{env_var(name)}` | {shown} | {project} "
            f"| {field.description} |"
        )
    return "\n".join(rows)


def untrusted_project(name: str) -> str:
    """What the settings table says an untrusted project's ``orchmode.toml`` may do to it."""
    kind, stricter = trust_of(name)
    if kind == "safe":
        return "yes"
    if kind == "protected":
        return "no"
    if stricter == "more":
        return "only add"
    if Settings.model_fields[name].annotation is bool:
        return "only `false`"
    return f"only {stricter}"
