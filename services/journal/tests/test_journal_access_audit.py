"""Refused API access in the audit trail (:mod:`temporality_journal.access`): every 401/403 of the journal's
token check becomes ``api.access_refused``, rate-limited per caller and window, never with the token."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
from journal_support import OPERATOR, OPERATOR_TOKEN, VIEWER, ServedJournal, eventually

from temporality_bus import Bus
from temporality_journal.access import AccessAudit, _Request
from temporality_testing.events import EventLog

Clock = Callable[[], float]
BAD_TOKEN = "a-token-nobody-issued-0123456789abcdef"


async def _entries(client: httpx.AsyncClient, count: int) -> list[dict[str, Any]] | None:
    answer = await client.get("/audit", params={"kind": "access_refusal"}, headers=OPERATOR)
    assert answer.status_code == 200, answer.text
    entries: list[dict[str, Any]] = answer.json()["entries"]
    return entries if len(entries) >= count else None


async def test_refusals_of_the_journal_are_in_the_audit_without_the_token(served_journal: ServedJournal) -> None:
    async with httpx.AsyncClient(base_url=served_journal.url, timeout=20) as client:
        assert (await client.get("/runs")).status_code == 401  # no token
        refused = await client.get("/runs/waiting", headers={"Authorization": f"Bearer {BAD_TOKEN}"})
        assert refused.status_code == 401  # from the same address: counted, not published again
        forbidden = await client.post("/runs/run-x/cancel", headers=VIEWER, json={"reason": "x"})
        assert forbidden.status_code == 403
        entries = await eventually(lambda: _entries(client, 2), what="the two first refusals in /audit")
        by_status = {e["details"]["status"]: e for e in entries}
        assert set(by_status) == {401, 403}
        first = by_status[401]
        assert (first["details"]["reason"], first["details"]["path"], first["details"]["count"]) == (
            "unauthorized",
            "/runs",
            1,
        )
        assert first["actor"] == "address:127.0.0.1"
        assert first["summary"] == "401 unauthorized GET /runs for 127.0.0.1"
        denied = by_status[403]
        assert (denied["actor"], denied["details"]["principal"], denied["details"]["role_needed"]) == (
            "token:board",
            "board",
            "operator",
        )
        assert denied["details"]["path"] == "/runs/run-x/cancel"
        # the operator's own successful reads are not refusals; and no token is anywhere in the trail
        everything = (await client.get("/audit", headers=OPERATOR)).text
        assert BAD_TOKEN not in everything
        assert OPERATOR_TOKEN not in everything
        assert "journal-test-viewer-token" not in everything


async def test_rate_limited_per_caller_and_window(bus: Bus, event_log: EventLog) -> None:
    now = [1_000_020.0]  # window 16667 of 60 s, second 0
    audit = AccessAudit(bus, window_s=60, max_callers=2, clock=lambda: now[0])
    scanner = _Request("GET", "/runs", "10.0.0.9")
    for _ in range(500):  # a scanner: one event at once, then its total when the window ends
        audit.refused(status=401, reason="invalid_token", request=scanner)
    audit.refused(status=403, reason="forbidden", request=_Request("POST", "/runs/r/cancel", "10.0.0.1"), principal="b")
    for n in range(50):  # more callers than max_callers: one event for all of them
        audit.refused(status=401, reason="unauthorized", request=_Request("GET", "/", f"10.1.0.{n}"))
    await audit.drain()
    firsts = await event_log.wait_for("api.access_refused", count=3)
    assert sorted((e.data["address"], e.data["count"]) for e in firsts) == [
        ("*", 1),
        ("10.0.0.1", 1),
        ("10.0.0.9", 1),
    ]
    now[0] += 60  # the window ended: the totals of those with more refusals than reported
    audit.flush()
    await audit.drain()
    events = await event_log.wait_for("api.access_refused", count=5)
    totals = sorted((e.data["address"], e.data["count"], e.data["reason"]) for e in events[3:])
    assert totals == [("*", 50, "many_callers"), ("10.0.0.9", 500, "invalid_token")]
    await event_log.caught_up()
    assert len(event_log.of_type("api.access_refused")) == 5  # 551 refusals, 5 events
    assert all(BAD_TOKEN not in json.dumps(e.data) for e in events)
    # the next window: the scanner gets one event again
    audit.refused(status=401, reason="invalid_token", request=scanner)
    await audit.drain()
    (again,) = [e for e in await event_log.wait_for("api.access_refused", count=6) if e not in events]
    assert (again.data["address"], again.data["count"]) == ("10.0.0.9", 1)
