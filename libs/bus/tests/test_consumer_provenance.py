"""SEC-1/AP-11 on a real nats-server: a consumer refuses an event whose envelope claims another sender than
the services that publish its type (the catalogue's ``senders_of``): dead-lettered and journaled, never
handled, and the service's dead-letter hook is not told (a forger must not make it act)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from nats.js.errors import NotFoundError

from temporality_bus import Bus, Consumer, Delivery, NatsSettings, SourceCheck
from temporality_bus.provenance import claimed_service, forgery
from temporality_protocol import BusDeadLettered, Envelope, LaunchSource, RunFailed, RunRequested, make_event
from temporality_protocol.catalog import (
    DLQ_STREAM,
    EVENTS_STREAM,
    ConsumerSpec,
    senders_of,
    service_source,
    subject_for,
)
from temporality_protocol.envelope import encode
from temporality_testing.events import EventLog

Connect = Callable[[SourceCheck], Awaitable[Bus]]


def _failed(run_id: str, *, source: str, actor: str | None = None) -> Envelope:
    data = RunFailed(run_id=run_id, reason="r", error="e")
    return make_event(data, source=source, id=f"evt-{run_id}", run_id=run_id, actor=actor)


def _requested(run_id: str, *, source: str) -> Envelope:
    data = RunRequested(run_id=run_id, agent="reviewer", title="t", launch=LaunchSource(kind="api"))
    return make_event(data, source=source, id=f"evt-{run_id}", run_id=run_id)


def _spec(durable: str, *types: str) -> ConsumerSpec:
    return ConsumerSpec(durable, EVENTS_STREAM.name, tuple(subject_for(t) for t in types), "test", backoff_s=(0.1,))


@pytest.fixture
async def connect(nats_settings: NatsSettings, bus: Bus) -> AsyncIterator[Connect]:
    """A Bus named like a consuming service, with the given check (``bus`` made the streams first)."""
    async with contextlib.AsyncExitStack() as stack:

        async def make(mode: SourceCheck) -> Bus:
            settings = nats_settings.model_copy(update={"source_check": mode})
            return await stack.enter_async_context(Bus.connect(settings, name="human-interaction"))

        yield make


async def _settled(bus: Bus, spec: ConsumerSpec, seq: int, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            info = await bus.js.consumer_info(spec.stream, spec.durable)
        except NotFoundError:
            assert time.monotonic() < deadline, f"consumer {spec.durable} never created"
            await asyncio.sleep(0.05)
            continue
        if info.ack_floor.stream_seq >= seq and info.num_ack_pending == 0:
            return
        assert time.monotonic() < deadline, f"not settled: {info}"
        await asyncio.sleep(0.05)


async def _dlq(bus: Bus, durable: str) -> list[tuple[str, str]]:
    """The dead letters of ``durable``: (original event id, error header), in order."""
    out: list[tuple[str, str]] = []
    info = await bus.js.stream_info(DLQ_STREAM.name, subjects_filter=f"temporality.dlq.{durable}")
    count = int((info.state.subjects or {}).get(f"temporality.dlq.{durable}", 0))
    if count == 0:
        return out
    reader = await bus.js.subscribe(f"temporality.dlq.{durable}", ordered_consumer=True)
    try:
        for _ in range(count):
            msg = await reader.next_msg(timeout=5)
            headers = msg.headers or {}
            out.append((Envelope.model_validate_json(msg.data).id, headers.get("Temporality-Error", "")))
    finally:
        await reader.unsubscribe()
    return out


async def _run(
    bus: Bus, spec: ConsumerSpec, events: list[Envelope], *, batch: bool = False
) -> tuple[list[str], list[str]]:
    """Publish ``events``, run a consumer of ``spec`` until all are settled: (ids handled, ids the hook saw)."""
    handled: list[str] = []
    hooked: list[str] = []

    async def handler(event: Envelope, delivery: Delivery) -> None:
        handled.append(event.id)

    async def batch_handler(items: list[tuple[Envelope, Delivery]]) -> None:
        handled.extend(event.id for event, _ in items)

    async def hook(message: Envelope | bytes, delivery: Delivery, error: BaseException) -> None:
        hooked.append(message.id if isinstance(message, Envelope) else "bytes")

    last = 0
    for event in events:
        last = (await bus.publish_raw(event.nats_subject, encode(event), {"Nats-Msg-Id": event.id})).seq
    stop = asyncio.Event()
    consumer = Consumer(
        bus, spec, handler=handler, on_dead_letter=hook, batch_handler=batch_handler if batch else None, batch_size=10
    )
    task = asyncio.create_task(consumer.run(stop))
    try:
        await _settled(bus, spec, last)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    return handled, hooked


async def _journaled(event_log: EventLog, durable: str, original_id: str) -> BusDeadLettered:
    [event] = await event_log.wait_for(
        "bus.dead_lettered",
        where=lambda e: e.data.get("consumer") == durable and e.data.get("original_id") == original_id,
        timeout_s=10,
    )
    return event.payload(BusDeadLettered)


async def test_strict_a_forged_sender_is_dead_lettered_and_journaled_never_handled(
    connect: Connect, event_log: EventLog
) -> None:
    bus = await connect("strict")
    spec = _spec("t-prov-strict", "run.failed")
    owned = _failed("owned", source=service_source("run-executor"))
    forged = _failed("forged", source=service_source("trigger-gateway"))  # run.failed is the executor's
    nobody = _failed("nobody", source="/test")  # strict: no service's source at all
    impostor = _failed("impostor", source=service_source("run-executor"), actor="service:journal")
    agent = _failed("agent", source=service_source("run-executor"), actor="agent:reviewer")  # who caused it: fine

    handled, hooked = await _run(bus, spec, [forged, owned, nobody, impostor, agent])

    assert handled == ["evt-owned", "evt-agent"]
    assert hooked == []  # the service is never told of a forgery
    letters = dict(await _dlq(bus, spec.durable))
    assert sorted(letters) == ["evt-forged", "evt-impostor", "evt-nobody"]
    assert letters["evt-forged"].startswith("ForgedEvent: source '/temporality/trigger-gateway' claims trigger-gateway")
    assert "run.failed is sent by run-executor" in letters["evt-forged"]
    assert "is no service's" in letters["evt-nobody"]
    assert "actor 'service:journal'" in letters["evt-impostor"]
    record = await _journaled(event_log, spec.durable, "evt-forged")
    assert record.original_type == "run.failed"
    assert record.error.startswith("ForgedEvent:")
    assert record.deliveries == 1  # refused at once, never retried
    for original in ("evt-nobody", "evt-impostor"):
        await _journaled(event_log, spec.durable, original)


async def test_an_event_several_services_send_is_accepted_from_each_of_them_only(
    connect: Connect, event_log: EventLog
) -> None:
    bus = await connect("strict")
    spec = _spec("t-prov-many", "run.requested")
    senders = senders_of("run.requested")
    assert set(senders) == {"trigger-gateway", "run-executor", "agent-collab"}
    events = [_requested(f"by-{name}", source=service_source(name)) for name in senders]
    events.append(_requested("by-human", source=service_source("human-interaction")))

    handled, _ = await _run(bus, spec, events)

    assert handled == [f"evt-by-{name}" for name in senders]
    assert [original for original, _ in await _dlq(bus, spec.durable)] == ["evt-by-human"]
    await _journaled(event_log, spec.durable, "evt-by-human")


async def test_the_batch_path_sets_a_forged_event_aside_and_hands_over_the_others(
    connect: Connect, event_log: EventLog
) -> None:
    bus = await connect("strict")
    spec = _spec("t-prov-batch", "run.failed")
    events = [
        _failed("b1", source=service_source("run-executor")),
        _failed("b2", source=service_source("agent-collab")),
        _failed("b3", source=service_source("run-executor")),
    ]

    handled, hooked = await _run(bus, spec, events, batch=True)

    assert handled == ["evt-b1", "evt-b3"]
    assert hooked == []
    assert [original for original, _ in await _dlq(bus, spec.durable)] == ["evt-b2"]
    await _journaled(event_log, spec.durable, "evt-b2")


async def test_claimed_lets_a_source_naming_no_service_through_and_refuses_a_false_claim(
    connect: Connect, event_log: EventLog
) -> None:
    bus = await connect("claimed")
    spec = _spec("t-prov-claimed", "run.failed")
    events = [
        _failed("c-test", source="/test"),
        _failed("c-gateway", source=service_source("trigger-gateway")),
        _failed("c-actor", source="/test", actor="service:human-interaction"),
        _failed("c-owner", source=service_source("run-executor")),
    ]

    handled, _ = await _run(bus, spec, events)

    assert handled == ["evt-c-test", "evt-c-owner"]
    assert sorted(original for original, _ in await _dlq(bus, spec.durable)) == ["evt-c-actor", "evt-c-gateway"]
    await _journaled(event_log, spec.durable, "evt-c-actor")


async def test_off_checks_nothing(connect: Connect) -> None:
    bus = await connect("off")
    spec = _spec("t-prov-off", "run.failed")
    handled, _ = await _run(bus, spec, [_failed("o1", source=service_source("journal"))])
    assert handled == ["evt-o1"]
    assert await _dlq(bus, spec.durable) == []


def _typed(event_type: str, source: str, actor: str | None = None) -> Envelope:
    return Envelope.model_validate(
        {"id": "e", "source": source, "type": event_type, "time": "2026-01-01T00:00:00Z", "data": {}, "actor": actor}
    )


@pytest.mark.parametrize(
    ("mode", "event", "refused"),
    [
        ("strict", _typed("human.answered", "/temporality/human-interaction"), False),
        ("strict", _typed("human.answered", "/temporality/human-interaction/extra"), True),
        ("strict", _typed("human.answered", "/temporality/run-executor"), True),
        ("strict", _typed("some.future_type", "/temporality/agent-collab"), False),  # a newer sender's type
        ("strict", _typed("some.future_type", "/elsewhere"), True),
        ("strict", _typed("human.answered", "/temporality/human-interaction", "service:human-interaction"), False),
        ("strict", _typed("human.answered", "/temporality/human-interaction", "user:alice"), False),
        ("claimed", _typed("human.answered", "/temporality/test"), False),  # "test" is no service
        ("claimed", _typed("human.answered", "/x", "service:test"), False),
        ("claimed", _typed("human.answered", "/x", "service:trigger-gateway"), True),
        ("claimed", _typed("some.future_type", "/temporality/journal"), False),
        ("off", _typed("human.answered", "/temporality/trigger-gateway"), False),
    ],
    ids=[f"case{i}" for i in range(12)],
)
def test_forgery_reads_the_claim_as_the_mode_says(mode: SourceCheck, event: Envelope, refused: bool) -> None:
    assert (forgery(event, mode) is not None) is refused


def test_every_service_source_names_its_service() -> None:
    for name in ("trigger-gateway", "run-executor", "human-interaction", "agent-collab", "journal"):
        assert claimed_service(service_source(name)) == name
    assert claimed_service("/temporality/test") is None
    assert claimed_service("https://example.com/temporality/journal") is None
