"""How the scripted server's answers and errors go out: SSE or Bedrock frames, error bodies.

Each front door (the Messages API, Bedrock, Vertex) has its own error shape and, for
Bedrock, its own stream framing; the server decides what to say and this module says it
in the shape the client came in by.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence

from aiohttp import web

from .answer import ErrorBody, InvocationMetrics, MessageStop, StreamEvent, _Answer
from .providers import (
    Route,
    bedrock_error,
    bedrock_exception_frame,
    bedrock_frame,
    google_error,
)
from .replies import Fault, SseEvent


class Outcome(Exception):
    """Ends a request early with a JSON error response and the outcome its log entry gets."""

    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        outcome: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.outcome = outcome
        self.headers = headers or {}


def invalid(message: str) -> Outcome:
    """The API's 400 for a request it will not take."""
    return Outcome(400, "invalid_request_error", message, f"invalid:{message}")


def fault_refusal(fault: Fault, streaming: bool, rate_limit_retry_after: float) -> Outcome | None:
    """The error a fault answers with before any byte of a reply; None for the faults that
    cut a reply short (a dropped connection, or a stream's ``error`` event)."""
    outcome = f"fault:{fault.kind}"
    retry = {} if fault.retry_after is None else retry_headers(fault.retry_after)
    kind = fault.kind
    if kind == "sse_error" and not streaming:
        kind = "overloaded"
    if kind == "overloaded":
        return Outcome(529, "overloaded_error", "Overloaded", outcome, retry)
    if kind == "rate_limit":
        seconds = rate_limit_retry_after if fault.retry_after is None else fault.retry_after
        message = "This request would exceed your organization's rate limit."
        return Outcome(429, "rate_limit_error", message, outcome, retry_headers(seconds))
    if kind == "server_error":
        return Outcome(500, "api_error", "Internal server error", outcome, retry)
    return None


def sse(name: str, data: Mapping[str, object] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"event: {name}\ndata: {text}\n\n".encode()


def error_body(kind: str, message: str, request_id: str) -> ErrorBody:
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}


def retry_headers(seconds: float) -> dict[str, str]:
    """``retry-after`` in (possibly fractional) seconds, which the SDK accepts, plus ms."""
    return {"retry-after": f"{seconds:g}", "retry-after-ms": str(round(seconds * 1000))}


def error_response(route: Route | None, out: Outcome, request_id: str) -> web.Response:
    """An error in the shape of the front door it came in by."""
    provider = route.provider if route is not None else "anthropic"
    if provider == "bedrock":
        status, body, headers = bedrock_error(out.status, out.kind, out.message, request_id)
        return web.json_response(body, status=status, headers={**out.headers, **headers})
    if provider == "vertex" and out.outcome.startswith("auth"):
        return web.json_response(
            google_error(out.status, out.message), status=out.status, headers=out.headers
        )
    return web.json_response(
        error_body(out.kind, out.message, request_id),
        status=out.status,
        headers={"request-id": request_id, **out.headers},
    )


def answer_headers(route: Route, request_id: str, answer: _Answer) -> dict[str, str]:
    if route.provider != "bedrock":
        return {"request-id": request_id}
    return {
        "x-amzn-requestid": request_id,
        "x-amzn-bedrock-input-token-count": str(answer.cache.input_tokens),
        "x-amzn-bedrock-output-token-count": str(answer.reply.output_tokens),
    }


def with_invocation_metrics(
    events: list[tuple[str, StreamEvent]], answer: _Answer
) -> list[tuple[str, StreamEvent]]:
    """Bedrock's ``message_stop`` carries its own metrics (which a client must ignore)."""
    metrics: InvocationMetrics = {
        "inputTokenCount": answer.cache.input_tokens,
        "outputTokenCount": answer.reply.output_tokens,
        "invocationLatency": 1,
        "firstByteLatency": 1,
    }
    return [
        (name, _measured(data, metrics)) if name == "message_stop" else (name, data)
        for name, data in events
    ]


def _measured(data: StreamEvent, metrics: InvocationMetrics) -> StreamEvent:
    if data["type"] != "message_stop":
        return data
    measured: MessageStop = {**data, "amazon-bedrock-invocationMetrics": metrics}
    return measured


def _bedrock_event(name: str, data: Mapping[str, object] | str) -> bytes:
    """One event as a Bedrock frame; an ``error`` event (the API's mid-stream overload)
    becomes the exception Bedrock sends in its place."""
    if name == "error":
        return bedrock_exception_frame(
            "serviceUnavailableException", "Bedrock is unable to process your request."
        )
    return bedrock_frame(data if isinstance(data, dict) else {"type": name, "data": data})


def abort(request: web.Request) -> None:
    """Cut the TCP connection without a clean end, as a network failure would."""
    transport = request.transport
    if transport is not None:
        transport.abort()


def _stream_response(
    request_id: str, events: Sequence[SseEvent], route: Route | None, ping_every: int | None
) -> tuple[web.StreamResponse, list[bytes]]:
    """The response's headers and its frames: SSE with pings interleaved (none when
    ``ping_every`` is None), or Bedrock's event-stream frames, one per event."""
    if route is not None and route.provider == "bedrock":
        response = web.StreamResponse(
            status=200,
            headers={
                "content-type": "application/vnd.amazon.eventstream",
                "x-amzn-bedrock-content-type": "application/json",
                "x-amzn-requestid": request_id,
            },
        )
        return response, [_bedrock_event(name, data) for name, data in events]
    response = web.StreamResponse(
        status=200,
        headers={
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "request-id": request_id,
        },
    )
    frames = []
    for n, (name, data) in enumerate(events, start=1):
        frame = sse(name, data)
        ping = ping_every is not None and (n == 1 if ping_every == 0 else n % ping_every == 0)
        frames.append(frame + sse("ping", {"type": "ping"}) if ping else frame)
    return response, frames


async def send_events(
    request: web.Request,
    request_id: str,
    events: Sequence[SseEvent],
    event_delay: float,
    *,
    ping_every: int | None,
    cut: bool = False,
    route: Route | None = None,
) -> tuple[web.StreamResponse, bool]:
    """Stream events: one write each when they are paced or ``cut`` short, else one write.

    ``ping_every=0`` sends one ping after the first event; N > 0 after every N events.
    Returns the response and whether the client was still connected at the end.
    """
    response, frames = _stream_response(request_id, events, route, ping_every)
    try:
        await response.prepare(request)
        if event_delay or cut:
            for n, frame in enumerate(frames, start=1):
                if n > 1 and event_delay:
                    await asyncio.sleep(event_delay)
                await response.write(frame)
        else:
            # Nothing to wait for between events: one write carries them all (the same
            # bytes, fewer packets), so the server's own cost stays out of benchmarks.
            await response.write(b"".join(frames))
        if cut:
            abort(request)
        else:
            await response.write_eof()
    except ConnectionError:
        return response, False
    return response, True
