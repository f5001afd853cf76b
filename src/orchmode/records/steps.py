"""The steps a history lists: commands, compactions, condensed results and settled changes."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.events import ChangeSettled, ContextCompacted, McpCallDone, ResultCondensed
from .wording import change_fate, compaction_text, condensed_text

#: Where an MCP call ran, in the report's sandbox column: not in the bash sandbox.
MCP_SANDBOX = "none: an MCP server, with your rights"


@dataclass(frozen=True)
class Compaction:
    """A conversation made smaller to fit the context window: what an agent lost, and when."""

    event: ContextCompacted
    at: float

    @property
    def agent(self) -> str:
        return self.event.agent

    def describe(self) -> str:
        return compaction_text(self.event)


@dataclass(frozen=True)
class CondensedResult:
    """A Workflow result the model saw condensed: what it missed, and where the whole is."""

    event: ResultCondensed
    at: float

    def describe(self) -> str:
        return condensed_text(self.event)


@dataclass(frozen=True)
class SettledChange:
    """What became of a worker's change to its copy of the tree, and where its patch is."""

    event: ChangeSettled
    at: float

    @property
    def fate(self) -> str:
        return self.event.fate

    @property
    def path(self) -> str:
        return self.event.path

    @property
    def what(self) -> str:
        """Its fate, with why: ``conflict in a.py``, ``not merged (refuted)``."""
        return change_fate(self.event)

    def describe(self) -> str:
        """``merged: 2 files (+10 −2): src/a.py (+8 −2), b.py (+2 −0)``."""
        files = self.event.files.strip()
        text = self.what + (f": {files}" if files else "")
        return " ".join(text.split())  # one line, whatever the file names hold


@dataclass(frozen=True)
class Command:
    """One bash command or MCP tool call, the main agent's or a subagent's."""

    agent: str
    #: The command line; for an MCP call, ``mcp <server>/<tool>``.
    command: str
    exit_code: int | None
    timed_out: bool
    duration: float
    sandbox: str
    at: float
    #: ``bash`` or ``mcp``; an MCP call has no exit code, only ok or its error.
    kind: str = "bash"
    error: str = ""

    @property
    def outcome(self) -> str:
        if self.kind == "mcp":
            return "ok" if self.ok else f"error: {self.error or 'failed'}"
        if self.timed_out:
            return "timed out"
        return "no exit code" if self.exit_code is None else f"exit {self.exit_code}"

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.exit_code == 0

    @classmethod
    def of_mcp(cls, event: McpCallDone, at: float) -> Command:
        """An MCP call, shown like a command: it runs outside the sandbox, as the user."""
        return cls(
            event.agent,
            f"mcp {event.server}/{event.tool}",
            0 if event.ok else 1,
            False,
            event.duration,
            MCP_SANDBOX,
            at,
            "mcp",
            event.error,
        )
