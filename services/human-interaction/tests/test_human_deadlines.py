"""Deadlines (HUM-8): real JetStream message schedules fire, pending requests expire with their policy."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from human_support import (
    ALICE,
    events_of,
    exactly,
    lose_answer_publish,
    requested,
    stored,
    timer_messages,
    wait_for_record,
)

from temporality_bus import Bus, PermanentError
from temporality_human_interaction.deadlines import DeadlineHandler
from temporality_human_interaction.records import HumanRequestRecord, open_store
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import (
    BusDeadLettered,
    HumanAnswered,
    HumanExpired,
    HumanRequested,
    HumanRequestState,
    OptionAnswer,
    TimeoutPolicy,
    derive_id,
)
from temporality_protocol.catalog import TIMER_SCHEDULE_HUMAN


def _fired(request_id: str) -> bytes:
    return json.dumps({"request_id": request_id}).encode()


def _after_every_deadline() -> datetime:
    """A clock past the requests' ``expires_at`` (an hour away), for a handler called directly."""
    return datetime.now(UTC) + timedelta(hours=2)


@pytest.mark.usefixtures("consumers")
async def test_deadline_expires_the_request_with_policy_fail(bus: Bus, client: httpx.AsyncClient) -> None:
    event = requested(expires_in_s=2)
    request_id = str(event.data["request_id"])
    await bus.publish(event)

    [expired] = await events_of(bus, "human.expired", wait_for=1)
    payload = expired.payload(HumanExpired)
    assert expired.id == derive_id("evt", request_id, "expired")
    assert expired.runid == event.runid
    assert expired.causationid == event.id
    assert payload.request_id == request_id
    assert payload.action == "fail"
    assert payload.default_answer is None
    assert payload.waited_s == pytest.approx(2, abs=1)
    # the consumer marks the expiry published only after the event is on the stream: wait for that
    record = await wait_for_record(bus, request_id, lambda r: r.expiry_published)
    assert record.status is HumanRequestState.EXPIRED
    assert (await client.get("/inbox", headers=ALICE)).json()["requests"] == []

    late = await client.post(f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
    assert late.status_code == 409
    assert late.json()["error"] == "expired"
    assert await events_of(bus, "human.answered") == []


@pytest.mark.usefixtures("consumers")
async def test_deadline_with_policy_default_carries_the_default_answer(bus: Bus) -> None:
    event = requested(expires_in_s=2, on_timeout=TimeoutPolicy(action="default", default_option="keep-v1"))
    await bus.publish(event)
    [expired] = await events_of(bus, "human.expired", wait_for=1)
    payload = expired.payload(HumanExpired)
    assert payload.action == "default"
    assert payload.default_answer == OptionAnswer(option_id="keep-v1", label="Keep the v1 API")


@pytest.mark.usefixtures("consumers")
async def test_a_deadline_already_past_expires_at_once(bus: Bus) -> None:
    event = requested(expires_in_s=-5)
    await bus.publish(event)
    [expired] = await events_of(bus, "human.expired", wait_for=1)
    assert expired.payload(HumanExpired).request_id == event.data["request_id"]


async def test_expiry_after_an_answer_is_a_no_op(bus: Bus, client: httpx.AsyncClient, handler: RequestHandler) -> None:
    event = requested()
    request_id = str(event.data["request_id"])
    await handler.handle(event)
    answer = await client.post(f"/requests/{request_id}/answer", json={"option_id": "drop-v1"}, headers=ALICE)
    assert answer.status_code == 200

    await DeadlineHandler(bus).handle(_fired(request_id))  # the timer fires after all
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status is HumanRequestState.ANSWERED
    assert await events_of(bus, "human.expired") == []


async def test_deadline_firing_twice_announces_once(bus: Bus, handler: RequestHandler) -> None:
    event = requested()
    request_id = str(event.data["request_id"])
    await handler.handle(event)
    deadlines = DeadlineHandler(bus, clock=_after_every_deadline)
    await deadlines.handle(_fired(request_id))
    await deadlines.handle(_fired(request_id))
    await exactly(bus, "human.expired", 1)


async def test_crash_between_expiry_and_publish_is_repaired_by_redelivery(bus: Bus, handler: RequestHandler) -> None:
    event = requested()
    request_id = str(event.data["request_id"])
    await handler.handle(event)
    store = await open_store(bus)
    got = await store.get(request_id)
    assert got is not None
    await store.update(request_id, got.value.moved_to(HumanRequestState.EXPIRED), got.revision)  # CAS done, no publish

    await DeadlineHandler(bus).handle(_fired(request_id))
    [expired] = await events_of(bus, "human.expired", wait_for=1)
    assert expired.payload(HumanExpired).request_id == request_id


async def test_a_timer_firing_before_expires_at_expires_nothing_and_rearms_the_deadline(
    bus: Bus, handler: RequestHandler
) -> None:
    event = requested(expires_in_s=3600)
    request_id = str(event.data["request_id"])
    await handler.handle(event)

    await DeadlineHandler(bus).handle(_fired(request_id))  # an hour early
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status is HumanRequestState.PENDING
    assert await events_of(bus, "human.expired") == []
    assert await timer_messages(bus, f"{TIMER_SCHEDULE_HUMAN}.{request_id}.rearm") == 1


@pytest.mark.usefixtures("deadline_consumer")
async def test_a_rearmed_deadline_expires_the_request_on_time(bus: Bus) -> None:
    event = requested(expires_in_s=2)
    request_id = str(event.data["request_id"])
    # Stored without its deadline timer: only the re-armed one can expire it.
    record = HumanRequestRecord.from_requested(event, event.payload(HumanRequested))
    await (await open_store(bus)).create(request_id, record)

    await DeadlineHandler(bus).handle(_fired(request_id))  # early: re-armed, not expired
    stored_now = await stored(bus, request_id)
    assert stored_now is not None
    assert stored_now.pending
    [expired] = await events_of(bus, "human.expired", wait_for=1)
    assert expired.payload(HumanExpired).request_id == request_id
    # the re-armed timer fired at the deadline, not before it (schedules have 1 s resolution)
    assert expired.time >= record.expires_at.replace(microsecond=0)


async def test_deadline_announces_an_answer_whose_publish_was_lost(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    event = requested()
    request_id = str(event.data["request_id"])
    await handler.handle(event)
    await lose_answer_publish(bus, client, request_id, "drop-v1")
    assert await events_of(bus, "human.answered") == []

    deadlines = DeadlineHandler(bus, clock=_after_every_deadline)
    await deadlines.handle(_fired(request_id))  # the deadline (or any timer) fires
    await deadlines.handle(_fired(request_id))  # and fires again
    [answered] = await events_of(bus, "human.answered", wait_for=1)
    assert answered.id == derive_id("evt", request_id, "answered")
    payload = answered.payload(HumanAnswered)
    assert payload.answer.model_dump() == {"type": "option", "option_id": "drop-v1", "label": "Drop v1"}
    assert payload.responder == "user:alice"
    assert payload.channel == "web"
    assert answered.causationid == event.id
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status is HumanRequestState.ANSWERED
    assert record.answer_published
    assert await events_of(bus, "human.expired") == []


@pytest.mark.parametrize("data", [b"not json", b"{}", b'{"request_id": "a.b"}'])
async def test_unparseable_deadline_payload_is_permanent(bus: Bus, data: bytes) -> None:
    with pytest.raises(PermanentError, match="unreadable"):
        await DeadlineHandler(bus).handle(data)


async def test_deadline_for_an_unknown_request_is_permanent(bus: Bus) -> None:
    with pytest.raises(PermanentError, match="not a known request"):
        await DeadlineHandler(bus).handle(_fired("hreq-nobody"))


@pytest.mark.usefixtures("consumers")
async def test_poison_timer_is_dead_lettered_and_journaled(bus: Bus) -> None:
    await bus.publish_raw("temporality.timers.fired.human.garbage", b"{oops", {"Nats-Msg-Id": "poison-1"})
    [dead] = await events_of(bus, "bus.dead_lettered", wait_for=1)
    payload = dead.payload(BusDeadLettered)
    assert payload.consumer == "human-interaction-deadlines"
    assert "unreadable deadline payload" in payload.error
