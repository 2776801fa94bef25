"""The consumer runner's batch mode with prefetch, against a real nats-server: the next batch is fetched
(bounded: one batch besides the one being handled) while a batch is handled, kept alive by the
heartbeat, and handed over in stream order; a consumer stopped mid-batch leaves what it held un-acked
and a new one gets it again, with nothing lost; a poison message is dead-lettered alone; a message nak'ed
by the fallback is never settled by the acks of the batches after it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import NotFoundError

from temporality_bus import Bus, Consumer, Delivery, PermanentError
from temporality_protocol import Envelope, RunFailed, make_event
from temporality_protocol.catalog import DLQ_STREAM, EVENTS_STREAM, ConsumerSpec, subject_for
from temporality_testing.waiting import stays

Batch = list[tuple[Envelope, Delivery]]


def _failed(run_id: str) -> Envelope:
    return make_event(RunFailed(run_id=run_id, reason="r", error="e"), source="/test", id=f"evt-{run_id}")


def _spec(durable: str, *, max_deliver: int = 8, backoff_s: tuple[float, ...] = (0.1,)) -> ConsumerSpec:
    return ConsumerSpec(
        durable, EVENTS_STREAM.name, (subject_for("run.failed"),), "test", max_deliver=max_deliver, backoff_s=backoff_s
    )


async def _publish(bus: Bus, *run_ids: str) -> int:
    seq = 0
    for run_id in run_ids:
        seq = (await bus.publish(_failed(run_id))).seq
    return seq


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


async def _ack_pending(bus: Bus, spec: ConsumerSpec) -> int:
    try:
        return int((await bus.js.consumer_info(spec.stream, spec.durable)).num_ack_pending)
    except NotFoundError:
        return 0


async def _eventually_pending(bus: Bus, spec: ConsumerSpec, count: int, within_s: float = 15.0) -> None:
    deadline = time.monotonic() + within_s
    while (pending := await _ack_pending(bus, spec)) != count:
        assert time.monotonic() < deadline, f"{pending} messages in hand, not {count}"
        await asyncio.sleep(0.05)


@asynccontextmanager
async def _running(consumer: Consumer) -> AsyncIterator[asyncio.Task[None]]:
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def _never(event: Envelope, delivery: Delivery) -> None:
    raise AssertionError(f"the per-message handler ran for {event.id}")


async def test_the_next_batch_is_prefetched_while_one_is_handled_and_batches_come_in_stream_order(bus: Bus) -> None:
    spec = _spec("t-prefetch-order")
    batches: list[list[tuple[str, int]]] = []
    entered, release = asyncio.Event(), asyncio.Event()

    async def batch_handler(batch: Batch) -> None:
        batches.append([(event.id, delivery.stream_seq) for event, delivery in batch])
        entered.set()
        await release.wait()

    last = await _publish(bus, *(f"o{i:02d}" for i in range(14)))
    consumer = Consumer(bus, spec, handler=_never, batch_handler=batch_handler, batch_size=4, ack_wait_s=5)
    async with _running(consumer):
        await asyncio.wait_for(entered.wait(), 15)
        # the first batch is being handled and the second one is already in hand: 4 + 4, and no more
        await _eventually_pending(bus, spec, 8)
        deadline = time.monotonic() + 15
        while len(consumer._in_hand) < 8:  # the server counts them as sent before the client has them
            assert time.monotonic() < deadline, f"{len(consumer._in_hand)} messages in the runner's hands"
            await asyncio.sleep(0.02)

        async def bounded() -> bool:  # never a third batch, and the prefetched one waits its turn
            return await _ack_pending(bus, spec) == 8 and len(consumer._in_hand) == 8 and len(batches) == 1

        await stays(bounded, settle_s=1.0, what="one batch handled and one prefetched")
        release.set()
        await _settled(bus, spec, last)
    ids = [event_id for batch in batches for event_id, _ in batch]
    assert ids == [f"evt-o{i:02d}" for i in range(14)]  # each once, in stream order across the batches
    seqs = [seq for batch in batches for _, seq in batch]
    assert seqs == sorted(seqs)
    assert seqs[-1] == last
    assert max(len(batch) for batch in batches) <= 4


async def test_a_batch_is_at_most_half_the_durables_max_ack_pending_so_the_next_one_is_still_prefetched(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch size larger than half the durable's ``max_ack_pending`` (here 10 against 6) is bounded to half of
    it: a batch of 3 is handled while the next 3 are prefetched. Unbounded, the first pull (10) could never be
    filled (the server hands out 6), waited out its fetch timeout and left no room for a prefetch."""
    spec = _spec("t-prefetch-bounded")
    config = ConsumerConfig(
        durable_name=spec.durable,
        ack_policy=AckPolicy.EXPLICIT,
        filter_subjects=list(spec.filter_subjects),
        max_ack_pending=6,
        ack_wait=30,
    )
    await bus.js.add_consumer(EVENTS_STREAM.name, config)

    async def as_created(*args: object, **kwargs: object) -> None:  # keep the durable's small max_ack_pending
        pass

    monkeypatch.setattr(bus, "ensure_consumer", as_created)
    batches: list[list[str]] = []
    entered, release = asyncio.Event(), asyncio.Event()

    async def batch_handler(batch: Batch) -> None:
        batches.append([event.id for event, _ in batch])
        entered.set()
        await release.wait()

    last = await _publish(bus, *(f"h{i:02d}" for i in range(14)))
    consumer = Consumer(bus, spec, handler=_never, batch_handler=batch_handler, batch_size=10, ack_wait_s=30)
    async with _running(consumer):
        await asyncio.wait_for(entered.wait(), 15)
        deadline = time.monotonic() + 15
        while len(consumer._in_hand) < 6:  # 3 being handled, 3 prefetched
            assert time.monotonic() < deadline, f"{len(consumer._in_hand)} messages in the runner's hands"
            await asyncio.sleep(0.02)
        assert batches == [[f"evt-h{i:02d}" for i in range(3)]]
        release.set()
        await _settled(bus, spec, last)
    assert [event_id for batch in batches for event_id in batch] == [f"evt-h{i:02d}" for i in range(14)]
    assert max(len(batch) for batch in batches) <= 3


async def test_the_heartbeat_keeps_the_prefetched_batch_alive(bus: Bus) -> None:
    spec = _spec("t-prefetch-heartbeat")
    deliveries: dict[str, list[int]] = {}
    release = asyncio.Event()

    async def batch_handler(batch: Batch) -> None:
        for event, delivery in batch:
            deliveries.setdefault(event.id, []).append(delivery.num_delivered)
        await release.wait()

    last = await _publish(bus, *(f"h{i}" for i in range(6)))
    consumer = Consumer(bus, spec, handler=_never, batch_handler=batch_handler, batch_size=3, ack_wait_s=1)
    async with _running(consumer):
        await _eventually_pending(bus, spec, 6)  # one batch handled, one prefetched
        await asyncio.sleep(3.5)  # more than three ack_waits: only the heartbeat keeps both alive
        release.set()
        await _settled(bus, spec, last)
        info = await bus.js.consumer_info(spec.stream, spec.durable)
    assert sorted(deliveries) == [f"evt-h{i}" for i in range(6)]
    assert all(counts == [1] for counts in deliveries.values()), deliveries
    assert info.num_redelivered == 0


async def test_a_consumer_stopped_mid_batch_leaves_what_it_held_and_nothing_is_lost_or_doubled(bus: Bus) -> None:
    """Batch 2 is committed but the consumer dies before its ack (batch 3 prefetched, not handled): a new
    consumer gets both again; the store, idempotent by event id, ends with every event exactly once."""
    spec = _spec("t-prefetch-crash")
    store: dict[str, int] = {}  # event id -> stream seq: what an idempotent INSERT ... ON CONFLICT keeps
    commits: list[str] = []  # every id a batch handler committed, duplicates included
    redelivered: list[str] = []
    calls = 0
    stuck = asyncio.Event()

    async def first_life(batch: Batch) -> None:
        nonlocal calls
        calls += 1
        for event, delivery in batch:
            commits.append(event.id)
            store.setdefault(event.id, delivery.stream_seq)
        if calls == 2:  # committed; the process dies before the runner acks
            stuck.set()
            await asyncio.Event().wait()

    async def second_life(batch: Batch) -> None:
        for event, delivery in batch:
            commits.append(event.id)
            store.setdefault(event.id, delivery.stream_seq)
            if delivery.num_delivered > 1:
                redelivered.append(event.id)

    ids = [f"c{i:02d}" for i in range(12)]
    last = await _publish(bus, *ids)
    first = Consumer(bus, spec, handler=_never, batch_handler=first_life, batch_size=4, ack_wait_s=1)
    stop = asyncio.Event()
    task = asyncio.create_task(first.run(stop))
    await asyncio.wait_for(stuck.wait(), 15)
    await _eventually_pending(bus, spec, 8)  # batch 2 (committed, un-acked) and batch 3 (prefetched)
    task.cancel()  # the crash: no graceful stop, no ack
    await asyncio.wait([task])
    assert not first._in_hand
    assert len(store) == 8

    second = Consumer(bus, spec, handler=_never, batch_handler=second_life, batch_size=4, ack_wait_s=1)
    async with _running(second):
        await _settled(bus, spec, last)
    assert sorted(store) == [f"evt-{i}" for i in ids]  # nothing lost
    assert sorted(redelivered) == [f"evt-c{i:02d}" for i in range(4, 12)]  # batch 2 and the prefetched 3
    assert len(commits) == 12 + 4  # batch 2 handled twice: idempotency by id keeps it once in the store
    assert list(store.values()) == sorted(store.values())  # recorded in stream order


async def test_a_poison_message_in_a_batch_is_dead_lettered_alone_and_the_rest_acked(bus: Bus) -> None:
    spec = _spec("t-prefetch-poison")
    handled: list[str] = []

    async def batch_handler(batch: Batch) -> None:
        if any(event.id == "evt-p2" for event, _ in batch):
            raise RuntimeError("the batch's transaction failed")
        handled.extend(event.id for event, _ in batch)

    async def handler(event: Envelope, delivery: Delivery) -> None:
        if event.id == "evt-p2":
            raise PermanentError("cannot ever store it")
        handled.append(event.id)

    last = await _publish(bus, *(f"p{i}" for i in range(1, 8)))
    async with _running(Consumer(bus, spec, handler=handler, batch_handler=batch_handler, batch_size=3)):
        await _settled(bus, spec, last)
        info = await bus.js.consumer_info(spec.stream, spec.durable)
    assert handled == [f"evt-p{i}" for i in (1, 3, 4, 5, 6, 7)]  # in stream order, each once
    assert await _dlq_count(bus, spec.durable) == 1
    assert info.num_redelivered == 0  # nobody nak'ed: the others acked, p2 dead-lettered


async def test_the_acks_of_later_batches_never_settle_a_message_whose_handling_failed(bus: Bus) -> None:
    """f2 fails in the fallback and is nak'ed for a retry in 2 s; the batches after it (prefetched) are
    committed and acked meanwhile. f2 must still come back: a cumulative ack past it would drop it."""
    spec = _spec("t-prefetch-nak", backoff_s=(2.0,))
    handled: list[tuple[str, int]] = []
    done = asyncio.Event()

    async def batch_handler(batch: Batch) -> None:
        if any(event.id == "evt-f2" and delivery.num_delivered == 1 for event, delivery in batch):
            raise ConnectionError("the batch's transaction failed")
        handled.extend((event.id, delivery.num_delivered) for event, delivery in batch)
        if any(event.id == "evt-f2" for event, _ in batch):
            done.set()

    async def handler(event: Envelope, delivery: Delivery) -> None:
        if event.id == "evt-f2" and delivery.num_delivered == 1:
            raise ConnectionError("the database went away")
        handled.append((event.id, delivery.num_delivered))
        if event.id == "evt-f2":
            done.set()

    last = await _publish(bus, *(f"f{i}" for i in range(1, 9)))
    async with _running(Consumer(bus, spec, handler=handler, batch_handler=batch_handler, batch_size=2)):
        await asyncio.wait_for(done.wait(), 20)
        await _settled(bus, spec, last)
    assert ("evt-f2", 2) in handled  # it came back after its nak, although later batches were acked first
    later = [event_id for event_id, _ in handled[: handled.index(("evt-f2", 2))]]
    assert "evt-f8" in later  # ... which they were: the retry came after the last batch
    assert sorted(event_id for event_id, _ in handled) == [f"evt-f{i}" for i in range(1, 9)]
    assert await _dlq_count(bus, spec.durable) == 0
