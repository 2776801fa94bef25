"""A consumer that stops gracefully naks what it fetched but never handed out, against a real nats-server:
another replica on the same durable gets those messages at once, not after ``ack_wait``.

The messages are put in the stopping replica's pull buffer the way a late reply does (the reply to a pull
request its fetch no longer waits on, e.g. after a stalled connection made the fetch give up): a pull
request sent to the replica's own pull inbox while it fetches nothing (its handler is busy, nothing is
prefetched). ``ack_wait`` is 30 s, the wait for the other replica 10 s: without the naks the messages would
only come back once ``ack_wait`` expired.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from consumer_support import failed_spec, publish_failed, running
from nats.js.errors import NotFoundError

from temporality_bus import Bus, Consumer, Delivery
from temporality_bus.consumer import _Puller
from temporality_protocol import Envelope
from temporality_protocol.catalog import ConsumerSpec
from temporality_testing.waiting import eventually

Batch = list[tuple[Envelope, Delivery]]
ACK_WAIT_S = 30.0
WITHIN_S = 10.0  # well before ack_wait: only a nak brings the messages back this soon


async def _late_reply(bus: Bus, spec: ConsumerSpec, puller: _Puller, count: int) -> None:
    """A pull request for ``count`` messages whose reply goes to ``puller``'s inbox on a token no fetch waits on."""
    request = json.dumps({"batch": count, "no_wait": True}).encode()
    subject = f"{bus.settings.js_api_prefix}.CONSUMER.MSG.NEXT.{spec.stream}.{spec.durable}"
    await bus.nc.publish(subject, request, reply=f"{puller._prefix}late")


async def _ack_pending(bus: Bus, spec: ConsumerSpec) -> int:
    try:
        return int((await bus.js.consumer_info(spec.stream, spec.durable)).num_ack_pending)
    except NotFoundError:
        return -1


@pytest.mark.parametrize("mode", ["per-message", "batch"])
async def test_a_stopping_replica_naks_its_unhandled_messages_and_another_gets_them_before_ack_wait(
    bus: Bus, mode: str
) -> None:
    spec = failed_spec(f"t-stop-release-{mode}")
    batch = mode == "batch"
    entered, release = asyncio.Event(), asyncio.Event()
    first_handled: list[str] = []
    second_handled: dict[str, int] = {}

    async def first_handler(event: Envelope, delivery: Delivery) -> None:
        first_handled.append(event.id)
        entered.set()
        await release.wait()

    async def first_batch(items: Batch) -> None:
        first_handled.extend(event.id for event, _ in items)
        entered.set()
        await release.wait()

    async def second_handler(event: Envelope, delivery: Delivery) -> None:
        second_handled[event.id] = delivery.num_delivered

    (held,) = await publish_failed(bus, "held", 1)
    first = Consumer(
        bus,
        spec,
        handler=first_handler,
        batch_handler=first_batch if batch else None,
        batch_size=1,
        ack_wait_s=ACK_WAIT_S,
        fetch_timeout_s=0.3,
    )
    stop_first = asyncio.Event()
    first_task = asyncio.create_task(first.run(stop_first))
    try:
        await asyncio.wait_for(entered.wait(), 15)
        assert first_handled == [held]
        puller = first._puller
        assert puller is not None
        if batch:  # the prefetch asked while the handler started; it ends empty (nothing more was published)

            def prefetching() -> bool:
                return any(t.get_name() == f"prefetch:{spec.durable}" for t in asyncio.all_tasks())

            await eventually(lambda: _true(not prefetching()), 10, "the prefetch to end")
        stop_first.set()  # from now on the runner fetches nothing more: it finishes the batch in hand and stops
        late = await publish_failed(bus, "late", 3)
        await _late_reply(bus, spec, puller, 3)
        await eventually(lambda: _true(len(puller._buffer) == 3), 10, "the late reply in the pull buffer")

        second = Consumer(bus, spec, handler=second_handler, ack_wait_s=ACK_WAIT_S, max_inflight=4)
        async with running(second):
            release.set()  # the first replica acks what it handled and stops, releasing the three
            await asyncio.wait_for(first_task, 15)
            await eventually(
                lambda: _true(sorted(second_handled) == sorted(late)), WITHIN_S, "the other replica to get the three"
            )

            async def settled() -> bool:
                return await _ack_pending(bus, spec) == 0

            await eventually(settled, WITHIN_S, "every message settled")
    finally:
        release.set()
        stop_first.set()
        await asyncio.wait([first_task], timeout=15)
    assert first_handled == [held]  # the first replica never handled the three
    assert held not in second_handled
    assert all(count == 2 for count in second_handled.values())  # a redelivery (the nak), not a first delivery
    assert not puller._buffer


async def _true(value: bool) -> bool:
    return value
