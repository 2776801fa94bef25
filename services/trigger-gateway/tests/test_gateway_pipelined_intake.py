"""The webhook hot path's pipelined writes against a real nats-server (issue 7, intake speed).

Per new event the gateway answers after two round trips: the dedupe claim, then the three events with the
delivery's ``accepted`` record (and its index entry); the claim's ``published`` mark is written behind the
answer (:mod:`temporality_trigger_gateway.behind`). These tests pin the order that keeps
exactly-once intake (nothing marked published before every event is acknowledged), what a batch that
JetStream only partly stored leaves behind, that the record written without re-validation reads
back as a valid record, and the whole message budget of a new event as the server sees it (7 writes, 7
acknowledgements, nothing else).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any
from unittest.mock import patch

import httpx
import nats
from gateway_support import MAX_BODY, eventually, fixture_bytes, fixture_json, journal, post, types
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from temporality_bus import Bus, BusError, NatsSettings, Pipeline, PublishResult, TransientError
from temporality_bus.pipeline import Write
from temporality_protocol import (
    NormalizedEvent,
    derive_id,
    run_id_for_delivery,
)
from temporality_protocol.catalog import BUCKET_DEDUPE, BUCKET_DELIVERIES
from temporality_trigger_gateway import Settings, TriggerConfig, create_app
from temporality_trigger_gateway.behind import WriteBehind
from temporality_trigger_gateway.deliveries import Deliveries, DeliveryRecord
from temporality_trigger_gateway.intake import DedupeRecord

PR_EVENT_ID = "5f0b8f6e-3c2d-4e71-a0d9-7b1e2c4d9a10"
TRIGGER = "ado-pr-review"
KEY = derive_id("dd", TRIGGER, PR_EVENT_ID)
RUN_ID = run_id_for_delivery(TRIGGER, PR_EVENT_ID)


def _what(write: Write) -> str:
    """A write as the assertions name it: ``dedupe:<state>``, ``record:<state>``, ``index``, an event's type."""
    if write.bucket == BUCKET_DEDUPE.name:
        return f"dedupe:{DedupeRecord.model_validate_json(write.payload).state}"
    if write.bucket == BUCKET_DELIVERIES.name:
        if ".at." in (write.key or ""):
            return "index"
        return f"record:{DeliveryRecord.model_validate_json(write.payload).state}"
    return write.headers.get("Ce-Type", write.subject)


async def _dedupe(bus: Bus) -> DedupeRecord:
    await WriteBehind.of(bus).settled()  # the mark this process queued behind its answer, if any
    stored = await (await bus.store(BUCKET_DEDUPE, DedupeRecord)).get(KEY)
    assert stored is not None
    return stored.value


async def _records(bus: Bus) -> list[DeliveryRecord]:
    return (await Deliveries(bus).newest(TRIGGER, before=None, limit=10))[0]


async def test_a_new_event_answers_after_two_round_trips_and_is_marked_published_behind_its_events(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    trips: list[list[str]] = []
    real_send = Pipeline.send

    async def sending(self: Pipeline, writes: Sequence[Write], **kw: Any) -> list[PublishResult | BusError]:
        results = await real_send(self, writes, **kw)
        trips.append([_what(w) for w in writes])
        return results

    # every pipelined batch goes through Pipeline.send, the events' too (Bus.publish_many)
    with patch.object(Pipeline, "send", sending):
        response = await post(client, fixture_bytes("pr-created.json"))
        answered = len(trips)
        await WriteBehind.of(bus).settled()
    assert response.status_code == 202
    assert response.json() == {"delivery_id": response.json()["delivery_id"], "status": "accepted", "run_id": RUN_ID}
    assert answered >= 2
    assert trips == [
        ["dedupe:claimed"],
        # the delivery's record rides with the events: stored before the 202, so a crash after it loses nothing
        ["trigger.received", "trigger.accepted", "run.requested", "record:accepted", "index"],
        ["dedupe:published"],  # behind the answer
    ]
    assert (await _dedupe(bus)).state == "published"
    # The record, written as the model's JSON with the event spliced in once, reads back as a valid record.
    (record,) = await _records(bus)
    assert (record.state, record.run_id, record.delivery_id) == ("accepted", RUN_ID, response.json()["delivery_id"])
    assert isinstance(record.event, NormalizedEvent)
    assert record.event.id == PR_EVENT_ID
    assert record.event.payload  # the full event, kept for a re-drive
    assert record.received_at <= record.updated_at


async def test_a_batch_jetstream_stores_only_in_part_answers_503_and_the_retry_makes_exactly_one_run(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    """JetStream refuses run.requested alone (its other two events are stored): 503, nothing marked
    published; the sender's retry publishes the same derived ids: one run, one trigger.accepted."""
    real_send = Pipeline.send
    bus.js.no_stream_retry_s = 0.2  # (a 503 is sent again for a while, as stored nothing: not 3 s here)

    async def refusing_run_requested(
        self: Pipeline, writes: Sequence[Write], **kw: Any
    ) -> list[PublishResult | BusError]:
        # run.requested to a subject no stream takes: the server answers "no responders"
        sent = [
            w._replace(subject="temporality.nowhere.run.requested")
            if w.headers.get("Ce-Type") == "run.requested"
            else w
            for w in writes
        ]
        return await real_send(self, sent, **kw)

    with patch.object(Pipeline, "send", refusing_run_requested):
        refused = await post(client, fixture_bytes("pr-created.json"))
    assert refused.status_code == 503
    assert refused.headers["Retry-After"] == "7"
    assert types(await journal(bus)) == ["trigger.received", "trigger.accepted"]  # half stored, on the stream
    assert (await _dedupe(bus)).state == "released"  # not published: a retry takes the claim at once
    (failed,) = await _records(bus)  # stored "accepted" with the events, corrected before the 503
    assert failed.state == "failed"
    assert failed.run_id is None  # its run was not requested
    assert failed.detail is not None
    assert "retries" in failed.detail

    retried = await post(client, fixture_bytes("pr-created.json"))
    assert retried.status_code == 202
    assert retried.json()["run_id"] == RUN_ID
    events = await journal(bus)
    assert types(events).count("run.requested") == 1
    assert types(events).count("trigger.accepted") == 1  # the retry's copy deduplicated by its derived id
    assert types(events).count("trigger.received") == 2  # one per delivery
    assert (await _dedupe(bus)).state == "published"
    again = await post(client, fixture_bytes("pr-created.json"))
    assert (again.status_code, again.json()["status"]) == (200, "duplicate")
    states = sorted(r.state for r in await _records(bus))
    assert states == ["accepted", "failed", "rejected"]


async def test_a_lost_mark_still_answers_accepted_and_a_copy_after_the_lease_makes_no_second_run(
    bus: Bus, triggers: list[TriggerConfig]
) -> None:
    """The claim's mark is not acknowledged (the events are): the 202 stands, since run.requested is
    stored; a copy of the event after the lease takes the stale claim over and republishes the same ids."""
    settings = Settings(max_body_bytes=MAX_BODY, retry_after_s=7, claim_lease_s=0.2)
    real_send = Pipeline.send

    async def losing_marks(self: Pipeline, writes: Sequence[Write], **kw: Any) -> list[PublishResult | BusError]:
        results = await real_send(self, [w for w in writes if _what(w) != "dedupe:published"], **kw)
        if any(_what(w) == "dedupe:published" for w in writes):
            results.insert(0, TransientError("simulated: no ack for the mark"))
        return results

    app = create_app(settings, bus, triggers)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as c:
        with patch.object(Pipeline, "send", losing_marks):
            first = await post(c, fixture_bytes("pr-created.json"))
            await WriteBehind.of(bus).settled()  # the mark (lost) goes out behind the answer
        assert first.status_code == 202
        assert (await _dedupe(bus)).state == "claimed"
        (record,) = await _records(bus)
        assert record.state == "accepted"  # written with the events, before the answer
        copy = await post(c, fixture_bytes("pr-created.json"))  # waits out the 0.2 s lease, takes over
    assert copy.status_code == 202
    assert copy.json()["run_id"] == RUN_ID
    events = await journal(bus)
    assert types(events).count("run.requested") == 1
    assert types(events).count("trigger.accepted") == 1
    assert (await _dedupe(bus)).state == "published"


async def test_launches_at_once_share_the_rounds_behind_their_answers_and_each_is_marked_and_recorded(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    """Twelve new events at once, and a copy of each after its answer: every claim ends ``published``, every
    delivery recorded once in its outcome's state (listed at once: read-your-writes), one run per event; the
    marks and records went out behind the answers, never more rounds than launches."""
    body = fixture_json("pr-created.json")
    ids = [f"{PR_EVENT_ID[:-2]}{i:02d}" for i in range(12)]
    behind: list[list[str]] = []
    real_send = Pipeline.send

    async def sending(self: Pipeline, writes: Sequence[Write], **kw: Any) -> list[PublishResult | BusError]:
        if any(_what(w) == "dedupe:published" for w in writes):
            behind.append([_what(w) for w in writes])
        return await real_send(self, writes, **kw)

    with patch.object(Pipeline, "send", sending):
        answers = await asyncio.gather(*(post(client, {**body, "id": event_id}) for event_id in ids))
        copies = await asyncio.gather(*(post(client, {**body, "id": event_id}) for event_id in ids))
    assert [a.status_code for a in answers] == [202] * 12
    assert [(c.status_code, c.json()["status"]) for c in copies] == [(200, "duplicate")] * 12
    marks = [w for round_ in behind for w in round_ if w == "dedupe:published"]
    assert len(marks) == 12  # one mark per launch, each after its events (the copies found them published)
    assert 1 <= len(behind) <= 12
    store = await bus.store(BUCKET_DEDUPE, DedupeRecord)
    for event_id in ids:
        found = await store.get(derive_id("dd", TRIGGER, event_id))
        assert found is not None
        assert found.value.state == "published"
    records, _ = await Deliveries(bus).newest(TRIGGER, before=None, limit=50)
    assert sorted(r.state for r in records) == ["accepted"] * 12 + ["rejected"] * 12
    accepted = {r.delivery_id for r in records if r.state == "accepted"}
    assert accepted == {a.json()["delivery_id"] for a in answers}
    assert types(await journal(bus)).count("run.requested") == 12


def _on_the_bus(subject: str) -> str:
    """A message seen on the bus as the message budget names it."""
    if subject.startswith("$KV."):
        return f"kv:{subject.split('.')[1]}"
    if subject.startswith("_INBOX."):
        return "reply"  # a JetStream acknowledgement (or an API answer) to a client's inbox
    if subject.startswith("temporality.events."):
        return subject.removeprefix("temporality.events.")
    return subject  # anything else is named in full in the failure


#: A new event's messages as the spy counts them: 7 writes, 7 acknowledgements (the budget below).
BUDGET = {
    "kv:trigger-dedupe": 2,  # the claim (create-if-absent), its published mark (compare-and-set)
    "trigger.received": 1,
    "trigger.accepted": 1,
    "run.requested": 1,
    "kv:trigger-deliveries": 2,  # the record, created in its final state, and its index entry
    "reply": 7,  # one acknowledgement per write
}


async def _spy_on_everything(spy: NATS, seen: Counter[str]) -> None:
    """Count on ``seen`` every message the server routes to ``spy`` from now on (subscribed to ``>``).

    Returns once the server has the subscription, proven by a message the spy publishes after its ``SUB`` (on
    one connection the server reads them in order) coming back to it. ``spy.flush()`` proves nothing here:
    nats-py 2.16 writes a flush's ``PING`` straight to the socket, ahead of the ``SUB`` still in its outbound
    buffer, so its ``PONG`` can come back before the server has read the ``SUB`` -- and on a loaded machine the
    server routed the webhook's first write (the claim) and its acknowledgement before it did."""
    marker = "spy.subscribed"
    ready = asyncio.Event()

    async def count(msg: Msg) -> None:
        if msg.subject == marker:
            ready.set()
        else:
            seen[_on_the_bus(msg.subject)] += 1

    await spy.subscribe(">", cb=count)
    await spy.publish(marker, b"")
    await asyncio.wait_for(ready.wait(), 10)


async def test_an_accepted_webhook_puts_seven_writes_and_their_seven_acks_on_the_bus_and_nothing_else(
    client: httpx.AsyncClient, bus: Bus, nats_settings: NatsSettings
) -> None:
    """The intake's message budget per new event, counted on the server by a second client subscribed to every
    subject (``>``): the claim and its mark, three events, the delivery's record and its index entry, each
    acknowledged once -- no read, no API call, no other write (the bench's ``msgs/req`` is this, under load)."""
    first = await post(client, fixture_bytes("pr-created.json"))  # opens the buckets (stream info calls) first
    assert first.status_code == 202
    await WriteBehind.of(bus).settled()
    event_id = f"{PR_EVENT_ID[:-2]}99"
    spy = await nats.connect(nats_settings.url)
    try:
        seen: Counter[str] = Counter()
        await _spy_on_everything(spy, seen)
        response = await post(client, {**fixture_json("pr-created.json"), "id": event_id})
        assert response.status_code == 202
        await WriteBehind.of(bus).settled()  # the writes behind the answer acknowledged too

        # Every write and acknowledgement the budget names was routed to the spy (the acks are in, the spy may be a
        # read behind): wait for them, not for the count to stop moving.
        async def counted() -> bool:
            await spy.flush()
            return all(seen[name] >= n for name, n in BUDGET.items())

        try:
            await eventually(counted, 10, "the spy to see the webhook's writes and acknowledgements")
        except AssertionError:
            pass  # the tally below names what is missing
        await spy.flush()  # and whatever else the server routed to the spy before this PING (nothing, below)
        tally = dict(seen)
    finally:
        await spy.close()
    assert tally == BUDGET
    # the second dedupe write counted is the claim's published mark
    mark = await (await bus.store(BUCKET_DEDUPE, DedupeRecord)).get(derive_id("dd", TRIGGER, event_id))
    assert mark is not None
    assert mark.value.state == "published"
