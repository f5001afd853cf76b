"""The only code that talks to the Messages API: streaming, effort, prompt caching, usage.

Every request carries ``output_config.effort``, the per-request timeout and top-level
automatic prompt caching, so a multi-turn loop reads its growing prefix from the cache.
SDK and transport errors are turned into :mod:`orchmode.errors` exceptions here, so the
loops above never see an HTTP library.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import anthropic
import httpx2

from .errors import AuthError, EndpointError, ModelRequestError
from .events import EventBus, ModelRequestDone, TokenUsage
from .settings import Settings

Block = dict[str, Any]
Message = dict[str, Any]


@dataclass(frozen=True)
class Credentials:
    api_key: str | None = None
    auth_token: str | None = None

    def __repr__(self) -> str:  # never print a secret, even by accident
        return "Credentials(***)"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Credentials:
        """``ANTHROPIC_API_KEY`` first, then ``ANTHROPIC_AUTH_TOKEN``, as the SDK orders them."""
        api_key = env.get("ANTHROPIC_API_KEY") or None
        if api_key:
            return cls(api_key=api_key)
        auth_token = env.get("ANTHROPIC_AUTH_TOKEN") or None
        if auth_token:
            return cls(auth_token=auth_token)
        raise AuthError(
            "no API key — set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN) in the environment"
        )


@dataclass(frozen=True)
class ModelReply:
    """One finished response, its content already in request (param) form."""

    message_id: str
    content: list[Block]
    stop_reason: str | None
    usage: TokenUsage

    @property
    def text(self) -> str:
        return "\n\n".join(b["text"] for b in self.content if b.get("type") == "text").strip()

    @property
    def tool_uses(self) -> list[Block]:
        return [b for b in self.content if b.get("type") == "tool_use"]


def block_to_param(block: Any) -> Block | None:
    """An SDK content block as a request block; ``None`` for blocks the API would reject."""
    kind = getattr(block, "type", None)
    if kind == "text":
        text = cast(str, block.text)
        return {"type": "text", "text": text} if text.strip() else None
    if kind == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    dumped = cast(Block, block.model_dump(mode="json", exclude_none=True))
    return dumped


def _usage(raw: Any) -> TokenUsage:
    return TokenUsage(
        input_tokens=raw.input_tokens or 0,
        output_tokens=raw.output_tokens or 0,
        cache_read_tokens=raw.cache_read_input_tokens or 0,
        cache_write_tokens=raw.cache_creation_input_tokens or 0,
    )


def _api_message(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return cast(str, error["message"])
    return exc.message


@dataclass
class ModelGateway:
    """Sends requests for every agent of a session and keeps the session's usage."""

    settings: Settings
    credentials: Credentials
    events: EventBus = field(default_factory=EventBus)
    usage: TokenUsage = field(default_factory=TokenUsage)
    requests: int = 0
    _client: anthropic.AsyncAnthropic | None = None

    @property
    def client(self) -> anthropic.AsyncAnthropic:
        if self._client is None:
            self._client = anthropic.AsyncAnthropic(
                api_key=self.credentials.api_key,
                auth_token=self.credentials.auth_token,
                base_url=self.settings.base_url,
                timeout=self.settings.request_timeout,
                max_retries=self.settings.max_retries,
            )
        return self._client

    @property
    def endpoint(self) -> str:
        return str(self.client.base_url).rstrip("/")

    async def complete(
        self,
        *,
        agent: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[Block],
        on_text: Callable[[str], None] | None = None,
    ) -> ModelReply:
        """Stream one response to the end and return it; raise an ``OrchmodeError`` on failure."""
        started = time.monotonic()
        try:
            async with self.client.messages.stream(
                model=self.settings.model,
                max_tokens=self.settings.max_tokens,
                system=system,
                messages=cast(Any, list(messages)),
                tools=cast(Any, list(tools)),
                output_config={"effort": self.settings.effort},
                cache_control={"type": "ephemeral"},
                timeout=self.settings.request_timeout,
            ) as stream:
                if on_text is not None:
                    async for event in stream:
                        if event.type == "text":
                            on_text(event.text)
                message = await stream.get_final_message()
        except anthropic.AuthenticationError as exc:
            raise AuthError(
                f"the API rejected the credentials ({exc.status_code}: {_api_message(exc)}) — "
                "check ANTHROPIC_API_KEY or ANTHROPIC_AUTH_TOKEN"
            ) from exc
        except anthropic.PermissionDeniedError as exc:
            raise AuthError(
                f"the API denied access ({exc.status_code}: {_api_message(exc)}) — "
                "check that the key may use this model"
            ) from exc
        except anthropic.APIStatusError as exc:
            status = exc.status_code
            message_text = _api_message(exc)
            if status in (429, 529) or status >= 500:
                raise EndpointError(
                    f"the API kept failing ({status}: {message_text}) after "
                    f"{self.settings.max_retries} retries"
                ) from exc
            raise ModelRequestError(
                f"the API rejected a request ({status}): {message_text}"
            ) from exc
        except anthropic.APITimeoutError as exc:
            raise EndpointError(
                f"a request to {self.endpoint} timed out after {self.settings.request_timeout:g} s"
            ) from exc
        except anthropic.APIConnectionError as exc:
            raise EndpointError(
                f"cannot reach the Messages API at {self.endpoint} — check --base-url, "
                "ANTHROPIC_BASE_URL and the network"
            ) from exc
        except (anthropic.AnthropicError, httpx2.HTTPError) as exc:
            raise EndpointError(
                f"the response stream from {self.endpoint} broke off: {exc or type(exc).__name__}"
            ) from exc

        content = [p for b in message.content if (p := block_to_param(b)) is not None]
        usage = _usage(message.usage)
        self.usage = self.usage + usage
        self.requests += 1
        self.events.emit(
            ModelRequestDone(
                agent=agent,
                message_id=message.id,
                stop_reason=message.stop_reason,
                usage=usage,
                duration=time.monotonic() - started,
            )
        )
        return ModelReply(message.id, content, message.stop_reason, usage)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
