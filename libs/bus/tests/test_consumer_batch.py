"""The consumer runner's batch mode against a real nats-server: a batch is acked once its handler
returned; an undecodable message is dead-lettered alone; a failing batch falls back to the per-message
path, so one poison message is dead-lettered without blocking or dead-lettering its neighbours."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

import pytest
from consumer_support import failed, failed_spec, running
from nats.js.errors import NotFoundError

from temporality_bus import Bus, Consumer, Delivery, PermanentError
from temporality_bus import consumer as consumer_module
from temporality_protocol import Envelope
from temporality_protocol.catalog import DLQ_STREAM, ConsumerSpec, subject_for

Batch = list[tuple[Envelope, Delivery]]


async def _dlq_count(bus: Bus, durable: str) -> int:
    subject = f"temporality.dlq.{durable}"
    info = await bus.js.stream_info(DLQ_STREAM.name, subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))


async def _settled(bus: Bus, spec: ConsumerSpec, seq: int, within_s: float = 20.0) -> None:
    """Wait until the server has every message up to ``seq`` settled and nothing in hand."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            info = await bus.js.consumer_info(spec.stream, spec.durable)
        except NotFoundError:  # the consumer task has not created the durable yet
            info = None
        if info is not None and info.ack_floor.stream_seq >= seq and info.num_ack_pending == 0:
            return
        assert time.monotonic() < deadline, f"not settled: {info}"
        await asyncio.sleep(0.05)


async def _publish(bus: Bus, *run_ids: str) -> int:
    seq = 0
    for run_id in run_ids:
        seq = (await bus.publish(failed(run_id))).seq
    return seq


def _never(event: Envelope, delivery: Delivery) -> Awaitable[None]:
    raise AssertionError(f"the per-message handler ran for {event.id}")


async def test_batch_mode_needs_the_per_message_handler(bus: Bus) -> None:
    async def batch_handler(batch: Batch) -> None:
        pass

    async def raw(data: bytes, delivery: Delivery) -> None:
        pass

    with pytest.raises(ValueError, match="batch_handler needs handler"):
        Consumer(bus, failed_spec("t-b-none"), raw_handler=raw, batch_handler=batch_handler)
    with pytest.raises(ValueError, match="batch_size"):
        Consumer(bus, failed_spec("t-b-none"), handler=_never, batch_handler=batch_handler, batch_size=0)


async def test_a_batch_comes_in_stream_order_and_is_acked_after_its_handler_returned(bus: Bus) -> None:
    spec = failed_spec("t-batch")
    batches: list[list[tuple[str, int]]] = []
    entered, release = asyncio.Event(), asyncio.Event()

    async def batch_handler(batch: Batch) -> None:
        batches.append([(event.id, delivery.stream_seq) for event, delivery in batch])
        entered.set()
        await release.wait()

    last = await _publish(bus, *(f"b{i}" for i in range(5)))
    consumer = Consumer(bus, spec, handler=_never, batch_handler=batch_handler, batch_size=10, ack_wait_s=5)
    async with running(consumer):
        await asyncio.wait_for(entered.wait(), 15)
        await asyncio.sleep(0.3)  # give a premature ack every chance to arrive
        info = await bus.js.consumer_info(spec.stream, spec.durable)
        assert info.num_ack_pending == 5  # all in hand, none acked while the batch handler runs
        release.set()
        await _settled(bus, spec, last)
    assert [ids for ids, _ in batches[0]] == [f"evt-b{i}" for i in range(5)]
    seqs = [seq for _, seq in batches[0]]
    assert seqs == sorted(seqs)
    assert seqs[-1] == last
    assert len(batches) == 1


async def test_batch_size_bounds_each_batch(bus: Bus) -> None:
    spec = failed_spec("t-batch-size")
    sizes: list[int] = []

    async def batch_handler(batch: Batch) -> None:
        sizes.append(len(batch))

    last = await _publish(bus, *(f"s{i}" for i in range(7)))
    async with running(Consumer(bus, spec, handler=_never, batch_handler=batch_handler, batch_size=3)):
        await _settled(bus, spec, last)
    assert sum(sizes) == 7
    assert max(sizes) <= 3


async def test_an_undecodable_message_is_dead_lettered_alone_and_the_rest_batched(bus: Bus) -> None:
    spec = failed_spec("t-batch-garbage")
    seen: list[str] = []

    async def batch_handler(batch: Batch) -> None:
        seen.extend(event.id for event, _ in batch)

    await _publish(bus, "g1")
    await bus.publish_raw(subject_for("run.failed"), b"not a cloudevent", {"Nats-Msg-Id": "garbage-1"})
    last = await _publish(bus, "g2")
    async with running(Consumer(bus, spec, handler=_never, batch_handler=batch_handler, batch_size=10)):
        await _settled(bus, spec, last)
    assert seen == ["evt-g1", "evt-g2"]
    assert await _dlq_count(bus, spec.durable) == 1


async def test_batched_messages_keep_their_headers_and_a_dead_letter_copies_them(bus: Bus) -> None:
    """The batch path reads messages off the parser without parsing their headers (``_route``): read, a batched
    message's headers are those it was published with, and a dead letter still copies them to the DLQ."""
    spec = failed_spec("t-batch-headers")
    headers: dict[str, dict[str, str] | None] = {}
    kinds: set[type] = set()

    async def batch_handler(batch: Batch) -> None:
        kinds.update(type(delivery.msg) for _, delivery in batch)
        headers.update({event.id: delivery.msg.headers for event, delivery in batch})

    await _publish(bus, "h1")
    await bus.publish_raw(
        subject_for("run.failed"), b"not a cloudevent", {"Nats-Msg-Id": "garbage-h", "Temporality-Test": "kept"}
    )
    last = await _publish(bus, "h2")
    async with running(Consumer(bus, spec, handler=_never, batch_handler=batch_handler, batch_size=10)):
        await _settled(bus, spec, last)
    assert consumer_module._ROUTABLE  # the pinned nats-py is the one _route was written for
    assert kinds == {consumer_module._LazyHeadersMsg}  # read off the parser, not through nats-py's Msg path
    assert sorted(headers) == ["evt-h1", "evt-h2"]
    for event_id, got in headers.items():
        assert got is not None
        assert got["Nats-Msg-Id"] == event_id
        assert got["Ce-Type"] == "run.failed"
    dead = await bus.js.get_last_msg(DLQ_STREAM.name, f"temporality.dlq.{spec.durable}")
    assert dead.data == b"not a cloudevent"
    assert dead.headers is not None
    assert dead.headers["Temporality-Test"] == "kept"


async def test_a_failing_batch_falls_back_to_one_by_one_and_only_the_poison_is_dead_lettered(bus: Bus) -> None:
    spec = failed_spec("t-batch-poison")
    batches: list[list[str]] = []
    one_by_one: list[str] = []

    async def batch_handler(batch: Batch) -> None:
        batches.append([event.id for event, _ in batch])
        if any(event.id == "evt-p2" for event, _ in batch):
            raise RuntimeError("the batch's transaction failed")

    async def handler(event: Envelope, delivery: Delivery) -> None:
        one_by_one.append(event.id)
        if event.id == "evt-p2":
            raise PermanentError("cannot ever store it")

    last = await _publish(bus, "p1", "p2", "p3")
    async with running(Consumer(bus, spec, handler=handler, batch_handler=batch_handler, batch_size=10)):
        await _settled(bus, spec, last)
    assert batches[0] == ["evt-p1", "evt-p2", "evt-p3"]
    assert one_by_one == ["evt-p1", "evt-p2", "evt-p3"]  # the fallback, in stream order, once each
    assert await _dlq_count(bus, spec.durable) == 1
    info = await bus.js.consumer_info(spec.stream, spec.durable)
    assert info.num_redelivered == 0  # nobody was nak'ed: p1 and p3 acked, p2 dead-lettered


async def test_a_failing_batch_retries_each_message_with_backoff_and_never_dead_letters_without_a_limit(
    bus: Bus,
) -> None:
    spec = failed_spec("t-batch-outage", max_deliver=-1)
    down = True
    calls: dict[str, int] = {}
    recovered: list[str] = []
    done, retried = asyncio.Event(), asyncio.Event()

    async def batch_handler(batch: Batch) -> None:
        if down:
            raise ConnectionError("the database is down")
        recovered.extend(event.id for event, _ in batch)
        if len(set(recovered)) == 2:
            done.set()

    async def handler(event: Envelope, delivery: Delivery) -> None:
        calls[event.id] = calls.get(event.id, 0) + 1
        if min(calls.get("evt-o1", 0), calls.get("evt-o2", 0)) >= 3:  # nak'ed and redelivered, again
            retried.set()
        if down:
            raise ConnectionError("the database is down")
        recovered.append(event.id)
        if len(set(recovered)) == 2:
            done.set()

    last = await _publish(bus, "o1", "o2")
    async with running(Consumer(bus, spec, handler=handler, batch_handler=batch_handler, batch_size=10)):
        await asyncio.wait_for(retried.wait(), 20)
        down = False
        await asyncio.wait_for(done.wait(), 20)
        await _settled(bus, spec, last)
    assert sorted(set(recovered)) == ["evt-o1", "evt-o2"]
    assert await _dlq_count(bus, spec.durable) == 0


async def test_a_linger_gathers_a_trickle_into_one_batch(bus: Bus) -> None:
    """``batch_linger_s``: a fetch that got one message (delivered: the server holds it un-acked) waits, and the
    four published meanwhile join its batch -- one transaction for five at a trickle, not five."""
    spec = failed_spec("t-batch-linger")
    batches: list[list[str]] = []

    async def batch_handler(batch: Batch) -> None:
        batches.append([event.id for event, _ in batch])

    consumer = Consumer(bus, spec, handler=_never, batch_handler=batch_handler, batch_size=10, batch_linger_s=3.0)
    with pytest.raises(ValueError, match="batch_linger_s"):
        Consumer(bus, spec, handler=_never, batch_handler=batch_handler, batch_linger_s=-1)
    async with running(consumer):
        await _publish(bus, "l0")
        deadline = time.monotonic() + 2.5  # well inside the linger: the batch cannot have been handled yet
        while True:  # the first message is delivered and in hand (lingering), not acked
            try:
                info = await bus.js.consumer_info(spec.stream, spec.durable)
            except NotFoundError:
                info = None
            if info is not None and info.num_ack_pending == 1:
                break
            assert time.monotonic() < deadline, f"the first message was not delivered in time: {info}"
            await asyncio.sleep(0.02)
        assert batches == []
        last = await _publish(bus, *(f"l{i}" for i in range(1, 5)))
        await _settled(bus, spec, last)
    assert batches == [[f"evt-l{i}" for i in range(5)]]
