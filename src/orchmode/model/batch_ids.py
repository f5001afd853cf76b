"""The ``custom_id`` of a request sent through the Message Batches API.

A digest of everything the request asks, so a run that stopped and is resumed asks the
same request under the same id and finds it in the batch it already paid for, while a
request that differs in any byte (another turn, another tool result) is a new one. The
attempt number tells apart the same request asked again after its result came back
errored, expired or canceled.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

#: What the API accepts as a ``custom_id``: 1 to 64 of these characters.
CUSTOM_ID_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
CUSTOM_ID_LENGTH = 64
#: Hex digits of the digest kept: 224 bits, with room left for ``-`` and the attempt.
_DIGITS = 56


def custom_id(params: Mapping[str, object], attempt: int = 0) -> str:
    """The id of ``params`` (a Messages request's body) in a batch, at ``attempt`` (from 0)."""
    if not 0 <= attempt < 10**7:
        raise ValueError(f"a batched request's attempt is 0 to 9999999, not {attempt}")
    canonical = json.dumps(
        params, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str
    )
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{digest[:_DIGITS]}-{attempt}"
