"""Telemetry: a session's events exported as OpenTelemetry traces, for the tracing tools a
team already runs (Jaeger, Tempo, Phoenix, …). The OpenTelemetry SDK is imported only when
traces are asked for.
"""
