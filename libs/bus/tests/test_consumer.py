"""The consumer runner's acks and heartbeat against a real nats-server."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import structlog
import structlog.testing
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy

from temporality_bus import Bus, Consumer, Delivery, NatsSettings, TransientError
from temporality_bus import consumer as consumer_module
from temporality_protocol import Envelope, RunFailed, make_event
from temporality_protocol.catalog import EVENTS_STREAM, ConsumerSpec, subject_for


def _failed(run_id: str) -> Envelope:
    return make_event(RunFailed(run_id=run_id, reason="r", error="e"), source="/test", id=f"evt-{run_id}")


def _spec(durable: str) -> ConsumerSpec:
    return ConsumerSpec(durable, EVENTS_STREAM.name, (subject_for("run.failed"),), "test", backoff_s=(0.1,))


async def _until(
    bus: Bus, durable: str, condition: Callable[[ConsumerInfo], bool], within_s: float = 15.0
) -> ConsumerInfo:
    deadline = time.monotonic() + within_s
    while True:
        info = await bus.js.consumer_info(EVENTS_STREAM.name, durable)
        if condition(info):
            return info
        assert time.monotonic() < deadline, f"condition not met: {info}"
        await asyncio.sleep(0.05)


async def _wait(awaitable: Awaitable[object], within_s: float = 15.0) -> None:
    await asyncio.wait_for(awaitable, within_s)


async def test_running_is_set_once_the_durable_exists_and_cleared_at_stop(bus: Bus) -> None:
    async def handler(event: Envelope, delivery: Delivery) -> None:
        pass

    consumer = Consumer(bus, _spec("t-running"), handler=handler)
    assert not consumer.running.is_set()
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    await _wait(consumer.running.wait())
    info = await bus.js.consumer_info(EVENTS_STREAM.name, "t-running")  # exists once running is set
    assert info.config.durable_name == "t-running"
    stop.set()
    await _wait(task)
    assert not consumer.running.is_set()


async def test_the_ack_is_sent_only_after_the_handler_returned(bus: Bus) -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    committed: list[str] = []

    async def handler(event: Envelope, delivery: Delivery) -> None:
        entered.set()
        await release.wait()
        committed.append(event.id)

    seq = (await bus.publish(_failed("ack-1"))).seq
    stop = asyncio.Event()
    task = asyncio.create_task(Consumer(bus, _spec("t-ack"), handler=handler, ack_wait_s=5).run(stop))
    try:
        await _wait(entered.wait())
        await asyncio.sleep(0.5)  # give a premature ack every chance to arrive
        info = await bus.js.consumer_info(EVENTS_STREAM.name, "t-ack")
        assert info.num_ack_pending == 1  # handed out, not acked while the handler runs
        assert info.ack_floor.stream_seq < seq
        release.set()
        info = await _until(bus, "t-ack", lambda i: i.ack_floor.stream_seq >= seq and i.num_ack_pending == 0)
        assert committed == ["evt-ack-1"]
        assert info.num_redelivered == 0
    finally:
        release.set()
        stop.set()
        await _wait(task)


async def test_one_heartbeat_keeps_long_handlers_alive_beyond_ack_wait(bus: Bus) -> None:
    """Three handlers each run 3.5 x ack_wait: no redelivery, and one heartbeat task serves them all."""
    ack_wait = 1.0
    n = 3
    calls: list[tuple[str, int]] = []
    all_in = asyncio.Event()
    heartbeats_seen: list[int] = []
    durable = "t-heartbeat"

    async def handler(event: Envelope, delivery: Delivery) -> None:
        calls.append((event.id, delivery.num_delivered))
        if len(calls) == n:
            all_in.set()
        await _wait(all_in.wait())
        heartbeats_seen.append(sum(1 for t in asyncio.all_tasks() if t.get_name() == f"heartbeat:{durable}"))
        await asyncio.sleep(3.5 * ack_wait)  # a long turn: longer than ack_wait, several times over

    last = 0
    for k in range(n):
        last = (await bus.publish(_failed(f"hb-{k}"))).seq
    stop = asyncio.Event()
    consumer = Consumer(bus, _spec(durable), handler=handler, max_inflight=n, ack_wait_s=ack_wait)
    task = asyncio.create_task(consumer.run(stop))
    try:
        await _wait(consumer.running.wait())
        info = await _until(bus, durable, lambda i: i.ack_floor.stream_seq >= last and i.num_ack_pending == 0, 30)
    finally:
        stop.set()
        await _wait(task)
    assert sorted(calls) == sorted((f"evt-hb-{k}", 1) for k in range(n))  # each handled once, first delivery
    assert info.num_redelivered == 0
    assert heartbeats_seen == [1] * n  # one loop for the consumer, not one per message
    assert not any(t.get_name() == f"heartbeat:{durable}" for t in asyncio.all_tasks())  # gone after stop


async def test_without_a_heartbeat_the_server_would_redeliver(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control for the test above: the same long handler with in_progress silenced is redelivered."""
    ack_wait = 1.0
    durable = "t-no-heartbeat"
    deliveries: list[int] = []
    redelivered = asyncio.Event()

    async def silent(self: Consumer) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(Consumer, "_heartbeat", silent)

    async def handler(event: Envelope, delivery: Delivery) -> None:
        deliveries.append(delivery.num_delivered)
        if delivery.num_delivered > 1:
            redelivered.set()
            return
        await _wait(redelivered.wait(), 20)

    await bus.publish(_failed("nohb"))
    stop = asyncio.Event()
    task = asyncio.create_task(
        Consumer(bus, _spec(durable), handler=handler, max_inflight=2, ack_wait_s=ack_wait).run(stop)
    )
    try:
        await _wait(redelivered.wait(), 20)
    finally:
        stop.set()
        await _wait(task, 30)
    assert deliveries[:2] == [1, 2]


async def test_a_new_durable_with_deliver_policy_new_starts_at_the_tail_and_later_resumes(bus: Bus) -> None:
    await bus.ensure(streams=[EVENTS_STREAM])
    await bus.publish(_failed("before"))
    seen: list[str] = []

    async def handler(event: Envelope, delivery: Delivery) -> None:
        seen.append(str(event.data["run_id"]))

    spec = ConsumerSpec(
        "t-tail", EVENTS_STREAM.name, (subject_for("run.failed"),), "test", backoff_s=(0.1,), deliver_policy="new"
    )
    for run_ids in (["after"], ["while-away"]):
        consumer = Consumer(bus, spec, handler=handler, fetch_timeout_s=0.2)
        stop = asyncio.Event()
        task = asyncio.create_task(consumer.run(stop))
        await _wait(consumer.running.wait())
        for run_id in run_ids:
            await bus.publish(_failed(run_id))
        await _until(
            bus, "t-tail", lambda i: i.num_pending == 0 and i.num_ack_pending == 0 and i.delivered.stream_seq > 1
        )
        stop.set()
        await _wait(task)
        if run_ids == ["after"]:
            await bus.publish(_failed("between"))  # stored while no process runs the durable: delivered later
    info = await bus.js.consumer_info(EVENTS_STREAM.name, "t-tail")
    assert info.config.deliver_policy == DeliverPolicy.NEW
    assert seen == ["after", "between", "while-away"]  # never "before": the new durable started at the tail


@pytest.mark.parametrize(
    ("error", "traceback"), [(TransientError("a race was lost"), False), (RuntimeError("a bug"), True)]
)
async def test_a_retry_logs_a_traceback_only_for_an_unexpected_error(
    bus: Bus, error: Exception, traceback: bool
) -> None:
    """A handler's TransientError (a lost race, a peer away) is retried with its message in the log, no
    traceback; any other exception is retried with its traceback (a bug to find)."""
    durable = f"t-retry-log-{type(error).__name__.lower()}"
    calls: list[int] = []

    async def handler(event: Envelope, delivery: Delivery) -> None:
        calls.append(delivery.num_delivered)
        if delivery.num_delivered == 1:
            raise error

    seq = (await bus.publish(_failed(durable))).seq
    stop = asyncio.Event()
    consumer = Consumer(bus, _spec(durable), handler=handler)
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(consumer.run(stop))
        try:
            await _wait(consumer.running.wait())
            await _until(bus, durable, lambda i: i.num_ack_pending == 0 and i.ack_floor.stream_seq >= seq)
        finally:
            stop.set()
            await _wait(task)
    assert calls == [1, 2]
    (retry,) = [e for e in logs if e["event"] == "handler.retry"]
    assert retry["error"] == repr(error)
    assert retry["log_level"] == "warning"
    assert retry["exc_info"] is traceback


async def test_replicas_whose_durable_is_nearly_full_do_not_spin_on_pull_requests(
    bus: Bus, nats_settings: NatsSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas on one durable, its max_ack_pending (2) full with messages in hand, one more waiting: the
    server ends one replica's requests at once ("408 Requests Pending") while the other's waits. It pauses
    after such an end instead of asking again at once (it sent thousands of requests a second)."""
    spec = _spec("t-two-replicas")
    config = ConsumerConfig(
        durable_name=spec.durable,
        ack_policy=AckPolicy.EXPLICIT,
        filter_subjects=list(spec.filter_subjects),
        max_ack_pending=2,
        ack_wait=30,
    )
    await bus.js.add_consumer(EVENTS_STREAM.name, config)
    fetches: collections.Counter[int] = collections.Counter()
    fetch = consumer_module._Puller.fetch

    async def counted(self: consumer_module._Puller, *args: Any, **kwargs: Any) -> Any:
        fetches[id(self)] += 1
        return await fetch(self, *args, **kwargs)

    monkeypatch.setattr(consumer_module._Puller, "fetch", counted)
    release = asyncio.Event()

    async def handler(event: Envelope, delivery: Delivery) -> None:
        await release.wait()

    stop = asyncio.Event()
    async with Bus.connect(nats_settings, name="replica-b") as other:

        async def as_created(*args: object, **kwargs: object) -> None:  # keep the durable's small max_ack_pending
            pass

        replicas = [Consumer(b, spec, handler=handler, max_inflight=8) for b in (bus, other)]
        for b in (bus, other):
            monkeypatch.setattr(b, "ensure_consumer", as_created)
        tasks = [asyncio.create_task(c.run(stop)) for c in replicas]
        try:
            await _wait(asyncio.gather(*(c.running.wait() for c in replicas)))
            for n in range(3):
                await bus.publish(_failed(f"two-{n}"))
            await _until(bus, spec.durable, lambda i: i.num_ack_pending == 2 and i.num_pending == 1)
            fetches.clear()
            await asyncio.sleep(1.0)  # a window to count in: the pause bounds what comes, whatever the load
            assert sum(fetches.values()) < 60, fetches  # ~10 a second per replica at most; thousands before
        finally:
            release.set()
            stop.set()
            await _wait(asyncio.gather(*tasks))
