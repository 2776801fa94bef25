"""Trace context across timers and request/reply, against a real nats-server: a timer armed inside a span fires
in that trace (or, for a self-re-arming one, a new trace linked to it); a NATS request carries the caller's
context in its headers and the responder answers in a SERVER child span. Nothing at all with tracing off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import nats.errors
import pytest
from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import BaseModel, Field

from temporality_bus import (
    Bus,
    Consumer,
    Delivery,
    Failure,
    NatsSettings,
    Request,
    Responder,
    Timers,
    tracing,
    written_out,
)
from temporality_protocol import RunFailed, decode, make_event
from temporality_protocol.catalog import EVENTS_STREAM, ConsumerSpec
from temporality_testing.spans import spans_in_memory
from temporality_testing.timers import TEST_TIMERS_STREAM

SUBJECT = "temporality.rpc.test.traced"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process, spans kept in memory."""
    with spans_in_memory() as exporter:
        yield exporter


@pytest.fixture
async def other_bus(nats_settings: NatsSettings) -> AsyncIterator[Bus]:
    async with Bus.connect(nats_settings, name="test-2") as b:
        yield b


@pytest.fixture
def untraced() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert not tracing.enabled()
    yield exporter
    provider.shutdown()


# --------------------------------------------------------------------------- timers
Fired = tuple[bytes, dict[str, str], trace.SpanContext, int]


async def _arm(timers: Timers, key: str) -> None:
    """Arm ``key`` to fire in under a second (rounded up to the next whole second)."""
    await timers.arm(key, datetime.now(UTC) + timedelta(milliseconds=200), key.encode())


async def _fired(bus: Bus, timers: Timers, *, publish_as: str | None = None) -> Fired:
    """Consume one firing with a real consumer runner: the payload, the fired message's headers, the handler's
    span context and (``publish_as``) the stream sequence of an event the handler published."""
    seen: asyncio.Queue[Fired] = asyncio.Queue()

    async def handler(data: bytes, delivery: Delivery) -> None:
        seq = 0
        if publish_as is not None:
            event = make_event(RunFailed(run_id=publish_as, reason="r", error="e"), source="/t", run_id=publish_as)
            seq = (await bus.publish(event)).seq
        await seen.put((data, dict(delivery.msg.headers or {}), trace.get_current_span().get_span_context(), seq))

    spec = ConsumerSpec(
        f"t-fire-{timers.namespace}", TEST_TIMERS_STREAM.name, (timers.fired_filter,), "test", backoff_s=(0.1,)
    )
    stop = asyncio.Event()
    task = asyncio.create_task(Consumer(bus, spec, raw_handler=handler).run(stop))
    try:
        return await asyncio.wait_for(seen.get(), 15)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


def _consumer_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CONSUMER]


async def test_a_timer_armed_in_a_span_fires_in_that_trace(bus: Bus, exported: InMemorySpanExporter) -> None:
    timers = Timers(bus, "trcont", stream=TEST_TIMERS_STREAM)
    with tracing.tracer().start_as_current_span("arming") as arming:
        armed = arming.get_span_context()
        await _arm(timers, "k1")
    data, headers, inside, seq = await _fired(bus, timers, publish_as="run-timer-1")  # after the span ended
    assert data == b"k1"
    assert headers["traceparent"].split("-")[1] == f"{armed.trace_id:032x}"
    (span,) = _consumer_spans(exported)
    assert span.name == f"process {timers.fired_subject('k1')}"
    assert span.context is not None
    assert span.parent is not None
    assert span.context.trace_id == armed.trace_id
    assert span.parent.span_id == armed.span_id
    assert span.attributes is not None
    assert span.attributes["messaging.consumer.group.name"] == "t-fire-trcont"
    assert inside.span_id == span.context.span_id  # the handler ran inside it
    stored = await bus.js.get_msg(EVENTS_STREAM.name, seq)  # what it published continues the trace
    assert stored.data is not None
    published = decode(stored.data)
    (producer,) = [s for s in exported.get_finished_spans() if s.kind is SpanKind.PRODUCER]  # written in the firing
    assert producer.parent is not None
    assert producer.parent.span_id == span.context.span_id
    assert producer.context is not None
    assert (producer.attributes or {}).get("messaging.message.id") == published.id
    assert published.traceparent is not None
    assert published.traceparent.startswith(f"00-{armed.trace_id:032x}-{producer.context.span_id:016x}-")


async def test_a_self_rearming_timer_fires_in_a_new_trace_linked_to_the_arming_span(
    bus: Bus, exported: InMemorySpanExporter
) -> None:
    timers = Timers(bus, "trlink", stream=TEST_TIMERS_STREAM, trace="link")
    with tracing.tracer().start_as_current_span("arming") as arming:
        armed = arming.get_span_context()
        await _arm(timers, "k1")
    _, headers, inside, _ = await _fired(bus, timers)
    assert "traceparent" not in headers
    assert headers[tracing.TRACE_LINK_HEADER].split("-")[1] == f"{armed.trace_id:032x}"
    (span,) = _consumer_spans(exported)
    assert span.parent is None
    assert span.context is not None
    assert span.context.trace_id != armed.trace_id
    assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [(armed.trace_id, armed.span_id)]
    assert inside.span_id == span.context.span_id


@pytest.mark.parametrize("case", ["none-mode", "outside-a-span"])
async def test_a_timer_without_a_context_carries_none_and_fires_without_a_span(
    bus: Bus, exported: InMemorySpanExporter, case: str
) -> None:
    if case == "none-mode":
        timers = Timers(bus, "trnone", stream=TEST_TIMERS_STREAM, trace="none")
        with tracing.tracer().start_as_current_span("arming"):
            await _arm(timers, "k1")
    else:
        timers = Timers(bus, "trout", stream=TEST_TIMERS_STREAM)
        await _arm(timers, "k1")
    _, headers, inside, _ = await _fired(bus, timers)
    assert not {"traceparent", "tracestate", tracing.TRACE_LINK_HEADER} & headers.keys()
    assert not inside.is_valid
    assert _consumer_spans(exported) == []


async def test_with_tracing_off_a_timer_carries_no_context(bus: Bus, untraced: InMemorySpanExporter) -> None:
    timers = Timers(bus, "troff", stream=TEST_TIMERS_STREAM)
    with trace.NoOpTracer().start_as_current_span("ignored"):
        await _arm(timers, "k1")
    _, headers, inside, _ = await _fired(bus, timers)
    assert not {"traceparent", tracing.TRACE_LINK_HEADER} & headers.keys()
    assert not inside.is_valid
    assert untraced.get_finished_spans() == ()


# --------------------------------------------------------------------------- request/reply
class Ping(BaseModel):
    text: str
    protocol_versions: list[str] = Field(default_factory=lambda: ["1.0"])


class Pong(BaseModel):
    text: str | None = None
    traceparent: str | None = None
    error: str | None = None


def _error(failure: Failure) -> Pong:
    return Pong(error=failure.detail)


async def _echo(request: Request[Ping]) -> Pong:
    context = trace.get_current_span().get_span_context()
    seen = f"00-{context.trace_id:032x}-{context.span_id:016x}-01" if context.is_valid else None
    return Pong(text=request.body.text, traceparent=seen)


async def _request(bus: Bus, body: Ping) -> Pong:
    """``Bus.request``; "no responders" right after another connection's SUB + flush is retried for a while
    (the server has not propagated the interest yet: see test_responder.py)."""
    async with asyncio.timeout(15):
        while True:
            try:
                return Pong.model_validate_json(await bus.request(SUBJECT, body.model_dump_json().encode(), 15))
            except nats.errors.NoRespondersError:
                await asyncio.sleep(0.05)


async def test_a_request_carries_the_callers_context_and_is_answered_in_a_server_child_span(
    bus: Bus, other_bus: Bus, exported: InMemorySpanExporter
) -> None:
    responder = Responder(other_bus, SUBJECT, request_model=Ping, handler=_echo, on_error=_error, queue="q")
    await responder.start()
    try:
        with tracing.tracer().start_as_current_span("caller") as caller:
            pong = await _request(bus, Ping(text="hi"))
        bare = Pong.model_validate_json(
            (await bus.nc.request(SUBJECT, Ping(text="bare").model_dump_json().encode(), 15)).data
        )  # the responder answered "hi" just before: its interest is known
    finally:
        await responder.stop()
    assert pong.text == "hi"
    servers = [s for s in exported.get_finished_spans() if s.kind is SpanKind.SERVER]
    (server,) = [s for s in servers if s.parent is not None]
    (root,) = [s for s in servers if s.parent is None]
    assert server.parent is not None
    clients = [s for s in exported.get_finished_spans() if s.kind is SpanKind.CLIENT]
    (client,) = [s for s in clients if s.context is not None and s.context.span_id == server.parent.span_id]
    # a retried "no responders" leaves an error span of its own
    assert all(s.status.status_code is StatusCode.ERROR for s in clients if s is not client)
    assert client.name == f"send {SUBJECT}"
    assert server.name == f"process {SUBJECT}"
    assert client.context is not None
    assert server.context is not None
    assert client.parent is not None
    assert client.parent.span_id == caller.get_span_context().span_id
    assert server.parent is not None
    assert server.parent.span_id == client.context.span_id
    assert server.context.trace_id == caller.get_span_context().trace_id
    assert pong.traceparent == f"00-{server.context.trace_id:032x}-{server.context.span_id:016x}-01"
    # a requester that sends no context (an external agent's plain request): a root SERVER span
    assert root.context is not None
    assert bare.traceparent == f"00-{root.context.trace_id:032x}-{root.context.span_id:016x}-01"


async def test_with_tracing_off_a_request_carries_no_headers(
    bus: Bus, other_bus: Bus, untraced: InMemorySpanExporter
) -> None:
    received: list[dict[str, str] | None] = []

    async def record(msg: Msg) -> None:
        received.append(msg.headers)
        await msg.respond(Pong(text="ok").model_dump_json().encode())

    sub = await other_bus.nc.subscribe(SUBJECT, cb=record)
    await written_out(other_bus.nc)
    try:
        assert (await _request(bus, Ping(text="x"))).text == "ok"
    finally:
        await sub.unsubscribe()
    assert received == [None]
    assert untraced.get_finished_spans() == ()
