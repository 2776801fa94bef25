"""Spans kept in memory: tracing switched on in the test's own process, for tests that read the spans it made."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from temporality_bus import tracing


@contextmanager
def spans_in_memory() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process (an SDK provider of its own, not the global one) while inside; every finished span
    is in the exporter (``get_finished_spans()``). Off again, and the provider shut down, on the way out."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()
