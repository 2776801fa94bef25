"""What a bare message (one that replies to no question) costs to bind: the chat's open questions come from the
replica's mirror of ``human-channels`` (:func:`~temporality_human_interaction.mirror.chat_questions`), so the
records of a chat's ended questions are not read, nor its keys listed; without a caught-up mirror, from a listing
of the chat's keys and a read of every key and record, as before. The binding is the same either way.

Real parts: nats-server (the fixtures), python-telegram-bot against the Bot API emulator over real HTTP, and a
real Synapse for Matrix (skipped where none is installed). The reads are counted on the bus connection itself
(:func:`human_support.count_requests`: every KV read the adapter, the mirror and the binding send)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from human_support import (
    TG_ALICE,
    ask_on_telegram,
    count_requests,
    exactly,
    requested,
    stored,
    telegram_first,
    wait_for_record,
)
from matrix_support import MatrixPerson, alice_on_matrix

from temporality_bus import Bus
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRef, ChannelRefs, ref_key
from temporality_human_interaction.channels.telegram import TelegramAdapter
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.inbound import AnswerRouter
from temporality_human_interaction.mirror import ChannelMirror
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.runs import RunEndHandler
from temporality_protocol import HumanRequestState, OptionAnswer, RunCancelled, TextAnswer, make_event, new_id
from temporality_testing.kv_reads import kv_read_key
from temporality_testing.synapse import MatrixAccount, Synapse
from temporality_testing.telegram_emulator import TelegramEmulator
from temporality_testing.waiting import eventually

ALICE = TG_ALICE
#: How many ended questions the chat holds besides the open one.
ENDED = 12

USERS = telegram_first(fallback=["web"])

#: How the adapter finds a chat's questions: the service's mirror (watching), none, or one whose watch is not running
#: (down: the listing, as without one).
LOOKUPS = ["mirror", "no_mirror", "mirror_down"]


def _reads(sent: list[tuple[str, bytes]], bucket: str) -> list[str]:
    return [key for s, p in sent if (key := kv_read_key(s, p, bucket)) is not None]


@pytest.fixture
async def mirror(bus: Bus, request: pytest.FixtureRequest) -> AsyncIterator[ChannelMirror | None]:
    lookup = getattr(request, "param", "mirror")
    if lookup == "no_mirror":
        yield None
        return
    mirror = await ChannelMirror.open(bus)
    if lookup == "mirror_down":
        yield mirror
        return
    async with mirror.watching():
        yield mirror


async def _live(mirror: ChannelMirror | None) -> bool:
    """Whether the adapter looks up in ``mirror`` (it watches and has caught up), not in a listing."""
    return mirror is not None and await mirror.caught_up()


async def _ended(bus: Bus, mirror: ChannelMirror | None, run_id: str, request_ids: list[str]) -> None:
    """End the run (its requests cancelled, their run entries marked ended), and wait until the mirror shows it."""
    ends = RunEndHandler(bus, mirror=mirror)
    await ends.handle(make_event(RunCancelled(run_id=run_id, reason="stopped"), source="/test", run_id=run_id))
    for request_id in request_ids:
        await wait_for_record(bus, request_id, lambda r: r.status is HumanRequestState.CANCELLED)
    if mirror is not None and await _live(mirror):
        await eventually(
            lambda: _async(all(mirror.ended(i) for i in request_ids)), what="the mirror shows the run entries ended"
        )


async def _async(value: bool) -> bool:
    return value


# ---------------------------------------------------------------------------------------------------- Telegram
@pytest.fixture
async def emulator() -> AsyncIterator[TelegramEmulator]:
    async with TelegramEmulator().serve() as tg:
        yield tg


@pytest.fixture
async def intake(bus: Bus, emulator: TelegramEmulator, mirror: ChannelMirror | None) -> AsyncIterator[RequestHandler]:
    directory = Directory.from_mapping(USERS)
    adapters: dict[str, ChannelAdapter] = {}
    router = AnswerRouter(bus, directory, adapters)
    web = WebInboxAdapter()
    telegram = TelegramAdapter(bus, token=emulator.token, base_url=emulator.base_url, poll_timeout_s=1, mirror=mirror)
    for adapter in (web, telegram):
        adapter.attach(router)
    async with web, telegram:
        adapters.update({web.name: web, telegram.name: telegram})
        yield RequestHandler(bus, directory, adapters)


async def _say(emulator: TelegramEmulator, text: str) -> str:
    """Alice writes ``text`` (no reply) in her chat with the bot; the bot's reply to it."""
    said = await emulator.say(ALICE, text)
    told = await emulator.wait_for_message(
        ALICE.id, lambda m: m.get("reply_to_message", {}).get("message_id") == said["message_id"]
    )
    return str(told["text"])


@pytest.mark.parametrize("mirror", LOOKUPS, indirect=True)
async def test_a_bare_message_in_a_chat_of_many_ended_questions_reads_only_the_open_ones_record(
    bus: Bus, intake: RequestHandler, emulator: TelegramEmulator, mirror: ChannelMirror | None, monkeypatch: Any
) -> None:
    """Twelve ended questions and one open one in Alice's chat: her bare message binds to the open one. With the
    mirror, none of the ended ones' records is read and none of the chat's keys (``telegram.msg.<chat>.*``) is read
    or listed; without it (or with its watch down) every key and record is read, as before."""
    run_id = new_id("run")
    ended = [
        (await ask_on_telegram(bus, intake, emulator, run_id=run_id, title=f"Old question {n}"))[0]
        for n in range(ENDED)
    ]
    await _ended(bus, mirror, run_id, ended)
    open_id, _ = await ask_on_telegram(bus, intake, emulator, title="Deploy 9: which region")

    sent = count_requests(bus, monkeypatch)
    assert await _say(emulator, "2") == "Recorded for “Deploy 9: which region” as option 2 “Drop v1”."
    record = await wait_for_record(bus, open_id, lambda r: r.status is HumanRequestState.ANSWERED)
    assert record.answer == OptionAnswer(option_id="drop-v1", label="Drop v1")

    record_reads = _reads(sent, "human-requests")
    chat_reads = [k for k in _reads(sent, BUCKET_HUMAN_CHANNELS.name) if k.startswith("telegram.msg.")]
    assert open_id in record_reads  # reads are seen: the counts below are not vacuous
    if await _live(mirror):
        assert set(record_reads) == {open_id}  # the lookup's read, then the binding's own
        assert chat_reads == []
    else:  # the listing: every question's message key, and every record
        assert set(record_reads) == {open_id, *ended}
        assert len(chat_reads) == ENDED + 1
    await exactly(bus, "human.answered", 1)


async def test_a_bare_message_looked_up_in_the_mirror_binds_as_the_listing_would(
    bus: Bus, intake: RequestHandler, emulator: TelegramEmulator, mirror: ChannelMirror, monkeypatch: Any
) -> None:
    """With the mirror: a request whose run entry is missing (an older version's) stays a candidate and takes the
    message; one whose run entry lost its end mark is read once and, not pending, not bound; nothing open, or two
    open, gets the hint, newest first -- what the listing gives."""
    legacy, _ = await ask_on_telegram(bus, intake, emulator, title="Review PR 41: rename the flag")
    answered, question = await ask_on_telegram(bus, intake, emulator, title="Review PR 42: remove the v1 API")
    press = await emulator.press(ALICE, question, emulator.buttons(question)[0]["callback_data"])
    await emulator.wait_for_callback_answer(press)
    refs = ChannelRefs(bus)
    answered_key = ref_key("run", (await _run_of(bus, answered)), answered)
    await eventually(lambda: _async(mirror.ended(answered)), what="the answered request's run entry marked ended")
    # the mark is lost (best effort): the run entry says pending again; the legacy request has no run entry
    store = await bus.store(BUCKET_HUMAN_CHANNELS, ChannelRef)
    got = await store.get(answered_key)
    assert got is not None
    await store.put(answered_key, got.value.model_copy(update={"ended_at": None, "ended": None}))
    await refs.delete(ref_key("run", await _run_of(bus, legacy), legacy))
    await eventually(lambda: _async(not mirror.ended(answered)), what="the mirror sees the mark lost")
    assert await mirror.caught_up()

    sent = count_requests(bus, monkeypatch)
    assert await _say(emulator, "keep v1 please") == (
        "Recorded for “Review PR 41: rename the flag” in your own words: “keep v1 please”."
    )
    bound = await wait_for_record(bus, legacy, lambda r: r.status is HumanRequestState.ANSWERED)
    assert bound.answer == TextAnswer(value="keep v1 please")
    assert answered in _reads(sent, "human-requests")  # the stale candidate: read, found answered, not bound
    assert (await stored(bus, answered)).answer == OptionAnswer(option_id="keep-v1", label="Keep the v1 API")  # type: ignore[union-attr]

    told = await _say(emulator, "2")  # nothing open
    assert told.startswith("To answer a question, reply to the question's message")
    assert told.endswith("There is no open question here right now.")

    await ask_on_telegram(bus, intake, emulator, title="Deploy 7: which region")
    await ask_on_telegram(bus, intake, emulator, title="Deploy 8: how many replicas")
    told = await _say(emulator, "1")  # two open: not guessed
    assert re.search(
        r"2 questions are open here: “Deploy 8: how many replicas” \(run \w{8}\), “Deploy 7: which region” \(run \w{8}\)\.$",
        told,
    ), told
    await exactly(bus, "human.answered", 2)


async def _run_of(bus: Bus, request_id: str) -> str:
    record = await stored(bus, request_id)
    assert record is not None
    return record.run_id


# ---------------------------------------------------------------------------------------------------- Matrix
#: Fewer on Matrix: each question is a message, its reactions and a poll on a real homeserver.
MATRIX_ENDED = 4


@pytest.fixture
async def bot(
    bus: Bus, synapse: Synapse, matrix_accounts: dict[str, MatrixAccount], mirror: ChannelMirror | None
) -> AsyncIterator[RequestHandler]:
    async with alice_on_matrix(bus, synapse, matrix_accounts, mirror=mirror) as handler:
        yield handler


@pytest.fixture
async def alice(synapse: Synapse, matrix_accounts: dict[str, MatrixAccount]) -> AsyncIterator[MatrixPerson]:
    person = await MatrixPerson(synapse.url, matrix_accounts["alice"]).start()
    try:
        yield person
    finally:
        await person.close()


async def _ask_matrix(bus: Bus, bot: RequestHandler, alice: MatrixPerson, **kw: Any) -> tuple[str, str, str]:
    event = requested(**kw)
    await bot.handle(event)
    request_id = str(event.data["request_id"])
    record = await stored(bus, request_id)
    assert record is not None
    copy = record.copy_on("matrix")
    assert copy is not None
    room_id, question = await alice.wait_for(lambda _r, e: e.get("event_id") == copy.reference, what="the question")
    return request_id, room_id, str(question["event_id"])


@pytest.mark.parametrize("mirror", ["mirror", "no_mirror"], indirect=True)
async def test_a_bare_message_in_a_room_of_many_ended_questions_reads_only_the_open_ones_record(
    bus: Bus,
    bot: RequestHandler,
    alice: MatrixPerson,
    matrix_accounts: dict[str, MatrixAccount],
    mirror: ChannelMirror | None,
    monkeypatch: Any,
) -> None:
    """Ended questions and one open one in Alice's DM: her bare message binds to the open one; with the mirror the
    ended ones' records are not read (nor the room's ``matrix.asked.*`` keys). Then, with nothing open (every
    question ended: with the mirror, no record read at all), she is told there is no open question -- the room was
    asked in, so the message is not left alone."""
    bot_id = matrix_accounts["bot"].user_id
    run_id = new_id("run")
    ended = [
        (await _ask_matrix(bus, bot, alice, run_id=run_id, title=f"Old question {n}"))[0] for n in range(MATRIX_ENDED)
    ]
    await _ended(bus, mirror, run_id, ended)
    open_id, room_id, _ = await _ask_matrix(bus, bot, alice, title="Deploy 9: which region")

    sent = count_requests(bus, monkeypatch)
    said = await alice.say(room_id, "2")
    bound = await wait_for_record(bus, open_id, lambda r: r.status is HumanRequestState.ANSWERED)
    assert bound.answer == OptionAnswer(option_id="drop-v1", label="Drop v1")
    told = await alice.wait_for_reply_to(said, sender=bot_id)
    assert told["content"]["body"].endswith("“Deploy 9: which region” — Recorded as option 2 “Drop v1”")
    record_reads = _reads(sent, "human-requests")
    asked_reads = [k for k in _reads(sent, BUCKET_HUMAN_CHANNELS.name) if k.startswith("matrix.asked.")]
    assert open_id in record_reads
    if mirror is not None:
        assert set(record_reads) == {open_id}
        assert asked_reads == []
        await eventually(lambda: _async(mirror.ended(open_id)), what="the answered request's run entry marked ended")
    else:
        assert set(record_reads) == {open_id, *ended}
        assert len(asked_reads) == MATRIX_ENDED + 1

    sent.clear()
    said = await alice.say(room_id, "1")  # nothing open: told so, not left alone
    told = await alice.wait_for_reply_to(said, sender=bot_id)
    assert told["content"]["body"].endswith("There is no open question here right now.")
    if mirror is not None:
        assert _reads(sent, "human-requests") == []
    await exactly(bus, "human.answered", 1)
