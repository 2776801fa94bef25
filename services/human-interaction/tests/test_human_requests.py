"""human.requested intake: SEC-1 checks, persist-then-notify, channel fallback, redelivery (HUM-2, HUM-4)."""

from __future__ import annotations

import asyncio
from typing import ClassVar, cast

import httpx
import pytest
from human_support import (
    ALICE,
    BOB,
    CrashingBus,
    PublishCrash,
    count_requests,
    delivered_then_withdrawn,
    events_of,
    exactly,
    requested,
    stored,
    timer_messages,
)

from temporality_bus import Bus, PermanentError, TransientError
from temporality_human_interaction.channels import ChannelAdapter, DeliveryFailed, DeliveryReceipt, WebInboxAdapter
from temporality_human_interaction.directory import Directory, UserProfile
from temporality_human_interaction.metrics import DeliveryOutcome
from temporality_human_interaction.records import HumanRequestRecord, SentCopy, open_store
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.runs import RunEndHandler
from temporality_protocol import (
    HumanExpired,
    HumanNotified,
    HumanRejected,
    HumanRequestState,
    RunCompleted,
    derive_id,
    make_event,
)
from temporality_protocol.catalog import BUCKET_HUMAN_REQUESTS, TIMER_SCHEDULE_HUMAN, TIMERS_STREAMS
from temporality_protocol.events import HumanRequested
from temporality_testing.kv_reads import kv_read_key


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
    """The intake of a new request writes its one index entry once (the run entry, naming who may answer it, just
    before the record: no per-person inbox entry since 2026-12-06) and records its
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
    assert index_writes == ["run"]  # create-if-absent of the entry, once
    assert [s for s, _ in sent if s.startswith("$KV.human-channels.run.")] == [
        f"$KV.human-channels.run.{run_id}.{request_id}"
    ]
    record_reads = [s for s, p in sent if kv_read_key(s, p, "human-requests") is not None]
    assert record_reads == []
    assert any(kv_read_key(s, p, "human-channels") is not None for s, p in sent)  # reads are seen: not vacuous


async def _record_writes(bus: Bus) -> int:
    """How many writes the requests bucket has taken (its stream's last sequence: every write is one message)."""
    info = await bus.js.stream_info(f"KV_{BUCKET_HUMAN_REQUESTS.name}")
    return int(info.state.last_seq)


async def test_a_web_delivery_is_stored_with_the_record_in_one_write(bus: Bus, handler: RequestHandler) -> None:
    """alice prefers Matrix, which has no adapter here, then the web inbox, whose delivery is the stored record
    itself (the inbox lists the stored pending requests; nothing is sent): the intake creates the record with its
    channel, its copy and the Matrix attempt, and writes it once -- no compare-and-set after the create -- and
    ``human.notified`` says what the delivery after the create used to say. (Until 2026-12-06: two writes.)"""
    event = requested(recipient="user:alice")
    request_id = str(event.data["request_id"])
    before = await _record_writes(bus)
    await handler.handle(event)

    assert await _record_writes(bus) - before == 1
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status is HumanRequestState.PENDING
    assert record.channel == "web"
    assert [(d.channel, d.reference, d.recipient) for d in record.deliveries] == [("web", request_id, None)]
    assert [(f.channel, f.error) for f in record.failed_deliveries] == [
        ("matrix", "no matrix adapter runs in this deployment")
    ]
    [notified] = await events_of(bus, "human.notified", wait_for=1)
    payload = notified.payload(HumanNotified)
    assert (payload.channel, payload.fallback_from) == ("web", "matrix")
    assert [(a.channel, a.error) for a in payload.failed_attempts] == [
        ("matrix", "no matrix adapter runs in this deployment")
    ]
    assert await timer_messages(bus, f"{TIMER_SCHEDULE_HUMAN}.{request_id}") == 1  # the deadline, as before


class _SendingMatrix(ChannelAdapter):
    """A channel that sends (as Matrix and Telegram do): it checks, as it sends, that the record is stored."""

    name: ClassVar[str] = "matrix"

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self.stored_when_sent: list[bool] = []

    async def initialize(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None

    @property
    def available(self) -> bool:
        return True

    def reaches(self, profile: UserProfile) -> bool:
        return True

    async def do_deliver(
        self, request: HumanRequestRecord, profile: UserProfile, *, banner: str | None = None, tag: str = ""
    ) -> DeliveryReceipt:
        self.stored_when_sent.append(await stored(self._bus, request.request_id) is not None)
        return DeliveryReceipt(channel=self.name, reference="$event", address="!room")

    async def do_update(self, request: HumanRequestRecord, copy: SentCopy, responder_name: str | None) -> None:
        return None

    async def do_notify(self, profile: UserProfile, text: str, key: str) -> DeliveryReceipt:
        raise DeliveryFailed("not here")


async def test_a_channel_that_sends_still_sends_only_once_the_record_is_stored(bus: Bus, directory: Directory) -> None:
    """Only a delivery that is the stored record itself is made before the create: a channel that sends comes
    first for alice (Matrix), so the question goes out after the record is stored (an answer that comes before the
    notification is never lost), and the delivery is recorded by a compare-and-set after it, as before."""
    matrix = _SendingMatrix(bus)
    async with WebInboxAdapter() as web:
        handler = RequestHandler(bus, directory, {matrix.name: matrix, web.name: web})
        event = requested(recipient="user:alice")
        request_id = str(event.data["request_id"])
        before = await _record_writes(bus)
        await handler.handle(event)
    assert matrix.stored_when_sent == [True]
    assert await _record_writes(bus) - before == 2  # created, then delivered
    record = await stored(bus, request_id)
    assert record is not None
    assert record.channel == "matrix"
    assert [(d.channel, d.reference) for d in record.deliveries] == [("matrix", "$event")]
    assert record.failed_deliveries == []


class _Deliveries:
    """The delivery attempts the adapters report (as :class:`~.metrics.HumanMetrics` counts them)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def delivery(self, channel: str, tag: str, outcome: DeliveryOutcome) -> None:
        self.seen.append((channel, tag, outcome))


async def test_a_crash_after_the_web_first_create_is_announced_once_by_the_redelivery(
    bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter]
) -> None:
    """The web inbox delivery is stored in the record's create; the process dies before ``human.notified``. The
    redelivery finds the record delivered: it publishes ``human.notified`` exactly once and writes no record (no
    second create, no delivery's compare-and-set), and the delivery is counted once."""
    crashing = CrashingBus(bus, HumanNotified.EVENT_TYPE)
    counted = _Deliveries()
    adapters["web"].observer = counted
    handler = RequestHandler(cast(Bus, crashing), directory, adapters)
    event = requested(recipient="user:alice")
    request_id = str(event.data["request_id"])
    before = await _record_writes(bus)
    with pytest.raises(PublishCrash):
        await handler.handle(event)
    assert await _record_writes(bus) - before == 1
    record = await stored(bus, request_id)
    assert record is not None
    assert (record.status, record.channel) == (HumanRequestState.PENDING, "web")
    assert await events_of(bus, "human.notified") == []  # lost with the process

    await handler.handle(event)  # the redelivery
    [notified] = await exactly(bus, "human.notified")
    payload = notified.payload(HumanNotified)
    assert (payload.request_id, payload.channel, payload.fallback_from) == (request_id, "web", "matrix")
    assert await _record_writes(bus) - before == 1
    assert await stored(bus, request_id) == record
    assert await timer_messages(bus, f"{TIMER_SCHEDULE_HUMAN}.{request_id}") == 1  # the deadline, once
    assert counted.seen == [("web", "", "delivered")]


async def test_a_run_end_handled_right_after_the_create_leaves_the_web_delivery_announced(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run ends between the record's create (with its web inbox delivery) and the intake's read of the markers,
    and the run end's handler cancels it first: the intake finds it cancelled. The delivery stays and is announced,
    as when the intake's own cancel wins (test_human_mirror_reads.py, test_human_withdraw.py)."""
    event = requested(recipient="user:alice")
    request_id, run_id = str(event.data["request_id"]), str(event.data["run_id"])
    ended = handler._ended

    async def end_first(record: HumanRequestRecord, indexed_at: int | None = None) -> str | None:
        await RunEndHandler(bus).handle(
            make_event(RunCompleted(run_id=run_id, result="done", turns=1), source="/test", run_id=run_id)
        )
        return await ended(record, indexed_at)

    monkeypatch.setattr(handler, "_ended", end_first)
    await handler.handle(event)
    await delivered_then_withdrawn(bus, client, request_id, reason="run_completed")


async def test_an_intake_that_loses_the_create_counts_no_web_delivery_and_announces_the_stored_one(
    bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two deliveries of the same ``human.requested`` (two replicas): the second one's create lands first, between
    the first one's web inbox delivery and its create. The first gets AlreadyExists and goes on with the stored
    record: one record, one ``human.notified``, and the web delivery counted once -- by the intake whose create
    stored it (the loser's, made before its create, is not counted)."""
    counted = _Deliveries()
    adapters["web"].observer = counted
    first, second = RequestHandler(bus, directory, adapters), RequestHandler(bus, directory, adapters)
    event = requested(recipient="user:alice")
    request_id = str(event.data["request_id"])
    delivered_with_record = first._delivered_with_record

    async def overtaken_before_the_create(record: HumanRequestRecord, profile: UserProfile) -> HumanRequestRecord:
        delivered = await delivered_with_record(record, profile)
        await second.handle(event)  # the first intake, between its delivery and its create: the second goes through
        return delivered

    monkeypatch.setattr(first, "_delivered_with_record", overtaken_before_the_create)
    before = await _record_writes(bus)
    await first.handle(event)
    assert await _record_writes(bus) - before == 1
    record = await stored(bus, request_id)
    assert record is not None
    assert (record.status, record.channel) == (HumanRequestState.PENDING, "web")
    [notified] = await exactly(bus, "human.notified")
    assert notified.payload(HumanNotified).channel == "web"
    assert counted.seen == [("web", "", "delivered")]


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
