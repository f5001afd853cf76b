"""The default executor: subagents run as coroutines in this process."""

from __future__ import annotations

from collections.abc import Callable

from ..core.events import EventBus
from ..core.results import AgentResult
from ..trees.trees import Trees
from . import Job
from .host import AgentHost

#: How the records name the node of an agent that ran in the user's own process.
HERE = ""


class LocalExecutor:
    """Runs every job in this process, through one :class:`AgentHost`."""

    def __init__(self, host: AgentHost) -> None:
        self.host = host

    async def start(self) -> None:
        return None

    async def run(
        self, job: Job, events: EventBus, on_placed: Callable[[str], None]
    ) -> AgentResult:
        on_placed(HERE)
        return await self.host.run(job, events)

    async def share_tree(self, trees: Trees, commit: str) -> None:
        return None  # this process's agents read the session's own store

    async def finish_housekeeping(self) -> None:
        await self.host.finish_housekeeping()

    async def close(self) -> None:
        await self.host.finish_housekeeping()
