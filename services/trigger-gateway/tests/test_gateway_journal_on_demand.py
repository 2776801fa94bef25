"""The journal is read only while something needs it (TRG-6, issue 7): the ``trigger-gateway-events``
consumer pulls while an enabled event trigger or a trigger with a concurrency key exists, on every
replica alike, and not at all otherwise. Real nats-server; two gateway replicas in-process
(``gateway_support.replicas``); the consumer's state is read from the server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from gateway_support import AS_ADMIN, AS_OPERATOR, AS_VIEWER, eventually, replicas, webhook_spec

from temporality_bus import Bus, Consumer, Delivery
from temporality_embedded.natsserver import NatsServer
from temporality_protocol import Envelope, RunCompleted, derive_id, make_event, run_id_for_delivery
from temporality_protocol.catalog import CONSUMERS, EVENTS_STREAM
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays
from temporality_trigger_gateway import Settings
from temporality_trigger_gateway.events import journal_needed
from temporality_trigger_gateway.ondemand import OnDemandConsumer
from temporality_trigger_gateway.store import validate_spec

DURABLE = "trigger-gateway-events"


def _completed(run_id: str) -> Any:
    return make_event(
        RunCompleted(run_id=run_id, result="done", turns=1),
        source="/temporality/run-executor",
        id=derive_id("evt", run_id, "run.completed"),
        run_id=run_id,
        actor="agent:reviewer",
    )


def _event_spec(trigger_id: str = "after-any-run") -> dict[str, Any]:
    return {
        "id": trigger_id,
        "name": "After any run",
        "type": "event",
        "event_type": "run.completed",
        "agent": "triager",
    }


def test_what_needs_the_journal() -> None:
    event = validate_spec(_event_spec(), environ={}, agents=None)
    disabled = validate_spec({**_event_spec(), "enabled": False}, environ={}, agents=None)
    webhook = validate_spec(webhook_spec(), environ={}, agents=None)
    keyed = validate_spec(
        webhook_spec(enabled=False, concurrency={"key": "payload.pull_request.id", "policy": "skip"}),
        environ={},
        agents=None,
    )
    assert journal_needed([]) is None
    assert journal_needed([webhook, disabled]) is None
    assert journal_needed([webhook, event]) == "event trigger after-any-run is enabled"
    assert "concurrency" in (journal_needed([keyed]) or "")  # disabled, but a run of its key may be active


async def test_the_events_consumer_pulls_only_while_a_trigger_needs_it_on_every_replica(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async def info() -> Any:
        return await bus.js.consumer_info(EVENTS_STREAM.name, DURABLE)

    async def idle() -> bool:  # no replica has a pull request waiting
        return bool((await info()).num_waiting == 0)

    async def caught_up() -> bool:
        found = await info()
        return bool(found.num_pending == 0 and found.num_ack_pending == 0)

    async def untouched(delivered: int, pending: int) -> None:
        async def same() -> bool:
            found = await info()
            return bool(found.delivered.stream_seq == delivered and found.num_pending == pending)

        await stays(same, settle_s=1.5, what="nothing delivered from the journal")

    async with replicas(gateway_settings, 2) as (a, b):
        # the file has a webhook and a schedule trigger: the durable exists (its cursor), nobody pulls
        start = await info()
        assert start.num_waiting == 0
        backlog = _completed("run-before")
        await bus.publish(backlog)
        await untouched(start.delivered.stream_seq, 1)

        # the first enabled event trigger: both replicas pull; the event stored before it is passed over
        created = await a.post("/triggers", json=_event_spec(), headers=AS_ADMIN)
        assert created.status_code == 201, created.text
        await eventually(caught_up, timeout_s=10, what="the consumer caught up")
        fresh = _completed("run-after")
        await bus.publish(fresh)
        await event_log.wait_for("run.requested", run_id=run_id_for_delivery("after-any-run", fresh.id), timeout_s=10)
        await eventually(caught_up, timeout_s=10, what="the consumer caught up")
        await event_log.caught_up()
        assert not event_log.of_type("run.requested", run_id=run_id_for_delivery("after-any-run", backlog.id))

        async def nobody_reads_the_journal(applied_everywhere: Callable[[httpx.AsyncClient], Awaitable[bool]]) -> None:
            for replica in (a, b):  # each replica applied the change (so it decided), then no pull request waits

                async def applied(r: httpx.AsyncClient = replica) -> bool:
                    return await applied_everywhere(r)

                await eventually(applied, timeout_s=10, what="the change applied")
            await eventually(idle, timeout_s=10, what="no replica pulls")
            stopped = await info()
            await bus.publish(_completed(f"run-unread-{stopped.delivered.stream_seq}"))
            await untouched(stopped.delivered.stream_seq, 1)

        # the last one disabled (through the other replica): both stop pulling
        disabled = await b.post("/triggers/after-any-run/disable", headers=AS_OPERATOR)
        assert disabled.status_code == 200, disabled.text

        async def serves_it_disabled(replica: httpx.AsyncClient) -> bool:
            view = (await replica.get("/triggers/after-any-run", headers=AS_VIEWER)).json()
            return bool(view["served"] and view["trigger"]["enabled"] is False)

        await nobody_reads_the_journal(serves_it_disabled)

        # a trigger with a concurrency key needs the runs' ends: pulling again, the events kept meanwhile
        # handed over (the one stored while nobody pulled is acknowledged, no run: the trigger is disabled)
        keyed = webhook_spec("keyed", concurrency={"key": "payload.pull_request.id", "policy": "skip"})
        assert (await b.post("/triggers", json=keyed, headers=AS_ADMIN)).status_code == 201
        await eventually(caught_up, timeout_s=10, what="the consumer caught up again")
        deleted = await a.delete("/triggers/keyed", headers=AS_ADMIN)
        assert deleted.status_code == 204, deleted.text

        async def serves_it_no_more(replica: httpx.AsyncClient) -> bool:
            return (await replica.post("/hooks/keyed", json={})).status_code == 404

        await nobody_reads_the_journal(serves_it_no_more)
        await event_log.caught_up()
        assert len(event_log.of_type("run.requested")) == 1


async def test_a_start_that_fails_while_the_bus_is_away_is_retried_not_fatal(nats_server: NatsServer, bus: Bus) -> None:
    handled: list[str] = []

    async def handler(envelope: Envelope, delivery: Delivery) -> None:
        handled.append(envelope.id)

    consumer = OnDemandConsumer(bus, CONSUMERS[DURABLE], handler=handler)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))

    async def running() -> bool:
        return consumer.running.is_set()

    async def disconnected() -> bool:
        return not bus.nc.is_connected

    async def retried() -> bool:
        return consumer.starts >= 2

    async def pulling() -> bool:
        return consumer.pulling

    try:
        await eventually(running, timeout_s=10, what="the supervisor running")
        assert not consumer.pulling  # nothing wants the journal yet
        nats_server.requested_port = nats_server.port  # come back on the same port
        nats_server.stop(hold_port=True)  # held meanwhile: no other test's server takes it
        await eventually(disconnected, timeout_s=10, what="the bus gone")
        consumer.want(True, why="a trigger enabled during the outage")
        await eventually(retried, timeout_s=30, what="a failed start tried again")
        assert consumer.running.is_set()
        assert not task.done()  # the failure did not end the consumer (and so the service)
        nats_server.start()
        await eventually(pulling, timeout_s=30, what="pulling once the bus is back")
        event = _completed("run-after-the-outage")
        await bus.publish(event)

        async def seen() -> bool:
            return event.id in handled

        await eventually(seen, timeout_s=10, what="the event handled")
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


async def test_what_waits_for_an_unwanted_on_demand_consumer_is_no_lag(bus: Bus) -> None:
    """With no event trigger the durable is never pulled and the server keeps every run's events for it: the
    ``/metrics`` lag gauge says 0 then (no consumer-lag alert for nothing); wanted, its pending count is a lag again."""
    from temporality_service.metrics import ServiceMetrics

    async def handler(envelope: Envelope, delivery: Delivery) -> None:
        pass

    consumer = OnDemandConsumer(bus, CONSUMERS[DURABLE], handler=handler)
    metrics = ServiceMetrics("trigger-gateway", bus)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))

    def pending() -> float | None:
        return metrics.registry.get_sample_value(
            "temporality_consumer_pending", {"service": "trigger-gateway", "consumer": DURABLE}
        )

    try:
        await eventually(lambda: _is(consumer.running.is_set()), timeout_s=10, what="the supervisor running")
        for n in range(3):
            await bus.publish(_completed(f"run-kept-{n}"))

        async def kept() -> bool:
            return (await bus.js.consumer_info(EVENTS_STREAM.name, DURABLE)).num_pending >= 3

        await eventually(kept, timeout_s=10, what="the events kept for the durable")
        assert not consumer.lag_matters
        await metrics.refresh_lag([consumer])
        assert pending() == 0
        await metrics.refresh_lag([Consumer(bus, CONSUMERS[DURABLE], handler=handler)])  # an ordinary consumer's
        assert pending() == 3  # what the server keeps, which the on-demand consumer did not report
        consumer.want(True, why="an event trigger enabled")
        assert consumer.lag_matters  # the server's count from now on (the kept events, while handed over)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


async def _is(value: bool) -> bool:
    return value
