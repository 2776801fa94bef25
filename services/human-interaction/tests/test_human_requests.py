"""human.requested intake: SEC-1 checks, persist-then-notify, channel fallback, redelivery (HUM-2, HUM-4)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from human_support import ALICE, BOB, count_requests, events_of, requested, stored, timer_messages

from temporality_bus import Bus, PermanentError, TransientError
from temporality_human_interaction.channels import DeliveryFailed, DeliveryReceipt, WebInboxAdapter
from temporality_human_interaction.directory import Directory, UserProfile
from temporality_human_interaction.records import HumanRequestRecord, open_store
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import HumanExpired, HumanNotified, HumanRejected, HumanRequestState, derive_id, make_event
from temporality_protocol.catalog import TIMER_SCHEDULE_HUMAN, TIMERS_STREAMS
from temporality_protocol.events import HumanRequested


@pytest.mark.usefixtures("consumers")
async def test_request_is_persisted_then_notified_through_the_web_fallback(bus: Bus, client: httpx.AsyncClient) -> None:
    event = requested(recipient="user:alice")
    await bus.publish(event)

    [notified] = await events_of(bus, "human.notified", wait_for=1)
    payload = notified.payload(HumanNotified)
    request_id = event.data["request_id"]
    assert payload.request_id == request_id
    assert payload.channel == "web"
    assert payload.fallback_from == "matrix"  # alice prefers Matrix, whose adapter is not configured here
    assert [(a.channel, a.error) for a in payload.failed_attempts] == [
        ("matrix", "no matrix adapter runs in this deployment")
    ]  # every attempt is journaled
    assert notified.id == derive_id("evt", request_id, "notified")
    assert notified.source == "/temporality/human-interaction"
    assert notified.runid == event.runid
    assert notified.causationid == event.id

    record = await stored(bus, request_id)
    assert record is not None
    assert record.status is HumanRequestState.PENDING
    assert record.channel == "web"
    assert record.recipient == "user:alice"

    inbox = (await client.get("/inbox", headers=ALICE)).json()
    assert [r["id"] for r in inbox["requests"]] == [request_id]
    assert inbox["requests"][0]["channel"] == "web"
    assert inbox["requests"][0]["options"][0]["id"] == "keep-v1"


async def test_preferred_web_is_not_a_fallback(bus: Bus, handler: RequestHandler) -> None:
    await handler.handle(requested(recipient="user:bob"))
    [notified] = await events_of(bus, "human.notified", wait_for=1)
    assert notified.payload(HumanNotified).channel == "web"
    assert notified.payload(HumanNotified).fallback_from is None


@pytest.mark.usefixtures("consumers")
@pytest.mark.parametrize(
    ("recipient", "allowed"),
    [
        ("user:bob", ("user:alice",)),  # a real user, but not one this run's trigger allows
        ("user:mallory", ("user:alice",)),  # someone a webhook made up
        ("@bob:example.org", ("@bob:example.org",)),  # a channel address is never a recipient
    ],
)
async def test_recipient_not_allowed_is_rejected_and_nothing_is_stored(
    bus: Bus, client: httpx.AsyncClient, recipient: str, allowed: tuple[str, ...]
) -> None:
    event = requested(recipient=recipient, allowed=allowed)
    await bus.publish(event)

    [rejected] = await events_of(bus, "human.rejected", wait_for=1)
    payload = rejected.payload(HumanRejected)
    assert payload.reason == "recipient_not_allowed"
    assert payload.recipient == recipient
    assert rejected.id == derive_id("evt", event.data["request_id"], "rejected")
    assert rejected.causationid == event.id
    assert await stored(bus, event.data["request_id"]) is None
    assert await events_of(bus, "human.notified") == []
    for token in (ALICE, BOB):
        assert (await client.get("/inbox", headers=token)).json()["requests"] == []


async def test_unknown_user_is_rejected(bus: Bus, handler: RequestHandler) -> None:
    event = requested(recipient="user:carol", allowed=("user:carol",))
    await handler.handle(event)
    [rejected] = await events_of(bus, "human.rejected", wait_for=1)
    assert rejected.payload(HumanRejected).reason == "unknown_recipient"
    assert await stored(bus, event.data["request_id"]) is None


async def test_no_available_channel_is_rejected(bus: Bus, directory: Directory) -> None:
    event = requested(recipient="user:bob")
    await RequestHandler(bus, directory, {}).handle(event)
    [rejected] = await events_of(bus, "human.rejected", wait_for=1)
    assert rejected.payload(HumanRejected).reason == "no_channel"
    assert await stored(bus, event.data["request_id"]) is None


async def test_unanswerable_request_is_rejected_as_invalid(bus: Bus, handler: RequestHandler) -> None:
    event = requested(recipient="user:bob")
    data = HumanRequested.model_validate({**event.data, "options": [], "allow_free_text": False})
    await handler.handle(make_event(data, source="/test", run_id=data.run_id))
    [rejected] = await events_of(bus, "human.rejected", wait_for=1)
    assert rejected.payload(HumanRejected).reason == "invalid_request"


async def test_redelivered_request_makes_one_record_and_one_notification(bus: Bus, handler: RequestHandler) -> None:
    event = requested(recipient="user:alice")
    await handler.handle(event)
    first = await stored(bus, event.data["request_id"])
    # The same message delivered again, sequentially and concurrently (two replicas, an ack lost).
    await handler.handle(event)
    await asyncio.gather(handler.handle(event), handler.handle(event))

    assert await stored(bus, event.data["request_id"]) == first
    assert await (await open_store(bus)).keys() == [event.data["request_id"]]
    assert len(await events_of(bus, "human.notified")) == 1
    info = await bus.js.stream_info(
        TIMERS_STREAMS["human-interaction"].name, subjects_filter=f"{TIMER_SCHEDULE_HUMAN}.>"
    )
    assert info.state.messages == 1


async def test_a_new_request_is_indexed_once_and_read_once(
    bus: Bus, handler: RequestHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The intake of a new request writes each index entry once (just before the record) and records its
    delivery from the record it stored, not from a read back: no read of the record at all (the run entry it
    created says none can be stored yet)."""
    event = requested(recipient="user:alice")
    request_id, run_id = event.data["request_id"], event.data["run_id"]
    sent = count_requests(bus, monkeypatch)
    await handler.handle(event)
    sent = list(sent)  # what the intake sent (the checks below read too)

    record = await stored(bus, request_id)
    assert record is not None
    assert record.channel == "web"
    assert [d.channel for d in record.deliveries] == ["web"]
    index_writes = sorted(s.rsplit(".", 3)[-3] for s, _ in sent if s.startswith("$KV.human-channels."))
    assert index_writes == ["open", "run"]  # create-if-absent of each entry, once
    assert [s for s, _ in sent if s.startswith("$KV.human-channels.run.")] == [
        f"$KV.human-channels.run.{run_id}.{request_id}"
    ]
    record_reads = [p for s, p in sent if s.endswith("STREAM.MSG.GET.KV_human-requests")]
    assert record_reads == []


async def test_request_id_reused_by_another_run_is_permanent(bus: Bus, handler: RequestHandler) -> None:
    event = requested(recipient="user:alice", request_id="hreq-shared")
    await handler.handle(event)
    with pytest.raises(PermanentError, match="already used"):
        await handler.handle(requested(recipient="user:bob", request_id="hreq-shared"))


class _BrokenWeb(WebInboxAdapter):
    """A web channel whose every delivery fails (a transport that is up but refuses)."""

    async def do_deliver(
        self, request: HumanRequestRecord, profile: UserProfile, *, banner: str | None = None, tag: str = ""
    ) -> DeliveryReceipt:
        raise DeliveryFailed("the inbox refused it")


@pytest.mark.usefixtures("deadline_consumer")
async def test_a_request_that_can_never_be_delivered_still_expires(bus: Bus, directory: Directory) -> None:
    event = requested(recipient="user:bob", expires_in_s=2)
    request_id = str(event.data["request_id"])
    async with _BrokenWeb() as web:
        handler = RequestHandler(bus, directory, {web.name: web})
        with pytest.raises(TransientError, match="could not be delivered"):
            await handler.handle(event)  # the consumer retries this, then dead-letters it
        assert await timer_messages(bus, f"{TIMER_SCHEDULE_HUMAN}.{request_id}") == 1  # armed before delivery

        [expired] = await events_of(bus, "human.expired", wait_for=1)
        assert expired.payload(HumanExpired).request_id == request_id
        assert expired.payload(HumanExpired).action == "fail"
        record = await stored(bus, request_id)
        assert record is not None
        assert record.status is HumanRequestState.EXPIRED
        assert record.channel is None

        await handler.handle(event)  # a redelivery after the expiry settles without delivering
    assert await events_of(bus, "human.notified") == []
