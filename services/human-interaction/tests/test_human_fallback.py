"""Delivery follows the profile (HUM-2): the preferred channel first, the fallback order after it, every attempt
journaled in ``human.notified``. Real Synapse for Matrix, the Bot API emulator for Telegram."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from human_support import events_of, requested, stored

from temporality_bus import Bus
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.channels.matrix import MatrixAdapter
from temporality_human_interaction.channels.telegram import TelegramAdapter
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.inbound import AnswerRouter
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import HumanNotified, HumanRequestState
from temporality_testing.synapse import MatrixAccount, Synapse
from temporality_testing.telegram_emulator import TelegramEmulator, TelegramUser

CAROL = TelegramUser(1003, "Carol")


def _directory(accounts: dict[str, MatrixAccount]) -> Directory:
    return Directory.from_mapping(
        {
            "users": {
                # A Matrix id on a homeserver ours does not federate with: the DM cannot be opened.
                "carol": {
                    "display_name": "Carol Example",
                    "inbox_token": "carol-demo-token",
                    "preferred": "matrix",
                    "fallback": ["telegram", "web"],
                    "channels": {
                        "matrix": {"user_id": "@carol:unreachable.example"},
                        "telegram": {"chat_id": CAROL.id},
                        "web": {},
                    },
                },
                "dave": {  # reachable on Matrix and Telegram, but the bot is blocked on Telegram
                    "display_name": "Dave Example",
                    "inbox_token": "dave-demo-token",
                    "preferred": "telegram",
                    "fallback": ["web"],
                    "channels": {"telegram": {"chat_id": 1004}, "web": {}},
                },
            }
        }
    )


@pytest.fixture
async def intake(
    bus: Bus, synapse: Synapse, matrix_accounts: dict[str, MatrixAccount]
) -> AsyncIterator[tuple[RequestHandler, TelegramEmulator]]:
    directory = _directory(matrix_accounts)
    adapters: dict[str, ChannelAdapter] = {}
    router = AnswerRouter(bus, directory, adapters)
    bot = matrix_accounts["bot"]
    async with TelegramEmulator().serve() as emulator:
        matrix = MatrixAdapter(
            bus, homeserver=synapse.url, user_id=bot.user_id, password=bot.password, sync_timeout_s=5
        )
        telegram = TelegramAdapter(bus, token=emulator.token, base_url=emulator.base_url, poll_timeout_s=1)
        web = WebInboxAdapter()
        for adapter in (matrix, telegram, web):
            adapter.attach(router)
        async with matrix, telegram, web:
            adapters.update({a.name: a for a in (matrix, telegram, web)})
            yield RequestHandler(bus, directory, adapters), emulator


async def test_matrix_delivery_fails_then_telegram_carries_the_question_and_both_attempts_are_journaled(
    bus: Bus, intake: tuple[RequestHandler, TelegramEmulator]
) -> None:
    handler, emulator = intake
    event = requested(recipient="user:carol", allowed=("user:carol",))
    await handler.handle(event)

    message = await emulator.wait_for_message(CAROL.id)
    assert "Review PR 42" in message["text"]
    [notified] = await events_of(bus, "human.notified", wait_for=1)
    payload = notified.payload(HumanNotified)
    assert payload.channel == "telegram"
    assert payload.fallback_from == "matrix"
    [failed] = payload.failed_attempts
    assert failed.channel == "matrix"
    assert "cannot open a DM with @carol:unreachable.example" in failed.error

    record = await stored(bus, str(event.data["request_id"]))
    assert record is not None
    assert record.status is HumanRequestState.PENDING
    assert [c.channel for c in record.deliveries] == ["telegram"]

    # The fallback copy binds like any other: Carol answers on Telegram.
    query = await emulator.press(CAROL, message, emulator.buttons(message)[0]["callback_data"])
    assert (await emulator.wait_for_callback_answer(query))["text"] == "Recorded: Keep the v1 API"


async def test_a_blocked_bot_falls_back_to_the_web_inbox(
    bus: Bus, intake: tuple[RequestHandler, TelegramEmulator]
) -> None:
    handler, emulator = intake
    emulator.block(1004)
    event = requested(recipient="user:dave", allowed=("user:dave",))
    await handler.handle(event)
    [notified] = await events_of(bus, "human.notified", wait_for=1)
    payload = notified.payload(HumanNotified)
    assert payload.channel == "web"
    assert payload.fallback_from == "telegram"
    assert [a.channel for a in payload.failed_attempts] == ["telegram"]
    assert "blocked" in payload.failed_attempts[0].error
