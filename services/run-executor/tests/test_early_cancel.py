"""A cancel that overtakes its run (RUN-2, a trigger's ``supersede``) over a real nats-server.

``run.cancel_requested`` and ``run.requested`` come on different consumers, so a cancel published
milliseconds after the request may be handled first. The cancel leaves a marker (bucket
``run-cancel-markers``, key = the run id, TTL 7 days); the ``run.requested`` that comes later finds it and
the run is cancelled at once: ``run.created`` then ``run.cancelled`` (the reason and who asked), no
``run.started``, no provider call. Either order, each message delivered twice (the same CloudEvent
again, as after a lost ack): exactly one terminal event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

import pytest
from executor_support import HeldProvider, RunExecutor, run_record, run_requested, settled

from temporality_bus import Bus
from temporality_protocol import (
    CONTENT_TYPE,
    Envelope,
    RunCancelled,
    RunCancelRequested,
    RunState,
    encode,
    make_event,
)
from temporality_protocol.catalog import BUCKET_CANCEL_MARKERS, BUCKET_RUNS
from temporality_run_executor.agents import AgentCard
from temporality_run_executor.providers import Provider
from temporality_run_executor.providers.factory import ProviderCache
from temporality_run_executor.records import CancelRequest, RunRecord
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays

TERMINAL = ("run.completed", "run.failed", "run.cancelled")


class CountingProvider(HeldProvider):
    """The real scripted provider, counting its calls."""

    def __init__(self, inner: Provider) -> None:
        super().__init__(inner, hold=False)


Counted = tuple[ProviderCache, dict[str, CountingProvider]]


@pytest.fixture
async def counted() -> AsyncIterator[Counted]:
    cache = ProviderCache()
    made: dict[str, CountingProvider] = {}
    yield cache, made
    await cache.aclose()


def _cancel_event(run_id: str, event_id: str, reason: str = "superseded by a newer push") -> Envelope:
    data = RunCancelRequested(run_id=run_id, reason=reason, requested_by="trigger:ado-pr-review")
    return make_event(data, source="/test", id=event_id, run_id=run_id)


async def _redeliver(bus: Bus, event: Envelope, copy: int) -> None:
    """The very same CloudEvent once more (a new ``Nats-Msg-Id`` only, so JetStream stores it again): what
    the consumer sees when a delivery's ack was lost."""
    headers = {"Nats-Msg-Id": f"{event.id}#redelivery-{copy}", "Content-Type": CONTENT_TYPE, "Ce-Type": event.type}
    await bus.publish_raw(event.nats_subject, encode(event), headers)


#: The two consumers the test feeds.
_FED = ("run-executor-requests", "run-executor-human")


async def _marker(bus: Bus, run_id: str, timeout_s: float = 30) -> CancelRequest:
    store = await bus.store(BUCKET_CANCEL_MARKERS, CancelRequest)
    async with asyncio.timeout(timeout_s):
        while True:
            got = await store.get(run_id)
            if got is not None:
                return got.value
            await asyncio.sleep(0.05)


async def _exactly_one_cancel(bus: Bus, event_log: EventLog, run_id: str, cancel_id: str) -> None:
    (cancelled,) = await event_log.wait_for("run.cancelled", run_id=run_id)
    assert cancelled.payload(RunCancelled).reason == "superseded by a newer push (requested by trigger:ado-pr-review)"
    assert cancelled.causationid == cancel_id
    record = await run_record(bus, run_id, RunState.CANCELLED)
    assert record.cancel is not None
    assert (record.cancel.requested_by, record.cancel.event_id) == ("trigger:ado-pr-review", cancel_id)
    await settled(bus, _FED)
    await event_log.caught_up()

    def one_terminal() -> bool:
        return [e.type for e in event_log.events if e.runid == run_id and e.type in TERMINAL] == ["run.cancelled"]

    await stays(one_terminal, settle_s=1.0, what=f"one terminal event for {run_id}")
    assert len(event_log.of_type("run.created", run_id)) >= 1
    assert not event_log.of_type("bus.dead_lettered")


def _provider_for(counted: Counted) -> Callable[[AgentCard], Provider]:
    cache, made = counted

    def provider_for(card: AgentCard) -> Provider:
        return made.setdefault(card.id, CountingProvider(cache(card)))

    return provider_for


async def test_a_cancel_before_its_run_requested_cancels_the_run_at_once_without_a_turn(
    bus: Bus,
    event_log: EventLog,
    executor: RunExecutor,
    counted: Counted,
) -> None:
    await executor(provider_for=_provider_for(counted))
    requested = run_requested()
    run_id = requested.runid
    assert run_id
    cancel = _cancel_event(run_id, f"evt-cancel-{run_id}")
    await bus.publish(cancel)
    await _redeliver(bus, cancel, 1)  # the cancel twice, before the run exists
    marker = await _marker(bus, run_id)
    assert (marker.reason, marker.event_id) == ("superseded by a newer push", cancel.id)
    await settled(bus, _FED)
    assert await (await bus.store(BUCKET_RUNS, RunRecord)).get(run_id) is None  # a marker, not a run
    assert not event_log.of_type("bus.dead_lettered")  # no longer a poison message

    await bus.publish(requested)
    await _exactly_one_cancel(bus, event_log, run_id, cancel.id)
    await _redeliver(bus, requested, 1)  # and both again after the end
    await _redeliver(bus, cancel, 2)
    await _exactly_one_cancel(bus, event_log, run_id, cancel.id)
    assert not event_log.of_type("run.started", run_id)
    assert not event_log.of_type("run.checkpointed", run_id)
    assert counted[1] == {}  # no provider was ever asked for a turn


async def test_a_cancel_after_its_run_requested_takes_the_usual_way(
    bus: Bus,
    event_log: EventLog,
    executor: RunExecutor,
    counted: Counted,
) -> None:
    await executor(provider_for=_provider_for(counted))
    requested = run_requested()
    run_id = requested.runid
    assert run_id
    await bus.publish(requested)
    await event_log.wait_for("human.requested", run_id=run_id)  # parked: nobody drives it
    await run_record(bus, run_id, RunState.WAITING_FOR_HUMAN)
    cancel = _cancel_event(run_id, f"evt-cancel-{run_id}")
    await bus.publish(cancel)
    await _redeliver(bus, requested, 1)
    await _redeliver(bus, cancel, 1)
    await _exactly_one_cancel(bus, event_log, run_id, cancel.id)
    assert await (await bus.store(BUCKET_CANCEL_MARKERS, CancelRequest)).get(run_id) is None  # the run was known
    assert [e.type for e in event_log.events if e.runid == run_id].count("run.started") == 1


async def test_a_second_early_cancel_keeps_the_first(bus: Bus, event_log: EventLog, executor: RunExecutor) -> None:
    await executor()
    requested = run_requested()
    run_id = requested.runid
    assert run_id
    first = _cancel_event(run_id, "evt-c1")
    await bus.publish(first)
    await _marker(bus, run_id)
    await bus.publish(_cancel_event(run_id, "evt-c2", reason="another reason"))
    await settled(bus, _FED)
    assert (await _marker(bus, run_id)).event_id == "evt-c1"
    await bus.publish(requested)
    await _exactly_one_cancel(bus, event_log, run_id, "evt-c1")


async def test_cancel_markers_expire(bus: Bus) -> None:
    """A cancel for a run that never comes does not stay forever: the bucket's TTL is 7 days."""
    info = await bus.js.stream_info(f"KV_{BUCKET_CANCEL_MARKERS.name}")
    assert info.config.max_age == timedelta(days=7).total_seconds()
