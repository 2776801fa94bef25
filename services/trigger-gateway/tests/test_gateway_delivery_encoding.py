"""A delivery's record is written with its event spliced into the head's JSON (deliveries.Draft.encoded):
it reads back as the head with that event, whatever the head's texts hold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Literal

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


@pytest.mark.parametrize("text", ["plain", '"event":null', 'x","event":null,"y":"', "ü \\ \u2028 \x00", "d" * 1500])
@pytest.mark.parametrize("keep_event", [True, False])
@pytest.mark.parametrize("kind", ["webhook", "event"])
def test_the_record_written_without_its_model_is_byte_for_byte_the_models(
    text: str, keep_event: bool, kind: Literal["webhook", "event"]
) -> None:
    """Differential: Draft.record_json (the record's JSON written straight from its values, what the launch path
    stores) against the validating model's JSON it replaced (Draft.head + Draft.encoded), in every state and
    with every optional field absent or set -- the same bytes."""
    now = datetime(2026, 12, 6, 1, 2, 3, 456789, tzinfo=UTC)
    updates = (
        datetime(2026, 12, 6, 2, 0, 0, 1, tzinfo=UTC),
        datetime(2026, 12, 6, 2, 0, tzinfo=timezone(timedelta(hours=1))),
    )
    event = NormalizedEvent(
        id=text[:50],
        type="generic.push",
        source="https://example.test",
        timestamp=now,
        actor=Actor(id=text[:50]),
        payload={"event": None, "text": text, "n": [1, 2.5, True, None]},
    )
    trigger = WebhookTrigger.model_validate(webhook_spec("t-1"))
    deliveries = [
        TriggerDelivery(trigger, "dlv-1", kind, "generic", text, None),
        TriggerDelivery(trigger, "dlv-2", kind, "event", "evt-1", "run.completed", 42, 2, "evt-0", text),
        TriggerDelivery(
            trigger, "dlv-3", kind, "generic", text, None, rerun=2, rerun_of="run-0", requested_by="on-call"
        ),
    ]
    event_json = event.model_dump_json().encode() if keep_event else None
    for delivery in deliveries:
        for redrive_of, title in ((None, None), ("dlv-0", text)):
            draft = Draft(delivery, event, "t-1.dlv", event_json, kind == "webhook", now, title, redrive_of)
            for state, run_id, reason, detail in (
                ("accepted", "run-1", None, None),
                ("rejected", "run-1", "duplicate", text),
                ("rejected", None, "concurrency_skip", text),
                ("failed", None, None, text),
                ("queued", "run-2", None, None),
                ("debounced", "run-2", None, None),
            ):
                head = draft.head(state, run_id=run_id, reason=reason, detail=detail)  # type: ignore[arg-type]
                for later in updates:
                    model_json = draft.encoded(head.model_copy(update={"updated_at": later}))
                    written = draft.record_json(state, run_id=run_id, reason=reason, detail=detail, updated_at=later)  # type: ignore[arg-type]
                    assert written == model_json, (state, delivery)
                    # only a rerun's record has the rerun fields: an earlier gateway (a rolling upgrade) reads the rest
                    assert (b'"rerun"' in written) is (delivery.rerun is not None)
                    assert DeliveryRecord.model_validate_json(written).event == (event if keep_event else None)
