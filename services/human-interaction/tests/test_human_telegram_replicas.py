"""Issue 11: two human-interaction replicas with the same Telegram bot. One at a time polls ``getUpdates`` (the
inbound lease in ``human-channels``), both send; a button press is bound once; when the poller stops (releasing
its lease) or dies (its lease runs out), the other polls and binds the next answer. Against the Bot API emulator
over real HTTP and the test's nats-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from human_support import exactly, request_run, requested, service_settings, stored, wait_for_record
from pydantic import SecretStr
from replica_support import replica
from test_human_telegram import ALICE, USERS

from temporality_bus import Bus, NatsSettings
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.channels.lease import InboundLease, lease_key
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRef, ChannelRefs
from temporality_human_interaction.channels.telegram import TelegramAdapter
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.inbound import AnswerRouter
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import new_id
from temporality_testing.telegram_emulator import TelegramEmulator
from temporality_testing.waiting import eventually, stays

TTL_S, RENEW_S = 3.0, 0.3
KEY = lease_key("telegram", "4242")


@dataclass
class Replica:
    name: str
    telegram: TelegramAdapter
    lease: InboundLease
    intake: RequestHandler
    stack: AsyncExitStack


@pytest.fixture
async def emulator() -> AsyncIterator[TelegramEmulator]:
    async with TelegramEmulator().serve() as tg:
        yield tg


async def _replica(bus: Bus, tg: TelegramEmulator, name: str) -> Replica:
    """What the service's setup builds for Telegram (``build_adapters``): its own adapters, binding and lease."""
    directory = Directory.from_mapping(USERS)
    adapters: dict[str, ChannelAdapter] = {}
    router = AnswerRouter(bus, directory, adapters)
    lease = InboundLease(bus, KEY, holder=f"replica-{name}", ttl_s=TTL_S, renew_s=RENEW_S)
    web = WebInboxAdapter()
    telegram = TelegramAdapter(bus, token=tg.token, base_url=tg.base_url, poll_timeout_s=1, lease=lease)
    stack = AsyncExitStack()
    for adapter in (web, telegram):
        adapter.attach(router)
        adapters[adapter.name] = await stack.enter_async_context(adapter)
    return Replica(name, telegram, lease, RequestHandler(bus, directory, adapters), stack)


@pytest.fixture
async def replicas(bus: Bus, emulator: TelegramEmulator) -> AsyncIterator[tuple[Replica, Replica]]:
    a = await _replica(bus, emulator, "a")
    b = await _replica(bus, emulator, "b")
    try:
        yield a, b
    finally:
        await b.stack.aclose()
        await a.stack.aclose()


async def _the_poller(*replicas: Replica) -> Replica:
    """The one replica polling (and holding the lease), once exactly one does."""

    def one() -> Replica | None:
        polling = [r for r in replicas if r.telegram.polling]
        return polling[0] if len(polling) == 1 and polling[0].lease.held else None

    async def probe() -> Replica | None:
        return one()

    return await eventually(probe, timeout_s=TTL_S * 4, what="exactly one replica polling")


async def _ask_and_press(bus: Bus, sender: Replica, emulator: TelegramEmulator, answered: int) -> None:
    """``sender`` asks Alice; she presses the second button: recorded once (``answered`` in all so far)."""
    event = requested()
    await sender.intake.handle(event)
    record = await stored(bus, str(event.data["request_id"]))
    assert record is not None
    copy = record.copy_on("telegram")
    assert copy is not None, "the question went out on Telegram"
    assert copy.address is not None
    message = await emulator.wait_for_message(int(copy.address), lambda m: m["message_id"] == int(copy.reference))
    query = await emulator.press(ALICE, message, emulator.buttons(message)[1]["callback_data"])
    answer = await emulator.wait_for_callback_answer(query)
    assert answer["text"] == "Recorded: Drop v1"
    await exactly(bus, "human.answered", answered)
    await emulator.wait_for_edit(message)  # the question shows who answered
    assert len([a for a in emulator.callback_answers if a.get("callback_query_id") == query]) == 1


async def test_one_replica_polls_both_send_and_the_other_takes_over_when_it_stops(
    bus: Bus, emulator: TelegramEmulator, replicas: tuple[Replica, Replica]
) -> None:
    poller = await _the_poller(*replicas)
    other = replicas[1] if poller is replicas[0] else replicas[0]
    overlaps = emulator.poll_overlaps
    await stays(
        lambda: poller.telegram.polling and not other.telegram.polling and emulator.poll_overlaps == overlaps,
        settle_s=2.0,
        what=f"only replica {poller.name} polls getUpdates",
    )
    assert other.telegram.available, "the replica that does not poll still sends"
    holder = await ChannelRefs(bus).get(KEY)
    assert holder == poller.lease.holder

    # the question sent by the replica that does not poll; the press is bound once, by the poller
    await _ask_and_press(bus, other, emulator, answered=1)

    # the poller stops (releasing its lease): the other polls at its next look, not after the ttl
    await poller.stack.aclose()
    assert not poller.telegram.polling
    await eventually(
        lambda: _true_if(other.telegram.polling and other.lease.held),
        timeout_s=TTL_S,  # within a few renewal periods (0.3 s), well before the lease would run out
        what=f"replica {other.name} polls after {poller.name} stopped",
    )
    await _ask_and_press(bus, other, emulator, answered=2)


async def _true_if(value: bool) -> bool | None:
    return True if value else None


async def test_a_lease_whose_holder_died_is_taken_over_after_its_ttl(bus: Bus) -> None:
    first = InboundLease(bus, lease_key("test", "died"), holder="first", ttl_s=TTL_S, renew_s=RENEW_S)
    second = InboundLease(bus, lease_key("test", "died"), holder="second", ttl_s=TTL_S, renew_s=RENEW_S)
    await first.start()
    assert first.held
    await second.start()
    try:
        await stays(lambda: first.held and not second.held, settle_s=TTL_S / 2, what="first holds the lease")
        # the holder dies: it neither renews nor releases (its renewal task gone, as with a killed process)
        assert first._task is not None
        first._task.cancel()
        await eventually(lambda: _true_if(second.held), timeout_s=TTL_S * 4, what="second takes the lease over")
        assert await ChannelRefs(bus).get(lease_key("test", "died")) == "second"
    finally:
        await second.stop()
    assert await ChannelRefs(bus).get(lease_key("test", "died")) is None, "released on stop"


async def test_a_replica_restarted_under_its_own_name_takes_its_lease_back_at_once(bus: Bus) -> None:
    """TEMPORALITY_HUMAN_CHANNEL_LEASE_HOLDER (the chart: the pod's name): the replica's process dies holding the
    lease, its restart under the same name holds it from its first step -- not after the ttl -- while a replica
    under another name still waits the ttl out."""
    key = lease_key("test", "restarted")
    crashed = InboundLease(bus, key, holder="pod-a", ttl_s=60, renew_s=RENEW_S)
    await crashed.start()
    assert crashed.held
    assert crashed._task is not None
    crashed._task.cancel()  # killed: no renewal, no release
    other = InboundLease(bus, key, holder="pod-b", ttl_s=60, renew_s=RENEW_S)
    restarted = InboundLease(bus, key, holder="pod-a", ttl_s=60, renew_s=RENEW_S)
    await other.start()
    await restarted.start()
    try:
        assert restarted.held  # at once: a ttl of 60 s has not passed
        assert not other.held
        await stays(lambda: restarted.held and not other.held, settle_s=RENEW_S * 4, what="pod-a keeps it")
    finally:
        await other.stop()
        await restarted.stop()


async def test_a_replica_that_lost_its_lease_stops_polling_and_polls_again_once_it_holds_it_again(
    bus: Bus, emulator: TelegramEmulator
) -> None:
    only = await _replica(bus, emulator, "only")
    try:
        await _the_poller(only)
        # another holder's write: the holder's next renewal loses its compare-and-set and it stops polling; that
        # other holder never renews, so after the ttl it takes the lease over and polls again (a restarted updater)
        await (await bus.store(BUCKET_HUMAN_CHANNELS, ChannelRef)).put(KEY, ChannelRef(value="someone-else"))
        await eventually(lambda: _true_if(not only.telegram.polling), timeout_s=TTL_S, what="polling stopped")
        assert await ChannelRefs(bus).get(KEY) == "someone-else"
        await _the_poller(only)
        assert await ChannelRefs(bus).get(KEY) == only.lease.holder
        await _ask_and_press(bus, only, emulator, answered=1)
    finally:
        await only.stack.aclose()


SERVICE_USERS = f"""users:
  alice:
    display_name: Alice Example
    inbox_token: alice-demo-inbox-token-change-me
    preferred: telegram
    fallback: [web]
    channels: {{telegram: {{chat_id: {ALICE.id}}}, web: {{}}}}
"""


@pytest.mark.timeout(150)
async def test_two_service_replicas_with_one_bot_bind_each_press_once_and_hand_over_when_the_poller_stops(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, emulator: TelegramEmulator
) -> None:
    """The service as it starts (``configure``/``setup`` under the runtime, ``build_adapters`` giving Telegram its
    lease from the settings), twice on one nats-server and one bot."""
    settings = service_settings(
        tmp_path,
        nats_settings,
        SERVICE_USERS,
        telegram_token=SecretStr(emulator.token),
        telegram_base_url=emulator.base_url,
        telegram_poll_timeout_s=1,
        channel_lease_ttl_s=TTL_S,
        channel_lease_renew_s=RENEW_S,
    )
    run_id = new_id("run")
    await request_run(bus, run_id, ["user:alice"])

    async def ask_and_press(answered: int) -> None:
        event = requested(recipient="user:alice", allowed=("user:alice",), run_id=run_id)
        await bus.publish(event)
        record = await wait_for_record(bus, str(event.data["request_id"]), lambda r: bool(r.deliveries))
        copy = record.copy_on("telegram")
        assert copy is not None, "the question went out on Telegram"
        message = await emulator.wait_for_message(ALICE.id, lambda m: m["message_id"] == int(copy.reference))
        query = await emulator.press(ALICE, message, emulator.buttons(message)[1]["callback_data"])
        assert (await emulator.wait_for_callback_answer(query))["text"] == "Recorded: Drop v1"
        await exactly(bus, "human.answered", answered)
        await stays(
            lambda: len([a for a in emulator.callback_answers if a.get("callback_query_id") == query]) == 1,
            settle_s=1.0,
            what="the press answered once",
        )

    first = AsyncExitStack()  # closed by hand below (aclose again at the end is a no-op)
    async with first:
        await first.enter_async_context(replica(settings))
        async with replica(settings):
            holder = await ChannelRefs(bus).get(KEY)
            assert holder is not None, "the first replica took the polling lease as it started"
            overlaps = emulator.poll_overlaps
            await stays(lambda: emulator.poll_overlaps == overlaps, settle_s=2.0, what="one poller at a time")
            await ask_and_press(answered=1)

            await first.aclose()  # the poller stops: the other replica takes over

            async def taken_over() -> str | None:
                now = await ChannelRefs(bus).get(KEY)
                return now if now is not None and now != holder else None

            # within the lease's TTL of the stop, give or take a loaded machine's scheduling
            await eventually(taken_over, timeout_s=TTL_S * 5, what="the second replica holds the polling lease")
            await ask_and_press(answered=2)


async def test_a_lease_stops_even_when_a_cancellation_of_its_renewals_is_dropped(bus: Bus) -> None:
    """nats-py's requests wait with ``asyncio.wait_for``, which before Python 3.12 drops a cancellation landing as
    the reply arrives: the renewal loop went on and ``stop()`` waited for it forever (a CI run's timeout). Here the
    renewal in progress drops the first cancellation, as that race does."""
    lease = InboundLease(bus, lease_key("test", "dropped"), holder="pod-a", ttl_s=60, renew_s=0.01)
    await lease.start()
    in_step, dropped = asyncio.Event(), []

    async def renewal_dropping_one_cancel() -> None:
        in_step.set()
        try:
            await asyncio.sleep(1)  # a renewal's request, waiting for its reply
        except asyncio.CancelledError:
            if dropped:
                raise
            dropped.append(True)  # "the reply arrived": the cancellation is gone

    lease._step = renewal_dropping_one_cancel  # type: ignore[method-assign]
    await asyncio.wait_for(in_step.wait(), 10)
    await asyncio.wait_for(lease.stop(), 10)
    assert dropped == [True]
