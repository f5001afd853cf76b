"""The create-batch body checked as the Message Batches API checks it, request by request.

The envelope (the list, each ``custom_id``, the limits) is refused at once. Each request's
``params`` go through the same validation as a ``POST /v1/messages`` body (the caller
passes it in), but as the API does it, once the batch runs: a malformed request ends
``errored`` with the complaint it would have heard interactively, and the others in its
batch are answered.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .batch_store import BatchItem, BatchSettings
from .cache import EditedPrompt
from .responses import Outcome, invalid

__all__ = ["read_batch_requests"]

_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_CUSTOM_ID_MAX = 64

#: Validates one request's params as ``/v1/messages`` does; raises an :class:`Outcome`.
Prepare = Callable[[Any], EditedPrompt]


def read_batch_requests(
    raw: bytes | None, body: Any, settings: BatchSettings, prepare: Prepare
) -> list[BatchItem]:
    """The batch's requests, or the API's error for the first problem found."""
    if raw is None or len(raw) > settings.max_body_bytes:
        message = "Request exceeds the maximum allowed size"
        raise Outcome(413, "request_too_large", message, f"invalid:{message}")
    if not isinstance(body, dict):
        raise invalid("Request body must be a JSON object")
    requests = body.get("requests")
    if "requests" not in body:
        raise invalid("requests: Field required")
    if not isinstance(requests, list):
        raise invalid("requests: Input should be a valid list")
    if not requests:
        raise invalid("requests: List should have at least 1 item after validation, not 0")
    if len(requests) > settings.max_requests:
        raise invalid(
            f"requests: List should have at most {settings.max_requests} items after "
            f"validation, not {len(requests)}"
        )
    items: list[BatchItem] = []
    seen: set[str] = set()
    for i, request in enumerate(requests):
        item = _read_request(i, request, prepare)
        if item.custom_id in seen:
            raise invalid(
                f"requests.{i}.custom_id: {item.custom_id!r} is already used by another "
                "request in this batch; custom_id must be unique within a batch"
            )
        seen.add(item.custom_id)
        items.append(item)
    return items


def _read_request(i: int, request: Any, prepare: Prepare) -> BatchItem:
    path = f"requests.{i}"
    if not isinstance(request, dict):
        raise invalid(f"{path}: Input should be a valid dictionary")
    for name in ("custom_id", "params"):
        if name not in request:
            raise invalid(f"{path}.{name}: Field required")
    extra = sorted(set(request) - {"custom_id", "params"})
    if extra:
        raise invalid(f"{path}.{extra[0]}: Extra inputs are not permitted")
    custom_id = _custom_id(request["custom_id"], f"{path}.custom_id")
    params = request["params"]
    if not isinstance(params, dict):
        raise invalid(f"{path}.params: Input should be a valid dictionary")
    if params.get("stream") is True:
        return BatchItem(custom_id, None, "stream: streaming is not supported in a message batch")
    try:
        return BatchItem(custom_id, prepare(params))
    except Outcome as out:
        return BatchItem(custom_id, None, out.message)


def _custom_id(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise invalid(f"{path}: Input should be a valid string")
    if not value:
        raise invalid(f"{path}: String should have at least 1 character")
    if len(value) > _CUSTOM_ID_MAX:
        raise invalid(f"{path}: String should have at most {_CUSTOM_ID_MAX} characters")
    if not _CUSTOM_ID.match(value):
        raise invalid(f"{path}: String should match pattern '{_CUSTOM_ID.pattern}'")
    return value
