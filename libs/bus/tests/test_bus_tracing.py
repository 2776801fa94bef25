"""Trace context on the envelope (CloudEvents Distributed Tracing) against a real nats-server: injected on
publish inside a span, extracted into a CONSUMER child span; nothing at all with tracing off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from temporality_bus import Bus, Consumer, Delivery, PermanentError, tracing
from temporality_bus.pipeline import event_write
from temporality_protocol import Envelope, RunFailed, decode, make_event
from temporality_protocol.catalog import EVENTS_STREAM, ConsumerSpec, subject_for
from temporality_testing.spans import spans_in_memory

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _failed(run_id: str, **extra: str) -> Envelope:
    return make_event(
        RunFailed(run_id=run_id, reason="r", error="e"), source="/test", id=f"evt-{run_id}", run_id=run_id, **extra
    )


def _traceparent(context: trace.SpanContext) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def _producer(exported: InMemorySpanExporter, event_id: str) -> ReadableSpan:
    """The PRODUCER span the event ``event_id`` was written in (exactly one)."""
    (span,) = [
        s
        for s in exported.get_finished_spans()
        if s.kind is SpanKind.PRODUCER and (s.attributes or {}).get("messaging.message.id") == event_id
    ]
    return span


def _child_of(span: ReadableSpan, parent: trace.SpanContext | None) -> bool:
    return parent is not None and span.parent is not None and span.parent.span_id == parent.span_id


def _spec(durable: str) -> ConsumerSpec:
    return ConsumerSpec(durable, EVENTS_STREAM.name, (subject_for("run.failed"),), "test", backoff_s=(0.1,))


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process, spans kept in memory."""
    with spans_in_memory() as exporter:
        yield exporter


@pytest.fixture
def untraced() -> Iterator[InMemorySpanExporter]:
    """An SDK provider that exists but was never handed to the bus: tracing stays off."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert not tracing.enabled()
    yield exporter
    provider.shutdown()


async def _stored(bus: Bus, seq: int) -> Envelope:
    msg = await bus.js.get_msg(EVENTS_STREAM.name, seq)
    assert msg.data is not None
    return decode(msg.data)


async def _consume_one(bus: Bus, durable: str) -> AsyncIterator[tuple[Envelope, trace.SpanContext]]:
    seen: asyncio.Queue[tuple[Envelope, trace.SpanContext]] = asyncio.Queue()

    async def handler(event: Envelope, delivery: Delivery) -> None:
        await seen.put((event, trace.get_current_span().get_span_context()))

    stop = asyncio.Event()
    task = asyncio.create_task(Consumer(bus, _spec(durable), handler=handler).run(stop))
    try:
        yield await asyncio.wait_for(seen.get(), 15)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def _handled(bus: Bus, durable: str) -> tuple[Envelope, trace.SpanContext]:
    async for got in _consume_one(bus, durable):
        return got
    raise AssertionError("no message handled")


# --------------------------------------------------------------------------- tracing off
def test_outside_a_span_the_event_is_left_as_it_is(untraced: InMemorySpanExporter) -> None:
    event = _failed("off-1")
    assert tracing.traced(event) is event  # not even a copy
    assert b"traceparent" not in event_write(event).payload


async def test_with_tracing_off_nothing_is_added_and_no_span_is_made(bus: Bus, untraced: InMemorySpanExporter) -> None:
    seq = (await bus.publish(_failed("off-2"))).seq
    stored = await _stored(bus, seq)
    assert stored.traceparent is None
    assert stored.tracestate is None
    event, context = await _handled(bus, "t-trace-off")
    assert event.id == "evt-off-2"
    assert not context.is_valid  # the handler ran in no span
    assert untraced.get_finished_spans() == ()


async def test_with_tracing_off_a_carried_context_is_not_continued(bus: Bus, untraced: InMemorySpanExporter) -> None:
    await bus.publish(_failed("off-3", traceparent=TRACEPARENT))
    event, context = await _handled(bus, "t-trace-off-carried")
    assert event.traceparent == TRACEPARENT  # kept on the wire (it was set by its maker) ...
    assert not context.is_valid  # ... but no span is opened for it
    assert untraced.get_finished_spans() == ()


# --------------------------------------------------------------------------- tracing on
async def test_publishing_inside_a_span_injects_its_context(bus: Bus, exported: InMemorySpanExporter) -> None:
    with tracing.tracer().start_as_current_span("publisher") as span:
        seq = (await bus.publish(_failed("on-1"))).seq
        piped = decode(event_write(_failed("on-1b")).payload)
    stored = await _stored(bus, seq)
    # each event in a PRODUCER span of its own, the publisher's child, whose context it carries
    for event_id, carried in (("evt-on-1", stored), ("evt-on-1b", piped)):  # the pipelined path (the gateway's) too
        producer = _producer(exported, event_id)
        assert producer.context is not None
        assert _child_of(producer, span.get_span_context())
        assert producer.name == f"create {subject_for('run.failed')}"
        assert carried.traceparent == _traceparent(producer.context)
        assert (
            dict(producer.attributes or {}).items()
            >= {
                "messaging.system": "nats",
                "messaging.operation.type": "create",
                "messaging.destination.name": subject_for("run.failed"),
                "messaging.message.id": event_id,
                "cloudevents.event_type": "run.failed",
            }.items()
        )


async def test_tracestate_travels_with_the_traceparent(bus: Bus, exported: InMemorySpanExporter) -> None:
    parent = tracing.context_of(TRACEPARENT, "vendor=abc,other=1")
    assert parent is not None
    with tracing.tracer().start_as_current_span("publisher", context=parent):
        seq = (await bus.publish(_failed("on-2"))).seq
    stored = await _stored(bus, seq)
    assert stored.traceparent is not None
    assert stored.traceparent.startswith("00-0af7651916cd43dd8448eb211c80319c-")
    assert stored.tracestate == "vendor=abc,other=1"


async def test_consuming_opens_a_consumer_child_span_with_messaging_attributes(
    bus: Bus, exported: InMemorySpanExporter
) -> None:
    with tracing.tracer().start_as_current_span("publisher") as publisher:
        await bus.publish(_failed("on-3"))
    event, context = await _handled(bus, "t-trace-on")
    assert context.is_valid
    assert context.trace_id == publisher.get_span_context().trace_id
    spans = {s.name: s for s in exported.get_finished_spans()}
    consumer: ReadableSpan = spans[f"process {subject_for('run.failed')}"]
    assert consumer.kind is SpanKind.CONSUMER
    producer = _producer(exported, event.id)  # consumer <- producer <- publisher
    assert _child_of(consumer, producer.context)
    assert _child_of(producer, publisher.get_span_context())
    assert consumer.context is not None
    assert consumer.context.span_id == context.span_id
    assert (
        dict(consumer.attributes or {}).items()
        >= {
            "messaging.system": "nats",
            "messaging.destination.name": subject_for("run.failed"),
            "messaging.message.id": event.id,
            "messaging.consumer.group.name": "t-trace-on",
            "cloudevents.event_type": "run.failed",
            "temporality.run_id": "on-3",
        }.items()
    )


async def test_an_event_published_while_handling_continues_the_trace(bus: Bus, exported: InMemorySpanExporter) -> None:
    """What a handler publishes is produced in a child of the CONSUMER span, so the next consumer descends
    from it."""
    with tracing.tracer().start_as_current_span("root") as root:
        await bus.publish(_failed("chain-1"))
    forwarded: list[int] = []

    async def handler(event: Envelope, delivery: Delivery) -> None:
        if event.id == "evt-chain-1":
            forwarded.append((await bus.publish(_failed("chain-2"))).seq)

    stop = asyncio.Event()
    task = asyncio.create_task(Consumer(bus, _spec("t-trace-chain"), handler=handler).run(stop))
    try:
        async with asyncio.timeout(15):
            while len([s for s in exported.get_finished_spans() if s.kind is SpanKind.CONSUMER]) < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    first, second = sorted(
        (s for s in exported.get_finished_spans() if s.kind is SpanKind.CONSUMER),
        key=lambda s: s.attributes["messaging.message.id"] if s.attributes else "",
    )
    assert first.context is not None
    assert second.context is not None
    assert {first.context.trace_id, second.context.trace_id} == {root.get_span_context().trace_id}
    produced = _producer(exported, "evt-chain-2")
    assert produced.context is not None
    assert _child_of(second, produced.context)
    assert _child_of(produced, first.context)
    stored = await _stored(bus, forwarded[0])
    assert stored.traceparent == _traceparent(produced.context)


async def test_a_stored_context_is_kept_outside_a_span_and_replaced_inside_one(
    bus: Bus, exported: InMemorySpanExporter
) -> None:
    seq = (await bus.publish(_failed("kept-1", traceparent=TRACEPARENT))).seq
    assert (await _stored(bus, seq)).traceparent == TRACEPARENT
    with tracing.tracer().start_as_current_span("now") as span:
        seq = (await bus.publish(_failed("kept-2", traceparent=TRACEPARENT))).seq
    producer = _producer(exported, "evt-kept-2")
    assert producer.context is not None
    assert _child_of(producer, span.get_span_context())
    assert (await _stored(bus, seq)).traceparent == _traceparent(producer.context)
    assert [s for s in exported.get_finished_spans() if s.kind is SpanKind.PRODUCER] == [producer]  # none outside


@pytest.mark.parametrize("bad", ["garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01", "x" * 100])
async def test_an_unparseable_traceparent_is_handled_in_a_root_span(
    bus: Bus, exported: InMemorySpanExporter, bad: str
) -> None:
    assert tracing.context_of(bad) is None
    durable = f"t-trace-bad-{len(bad)}-{bad[:2]}"
    await bus.publish(_failed("bad-" + durable, traceparent=bad))
    event, context = await _handled(bus, durable)
    assert event.traceparent == bad
    assert context.is_valid
    (span,) = [s for s in exported.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    assert span.parent is None


async def test_dead_lettering_happens_in_an_error_span_continuing_the_message_s_trace(
    bus: Bus, exported: InMemorySpanExporter
) -> None:
    hooked: asyncio.Queue[trace.SpanContext] = asyncio.Queue()

    async def handler(event: Envelope, delivery: Delivery) -> None:
        raise PermanentError("never")

    async def on_dead_letter(message: Envelope | bytes, delivery: Delivery, error: BaseException) -> None:
        await hooked.put(trace.get_current_span().get_span_context())

    await bus.publish(_failed("dead-1", traceparent=TRACEPARENT))
    stop = asyncio.Event()
    consumer = Consumer(bus, _spec("t-trace-dead"), handler=handler, on_dead_letter=on_dead_letter)
    task = asyncio.create_task(consumer.run(stop))
    try:
        inside = await asyncio.wait_for(hooked.get(), 15)
        async with asyncio.timeout(15):
            while not [s for s in exported.get_finished_spans() if s.name.startswith("dead-letter")]:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    (dead,) = [s for s in exported.get_finished_spans() if s.name.startswith("dead-letter")]
    (handled,) = [s for s in exported.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    assert dead.status.status_code is StatusCode.ERROR
    assert "PermanentError: never" in (dead.status.description or "")
    assert handled.status.status_code is StatusCode.ERROR  # the handler's own span says it failed
    assert dead.context is not None
    assert f"{dead.context.trace_id:032x}" == TRACEPARENT[3:35]
    assert dead.parent is not None
    assert f"{dead.parent.span_id:016x}" == TRACEPARENT[36:52]
    assert inside.span_id == dead.context.span_id  # the service's hook ran inside it
    journaled = await bus.js.get_last_msg(EVENTS_STREAM.name, subject_for("bus.dead_lettered"))
    assert journaled.data is not None
    dead_lettered = decode(journaled.data)
    producer = _producer(exported, dead_lettered.id)  # bus.dead_lettered, written inside the error span
    assert producer.context is not None
    assert _child_of(producer, dead.context)
    assert dead_lettered.traceparent == _traceparent(producer.context)
