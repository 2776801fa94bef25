"""Display names on the protocol: the question names the asking agent by its card's display name
(``human.requested``'s ``agent_display_name``; without one, its id), and ``human.answered`` carries the responder's
directory display name (``responder_display_name``; ``None`` for a record bound before it). Over a real
nats-server: the Telegram adapter polling the Bot API emulator (real HTTP), and the web inbox's API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
from human_support import ALICE, TG_ALICE, TelegramDesk, exactly, requested

from temporality_bus import Bus
from temporality_human_interaction.channels.render import question_html, question_text
from temporality_human_interaction.events import answered_event, responder_display_name
from temporality_human_interaction.records import HumanRequestRecord
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import HumanAnswered, HumanRequested, HumanRequestState, OptionAnswer


@pytest.mark.parametrize(
    ("agent_display_name", "asker"),
    [("Rita the Reviewer", "🤖 Rita the Reviewer (agent reviewer) asks:"), (None, "🤖 reviewer (agent) asks:")],
)
async def test_telegram_names_the_agent_and_the_answer_names_the_responder(
    bus: Bus, telegram: TelegramDesk, agent_display_name: str | None, asker: str
) -> None:
    tg, intake = telegram.tg, telegram.intake()
    event = requested(allowed=("user:alice",), agent_display_name=agent_display_name)
    await intake.handle(event)
    question = await tg.wait_for_message(TG_ALICE.id)
    assert f"{asker}\nShould the v1 API stay for one more release?" in question["text"]

    query = await tg.press(TG_ALICE, question, tg.buttons(question)[0]["callback_data"])
    assert (await tg.wait_for_callback_answer(query))["text"].startswith("Recorded")
    [answered_env] = await exactly(bus, "human.answered")
    answered = answered_env.payload(HumanAnswered)
    assert (answered.responder, answered.responder_display_name) == ("user:alice", "Alice Example")
    assert answered_env.data["responder_display_name"] == "Alice Example"  # on the wire, as the schema says


async def test_the_web_answer_and_the_request_view_carry_both_display_names(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    event = requested(agent_display_name="Rita the Reviewer")
    request_id = str(event.data["request_id"])
    await handler.handle(event)
    before = (await client.get(f"/requests/{request_id}", headers=ALICE)).json()
    assert (before["agent"], before["agent_display_name"], before["responder_display_name"]) == (
        "reviewer",
        "Rita the Reviewer",
        None,
    )
    response = await client.post(f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
    assert response.status_code == 200
    assert (response.json()["responder"], response.json()["responder_display_name"]) == ("user:alice", "Alice Example")
    [answered] = await exactly(bus, "human.answered")
    assert answered.payload(HumanAnswered).responder_display_name == "Alice Example"  # config/users.yaml's


def _record(**changes: object) -> HumanRequestRecord:
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    payload = HumanRequested.model_validate(requested().data)
    base = HumanRequestRecord.model_validate(
        {
            "request_id": payload.request_id, "run_id": payload.run_id, "agent": "reviewer", "title": "t",
            "recipient": "user:alice", "question": "q", "created_at": now, "expires_at": now + timedelta(hours=1),
            "policy": payload.policy.model_dump(),
        }
    )  # fmt: skip
    answered = {
        "status": HumanRequestState.ANSWERED,
        "answer": OptionAnswer(option_id="keep-v1", label="Keep"),
        "responder": "user:alice",
        "answered_at": now + timedelta(minutes=1),
    }
    return base.model_copy(update=answered | changes)


@pytest.mark.parametrize(
    ("responder_name", "expected"),
    [
        ("Alice Example", "Alice Example"),
        (None, None),  # a record bound before the name was kept: the id shows
        ("user:alice", None),  # the binding found no profile and kept the id: no name to add
        ("   ", None),
    ],
)
def test_the_answered_event_names_the_responder_only_with_a_real_display_name(
    responder_name: str | None, expected: str | None
) -> None:
    record = _record(responder_name=responder_name)
    assert responder_display_name(record) == expected
    assert answered_event(record, channel="web").payload(HumanAnswered).responder_display_name == expected


def test_a_stored_record_from_before_the_agent_display_name_reads_and_renders_the_id() -> None:
    record = HumanRequestRecord.model_validate(_record().model_dump(mode="json", exclude={"agent_display_name"}))
    assert record.agent_display_name is None
    assert "🤖 reviewer (agent) asks:\nq" in question_text(record)
    named = record.model_copy(update={"agent_display_name": "Rita <the> Reviewer"})
    assert "🤖 Rita <the> Reviewer (agent reviewer) asks:\nq" in question_text(named)
    assert "🤖 Rita &lt;the&gt; Reviewer (agent reviewer) asks: q" in question_html(named)  # escaped
