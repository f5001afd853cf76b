"""Tracing switched on for a session: the OpenTelemetry SDK set up to export its spans.

With tracing off the OpenTelemetry SDK and its exporter are never imported.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ..core.errors import ConfigError
from ..core.settings import Settings
from .ids import TurnIds
from .traces import Traces

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor

#: The standard variables that switch tracing on, as every OpenTelemetry SDK reads them.
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
INSTALL_HINT = "pip install 'orchmode[otel]'"


def tracing_wanted(settings: Settings, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this session exports traces: ``otlp_endpoint``, or an OTLP endpoint variable."""
    return bool(settings.otlp_endpoint) or any(environ.get(name) for name in ENDPOINT_VARIABLES)


def start_tracing(
    settings: Settings,
    secrets: Iterable[str] = (),
    environ: Mapping[str, str] = os.environ,
    processor: SpanProcessor | None = None,
) -> Traces:
    """The session's tracer, exporting over OTLP/HTTP in batches (or to ``processor``).

    Every standard ``OTEL_*`` variable is honoured (headers, timeout, compression, service
    name, resource attributes, sampler, batch sizes): the SDK reads them itself.
    ``service.name`` is ``orchmode`` unless they name one. Raises :class:`ConfigError` when
    the OpenTelemetry packages are not installed.
    """
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import IdGenerator
    except ImportError:
        raise ConfigError(
            f"traces were asked for (--otlp-endpoint or OTEL_EXPORTER_OTLP_*), but the "
            f"OpenTelemetry packages are not installed — {INSTALL_HINT}"
        ) from None
    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named else {"service.name": "orchmode"})
    ids = TurnIds()

    class Generator(IdGenerator):  # the SDK's interface, over the plan above
        def generate_trace_id(self) -> int:
            return ids.trace_id()

        def generate_span_id(self) -> int:
            return ids.span_id()

    provider = TracerProvider(resource=resource, id_generator=Generator())
    if processor is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = settings.otlp_endpoint
        exporter = (
            OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
            if endpoint
            else OTLPSpanExporter()
        )
        processor = BatchSpanProcessor(exporter)
    provider.add_span_processor(processor)
    traces = Traces(provider, settings, secrets)
    traces.ids = ids
    return traces
