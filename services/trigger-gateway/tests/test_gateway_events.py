"""Event triggers (TRG-2/5/6): runs started by the system's own events. Real nats-server; the gateways are
the real ``configure`` + ``run_until`` in-process (``gateway_support.replicas``); events are published on
the bus as the other services publish them."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import nats.errors
import pytest
import structlog
from gateway_support import AGENTS, AS_ADMIN, AS_OPERATOR, AS_VIEWER, eventually, replicas
from nats.js.kv import KeyValue

from temporality_bus import Bus, Consumer, Delivery, Outcome, TransientError
from temporality_protocol import (
    CONTENT_TYPE,
    Envelope,
    RunCompleted,
    RunRequested,
    TriggerRejected,
    decode,
    derive_id,
    encode,
    make_event,
)
from temporality_protocol.catalog import CONSUMERS, DEAD_LETTERED, DLQ_STREAM, EVENTS_STREAM, subject_for
from temporality_service import ApiAuth
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays
from temporality_trigger_gateway import Settings, create_app
from temporality_trigger_gateway.events import SYNC_DELIVERIES, EventTriggers, normalize
from temporality_trigger_gateway.launch import Launcher
from temporality_trigger_gateway.store import TriggerRecord, TriggerRegistry, TriggerStore, validate_spec
from temporality_trigger_gateway.triggers import EventTrigger

DURABLE = "trigger-gateway-events"


def _spec(trigger_id: str = "after-review", **changes: Any) -> dict[str, Any]:
    """An event trigger: when a reviewer run completes, a triager run gets its result."""
    spec: dict[str, Any] = {
        "id": trigger_id,
        "name": "Triage what the reviewer found",
        "type": "event",
        "event_type": "run.completed",
        "filter": {"actor_type": "agent", "actor_id": "reviewer", "project": "fabrikam"},
        "agent": "triager",
        "input": {"reviewed_run": "metadata.run_id", "result": "payload.result", "turns": "payload.turns"},
        "prompt": "Triage the findings of ${reviewed_run}: ${result}",
        "human": {"allowed_recipients": ["user:alice"]},
    }
    spec.update(changes)
    return spec


def _completed(run_id: str, agent: str = "reviewer", tenant: str | None = "fabrikam") -> Envelope:
    """``run.completed`` as the run-executor publishes it."""
    return make_event(
        RunCompleted(run_id=run_id, result=f"findings of {run_id}", turns=3),
        source="/temporality/run-executor",
        id=derive_id("evt", run_id, "run.completed"),
        run_id=run_id,
        correlation_id=f"saga-{run_id}",
        actor=f"agent:{agent}",
        tenant=tenant,
    )


def _runs(log: EventLog, trigger_id: str) -> list[RunRequested]:
    return [
        e.payload(RunRequested)
        for e in log.of_type("run.requested")
        if e.data["launch"].get("trigger_id") == trigger_id
    ]


async def _run_for(log: EventLog, trigger_id: str, source: Envelope) -> RunRequested:
    return await _run_for_within(log, trigger_id, source, timeout_s=10)


async def _run_for_within(log: EventLog, trigger_id: str, source: Envelope, *, timeout_s: float) -> RunRequested:
    (found,) = await log.wait_for(
        "run.requested",
        where=lambda e: (
            e.data["launch"].get("trigger_id") == trigger_id and (e.data.get("event") or {}).get("id") == source.id
        ),
        timeout_s=timeout_s,
    )
    run: RunRequested = found.payload(RunRequested)
    return run


async def _create(client: Any, spec: dict[str, Any]) -> None:
    created = await client.post("/triggers", json=spec, headers=AS_ADMIN)
    assert created.status_code == 201, created.text


# --------------------------------------------------------------------------- pure
def _trigger(**changes: Any) -> EventTrigger:
    trigger = validate_spec(_spec(**changes), environ={}, agents=AGENTS)
    assert isinstance(trigger, EventTrigger)
    return trigger


def test_the_filter_matches_exactly_and_compares_numbers_in_string_form() -> None:
    event = normalize(_completed("run-1"))
    assert event.actor is not None
    assert (event.actor.type, event.actor.id) == ("agent", "reviewer")
    assert event.metadata["run_id"] == "run-1"
    assert _trigger().matches(event)
    assert _trigger(filter={"data.turns": 3}).matches(event)
    assert _trigger(filter={"data.turns": "3"}).matches(event)
    assert not _trigger(filter={"data.turns": "4"}).matches(event)
    assert not _trigger().matches(normalize(_completed("run-1", agent="triager")))
    assert not _trigger().matches(normalize(_completed("run-1", tenant=None)))
    assert _trigger(filter={}).matches(normalize(_completed("run-1", agent="x", tenant=None)))  # empty: every event


async def test_an_invalid_event_trigger_is_refused_naming_the_field(gateway_settings: Settings) -> None:
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"event_type": "run.exploded"}, "event_type", "unknown event type"),
        ({"event_type": "run.tool_called"}, "event_type", "unknown event type"),  # not one a trigger may listen to
        ({"event_type": ["run.failed", "run.failed"]}, "event_type", "twice"),
        ({"filter": {"colour": "red"}}, "filter", "unknown filter key(s) colour"),
        ({"filter": {"data.reason": "x"}}, "filter", "run.completed events have no field 'reason'"),
        ({"filter": {"data.": "x"}}, "filter", "data.<field>"),
        ({"input": {"r": "payload.[["}}, "input", "not a valid JMESPath expression"),
        ({"prompt": "${nope}"}, "prompt", "the template uses nope"),
        # no mapping: the input is the event's data, so a field no listed type has stays "${payload}" in the prompt
        ({"input": None, "prompt": "follow up ${payload}"}, "prompt", "the template uses payload"),
        ({"input": None, "prompt": "${reason}"}, "prompt", "without an input mapping the input is the event's data"),
        ({"input": None, "event_type": ["run.completed", "run.failed"], "prompt": "${result}"}, "prompt", "result"),
        ({"adapter": "github"}, "adapter", "unknown key 'adapter'; allowed here: agent, allow_self, concurrency"),
    ]
    async with replicas(gateway_settings, 1) as (a,):
        for changes, field, message in cases:
            answer = await a.post("/triggers", json=_spec(**changes), headers=AS_ADMIN)
            assert answer.status_code == 422, (changes, answer.text)
            body = answer.json()
            assert body["error"] == "invalid_trigger"
            assert any(e["field"] == field and message in e["message"] for e in body["errors"]), (changes, body)


def test_without_a_mapping_the_prompt_may_use_the_fields_every_listed_type_has() -> None:
    environ: dict[str, str] = {}
    ok = validate_spec(
        _spec(input=None, prompt="Why did ${run_id} end? ${context}", context={"team": "a"}),
        environ=environ,
        agents=None,
    )
    assert isinstance(ok, EventTrigger)
    both = _spec(input=None, event_type=["run.completed", "run.failed"], prompt="Look at ${run_id}")
    assert isinstance(validate_spec(both, environ=environ, agents=None), EventTrigger)
    # a record stored before the check is still served (its runs' prompt keeps the unknown field as written)
    stored = validate_spec(_spec(input=None, prompt="follow up ${payload}"), environ=environ, agents=None, stored=True)
    assert isinstance(stored, EventTrigger)


async def test_a_matching_event_starts_one_run_with_the_mapped_input_across_two_replicas(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 2) as (a, b):
        await _create(a, _spec())
        await _create(
            b, _spec("all-failures", event_type=["run.failed", "run.cancelled"], filter={}, input=None, prompt=None)
        )
        first, other_agent, second = _completed("run-r1"), _completed("run-t1", agent="triager"), _completed("run-r2")
        for event in (first, other_agent, second):
            await bus.publish(event)
        await bus.publish_raw(  # the same event again, past JetStream's duplicate window (another Nats-Msg-Id)
            first.nats_subject, encode(first), {"Nats-Msg-Id": first.id + "-again", "Content-Type": CONTENT_TYPE}
        )
        run = await _run_for(event_log, "after-review", first)
        await _run_for(event_log, "after-review", second)
        assert run.agent == "triager"
        assert run.launch.kind == "event"
        assert run.launch.trigger_id == "after-review"
        assert run.launch.depth == 1
        assert run.input == {
            "reviewed_run": "run-r1",
            "result": "findings of run-r1",
            "turns": 3,
            "prompt": "Triage the findings of run-r1: findings of run-r1",
        }
        assert run.event is not None
        assert run.event.payload["result"] == "findings of run-r1"
        assert run.human.allowed_recipients == ["user:alice"]
        requested = next(e for e in event_log.of_type("run.requested") if e.runid == run.run_id)
        assert requested.correlationid == "saga-run-r1"  # the run joins the saga of the event that fired it
        (received,) = [
            e for e in event_log.of_type("trigger.received") if e.data["delivery_id"] == run.launch.delivery_id
        ]
        assert received.data["adapter"] == "event"
        assert received.causationid == first.id

        async def settled() -> bool:
            info = await bus.js.consumer_info(EVENTS_STREAM.name, DURABLE)
            return bool(info.num_pending == 0 and info.num_ack_pending == 0)

        await eventually(settled, timeout_s=10, what="every event handled")
        await event_log.caught_up()

        def once_each() -> bool:
            runs = _runs(event_log, "after-review")
            return sorted(r.run_id for r in runs) == sorted({r.run_id for r in runs}) and len(runs) == 2

        await stays(once_each, settle_s=0.5, what="one run per matching event, none for the triager's")
        assert not _runs(event_log, "all-failures")  # it listens to other event types
        assert len(event_log.of_type("trigger.accepted")) == 2
        # a copy of an event is the same delivery, not a duplicate; the triager's completion is filtered out
        # by the subscription's condition: nothing journaled for it
        assert not event_log.of_type("trigger.rejected")
        assert not [e for e in event_log.of_type("trigger.received") if e.data.get("source_event_id") == other_agent.id]

        # a trigger created through one replica reacts at once, whichever replica gets the event
        for n in range(4):
            await _create((a, b)[n % 2], _spec(f"just-made-{n}", filter={"data.run_id": f"run-new-{n}"}))
            fresh = _completed(f"run-new-{n}")
            await bus.publish(fresh)
            await _run_for(event_log, f"just-made-{n}", fresh)


@contextlib.asynccontextmanager
async def _admin_only(settings: Settings, bus: Bus) -> AsyncIterator[httpx.AsyncClient]:
    """The admin API without the event consumer: what it stores while no gateway handles events."""
    store = await TriggerStore.open(bus)
    registry = TriggerRegistry(environ={}, agents=AGENTS)
    async with registry.watching(store):
        app = create_app(settings, bus, registry, store=store, auth=ApiAuth.from_settings(settings.api))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as c:
            yield c


async def test_events_before_the_trigger_existed_or_while_it_was_disabled_start_nothing(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    await bus.ensure_consumer(CONSUMERS[DURABLE])  # as a gateway's first start: what follows is its backlog
    before = _completed("run-before")
    await bus.publish(before)  # in the backlog, stored before the trigger exists
    async with _admin_only(gateway_settings, bus) as admin:
        await _create(admin, _spec())
    async with replicas(gateway_settings, 1) as (a,):
        after = _completed("run-after")
        await bus.publish(after)
        await _run_for(event_log, "after-review", after)  # handled in stream order: the backlog before it
        assert (await a.post("/triggers/after-review/disable", headers=AS_OPERATOR)).status_code == 200
    while_disabled = _completed("run-disabled")
    await bus.publish(while_disabled)  # in the backlog again, stored while the trigger is disabled
    async with _admin_only(gateway_settings, bus) as admin:
        assert (await admin.post("/triggers/after-review/enable", headers=AS_OPERATOR)).status_code == 200
    async with replicas(gateway_settings, 1):
        enabled_again = _completed("run-enabled")
        await bus.publish(enabled_again)
        await _run_for(event_log, "after-review", enabled_again)
        seen = {r.event.id for r in _runs(event_log, "after-review") if r.event is not None}
        assert seen == {after.id, enabled_again.id}
        await stays(lambda: len(_runs(event_log, "after-review")) == 2, settle_s=0.5, what="no replayed history")
        assert not event_log.of_type("trigger.rejected")  # skipped, not refused: nothing journaled for them


async def test_a_seeded_trigger_and_a_record_without_an_activation_skip_the_backlog_before_them(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    await bus.ensure_consumer(CONSUMERS[DURABLE])  # as a gateway's first start: what follows is its backlog
    backlog = _completed("run-backlog")
    await bus.publish(backlog)
    text = gateway_settings.triggers_file.read_text(encoding="utf-8")
    seeded = "\n".join(
        [
            "  - id: seeded-events",
            "    name: Seeded from the file",
            "    type: event",
            "    event_type: run.completed",
            "    agent: triager",
        ]
    )
    gateway_settings.triggers_file.write_text(text.rstrip("\n") + "\n" + seeded + "\n", encoding="utf-8")
    store = await TriggerStore.open(bus)  # a record an older gateway wrote: no active_from_seq (its time counts)
    await store.store.create(
        "legacy-events",
        TriggerRecord(
            spec=_spec("legacy-events", filter={}), origin="api", updated_by="old", updated_at=datetime.now(UTC)
        ),
    )
    async with replicas(gateway_settings, 1):
        after = _completed("run-after-start")
        await bus.publish(after)
        await _run_for(event_log, "seeded-events", after)
        await _run_for(event_log, "legacy-events", after)  # handled in stream order: the backlog before it
        assert {r.event.id for r in _runs(event_log, "seeded-events") if r.event is not None} == {after.id}
        assert {r.event.id for r in _runs(event_log, "legacy-events") if r.event is not None} == {after.id}


async def test_the_loop_limit_refuses_an_event_of_a_run_the_trigger_started(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 1) as (a,):
        # a reviewer run whose completion starts a reviewer run: would loop forever without the limit
        await _create(a, _spec("review-again", agent="reviewer", filter={}, input=None, prompt=None))
        # and a trigger on refusals, which must not react to the loop refusal (nor to its own refusals)
        await _create(a, _spec("on-refusal", event_type="trigger.rejected", filter={}, input=None, prompt=None))
        webhook_refusal = make_event(
            TriggerRejected(trigger_id="ado-pr", delivery_id="dlv-1", reason="duplicate", detail="seen"),
            source="/temporality/trigger-gateway",
            id="evt-webhook-refusal",
        )
        await bus.publish(webhook_refusal)
        assert (await _run_for(event_log, "on-refusal", webhook_refusal)).launch.depth == 1
        webhook_run = _completed("run-from-webhook")
        await bus.publish(webhook_run)
        first = await _run_for(event_log, "review-again", webhook_run)
        assert first.launch.depth == 1
        await bus.publish(_completed(first.run_id))  # that run completes (its events carry its run id)
        (rejected,) = await event_log.wait_for(
            "trigger.rejected",
            where=lambda e: e.source == "/temporality/trigger-gateway" and e.id != webhook_refusal.id,
        )
        assert rejected.data["reason"] == "loop_limit"
        assert rejected.data["trigger_id"] == "review-again"
        assert rejected.data["depth"] == 2
        assert "itself" in rejected.data["detail"]

        async def settled() -> bool:
            info = await bus.js.consumer_info(EVENTS_STREAM.name, DURABLE)
            return bool(info.num_pending == 0 and info.num_ack_pending == 0)

        await eventually(settled, timeout_s=10, what="every event handled")
        await event_log.caught_up()

        def one_run_each() -> bool:
            return len(_runs(event_log, "review-again")) == 1 and len(_runs(event_log, "on-refusal")) == 1

        await stays(one_run_each, settle_s=0.5, what="no second run, no run for the loop refusal")
        assert len(event_log.of_type("trigger.rejected")) == 2  # the webhook's and the loop refusal: no more


async def test_a_failing_expression_of_an_event_trigger_is_recorded_mapping_failed_and_redriven_once_fixed(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    """The trigger's own expression (``input``, ``when``) failing on a valid event: the trigger is at fault, as
    for a webhook's -- recorded ``mapping_failed`` with its event kept, journaled ``trigger.rejected``
    (``invalid_payload``) with a ``mapping_failed:`` detail naming the expression, re-drivable once fixed."""
    async with replicas(gateway_settings, 1) as (a,):
        broken_input = {"reviewed_run": "metadata.run_id", "n": "length(payload.turns)"}  # turns is a number
        await _create(a, _spec("broken-input", input=broken_input, prompt=None))
        await _create(a, _spec("broken-when", when="contains(payload.turns, 'x')", input=None, prompt=None))
        event = _completed("run-m1")
        await bus.publish(event)

        rejections: dict[str, TriggerRejected] = {}
        for trigger_id in ("broken-input", "broken-when"):
            (found,) = await event_log.wait_for(
                "trigger.rejected", where=lambda e, t=trigger_id: e.data["trigger_id"] == t, timeout_s=10
            )
            rejections[trigger_id] = found.payload(TriggerRejected)
        for trigger_id, where in (("broken-input", "input.n"), ("broken-when", "when")):
            rejected = rejections[trigger_id]
            assert rejected.reason == "invalid_payload"  # the protocol's reason
            assert rejected.detail.startswith(f"mapping_failed: the trigger's {where} expression failed"), rejected
            assert rejected.source_event_id == event.id

            async def recorded(t: str = trigger_id) -> dict[str, Any] | None:
                listed = await a.get(f"/triggers/{t}/deliveries", headers=AS_VIEWER)
                assert listed.status_code == 200, listed.text
                rows: list[dict[str, Any]] = listed.json()["deliveries"]
                return rows[0] if rows else None

            row = await eventually(recorded, what=f"{trigger_id}'s delivery recorded")
            assert (row["state"], row["reason"]) == ("rejected", "mapping_failed")
            assert row["detail"] == rejected.detail
            assert row["has_event"] is True
            assert row["source_event_id"] == event.id
        assert not _runs(event_log, "broken-input")

        # fixed, the kept event is re-driven through the launch path: the run the event would have started
        current = await a.get("/triggers/broken-input", headers=AS_VIEWER)
        fixed = await a.put(
            "/triggers/broken-input",
            json=_spec("broken-input", input={"reviewed_run": "metadata.run_id", "n": "payload.turns"}, prompt=None),
            headers={**AS_ADMIN, "If-Match": current.headers["ETag"]},
        )
        assert fixed.status_code == 200, fixed.text
        delivery_id = rejections["broken-input"].delivery_id

        async def redriven() -> httpx.Response | None:
            again = await a.post(f"/triggers/broken-input/deliveries/{delivery_id}/redrive", headers=AS_OPERATOR)
            return again if again.status_code == 202 else None

        await eventually(redriven, what="the re-drive accepted once the trigger serves its fix")
        run = await _run_for(event_log, "broken-input", event)
        assert run.input["n"] == 3
        assert run.launch.depth == 1


async def test_a_longer_chain_is_allowed_up_to_the_configured_depth(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    settings = gateway_settings.model_copy(update={"event_max_depth": 2})
    async with replicas(settings, 1) as (a,):
        await _create(a, _spec("chain", agent="reviewer", filter={}, input=None, prompt=None, allow_self=True))
        source = _completed("run-root")
        await bus.publish(source)
        depths = []
        for _ in range(2):
            run = await _run_for(event_log, "chain", source)
            depths.append(run.launch.depth)
            source = _completed(run.run_id)
            await bus.publish(source)
        assert depths == [1, 2]
        (rejected,) = await event_log.wait_for("trigger.rejected", timeout_s=10)
        assert rejected.data["reason"] == "loop_limit"
        assert "past the maximum 2" in rejected.data["detail"]
        assert rejected.data["source_event_id"] == source.id
        assert rejected.data["depth"] == 3
        await event_log.caught_up()
        await stays(lambda: len(_runs(event_log, "chain")) == 2, settle_s=0.5, what="the chain stopped at depth 2")


async def test_a_redelivery_after_a_crash_starts_no_second_run(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    nats = gateway_settings.nats.model_copy(update={"ack_wait_s": 1.0})  # the redelivery comes sooner
    gateway_settings = gateway_settings.model_copy(update={"nats": nats})
    async with replicas(gateway_settings, 1) as (a,):
        await _create(a, _spec())
    event = _completed("run-crash")
    await bus.publish(event)
    # a gateway that handled the event and died before acknowledging it: the durable still owes it
    store = await TriggerStore.open(bus)
    registry = TriggerRegistry(environ={}, agents=AGENTS)
    sub = await bus.js.pull_subscribe_bind(durable=DURABLE, stream=EVENTS_STREAM.name)
    try:
        (msg,) = await sub.fetch(batch=1, timeout=5)
        async with registry.watching(store):
            await EventTriggers(registry, Launcher(bus, retry_after_s=1)).handle(decode(msg.data), Delivery(msg))
    finally:
        await sub.unsubscribe()
    await _run_for(event_log, "after-review", event)
    async with replicas(gateway_settings, 1):  # the restart: the message is redelivered after ack_wait (1 s)

        async def redelivered_and_acked() -> bool:
            info = await bus.js.consumer_info(EVENTS_STREAM.name, DURABLE)
            return bool(info.num_redelivered == 0 and info.num_ack_pending == 0 and info.num_pending == 0)

        await eventually(redelivered_and_acked, timeout_s=15, what="the redelivery handled")
        await event_log.caught_up()
        assert len(_runs(event_log, "after-review")) == 1
        assert len(event_log.of_type("trigger.accepted")) == 1  # the same derived ids: JetStream deduped them
        assert not event_log.of_type("trigger.rejected")  # the claim knew the delivery as its own: no "duplicate"


async def test_a_replica_behind_the_trigger_store_has_the_event_redelivered_instead_of_missing_a_new_trigger(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    """A trigger created just before the event, which this replica's watch has not applied yet: the event is
    not handled with the triggers the replica knows (its launch would be missed for good once acknowledged)
    but refused as transient (the consumer redelivers it with backoff); once the watch caught up, the
    redelivery launches. Only the SYNC_DELIVERIES-th delivery is handled with what is known."""
    await bus.ensure_consumer(CONSUMERS[DURABLE])
    async with _admin_only(gateway_settings, bus) as admin:
        await _create(admin, _spec())
    event = _completed("run-lagging")
    await bus.publish(event)
    store = await TriggerStore.open(bus)
    registry = TriggerRegistry(environ={}, agents=AGENTS)  # not watching yet: behind the store
    handler = EventTriggers(registry, Launcher(bus, retry_after_s=1), store=store, store_wait_s=0.2)
    sub = await bus.js.pull_subscribe_bind(durable=DURABLE, stream=EVENTS_STREAM.name)
    try:
        (msg,) = await sub.fetch(batch=1, timeout=5)
        delivery = Delivery(msg)
        assert delivery.num_delivered == 1
        with pytest.raises(TransientError, match="redelivered"):
            await handler.handle(decode(msg.data), delivery)
        delivery.num_delivered = SYNC_DELIVERIES  # the last lagging delivery: handled with the triggers known
        await handler.handle(decode(msg.data), delivery)  # (none: nothing to launch, nothing raised)
        delivery.num_delivered = 2
        async with registry.watching(store):  # caught up: the redelivery launches
            await handler.handle(decode(msg.data), delivery)
        await msg.ack()
    finally:
        await sub.unsubscribe()
    run = await _run_for(event_log, "after-review", event)
    assert run.launch.kind == "event"
    await event_log.caught_up()
    assert len(_runs(event_log, "after-review")) == 1


class _PositionUnreadable(TriggerStore):
    """The trigger store whose position (its stream's info) cannot be read: JetStream's API times out."""

    async def last_revision(self) -> int:
        raise nats.errors.TimeoutError


async def test_a_store_whose_position_cannot_be_read_delays_an_event_but_never_holds_it_forever(
    bus: Bus, event_log: EventLog
) -> None:
    """Its first deliveries are refused as transient (redelivered); the SYNC_DELIVERIES-th is handled with the
    triggers known (a run's end must still release its concurrency key): never dead-lettered for it."""
    await bus.ensure_consumer(CONSUMERS[DURABLE])
    event = _completed("run-unreadable")
    await bus.publish(event)
    store = await TriggerStore.open(bus)
    registry = TriggerRegistry(environ={}, agents=AGENTS)
    handler = EventTriggers(
        registry, Launcher(bus, retry_after_s=1), store=_PositionUnreadable(store.store, store.kv, store.bus)
    )
    sub = await bus.js.pull_subscribe_bind(durable=DURABLE, stream=EVENTS_STREAM.name)
    try:
        (msg,) = await sub.fetch(batch=1, timeout=5)
        delivery = Delivery(msg)
        with pytest.raises(TransientError, match="position cannot be read"):  # the consumer naks it (backoff)
            await handler.handle(decode(msg.data), delivery)
        delivery.num_delivered = SYNC_DELIVERIES
        await handler.handle(decode(msg.data), delivery)  # handled (nothing to launch): no error
        await msg.ack()
    finally:
        await sub.unsubscribe()


class _HeldWatch(TriggerRegistry):
    """A replica's registry whose store watch hangs while applying one key's change (as a slow or stalled watch
    does): that change and every later one stay unapplied here until :attr:`release` is set."""

    def __init__(self, held_key: str) -> None:
        super().__init__(environ={}, agents=AGENTS)
        self._held_key = held_key
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        #: The timeout of every wait for the store a delivery made (the handler's choice, not the clock's).
        self.waits: list[float] = []

    async def wait_for_store(self, revision: int, timeout_s: float = 2.0) -> bool:
        self.waits.append(timeout_s)
        return await super().wait_for_store(revision, timeout_s)

    async def _apply_entry(self, entry: KeyValue.Entry) -> None:
        if entry.key == self._held_key:
            self.holding.set()
            await self.release.wait()
        await super()._apply_entry(entry)


class _Outcomes:
    """The consumer's own account of each message it settled (its ``ConsumerObserver``)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def settled(self, durable: str, outcome: Outcome, seconds: float, count: int = 1) -> None:
        self.seen.extend([outcome] * count)


ACK_WAIT_S = 10.0


@contextlib.asynccontextmanager
async def _consuming(
    bus: Bus, handler: EventTriggers, deliveries: list[tuple[int, float]], outcomes: _Outcomes
) -> AsyncIterator[Consumer]:
    """The events durable run by a real :class:`Consumer` (its backoff, max_deliver, dead-lettering), as the
    gateway runs it; ``deliveries`` gets (delivery number, seconds the handler took) of every delivery."""
    loop = asyncio.get_running_loop()

    async def handle(envelope: Envelope, delivery: Delivery) -> None:
        started = loop.time()
        try:
            await handler.handle(envelope, delivery)
        finally:
            deliveries.append((delivery.num_delivered, loop.time() - started))

    # ack_wait 10 s (the fixture's is 2 s): the first delivery holds the message for the 2 s wait, and on a loaded
    # machine a stalled heartbeat must not bring an extra delivery into the count
    consumer = Consumer(bus, CONSUMERS[DURABLE], handler=handle, observer=outcomes, ack_wait_s=ACK_WAIT_S)
    stop = asyncio.Event()
    running = asyncio.create_task(consumer.run(stop))
    try:
        async with asyncio.timeout(10):
            await consumer.running.wait()
        yield consumer
    finally:
        stop.set()
        await running


async def _handled_once(bus: Bus, event_log: EventLog, event: Envelope, outcomes: _Outcomes) -> None:
    """The event ran exactly once through the fallback: one run, acknowledged, nothing dead-lettered."""

    async def settled() -> bool:
        info = await bus.js.consumer_info(EVENTS_STREAM.name, DURABLE)
        return bool(info.num_pending == 0 and info.num_ack_pending == 0 and info.num_redelivered == 0)

    await eventually(settled, timeout_s=10, what="the event acknowledged")
    await event_log.caught_up()
    await stays(lambda: len(_runs(event_log, "after-review")) == 1, settle_s=0.5, what="one run for the event")
    (received,) = event_log.of_type("trigger.received")
    assert received.data["source_event_id"] == event.id
    assert len(event_log.of_type("trigger.accepted")) == 1
    assert not event_log.of_type("trigger.rejected")
    assert not event_log.of_type(DEAD_LETTERED)
    assert (await bus.js.stream_info(DLQ_STREAM.name)).state.messages == 0
    assert outcomes.seen == ["retried"] * (SYNC_DELIVERIES - 1) + ["acked"]


async def test_through_the_consumer_a_lagging_store_redelivers_the_event_until_its_last_lagging_delivery_runs_it(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    """The lag of the unit tests above, driven by a real :class:`Consumer` on the real server: the watch of this
    replica hangs on a trigger another replica just created, so every delivery of the event finds the store
    ahead. The first delivery waits the full 2 s for it, the redeliveries (after the consumer's backoff)
    0.1 s each, and the SYNC_DELIVERIES-th handles it with the triggers known: one run, acknowledged, never
    dead-lettered, and nothing more once the watch catches up."""
    await bus.ensure_consumer(CONSUMERS[DURABLE], ack_wait_s=ACK_WAIT_S)
    async with _admin_only(gateway_settings, bus) as admin:
        await _create(admin, _spec())
    store = await TriggerStore.open(bus)
    registry = _HeldWatch("just-created")
    deliveries: list[tuple[int, float]] = []
    outcomes = _Outcomes()
    async with registry.watching(store):
        assert registry.get("after-review") is not None
        async with _admin_only(gateway_settings, bus) as admin:  # another replica: this one's watch hangs on it
            await _create(admin, _spec("just-created", event_type="run.failed", filter={}, input=None, prompt=None))
        async with asyncio.timeout(10):
            await registry.holding.wait()  # the watch hangs on it
        assert registry.applied < await store.last_revision()
        event = _completed("run-lagging")
        await bus.publish(event)
        handler = EventTriggers(registry, Launcher(bus, retry_after_s=1), store=store)  # the gateway's 2 s wait
        async with _consuming(bus, handler, deliveries, outcomes):
            await _run_for_within(event_log, "after-review", event, timeout_s=30)
            await _handled_once(bus, event_log, event, outcomes)
            waits = list(registry.waits)  # the handler's (the test's own wait follows)
            registry.release.set()
            assert await registry.wait_for_store(await store.last_revision(), timeout_s=10)
            await stays(lambda: len(deliveries) == SYNC_DELIVERIES, settle_s=1.0, what="no further delivery")
    assert [n for n, _ in deliveries] == list(range(1, SYNC_DELIVERIES + 1))
    # the first delivery waited the full 2 s for the watch, every redelivery only checked briefly
    assert waits == [2.0] + [0.1] * (SYNC_DELIVERIES - 1), waits
    assert deliveries[0][1] >= 1.9  # and that first wait really ran out (an asyncio timeout only runs long)
    assert len(_runs(event_log, "after-review")) == 1


async def test_through_the_consumer_an_unreadable_store_position_falls_back_at_the_last_lagging_delivery(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    """The trigger store's position cannot be read (its connection is gone: a TransientError at each delivery):
    the real consumer redelivers the event with its backoff, and the SYNC_DELIVERIES-th delivery handles it with
    the triggers known -- one run, acknowledged, never dead-lettered. Each retry is logged without a traceback
    (``handler.retry``), the store's failure with its cause (``launch.bus_unavailable``)."""
    await bus.ensure_consumer(CONSUMERS[DURABLE], ack_wait_s=ACK_WAIT_S)
    async with _admin_only(gateway_settings, bus) as admin:
        await _create(admin, _spec())
    store = await TriggerStore.open(bus)
    async with Bus.connect(gateway_settings.nats, name="test-gone") as gone:
        unreadable = await TriggerStore.open(gone)
    with pytest.raises(nats.errors.Error):
        await unreadable.last_revision()
    registry = TriggerRegistry(environ={}, agents=AGENTS)
    deliveries: list[tuple[int, float]] = []
    outcomes = _Outcomes()
    async with registry.watching(store):
        assert registry.get("after-review") is not None
        event = _completed("run-unreadable-store")
        await bus.publish(event)
        handler = EventTriggers(registry, Launcher(bus, retry_after_s=1), store=unreadable)
        with structlog.testing.capture_logs() as logs:
            async with _consuming(bus, handler, deliveries, outcomes):
                await _run_for_within(event_log, "after-review", event, timeout_s=30)
                await _handled_once(bus, event_log, event, outcomes)
                await stays(lambda: len(deliveries) == SYNC_DELIVERIES, settle_s=1.0, what="no further delivery")
    assert [n for n, _ in deliveries] == list(range(1, SYNC_DELIVERIES + 1))
    retries = [e for e in logs if e["event"] == "handler.retry"]
    assert len(retries) == SYNC_DELIVERIES - 1, retries
    for retry in retries:
        assert retry["error"].startswith("TransientError("), retry
        assert "position cannot be read" in retry["error"], retry
        assert retry["exc_info"] is False  # a TransientError: no traceback per retry
    unavailable = [e for e in logs if e["event"] == "launch.bus_unavailable"]
    assert len(unavailable) >= SYNC_DELIVERIES - 1, unavailable
    assert all(e["error"] for e in unavailable)  # the cause: the store connection's error
    assert "Error" in unavailable[0]["error"], unavailable[0]


def test_the_lagging_fallback_comes_before_the_consumer_dead_letters() -> None:
    """A lagging replica handles an event with the triggers it knows at its SYNC_DELIVERIES-th delivery: the
    events consumer must deliver it that often before dead-lettering it (max_deliver)."""
    spec = CONSUMERS[DURABLE]
    assert spec.max_deliver <= 0 or SYNC_DELIVERIES < spec.max_deliver


async def test_the_preview_shows_what_an_event_trigger_makes_of_a_sample_event(gateway_settings: Settings) -> None:
    sample = json.loads(encode(_completed("run-sample")))
    async with replicas(gateway_settings, 1) as (a,):

        async def preview(**changes: Any) -> dict[str, Any]:
            body = {"trigger": _spec(), "payload": sample} | changes
            answer = await a.post("/triggers/preview", json=body, headers=AS_VIEWER)
            assert answer.status_code == 200, answer.text
            result: dict[str, Any] = answer.json()
            return result

        shown = await preview()
        assert shown["ok"]
        assert shown["would_start_run"]
        assert shown["input"]["reviewed_run"] == "run-sample"
        assert shown["input"]["turns"] == 3
        assert shown["source_event"] == {"id": derive_id("evt", "run-sample", "run.completed"), "type": "run.completed"}
        filtered = await preview(trigger=_spec(filter={"actor_id": "triager"}))
        assert filtered["would_start_run"] is False
        assert filtered["ignored"]["reason"] == "filtered"
        other = await preview(trigger=_spec(event_type="run.failed", filter={}))
        assert other["ignored"]["reason"] == "unsupported_event"
        broken = await preview(payload={"id": "x", "type": "run.completed"})
        assert broken["ok"] is False
        assert broken["stage"] == "payload"
        assert {e["field"] for e in broken["errors"]} >= {"source", "time", "data"}


@pytest.mark.parametrize("event_type", ["run.completed", "trigger.rejected"])
def test_the_consumer_listens_to_what_a_trigger_may_name(event_type: str) -> None:
    assert subject_for(event_type) in CONSUMERS[DURABLE].filter_subjects
    assert CONSUMERS[DURABLE].deliver_policy == "new"
