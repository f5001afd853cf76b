"""The agent loop itself: request, read the stop reason, run the tools, until the turn ends.

One loop for every role. Per response it reads :data:`~.stops.STOPS`: ``pause_turn`` sends
the conversation back as it is (the paused reply kept, its text joined to what follows);
tool calls run through the :class:`~.toolbox.Toolbox`, all results go back in one user
message; any other stop ends the run, the reply kept or dropped as the table says. A
request refused as too long (or a reply that says the window was exceeded) is compacted
and sent again once; a refused request uses no turn. What a role does with the ending —
a main turn's text, a subagent's status — is its own: the loop returns a
:class:`LoopResult`, and lets through only what it cannot act on: a rejected credential, a
cancellation, a tool that raised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import cast

from ..core.errors import AuthError, OrchmodeError, PromptTooLong
from ..core.events import ModelRefused, TokenUsage
from ..core.wire import Block, Message, ToolResultBlock, ToolSchema, ToolUseBlock
from ..model.gateway import ModelChoice, ModelGateway
from ..model.reply import ModelReply
from .room import Room
from .stops import Step, StopRule, refusal_note, rule_for
from .toolbox import Toolbox


class Ending(StrEnum):
    """How a run of the loop ended."""

    #: A response ended it (``LoopResult.stop`` says which, ``rule`` what that means).
    STOPPED = "stopped"
    #: A tool call finished the run (``LoopResult.text`` is its value).
    FINISHED = "finished"
    #: Refused as too long even after the one compaction (``error`` says how long).
    TOO_LONG = "too_long"
    #: A model request failed (``error``): the role decides what that costs.
    FAILED = "failed"
    #: The turns ran out while the model still called tools.
    TURN_LIMIT = "turn_limit"


@dataclass(frozen=True)
class LoopResult:
    ending: Ending
    #: Model responses this run took (a request refused as too long is not one).
    turns: int
    #: Requests sent, refused and failed ones included.
    requests: int
    usage: TokenUsage = field(default_factory=TokenUsage)
    #: STOPPED: the text since the last tool round (paused parts joined); FINISHED: the
    #: tool's value; TURN_LIMIT and FAILED: the last text the model wrote.
    text: str = ""
    #: STOPPED: the response's stop reason ("end_turn" when the API gave none).
    stop: str = ""
    rule: StopRule | None = None
    #: STOPPED: the last response had no content at all.
    empty: bool = False
    error: OrchmodeError | None = None
    #: STOPPED by a refusal: the API's reasons (its ``stop_details``), also in ``rule.note``.
    refusal: ModelRefused | None = None


class Hooks:
    """What a role adds to the loop; the defaults do nothing."""

    async def changed(self) -> None:
        """The conversation gained messages (the main agent checkpoints it)."""

    def replied(self, reply: ModelReply) -> None:
        """A response came (before the loop acts on it)."""


@dataclass
class AgentLoop:
    """One agent's conversation driven through the gateway, whatever its role."""

    gateway: ModelGateway
    #: Who the requests are for (events, traces): "main", "worker 1.2", …
    agent: str
    system: str
    room: Room
    hooks: Hooks = field(default_factory=Hooks)
    #: Streams the reply's text as it comes (the main agent's live answer).
    on_text: Callable[[str], None] | None = None
    #: Called once, as the first request goes out (a subagent starts its shell then).
    on_first_send: Callable[[], None] | None = None
    #: The conversation's last response, for the API's cache diagnostics.
    last_message_id: str | None = None
    #: The model and effort of the agent's role (None: the main agent's).
    choice: ModelChoice | None = None

    async def run(self, messages: list[Message], tools: Toolbox, max_turns: int) -> LoopResult:
        """Drive ``messages`` (extended and compacted in place) until the run ends."""
        usage = TokenUsage()
        paused: list[str] = []
        last_text = ""
        retried = False  # a request refused as too long is compacted and sent again once
        turns = requests = 0
        while turns < max_turns:
            await self.room.make_room(messages, tools.schemas)
            sent = len(messages)
            requests += 1
            try:
                reply = await self._send(messages, tools.schemas)
            except AuthError:
                raise
            except PromptTooLong as exc:
                self.room.refused(sent, exc.tokens)
                if not retried and self.room.compact(messages, refused=True):
                    retried = True
                    continue
                return LoopResult(Ending.TOO_LONG, turns, requests, usage, error=exc)
            except OrchmodeError as exc:
                return LoopResult(Ending.FAILED, turns, requests, usage, last_text, error=exc)
            turns += 1
            usage = usage + reply.usage
            self._took(messages, sent, reply)
            last_text = reply.text or last_text
            rule = _rule_of(reply)
            if rule.compact_first and not retried and self.room.compact(messages, refused=True):
                retried = True
                continue
            retried = False
            if rule.step is Step.CONTINUE:
                if reply.content:
                    await self._append_reply(messages, reply)
                    paused.append(reply.text)
                continue
            if rule.step is Step.STOP:
                text = "\n\n".join(t for t in [*paused, reply.text] if t)
                if rule.kept and reply.content:
                    await self._append_reply(messages, reply)
                stop = reply.stop_reason or "end_turn"
                return LoopResult(
                    Ending.STOPPED,
                    turns,
                    requests,
                    usage,
                    text,
                    stop,
                    rule,
                    not reply.content,
                    refusal=reply.refusal,
                )
            paused.clear()
            await self._append_reply(messages, reply)
            finish = await self.run_tools(messages, tools, reply.tool_uses)
            if finish is not None:
                return LoopResult(Ending.FINISHED, turns, requests, usage, finish)
        return LoopResult(Ending.TURN_LIMIT, turns, requests, usage, last_text)

    def _took(self, messages: list[Message], sent: int, reply: ModelReply) -> None:
        """A response came: remember it for the cache diagnostics, tell the role, measure it."""
        self.last_message_id = reply.message_id
        self.hooks.replied(reply)
        self.room.measured(messages, sent, reply)

    async def _append_reply(self, messages: list[Message], reply: ModelReply) -> None:
        messages.append({"role": "assistant", "content": reply.content})
        await self.hooks.changed()

    async def run_tools(
        self, messages: list[Message], tools: Toolbox, tool_uses: list[ToolUseBlock]
    ) -> str | None:
        """Run one round of calls and append all results in one user message, whatever
        happens; the value a call finished the run with, if one did."""
        results: list[ToolResultBlock] = []
        try:
            finish = await tools.run(tool_uses, results)
        finally:
            messages.append({"role": "user", "content": cast("list[Block]", results)})
        await self.hooks.changed()
        return finish.value if finish is not None else None

    async def _send(self, messages: list[Message], schemas: list[ToolSchema]) -> ModelReply:
        on_send, self.on_first_send = self.on_first_send, None
        return await self.gateway.complete(
            agent=self.agent,
            system=self.system,
            messages=messages,
            tools=schemas,
            on_text=self.on_text,
            previous_message_id=self.last_message_id,
            on_send=on_send,
            context_edits=self.room.context_edits(),
            choice=self.choice,
        )


def _rule_of(reply: ModelReply) -> StopRule:
    """What the loop does after this reply; a refusal's reasons go in its note."""
    rule = rule_for(reply.stop_reason, bool(reply.tool_uses))
    refusal = reply.refusal
    if refusal is not None:
        rule = replace(rule, note=refusal_note(refusal))
    return rule
