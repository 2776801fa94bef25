"""An accepted answer is redacted before it is stored and published (SEC-1, issue 11): a secret a person pastes into
free text or into a form's field is ``[REDACTED:<kind>]`` in the record, in ``human.answered`` on the bus (what the
journal and the agent get) and in what the channel says back -- on the web inbox API and in a chat (Telegram), the
one binding every channel goes through. Before, the HTTP answer showed the marker while the event and the record
held the token."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
from human_support import (
    ALICE,
    TG_ALICE,
    TelegramDesk,
    events_of,
    exactly,
    requested,
    stored,
    wait_for_record,
)

from temporality_bus import Bus
from temporality_human_interaction.api import create_app
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.egress import EgressPolicy
from temporality_human_interaction.records import HumanRequestRecord, open_store
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.settings import Settings
from temporality_protocol import Envelope, HumanAnswered, HumanOption, HumanRequestState, TextAnswer, forms

#: A GitHub token as a person would paste it (built, so no scanner flags this file).
TOKEN = "ghp_" + "abcdefghijklmnopqrstuvwxyz0123456789"
MARK = "[REDACTED:github_token]"


def _answered(events: list[Envelope]) -> HumanAnswered:
    [event] = events
    assert TOKEN not in json.dumps(event.data)
    return event.payload(HumanAnswered)


async def _bound(bus: Bus, request_id: str) -> HumanRequestRecord:
    record = await wait_for_record(bus, request_id, lambda r: r.status is HumanRequestState.ANSWERED)
    assert TOKEN not in record.model_dump_json()
    return record


async def test_a_free_text_answer_on_the_web_inbox_is_redacted_in_the_record_the_event_and_the_reply(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    event = requested()
    request_id = str(event.data["request_id"])
    await handler.handle(event)
    url = f"/requests/{request_id}/answer"
    text = f"Keep v1; token {TOKEN}"

    reply = await client.post(url, json={"text": text}, headers=ALICE)
    assert reply.status_code == 200, reply.text
    assert reply.json()["answer"] == {"type": "text", "value": f"Keep v1; token {MARK}"}

    answered = _answered(await exactly(bus, "human.answered"))
    assert answered.answer == TextAnswer(value=f"Keep v1; token {MARK}")
    record = await _bound(bus, request_id)
    assert record.answer == answered.answer
    assert record.answer_redactions == answered.redacted == {"github_token": 1}  # counted, never the secret
    shown = await client.get(f"/requests/{request_id}", headers=ALICE)
    assert shown.json()["answer"] == reply.json()["answer"]

    # the identical answer again is still the same answer (already recorded), not a refusal
    again = await client.post(url, json={"text": text}, headers=ALICE)
    assert again.status_code == 200, again.text
    assert again.json()["already_recorded"] is True
    assert len(await exactly(bus, "human.answered")) == 1


async def test_an_answer_without_a_secret_is_stored_as_given(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    event = requested()
    request_id = str(event.data["request_id"])
    await handler.handle(event)
    reply = await client.post(f"/requests/{request_id}/answer", json={"text": "Keep v1 until June"}, headers=ALICE)
    assert reply.status_code == 200, reply.text
    answered = _answered(await exactly(bus, "human.answered"))
    assert answered.answer == TextAnswer(value="Keep v1 until June")
    assert answered.redacted == {}
    record = await _bound(bus, request_id)
    assert record.answer_redactions == {}


async def test_an_older_versions_raw_answer_repeated_is_already_recorded_and_a_late_answer_is_kept_redacted(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    event = requested()
    request_id = str(event.data["request_id"])
    await handler.handle(event)
    raw = f"Keep v1; token {TOKEN}"
    # bound and announced as a version that did not redact answers left it: the token in the record
    store = await open_store(bus)
    await store.modify(
        request_id,
        lambda r: r.moved_to(
            HumanRequestState.ANSWERED,
            answer=TextAnswer(value=raw),
            responder="user:alice",
            answered_at=datetime.now(UTC),
            answer_channel="web",
            answer_published=True,
        ),
    )
    url = f"/requests/{request_id}/answer"

    again = await client.post(url, json={"text": raw}, headers=ALICE)
    assert again.status_code == 200, again.text
    assert again.json()["already_recorded"] is True
    assert again.json()["answer"]["value"] == f"Keep v1; token {MARK}"  # shown redacted

    late = await client.post(url, json={"text": f"Drop v1 after all; {TOKEN}"}, headers=ALICE)
    assert late.status_code == 409, late.text
    record = await wait_for_record(bus, request_id, lambda r: bool(r.late_answers))
    assert [a.answer for a in record.late_answers] == [TextAnswer(value=f"Drop v1 after all; {MARK}")]
    assert await events_of(bus, "human.answered") == []


DECLINE = HumanOption(id="decline", label="Decline", consequence="the tool is told you declined")
#: A deployment's own pattern, added after the request below was stored (its intake used the built-in ones only).
PLAN = EgressPolicy.build(extra_patterns={"plan_code": r"PLAN-[0-9]{4}"})
#: A form with a free text field, a closed field whose values the new pattern matches, a list of texts, a number.
FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "note": {"type": "string", "maxLength": 200},
        "plan": {"type": "string", "enum": ["PLAN-0001", "PLAN-0002"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "replicas": {"type": "integer", "minimum": 1},
    },
    "required": ["note", "replicas"],
}


async def test_a_form_answer_keeps_fitting_the_form_with_every_string_value_redacted(
    bus: Bus, settings: Settings, directory: Directory, handler: RequestHandler
) -> None:
    event = requested(answer_schema=FORM, options=[DECLINE])
    request_id = str(event.data["request_id"])
    await handler.handle(event)
    record = await stored(bus, request_id)
    assert record is not None
    assert record.answer_schema is not None
    assert record.answer_schema["properties"]["plan"]["enum"] == ["PLAN-0001", "PLAN-0002"]
    text = f"note: use {TOKEN} for PLAN-1234\nplan: PLAN-0002\ntags: a, {TOKEN}\nreplicas: 2"

    app = create_app(settings, bus, directory, egress=PLAN)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://human.test") as client:
        reply = await client.post(f"/requests/{request_id}/answer", json={"text": text}, headers=ALICE)
    assert reply.status_code == 200, reply.text
    answered = _answered(await exactly(bus, "human.answered"))
    assert isinstance(answered.answer, TextAnswer)
    assert reply.json()["answer"] == answered.answer.model_dump()
    # what the run-executor reads: each secret redacted; the form's own value (which the new pattern would match)
    # and the number as given, so the answer still fits the form
    read = forms.read(record.answer_schema, answered.answer)
    assert (read.action, read.refused) == ("accept", None)
    assert read.content == {
        "note": f"use {MARK} for [REDACTED:plan_code]",
        "plan": "PLAN-0002",
        "tags": ["a", MARK],
        "replicas": 2,
    }
    bound = await _bound(bus, request_id)
    assert bound.answer == answered.answer
    assert bound.answer_redactions == {"github_token": 2, "plan_code": 1}


async def test_a_form_answer_that_fits_only_with_its_secret_is_refused_and_nothing_is_bound(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    form = {"type": "object", "properties": {"mirror": {"type": "string", "pattern": "^ghp_"}}, "required": ["mirror"]}
    event = requested(answer_schema=form, options=[DECLINE])
    request_id = str(event.data["request_id"])
    await handler.handle(event)

    refused = await client.post(f"/requests/{request_id}/answer", json={"text": TOKEN}, headers=ALICE)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"] == "invalid_answer"
    assert "holds a secret (github_token)" in refused.json()["detail"]
    assert TOKEN not in refused.text
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status is HumanRequestState.PENDING

    declined = await client.post(f"/requests/{request_id}/answer", json={"option_id": "decline"}, headers=ALICE)
    assert declined.status_code == 200, declined.text


# ---------------------------------------------------------------------------------------------------- Telegram
async def test_a_free_text_reply_in_telegram_is_redacted_in_the_record_the_event_and_the_chat(
    bus: Bus, telegram: TelegramDesk
) -> None:
    tg, intake = telegram.tg, telegram.intake()
    event = requested(allowed=("user:alice",))
    request_id = str(event.data["request_id"])
    await intake.handle(event)
    question = await tg.wait_for_message(TG_ALICE.id)

    said = await tg.reply(TG_ALICE, question, f"Keep v1; token {TOKEN}")
    told = await tg.wait_for_message(
        TG_ALICE.id, lambda m: m.get("reply_to_message", {}).get("message_id") == said["message_id"]
    )
    assert TOKEN not in told["text"]  # the bot's reply (it quotes alice's own message in reply_to_message)
    edited = await tg.wait_for_edit(question)  # the question shows the outcome
    assert f"Keep v1; token {MARK}" in edited["text"]
    assert TOKEN not in edited["text"]

    answered = _answered(await exactly(bus, "human.answered"))
    assert (answered.channel, answered.answer) == ("telegram", TextAnswer(value=f"Keep v1; token {MARK}"))
    record = await _bound(bus, request_id)
    assert record.answer == answered.answer
    assert record.answer_redactions == answered.redacted == {"github_token": 1}  # counted, never the secret
