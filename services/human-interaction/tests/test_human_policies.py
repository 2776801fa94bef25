"""SEC-1: human-interaction decides whom a run may ask from its own projection of ``run.requested``, never from
the copy the run-executor puts into ``human.requested`` / ``human.notify_requested`` (forged events here)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from human_support import count_requests, events_of, exactly, kv_calls, requested, running, stored
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from temporality_bus import Bus, Consumer, Delivery, NatsSettings, PermanentError, TransientError
from temporality_human_interaction.channels import ChannelAdapter
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS
from temporality_human_interaction.deadlines import DeadlineHandler
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.notifications import NotificationHandler
from temporality_human_interaction.parking import parked_of_run
from temporality_human_interaction.policies import RunPolicies, RunPolicyHandler
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import (
    Escalate,
    HumanNotified,
    HumanNotifyRequested,
    HumanPolicy,
    HumanRejected,
    LaunchSource,
    RunRequested,
    TimeoutPolicy,
    make_event,
    new_id,
)
from temporality_protocol.catalog import CONSUMERS, EVENTS_STREAM
from temporality_testing.kv_reads import kv_read_key


def _run_requested(run_id: str, allowed: list[str], max_timeout_s: int = 7 * 24 * 3600) -> RunRequested:
    return RunRequested(
        run_id=run_id,
        agent="reviewer",
        title="Review PR 42",
        launch=LaunchSource(kind="webhook", trigger_id="ado-pr-review"),
        human=HumanPolicy(allowed_recipients=allowed, max_timeout_s=max_timeout_s),
    )


async def _publish_run(bus: Bus, run_id: str, allowed: list[str], max_timeout_s: int = 7 * 24 * 3600) -> None:
    data = _run_requested(run_id, allowed, max_timeout_s)
    await bus.publish(make_event(data, source="/temporality/trigger-gateway", run_id=run_id))


def _consumers(
    bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter], wait_deliveries: int
) -> tuple[Consumer, Consumer, Consumer]:
    """The policies, requests and timers consumers, as the service wires them (a parked request's timers
    reach the request intake through the timers' handler)."""
    policies = RunPolicies(bus, wait_deliveries=wait_deliveries)
    handler = RequestHandler(bus, directory, adapters, policies=policies)
    timers = DeadlineHandler(bus, resume=handler.resume_parked)
    return (
        Consumer(
            bus, CONSUMERS["human-interaction-policies"], handler=RunPolicyHandler(policies).handle, fetch_timeout_s=0.2
        ),
        Consumer(bus, CONSUMERS["human-interaction-requests"], handler=handler.handle, fetch_timeout_s=0.2),
        Consumer(bus, CONSUMERS["human-interaction-deadlines"], raw_handler=timers.handle, fetch_timeout_s=0.2),
    )


@pytest.fixture
async def both(bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter]) -> AsyncIterator[None]:
    async with running(*_consumers(bus, directory, adapters, wait_deliveries=5)):
        yield


@pytest.mark.usefixtures("both")
async def test_a_forged_request_widening_the_recipients_is_refused(bus: Bus) -> None:
    run_id = new_id("run")
    await _publish_run(bus, run_id, ["user:alice"])
    # the executor's copy claims bob may be asked too: the trigger never said so
    forged = requested(recipient="user:bob", allowed=("user:alice", "user:bob"), run_id=run_id)
    await bus.publish(forged)

    [rejected] = await exactly(bus, "human.rejected")
    payload = rejected.payload(HumanRejected)
    assert payload.request_id == forged.data["request_id"]
    assert payload.reason == "recipient_not_allowed"
    assert await stored(bus, payload.request_id) is None
    assert await events_of(bus, "human.notified") == []


@pytest.mark.usefixtures("both")
async def test_the_projected_policy_replaces_the_copy_escalation_included(bus: Bus) -> None:
    run_id = new_id("run")
    await _publish_run(bus, run_id, ["user:alice"], max_timeout_s=600)
    widened = TimeoutPolicy(action="fail", escalate=Escalate(to="user:bob", after_s=60))
    event = requested(
        recipient="user:alice",
        allowed=("user:alice", "user:bob"),
        run_id=run_id,
        on_timeout=widened,
        expires_in_s=30 * 24 * 3600,  # far beyond the trigger's max_timeout_s
    )
    await bus.publish(event)

    [notified] = await exactly(bus, "human.notified")
    assert notified.payload(HumanNotified).request_id == event.data["request_id"]
    record = await stored(bus, str(event.data["request_id"]))
    assert record is not None
    assert record.policy.allowed_recipients == ["user:alice"]
    assert record.policy.on_timeout.escalate is None  # the forged escalation target is gone
    assert record.expires_at <= event.time + timedelta(seconds=600 + 60)  # capped at the trigger's max_timeout_s


async def _redelivered(bus: Bus, consumer: str, *, within_s: float = 20) -> None:
    """Until ``consumer`` has redelivered a message (it nak'ed one and got it again)."""
    async with asyncio.timeout(within_s):
        while True:
            try:
                if (await bus.js.consumer_info(EVENTS_STREAM.name, consumer)).num_redelivered >= 1:
                    return
            except NotFoundError:  # the runner has not created its durable yet
                pass
            await asyncio.sleep(0.05)


async def test_a_request_before_its_run_policy_waits_for_it(
    bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter]
) -> None:
    policy_consumer, request_consumer, _ = _consumers(bus, directory, adapters, wait_deliveries=7)
    run_id = new_id("run")
    event = requested(recipient="user:alice", run_id=run_id)
    await bus.publish(event)
    await _publish_run(bus, run_id, ["user:alice"])
    async with running(request_consumer):
        # the request is handled first and retried (nak with delay), since no policy is projected yet
        await _redelivered(bus, "human-interaction-requests")
        assert await stored(bus, str(event.data["request_id"])) is None
        async with running(policy_consumer):
            [notified] = await exactly(bus, "human.notified", within_s=40)
    assert notified.payload(HumanNotified).request_id == event.data["request_id"]
    assert await events_of(bus, "human.rejected") == []


async def test_a_request_whose_run_never_came_is_refused_after_the_bound(
    bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter]
) -> None:
    _, request_consumer, _ = _consumers(bus, directory, adapters, wait_deliveries=2)
    event = requested(recipient="user:alice")
    await bus.publish(event)
    async with running(request_consumer):
        [rejected] = await exactly(bus, "human.rejected", within_s=20)
    payload = rejected.payload(HumanRejected)
    assert payload.reason == "recipient_not_allowed"
    assert "no policy for run" in payload.detail
    assert await stored(bus, payload.request_id) is None


async def _settled(bus: Bus, consumer: str, *, within_s: float = 20) -> None:
    """Until ``consumer`` holds no message: every one it was given is acked (none waits for a redelivery)."""
    async with asyncio.timeout(within_s):
        while True:
            info = await bus.js.consumer_info(EVENTS_STREAM.name, consumer)
            if info.num_pending == 0 and info.num_ack_pending == 0 and info.delivered.stream_seq > 0:
                return
            await asyncio.sleep(0.05)


async def _parked(bus: Bus, run_id: str, *, within_s: float = 20) -> None:
    """Until a request is parked under ``run_id``."""
    async with asyncio.timeout(within_s):
        while True:
            if await parked_of_run(bus, run_id):
                return
            await asyncio.sleep(0.05)


async def _unparked(bus: Bus, run_id: str, *, within_s: float = 20) -> None:
    """Until nothing is parked under ``run_id`` any more."""
    async with asyncio.timeout(within_s):
        while True:
            if not await parked_of_run(bus, run_id):
                return
            await asyncio.sleep(0.05)


async def _stop_policies_with_a_backlog(bus: Bus, policy_consumer: Consumer, *runs: str) -> None:
    """The policies consumer ran once (its durable exists), then stops: ``runs``' run.requested wait in its
    backlog, as after an outage."""
    async with running(policy_consumer):
        pass
    for run_id in runs:
        await _publish_run(bus, run_id, ["user:alice"])


async def test_past_the_bound_a_request_is_parked_until_the_projection_catches_up_across_a_restart(
    bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter]
) -> None:
    """After an outage with a backlog of run.requested, the bound alone would refuse requests whose policy is
    still in the backlog: while the policies consumer has messages pending, the request is parked (acked on
    the bus, kept in KV with a durable timer), however long the projection takes -- no delivery count bounds
    it -- and taken in when its policy comes, by whichever replica runs then."""
    policy_consumer, request_consumer, timers_consumer = _consumers(bus, directory, adapters, wait_deliveries=2)
    run_id = new_id("run")
    await _stop_policies_with_a_backlog(bus, policy_consumer, run_id)
    event = requested(recipient="user:alice", run_id=run_id)
    request_id = str(event.data["request_id"])
    await bus.publish(event)
    async with running(request_consumer, timers_consumer):
        await _parked(bus, run_id)  # after its short retries (nak with backoff)
        await _settled(bus, "human-interaction-requests")  # acked: off the consumer's delivery budget
        assert await parked_of_run(bus, run_id) == [request_id]
        assert await stored(bus, request_id) is None  # nobody is asked before the policy says who may be
        assert await events_of(bus, "human.rejected") == []
    # every replica restarts; then the projection catches up: the parked request is taken in
    policy_consumer, request_consumer, timers_consumer = _consumers(bus, directory, adapters, wait_deliveries=2)
    async with running(policy_consumer, request_consumer, timers_consumer):
        [notified] = await exactly(bus, "human.notified", within_s=60)
        await _unparked(bus, run_id)
    assert notified.payload(HumanNotified).request_id == request_id
    assert await events_of(bus, "human.rejected") == []
    assert await stored(bus, request_id) is not None


async def test_a_parked_request_whose_policy_never_comes_is_refused_at_its_deadline(
    bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter]
) -> None:
    """The wait's only bound is the request's own deadline (a short one here): its durable timer refuses it."""
    policy_consumer, request_consumer, timers_consumer = _consumers(bus, directory, adapters, wait_deliveries=2)
    await _stop_policies_with_a_backlog(bus, policy_consumer, new_id("run"))  # another run: the projection lags
    run_id = new_id("run")
    event = requested(recipient="user:alice", run_id=run_id, expires_in_s=4)
    request_id = str(event.data["request_id"])
    await bus.publish(event)
    async with running(request_consumer, timers_consumer):
        [rejected] = await exactly(bus, "human.rejected", within_s=30)
        await _unparked(bus, run_id)
    payload = rejected.payload(HumanRejected)
    assert payload.request_id == request_id
    assert payload.reason == "recipient_not_allowed"
    assert "no policy for run" in payload.detail
    assert rejected.time >= event.time + timedelta(seconds=3)  # at the deadline, not at a delivery bound
    assert await stored(bus, request_id) is None


async def test_a_forged_notification_widening_the_recipients_is_refused(
    bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter]
) -> None:
    policies = RunPolicies(bus)
    run_id = new_id("run")
    await RunPolicyHandler(policies).handle(
        make_event(_run_requested(run_id, ["user:alice"]), source="/temporality/trigger-gateway", run_id=run_id)
    )
    note = HumanNotifyRequested(
        notification_id=new_id("hn"),
        run_id=run_id,
        agent="reviewer",
        title="Review PR 42",
        recipient="user:bob",
        message="Review finished.",
        policy=HumanPolicy(allowed_recipients=["user:alice", "user:bob"]),
        turn=3,
    )
    handler = NotificationHandler(bus, directory, adapters, policies=policies)
    with pytest.raises(PermanentError, match="SEC-1"):
        await handler.handle(make_event(note, source="/temporality/run-executor", run_id=run_id))
    unknown = note.model_copy(update={"run_id": new_id("run")})
    with pytest.raises(PermanentError, match="no policy for run"):
        await handler.handle(make_event(unknown, source="/temporality/run-executor", run_id=unknown.run_id))


async def test_the_first_run_requested_of_a_run_is_the_one_kept(bus: Bus) -> None:
    policies = RunPolicies(bus)
    run_id = new_id("run")
    assert (await policies.record(run_id, HumanPolicy(allowed_recipients=["user:alice"]))).allowed_recipients == [
        "user:alice"
    ]
    again = await policies.record(run_id, HumanPolicy(allowed_recipients=["user:alice", "user:bob"]))
    assert again.allowed_recipients == ["user:alice"]
    relay = f"{run_id}/ask/01"  # relay run ids carry slashes: still one key
    await policies.record(relay, HumanPolicy(allowed_recipients=[]))
    found = await policies.lookup(relay)
    assert found is not None
    assert found.allowed_recipients == []


async def test_projecting_a_run_s_policy_lists_nothing_when_nothing_is_parked(
    bus: Bus, nats_settings: NatsSettings
) -> None:
    """Every ``run.requested`` looks for requests parked under its run, which almost never exist: no watcher is
    made on ``human-channels`` for that (it was a consumer created, read and deleted per run on the pipeline's
    hot path); a parked request still shows (``test_past_the_bound_...`` wakes one)."""
    policies = RunPolicies(bus)
    run_id = new_id("run")
    async with kv_calls(nats_settings.url, BUCKET_HUMAN_CHANNELS.name) as spy:
        await RunPolicyHandler(policies).handle(
            make_event(_run_requested(run_id, ["user:alice"]), source="/temporality/trigger-gateway", run_id=run_id)
        )
        assert (await spy.calls()).listings == []
    assert await parked_of_run(bus, run_id) == []


def _delivery(num_delivered: int) -> Delivery:
    """A delivery as the requests consumer hands it over, ``num_delivered`` times delivered."""
    reply = f"$JS.ACK.{EVENTS_STREAM.name}.human-interaction-requests.{num_delivered}.7.7.1764892800000000000.0"
    return Delivery(Msg(_client=None, subject="temporality.events.human.requested", reply=reply))  # type: ignore[arg-type]


@pytest.mark.parametrize("num_delivered", [1, 2])
async def test_a_policy_stored_as_its_first_request_arrives_is_taken_without_a_retry(
    bus: Bus, num_delivered: int
) -> None:
    """At a request's first delivery the policy is looked for again a few times before the retry (it is usually
    being stored that very moment); a redelivery has waited its backoff already and looks once."""
    policies = RunPolicies(bus)
    run_id = new_id("run")
    policy = HumanPolicy(allowed_recipients=["user:alice"])
    lookups = 0
    lookup = policies.lookup

    async def stored_just_after_the_first_look(run: str) -> HumanPolicy | None:
        nonlocal lookups
        lookups += 1
        found = await lookup(run)
        if lookups == 1:
            await policies.record(run_id, policy)  # the policies consumer, a moment later
        return found

    policies.lookup = stored_just_after_the_first_look  # type: ignore[method-assign]
    if num_delivered == 1:
        assert await policies.get(run_id, _delivery(1)) == policy
        assert lookups == 2
    else:
        with pytest.raises(TransientError):
            await policies.get(run_id, _delivery(num_delivered))
        assert lookups == 1


async def test_a_run_that_may_ask_nobody_costs_no_write_and_its_requests_are_refused_at_once(
    bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay run of agent-collab (or a trigger naming nobody) may ask nobody: its ``run.requested`` stores no
    policy (no write to ``human-channels``), and a question or a notification whose copy allows nobody is refused
    at its first delivery without looking a policy up. One whose copy claims somebody finds no policy and is
    refused as for a run never seen: the missing key never widens whom the run may ask."""
    policies = RunPolicies(bus)
    run_id = f"{new_id('run')}/ask/01"  # relay run ids carry slashes
    sent = count_requests(bus, monkeypatch)
    await RunPolicyHandler(policies).handle(
        make_event(_run_requested(run_id, []), source="/temporality/agent-collab", run_id=run_id)
    )
    assert [s for s, _ in sent if s.startswith(f"$KV.{BUCKET_HUMAN_CHANNELS.name}.")] == []  # no write
    assert await policies.lookup(run_id) is None
    handler = RequestHandler(bus, directory, adapters, policies=policies)
    relayed = requested(recipient="user:alice", allowed=(), run_id=run_id)
    sent.clear()
    await handler.handle(relayed, None)
    [rejected] = await exactly(bus, "human.rejected")
    assert rejected.payload(HumanRejected).reason == "recipient_not_allowed"
    assert rejected.data["request_id"] == relayed.data["request_id"]
    assert [k for s, p in sent if (k := kv_read_key(s, p, BUCKET_HUMAN_CHANNELS.name)) is not None] == []
    assert await stored(bus, str(relayed.data["request_id"])) is None
    note = HumanNotifyRequested(
        notification_id=new_id("hn"),
        run_id=run_id,
        agent="reviewer",
        title="Relay",
        recipient="user:alice",
        message="Done.",
        policy=HumanPolicy(allowed_recipients=[]),
        turn=1,
    )
    notifications = NotificationHandler(bus, directory, adapters, policies=policies)
    with pytest.raises(PermanentError, match="allows no recipient"):
        await notifications.handle(make_event(note, source="/temporality/run-executor", run_id=run_id))
    forged = requested(recipient="user:alice", allowed=("user:alice",), run_id=run_id)  # claims alice
    await handler.handle(forged, None)  # no delivery to retry: the policy unknown is final
    refused = [e for e in await events_of(bus, "human.rejected") if e.data["request_id"] == forged.data["request_id"]]
    assert [e.payload(HumanRejected).reason for e in refused] == ["recipient_not_allowed"]
    assert await stored(bus, str(forged.data["request_id"])) is None
    assert await events_of(bus, "human.notified") == []
