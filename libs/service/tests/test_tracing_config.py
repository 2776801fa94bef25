"""Tracing is configured from the standard ``OTEL_*`` environment: off without an endpoint, a clear
configuration error (exit 2 before connecting) for what the process cannot honour."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from temporality_bus import tracing as bus_tracing
from temporality_service import HTTP_TELEMETRY, TracingConfigError, configure_tracing
from temporality_service.logs import add_trace_ids
from temporality_service.tracing import tracing_wanted

_OTEL = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _OTEL:
        monkeypatch.delenv(name, raising=False)


def test_without_an_endpoint_tracing_is_off_and_nothing_is_installed() -> None:
    before = trace.get_tracer_provider()
    assert tracing_wanted() is None
    assert configure_tracing("trigger-gateway") is None
    assert trace.get_tracer_provider() is before  # no SDK provider: the API's no-op stays
    assert not bus_tracing.enabled()


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"])
def test_an_otlp_endpoint_turns_it_on(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    monkeypatch.setenv(variable, "http://127.0.0.1:4318")
    assert tracing_wanted() == "otlp"


@pytest.mark.parametrize(("variable", "value"), [("OTEL_SDK_DISABLED", "true"), ("OTEL_TRACES_EXPORTER", "none")])
def test_the_standard_switches_turn_it_off_whatever_the_endpoint(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv(variable, value)
    assert tracing_wanted() is None


def test_console_needs_no_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    assert tracing_wanted() == "console"


def test_an_unknown_exporter_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(TracingConfigError, match="zipkin"):
        tracing_wanted()


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"])
def test_otlp_over_grpc_is_refused_before_anything_is_installed(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    before = trace.get_tracer_provider()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv(variable, "grpc")
    with pytest.raises(TracingConfigError, match="http/protobuf"):
        configure_tracing("journal")
    assert trace.get_tracer_provider() is before
    assert not bus_tracing.enabled()


def test_probes_are_never_traced() -> None:
    exclude = HTTP_TELEMETRY.get("exclude")
    assert exclude is not None
    assert exclude({"type": "http", "path": "/readyz"})
    assert exclude({"type": "http", "path": "/metrics"})
    assert not exclude({"type": "http", "path": "/hooks/ado-pr-review"})


def test_a_log_line_inside_a_span_names_its_trace() -> None:
    assert add_trace_ids(None, "info", {"event": "outside"}) == {"event": "outside"}
    provider = TracerProvider()
    with provider.get_tracer("test").start_as_current_span("work") as span:
        line = add_trace_ids(None, "info", {"event": "inside"})
    context = span.get_span_context()
    assert line == {"event": "inside", "trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}
    provider.shutdown()
