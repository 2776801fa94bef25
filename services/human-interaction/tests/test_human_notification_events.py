"""An agent's ``notify`` is journaled (HUM-9): ``human.notification_delivered`` names the channel that carried it,
the channels that failed before it and which delivery got through; ``human.notification_failed`` says why it
was given up and who was not told. Real nats-server under the real consumer runner (redeliveries, dead
letters), the Bot API emulator for Telegram; Matrix is named in profiles but runs nowhere here (an adapter
that does not run is a failed attempt like any other)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import cast

import pytest
from human_support import CrashingBus, PublishCrash, events_of, exactly, running

from temporality_bus import Bus, Consumer, Delivery
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.channels.refs import ChannelRefs, ref_key
from temporality_human_interaction.channels.telegram import TelegramAdapter
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.notifications import NotificationHandler
from temporality_protocol import (
    Envelope,
    HumanNotificationDelivered,
    HumanNotificationFailed,
    HumanNotifyRequested,
    HumanPolicy,
    make_event,
    new_id,
)
from temporality_protocol.catalog import CONSUMERS
from temporality_testing.telegram_emulator import TelegramEmulator, TelegramUser

ALICE = TelegramUser(2001, "Alice")
ERIN = TelegramUser(2005, "Erin")
FRANK = TelegramUser(2006, "Frank")

USERS = {
    "users": {
        "alice": {
            "display_name": "Alice Example",
            "inbox_token": "alice-demo-inbox-token-change-me",
            "preferred": "telegram",
            "fallback": ["web"],
            "channels": {"telegram": {"chat_id": ALICE.id}, "web": {}},
        },
        "erin": {  # prefers Matrix, which this deployment does not run: Telegram carries it
            "display_name": "Erin Example",
            "preferred": "matrix",
            "fallback": ["telegram"],
            "channels": {"matrix": {"user_id": "@erin:matrix.example"}, "telegram": {"chat_id": ERIN.id}},
        },
        "frank": {  # Telegram, then the web inbox (which carries no notifications)
            "display_name": "Frank Example",
            "inbox_token": "frank-demo-token",
            "preferred": "telegram",
            "fallback": ["web"],
            "channels": {"telegram": {"chat_id": FRANK.id}, "web": {}},
        },
    },
    "groups": {"pair": {"display_name": "Alice and Frank", "members": ["alice", "frank"]}},
}

#: Few deliveries, short backoff: a notification no channel carries is given up within a second or two.
MAX_DELIVER = 3


@dataclasses.dataclass
class Notifier:
    bus: Bus
    emulator: TelegramEmulator
    handler: NotificationHandler
    #: The channels the handler sends on (Telegram on the emulator, the web inbox).
    adapters: dict[str, ChannelAdapter]
    #: (delivery number, the error or None) of every handling the consumer ran, in order.
    handled: list[tuple[int, BaseException | None]]
    #: Set once the consumer has handled a delivery.
    settled: asyncio.Event

    async def notify(self, recipient: str, *, allowed: tuple[str, ...] | None = None) -> Envelope:
        event = _notify_requested(recipient, allowed=allowed)
        await self.bus.publish(event)
        return event


def _notify_requested(recipient: str, *, allowed: tuple[str, ...] | None = None) -> Envelope:
    """A run's ``human.notify_requested`` to ``recipient`` (allowed to notify ``allowed``, default: them)."""
    data = HumanNotifyRequested(
        notification_id=new_id("hn"),
        run_id=new_id("run"),
        agent="reviewer",
        title="Review PR 42",
        recipient=recipient,
        message="Review finished: two comments.",
        policy=HumanPolicy(allowed_recipients=list(allowed or (recipient,))),
        turn=3,
    )
    return make_event(data, source="/temporality/run-executor", run_id=data.run_id)


def _counting(
    handle: Callable[[Envelope, Delivery], Awaitable[None]],
    handled: list[tuple[int, BaseException | None]],
    settled: asyncio.Event,
) -> Callable[[Envelope, Delivery], Awaitable[None]]:
    async def counted(event: Envelope, delivery: Delivery) -> None:
        try:
            await handle(event, delivery)
        except Exception as exc:
            handled.append((delivery.num_delivered, exc))
            raise
        else:
            handled.append((delivery.num_delivered, None))
        finally:
            settled.set()

    return counted


@pytest.fixture
async def notifier(bus: Bus) -> AsyncIterator[Notifier]:
    directory = Directory.from_mapping(USERS)
    async with TelegramEmulator().serve() as emulator:
        telegram = TelegramAdapter(bus, token=emulator.token, base_url=emulator.base_url, poll_timeout_s=1)
        async with telegram, WebInboxAdapter() as web:
            adapters: dict[str, ChannelAdapter] = {telegram.name: telegram, web.name: web}
            handler = NotificationHandler(bus, directory, adapters)
            handled: list[tuple[int, BaseException | None]] = []
            settled = asyncio.Event()
            spec = dataclasses.replace(
                CONSUMERS["human-interaction-notifications"], max_deliver=MAX_DELIVER, backoff_s=(0.2, 0.3)
            )
            consumer = Consumer(
                bus,
                spec,
                handler=_counting(handler.handle, handled, settled),
                on_dead_letter=handler.on_dead_letter,
                fetch_timeout_s=0.2,
            )
            async with running(consumer):
                yield Notifier(bus, emulator, handler, adapters, handled, settled)


def _of(events: list[Envelope], notification: Envelope) -> list[Envelope]:
    return [e for e in events if e.data.get("notification_id") == notification.data["notification_id"]]


def _sent(emulator: TelegramEmulator, user: TelegramUser) -> list[str]:
    return [
        m["text"] for (chat, _), m in emulator.messages.items() if chat == user.id and "Review finished" in m["text"]
    ]


async def test_the_preferred_channel_carries_it_once_and_a_redelivery_journals_no_second_event(
    notifier: Notifier,
) -> None:
    event = await notifier.notify("user:alice")
    [told] = await exactly(notifier.bus, "human.notification_delivered")
    data = told.payload(HumanNotificationDelivered)
    assert (data.notification_id, data.run_id) == (event.data["notification_id"], event.data["run_id"])
    assert (data.recipient, data.person, data.channel) == ("user:alice", "user:alice", "telegram")
    assert (data.fallback_from, data.failed_attempts, data.delivery) == (None, [], 1)
    assert (told.runid, told.causationid) == (event.data["run_id"], event.id)  # in the run's journal, caused by it
    assert _sent(notifier.emulator, ALICE) == ["📣 Review PR 42\n\nReview finished: two comments."]

    await notifier.handler.handle(event)  # redelivered after it was claimed: neither sent nor journaled again
    # a crash after the send, before the claim: the redelivery sends again (Telegram has no idempotency key: at
    # least once) and journals once (the event keeps its id)
    await ChannelRefs(notifier.bus).delete(ref_key("notify", str(event.data["notification_id"])))
    await notifier.handler.handle(event)
    assert len(_sent(notifier.emulator, ALICE)) == 2
    await exactly(notifier.bus, "human.notification_delivered", settle_s=0.5)
    await exactly(notifier.bus, "human.notification_failed", 0, settle_s=0.2)


async def test_a_crash_between_the_claim_and_the_event_sends_once_and_the_redelivery_journals_it(
    bus: Bus, notifier: Notifier
) -> None:
    crashing = CrashingBus(bus, HumanNotificationDelivered.EVENT_TYPE)
    handler = NotificationHandler(cast(Bus, crashing), Directory.from_mapping(USERS), notifier.adapters)
    event = _notify_requested("user:alice")
    with pytest.raises(PublishCrash):
        await handler.handle(event)
    assert len(_sent(notifier.emulator, ALICE)) == 1  # sent and claimed; its event never reached the bus
    await exactly(bus, "human.notification_delivered", 0, settle_s=0.2)
    await handler.handle(event)  # the redelivery: the marker's event is published, nothing is sent again
    [told] = await exactly(bus, "human.notification_delivered")
    assert told.payload(HumanNotificationDelivered).channel == "telegram"
    assert (told.runid, told.causationid) == (event.data["run_id"], event.id)
    assert len(_sent(notifier.emulator, ALICE)) == 1


async def test_a_channel_that_fails_is_journaled_and_the_next_one_carries_it(notifier: Notifier) -> None:
    await notifier.notify("user:erin")
    [told] = await exactly(notifier.bus, "human.notification_delivered")
    data = told.payload(HumanNotificationDelivered)
    assert (data.person, data.channel, data.fallback_from) == ("user:erin", "telegram", "matrix")
    [attempt] = data.failed_attempts
    assert (attempt.channel, attempt.error) == ("matrix", "no matrix adapter runs in this deployment")
    assert len(_sent(notifier.emulator, ERIN)) == 1


async def test_every_channel_failing_on_every_delivery_is_one_failure_event(notifier: Notifier) -> None:
    notifier.emulator.block(FRANK.id)
    event = await notifier.notify("user:frank")
    [failed] = await exactly(notifier.bus, "human.notification_failed")
    data = failed.payload(HumanNotificationFailed)
    assert (data.notification_id, data.recipient) == (event.data["notification_id"], "user:frank")
    assert (data.reason, data.unreached, data.deliveries) == ("no_channel", ["user:frank"], MAX_DELIVER)
    assert [a.channel for a in data.failed_attempts] == ["telegram", "web"]
    assert "blocked by the user" in data.failed_attempts[0].error
    assert "no notifications" in data.failed_attempts[1].error
    assert failed.runid == event.data["run_id"]
    [dead] = await exactly(notifier.bus, "bus.dead_lettered")  # the message itself is kept in the DLQ
    assert dead.data["original_id"] == event.id
    assert [n for n, _ in notifier.handled] == list(range(1, MAX_DELIVER + 1))
    await exactly(notifier.bus, "human.notification_delivered", 0, settle_s=0.2)
    assert _sent(notifier.emulator, FRANK) == []


async def test_a_later_delivery_that_gets_through_says_which_it_was(notifier: Notifier) -> None:
    notifier.emulator.block(FRANK.id)
    await notifier.notify("user:frank")
    await asyncio.wait_for(notifier.settled.wait(), 30)  # the first delivery failed on both channels: retried
    assert notifier.handled[0][1] is not None
    notifier.emulator.unblock(FRANK.id)
    [told] = await exactly(notifier.bus, "human.notification_delivered")
    data = told.payload(HumanNotificationDelivered)
    assert (data.channel, data.fallback_from, data.failed_attempts) == ("telegram", None, [])
    assert data.delivery >= 2
    await exactly(notifier.bus, "human.notification_failed", 0, settle_s=0.2)


async def test_a_group_journals_each_member_told_and_the_members_nobody_reached(notifier: Notifier) -> None:
    notifier.emulator.block(FRANK.id)
    event = await notifier.notify("group:pair")
    [failed] = await exactly(notifier.bus, "human.notification_failed")
    data = failed.payload(HumanNotificationFailed)
    assert (data.recipient, data.reason, data.unreached) == ("group:pair", "no_channel", ["user:frank"])
    assert [(a.channel, a.error.split(":", 2)[:2]) for a in data.failed_attempts] == [
        ("telegram", ["user", "frank"]),
        ("web", ["user", "frank"]),
    ]
    # alice was told on the first delivery, once: the redeliveries (for frank) skip her
    [told] = _of(await events_of(notifier.bus, "human.notification_delivered", wait_for=1), event)
    assert told.payload(HumanNotificationDelivered).person == "user:alice"
    assert told.payload(HumanNotificationDelivered).recipient == "group:pair"
    assert len(_sent(notifier.emulator, ALICE)) == 1


async def test_a_refused_recipient_is_one_failure_event(notifier: Notifier) -> None:
    event = await notifier.notify("user:frank", allowed=("user:alice",))
    [failed] = await exactly(notifier.bus, "human.notification_failed")
    data = failed.payload(HumanNotificationFailed)
    assert (data.reason, data.unreached, data.failed_attempts) == ("recipient_not_allowed", ["user:frank"], [])
    assert "SEC-1" in data.detail
    assert data.deliveries == 1  # refused at once: no retry
    [dead] = await exactly(notifier.bus, "bus.dead_lettered")
    assert dead.data["original_id"] == event.id
    unknown = await notifier.notify("user:nobody")
    failures = await events_of(notifier.bus, "human.notification_failed", wait_for=2)
    [gone] = _of(failures, unknown)
    assert gone.payload(HumanNotificationFailed).reason == "unknown_recipient"
    assert _sent(notifier.emulator, FRANK) == []
