"""Tracing for a service process: the OpenTelemetry SDK from the standard ``OTEL_*`` environment, and how
the HTTP apps make their SERVER spans (:data:`HTTP_TELEMETRY`).

:func:`configure_tracing` is called once per process by the runtime (after logging, before connecting).
Tracing is **on** only when an OTLP endpoint is configured (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT``) or ``OTEL_TRACES_EXPORTER=console``; ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` turn it off whatever else is set. Off, no tracer provider is installed and
nothing builds a span or encodes a header (:mod:`temporality_bus.tracing`). On:

==================================  ==========================================================================
``OTEL_SERVICE_NAME``               ``service.name`` (default: the service's own name, ``trigger-gateway`` ...)
``OTEL_RESOURCE_ATTRIBUTES``        more resource attributes (``deployment.environment=prod,...``)
``OTEL_EXPORTER_OTLP_*``            endpoint, headers, timeout, compression, certificates (the SDK reads them)
``OTEL_EXPORTER_OTLP_PROTOCOL``     ``http/protobuf`` (the default and the only one shipped); else exit 2
``OTEL_TRACES_SAMPLER``, ``_ARG``   the sampler (default ``parentbased_always_on``)
``OTEL_BSP_*``                      the batch span processor (``SCHEDULE_DELAY`` ms, queue and batch sizes)
==================================  ==========================================================================

HTTP requests get their SERVER spans from FastAPI's built-in instrumentation (:data:`HTTP_TELEMETRY`).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any

import structlog
from fastapi.telemetry import TelemetryConfig
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from temporality_bus import tracing as bus_tracing

__all__ = ["HTTP_TELEMETRY", "TracingConfigError", "configure_tracing", "shutdown_tracing", "tracing_wanted"]

log = structlog.get_logger(__name__)
_SUPPORTED_PROTOCOLS = ("http/protobuf",)
#: Paths probed every few seconds (kubelet, Prometheus): never a span.
_PROBES = frozenset({"/healthz", "/readyz", "/metrics"})


def _probe(scope: MutableMapping[str, Any]) -> bool:
    return scope.get("path") in _PROBES


#: Every service's ``FastAPI(telemetry=HTTP_TELEMETRY)``: FastAPI's own OpenTelemetry instrumentation makes
#: one SERVER span per request (``POST /hooks/{trigger_id}``: ``http.route``, ``http.response.status_code``,
#: the parent from the request's ``traceparent``) once a tracer provider is installed, and nothing until
#: then. Without the probes, and without its per-operation spans (dependencies, endpoint, serialization):
#: what a handler publishes is the child of the request's span itself.
HTTP_TELEMETRY: TelemetryConfig = {"exclude": _probe, "operation_spans": False}


class TracingConfigError(ValueError):
    """The ``OTEL_*`` environment asks for something this process cannot do (exit 2, before connecting)."""


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def tracing_wanted() -> str | None:
    """The exporter the environment asks for (``otlp``, ``console``), or ``None``: tracing off."""
    if _env("OTEL_SDK_DISABLED").lower() == "true":
        return None
    exporters = [e.strip() for e in (_env("OTEL_TRACES_EXPORTER") or "otlp").lower().split(",") if e.strip()]
    if "none" in exporters or not exporters:
        return None
    unknown = sorted(set(exporters) - {"otlp", "console"})
    if unknown:
        raise TracingConfigError(f"OTEL_TRACES_EXPORTER: {unknown} not supported (otlp, console or none)")
    if "otlp" in exporters and (_env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or _env("OTEL_EXPORTER_OTLP_ENDPOINT")):
        return "otlp"
    return "console" if "console" in exporters else None


def _exporter(kind: str) -> SpanExporter:
    if kind == "console":
        return ConsoleSpanExporter()
    protocol = _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or _env("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    if protocol not in _SUPPORTED_PROTOCOLS:
        raise TracingConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r} is not supported: Temporality exports OTLP over http/protobuf"
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # only when tracing is on

    return OTLPSpanExporter()


def configure_tracing(service: str) -> TracerProvider | None:
    """Install the SDK tracer provider the ``OTEL_*`` environment describes, or nothing (tracing off).

    Raises :class:`TracingConfigError` for an environment it cannot honour. Call :func:`shutdown_tracing`
    with the provider at exit: it exports the spans still queued."""
    kind = tracing_wanted()
    if kind is None:
        return None
    exporter = _exporter(kind)
    # Resource.create also reads OTEL_RESOURCE_ATTRIBUTES; OTEL_SERVICE_NAME, when set, names the service.
    resource = Resource.create({SERVICE_NAME: _env("OTEL_SERVICE_NAME") or service, "service.namespace": "temporality"})
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER(_ARG)
    provider.add_span_processor(BatchSpanProcessor(exporter))  # OTEL_BSP_* from the environment
    trace.set_tracer_provider(provider)
    bus_tracing.enable(provider)
    log.info(
        "tracing.enabled",
        exporter=kind,
        service_name=resource.attributes.get(SERVICE_NAME),
        sampler=_env("OTEL_TRACES_SAMPLER") or "parentbased_always_on",
    )
    return provider


def shutdown_tracing(provider: TracerProvider | None) -> None:
    """Export what is queued and stop (bounded by the exporter's timeout); nothing when tracing was off."""
    if provider is None:
        return
    bus_tracing.disable()
    try:
        provider.shutdown()
    except Exception as exc:  # the collector may be gone at shutdown: losing spans must not fail the exit
        log.warning("tracing.shutdown_failed", error=repr(exc))
