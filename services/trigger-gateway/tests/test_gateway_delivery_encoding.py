"""A delivery's record is written with its event spliced into the head's JSON (deliveries.Draft.encoded):
it reads back as the head with that event, whatever the head's texts hold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from gateway_support import webhook_spec

from temporality_protocol import Actor, NormalizedEvent
from temporality_trigger_gateway.deliveries import DeliveryRecord, Draft, _indexed, index_key
from temporality_trigger_gateway.launch import TriggerDelivery
from temporality_trigger_gateway.triggers import WebhookTrigger


@pytest.mark.parametrize("text", ["plain", '"event":null', 'x","event":null,"y":"', "ü \\ \u2028"])
@pytest.mark.parametrize("keep_event", [True, False])
def test_the_record_reads_back_as_its_head_with_the_event(text: str, keep_event: bool) -> None:
    now = datetime(2026, 12, 6, 1, 2, 3, tzinfo=UTC)
    event = NormalizedEvent(
        id=text,
        type="generic.push",
        source="https://example.test",
        timestamp=now,
        actor=Actor(id=text),
        payload={"event": None, "text": text},
    )
    head = DeliveryRecord(
        trigger_id="t-1",
        delivery_id="dlv-1",
        kind="webhook",
        adapter="generic",
        source_event_id=text,
        state="accepted",
        detail=text,
        title=text,
        run_id="run-1",
        received_at=now,
        updated_at=now,
    )
    trigger = WebhookTrigger.model_validate(webhook_spec("t-1"))
    delivery = TriggerDelivery(trigger, "dlv-1", "webhook", "generic", text, None)
    event_json = event.model_dump_json().encode() if keep_event else None
    draft = Draft(delivery, event, "t-1.dlv-1", event_json, True, now, title=text)
    stored = DeliveryRecord.model_validate_json(draft.encoded(head))
    assert stored == head.model_copy(update={"event": event if keep_event else None})
    # the draft's own head, in its outcome's state: the same record but for the time of the outcome
    own = draft.head("accepted", run_id="run-1", detail=text)
    assert own.model_copy(update={"updated_at": now, "event_omitted": False}) == head
    assert own.event_omitted is not keep_event
    assert DeliveryRecord.model_validate_json(draft.encoded(own)) == own.model_copy(
        update={"event": event if keep_event else None}
    )


@pytest.mark.parametrize(
    "at",
    [
        datetime(2026, 12, 6, 1, 2, 3, 4, tzinfo=UTC),
        datetime(2026, 1, 1, tzinfo=UTC),
        datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 12, 6, 1, 2, 3, 4, tzinfo=timezone(timedelta(hours=-5))),
        datetime(999, 1, 2, 3, 4, 5, tzinfo=UTC),
        datetime(9999, 12, 31, tzinfo=UTC),
    ],
)
def test_an_index_key_holds_the_receipt_time_as_strftime_writes_it(at: datetime) -> None:
    key = index_key("t-1", at, "dlv-1")
    assert key == f"t-1.at.{at.astimezone(UTC).strftime('%Y%m%dT%H%M%S%fZ')}.dlv-1"
    if at.year >= 1000:
        assert _indexed(key, "t-1") == (at, "dlv-1")
