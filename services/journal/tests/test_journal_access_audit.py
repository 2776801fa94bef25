"""Refused API access in the audit trail: every 401/403 of the journal's token check becomes
``api.access_refused`` (:mod:`temporality_service.audit`, whose own tests cover the rate limit), never with the
token."""

from __future__ import annotations

from typing import Any

import httpx
from journal_support import OPERATOR, OPERATOR_TOKEN, VIEWER, ServedJournal, eventually

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
        assert refused.status_code == 401  # the same address, another path and reason: an entry of its own
        forbidden = await client.post("/runs/run-x/cancel", headers=VIEWER, json={"reason": "x"})
        assert forbidden.status_code == 403
        entries = await eventually(lambda: _entries(client, 3), what="the three refusals in /audit")
        assert len(entries) == 3
        by_path = {e["details"]["path"]: e for e in entries}
        assert set(by_path) == {"/runs", "/runs/waiting", "/runs/run-x/cancel"}
        assert by_path["/runs/waiting"]["details"]["status"] == 401
        assert by_path["/runs/waiting"]["details"]["reason"] != "unauthorized"  # a bad token, not none
        by_status = {e["details"]["status"]: e for e in entries if e["details"]["path"] != "/runs/waiting"}
        assert set(by_status) == {401, 403}
        first = by_status[401]
        assert (first["details"]["reason"], first["details"]["path"], first["details"]["count"]) == (
            "unauthorized",
            "/runs",
            1,
        )
        assert first["actor"] == "address:127.0.0.1"
        assert first["summary"] == "journal: 401 unauthorized GET /runs for 127.0.0.1"
        assert first["details"]["service"] == "journal"
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
