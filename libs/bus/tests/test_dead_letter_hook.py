"""The consumer runner's dead-letter hook against a real nats-server: called before the DLQ copy, whichever
way a message is given up on; a failing hook retries the dead-lettering, never drops the message."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.js.errors import NotFoundError

from temporality_bus import Bus, Consumer, DeadLetterHook, Delivery, PermanentError
from temporality_protocol import Envelope, RunFailed, make_event
from temporality_protocol.catalog import DLQ_STREAM, EVENTS_STREAM, ConsumerSpec, subject_for
from temporality_testing.timers import TEST_TIMERS_STREAM

Seen = list[tuple[str, int, str, int]]


def _failed(run_id: str) -> Envelope:
    return make_event(RunFailed(run_id=run_id, reason="r", error="e"), source="/test", id=f"evt-{run_id}")


def _spec(durable: str, *, stream: str = EVENTS_STREAM.name, max_deliver: int = 8) -> ConsumerSpec:
    subject = subject_for("run.failed") if stream == EVENTS_STREAM.name else "temporality.timers.fired.hooktest.>"
    return ConsumerSpec(durable, stream, (subject,), "test", max_deliver=max_deliver, backoff_s=(0.1,))


async def _dlq_count(bus: Bus, durable: str) -> int:
    subject = f"temporality.dlq.{durable}"
    info = await bus.js.stream_info(DLQ_STREAM.name, subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))


async def _settled(bus: Bus, spec: ConsumerSpec, seq: int, within_s: float = 20.0) -> None:
    """Wait until the server has the message at ``seq`` settled (acked or terminated) and nothing is in hand."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            info = await bus.js.consumer_info(spec.stream, spec.durable)
        except NotFoundError:  # the consumer task has not created the durable yet
            assert time.monotonic() < deadline, f"consumer {spec.durable} never created"
            await asyncio.sleep(0.05)
            continue
        if info.ack_floor.stream_seq >= seq and info.num_ack_pending == 0:
            return
        assert time.monotonic() < deadline, f"not settled: {info}"
        await asyncio.sleep(0.05)


def _recording(bus: Bus, durable: str, seen: Seen, *, fail_first: int = 0) -> DeadLetterHook:
    """A hook that records (kind, delivery, error, DLQ copies at the time) and raises its first ``fail_first`` calls."""

    async def hook(message: Envelope | bytes, delivery: Delivery, error: BaseException) -> None:
        kind = message.id if isinstance(message, Envelope) else f"bytes:{message!r}"
        seen.append((kind, delivery.num_delivered, f"{type(error).__name__}: {error}", await _dlq_count(bus, durable)))
        if len(seen) <= fail_first:
            raise RuntimeError("the hook's store is down")

    return hook


async def test_the_hook_runs_before_the_dlq_copy_with_the_envelope_the_delivery_and_the_error(bus: Bus) -> None:
    spec = _spec("t-hook")
    seen: Seen = []

    async def handler(event: Envelope, delivery: Delivery) -> None:
        raise PermanentError("cannot ever work")

    seq = (await bus.publish(_failed("h1"))).seq
    stop = asyncio.Event()
    hook = _recording(bus, spec.durable, seen)
    task = asyncio.create_task(Consumer(bus, spec, handler=handler, on_dead_letter=hook).run(stop))
    try:
        await _settled(bus, spec, seq)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert seen == [("evt-h1", 1, "PermanentError: cannot ever work", 0)]  # nothing in the DLQ yet when called
    assert await _dlq_count(bus, spec.durable) == 1


async def test_a_failing_hook_retries_the_dead_lettering_and_the_message_is_never_dropped(bus: Bus) -> None:
    spec = _spec("t-hook-fails")
    seen: Seen = []
    handled: list[int] = []

    async def handler(event: Envelope, delivery: Delivery) -> None:
        handled.append(delivery.num_delivered)
        raise PermanentError("never")

    seq = (await bus.publish(_failed("h2"))).seq
    stop = asyncio.Event()
    hook = _recording(bus, spec.durable, seen, fail_first=2)
    task = asyncio.create_task(Consumer(bus, spec, handler=handler, on_dead_letter=hook).run(stop))
    try:
        await _settled(bus, spec, seq, within_s=30)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    # each failed hook nak'ed the message; the next delivery tried again; the third call went through
    assert [(s[1], s[3]) for s in seen] == [(1, 0), (2, 0), (3, 0)]
    assert handled == [1, 2, 3]
    assert await _dlq_count(bus, spec.durable) == 1


async def test_a_delivery_past_the_limit_calls_the_hook_without_running_the_handler(bus: Bus) -> None:
    """The handler kills its "process" every time (nothing settles): past max_deliver only the hook runs."""
    spec = _spec("t-hook-unsettled", max_deliver=1)
    seen: Seen = []
    calls: list[int] = []
    called = asyncio.Event()

    async def handler(event: Envelope, delivery: Delivery) -> None:
        calls.append(delivery.num_delivered)
        called.set()
        raise asyncio.CancelledError  # stands in for a process dying mid-handler: nothing settles

    hook = _recording(bus, spec.durable, seen)
    seq = (await bus.publish(_failed("h3"))).seq
    dying = Consumer(bus, spec, handler=handler, ack_wait_s=1.0, on_dead_letter=hook)
    task = asyncio.create_task(dying.run(asyncio.Event()))
    await asyncio.wait_for(called.wait(), 15)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stop = asyncio.Event()
    survivor = Consumer(bus, spec, handler=handler, ack_wait_s=1.0, on_dead_letter=hook)
    task = asyncio.create_task(survivor.run(stop))
    try:
        await _settled(bus, spec, seq)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert calls == [1]
    assert seen == [("evt-h3", 2, "RuntimeError: deliveries exhausted without a settled outcome", 0)]
    assert await _dlq_count(bus, spec.durable) == 1


async def test_raw_consumers_and_undecodable_envelopes_give_the_hook_bytes(bus: Bus) -> None:
    seen: Seen = []
    events = _spec("t-hook-garbage")
    raw = _spec("t-hook-raw", stream=TEST_TIMERS_STREAM.name)

    async def handler(event: Envelope, delivery: Delivery) -> None:
        raise AssertionError("an undecodable message never reaches the handler")

    async def raw_handler(data: bytes, delivery: Delivery) -> None:
        raise PermanentError("bad timer payload")

    garbage = await bus.js.publish(subject_for("run.failed"), b"{not json", headers={"Nats-Msg-Id": "garbage"})
    # an envelope on a raw consumer is still bytes to it (a timer payload is not a CloudEvent)
    fired = await bus.publish_raw("temporality.timers.fired.hooktest.k1", _failed("h4").model_dump_json().encode(), {})
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(
            Consumer(bus, events, handler=handler, on_dead_letter=_recording(bus, events.durable, seen)).run(stop)
        ),
        asyncio.create_task(
            Consumer(bus, raw, raw_handler=raw_handler, on_dead_letter=_recording(bus, raw.durable, seen)).run(stop)
        ),
    ]
    try:
        await _settled(bus, events, garbage.seq)
        await _settled(bus, raw, fired.seq)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
    kinds = sorted(s[0][:6] for s in seen)
    assert kinds == ["bytes:", "bytes:"]
    assert any("InvalidEnvelope" in s[2] for s in seen)
    assert any(s[2] == "PermanentError: bad timer payload" for s in seen)


async def test_a_hook_that_refuses_permanently_does_not_hold_the_message_back(bus: Bus) -> None:
    spec = _spec("t-hook-refuses")
    calls: list[int] = []

    async def handler(event: Envelope, delivery: Delivery) -> None:
        raise PermanentError("never")

    async def hook(message: Envelope | bytes, delivery: Delivery, error: BaseException) -> None:
        calls.append(delivery.num_delivered)
        raise PermanentError("this hook can never handle that message")

    seq = (await bus.publish(_failed("h5"))).seq
    stop = asyncio.Event()
    task = asyncio.create_task(Consumer(bus, spec, handler=handler, on_dead_letter=hook).run(stop))
    try:
        await _settled(bus, spec, seq)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert calls == [1]
    assert await _dlq_count(bus, spec.durable) == 1
