"""A batch consumer that is cancelled naks what it fetched but never handed to its handler, against a real
nats-server: another replica on the same durable gets those messages at once (a second delivery), not after
``ack_wait``; the batch being handled is abandoned un-acked (JetStream redelivers it after ``ack_wait``).

- messages taken by a fetch that was lingering (``batch_linger_s``) when the runner was cancelled: they were
  neither in the pull buffer nor handed out, and used to wait out ``ack_wait``;
- a prefetched batch: nak'ed only once the pull subscription is gone, so a pull request still open on the
  replica's inbox (one its fetches gave up on) cannot take them back (they used to be nak'ed first: the server
  handed them to that request, a third delivery, or lost on the way once the subscription ended).

``ack_wait`` is 30 s, the wait for the other replica 10 s: without the naks the messages would only come back
once ``ack_wait`` expired.
"""

from __future__ import annotations

import asyncio
import json

from consumer_support import failed_spec, publish_failed, running

from temporality_bus import Bus, Consumer, Delivery
from temporality_bus.consumer import _Puller
from temporality_protocol import Envelope
from temporality_protocol.catalog import ConsumerSpec
from temporality_testing.waiting import eventually

Batch = list[tuple[Envelope, Delivery]]
ACK_WAIT_S = 30.0
WITHIN_S = 10.0  # well before ack_wait: only a nak brings the messages back this soon


async def _true(value: bool) -> bool:
    return value


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.wait([task], timeout=15)
    assert task.done()


async def test_messages_of_a_lingering_fetch_are_nakd_when_the_runner_is_cancelled(bus: Bus) -> None:
    spec = failed_spec("t-cancel-linger")
    second_handled: dict[str, int] = {}

    async def never(items: Batch) -> None:
        raise AssertionError("the lingering fetch's messages are never handed out")

    async def handler(event: Envelope, delivery: Delivery) -> None:
        second_handled[event.id] = delivery.num_delivered

    first = Consumer(
        bus,
        spec,
        handler=handler,
        batch_handler=never,
        batch_size=10,
        batch_linger_s=600.0,  # the fetch lingers until the cancellation
        ack_wait_s=ACK_WAIT_S,
        fetch_timeout_s=0.5,
    )
    lingering = await publish_failed(bus, "linger", 2)  # both there for the first fetch, which then lingers
    first_task = asyncio.create_task(first.run(asyncio.Event()))
    try:
        await eventually(lambda: _true(len(first._in_hand) == 2), WITHIN_S, "the fetch lingering with both")
        puller = first._puller
        assert puller is not None
        await _cancel(first_task)
        assert not first._in_hand
        assert not puller._buffer

        second = Consumer(bus, spec, handler=handler, ack_wait_s=ACK_WAIT_S, max_inflight=4)
        async with running(second):
            await eventually(
                lambda: _true(sorted(second_handled) == sorted(lingering)), WITHIN_S, "the other replica to get them"
            )
    finally:
        if not first_task.done():
            await _cancel(first_task)
    assert all(count == 2 for count in second_handled.values()), second_handled  # the nak's redelivery


async def test_a_prefetched_batch_is_nakd_after_the_pull_subscription_ends_when_the_runner_is_cancelled(
    bus: Bus,
) -> None:
    spec = failed_spec("t-cancel-prefetch")
    entered = asyncio.Event()
    first_handled: list[str] = []
    second_handled: dict[str, int] = {}

    async def first_batch(items: Batch) -> None:
        first_handled.extend(event.id for event, _ in items)
        entered.set()
        await asyncio.Event().wait()  # until cancelled

    async def handler(event: Envelope, delivery: Delivery) -> None:
        second_handled[event.id] = delivery.num_delivered

    (held,) = await publish_failed(bus, "held", 1)
    first = Consumer(
        bus,
        spec,
        handler=handler,
        batch_handler=first_batch,
        batch_size=2,
        ack_wait_s=ACK_WAIT_S,
        fetch_timeout_s=5.0,  # the prefetch waits on the server for the next message
    )
    first_task = asyncio.create_task(first.run(asyncio.Event()))
    try:
        await asyncio.wait_for(entered.wait(), 15)
        assert first_handled == [held]
        prefetched = await publish_failed(bus, "pre", 1)
        await eventually(lambda: _true(len(first._in_hand) == 2), WITHIN_S, "the next message prefetched")

        def prefetching() -> bool:
            return any(t.get_name() == f"prefetch:{spec.durable}" for t in asyncio.all_tasks())

        await eventually(lambda: _true(not prefetching()), WITHIN_S, "the prefetch to end")
        puller = first._puller
        assert puller is not None
        await _open_request(bus, spec, puller)  # waits on the server: the oldest request, first to be served

        second = Consumer(bus, spec, handler=handler, ack_wait_s=ACK_WAIT_S, max_inflight=4)
        async with running(second):
            await asyncio.wait_for(second.running.wait(), 15)
            await _cancel(first_task)  # the held batch is abandoned; the prefetched one released
            assert not puller._buffer
            await eventually(
                lambda: _true(sorted(second_handled) == sorted(prefetched)), WITHIN_S, "the other replica to get it"
            )
    finally:
        if not first_task.done():
            await _cancel(first_task)
    assert first_handled == [held]
    assert second_handled == dict.fromkeys(prefetched, 2)  # one nak: not taken back by the open request first


async def _open_request(bus: Bus, spec: ConsumerSpec, puller: _Puller) -> None:
    """A pull request left open on ``puller``'s inbox (a token no fetch waits on), as one a fetch gave up on."""
    request = json.dumps({"batch": 5, "expires": 60_000_000_000}).encode()
    subject = f"{bus.settings.js_api_prefix}.CONSUMER.MSG.NEXT.{spec.stream}.{spec.durable}"
    await bus.nc.publish(subject, request, reply=f"{puller._prefix}open")
    await bus.nc.flush()
