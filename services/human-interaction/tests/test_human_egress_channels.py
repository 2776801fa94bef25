"""Egress on real channels (HUM-5, SEC-1): the web inbox over HTTP and Telegram through the Bot API emulator
show the redacted, truncated question; a secret never reaches what the channel received, nor the stored
request; ``human.notified`` journals what was redacted (counts, never the secret)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from human_support import (
    ALICE,
    OPTIONS,
    TG_ALICE,
    TelegramDesk,
    events_of,
    requested,
    stored,
    telegram_and_web,
    telegram_first,
)

from temporality_bus import Bus
from temporality_human_interaction.api import create_app
from temporality_human_interaction.channels import WebInboxAdapter
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.egress import EgressPolicy
from temporality_human_interaction.notifications import NotificationHandler
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.settings import Settings
from temporality_protocol import (
    Envelope,
    HumanNotified,
    HumanNotifyRequested,
    HumanOption,
    HumanPolicy,
    HumanRequested,
    make_event,
    new_id,
)
from temporality_protocol.catalog import BUCKET_HUMAN_REQUESTS

GITHUB = "ghp_" + "Zq9Wx8Ec7Rv6Tb5Yn4Um" * 2
DB_URL_PASSWORD = "s3cr3t-db-pw"
PEM_BODY = "MIIEpAIBAAKCAQEAv3pOlTQ"
LONG_TAIL = "lorem ipsum dolor " * 200  # 3,600 characters of context after the secrets

POLICY = EgressPolicy.build(limits={"web": 500, "telegram": 300})


def _asking_with_secrets(**kw: object) -> Envelope:
    event = requested(**kw)  # type: ignore[arg-type]
    payload = event.payload(HumanRequested).model_copy(
        update={
            "question": f"The PR commits {GITHUB} to settings.py. Revoke it before merging?",
            "context": (
                f"settings.py now has DATABASE_URL=postgres://app:{DB_URL_PASSWORD}@db.internal/orders and\n"
                f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----\n{LONG_TAIL}"
            ),
            "options": [*OPTIONS, HumanOption(id="revoke", label=f"Revoke {GITHUB[:4]}… now")],
        }
    )
    return make_event(payload, source="/temporality/run-executor", run_id=payload.run_id, id=new_id("evt"))


SECRETS = (GITHUB, DB_URL_PASSWORD, PEM_BODY)


def _leaks(blob: str) -> list[str]:
    return [s for s in SECRETS if s in blob]


async def _raw_stored(bus: Bus, request_id: str) -> str:
    entry = await (await bus.kv(BUCKET_HUMAN_REQUESTS)).get(request_id)
    assert entry.value is not None
    return entry.value.decode()


# ---------------------------------------------------------------------------------------------------- web inbox
@pytest.fixture
async def web_client(bus: Bus, directory: Directory) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(bus_timeout_s=2.0), bus, directory, egress=POLICY)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://human.test") as c:
        yield c


async def test_the_web_inbox_shows_the_redacted_truncated_question(
    bus: Bus, directory: Directory, web_client: httpx.AsyncClient
) -> None:
    async with WebInboxAdapter() as web:
        web.egress = POLICY
        handler = RequestHandler(bus, directory, {web.name: web}, egress=POLICY)
        event = _asking_with_secrets()
        await handler.handle(event)
    request_id = str(event.data["request_id"])

    inbox = await web_client.get("/inbox", headers=ALICE)
    assert inbox.status_code == 200
    [item] = [r for r in inbox.json()["requests"] if r["id"] == request_id]
    one = await web_client.get(f"/requests/{request_id}", headers=ALICE)
    assert one.status_code == 200
    for shown in (item, one.json()):
        assert _leaks(json.dumps(shown)) == []
        assert "[REDACTED:github_token]" in shown["question"]
        assert "postgres://app:[REDACTED:url_credentials]@db.internal" in shown["context"]
        assert "[REDACTED:private_key]" in shown["context"]
        assert shown["context"].endswith("more characters)")
        assert "… (truncated, " in shown["context"]
        assert len(shown["context"]) < 600  # the web limit (500) plus the marker
        assert [o["id"] for o in shown["options"]] == ["keep-v1", "drop-v1", "revoke"]  # machine values kept

    # the stored request never held the secrets (nothing downstream can show them)
    assert _leaks(await _raw_stored(bus, request_id)) == []
    record = await stored(bus, request_id)
    assert record is not None
    assert record.redactions == {"github_token": 1, "private_key": 1, "url_credentials": 1}
    assert len(record.context) > 3000  # truncation is per channel, at egress; the record keeps it all

    [notified] = await events_of(bus, "human.notified", wait_for=1)
    payload = notified.payload(HumanNotified)
    assert payload.channel == "web"
    assert payload.redacted == {"github_token": 1, "private_key": 1, "url_credentials": 1}
    assert payload.truncated == ["context"]
    assert _leaks(notified.model_dump_json()) == []

    answered = await web_client.post(f"/requests/{request_id}/answer", json={"option_id": "revoke"}, headers=ALICE)
    assert answered.status_code == 200
    assert _leaks(answered.text) == []


# ---------------------------------------------------------------------------------------------------- Telegram
@pytest.fixture
async def telegram(bus: Bus) -> AsyncIterator[TelegramDesk]:
    async with telegram_and_web(bus, telegram_first(fallback=["web"]), egress=POLICY) as desk:
        yield desk


async def test_telegram_receives_only_the_redacted_truncated_question_and_outcome(
    bus: Bus, telegram: TelegramDesk
) -> None:
    tg, directory, adapters = telegram.tg, telegram.directory, telegram.adapters
    handler = telegram.intake(egress=POLICY)
    event = _asking_with_secrets(allowed=("user:alice",))
    await handler.handle(event)
    message = await tg.wait_for_message(TG_ALICE.id)
    text = message["text"]
    assert "[REDACTED:github_token]" in text
    assert "[REDACTED:url_credentials]" in text
    assert "more characters)" in text
    assert "lorem ipsum" in text  # the start of the long tail is kept, the rest cut
    assert len(text) < 1500

    [notified] = await events_of(bus, "human.notified", wait_for=1)
    assert notified.payload(HumanNotified).channel == "telegram"
    assert notified.payload(HumanNotified).redacted == {"github_token": 1, "private_key": 1, "url_credentials": 1}
    assert notified.payload(HumanNotified).truncated == ["context"]

    buttons = tg.buttons(message)
    query = await tg.press(TG_ALICE, message, buttons[2]["callback_data"])
    assert (await tg.wait_for_callback_answer(query))["text"].startswith("Recorded")
    edited = await tg.wait_for_edit(message, lambda m: "Answered by" in m["text"])
    assert "[REDACTED:github_token]" in edited["text"]

    # a notification with a secret in it is redacted too
    note = HumanNotifyRequested(
        notification_id=new_id("hn"),
        run_id="run-egress-1",
        agent="reviewer",
        title="Review PR 42",
        recipient="user:alice",
        message=f"Rotated: the old token {GITHUB} is revoked. " + "details " * 200,
        policy=HumanPolicy(allowed_recipients=["user:alice"]),
        turn=3,
    )
    await NotificationHandler(bus, directory, adapters).handle(make_event(note, source="/test", run_id=note.run_id))
    sent = await tg.wait_for_message(TG_ALICE.id, lambda m: "Rotated" in m["text"])
    assert "[REDACTED:github_token]" in sent["text"]
    assert "more characters)" in sent["text"]

    # nothing the emulator ever received (messages, edits, keyboards) holds a secret
    assert _leaks(json.dumps(list(tg.messages.values()))) == []
