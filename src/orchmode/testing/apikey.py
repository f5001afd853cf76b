"""The Messages API's own authentication: an API key, sent as ``x-api-key`` or a bearer token."""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from .responses import Outcome


def check_api_key(headers: Mapping[str, str], api_key: str | None) -> None:
    """Refuse a request without ``api_key`` as the API does (401); None accepts any key.

    The same check guards every endpoint on the Messages API's front door, batches too.
    """
    if api_key is None:
        return
    key = headers.get("x-api-key")
    if key is None:
        bearer = headers.get("authorization", "")
        key = bearer[7:] if bearer.lower().startswith("bearer ") else None
    if key is None:
        raise Outcome(401, "authentication_error", "x-api-key header is required", "auth")
    if not secrets.compare_digest(key.encode(), api_key.encode()):
        raise Outcome(401, "authentication_error", "invalid x-api-key", "auth")
