"""A run: a task with orchestration on, then a brief summary of its answer with it off.

The run's progress is saved with the session's state (:class:`RunRecord`), so a run that was
interrupted — in its task, in its summary, or between the two — is finished by a resume
with the answers the uninterrupted run would have given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..core.errors import OrchmodeError
from ..core.prompts import SUMMARY_TASK
from .agent import Conversation, TurnResult
from .run_record import RunRecord


@dataclass(frozen=True)
class RunAnswer:
    """One answer of a run, as soon as it is known: the task's, then the summary's."""

    turn: TurnResult
    #: True for the summary's answer.
    summary: bool = False


#: What a run calls with each answer as it comes (``orchmode run`` prints it).
OnAnswer = Callable[[RunAnswer], object]


@dataclass(frozen=True)
class RunResult:
    """A run's two answers; no summary when the task's turn failed or the model refused
    it (a summary of a refusal has nothing to stand on)."""

    task: TurnResult
    summary: TurnResult | None

    @property
    def ok(self) -> bool:
        return self.task.ok and (self.summary is None or self.summary.ok)


async def run_task(conversation: Conversation, task: str, on_answer: OnAnswer) -> RunResult:
    """The run's two turns, its record saved as each begins and once it is done.

    ``on_answer`` hears each answer that came without an error, as soon as it is known.
    """
    conversation.run = RunRecord(task=task, batch=conversation.settings.batch)
    conversation.set_mode(True)
    first = await conversation.turn(task)
    return await _summarised(conversation, first, on_answer)


async def finish_run(conversation: Conversation, on_answer: OnAnswer) -> RunResult:
    """An interrupted run finished from its last recorded step: the task's turn and then
    its summary, or only the summary, with the answers the whole run would have given."""
    run = conversation.run
    if run is None:
        raise OrchmodeError(f"session {conversation.session_id!r} was not started as a run")
    if run.phase == 1:
        return await _summarised(conversation, await conversation.resume_turn(), on_answer)
    first = TurnResult(conversation.answer_of_turn(1) or "", "end_turn", 0)
    second = await conversation.resume_turn()
    if second.error is None:
        on_answer(RunAnswer(first))
        on_answer(RunAnswer(second, summary=True))
        await _done(conversation)
    return RunResult(first, second)


async def _summarised(
    conversation: Conversation, first: TurnResult, on_answer: OnAnswer
) -> RunResult:
    """The summary's turn after the task's answer ``first`` (none after a failure or a
    refusal), the run recorded as done once it ends well."""
    if first.error is not None:
        return RunResult(first, None)
    on_answer(RunAnswer(first))
    second = None
    if first.stop != "refusal":
        conversation.run = _at(conversation, 2)
        conversation.set_mode(False)
        second = await conversation.turn(SUMMARY_TASK)
        if second.error is not None:
            return RunResult(first, second)
        on_answer(RunAnswer(second, summary=True))
    await _done(conversation)
    return RunResult(first, second)


async def _done(conversation: Conversation) -> None:
    conversation.run = _at(conversation, "done")
    await conversation.save()


def _at(conversation: Conversation, phase: Literal[2, "done"]) -> RunRecord:
    run = conversation.run
    assert run is not None, "a run's phase is set only while it runs"
    return run.model_copy(update={"phase": phase})
