"""The ``/human/`` inbox proxy (:mod:`temporality_journal.human`) against the real human-interaction service.

human-interaction runs in-process on a real port over the test's nats-server (``journal_support.serve_human``:
alice and bob on the web inbox); the journal is the served service with ``TEMPORALITY_JOURNAL_HUMAN_URL``
pointing at it. A ``human.requested`` published to NATS reaches both: human-interaction stores the request
(the inbox), the journal records the event (the ``on_timeout`` it adds).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from journal_support import (
    ALICE_INBOX,
    BOB_INBOX,
    VIEWER,
    ServedJournal,
    eventually,
)

from temporality_protocol import (
    HumanOption,
    HumanPolicy,
    HumanRequested,
)
from temporality_protocol.events import Escalate, TimeoutPolicy


@pytest.fixture
async def inbox_journal(served_journal_with_human: ServedJournal) -> ServedJournal:
    return served_journal_with_human


async def _ask_bob(served: ServedJournal, **policy: Any) -> str:
    """Publish a ``human.requested`` to bob (options keep / drop, the given timeout policy); its request id."""
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    request_id = f"hreq-{uuid.uuid4().hex[:12]}"
    data = HumanRequested(
        request_id=request_id,
        run_id=run_id,
        agent="reviewer",
        title="Review PR 42",
        recipient="user:bob",
        question="Keep the v1 field?",
        context="The PR removes `total`; two clients read it.",
        options=[
            HumanOption(id="keep-v1", label="Keep v1", consequence="the field stays"),
            HumanOption(id="drop", label="Drop it"),
        ],
        timeout_s=3600,
        expires_at=datetime.now(UTC) + timedelta(hours=1),
        policy=HumanPolicy(allowed_recipients=["user:bob"], on_timeout=TimeoutPolicy(**policy)),
        turn=1,
    )
    await served.ask(data)
    return request_id


async def _pending(client: httpx.AsyncClient, request_id: str) -> dict[str, Any] | None:
    """bob's pending request ``request_id`` through the proxy, once human-interaction has stored it."""
    answer = await client.get("/human/inbox", headers=BOB_INBOX)
    assert answer.status_code == 200, answer.text
    return next((r for r in answer.json()["requests"] if r["id"] == request_id), None)


async def test_a_person_reads_and_answers_their_own_questions_through_the_journal(inbox_journal: ServedJournal) -> None:
    request_id = await _ask_bob(
        inbox_journal, action="default", default_option="keep-v1", escalate=Escalate(to="user:alice", after_s=1800)
    )
    async with httpx.AsyncClient(base_url=inbox_journal.url, timeout=20) as client:
        item = await eventually(lambda: _pending(client, request_id), what="bob's inbox to hold the request")
        assert (item["question"], [o["id"] for o in item["options"]]) == ("Keep the v1 field?", ["keep-v1", "drop"])
        # What happens on timeout, from the journal's human.requested (human-interaction does not say).
        assert item["on_timeout"]["action"] == "default"
        assert item["on_timeout"]["default_label"] == "Keep v1"
        assert item["on_timeout"]["summary"] == (
            "Before the deadline it is also sent to user:alice after 30 min. Without an answer by the deadline "
            'the run continues with "Keep v1".'
        )
        one = await client.get(f"/human/requests/{request_id}", headers=BOB_INBOX)
        assert one.status_code == 200, one.text
        assert (one.json()["status"], one.json()["on_timeout"]["action"]) == ("pending", "default")

        # Only the recipient: alice sees none of it, and may neither read nor answer it.
        alice_inbox = await client.get("/human/inbox", headers=ALICE_INBOX)
        assert alice_inbox.status_code == 200
        assert alice_inbox.json()["user"] == "user:alice"
        assert request_id not in [r["id"] for r in alice_inbox.json()["requests"]]
        foreign = await client.get(f"/human/requests/{request_id}", headers=ALICE_INBOX)
        assert (foreign.status_code, foreign.json()["error"]) == (403, "not_recipient")
        foreign = await client.post(
            f"/human/requests/{request_id}/answer", headers=ALICE_INBOX, json={"option_id": "drop"}
        )
        assert (foreign.status_code, foreign.json()["error"]) == (403, "not_recipient")

        wrong = await client.post(f"/human/requests/{request_id}/answer", headers=BOB_INBOX, json={"option_id": "x"})
        assert (wrong.status_code, wrong.json()["error"]) == (422, "invalid_answer")
        answered = await client.post(
            f"/human/requests/{request_id}/answer", headers=BOB_INBOX, json={"option_id": "keep-v1"}
        )
        assert answered.status_code == 200, answered.text
        assert (answered.json()["status"], answered.json()["already_recorded"]) == ("answered", False)
        again = await client.post(
            f"/human/requests/{request_id}/answer", headers=BOB_INBOX, json={"option_id": "keep-v1"}
        )
        assert (again.status_code, again.json()["already_recorded"]) == (200, True)
        other = await client.post(f"/human/requests/{request_id}/answer", headers=BOB_INBOX, json={"text": "drop"})
        assert (other.status_code, other.json()["error"]) == (409, "already_answered")
        unknown = await client.get("/human/requests/hreq-nobody-knows", headers=BOB_INBOX)
        assert (unknown.status_code, unknown.json()["error"]) == (404, "unknown_request")


async def test_a_bearer_is_required_and_human_interaction_judges_it(inbox_journal: ServedJournal) -> None:
    async with httpx.AsyncClient(base_url=inbox_journal.url, timeout=20) as client:
        for headers in ({}, {"Authorization": "Basic Ym9iOng="}, {"Authorization": "Bearer"}):
            answer = await client.get("/human/inbox", headers=headers)
            assert (answer.status_code, answer.json()["error"]) == (401, "unauthorized"), headers
            assert "inbox token" in answer.json()["detail"]
            assert answer.headers["www-authenticate"] == "Bearer"
        # An API role token is not an inbox token: human-interaction refuses it, the journal passes that on.
        refused = await client.get("/human/inbox", headers=VIEWER)
        assert refused.status_code == 401
        assert "inbox token is not valid" in refused.json()["detail"]
        assert refused.headers["www-authenticate"] == "Bearer"


async def test_only_the_allow_listed_inbox_routes_are_forwarded(inbox_journal: ServedJournal) -> None:
    async with httpx.AsyncClient(base_url=inbox_journal.url, timeout=20) as client:
        for method, path in [
            ("GET", "/human/directory/users"),
            ("GET", "/human/healthz"),
            ("GET", "/human/requests"),
            ("GET", "/human/requests/a%2F..%2F..%2Fdirectory"),
            ("GET", "/human/requests/%2E%2E"),
            ("GET", "/human/requests/bad.id"),
            ("GET", "/human/requests/" + "x" * 129),
            ("POST", "/human/requests/abc/answer/more"),
        ]:
            answer = await client.request(method, path, headers=BOB_INBOX)
            assert (answer.status_code, answer.json()["error"]) == (404, "human_route_not_found"), (method, path)
        for method, path, allowed in [
            ("POST", "/human/inbox", "GET"),
            ("DELETE", "/human/requests/abc", "GET"),
            ("GET", "/human/requests/abc/answer", "POST"),
        ]:
            answer = await client.request(method, path, headers=BOB_INBOX)
            assert (answer.status_code, answer.headers.get("allow")) == (405, allowed), (method, path)


async def test_without_a_human_url_the_inbox_routes_are_503(served_journal: ServedJournal) -> None:
    async with httpx.AsyncClient(base_url=served_journal.url, timeout=20) as client:
        answer = await client.get("/human/inbox", headers=BOB_INBOX)
    assert (answer.status_code, answer.json()["error"]) == (503, "human_not_configured")
    assert "TEMPORALITY_JOURNAL_HUMAN_URL" in answer.json()["detail"]
