"""Refused answers are journaled, never applied (HUM-7, HUM-9): ``human.answer_refused`` for a late answer
(expired, cancelled, already answered with another value) and a foreign responder, on the web inbox and on
Telegram; one event per (request, responder, submission) however often it is retried."""

from __future__ import annotations

import httpx
import pytest
from human_support import (
    ALICE,
    BOB,
    TG_ALICE,
    TelegramDesk,
    events_of,
    exactly,
    requested,
    wait_for_record,
)

from temporality_bus import Bus
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.runs import RunEndHandler
from temporality_protocol import (
    Envelope,
    HumanAnswerRefused,
    HumanRequestState,
    OptionAnswer,
    RunCancelled,
    TextAnswer,
    make_event,
)
from temporality_testing.telegram_emulator import TelegramUser

GITHUB = "ghp_" + "Qw3Er4Ty5Ui6Op7As8Df9" * 2


def _refusals(events: list[Envelope]) -> list[HumanAnswerRefused]:
    return [e.payload(HumanAnswerRefused) for e in events]


async def test_web_second_foreign_and_repeated_refusals_are_journaled_once_each(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    event = requested()
    request_id = str(event.data["request_id"])
    await handler.handle(event)
    url = f"/requests/{request_id}/answer"
    assert (await client.post(url, json={"option_id": "keep-v1"}, headers=ALICE)).status_code == 200

    foreign = await client.post(url, json={"option_id": "drop-v1"}, headers=BOB)  # bob is not the recipient
    assert foreign.status_code == 403
    second = await client.post(url, json={"text": f"actually drop it, token {GITHUB}"}, headers=ALICE)
    assert second.status_code == 409
    again = await client.post(url, json={"text": f"actually drop it, token {GITHUB}"}, headers=ALICE)  # a retry
    assert again.status_code == 409
    same = await client.post(url, json={"option_id": "keep-v1"}, headers=ALICE)  # the identical answer: not refused
    assert same.status_code == 200

    found = await exactly(bus, "human.answer_refused", 2)
    by_reason = {r.reason: r for r in _refusals(found)}
    assert set(by_reason) == {"not_recipient", "already_answered"}
    bob = by_reason["not_recipient"]
    assert (bob.request_id, bob.run_id, bob.recipient, bob.responder, bob.channel) == (
        request_id,
        event.runid,
        "user:alice",
        "user:bob",
        "web",
    )
    assert bob.answer == OptionAnswer(option_id="drop-v1", label="Drop v1")
    alice = by_reason["already_answered"]
    assert alice.responder == "user:alice"
    assert isinstance(alice.answer, TextAnswer)
    assert GITHUB not in alice.answer.value  # redacted by the egress policy
    assert "[REDACTED:github_token]" in alice.answer.value
    assert "already answered by" in alice.detail
    assert all(GITHUB not in e.model_dump_json() for e in found)
    assert len(await exactly(bus, "human.answered")) == 1  # nothing refused was applied


@pytest.mark.usefixtures("consumers")
async def test_web_an_answer_after_expiry_is_journaled_and_not_applied(bus: Bus, client: httpx.AsyncClient) -> None:
    event = requested(expires_in_s=-5)
    request_id = str(event.data["request_id"])
    await bus.publish(event)
    await wait_for_record(bus, request_id, lambda r: r.status is HumanRequestState.EXPIRED and r.expiry_published)

    late = await client.post(f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
    assert late.status_code == 409
    [refused] = _refusals(await exactly(bus, "human.answer_refused"))
    assert refused.reason == "expired"
    assert refused.answer == OptionAnswer(option_id="keep-v1", label="Keep the v1 API")
    assert refused.received_at.tzinfo is not None
    assert await events_of(bus, "human.answered") == []


# ---------------------------------------------------------------------------------------------------- Telegram
TG_CAROL = TelegramUser(3003, "Carol")  # nobody in the directory


async def test_telegram_a_foreign_press_and_a_button_after_cancel_are_journaled(
    bus: Bus, telegram: TelegramDesk
) -> None:
    tg, intake, router = telegram.tg, telegram.intake(), telegram.router
    event = requested(allowed=("user:alice",))
    request_id = str(event.data["request_id"])
    await intake.handle(event)
    message = await tg.wait_for_message(TG_ALICE.id)
    buttons = tg.buttons(message)

    # carol got hold of the message (forwarded): her press is refused and journaled with her Telegram identity
    carol = await tg.press(TG_CAROL, message, buttons[0]["callback_data"])
    assert "recipient" in (await tg.wait_for_callback_answer(carol))["text"]
    [foreign] = _refusals(await exactly(bus, "human.answer_refused"))
    assert (foreign.reason, foreign.responder, foreign.channel) == ("not_recipient", "telegram:3003", "telegram")

    # the run ends: the request is cancelled; alice's press after that is refused and journaled
    assert event.runid is not None
    ended = make_event(RunCancelled(run_id=event.runid, reason="operator"), source="/test", run_id=event.runid)
    await RunEndHandler(bus, router.show_outcome).handle(ended)
    await wait_for_record(bus, request_id, lambda r: r.status is HumanRequestState.CANCELLED)
    late = await tg.press(TG_ALICE, message, buttons[1]["callback_data"])
    assert "cancelled" in (await tg.wait_for_callback_answer(late))["text"]
    refused = _refusals(await exactly(bus, "human.answer_refused", 2))
    cancelled = next(r for r in refused if r.reason == "cancelled")
    assert (cancelled.responder, cancelled.channel) == ("user:alice", "telegram")
    assert cancelled.answer == OptionAnswer(option_id="drop-v1", label="Drop v1")
    assert await events_of(bus, "human.answered") == []
