"""An ignored delivery (the gateway's HTTP 200 ``ignored``: a ping, an event type the trigger does not list, a
disabled trigger, its condition false; journaled as ``trigger.rejected``) is counted apart from the refused ones
in ``/triggers`` and reads ``ignored`` in a trigger's deliveries (SQLite, PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from temporality_protocol import TriggerReceived, TriggerRejected, derive_id, make_event

Journal = Any  # conftest.Journal

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


async def test_an_ignored_delivery_is_counted_apart_from_the_refused_ones(journal: Journal) -> None:
    def received(delivery: str, event_type: str, at: datetime) -> Any:
        data = TriggerReceived(
            trigger_id="gh-pr",
            delivery_id=delivery,
            adapter="github",
            source_event_id=f"src-{delivery}",
            source_event_type=event_type,
            body_bytes=2,
        )
        return make_event(data, source="/temporality/test", id=derive_id("evt", "recv", delivery), time=at)

    def rejected(delivery: str, reason: Any, at: datetime) -> Any:
        data = TriggerRejected(trigger_id="gh-pr", delivery_id=delivery, reason=reason, detail="why")
        return make_event(data, source="/temporality/test", id=derive_id("evt", "rej", delivery), time=at)

    cases = [
        ("d1", "ping", "unsupported_event"),
        ("d2", "issues", "unsupported_event"),
        ("d3", "pull_request", "filtered"),
        ("d4", "pull_request", "disabled"),
        ("d5", "pull_request", "duplicate"),
        ("d6", "pull_request", "invalid_payload"),
    ]
    for i, (delivery, event_type, reason) in enumerate(cases):
        at = T0 + timedelta(minutes=i)
        await journal.send(received(delivery, event_type, at), rejected(delivery, reason, at + timedelta(seconds=1)))

    (trigger,) = (await journal.client.get("/triggers")).json()["triggers"]
    assert (trigger["deliveries_received"], trigger["deliveries_ignored"], trigger["deliveries_rejected"]) == (6, 4, 2)
    assert trigger["ignored_by_reason"] == {"disabled": 1, "filtered": 1, "unsupported_event": 2}
    assert trigger["rejected_by_reason"] == {"duplicate": 1, "invalid_payload": 1}
    deliveries = (await journal.client.get("/triggers/gh-pr/deliveries")).json()["deliveries"]
    assert {d["delivery_id"]: (d["outcome"], d["reason"]) for d in deliveries} == {
        "d1": ("ignored", "unsupported_event"),
        "d2": ("ignored", "unsupported_event"),
        "d3": ("ignored", "filtered"),
        "d4": ("ignored", "disabled"),
        "d5": ("rejected", "duplicate"),
        "d6": ("rejected", "invalid_payload"),
    }
