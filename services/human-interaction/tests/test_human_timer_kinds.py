"""A rolling upgrade: an older replica is handed the firing of a timer kind it does not know (here a parked
request's wake-up, ``<id>.policywake``). It neither guesses nor dead-letters it: the firing is armed again,
unchanged, for later, and a replica that knows the kind takes it -- on a real nats-server, under the real
durable consumers, the old replica's timers handler built without that kind."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from human_support import events_of, exactly, requested, running, stored, timer_messages

from temporality_bus import Bus, Consumer
from temporality_human_interaction.channels import ChannelAdapter
from temporality_human_interaction.deadlines import KNOWN_KINDS, DeadlineHandler, timer_kind
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.parking import park, parked_of_run
from temporality_human_interaction.policies import RunPolicies, RunPolicyHandler
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.timers import human_timers
from temporality_protocol import HumanNotified, HumanPolicy, LaunchSource, RunRequested, make_event, new_id
from temporality_protocol.catalog import CONSUMERS

DLQ_STREAM = "TEMPORALITY_DLQ"


def _replica(
    bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter], kinds: frozenset[str]
) -> tuple[Consumer, Consumer]:
    """The policies and timers consumers of one replica whose timers handler knows ``kinds``."""
    policies = RunPolicies(bus, wait_deliveries=2)
    handler = RequestHandler(bus, directory, adapters, policies=policies)
    timers = DeadlineHandler(bus, resume=handler.resume_parked, known_kinds=kinds, defer_unknown_s=1)
    return (
        Consumer(
            bus, CONSUMERS["human-interaction-policies"], handler=RunPolicyHandler(policies).handle, fetch_timeout_s=0.2
        ),
        Consumer(bus, CONSUMERS["human-interaction-deadlines"], raw_handler=timers.handle, fetch_timeout_s=0.2),
    )


async def _dead_lettered(bus: Bus) -> int:
    info = await bus.js.stream_info(DLQ_STREAM)
    return int(info.state.messages)


async def _fired_at_least(bus: Bus, subject: str, count: int, *, within_s: float = 30) -> None:
    seen = 0
    try:
        async with asyncio.timeout(within_s):
            while True:
                seen = await timer_messages(bus, subject)
                if seen >= count:
                    return
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"{subject} fired {seen} times, not {count}") from None


def test_the_kind_is_the_fired_key_s_suffix() -> None:
    assert [timer_kind(k) for k in ("hr-1", "hr-1.repair", "hr-1.policywake", "hr-1.later-kind")] == [
        "",
        "repair",
        "policywake",
        "later-kind",
    ]
    assert timer_kind("not a key") is None
    assert timer_kind("hr-1.two.parts") is None
    assert "later-kind" not in KNOWN_KINDS


@pytest.mark.timeout(90)
async def test_an_old_replica_defers_a_wake_up_it_does_not_know_and_a_new_one_takes_it(
    bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter]
) -> None:
    run_id = new_id("run")
    event = requested(recipient="user:alice", run_id=run_id, expires_in_s=600)
    request_id = str(event.data["request_id"])
    # parked while the run's policy was unknown (as the intake parks it: the event kept, its deadline armed)
    await park(bus, event, run_id, request_id, event.time + timedelta(seconds=600))
    assert await parked_of_run(bus, run_id) == [request_id]
    wake_subject = human_timers(bus).fired_subject(f"{request_id}.policywake")
    dead_before = await _dead_lettered(bus)

    old = _replica(bus, directory, adapters, KNOWN_KINDS - {"policywake"})  # the version before the wake-up
    async with running(*old):
        run = RunRequested(
            run_id=run_id,
            agent="reviewer",
            title="Review PR 42",
            launch=LaunchSource(kind="webhook", trigger_id="ado-pr-review"),
            human=HumanPolicy(allowed_recipients=["user:alice"]),
        )
        await bus.publish(make_event(run, source="/temporality/trigger-gateway", run_id=run_id))
        # the policy arrives, its handler arms the wake-up; the old replica gets it twice (the firing, and
        # the firing it deferred), takes it in neither time, and dead-letters nothing
        await _fired_at_least(bus, wake_subject, 2)
        assert await parked_of_run(bus, run_id) == [request_id]
        assert await stored(bus, request_id) is None
        assert await _dead_lettered(bus) == dead_before

    new = _replica(bus, directory, adapters, KNOWN_KINDS)  # the upgrade is done
    requests_consumer = Consumer(
        bus,
        CONSUMERS["human-interaction-requests"],
        handler=RequestHandler(bus, directory, adapters, policies=RunPolicies(bus, wait_deliveries=2)).handle,
        fetch_timeout_s=0.2,
    )
    async with running(*new, requests_consumer):
        [notified] = await exactly(bus, "human.notified", within_s=30)
    assert notified.payload(HumanNotified).request_id == request_id
    assert await parked_of_run(bus, run_id) == []
    assert await stored(bus, request_id) is not None
    assert await _dead_lettered(bus) == dead_before
    assert await events_of(bus, "human.rejected") == []
