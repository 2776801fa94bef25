"""The Telegram channel against the Bot API emulator over real HTTP (HUM-3, HUM-4): python-telegram-bot runs
in the test's event loop exactly as in the service; people press buttons and reply through the emulator."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from human_support import OPTIONS, ask_on_telegram, events_of, exactly, requested, running, stored, wait_for_record

from temporality_bus import Bus, Consumer, PermanentError, TransientError
from temporality_human_interaction.api import create_app
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.channels.telegram import TelegramAdapter
from temporality_human_interaction.deadlines import DeadlineHandler
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.inbound import AnswerRouter
from temporality_human_interaction.notifications import NotificationHandler
from temporality_human_interaction.records import HumanRequestRecord
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.runs import RunEndHandler
from temporality_human_interaction.settings import Settings
from temporality_protocol import (
    Envelope,
    HumanAnswered,
    HumanNotified,
    HumanNotifyRequested,
    HumanOption,
    HumanPolicy,
    HumanRequested,
    HumanRequestState,
    OptionAnswer,
    RunCancelled,
    TextAnswer,
    TimeoutPolicy,
    make_event,
    new_id,
)
from temporality_protocol.catalog import CONSUMERS
from temporality_testing.telegram_emulator import TelegramEmulator, TelegramUser, text_length
from temporality_testing.waiting import stays

ALICE = TelegramUser(1001, "Alice")
BOB = TelegramUser(1002, "Bob")
CAROL = TelegramUser(3003, "Carol")  # nobody in the directory
#: A time as the chat shows it: ``05:05 UTC`` (with the date when it is not today's: a test that ran over midnight).
HHMM = r"(?:\d{4}-\d\d-\d\d )?\d\d:\d\d UTC"

USERS = {
    "users": {
        "alice": {
            "display_name": "Alice Example",
            "inbox_token": "alice-demo-inbox-token-change-me",
            "preferred": "telegram",
            "fallback": ["web"],
            "channels": {"telegram": {"chat_id": ALICE.id}, "web": {}},
        },
        "bob": {
            "display_name": "Bob Example",
            "inbox_token": "bob-demo-inbox-token-change-me",
            "preferred": "telegram",
            "channels": {"telegram": {"chat_id": BOB.id}, "web": {}},
        },
    }
}


@pytest.fixture
def tg_directory() -> Directory:
    return Directory.from_mapping(USERS)


@pytest.fixture
async def emulator() -> AsyncIterator[TelegramEmulator]:
    async with TelegramEmulator().serve() as tg:
        yield tg


def _telegram(bus: Bus, tg: TelegramEmulator) -> TelegramAdapter:
    return TelegramAdapter(bus, token=tg.token, base_url=tg.base_url, poll_timeout_s=1)


@pytest.fixture
async def channels(
    bus: Bus, emulator: TelegramEmulator, tg_directory: Directory
) -> AsyncIterator[tuple[dict[str, ChannelAdapter], AnswerRouter]]:
    adapters: dict[str, ChannelAdapter] = {}
    router = AnswerRouter(bus, tg_directory, adapters)
    web, telegram = WebInboxAdapter(), _telegram(bus, emulator)
    for adapter in (web, telegram):
        adapter.attach(router)
    async with web, telegram:
        adapters.update({web.name: web, telegram.name: telegram})
        yield adapters, router


@pytest.fixture
def intake(
    bus: Bus, tg_directory: Directory, channels: tuple[dict[str, ChannelAdapter], AnswerRouter]
) -> RequestHandler:
    return RequestHandler(bus, tg_directory, channels[0])


async def test_button_press_binds_the_option_and_the_message_shows_the_outcome(
    bus: Bus, intake: RequestHandler, emulator: TelegramEmulator
) -> None:
    request_id, message = await ask_on_telegram(bus, intake, emulator)
    [notified] = await events_of(bus, "human.notified", wait_for=1)
    assert notified.payload(HumanNotified).channel == "telegram"
    assert notified.payload(HumanNotified).fallback_from is None

    # The compact question (HUM-5): task, why, options with consequences, deadline and timeout outcome.
    text = message["text"]
    assert "Review PR 42" in text
    assert "two internal clients" in text
    assert "1. Keep the v1 API — The PR is asked to restore v1" in text
    assert "No answer by" in text
    buttons = emulator.buttons(message)
    assert [b["text"] for b in buttons] == ["1. Keep the v1 API", "2. Drop v1"]
    for button in buttons:  # a short token, never the request id
        assert request_id not in button["callback_data"]
        assert len(button["callback_data"]) <= 64

    query = await emulator.press(ALICE, message, buttons[1]["callback_data"])
    answer = await emulator.wait_for_callback_answer(query)
    assert answer["text"] == "Recorded: Drop v1"

    [answered] = await exactly(bus, "human.answered")
    payload = answered.payload(HumanAnswered)
    assert payload.answer == OptionAnswer(option_id="drop-v1", label="Drop v1")
    assert payload.channel == "telegram"
    assert payload.responder == "user:alice"

    edited = await emulator.wait_for_edit(message)
    assert "✅ Answered by Alice Example: “Drop v1”" in edited["text"]
    assert "reply_markup" not in edited  # the buttons are gone
    record = await stored(bus, request_id)
    assert record is not None
    assert record.copy_on("telegram") is not None


async def test_free_text_reply_binds_text_and_an_option_number_binds_the_option(
    bus: Bus, intake: RequestHandler, emulator: TelegramEmulator
) -> None:
    first, question = await ask_on_telegram(bus, intake, emulator)
    said = await emulator.reply(ALICE, question, "Keep it until the June release, then drop it")
    await emulator.wait_for_message(
        ALICE.id, lambda m: m.get("reply_to_message", {}).get("message_id") == said["message_id"]
    )
    record = await wait_for_record(bus, first, lambda r: r.status is HumanRequestState.ANSWERED)
    assert record.answer == TextAnswer(value="Keep it until the June release, then drop it")
    assert record.answer_channel == "telegram"

    second, question2 = await ask_on_telegram(bus, intake, emulator)
    await emulator.reply(ALICE, question2, "1")
    record2 = await wait_for_record(bus, second, lambda r: r.status is HumanRequestState.ANSWERED)
    assert record2.answer == OptionAnswer(option_id=OPTIONS[0].id, label=OPTIONS[0].label)
    await exactly(bus, "human.answered", 2)


async def test_a_reply_that_does_not_fit_the_form_is_answered_with_why_and_binds_nothing(
    bus: Bus, intake: RequestHandler, emulator: TelegramEmulator
) -> None:
    """A request with a form (an MCP elicitation's schema): a misfit reply is told what is wrong, in the chat,
    and nothing is bound; a fitting reply binds."""
    form = {
        "type": "object",
        "properties": {"replicas": {"type": "integer", "minimum": 1}, "region": {"type": "string", "enum": ["eu"]}},
        "required": ["replicas", "region"],
    }
    decline = HumanOption(id="decline", label="Decline")
    request_id, question = await ask_on_telegram(bus, intake, emulator, answer_schema=form, options=[decline])
    said = await emulator.reply(ALICE, question, "replicas: a few\nregion: eu")
    told = await emulator.wait_for_message(
        ALICE.id, lambda m: m.get("reply_to_message", {}).get("message_id") == said["message_id"]
    )
    assert told["text"].startswith("Not recorded: the answer does not fit the form: field 'replicas'"), told
    assert "is not of type 'integer'" in told["text"]
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status is HumanRequestState.PENDING
    assert await events_of(bus, "human.answered") == []

    await emulator.reply(ALICE, question, "replicas: 2\nregion: eu")
    record = await wait_for_record(bus, request_id, lambda r: r.status is HumanRequestState.ANSWERED)
    assert record.answer == TextAnswer(value="replicas: 2\nregion: eu")
    await exactly(bus, "human.answered", 1)


async def test_stale_button_is_refused_with_the_reason_and_binds_nothing(
    bus: Bus, intake: RequestHandler, emulator: TelegramEmulator
) -> None:
    request_id, message = await ask_on_telegram(bus, intake, emulator)
    data = emulator.buttons(message)[0]["callback_data"]
    first = await emulator.press(ALICE, message, data)
    assert (await emulator.wait_for_callback_answer(first))["text"].startswith("Recorded")

    await emulator.wait_for_edit(message)  # the buttons are gone, but an old client may still show them
    same = await emulator.press(ALICE, message, data)  # the same button again: idempotent
    assert (await emulator.wait_for_callback_answer(same))["text"] == "Already recorded: Keep the v1 API"
    other = await emulator.press(ALICE, message, emulator_data(data, 2))  # another option: refused
    refusal = await emulator.wait_for_callback_answer(other)
    # to the person who answered: "you", what they answered, the time as the question shows times (no ISO stamp)
    assert re.fullmatch(
        "Not recorded: you already answered “Review PR 42: remove the v1 API”: “Keep the v1 API”, at " + HHMM + r"\.",
        refusal["text"],
    ), refusal["text"]
    assert refusal["show_alert"] == "true"
    await exactly(bus, "human.answered", 1)

    forged = await emulator.press(ALICE, message, "not-a-token:1")
    assert "does not belong" in (await emulator.wait_for_callback_answer(forged))["text"]
    record = await stored(bus, request_id)
    assert record is not None
    assert record.answer == OptionAnswer(option_id="keep-v1", label="Keep the v1 API")


def emulator_data(data: str, number: int) -> str:
    """The callback data of option ``number`` under the same question (same token)."""
    return f"{data.partition(':')[0]}:{number}"


async def test_an_expired_request_edits_the_message_and_its_buttons_are_refused(
    bus: Bus,
    intake: RequestHandler,
    emulator: TelegramEmulator,
    channels: tuple[dict[str, ChannelAdapter], AnswerRouter],
) -> None:
    deadlines = Consumer(
        bus,
        CONSUMERS["human-interaction-deadlines"],
        raw_handler=DeadlineHandler(bus, on_outcome=channels[1].show_outcome).handle,
        fetch_timeout_s=0.2,
    )
    async with running(deadlines):
        on_timeout = TimeoutPolicy(action="default", default_option="keep-v1")
        request_id, message = await ask_on_telegram(bus, intake, emulator, expires_in_s=1, on_timeout=on_timeout)
        data = emulator.buttons(message)[0]["callback_data"]
        await wait_for_record(bus, request_id, lambda r: r.status is HumanRequestState.EXPIRED, within_s=30)
        edited = await emulator.wait_for_edit(message, lambda m: "⌛ Expired" in m["text"])
        assert "reply_markup" not in edited
        # what the run did is said, the time as the question shows times
        went = "without an answer — the run went ahead with the default: “Keep the v1 API”."
        assert re.search("⌛ Expired at " + HHMM + " " + re.escape(went), edited["text"]), edited["text"]
    late = await emulator.press(ALICE, message, data)
    answer = await emulator.wait_for_callback_answer(late)
    assert re.fullmatch("Not recorded: expired at " + HHMM + " " + re.escape(went), answer["text"]), answer["text"]
    assert await events_of(bus, "human.answered") == []


async def test_foreign_users_are_told_and_nothing_is_bound(
    bus: Bus, intake: RequestHandler, emulator: TelegramEmulator
) -> None:
    request_id, message = await ask_on_telegram(bus, intake, emulator)
    data = emulator.buttons(message)[0]["callback_data"]

    stranger = await emulator.press(CAROL, message, data)  # not in the directory at all
    assert "only the recipient may answer" in (await emulator.wait_for_callback_answer(stranger))["text"]
    colleague = await emulator.press(BOB, message, data)  # a known person, but not the one asked
    assert "only the recipient may answer" in (await emulator.wait_for_callback_answer(colleague))["text"]
    said = await emulator.reply(BOB, message, "drop it")  # in a chat Bob shares with the bot and Alice
    told = await emulator.wait_for_message(
        message["chat"]["id"], lambda m: m.get("reply_to_message", {}).get("message_id") == said["message_id"]
    )
    assert told["text"] == "Not recorded: only the recipient may answer."

    async def still_pending() -> bool:
        record = await stored(bus, request_id)
        return record is not None and record.pending

    await stays(still_pending, settle_s=1.0, what="the request staying pending")
    assert await events_of(bus, "human.answered") == []


async def test_an_answer_in_the_web_inbox_edits_the_telegram_copy(
    bus: Bus,
    intake: RequestHandler,
    emulator: TelegramEmulator,
    tg_directory: Directory,
    channels: tuple[dict[str, ChannelAdapter], AnswerRouter],
) -> None:
    request_id, message = await ask_on_telegram(bus, intake, emulator)
    app = create_app(Settings(bus_timeout_s=5.0), bus, tg_directory, channels[1])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://human.test") as web:
        got = await web.post(
            f"/requests/{request_id}/answer",
            json={"option_id": "keep-v1"},
            headers={"Authorization": "Bearer alice-demo-inbox-token-change-me"},
        )
    assert got.status_code == 200, got.text
    edited = await emulator.wait_for_edit(message)
    assert "Answered by Alice Example: “Keep the v1 API”" in edited["text"]
    [answered] = await exactly(bus, "human.answered")
    assert answered.payload(HumanAnswered).channel == "web"


async def test_a_restarted_adapter_still_binds_buttons_it_sent_before(
    bus: Bus, tg_directory: Directory, emulator: TelegramEmulator
) -> None:
    router = AnswerRouter(bus, tg_directory)
    first = _telegram(bus, emulator)
    first.attach(router)
    async with first:
        await RequestHandler(bus, tg_directory, {first.name: first}).handle(event := requested())
        message = await emulator.wait_for_message(ALICE.id)
    second = _telegram(bus, emulator)  # a new process: nothing in memory, the bindings are in KV
    second.attach(AnswerRouter(bus, tg_directory, {"telegram": second}))
    async with second:
        query = await emulator.press(ALICE, message, emulator.buttons(message)[0]["callback_data"])
        assert (await emulator.wait_for_callback_answer(query))["text"] == "Recorded: Keep the v1 API"
        await emulator.wait_for_edit(message)
    record = await stored(bus, str(event.data["request_id"]))
    assert record is not None
    assert record.status is HumanRequestState.ANSWERED


async def test_a_run_that_ends_cancels_its_pending_requests_and_updates_their_messages(
    bus: Bus,
    intake: RequestHandler,
    emulator: TelegramEmulator,
    channels: tuple[dict[str, ChannelAdapter], AnswerRouter],
    tg_directory: Directory,
) -> None:
    run_id = "run-ends-1"
    pending, message = await ask_on_telegram(bus, intake, emulator, run_id=run_id)
    data = emulator.buttons(message)[0]["callback_data"]
    answered, answered_message = await ask_on_telegram(bus, intake, emulator, run_id=run_id)
    other_run, _ = await ask_on_telegram(bus, intake, emulator)
    press = await emulator.press(ALICE, answered_message, emulator.buttons(answered_message)[0]["callback_data"])
    await emulator.wait_for_callback_answer(press)

    runs = Consumer(
        bus,
        CONSUMERS["human-interaction-runs"],
        handler=RunEndHandler(bus, channels[1].show_outcome).handle,
        fetch_timeout_s=0.2,
    )
    async with running(runs):
        await bus.publish(
            make_event(RunCancelled(run_id=run_id, reason="cancelled by on-call"), source="/test", run_id=run_id)
        )
        record = await wait_for_record(bus, pending, lambda r: r.status is HumanRequestState.CANCELLED)
        assert record.answer is None
        edited = await emulator.wait_for_edit(message, lambda m: "🚫 Cancelled" in m["text"])
        assert "reply_markup" not in edited

        # A request of the ended run that arrives late is cancelled at intake and never sent.
        late = requested(run_id=run_id)
        await intake.handle(late)
        late_record = await stored(bus, str(late.data["request_id"]))
        assert late_record is not None
        assert late_record.status is HumanRequestState.CANCELLED
        assert late_record.deliveries == []

    assert (await stored(bus, answered)).status is HumanRequestState.ANSWERED  # type: ignore[union-attr]
    assert (await stored(bus, other_run)).pending  # type: ignore[union-attr]
    app = create_app(Settings(bus_timeout_s=5.0), bus, tg_directory, channels[1])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://human.test") as web:
        refused = await web.post(
            f"/requests/{pending}/answer",
            json={"option_id": "keep-v1"},
            headers={"Authorization": "Bearer alice-demo-inbox-token-change-me"},
        )
    assert refused.status_code == 409
    assert refused.json()["error"] == "cancelled"
    late_press = await emulator.press(ALICE, message, data)
    assert (
        "the request is cancelled, “Review PR 42: remove the v1 API” no longer needs an answer"
        in (await emulator.wait_for_callback_answer(late_press))["text"]
    )


def _notify_event(recipient: str = "user:alice", allowed: tuple[str, ...] = ("user:alice",)) -> Envelope:
    data = HumanNotifyRequested(
        notification_id=new_id("hn"),
        run_id="run-notify-1",
        agent="reviewer",
        title="Review PR 42",
        recipient=recipient,
        message="Review finished: two comments.",
        policy=HumanPolicy(allowed_recipients=list(allowed)),
        turn=3,
    )
    return make_event(data, source="/test", run_id=data.run_id)


async def test_a_notification_goes_to_the_preferred_channel_once(
    bus: Bus,
    emulator: TelegramEmulator,
    tg_directory: Directory,
    channels: tuple[dict[str, ChannelAdapter], AnswerRouter],
) -> None:
    handler = NotificationHandler(bus, tg_directory, channels[0])
    event = _notify_event()
    await handler.handle(event)
    await handler.handle(event)  # redelivered: not sent again
    sent = await emulator.wait_for_message(ALICE.id, lambda m: "Review finished" in m["text"])
    assert sent["text"] == "📣 Review PR 42\n\nReview finished: two comments."
    assert [m for m in emulator.messages.values() if "Review finished" in m["text"]] == [sent]

    with pytest.raises(PermanentError, match="SEC-1"):
        await handler.handle(_notify_event(recipient="user:bob", allowed=("user:alice",)))

    emulator.block(BOB.id)  # bob's only other channel is the web inbox, which carries no notifications
    with pytest.raises(TransientError, match="could not be sent"):
        await handler.handle(_notify_event(recipient="user:bob", allowed=("user:bob",)))


async def test_a_delivery_repeated_before_its_copy_was_recorded_sends_no_second_message(
    bus: Bus,
    emulator: TelegramEmulator,
    tg_directory: Directory,
    channels: tuple[dict[str, ChannelAdapter], AnswerRouter],
) -> None:
    """The request handler crashed after ``sendMessage`` but before recording the copy: the redelivery's send
    finds the message it already sent (``telegram.sent.…``) and reuses it (the reminder is its own send)."""
    event = requested(allowed=("user:alice",))
    record = HumanRequestRecord.from_requested(event, event.payload(HumanRequested))
    profile = tg_directory.get("alice")
    assert profile is not None
    telegram = channels[0]["telegram"]
    first = await telegram.deliver(record, profile)
    again = await telegram.deliver(record, profile)  # the redelivery, the copy never recorded
    assert again == first
    reminder = await telegram.deliver(record, profile, banner="🔔 Reminder 1 of 1", tag="reask-1")
    assert reminder.reference != first.reference
    await emulator.wait_for_message(ALICE.id, lambda m: str(m["message_id"]) == reminder.reference)
    sent = [m for (chat, _), m in emulator.messages.items() if chat == ALICE.id and m["from"]["is_bot"]]
    assert sorted(str(m["message_id"]) for m in sent) == sorted([str(first.reference), str(reminder.reference)])


#: Ten options, each with a consequence just under the Telegram field cap (800): ~9,700 characters rendered in full.
LONG_OPTIONS = [
    HumanOption(id=f"opt-{n}", label=f"Option {n}", consequence=f"Consequence {n}: " + "lorem ipsum " * 63)
    for n in range(1, 11)
]


async def test_a_question_over_telegrams_limit_is_cut_to_fit_options_kept_and_its_outcome_fits_too(
    bus: Bus,
    intake: RequestHandler,
    emulator: TelegramEmulator,
    channels: tuple[dict[str, ChannelAdapter], AnswerRouter],
) -> None:
    """The emulator refuses a text over 4,096 like the real Bot API: the question (ten options with long
    consequences, a long context) arrives cut to fit, every option and the way to answer kept, with a note linking
    the inbox; the outcome edit fits as well."""
    channels[0]["telegram"].inbox_url = "https://temporality.example.org/#/inbox"
    request_id, message = await ask_on_telegram(bus, intake, emulator, options=LONG_OPTIONS, context="why " * 700)
    text = message["text"]
    assert text_length(text) <= 4096
    for n in range(1, 11):
        assert f"\n{n}. Option {n}" in text
    assert "…(cut; full question in the inbox: https://temporality.example.org/#/inbox)" in text
    assert (
        "To answer: tap an option below, or reply to this message with your own answer (while it is your only open"
        in text
    )
    assert "Should the v1 API stay for one more release?" in text  # cut after the context and consequences
    assert "🤖 reviewer (agent) asks:" in text  # who asks
    assert len(emulator.buttons(message)) == 10

    query = await emulator.press(ALICE, message, emulator.buttons(message)[9]["callback_data"])
    assert (await emulator.wait_for_callback_answer(query))["text"] == "Recorded: Option 10"
    edited = await emulator.wait_for_edit(message)
    assert text_length(edited["text"]) <= 4096
    assert edited["text"].endswith("✅ Answered by Alice Example: “Option 10” " + edited["text"][-9:])
    assert "\n10. Option 10" in edited["text"]
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status is HumanRequestState.ANSWERED


async def test_a_long_label_already_recorded_is_cut_to_the_callback_answers_200_characters(
    bus: Bus, intake: RequestHandler, emulator: TelegramEmulator
) -> None:
    label = "Keep the v1 contract and " + "x" * 165  # 190 characters: "Already recorded: " + it is over 200
    options = [HumanOption(id="keep", label=label), HumanOption(id="drop", label="Drop")]
    _, message = await ask_on_telegram(bus, intake, emulator, options=options)
    data = emulator.buttons(message)[0]["callback_data"]
    first = await emulator.press(ALICE, message, data)
    assert (await emulator.wait_for_callback_answer(first))["text"] == f"Recorded: {label}"
    again = await emulator.press(ALICE, message, data)
    told = (await emulator.wait_for_callback_answer(again))["text"]  # answered, not refused by the Bot API
    assert told.startswith("Already recorded: Keep the v1 contract")
    assert told.endswith("…")
    assert len(told) == 200


async def test_a_bare_message_answers_the_chats_one_open_question_else_says_how_to_answer(
    bus: Bus, intake: RequestHandler, emulator: TelegramEmulator
) -> None:
    """Not a reply: it binds to the one question open in the person's chat (an older one, when the newest is
    answered), the confirmation naming it; with none or several open, a hint says how to answer (and lists them)."""
    older, _ = await ask_on_telegram(bus, intake, emulator, title="Review PR 41: rename the flag")
    newest, question = await ask_on_telegram(bus, intake, emulator, title="Review PR 42: remove the v1 API")
    query = await emulator.press(ALICE, question, emulator.buttons(question)[0]["callback_data"])
    await emulator.wait_for_callback_answer(query)

    said = await emulator.say(ALICE, "2")  # the newest is answered: the older one is the only one open
    told = await emulator.wait_for_message(
        ALICE.id, lambda m: m.get("reply_to_message", {}).get("message_id") == said["message_id"]
    )
    assert told["text"] == "Recorded for “Review PR 41: rename the flag” as option 2 “Drop v1”."
    record = await wait_for_record(bus, older, lambda r: r.status is HumanRequestState.ANSWERED)
    assert record.answer == OptionAnswer(option_id="drop-v1", label="Drop v1")

    said = await emulator.say(ALICE, "keep v1 please")  # nothing open
    told = await emulator.wait_for_message(
        ALICE.id, lambda m: m.get("reply_to_message", {}).get("message_id") == said["message_id"]
    )
    assert told["text"].startswith("To answer a question, reply to the question's message")
    assert "no open question" in told["text"]

    await ask_on_telegram(bus, intake, emulator, title="Deploy 7: which region")
    await ask_on_telegram(bus, intake, emulator, title="Deploy 8: how many replicas")
    said = await emulator.say(ALICE, "1")  # two open: which one is meant is not guessed
    told = await emulator.wait_for_message(
        ALICE.id, lambda m: m.get("reply_to_message", {}).get("message_id") == said["message_id"]
    )
    assert re.search(
        r"2 questions are open here: “Deploy 8: how many replicas” \(run \w{8}\), “Deploy 7: which region” \(run \w{8}\)\.$",
        told["text"],
    ), told["text"]
    await exactly(bus, "human.answered", 2)
    assert (await stored(bus, newest)).answer == OptionAnswer(option_id="keep-v1", label="Keep the v1 API")  # type: ignore[union-attr]


async def test_the_question_says_why_the_agent_asks_on_telegram_and_in_the_inbox(
    bus: Bus,
    intake: RequestHandler,
    emulator: TelegramEmulator,
    tg_directory: Directory,
    channels: tuple[dict[str, ChannelAdapter], AnswerRouter],
) -> None:
    """OBS-1 for the person: ask_human's ``reason`` is one ``Why:`` line of the chat question (its line breaks
    collapsed, a secret in it redacted) and the inbox API's ``reason`` / ``reason_kind``; a question without a
    reason has no such line and null fields."""
    secret = "ghp_" + "Tg7Nc6Bv5Vc4Xz3Lk2Jh1" * 2
    request_id, message = await ask_on_telegram(
        bus,
        intake,
        emulator,
        reason=f"Publishing is irreversible,\na person must approve ({secret})",
        reason_kind="approval",
    )
    text = message["text"]
    why = [line for line in text.splitlines() if line.startswith("Why: ")]
    assert why == ["Why: Publishing is irreversible, a person must approve ([REDACTED:github_token])"]
    # after the context, before who asks
    assert text.index("two internal clients") < text.index(why[0]) < text.index("🤖 reviewer (agent) asks:")
    assert secret not in text

    plain_id, plain = await ask_on_telegram(bus, intake, emulator, title="Review PR 43")
    assert "Why:" not in plain["text"]

    app = create_app(Settings(bus_timeout_s=5.0), bus, tg_directory, channels[1])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://human.test") as web:
        got = await web.get("/inbox", headers={"Authorization": "Bearer alice-demo-inbox-token-change-me"})
    assert got.status_code == 200, got.text
    items = {item["id"]: item for item in got.json()["requests"]}
    assert items[request_id]["reason"] == "Publishing is irreversible,\na person must approve ([REDACTED:github_token])"
    assert items[request_id]["reason_kind"] == "approval"
    assert items[plain_id]["reason"] is None
    assert items[plain_id]["reason_kind"] is None
    schema = app.openapi()["components"]["schemas"]["InboxItem"]["properties"]  # documented for API clients
    assert "why the agent asks" in schema["reason"]["description"]
    assert "approval" in schema["reason_kind"]["description"]
