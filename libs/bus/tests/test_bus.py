"""The bus against a real nats-server: publish/dedupe, consumer outcomes, dead letters, KV CAS, timers."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from temporality_bus import AlreadyExists, Bus, Conflict, Consumer, Delivery, NatsSettings, PermanentError, schedule_at
from temporality_protocol import (
    BusDeadLettered,
    Envelope,
    RunFailed,
    decode,
    make_event,
)
from temporality_protocol.catalog import (
    BUCKET_RUNS,
    DLQ_STREAM,
    EVENTS_STREAM,
    TIMERS_STREAMS,
    ConsumerSpec,
    subject_for,
)
from temporality_testing.timers import TEST_TIMERS_STREAM


def _failed(run_id: str) -> Envelope:
    return make_event(RunFailed(run_id=run_id, reason="r", error="e"), source="/test", id=f"evt-{run_id}")


async def test_publish_is_deduplicated_by_event_id(bus: Bus) -> None:
    first = await bus.publish(_failed("r1"))
    second = await bus.publish(_failed("r1"))
    assert not first.duplicate
    assert second.duplicate
    assert second.seq == first.seq


async def test_ensure_is_idempotent(bus: Bus) -> None:
    from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS

    await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
    for stream in TIMERS_STREAMS.values():
        info = await bus.js.stream_info(stream.name)
        assert info.config.allow_msg_schedules is True
        assert info.config.subjects == list(stream.subjects)


async def test_events_retention_is_applied_to_the_events_stream_only(nats_settings: NatsSettings) -> None:
    from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS

    async with Bus.connect(nats_settings.model_copy(update={"events_max_age_days": 2}), name="retention") as b:
        await b.ensure(ALL_STREAMS, ALL_BUCKETS)
        events = await b.js.stream_info(EVENTS_STREAM.name)
        dlq = await b.js.stream_info(DLQ_STREAM.name)
    assert events.config.max_age == 2 * 24 * 3600
    assert dlq.config.max_age == DLQ_STREAM.max_age_s  # the dead letters keep their own retention
    assert events.config.num_replicas == 1  # TEMPORALITY_NATS_STREAM_REPLICAS' default (tests/test_nats_cluster.py: 3)
    async with Bus.connect(nats_settings, name="forever") as b:  # back to 0: every event is kept again
        await b.ensure(ALL_STREAMS, ALL_BUCKETS)
        assert not (await b.js.stream_info(EVENTS_STREAM.name)).config.max_age


async def _run_consumer(consumer: Consumer, until: asyncio.Event, stop: asyncio.Event) -> None:
    task = asyncio.create_task(consumer.run(stop))
    try:
        await asyncio.wait_for(until.wait(), 20)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_consumer_acks_after_handler_and_retries_transient(bus: Bus) -> None:
    spec = ConsumerSpec("t-retry", EVENTS_STREAM.name, (subject_for("run.failed"),), "test", backoff_s=(0.1,))
    seen: list[int] = []
    done = asyncio.Event()

    async def handler(event: Envelope, delivery: Delivery) -> None:
        seen.append(delivery.num_delivered)
        if delivery.num_delivered < 3:
            raise RuntimeError("transient")
        done.set()

    seq = (await bus.publish(_failed("r2"))).seq
    await _run_consumer(Consumer(bus, spec, handler=handler), done, asyncio.Event())
    assert seen == [1, 2, 3]
    deadline = time.monotonic() + 10
    while True:  # the ack is asynchronous: wait until the server has it
        info = await bus.js.consumer_info(EVENTS_STREAM.name, "t-retry")
        if info.ack_floor.stream_seq >= seq and info.num_ack_pending == 0:
            break
        assert time.monotonic() < deadline, f"not acked: {info}"
        await asyncio.sleep(0.05)
    assert info.num_pending == 0


async def test_poison_message_is_dead_lettered_journaled_and_consumer_goes_on(bus: Bus) -> None:
    spec = ConsumerSpec("t-poison", EVENTS_STREAM.name, (subject_for("run.failed"),), "test")
    good = asyncio.Event()
    handled: list[str] = []

    async def handler(event: Envelope, delivery: Delivery) -> None:
        handled.append(event.id)
        if event.runid == "bad":
            raise PermanentError("cannot ever work")
        good.set()

    await bus.js.publish(subject_for("run.failed"), b"{not json", headers={"Nats-Msg-Id": "garbage"})
    await bus.publish(make_event(RunFailed(run_id="bad", reason="r", error="e"), source="/t", run_id="bad"))
    await bus.publish(_failed("good"))
    await _run_consumer(Consumer(bus, spec, handler=handler), good, asyncio.Event())

    dlq = await bus.js.pull_subscribe("temporality.dlq.t-poison", durable="dlq-reader", stream=DLQ_STREAM.name)
    msgs = await dlq.fetch(2, timeout=5)
    assert msgs[0].data == b"{not json"
    assert "InvalidEnvelope" in msgs[0].headers["Temporality-Error"]
    assert "cannot ever work" in msgs[1].headers["Temporality-Error"]

    journal = await bus.js.pull_subscribe(subject_for("bus.dead_lettered"), durable="j", stream=EVENTS_STREAM.name)
    events = [decode(m.data) for m in await journal.fetch(2, timeout=5)]
    payloads = [e.payload(BusDeadLettered) for e in events]
    assert {p.consumer for p in payloads} == {"t-poison"}
    assert payloads[1].original_type == "run.failed"
    assert events[1].runid == "bad"
    assert handled[-1] == "evt-good"


async def test_a_dead_letter_names_the_id_and_type_an_invalid_event_claims(bus: Bus) -> None:
    # on-call matches a dead letter to its sender by the event id and type it claimed, valid envelope or not
    spec = ConsumerSpec("t-claimed", EVENTS_STREAM.name, (subject_for("run.failed"),), "test")
    good = asyncio.Event()

    async def handler(event: Envelope, delivery: Delivery) -> None:
        good.set()

    claimed = b'{"id": "evt-poison-2", "type": "run.failed", "specversion": "0.3", "data": {}}'
    await bus.js.publish(subject_for("run.failed"), claimed, headers={"Nats-Msg-Id": "claimed"})
    await bus.js.publish(subject_for("run.failed"), b'["id", "type"]', headers={"Nats-Msg-Id": "array"})
    await bus.publish(_failed("good"))
    await _run_consumer(Consumer(bus, spec, handler=handler), good, asyncio.Event())

    journal = await bus.js.pull_subscribe(subject_for("bus.dead_lettered"), durable="j2", stream=EVENTS_STREAM.name)
    payloads = [decode(m.data).payload(BusDeadLettered) for m in await journal.fetch(2, timeout=5)]
    assert [(p.original_id, p.original_type) for p in payloads] == [("evt-poison-2", "run.failed"), (None, None)]


async def test_exhausted_retries_are_dead_lettered(bus: Bus) -> None:
    spec = ConsumerSpec(
        "t-exhaust",
        EVENTS_STREAM.name,
        (subject_for("run.failed"),),
        "test",
        max_deliver=2,
        backoff_s=(0.05,),
    )

    async def handler(event: Envelope, delivery: Delivery) -> None:
        raise RuntimeError(f"boom {delivery.num_delivered}")

    await bus.publish(_failed("r3"))
    stop = asyncio.Event()
    task = asyncio.create_task(Consumer(bus, spec, handler=handler).run(stop))
    dlq = await bus.js.pull_subscribe("temporality.dlq.t-exhaust", durable="dlq-x", stream=DLQ_STREAM.name)
    msgs = await dlq.fetch(1, timeout=10)
    stop.set()
    await task
    assert "boom 2" in msgs[0].headers["Temporality-Error"]


async def test_store_create_if_absent_and_compare_and_set(bus: Bus) -> None:
    store = await bus.store(BUCKET_RUNS, RunFailed)
    rev = await store.create("k1", RunFailed(run_id="k1", reason="a", error="b"))
    with pytest.raises(AlreadyExists):
        await store.create("k1", RunFailed(run_id="k1", reason="x", error="y"))
    rev2 = await store.update("k1", RunFailed(run_id="k1", reason="c", error="d"), rev)
    with pytest.raises(Conflict):
        await store.update("k1", RunFailed(run_id="k1", reason="e", error="f"), rev)
    got = await store.get("k1")
    assert got is not None
    assert got.revision == rev2
    assert got.value.reason == "c"
    assert await store.get("missing") is None


async def test_message_schedule_fires_once_at_its_time(bus: Bus) -> None:
    sub = await bus.js.pull_subscribe(
        "temporality.timers.fired.test.>", durable="timer-reader", stream=TEST_TIMERS_STREAM.name
    )
    at = datetime.now(UTC) + timedelta(seconds=2)
    await schedule_at(
        bus,
        schedule_subject="temporality.timers.schedule.test.t1",
        target_subject="temporality.timers.fired.test.t1",
        at=at,
        payload=b"wake up",
        msg_id="timer-t1",
    )
    msgs = await sub.fetch(1, timeout=10)
    assert msgs[0].data == b"wake up"
    assert datetime.now(UTC) >= at.replace(microsecond=0)
    await msgs[0].ack()
    with pytest.raises(Exception, match="imeout"):
        await sub.fetch(1, timeout=1.5)


async def test_unlimited_max_deliver_retries_until_success_and_never_dead_letters(bus: Bus) -> None:
    spec = ConsumerSpec(
        "t-forever", EVENTS_STREAM.name, (subject_for("run.failed"),), "test", max_deliver=-1, backoff_s=(0.02,)
    )
    done = asyncio.Event()
    attempts: list[int] = []

    async def handler(event: Envelope, delivery: Delivery) -> None:
        attempts.append(delivery.num_delivered)
        if delivery.num_delivered < 12:
            raise RuntimeError("database down")
        done.set()

    await bus.publish(_failed("r4"))
    await _run_consumer(Consumer(bus, spec, handler=handler), done, asyncio.Event())
    assert attempts == list(range(1, 13))
    info = await bus.js.stream_info(DLQ_STREAM.name)
    assert info.state.messages == 0


async def test_a_failed_pull_request_does_not_kill_the_consumer(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pull request that fails (nats-py's errors while the connection is away) is logged and tried again."""
    import nats.errors

    from temporality_bus.consumer import _Puller

    original = _Puller.fetch
    raised = 0

    async def flaky_fetch(self: _Puller, *args: Any, **kwargs: Any) -> Any:
        nonlocal raised
        if raised < 2:
            raised += 1
            raise nats.errors.TimeoutError
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(_Puller, "fetch", flaky_fetch)
    spec = ConsumerSpec("t-bare-timeout", EVENTS_STREAM.name, (subject_for("run.failed"),), "test")
    done = asyncio.Event()

    async def handler(event: Envelope, delivery: Delivery) -> None:
        done.set()

    await bus.publish(_failed("r5"))
    await _run_consumer(Consumer(bus, spec, handler=handler), done, asyncio.Event())
    assert raised == 2


async def test_a_failed_dead_letter_is_retried_not_dropped(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    from temporality_bus import TransientError

    spec = ConsumerSpec("t-dlq-down", EVENTS_STREAM.name, (subject_for("run.failed"),), "test", backoff_s=(0.05,))
    original = bus.publish_raw
    failures = 0

    async def flaky_publish_raw(subject: str, payload: bytes, headers: dict[str, str]) -> object:
        nonlocal failures
        if subject.startswith("temporality.dlq.") and failures == 0:
            failures += 1
            raise TransientError("the bus is down")
        return await original(subject, payload, headers)

    monkeypatch.setattr(bus, "publish_raw", flaky_publish_raw)

    async def handler(event: Envelope, delivery: Delivery) -> None:
        raise PermanentError("never")

    await bus.publish(_failed("r6"))
    stop = asyncio.Event()
    task = asyncio.create_task(Consumer(bus, spec, handler=handler).run(stop))
    dlq = await bus.js.pull_subscribe("temporality.dlq.t-dlq-down", durable="dlq-down", stream=DLQ_STREAM.name)
    msgs = await dlq.fetch(1, timeout=20)
    stop.set()
    await task
    assert failures == 1
    assert msgs[0].headers["Temporality-Error"] == "PermanentError: never"
    deadline = time.monotonic() + 10
    while True:  # term is asynchronous: wait until the server has it
        info = await bus.js.consumer_info(EVENTS_STREAM.name, "t-dlq-down")
        if info.num_ack_pending == 0:
            break
        assert time.monotonic() < deadline, f"not settled: {info}"
        await asyncio.sleep(0.05)
    assert info.config.max_deliver == -1


async def test_a_message_that_never_settles_is_dead_lettered_past_the_limit(bus: Bus) -> None:
    """A handler that kills its process never acks/naks: past max_deliver the runner stops calling it."""
    spec = ConsumerSpec("t-unsettled", EVENTS_STREAM.name, (subject_for("run.failed"),), "test", max_deliver=2)
    calls: list[int] = []
    called = asyncio.Event()

    async def handler(event: Envelope, delivery: Delivery) -> None:
        calls.append(delivery.num_delivered)
        called.set()
        raise asyncio.CancelledError  # stands in for a process dying mid-handler: nothing settles

    await bus.publish(_failed("r7"))
    dlq = await bus.js.pull_subscribe("temporality.dlq.t-unsettled", durable="dlq-u", stream=DLQ_STREAM.name)
    for _attempt in range(spec.max_deliver):  # each "process" dies with the message in hand
        called.clear()
        consumer = Consumer(bus, spec, handler=handler, ack_wait_s=1.0)
        task = asyncio.create_task(consumer.run(asyncio.Event()))
        await asyncio.wait_for(called.wait(), 15)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    stop = asyncio.Event()
    survivor = asyncio.create_task(Consumer(bus, spec, handler=handler, ack_wait_s=1.0).run(stop))
    msgs = await dlq.fetch(1, timeout=15)
    stop.set()
    await survivor
    assert calls == [1, 2]
    assert "exhausted" in msgs[0].headers["Temporality-Error"]


async def test_a_message_over_max_payload_is_a_permanent_error(bus: Bus) -> None:
    too_big = b"x" * (bus.nc.max_payload + 1)
    with pytest.raises(PermanentError, match="max_payload"):
        await bus.publish_raw("temporality.events.run.failed", too_big, {"Nats-Msg-Id": "big"})


async def test_a_publish_no_stream_answered_is_sent_again_until_one_does(bus: Bus) -> None:
    """A 503 (no stream took it) stored nothing, so the publish is sent again for a while: on a cluster a
    stream just created can lack subject interest on this node for a moment (and a KV write is a publish)."""
    from temporality_protocol.catalog import StreamSpec

    late = StreamSpec(name="LATE", subjects=("late.>",), description="created while a publish waits")

    async def create_later() -> None:
        await asyncio.sleep(0.3)
        await bus.ensure_stream(late)

    creating = asyncio.create_task(create_later())
    ack = await bus.publish_raw("late.one", b"x", {"Nats-Msg-Id": "late-1"})
    await creating
    assert (ack.stream, ack.seq) == ("LATE", 1)
    assert (await bus.js.stream_info("LATE")).state.messages == 1  # sent again, stored once


async def test_publishing_to_a_subject_without_a_stream_is_transient_after_the_retry_window(bus: Bus) -> None:
    from temporality_bus import TransientError

    bus.js.no_stream_retry_s = 0.2
    started = time.monotonic()
    with pytest.raises(TransientError, match=r"publish to nowhere\.at\.all failed"):
        await bus.publish_raw("nowhere.at.all", b"x", {"Nats-Msg-Id": "n2"})
    assert time.monotonic() - started >= 0.1  # it was sent again, not failed at the first 503


async def test_publish_many_stores_every_event_in_order_and_dedupes_by_id(bus: Bus) -> None:
    await bus.ensure([EVENTS_STREAM])
    events = [_failed(f"m{i}") for i in range(3)]
    first = await asyncio.wait_for(bus.publish_many(events), 10)
    assert [r.duplicate for r in first] == [False, False, False]
    assert [r.seq for r in first] == sorted(r.seq for r in first)  # one connection: the batch's order
    again = await asyncio.wait_for(bus.publish_many([events[1], _failed("m3")]), 10)
    assert again[0].duplicate
    assert again[0].seq == first[1].seq
    assert not again[1].duplicate
    assert await asyncio.wait_for(bus.publish_many([]), 10) == []
    info = await bus.js.stream_info(EVENTS_STREAM.name)
    assert info.state.messages == 4


async def test_publish_many_raises_when_one_is_not_stored(bus: Bus) -> None:
    from temporality_bus import TransientError

    await bus.ensure([EVENTS_STREAM])
    bus.js.no_stream_retry_s = 0.2
    messages = [
        ("temporality.events.run.failed", b"{}", {"Nats-Msg-Id": "ok-1"}),
        ("nowhere.at.all", b"x", {"Nats-Msg-Id": "n2"}),
    ]
    started = time.monotonic()
    with pytest.raises(TransientError, match=r"publish to nowhere\.at\.all failed: no stream took it"):
        await asyncio.wait_for(bus.publish_raw_many(messages), 10)
    assert time.monotonic() - started >= 0.1  # it was sent again, not failed at the first 503
    assert (await bus.js.stream_info(EVENTS_STREAM.name)).state.messages == 1  # the other one, stored once
    too_big = b"x" * (bus.nc.max_payload + 1)
    with pytest.raises(PermanentError, match="max_payload"):
        await asyncio.wait_for(bus.publish_raw_many([("temporality.events.run.failed", too_big, {})]), 10)
    assert bus.pipeline.pending == 0  # nothing left waiting for an ack


async def test_publish_many_sends_again_what_no_stream_took_until_one_does(bus: Bus) -> None:
    """Like :meth:`Bus.publish`: a 503 in a pipelined batch stored nothing, so that message (alone) is
    sent again until a stream takes it."""
    from temporality_protocol.catalog import StreamSpec

    await bus.ensure([EVENTS_STREAM])
    late = StreamSpec(name="LATE_MANY", subjects=("late-many.>",), description="created while a batch waits")

    async def create_later() -> None:
        await asyncio.sleep(0.3)
        await bus.ensure_stream(late)

    creating = asyncio.create_task(create_later())
    stored, came_late = await asyncio.wait_for(
        bus.publish_raw_many(
            [
                ("temporality.events.run.failed", b"{}", {}),  # no Nats-Msg-Id: a copy would be stored too
                ("late-many.one", b"x", {"Nats-Msg-Id": "late-1"}),
            ]
        ),
        10,
    )
    await creating
    assert (stored.stream, stored.duplicate) == (EVENTS_STREAM.name, False)
    assert (came_late.stream, came_late.seq, came_late.duplicate) == ("LATE_MANY", 1, False)
    assert (await bus.js.stream_info("LATE_MANY")).state.messages == 1
    assert (await bus.js.stream_info(EVENTS_STREAM.name)).state.messages == 1  # the stored one was not sent again
    assert bus.pipeline.pending == 0


async def test_publish_many_without_an_ack_in_time_is_transient(bus: Bus) -> None:
    from temporality_bus import TransientError

    # a plain subscriber that never answers: the publish has a responder but gets no PubAck
    sub = await bus.nc.subscribe("silent.subject")
    try:
        with pytest.raises(TransientError, match="no ack within"):
            await asyncio.wait_for(
                bus.publish_raw_many([("silent.subject", b"x", {"Nats-Msg-Id": "s1"})], timeout_s=0.2), 10
            )
        assert bus.pipeline.pending == 0  # the unanswered future was cancelled, its slot freed
    finally:
        await sub.unsubscribe()
