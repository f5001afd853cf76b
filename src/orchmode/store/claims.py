"""Claims: which process runs a piece of work now, renewed while it runs, lapsing if it dies.

A claim is a row in the store with a holder and a lease, so it works the same for the
agents of one process, of several, and of a cluster's nodes sharing a PostgreSQL store.
The fan-out claims each subagent's journal key, the session start-up claims the session,
and whoever runs the work renews the claim; a holder that dies stops renewing and its
claim lapses for someone else to take.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator

from ..core.errors import OrchmodeError
from .base import Store

log = logging.getLogger("orchmode")


def holder_name(*, renewed_here: bool = True) -> str:
    """A claim holder's name: this host and process, and a part of its own so that two
    claims of one process are told apart.

    ``renewed_here=False`` for a claim that another process renews (a Ray actor on some
    node): its name then carries no process id, so it is never taken for a dead one's.
    """
    pid = str(os.getpid()) if renewed_here else "remote"
    return f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:12]}"


def holder_is_dead(holder: str) -> bool:
    """True only for a holder on this host whose process is gone (killed, crashed).

    A holder elsewhere, or one whose name does not say, is taken to be alive: its claim
    is left to lapse. A process id reused since is taken to be alive too — safe, just slow.
    """
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # someone else's process: alive
        return False
    return False


async def claim_or_take_over(store: Store, key: str, holder: str, lease: float) -> bool:
    """Claim ``key``; if a process on this host that died holds it, take it over at once
    rather than wait out its lease (after ``kill -9`` the resume starts straight away)."""
    if await store.claim(key, holder, lease):
        return True
    current = await store.holder(key)
    if current is None or not holder_is_dead(current):
        return False
    log.info("taking over a claim from %s, a process that is gone", current)
    await store.release(key, current)
    return await store.claim(key, holder, lease)


async def claim_within(store: Store, key: str, holder: str, lease: float, wait: float) -> bool:
    """Claim ``key``, trying again for up to ``wait`` seconds; False if it stayed taken."""
    deadline = time.monotonic() + wait
    while not await claim_or_take_over(store, key, holder, lease):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(min(1.0, lease / 10))
    return True


async def keep_claim(store: Store, key: str, holder: str, lease: float) -> None:
    """Renew a claim a third of the lease at a time, until cancelled."""
    while True:
        await asyncio.sleep(lease / 3)
        try:
            if not await store.renew(key, holder, lease):
                log.warning("lost the claim on a running subtask; it may run twice")
                return
        except OrchmodeError as exc:
            log.warning("could not renew a claim: %s", exc)


@contextlib.asynccontextmanager
async def holding(store: Store, key: str, holder: str, lease: float) -> AsyncIterator[None]:
    """Keep a claim already taken renewed inside the block, and let it go on the way out."""
    renewing = asyncio.create_task(keep_claim(store, key, holder, lease))
    try:
        yield
    finally:
        renewing.cancel()
        with contextlib.suppress(OrchmodeError):
            await store.release(key, holder)
