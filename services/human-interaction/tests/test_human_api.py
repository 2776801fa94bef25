"""The web inbox and answer binding over HTTP (HUM-4, HUM-6): who may answer, exactly once."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from human_support import (
    ALICE,
    BOB,
    count_requests,
    events_of,
    exactly,
    lose_answer_publish,
    requested,
    stored,
    timer_messages,
    wait_for_record,
)

from temporality_bus import Bus
from temporality_human_interaction.api import create_app
from temporality_human_interaction.channels.render import question_text
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.settings import Settings
from temporality_protocol import HumanAnswered, TimeoutPolicy, derive_id
from temporality_protocol.catalog import TIMER_FIRED_HUMAN, TIMER_SCHEDULE_HUMAN
from temporality_testing import NatsServer
from temporality_testing.kv_reads import kv_read_key


async def _ask(handler: RequestHandler, recipient: str = "user:alice", **kwargs: object) -> str:
    event = requested(recipient=recipient, **kwargs)  # type: ignore[arg-type]
    await handler.handle(event)
    return str(event.data["request_id"])


def _answer_url(request_id: str) -> str:
    return f"/requests/{request_id}/answer"


async def test_inbox_lists_only_the_token_owners_pending_requests_newest_first(
    client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    older = await _ask(handler, "user:alice")
    newer = await _ask(handler, "user:alice")
    bobs = await _ask(handler, "user:bob")
    answered = await _ask(handler, "user:alice")
    assert (await client.post(_answer_url(answered), json={"option_id": "keep-v1"}, headers=ALICE)).status_code == 200

    alice = (await client.get("/inbox", headers=ALICE)).json()
    assert alice["user"] == "user:alice"
    assert [r["id"] for r in alice["requests"]] == [newer, older]
    item = alice["requests"][0]
    assert set(item) == {
        "id", "run_id", "title", "question", "context", "reason", "reason_kind", "options", "allow_free_text",
        "channel", "created_at", "expires_at", "at_deadline", "waiting_s", "source_link", "answer_schema", "form",
    }  # fmt: skip
    assert item["waiting_s"] >= 0
    bob = (await client.get("/inbox", headers=BOB)).json()
    assert [r["id"] for r in bob["requests"]] == [bobs]


async def test_each_inbox_item_says_what_happens_at_its_deadline_as_the_chats_do(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    """HUM-5: the web inbox says what the chats' last line says -- the same sentence, from the question's policy --
    and ``GET /requests/{id}`` does too."""
    default = await _ask(handler, on_timeout=TimeoutPolicy(action="default", default_option="keep-v1"))
    cancel = await _ask(handler, on_timeout=TimeoutPolicy(action="cancel"))
    fail = await _ask(handler)

    items = {r["id"]: r for r in (await client.get("/inbox", headers=ALICE)).json()["requests"]}
    expected = {
        default: ("default", "keep-v1", "I go with “Keep the v1 API”"),
        cancel: ("cancel", None, "the task is cancelled"),
        fail: ("fail", None, "the task stops without your answer"),
    }
    for request_id, (action, option, outcome) in expected.items():
        record = await stored(bus, request_id)
        assert record is not None
        at_deadline = items[request_id]["at_deadline"]
        deadline = record.expires_at.strftime("%Y-%m-%d %H:%M UTC")
        assert at_deadline == {
            "action": action,
            "default_option": option,
            "text": f"No answer by {deadline} → {outcome}.",
        }
        assert at_deadline["text"] in question_text(record)  # the line the Telegram / Matrix message ends with
    mine = (await client.get(f"/requests/{default}", headers=ALICE)).json()
    assert mine["at_deadline"] == items[default]["at_deadline"]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer nope-not-a-token"},
        {"Authorization": "Basic YWxpY2U6eA=="},
        {"Authorization": "Bearer"},
    ],
)
async def test_bad_or_missing_token_is_401(
    client: httpx.AsyncClient, handler: RequestHandler, headers: dict[str, str]
) -> None:
    request_id = await _ask(handler)
    for response in (
        await client.get("/inbox", headers=headers),
        await client.get(f"/requests/{request_id}", headers=headers),
        await client.post(_answer_url(request_id), json={"option_id": "keep-v1"}, headers=headers),
    ):
        assert response.status_code == 401
        assert response.json()["error"] == "unauthorized"
        assert response.headers["www-authenticate"] == "Bearer"


async def test_get_request_only_for_its_recipient(client: httpx.AsyncClient, handler: RequestHandler) -> None:
    request_id = await _ask(handler, "user:alice")
    mine = await client.get(f"/requests/{request_id}", headers=ALICE)
    assert mine.status_code == 200
    assert mine.json()["status"] == "pending"
    assert mine.json()["recipient"] == "user:alice"
    theirs = await client.get(f"/requests/{request_id}", headers=BOB)
    assert theirs.status_code == 403
    assert theirs.json()["error"] == "not_recipient"
    missing = await client.get("/requests/hreq-missing", headers=ALICE)
    assert missing.status_code == 404
    assert missing.json() == {"error": "unknown_request", "detail": "there is no request hreq-missing"}


async def test_answer_by_option(bus: Bus, client: httpx.AsyncClient, handler: RequestHandler) -> None:
    request_id = await _ask(handler)
    response = await client.post(_answer_url(request_id), json={"option_id": "keep-v1"}, headers=ALICE)
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "answered"
    assert body["answer"] == {"type": "option", "option_id": "keep-v1", "label": "Keep the v1 API"}
    assert body["responder"] == "user:alice"

    [event] = await events_of(bus, "human.answered", wait_for=1)
    answered = event.payload(HumanAnswered)
    assert event.id == derive_id("evt", request_id, "answered")
    assert event.source == "/temporality/human-interaction"
    assert answered.responder == "user:alice"
    assert answered.channel == "web"
    assert answered.answer.type == "option"
    assert answered.answer.option_id == "keep-v1"
    assert answered.waited_s >= 0
    record = await stored(bus, request_id)
    assert record is not None
    assert record.answer_published
    assert (await client.get("/inbox", headers=ALICE)).json()["requests"] == []


async def test_an_answer_reads_its_request_once(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Binding reads the record (its compare-and-set), and marking the answer published starts from the record
    as bound instead of reading it back; the identical answer again reads it once and writes nothing."""
    request_id = await _ask(handler)
    sent = count_requests(bus, monkeypatch)
    response = await client.post(_answer_url(request_id), json={"option_id": "keep-v1"}, headers=ALICE)
    assert response.status_code == 200
    reads = [key for s, p in sent if (key := kv_read_key(s, p, "human-requests")) is not None]
    assert reads == [request_id]
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status == "answered"
    assert record.answer_published
    await exactly(bus, "human.answered", 1)

    sent.clear()
    again = await client.post(_answer_url(request_id), json={"option_id": "keep-v1"}, headers=ALICE)
    assert again.status_code == 200
    assert again.json()["already_recorded"] is True
    assert len([s for s, p in sent if kv_read_key(s, p, "human-requests") is not None]) == 1
    assert await stored(bus, request_id) == record


async def test_answer_by_free_text(bus: Bus, client: httpx.AsyncClient, handler: RequestHandler) -> None:
    request_id = await _ask(handler)
    response = await client.post(_answer_url(request_id), json={"text": "  Keep it until March.  "}, headers=ALICE)
    assert response.status_code == 200
    assert response.json()["answer"] == {"type": "text", "value": "Keep it until March."}
    [event] = await events_of(bus, "human.answered", wait_for=1)
    assert event.payload(HumanAnswered).answer.type == "text"


async def test_wrong_user_is_403_and_nothing_is_bound(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    request_id = await _ask(handler, "user:alice")
    response = await client.post(_answer_url(request_id), json={"option_id": "keep-v1"}, headers=BOB)
    assert response.status_code == 403
    assert response.json() == {"error": "not_recipient", "detail": "only the recipient may answer"}
    read = await client.get(f"/requests/{request_id}", headers=BOB)
    assert read.status_code == 403
    assert read.json() == {"error": "not_recipient", "detail": "only the recipient may read it"}
    record = await stored(bus, request_id)
    assert record is not None
    assert record.pending


async def test_second_answer_is_409_and_only_one_answered_event(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    request_id = await _ask(handler)
    first = await client.post(_answer_url(request_id), json={"option_id": "keep-v1"}, headers=ALICE)
    assert first.status_code == 200
    assert first.json()["already_recorded"] is False
    await wait_for_record(bus, request_id, lambda r: r.answer_published)
    for body in ({"option_id": "drop-v1"}, {"text": "changed my mind"}):
        again = await client.post(_answer_url(request_id), json=body, headers=ALICE)
        assert again.status_code == 409
        assert again.json()["error"] == "already_answered"
        assert "user:alice" in again.json()["detail"]
    # The identical answer from the same person, after it was announced: idempotent 200, "already recorded".
    same = await client.post(_answer_url(request_id), json={"option_id": "keep-v1"}, headers=ALICE)
    assert same.status_code == 200, same.text
    assert same.json()["already_recorded"] is True
    assert same.json()["answer"]["option_id"] == "keep-v1"
    await exactly(bus, "human.answered", 1)


@pytest.mark.parametrize(
    ("first", "second"),
    [({"option_id": "keep-v1"}, {"option_id": "drop-v1"}), ({"option_id": "keep-v1"}, {"option_id": "keep-v1"})],
)
async def test_racing_answers_one_wins(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler, first: dict[str, str], second: dict[str, str]
) -> None:
    """Of two racing answers exactly one is bound and announced once.

    Different answers: one 200, one 409. The *identical* answer twice from the same person is idempotent
    whatever the timing: both 200, one of them ``already_recorded``. Either way: one bound answer, one event.
    """
    request_id = await _ask(handler)
    responses = await asyncio.gather(
        client.post(_answer_url(request_id), json=first, headers=ALICE),
        client.post(_answer_url(request_id), json=second, headers=ALICE),
    )
    statuses = sorted(r.status_code for r in responses)
    if first != second:
        assert statuses == [200, 409], [r.text for r in responses]
    else:
        assert statuses == [200, 200], [r.text for r in responses]
        assert sorted(r.json()["already_recorded"] for r in responses) == [False, True]
    for refused in (r for r in responses if r.status_code != 200):
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"] == "already_answered"
    bodies = [r.json() for r in responses if r.status_code == 200]
    assert all(b["status"] == "answered" and b["responder"] == "user:alice" for b in bodies), bodies
    answers = [b["answer"] for b in bodies]
    assert all(a == answers[0] for a in answers), answers  # every 200 carries the one bound answer
    winner = answers[0]

    record = await wait_for_record(bus, request_id, lambda r: r.answer_published)
    assert record.answer is not None
    assert record.answer.model_dump() == winner
    assert record.responder == "user:alice"
    [event] = await exactly(bus, "human.answered", 1)  # never a second human.answered
    assert event.id == derive_id("evt", request_id, "answered")
    assert event.payload(HumanAnswered).answer.model_dump() == winner


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"option_id": "maybe"}, "not an option"),
        ({"option_id": "keep-v1", "text": "both"}, "give exactly one of option_id or text"),
        ({}, "give exactly one of option_id or text"),
        ({"text": "   "}, "at least 1 character"),
        ({"option_id": "keep-v1", "extra": 1}, "extra"),
        (["keep-v1"], "dictionary"),
    ],
)
async def test_invalid_answers_are_422(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler, body: object, fragment: str
) -> None:
    request_id = await _ask(handler)
    response = await client.post(_answer_url(request_id), json=body, headers=ALICE)
    assert response.status_code == 422
    assert response.json()["error"] == "invalid_answer"
    assert fragment in response.json()["detail"]
    assert "Value error" not in response.json()["detail"]  # pydantic's prefix is not the service's wording
    record = await stored(bus, request_id)
    assert record is not None
    assert record.pending


async def test_free_text_when_not_allowed_is_422(client: httpx.AsyncClient, handler: RequestHandler) -> None:
    request_id = await _ask(handler, allow_free_text=False)
    response = await client.post(_answer_url(request_id), json={"text": "neither"}, headers=ALICE)
    assert response.status_code == 422
    assert "free text" in response.json()["detail"]


async def test_answer_to_unknown_request_is_404(client: httpx.AsyncClient) -> None:
    response = await client.post(_answer_url("hreq-missing"), json={"option_id": "keep-v1"}, headers=ALICE)
    assert response.status_code == 404
    assert response.json()["error"] == "unknown_request"


async def test_malformed_json_is_400_and_oversized_body_is_413(
    client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    request_id = await _ask(handler)
    headers = {**ALICE, "Content-Type": "application/json"}
    malformed = await client.post(_answer_url(request_id), content=b'{"option_id": ', headers=headers)
    assert malformed.status_code == 400
    assert malformed.json()["error"] == "malformed_json"
    huge = b'{"text": "' + b"x" * (64 * 1024) + b'"}'
    too_big = await client.post(_answer_url(request_id), content=huge, headers=headers)
    assert too_big.status_code == 413
    assert too_big.json()["error"] == "body_too_large"

    async def chunks() -> object:  # no Content-Length: the limit holds while streaming
        for _ in range(80):
            yield b"x" * 1024

    streamed = await client.post(_answer_url(request_id), content=chunks(), headers=headers)  # type: ignore[arg-type]
    assert streamed.status_code == 413


async def test_unknown_route_is_a_json_error(client: httpx.AsyncClient) -> None:
    response = await client.get("/nowhere")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


async def test_lost_publish_is_repaired_by_the_same_answer(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    request_id = await _ask(handler)
    await lose_answer_publish(bus, client, request_id)
    assert await events_of(bus, "human.answered") == []

    repaired = await client.post(_answer_url(request_id), json={"option_id": "keep-v1"}, headers=ALICE)
    assert repaired.status_code == 200
    assert repaired.json()["answer"]["option_id"] == "keep-v1"
    record = await stored(bus, request_id)
    assert record is not None
    assert record.answer_published
    assert repaired.json()["already_recorded"] is True
    again = await client.post(_answer_url(request_id), json={"option_id": "keep-v1"}, headers=ALICE)
    assert again.status_code == 200
    assert again.json()["already_recorded"] is True
    assert (await client.post(_answer_url(request_id), json={"option_id": "drop-v1"}, headers=ALICE)).status_code == 409
    await exactly(bus, "human.answered", 1)


async def test_lost_publish_is_repaired_by_a_different_second_answer_which_is_still_refused(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    request_id = await _ask(handler)
    await lose_answer_publish(bus, client, request_id, "keep-v1")

    other = await client.post(_answer_url(request_id), json={"option_id": "drop-v1"}, headers=ALICE)
    assert other.status_code == 409
    assert other.json()["error"] == "already_answered"
    assert "user:alice" in other.json()["detail"]
    [event] = await events_of(bus, "human.answered", wait_for=1)
    assert event.id == derive_id("evt", request_id, "answered")
    assert event.payload(HumanAnswered).answer.model_dump() == {
        "type": "option", "option_id": "keep-v1", "label": "Keep the v1 API",
    }  # fmt: skip
    assert event.payload(HumanAnswered).channel == "web"
    record = await stored(bus, request_id)
    assert record is not None
    assert record.answer_published
    assert record.answer is not None
    assert record.answer.model_dump()["option_id"] == "keep-v1"

    assert (await client.post(_answer_url(request_id), json={"text": "no, really"}, headers=ALICE)).status_code == 409
    same = await client.post(_answer_url(request_id), json={"option_id": "keep-v1"}, headers=ALICE)
    assert (same.status_code, same.json()["already_recorded"]) == (200, True)
    await exactly(bus, "human.answered", 1)


@pytest.mark.usefixtures("deadline_consumer")
async def test_lost_publish_is_repaired_by_the_answers_repair_timer(
    bus: Bus, directory: Directory, handler: RequestHandler
) -> None:
    request_id = await _ask(handler)  # expires in an hour: only the repair timer can fire within the test
    app = create_app(Settings(bus_timeout_s=2.0, answer_repair_after_s=1), bus, directory)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://human.test") as client:
        await lose_answer_publish(bus, client, request_id, "keep-v1")

    [event] = await events_of(bus, "human.answered", wait_for=1)
    assert event.id == derive_id("evt", request_id, "answered")
    assert event.payload(HumanAnswered).answer.model_dump()["option_id"] == "keep-v1"
    assert event.payload(HumanAnswered).responder == "user:alice"
    record = await wait_for_record(bus, request_id, lambda r: r.answer_published)
    assert record.status == "answered"
    # The repair timer fired on its own subject; the deadline timer is untouched (still armed, not fired).
    assert await timer_messages(bus, f"{TIMER_FIRED_HUMAN}.{request_id}.repair") == 1
    assert await timer_messages(bus, f"{TIMER_FIRED_HUMAN}.{request_id}") == 0
    assert await timer_messages(bus, f"{TIMER_SCHEDULE_HUMAN}.{request_id}") == 1
    assert await events_of(bus, "human.expired") == []
    await exactly(bus, "human.answered", 1)


async def test_an_answer_arms_a_repair_timer_on_its_own_subject(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    request_id = await _ask(handler)
    assert (await client.post(_answer_url(request_id), json={"option_id": "keep-v1"}, headers=ALICE)).status_code == 200
    assert await timer_messages(bus, f"{TIMER_SCHEDULE_HUMAN}.{request_id}.repair") == 1
    assert await timer_messages(bus, f"{TIMER_SCHEDULE_HUMAN}.{request_id}") == 1  # the deadline is not replaced


@pytest.mark.parametrize("request_id", ["a*b", "a b", "a>b", "a.b", "x" * 300, "hr-" + "0" * 200])
async def test_an_id_that_cannot_be_a_request_id_is_404(client: httpx.AsyncClient, request_id: str) -> None:
    for response in (
        await client.get(f"/requests/{request_id}", headers=ALICE),
        await client.post(_answer_url(request_id), json={"option_id": "keep-v1"}, headers=ALICE),
    ):
        assert response.status_code == 404
        assert response.json()["error"] == "unknown_request"


async def test_bus_down_is_503_not_a_hang_and_the_same_answer_succeeds_once_it_is_back(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler, nats_server: NatsServer
) -> None:
    request_id = await _ask(handler)
    nats_server.stop(hold_port=True)  # no other test's server can take the port (and answer) meanwhile
    async with asyncio.timeout(10):
        inbox = await client.get("/inbox", headers=ALICE)
        answer = await client.post(_answer_url(request_id), json={"option_id": "keep-v1"}, headers=ALICE)
    assert inbox.status_code == 503
    assert answer.status_code == 503
    assert answer.json()["error"] == "bus_unavailable"
    for refused in (inbox, answer):  # as the webhook's 503: a client (the console, a bot) knows when to retry
        assert int(refused.headers["Retry-After"]) >= 1

    # The same server (port, store) comes back; the client reconnects. The timed-out CAS may still be
    # applied from the reconnect buffer: either way the identical answer now binds (or is repaired) once.
    nats_server.requested_port = nats_server.port
    nats_server.start()
    async with asyncio.timeout(30):
        while True:
            retry = await client.post(_answer_url(request_id), json={"option_id": "keep-v1"}, headers=ALICE)
            if retry.status_code != 503:
                break
            await asyncio.sleep(0.1)  # not a hot loop on the shared machine while the client reconnects
    assert retry.status_code == 200
    await exactly(bus, "human.answered", 1)


async def test_a_model_validators_refusal_is_the_whole_detail(
    client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    """The 422's detail is the service's sentence, without pydantic's "Value error, " before it."""
    request_id = await _ask(handler)
    response = await client.post(_answer_url(request_id), json={}, headers=ALICE)
    assert response.status_code == 422
    assert response.json() == {"error": "invalid_answer", "detail": "give exactly one of option_id or text"}
