"""Group recipients (HUM-2, HUM-4): ``group:<id>`` asks every member on their own channel, the first valid
answer wins and is bound once, a later answer from another member is refused saying who answered, and the
losing member's Telegram message is edited to show it. ``notify`` to a group tells every member."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from directory_support import ADMIN, replica
from human_support import BOB_TELEGRAM, DAVE_TELEGRAM, exactly, people, requested, stored

from temporality_bus import Bus, PermanentError
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.channels.telegram import TelegramAdapter
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.notifications import NotificationHandler
from temporality_human_interaction.requests import Refusal, RequestHandler, authorize
from temporality_protocol import (
    HumanAnswered,
    HumanNotified,
    HumanNotifyRequested,
    HumanPolicy,
    HumanRejected,
    HumanRequested,
    OptionAnswer,
    make_event,
    new_id,
)
from temporality_testing.telegram_emulator import TelegramEmulator

BOB, DAVE = BOB_TELEGRAM, DAVE_TELEGRAM
GROUP = "group:api-owners"

USERS: dict[str, Any] = people({"api-owners": {"display_name": "API owners", "members": ["alice", "bob"]}})
ALICE_WEB = {"Authorization": "Bearer alice-demo-inbox-token-change-me"}
BOB_WEB = {"Authorization": "Bearer bob-demo-inbox-token-change-me"}


@pytest.fixture
async def emulator() -> AsyncIterator[TelegramEmulator]:
    async with TelegramEmulator().serve() as tg:
        yield tg


def test_a_group_must_be_allowed_itself_and_known() -> None:
    directory = Directory.from_mapping(USERS)

    def payload(recipient: str, allowed: tuple[str, ...]) -> HumanRequested:
        return requested(recipient=recipient, allowed=allowed).payload(HumanRequested)

    members_only = authorize(payload(GROUP, ("user:alice", "user:bob")), directory)
    assert isinstance(members_only, Refusal)
    assert members_only.reason == "recipient_not_allowed"  # SEC-1: the trigger names the group itself
    unknown = authorize(payload("group:nobody", ("group:nobody",)), directory)
    assert isinstance(unknown, Refusal)
    assert unknown.reason == "unknown_recipient"
    route = authorize(payload(GROUP, (GROUP,)), directory)
    assert not isinstance(route, Refusal)
    assert route.group
    assert [m.recipient for m in route.members] == ["user:alice", "user:bob"]


async def test_group_question_first_answer_wins_the_other_is_told_and_its_message_edited(
    bus: Bus, emulator: TelegramEmulator
) -> None:
    adapters: dict[str, ChannelAdapter] = {}
    async with replica(bus, USERS, adapters=adapters) as r:
        web = WebInboxAdapter()
        telegram = TelegramAdapter(bus, token=emulator.token, base_url=emulator.base_url, poll_timeout_s=1)
        for adapter in (web, telegram):
            adapter.attach(r.router)
        async with web, telegram:
            adapters.update({web.name: web, telegram.name: telegram})
            intake = RequestHandler(bus, r.directory, adapters)
            event = requested(recipient=GROUP, allowed=(GROUP,))
            request_id = str(event.data["request_id"])
            await intake.handle(event)
            await intake.handle(event)  # a redelivery reaches nobody twice

            record = await stored(bus, request_id)
            assert record is not None
            assert record.members == ["user:alice", "user:bob"]
            assert sorted((c.recipient, c.channel) for c in record.deliveries) == [
                ("user:alice", "web"),
                ("user:bob", "telegram"),
            ]
            [notified] = await exactly(bus, "human.notified", settle_s=0.2)
            assert notified.payload(HumanNotified).recipient == GROUP
            bobs = record.copy_on("telegram")
            assert bobs is not None
            message = await emulator.wait_for_message(BOB.id, lambda m: m["message_id"] == int(bobs.reference))
            button = emulator.buttons(message)[0]["callback_data"]  # what Bob's client shows before Alice answers
            alice_inbox = (await r.client.get("/inbox", headers=ALICE_WEB)).json()
            assert [i["id"] for i in alice_inbox["requests"]] == [request_id]  # a member sees it in their inbox

            won = await r.client.post(
                f"/requests/{request_id}/answer", json={"option_id": "drop-v1"}, headers=ALICE_WEB
            )
            assert won.status_code == 200, won.text
            assert won.json()["responder"] == "user:alice"

            edited = await emulator.wait_for_edit(message)  # Alice's answer edits Bob's copy to say who answered
            assert "✅ Answered by Alice Example: “Drop v1”" in edited["text"]
            assert "reply_markup" not in edited
            press = await emulator.press(BOB, message, button)  # Bob presses before his client refreshed
            told = await emulator.wait_for_callback_answer(press)
            assert told["text"].startswith(
                "Not recorded: “Review PR 42: remove the v1 API” was already answered by Alice Example: “Drop v1”, at "
            )

            late = await r.client.post(f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=BOB_WEB)
            assert late.status_code == 409
            assert late.json()["error"] == "already_answered"
            assert "Alice Example" in late.json()["detail"]
            [answered] = await exactly(bus, "human.answered", settle_s=0.3)
            payload = answered.payload(HumanAnswered)
            assert (payload.recipient, payload.responder) == (GROUP, "user:alice")
            assert payload.answer == OptionAnswer(option_id="drop-v1", label="Drop v1")

            # Someone outside the group may not answer (nor read) it.
            await r.client.post(
                "/directory/users",
                json={
                    "id": "erin",
                    "display_name": "Erin",
                    "inbox_token": "erin-inbox-token-for-the-group",
                    "preferred": "web",
                    "channels": {"web": {}},
                },
                headers=ADMIN,
            )
            erin = {"Authorization": "Bearer erin-inbox-token-for-the-group"}
            assert (await r.client.get(f"/requests/{request_id}", headers=erin)).json()["error"] == "not_recipient"


async def test_two_members_answering_at_once_bind_one_answer_and_the_other_is_told_who(
    bus: Bus, emulator: TelegramEmulator
) -> None:
    adapters: dict[str, ChannelAdapter] = {}
    async with replica(bus, USERS, adapters=adapters) as r:
        web = WebInboxAdapter()
        telegram = TelegramAdapter(bus, token=emulator.token, base_url=emulator.base_url, poll_timeout_s=1)
        for adapter in (web, telegram):
            adapter.attach(r.router)
        async with web, telegram:
            adapters.update({web.name: web, telegram.name: telegram})
            event = requested(recipient=GROUP, allowed=(GROUP,))
            request_id = str(event.data["request_id"])
            await RequestHandler(bus, r.directory, adapters).handle(event)
            record = await stored(bus, request_id)
            assert record is not None
            bobs = record.copy_on("telegram")
            assert bobs is not None
            message = await emulator.wait_for_message(BOB.id, lambda m: m["message_id"] == int(bobs.reference))
            button = emulator.buttons(message)[1]["callback_data"]  # "Drop v1", while Alice picks "Keep v1"

            web_answer, press = await asyncio.gather(
                r.client.post(f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE_WEB),
                emulator.press(BOB, message, button),
            )
            told = (await emulator.wait_for_callback_answer(press))["text"]
            [answered] = await exactly(bus, "human.answered", settle_s=0.3)
            winner = answered.payload(HumanAnswered).responder
            if winner == "user:alice":
                assert web_answer.status_code == 200
                assert told.startswith(
                    "Not recorded: “Review PR 42: remove the v1 API” was already answered by Alice Example: “Keep the v1 API”"
                )
            else:
                assert winner == "user:bob"
                assert told == "Recorded: Drop v1"
                assert web_answer.status_code == 409
                assert "already answered by Bob Example (user:bob)" in web_answer.json()["detail"]
            edited = await emulator.wait_for_edit(message)
            assert "✅ Answered by" in edited["text"]


async def test_a_group_nobody_can_be_reached_in_is_rejected(bus: Bus) -> None:
    async with replica(bus, USERS) as r:  # no Telegram adapter: dave (telegram only) cannot be reached
        group = {"id": "chat-only", "display_name": "Chat only", "members": ["dave"]}
        assert (await r.client.post("/directory/groups", json=group, headers=ADMIN)).status_code == 201
        async with WebInboxAdapter() as web:
            intake = RequestHandler(bus, r.directory, {web.name: web})
            await intake.handle(requested(recipient="group:chat-only", allowed=("group:chat-only",)))
        [rejected] = await exactly(bus, "human.rejected", settle_s=0.2)
        assert rejected.payload(HumanRejected).reason == "no_channel"


def _notify(recipient: str) -> HumanNotifyRequested:
    return HumanNotifyRequested(
        notification_id=new_id("ntf"),
        run_id=new_id("run"),
        agent="reviewer",
        title="Review PR 42",
        recipient=recipient,
        message="v1 stays for one more release.",
        policy=HumanPolicy(allowed_recipients=[recipient]),
        turn=4,
    )


async def test_notify_to_a_group_tells_every_member_once(bus: Bus, emulator: TelegramEmulator) -> None:
    users = {**USERS, "groups": {"chat": {"display_name": "Chat people", "members": ["bob", "dave"]}}}
    directory = Directory.from_mapping(users)
    async with TelegramAdapter(bus, token=emulator.token, base_url=emulator.base_url, poll_timeout_s=1) as telegram:
        handler = NotificationHandler(bus, directory, {telegram.name: telegram})
        data = _notify("group:chat")
        event = make_event(data, source="/temporality/run-executor", run_id=data.run_id)
        await handler.handle(event)
        await handler.handle(event)  # a redelivery tells nobody twice
        for person in (BOB, DAVE):
            said = await emulator.wait_for_message(person.id, lambda m: "v1 stays" in m["text"])
            assert said["text"].startswith("📣 Review PR 42")
            sent = [m for (chat, _), m in emulator.messages.items() if chat == person.id and "v1 stays" in m["text"]]
            assert len(sent) == 1  # both handle() calls returned: every send they made is in the emulator
        unknown = _notify("group:nobody")
        with pytest.raises(PermanentError, match="not a group"):
            await handler.handle(make_event(unknown, source="/temporality/run-executor", run_id=unknown.run_id))


async def test_a_redelivery_after_the_group_left_the_directory_rejects_nothing(bus: Bus) -> None:
    directory = Directory.from_mapping(USERS)
    async with WebInboxAdapter() as web:
        intake = RequestHandler(bus, directory, {web.name: web})
        event = requested(recipient=GROUP, allowed=(GROUP,))
        await intake.handle(event)
        directory.apply_group("api-owners", None)  # deleted through the API meanwhile
        await intake.handle(event)  # the same message again
    [notified] = await exactly(bus, "human.notified", settle_s=0.2)
    assert notified.payload(HumanNotified).channel == "web"
    await exactly(bus, "human.rejected", 0, settle_s=0.2)
    record = await stored(bus, str(event.data["request_id"]))
    assert record is not None
    assert record.pending
