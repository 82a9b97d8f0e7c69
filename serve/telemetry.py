"""Tracing: OpenTelemetry spans per request, lane, engine step and chip-to-chip hop.

Off by default, costing nothing (the API's no-op tracer). The OpenTelemetry SDK's own environment
variables turn it on in every process that calls ``setup`` (the gateway, router, lanes and gRPC
server; Ray workers inherit the environment of the ``fastmode up`` that started them):

- ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) exports OTLP there,
  over ``OTEL_EXPORTER_OTLP_PROTOCOL`` (``grpc`` or ``http/protobuf``, the spec's default);
- ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, ``none``; comma-separated) picks exporters
  explicitly; ``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*`` work as the SDK defines;
- ``FASTMODE_TRACE_FILE=PATH`` also appends every span batch to PATH as OTLP JSON (one
  ``ExportTraceServiceRequest`` per line), which ``fastmode trace`` reads.

Spans hold no prompt, output, key or error message (which may quote the request) unless
``telemetry.record_content`` asks for text on the request span (``serve.router``).

Context crosses process boundaries as W3C ``traceparent`` carriers: from the caller (WebSocket
``metadata``, HTTP headers, gRPC metadata) into the router, and from the router to the lane inside
the request. Chip actors create no spans: every ``Hop`` carries its receiver's timestamp, and the
fast lane turns hop records into spans with exact start and end times.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context

TRACER_NAME = "fastmode"
_lock = threading.Lock()
_configured = False


def setup(process: str) -> bool:
    """Configure this process's tracer provider from the environment (idempotent); whether on."""
    global _configured
    with _lock:
        if _configured:
            return _enabled()
        _configured = True
        exporters = _exporters()
        if not exporters:
            return False
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "fastmode"),
                                    "fastmode.process": process, "process.pid": os.getpid()})
        provider = TracerProvider(resource=resource)  # the sampler comes from OTEL_TRACES_SAMPLER
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        return True


def _enabled() -> bool:
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def _exporters() -> list:
    env = os.environ
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    names = {n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "otlp" if endpoint else "").split(",") if n.strip()}
    out = []
    if "otlp" in names:
        protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        out.append(OTLPSpanExporter())  # reads the endpoint, headers, timeout from the environment
    if "console" in names:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        out.append(ConsoleSpanExporter())
    if env.get("FASTMODE_TRACE_FILE"):
        out.append(JsonFileExporter(env["FASTMODE_TRACE_FILE"]))
    return out


class JsonFileExporter:
    """Appends each batch of spans to a file as one OTLP JSON ``ExportTraceServiceRequest`` line."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans) -> Any:
        from google.protobuf.json_format import MessageToJson
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from opentelemetry.sdk.trace.export import SpanExportResult

        line = MessageToJson(encode_spans(spans), indent=None)
        with self._lock, open(self.path, "a") as f:
            f.write(line.replace("\n", "") + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def extract(carrier: Mapping[str, str] | None) -> Context | None:
    """The caller's context from a carrier holding ``traceparent`` (``None`` if there is none).

    The carrier is a request's ``metadata`` before validation: a ``traceparent`` that is not a string
    is no trace context (the request is refused later, naming the field)."""
    if not carrier or not isinstance(carrier.get("traceparent"), str):
        return None
    return propagate.extract({k: v for k, v in carrier.items() if isinstance(k, str) and isinstance(v, str)})


def inject(span: trace.Span) -> dict[str, str]:
    """A carrier (``traceparent``) that makes ``span`` the parent on the other side."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def with_traceparent(body: Any, headers: Mapping[str, str]) -> Any:
    """``body`` (a request dict) with the HTTP ``traceparent`` header copied into its metadata,
    unless the body already carries one."""
    tp = headers.get("traceparent")
    if tp and isinstance(body, dict):
        meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        if "traceparent" not in meta:
            body = body | {"metadata": {**meta, "traceparent": tp}}
    return body
