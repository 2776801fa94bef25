"""The human wait keeps the question's trace context: stored with the request, carried by what is built
for it outside any span (an expiry after a timer), replaced by the current span's inside one."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from human_support import requested
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from temporality_bus import Bus, tracing
from temporality_bus.pipeline import event_write
from temporality_human_interaction.events import answered_event, expired_event
from temporality_human_interaction.records import HumanRequestRecord, open_store
from temporality_human_interaction.traces import answering
from temporality_protocol import HumanRequested, HumanRequestState, OptionAnswer, decode
from temporality_testing.spans import spans_in_memory

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _record(traceparent: str | None, tracestate: str | None = None) -> HumanRequestRecord:
    event = requested().model_copy(update={"traceparent": traceparent, "tracestate": tracestate})
    return HumanRequestRecord.from_requested(event, event.payload(HumanRequested))


def test_the_request_keeps_the_context_human_requested_was_published_in() -> None:
    record = _record(TRACEPARENT, "vendor=abc")
    assert record.traceparent == TRACEPARENT
    assert record.tracestate == "vendor=abc"
    assert HumanRequestRecord.model_validate_json(record.model_dump_json()).traceparent == TRACEPARENT


def test_with_tracing_off_nothing_is_kept_and_nothing_is_carried() -> None:
    record = _record(None)
    assert record.traceparent is None
    assert b"traceparent" not in event_write(expired_event(record, now=datetime.now(UTC))).payload


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process, spans kept in memory."""
    with spans_in_memory() as exporter:
        yield exporter


def test_an_event_built_outside_any_span_continues_the_stored_context() -> None:
    """A timer's expiry (or a repair's republished answer) carries the question's trace context."""
    record = _record(TRACEPARENT, "vendor=abc")
    sent = decode(event_write(expired_event(record, now=datetime.now(UTC))).payload)
    assert sent.traceparent == TRACEPARENT
    assert sent.tracestate == "vendor=abc"


def test_inside_a_span_the_event_carries_its_producer_span_below_that_span_a_child_of_the_stored_context(
    exported: InMemorySpanExporter,
) -> None:
    record = _record(TRACEPARENT).moved_to(
        HumanRequestState.ANSWERED,
        answer=OptionAnswer(option_id="keep-v1", label="Keep"),
        responder="user:alice",
        answered_at=datetime.now(UTC),
    )
    parent = tracing.context_of(record.traceparent)
    with tracing.tracer().start_as_current_span("answer web", context=parent) as span:
        sent = decode(event_write(answered_event(record, channel="web")).payload)
    (producer,) = [s for s in exported.get_finished_spans() if s.kind is SpanKind.PRODUCER]
    assert producer.parent is not None
    assert producer.parent.span_id == span.get_span_context().span_id
    context = producer.get_span_context()
    assert sent.traceparent == f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    assert f"{context.trace_id:032x}" == TRACEPARENT[3:35]  # the same trace as the question


async def test_a_chat_answer_continues_the_stored_context_as_its_parent(
    bus: Bus, exported: InMemorySpanExporter
) -> None:
    record = _record(TRACEPARENT)
    await (await open_store(bus)).create(record.request_id, record)
    async with answering(bus, "telegram", record.request_id):
        inside = trace.get_current_span().get_span_context()
    (span,) = exported.get_finished_spans()
    assert span.name == "answer telegram"
    assert f"{inside.trace_id:032x}" == TRACEPARENT[3:35]
    assert span.parent is not None
    assert f"{span.parent.span_id:016x}" == TRACEPARENT[36:52]
    assert span.links == ()  # no HTTP request around it


async def test_a_web_answer_links_its_http_span_and_is_the_child_of_the_question(
    bus: Bus, exported: InMemorySpanExporter
) -> None:
    record = _record(TRACEPARENT)
    await (await open_store(bus)).create(record.request_id, record)
    with tracing.tracer().start_as_current_span("POST /requests/{request_id}/answer") as http_span:
        async with answering(bus, "web", record.request_id):
            pass
    answer = next(s for s in exported.get_finished_spans() if s.name == "answer web")
    assert answer.parent is not None
    assert f"{answer.parent.span_id:016x}" == TRACEPARENT[36:52]
    assert [link.context.span_id for link in answer.links] == [http_span.get_span_context().span_id]


async def test_a_request_asked_before_tracing_was_on_is_answered_in_the_http_span_s_trace(
    bus: Bus, exported: InMemorySpanExporter
) -> None:
    record = _record(None)
    await (await open_store(bus)).create(record.request_id, record)
    with tracing.tracer().start_as_current_span("POST /requests/{request_id}/answer") as http_span:
        async with answering(bus, "web", record.request_id):
            pass
    answer = next(s for s in exported.get_finished_spans() if s.name == "answer web")
    assert answer.parent is not None
    assert answer.parent.span_id == http_span.get_span_context().span_id
    assert answer.links == ()


async def test_with_tracing_off_an_answer_opens_no_span(bus: Bus) -> None:
    assert not tracing.enabled()
    async with answering(bus, "web", "hr-never-stored"):
        assert not trace.get_current_span().get_span_context().is_valid
