"""The Telegram adapter's start (HUM-2, HUM-3): Telegram unreachable, or refusing the token, when
human-interaction starts does not stop the service. Telegram is then unavailable (questions reach each
profile's next channel, the attempt journaled), the adapter keeps trying and carries questions once the Bot
API answers; the token, which python-telegram-bot quotes in its refusal, is never logged.

The Bot API is the emulator over real HTTP; a port chosen before it listens stands for "Telegram is down"."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import structlog
from human_support import events_of, requested, stored

from temporality_bus import Bus
from temporality_embedded.processes import free_port
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.channels.telegram import TelegramAdapter
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.inbound import AnswerRouter
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import HumanNotified
from temporality_testing.telegram_emulator import TelegramEmulator, TelegramUser
from temporality_testing.waiting import eventually

ALICE = TelegramUser(1001, "Alice")


def _directory() -> Directory:
    return Directory.from_mapping(
        {
            "users": {
                "alice": {
                    "display_name": "Alice Example",
                    "inbox_token": "alice-demo-inbox-token-change-me",
                    "preferred": "telegram",
                    "fallback": ["web"],
                    "channels": {"telegram": {"chat_id": ALICE.id}, "web": {}},
                }
            }
        }
    )


async def _notified(bus: Bus, count: int) -> HumanNotified:
    return (await events_of(bus, "human.notified", wait_for=count))[count - 1].payload(HumanNotified)


@pytest.fixture
async def down_at_start(bus: Bus) -> AsyncIterator[tuple[TelegramAdapter, RequestHandler, TelegramEmulator]]:
    """The adapter started while nothing listens where the Bot API should be; the emulator not yet serving."""
    emulator = TelegramEmulator(port=free_port())
    directory = _directory()
    adapters: dict[str, ChannelAdapter] = {}
    router = AnswerRouter(bus, directory, adapters)
    telegram = TelegramAdapter(bus, token=emulator.token, base_url=emulator.base_url, poll_timeout_s=1, retry_s=(0.2,))
    web = WebInboxAdapter()
    for adapter in (telegram, web):
        adapter.attach(router)
    async with telegram, web:  # does not raise: the service starts
        adapters.update({a.name: a for a in (telegram, web)})
        yield telegram, RequestHandler(bus, directory, adapters), emulator


async def test_telegram_down_at_start_sends_questions_to_the_fallback_then_carries_them_once_it_answers(
    bus: Bus, down_at_start: tuple[TelegramAdapter, RequestHandler, TelegramEmulator]
) -> None:
    telegram, handler, emulator = down_at_start
    assert not telegram.available

    first = requested(recipient="user:alice")
    await handler.handle(first)
    notified = await _notified(bus, 1)
    assert notified.channel == "web"
    assert notified.fallback_from == "telegram"
    assert [a.channel for a in notified.failed_attempts] == ["telegram"]

    async with emulator.serve():

        async def up() -> bool:
            return telegram.available

        await eventually(up, timeout_s=30, what="the Telegram adapter started once the Bot API answers")
        second = requested(recipient="user:alice")
        await handler.handle(second)
        message = await emulator.wait_for_message(ALICE.id)
        assert "Review PR 42" in message["text"]
        assert (await _notified(bus, 2)).channel == "telegram"
        record = await stored(bus, str(second.data["request_id"]))
        assert record is not None
        assert [c.channel for c in record.deliveries] == ["telegram"]
        query = await emulator.press(ALICE, message, emulator.buttons(message)[0]["callback_data"])
        assert (await emulator.wait_for_callback_answer(query))["text"] == "Recorded: Keep the v1 API"


async def test_a_refused_token_leaves_telegram_unavailable_keeps_trying_and_is_never_logged(bus: Bus) -> None:
    wrong = "999000:the-wrong-and-secret-token"
    async with TelegramEmulator().serve() as emulator:
        telegram = TelegramAdapter(bus, token=wrong, base_url=emulator.base_url, poll_timeout_s=1, retry_s=(0.2,))
        with structlog.testing.capture_logs() as logs:
            async with telegram:

                async def tried_again() -> bool:
                    return len([e for e in logs if e["event"] == "telegram.start_failed"]) >= 2

                await eventually(tried_again, timeout_s=30, what="a second attempt to start")
                assert not telegram.available
        failed = [e for e in logs if e["event"] == "telegram.start_failed"]
        assert "rejected" in failed[0]["error"]
        assert "<token>" in failed[0]["error"]
        assert wrong not in repr(logs)
        assert [m for m, _ in emulator.calls if m != "getMe"] == [], "nothing but getMe with a refused token"


async def test_pressing_start_tells_the_person_what_the_chat_is_for_and_the_id_their_profile_needs(bus: Bus) -> None:
    """Step 3 of connecting a real bot: each person presses Start once; the bot answers with their Telegram id
    (the ``chat_id`` of their profile), so nobody needs another bot to find it. Other text gets the usual hint."""
    newcomer = TelegramUser(7007, "Erin")
    async with TelegramEmulator().serve() as emulator:
        telegram = TelegramAdapter(bus, token=emulator.token, base_url=emulator.base_url, poll_timeout_s=1)
        async with telegram:
            await emulator.say(newcomer, "/start")
            hello = await emulator.wait_for_message(newcomer.id, lambda m: "Your Telegram id" in m["text"])
            assert hello["text"].startswith("Hello Erin. I am Temporality's bot")
            assert "Your Telegram id is 7007." in hello["text"]
            assert "chat_id: 7007" in hello["text"]

            await emulator.say(newcomer, "hello?")
            hint = await emulator.wait_for_message(newcomer.id, lambda m: m["text"].startswith("To answer a question"))
            assert "reply to the question's message" in hint["text"]
