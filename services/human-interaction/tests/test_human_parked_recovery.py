"""A rolling upgrade from a version before parking: a replica of that version handed a parked request's timer
(``<id>.policywake``, ``<id>.policy``) does not know it -- it took every timer for a stored request's deadline,
found none, and dead-lettered the firing. The parked request is not lost: the retention sweep finds it
parked with its run's policy known (or past its deadline) and takes it in (or refuses it) as the timer would
have. On a real nats-server, under the real durable consumers; the old replica's timers handler does what
that version's did with such a firing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from human_support import events_of, exactly, requested, running, stored

from temporality_bus import Bus, Consumer, Delivery, PermanentError
from temporality_human_interaction.channels import ChannelAdapter
from temporality_human_interaction.deadlines import DeadlinePayload
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.inbox import PARKED_GRACE, RetentionSweeper
from temporality_human_interaction.parking import park, parked_of_run
from temporality_human_interaction.policies import RunPolicies, RunPolicyHandler
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import HumanPolicy, HumanRejected, LaunchSource, RunRequested, make_event, new_id
from temporality_protocol.catalog import CONSUMERS

DLQ_STREAM = "TEMPORALITY_DLQ"


async def _before_parking(data: bytes, delivery: Delivery | None = None) -> None:
    """The timers handler of the version before parking, for a request that is not stored (a parked one)."""
    request_id = DeadlinePayload.model_validate_json(data).request_id
    raise PermanentError(f"a deadline fired for {request_id}, which is not a known request")


async def _dead_lettered(bus: Bus) -> int:
    return int((await bus.js.stream_info(DLQ_STREAM)).state.messages)


async def _until_dead_lettered(bus: Bus, count: int, *, within_s: float = 30) -> None:
    seen = 0
    try:
        async with asyncio.timeout(within_s):
            while True:
                seen = await _dead_lettered(bus)
                if seen >= count:
                    return
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"{seen} messages dead-lettered, not {count}") from None


def _run_requested(run_id: str) -> RunRequested:
    return RunRequested(
        run_id=run_id,
        agent="reviewer",
        title="Review PR 42",
        launch=LaunchSource(kind="webhook", trigger_id="ado-pr-review"),
        human=HumanPolicy(allowed_recipients=["user:alice"]),
    )


@pytest.mark.timeout(90)
async def test_a_wake_up_an_old_replica_dead_lettered_is_taken_in_by_the_sweep(
    bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter]
) -> None:
    run_id = new_id("run")
    event = requested(recipient="user:alice", run_id=run_id, expires_in_s=600)
    request_id = str(event.data["request_id"])
    await park(bus, event, run_id, request_id, event.time + timedelta(seconds=600))
    dead_before = await _dead_lettered(bus)

    policies = RunPolicies(bus, wait_deliveries=2)
    policy_consumer = Consumer(
        bus, CONSUMERS["human-interaction-policies"], handler=RunPolicyHandler(policies).handle, fetch_timeout_s=0.2
    )
    old_timers = Consumer(
        bus, CONSUMERS["human-interaction-deadlines"], raw_handler=_before_parking, fetch_timeout_s=0.2
    )
    async with running(policy_consumer, old_timers):
        await bus.publish(make_event(_run_requested(run_id), source="/temporality/trigger-gateway", run_id=run_id))
        await _until_dead_lettered(bus, dead_before + 1)  # the wake-up: lost to the old replica
    assert await parked_of_run(bus, run_id) == [request_id]
    assert await stored(bus, request_id) is None

    handler = RequestHandler(bus, directory, adapters, policies=policies)
    now = datetime.now(UTC)
    early = RetentionSweeper(
        bus, retention=timedelta(days=1), every_s=60, resume=handler.resume_parked, clock=lambda: now
    )
    await early.sweep()
    assert early.last_resumed == 0  # the wake-up may still be under way: left to it
    assert await parked_of_run(bus, run_id) == [request_id]

    later = now + PARKED_GRACE + timedelta(seconds=1)
    sweeper = RetentionSweeper(
        bus, retention=timedelta(days=1), every_s=60, resume=handler.resume_parked, clock=lambda: later
    )
    await sweeper.sweep()
    assert sweeper.last_resumed == 1
    [notified] = await exactly(bus, "human.notified", within_s=10)
    assert notified.data["request_id"] == request_id
    assert await parked_of_run(bus, run_id) == []
    assert await stored(bus, request_id) is not None
    await sweeper.sweep()  # nothing parked any more: nothing resumed, nothing asked twice
    assert sweeper.last_resumed == 0
    assert len(await events_of(bus, "human.notified")) == 1


async def test_a_parked_request_whose_deadline_firing_was_lost_is_refused_by_the_sweep(
    bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter]
) -> None:
    run_id = new_id("run")  # its run.requested never comes
    event = requested(recipient="user:alice", run_id=run_id, expires_in_s=600)
    request_id = str(event.data["request_id"])
    expires_at = event.time + timedelta(seconds=600)
    await park(bus, event, run_id, request_id, expires_at)  # its deadline timer is never handled here

    handler = RequestHandler(bus, directory, adapters, policies=RunPolicies(bus, wait_deliveries=2))
    before = expires_at + PARKED_GRACE - timedelta(seconds=1)
    sweeper = RetentionSweeper(
        bus, retention=timedelta(days=1), every_s=60, resume=handler.resume_parked, clock=lambda: before
    )
    await sweeper.sweep()
    assert sweeper.last_resumed == 0
    after = expires_at + PARKED_GRACE
    sweeper = RetentionSweeper(
        bus, retention=timedelta(days=1), every_s=60, resume=handler.resume_parked, clock=lambda: after
    )
    await sweeper.sweep()
    assert sweeper.last_resumed == 1
    [rejected] = await exactly(bus, "human.rejected", within_s=10)
    assert rejected.payload(HumanRejected).reason == "recipient_not_allowed"
    assert await parked_of_run(bus, run_id) == []
    assert await stored(bus, request_id) is None
