"""SDK and transport failures as orchmode's errors, so the loops never see an HTTP library."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import cast

import anthropic
import httpx2

from ..core.errors import (
    AuthError,
    ModelRequestError,
    Overloaded,
    PromptTooLong,
    StreamInterrupted,
    TransientFailure,
)
from ..core.settings import Settings
from .context import too_long_count
from .providers import Capabilities, auth_failures


class BetaRefused(Exception):
    """A 400 that says the context-editing beta is the problem: send it again without."""


#: What a 400 says when the context-editing beta itself is what the endpoint refuses: the
#: field (``context_management: Extra inputs are not permitted``), the beta's name or the
#: header (``Unexpected value(s) … for the anthropic-beta header``), or a beta it does not
#: know or take. Any other 400 is about something else and leaves context editing on.
_BETA_REFUSALS = re.compile(
    r"context[_-]management|anthropic-beta"
    r"|\b(unknown|unsupported|invalid|unexpected)\b[^.]*\bbetas?\b"
    r"|\bbetas?\b[^.]*\b(not (supported|available|enabled|recogni[sz]ed)|unknown)\b",
    re.IGNORECASE,
)


def beta_is_the_problem(message: str) -> bool:
    """Whether an API error's words say the context-editing beta is what it refused."""
    return _BETA_REFUSALS.search(message) is not None


def retry_after(exc: anthropic.APIStatusError) -> float | None:
    """The wait the API asked for, from ``retry-after-ms`` or ``retry-after`` (seconds)."""
    headers = exc.response.headers
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return max(0.0, float(value) * scale)
            except ValueError:
                continue
    return None


def api_message(exc: anthropic.APIStatusError) -> str:
    """The error's own words: ``error.message`` (Anthropic, Google) or Bedrock's ``message``."""
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return cast(str, error["message"])
        for key in ("message", "Message"):
            if isinstance(body.get(key), str):
                return cast(str, body[key])
    return exc.message


@dataclass(frozen=True)
class FailureWords:
    """What a translated error names: the provider, its endpoint and the request's terms."""

    settings: Settings
    caps: Capabilities
    endpoint: str
    #: Whether the request asked for context editing (a 400 may then be the beta's fault).
    context_edits: bool

    @property
    def who(self) -> str:
        return "the API" if self.settings.provider == "anthropic" else self.caps.label

    def translate(self, exc: Exception, *, opened: bool = False) -> Exception | None:
        """``exc`` as orchmode's error for it; None for one that is not the SDK's or the
        transport's (it goes up as it is).

        ``opened``: the response had begun, so a lost connection or a read that timed out
        is a stream broken part-way (the SDK reports it as a connection error since 2.17,
        as the transport's own error before), not an endpoint that cannot be reached."""
        if opened and isinstance(exc, anthropic.APIConnectionError):
            return self._broke_off(exc.__cause__ or exc)
        if isinstance(exc, anthropic.AuthenticationError | anthropic.PermissionDeniedError):
            return self._auth(exc)
        if isinstance(exc, auth_failures(self.settings.provider)):
            return AuthError(
                f"the credentials for {self.caps.label} stopped working: {exc} — "
                f"{self.caps.credentials_hint}"
            )
        if isinstance(exc, anthropic.APIStatusError):
            return self._status(exc)
        if isinstance(exc, anthropic.APITimeoutError):
            return TransientFailure(
                f"a request to {self.endpoint} timed out after {self.settings.request_timeout:g} s"
            )
        if isinstance(exc, anthropic.APIConnectionError):
            where = "the Messages API" if self.settings.provider == "anthropic" else self.caps.label
            return TransientFailure(
                f"cannot reach {where} at {self.endpoint} — {self.caps.endpoint_hint}"
            )
        if isinstance(exc, anthropic.AnthropicError | httpx2.HTTPError):
            return self._broke_off(exc)
        return None

    def _broke_off(self, cause: BaseException) -> StreamInterrupted:
        return StreamInterrupted(
            f"the response stream from {self.endpoint} broke off: {cause or type(cause).__name__}"
        )

    def _auth(self, exc: anthropic.APIStatusError) -> AuthError:
        if isinstance(exc, anthropic.AuthenticationError):
            return AuthError(
                f"{self.who} rejected the credentials ({exc.status_code}: "
                f"{api_message(exc)}) — {self.caps.credentials_hint}"
            )
        hint = (
            "check that the key may use this model"
            if self.settings.provider == "anthropic"
            else self.caps.credentials_hint
        )
        return AuthError(
            f"{self.who} denied access ({exc.status_code}: {api_message(exc)}) — {hint}"
        )

    def _status(self, exc: anthropic.APIStatusError) -> Exception:
        status = exc.status_code
        message_text = api_message(exc)
        if status < 400:  # an `error` event in the middle of a successful stream
            return StreamInterrupted(
                f"the response stream from {self.endpoint} reported an error: {message_text}"
            )
        # Bedrock and Vertex say "no capacity now" with 503 (ServiceUnavailable), where
        # the Messages API says 529: both are waited out under overload_patience.
        platform_busy = status == 503 and self.settings.provider != "anthropic"
        if status in (429, 529) or platform_busy:
            return Overloaded(
                f"{self.who} is overloaded ({status}: {message_text})", retry_after(exc)
            )
        if status >= 500 or status in (408, 409):
            return TransientFailure(
                f"the API kept failing ({status}: {message_text}) after "
                f"{self.settings.max_retries} retries"
            )
        tokens = too_long_count(message_text)
        if tokens is not None or "prompt is too long" in message_text:
            return PromptTooLong(
                f"the API refused a request as too long ({status}): {message_text}", tokens
            )
        if self.context_edits and status == 400 and beta_is_the_problem(message_text):
            return BetaRefused(f"{status}: {message_text}")
        return ModelRequestError(f"the API rejected a request ({status}): {message_text}")


def refused_in_batch(message_text: str) -> Exception:
    """A batched request's ``invalid_request_error`` result: what its 400 would have been
    interactively (too long, so the conversation is compacted; else a rejected request).
    The API checks a batched request's params only once the batch runs."""
    tokens = too_long_count(message_text)
    if tokens is not None or "prompt is too long" in message_text:
        return PromptTooLong(
            f"the API refused a batched request as too long: {message_text}", tokens
        )
    return ModelRequestError(f"the API rejected a batched request: {message_text}")
