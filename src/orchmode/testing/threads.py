"""An asyncio server served from a daemon thread, for callers that are not async.

A synchronous test, or one that starts ``orchmode`` processes, needs the scripted server
listening while its own thread blocks; the server then runs on a private event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable


class LoopThread:
    """A private event loop in a daemon thread, running one server's start and stop."""

    def __init__(self, owner: str, thread_name: str) -> None:
        self.owner = owner
        self.thread_name = thread_name
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self, start: Callable[[], Awaitable[None]], timeout: float) -> None:
        """Run ``start()`` on the thread's loop, then keep the loop running; raise what
        ``start()`` raised, or TimeoutError if it has not finished within ``timeout``."""
        if self._thread is not None:
            raise RuntimeError(f"{self.owner} thread already running")
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(start())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        thread = threading.Thread(target=run, name=self.thread_name, daemon=True)
        thread.start()
        if not ready.wait(timeout):
            raise TimeoutError(f"{self.owner} thread did not start in time")
        if failure:
            thread.join()
            raise failure[0]
        self._thread, self._loop = thread, loop

    def stop(self, stop: Callable[[], Awaitable[None]], timeout: float) -> None:
        """Run ``stop()`` on the loop, then end the loop and join its thread."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return

        async def stopping() -> None:
            await stop()

        try:
            asyncio.run_coroutine_threadsafe(stopping(), loop).result(timeout)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
            self._thread = self._loop = None
