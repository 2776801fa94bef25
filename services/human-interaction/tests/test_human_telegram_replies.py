"""What a person writes in Telegram that is not a plain answer to the question it replies to (HUM-3, HUM-4):
an edited message, a reply to the bot's own confirmation or hint, an option typed the many ways people type
one, a number that is no option; and what the bot says back.

Real parts: nats-server (the fixtures) and python-telegram-bot polling the Bot API emulator over real HTTP
(:func:`human_support.telegram_and_web`, the ``telegram`` fixture); alice writes, replies and edits through the
emulator, as the person answering at 2 a.m. would."""

from __future__ import annotations

import re
from typing import Any

from human_support import TG_ALICE, TelegramDesk, ask_on_telegram, stored, wait_for_record

from temporality_bus import Bus
from temporality_protocol import HumanOption, HumanRequestState, OptionAnswer, TextAnswer
from temporality_testing.telegram_emulator import TelegramEmulator
from temporality_testing.waiting import stays

ALICE = TG_ALICE
Json = dict[str, Any]
KEEP = OptionAnswer(option_id="keep-v1", label="Keep the v1 API")
DROP = OptionAnswer(option_id="drop-v1", label="Drop v1")


async def _told(tg: TelegramEmulator, said: Json, starts: str = "") -> Json:
    """The bot's reply to alice's message ``said`` (the first one starting with ``starts``)."""
    return await tg.wait_for_message(
        ALICE.id,
        lambda m: (
            m.get("reply_to_message", {}).get("message_id") == said["message_id"] and m["text"].startswith(starts)
        ),
    )


async def _pending(bus: Bus, request_id: str) -> bool:
    record = await stored(bus, request_id)
    return record is not None and record.status is HumanRequestState.PENDING


async def test_an_edited_answer_is_never_bound_and_the_person_is_told(bus: Bus, telegram: TelegramDesk) -> None:
    """Alice answered PR #101 with "1", then, with PR #103 open, edits that old "1" to "2": the edit binds nothing
    (not to PR #103, the one open now), PR #101's answer stays, and she is told so and how to answer."""
    tg, intake = telegram.tg, telegram.intake()
    first, question = await ask_on_telegram(bus, intake, tg, title="Review PR #101: drop v1")
    said = await tg.reply(ALICE, question, "1")
    await _told(tg, said, "Recorded for")
    await wait_for_record(bus, first, lambda r: r.answer == KEEP)
    second, _ = await ask_on_telegram(bus, intake, tg, title="Review PR #103: rename the flag")

    await tg.edit(ALICE, said, "2 — sorry, I meant 2")
    told = await _told(tg, said, "Not recorded: an edited message is never taken as an answer")
    assert "editing does not change an answer already recorded" in told["text"]
    assert re.search(r"One question is open here: “Review PR #103: rename the flag” \(run \w{8}\)", told["text"])

    await stays(lambda: _pending(bus, second), what="PR #103 still open")
    record = await stored(bus, first)
    assert record is not None
    assert record.answer == KEEP


async def test_a_reply_to_the_bots_confirmation_is_about_that_question_not_the_open_one(
    bus: Bus, telegram: TelegramDesk
) -> None:
    """A reply to the bot's "Recorded for PR #101" while PR #103 is the one open question: refused as PR #101's
    (already answered), never bound to PR #103. A reply to the bot's refusal about a question still open binds to
    that question, even with another one open too."""
    tg, intake = telegram.tg, telegram.intake()
    _, question = await ask_on_telegram(bus, intake, tg, title="Review PR #101: drop v1")
    said = await tg.reply(ALICE, question, "1")
    confirmation = await _told(tg, said, "Recorded for")
    second, question2 = await ask_on_telegram(bus, intake, tg, title="Review PR #103: rename the flag")

    said = await tg.reply(ALICE, confirmation, "2")
    told = await _told(tg, said)
    assert told["text"].startswith("Not recorded: you already answered “Review PR #101: drop v1”: “Keep the v1 API”")
    await stays(lambda: _pending(bus, second), what="PR #103 still open")

    said = await tg.reply(ALICE, question2, "3")  # no such option: refused, and the refusal is about PR #103
    refusal = await _told(tg, said)
    assert refusal["text"] == (
        "Not recorded: there is no option 3 for “Review PR #103: rename the flag”; its options are 1\u20132."
        " To answer in your own words, write more than a number."
    )
    third, _ = await ask_on_telegram(bus, intake, tg, title="Review PR #104: bump the SDK")  # two open now
    said = await tg.reply(ALICE, refusal, "2")
    told = await _told(tg, said)
    assert told["text"] == "Recorded for “Review PR #103: rename the flag” as option 2 “Drop v1”."
    await wait_for_record(bus, second, lambda r: r.answer == DROP)
    assert await _pending(bus, third)


async def test_a_reply_to_a_hint_listing_several_questions_is_never_bound(bus: Bus, telegram: TelegramDesk) -> None:
    """The bot's hint lists two open questions; a reply to it is answered with the hint again, even once only one
    of them is still open (which one the person meant is not guessed)."""
    tg, intake = telegram.tg, telegram.intake()
    first, question = await ask_on_telegram(bus, intake, tg, title="Deploy 7: which region")
    second, _ = await ask_on_telegram(bus, intake, tg, title="Deploy 8: how many replicas")
    said = await tg.say(ALICE, "1")
    hint = await _told(tg, said)
    assert "2 questions are open here" in hint["text"]

    said = await tg.reply(ALICE, hint, "1")
    told = await _told(tg, said)
    assert told["text"].startswith("Not recorded: that message lists several questions; which one you mean is not")
    assert "2 questions are open here" in told["text"]

    said = await tg.reply(ALICE, question, "2")  # Deploy 7 answered: Deploy 8 is the only one open
    await _told(tg, said, "Recorded for")
    said = await tg.reply(ALICE, hint, "1")
    told = await _told(tg, said)
    assert told["text"].startswith("Not recorded: that message lists several questions")
    await stays(lambda: _pending(bus, second), what="Deploy 8 still open")
    record = await stored(bus, first)
    assert record is not None
    assert record.answer == DROP


async def test_a_reply_to_a_hint_naming_one_question_answers_it(bus: Bus, telegram: TelegramDesk) -> None:
    """The hint after an edit names the one open question (PR #103): a reply to it -- what it invites -- answers PR
    #103, not "the message you replied to is not a question I can place" (again and again). Likewise the hint
    after a reply to the bot's greeting (a message about no question) while one question is open."""
    tg, intake = telegram.tg, telegram.intake()
    first, question = await ask_on_telegram(bus, intake, tg, title="Review PR #101: drop v1")
    said = await tg.reply(ALICE, question, "1")
    await _told(tg, said, "Recorded for")
    await wait_for_record(bus, first, lambda r: r.answer == KEEP)
    second, _ = await ask_on_telegram(bus, intake, tg, title="Review PR #103: rename the flag")
    await tg.edit(ALICE, said, "2")
    hint = await _told(tg, said, "Not recorded: an edited message")
    assert "One question is open here: “Review PR #103: rename the flag”" in hint["text"]

    said = await tg.reply(ALICE, hint, "2")
    told = await _told(tg, said)
    assert told["text"] == "Recorded for “Review PR #103: rename the flag” as option 2 “Drop v1”."
    await wait_for_record(bus, second, lambda r: r.answer == DROP)
    record = await stored(bus, first)
    assert record is not None
    assert record.answer == KEEP

    third, _ = await ask_on_telegram(bus, intake, tg, title="Review PR #104: bump the SDK")
    await tg.say(ALICE, "/start")
    greeting = await tg.wait_for_message(ALICE.id, lambda m: m["text"].startswith("Hello"))
    said = await tg.reply(ALICE, greeting, "1")
    hint = await _told(tg, said)
    assert hint["text"].startswith("Not recorded: the message you replied to is not a question I can place.")
    assert "One question is open here: “Review PR #104: bump the SDK”" in hint["text"]
    said = await tg.reply(ALICE, hint, "1")
    told = await _told(tg, said)
    assert told["text"] == "Recorded for “Review PR #104: bump the SDK” as option 1 “Keep the v1 API”."
    await wait_for_record(bus, third, lambda r: r.answer == KEEP)


async def test_options_labelled_with_numbers_are_answered_by_their_labels(bus: Bus, telegram: TelegramDesk) -> None:
    """A question "how many replicas?", options "3" and "5" (ids r3, r5): alice's "5" binds r5 -- the label, not a refusal
    for want of a fifth option; "7" (no label, no position) is refused naming the labels; "1" is the first option."""
    tg, intake = telegram.tg, telegram.intake()
    replicas = [HumanOption(id="r3", label="3"), HumanOption(id="r5", label="5")]
    first, question = await ask_on_telegram(bus, intake, tg, title="Deploy 8: how many replicas", options=replicas)
    said = await tg.reply(ALICE, question, "5")
    told = await _told(tg, said)
    assert told["text"] == "Recorded for “Deploy 8: how many replicas” as option 2 “5”."
    await wait_for_record(bus, first, lambda r: r.answer == OptionAnswer(option_id="r5", label="5"))

    second, question = await ask_on_telegram(bus, intake, tg, title="Deploy 9: how many replicas", options=replicas)
    said = await tg.reply(ALICE, question, "7")
    refusal = await _told(tg, said)
    assert refusal["text"] == (
        "Not recorded: there is no option 7 for “Deploy 9: how many replicas”; its options are 1\u20132 (or by label:"
        " “3”, “5”). To answer in your own words, write more than a number."
    )
    assert await _pending(bus, second)
    said = await tg.reply(ALICE, refusal, "1")
    told = await _told(tg, said)
    assert told["text"] == "Recorded for “Deploy 9: how many replicas” as option 1 “3”."
    await wait_for_record(bus, second, lambda r: r.answer == OptionAnswer(option_id="r3", label="3"))


async def test_an_option_typed_as_people_type_it_selects_it_and_free_text_is_quoted(
    bus: Bus, telegram: TelegramDesk
) -> None:
    """``1)``, ``#1``, a keycap, a full-width digit, ``option 1``, the label in another case with punctuation: each
    selects option 1, and the confirmation says so; words are recorded as the person's own, quoted (shortened)."""
    tg, intake = telegram.tg, telegram.intake()
    for typed in ("1)", "#1", "1️⃣", "\uff11", "option 1", "  keep the V1 api! "):
        request_id, question = await ask_on_telegram(bus, intake, tg, title=f"Typed {typed.strip()}")
        said = await tg.reply(ALICE, question, typed)
        told = await _told(tg, said)
        assert told["text"] == f"Recorded for “Typed {typed.strip()}” as option 1 “Keep the v1 API”.", typed
        record = await stored(bus, request_id)
        assert record is not None
        assert record.answer == KEEP, typed

    words = "Keep it until the June release, then drop it; " + "the clients need time. " * 10
    request_id, question = await ask_on_telegram(bus, intake, tg, title="In her words")
    said = await tg.reply(ALICE, question, words)
    told = await _told(tg, said)
    assert told["text"].startswith("Recorded for “In her words” in your own words: “Keep it until the June release")
    assert told["text"].endswith("…”.")
    record = await wait_for_record(bus, request_id, lambda r: r.status is HumanRequestState.ANSWERED)
    assert record.answer == TextAnswer(value=words.strip())


async def test_a_long_question_keeps_its_end_and_points_to_the_inbox(bus: Bus, telegram: TelegramDesk) -> None:
    """A question over Telegram's per-field limit (800): its start and its end (the actual question) are kept, the
    middle left out, and the message says where the whole question is, though the message itself fits."""
    telegram.adapters["telegram"].inbox_url = "https://temporality.example.org/#/inbox"
    tg, intake = telegram.tg, telegram.intake()
    asked = "Background: " + "the v1 API has a long history. " * 60 + "So: should v1 stay for one more release?"
    _, message = await ask_on_telegram(bus, intake, tg, question=asked)
    text = message["text"]
    assert "Background: the v1 API has a long history." in text
    assert "So: should v1 stay for one more release?" in text
    assert re.search(r"… \(truncated, [0-9,]+ characters left out\) …", text)
    assert "Full question in the inbox: https://temporality.example.org/#/inbox" in text


async def test_two_runs_asking_the_same_question_read_differently(bus: Bus, telegram: TelegramDesk) -> None:
    """The same question from two runs: each message names its run in short, so they are not byte-identical."""
    tg, intake = telegram.tg, telegram.intake()
    _, one = await ask_on_telegram(bus, intake, tg, run_id="run-aaaaaaaa1111111111111111")
    _, two = await ask_on_telegram(bus, intake, tg, run_id="run-bbbbbbbb2222222222222222")
    assert one["text"].endswith("(run aaaaaaaa)")
    assert two["text"].endswith("(run bbbbbbbb)")
    assert "tap an option below, or reply to this message with your own answer" in one["text"]
    assert "a plain message works too" in one["text"]
