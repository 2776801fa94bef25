"""What a person writes on Matrix that is not a plain answer to the question it replies to (HUM-3, HUM-4): an
edit (``m.replace``), a reply to the bot's own notice (a confirmation, a hint listing several questions), a number
that is no option, an option typed as a keycap.

Real parts: nats-server (the fixtures) and a real Synapse (skipped where none is installed); the bot is the adapter
under test (matrix-nio, in the test's loop), alice a nio client on the same homeserver."""

from __future__ import annotations

from typing import Any

from human_support import requested, stored, wait_for_record
from matrix_support import MatrixPerson, alice_on_matrix

from temporality_bus import Bus
from temporality_human_interaction.records import HumanRequestRecord
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import HumanRequestState, OptionAnswer
from temporality_testing.synapse import MatrixAccount, Synapse
from temporality_testing.waiting import stays

KEEP = OptionAnswer(option_id="keep-v1", label="Keep the v1 API")
DROP = OptionAnswer(option_id="drop-v1", label="Drop v1")


async def _ask(
    bus: Bus, handler: RequestHandler, alice: MatrixPerson, **kw: Any
) -> tuple[HumanRequestRecord, str, str]:
    """A question delivered to alice's DM: its record, the room and the question's event id."""
    event = requested(**kw)
    await handler.handle(event)
    record = await stored(bus, str(event.data["request_id"]))
    assert record is not None
    copy = record.copy_on("matrix")
    assert copy is not None
    room_id, question = await alice.wait_for(lambda _r, e: e.get("event_id") == copy.reference, what="the question")
    return record, room_id, str(question["event_id"])


async def _told(alice: MatrixPerson, event_id: str, bot: str) -> tuple[str, str]:
    """The bot's notice replying to ``event_id``: its event id and its text (without the ``<sender>: `` prefix)."""
    notice = await alice.wait_for_reply_to(event_id, sender=bot)
    return str(notice["event_id"]), str(notice["content"]["body"]).split(": ", 1)[1]


async def _pending(bus: Bus, request_id: str) -> bool:
    record = await stored(bus, request_id)
    return record is not None and record.status is HumanRequestState.PENDING


async def test_an_edit_is_never_bound_and_the_person_is_told_and_a_reply_to_that_notice_answers(
    bus: Bus, synapse: Synapse, matrix_accounts: dict[str, MatrixAccount]
) -> None:
    """Alice answered PR #101 with "1", then, with PR #103 open, edits that "1" to "2": nothing is bound, PR #101's
    answer stays, and she is told so (not left guessing whether the edit counted). The notice names the one open
    question (PR #103): a reply to it -- what it invites -- answers PR #103, not "the message you replied to is not a
    question I can place"."""
    bot = matrix_accounts["bot"].user_id
    person = await MatrixPerson(synapse.url, matrix_accounts["alice"]).start()
    try:
        async with alice_on_matrix(bus, synapse, matrix_accounts) as handler:
            first, room_id, question = await _ask(bus, handler, person, title="Review PR #101: drop v1")
            said = await person.reply(room_id, question, "1")
            await _told(person, said, bot)
            await wait_for_record(bus, first.request_id, lambda r: r.answer == KEEP)
            second, _, _ = await _ask(bus, handler, person, title="Review PR #103: rename the flag")

            edit = await person.send(
                room_id,
                "m.room.message",
                {
                    "msgtype": "m.text",
                    "body": "* 2 — sorry, I meant 2",
                    "m.new_content": {"msgtype": "m.text", "body": "2 — sorry, I meant 2"},
                    "m.relates_to": {"rel_type": "m.replace", "event_id": said},
                },
            )
            hint, text = await _told(person, edit, bot)
            assert text.startswith("Not recorded: an edited message is never taken as an answer"), text
            assert "One question is open here: “Review PR #103: rename the flag” (run " in text
            await stays(lambda: _pending(bus, second.request_id), what="PR #103 still open")
            assert (await stored(bus, first.request_id)).answer == KEEP  # type: ignore[union-attr]

            said = await person.reply(room_id, hint, "2")
            _, text = await _told(person, said, bot)
            assert text == "“Review PR #103: rename the flag” — Recorded as option 2 “Drop v1”", text
            await wait_for_record(bus, second.request_id, lambda r: r.answer == DROP)
            assert (await stored(bus, first.request_id)).answer == KEEP  # type: ignore[union-attr]
    finally:
        await person.close()


async def test_a_reply_to_the_bots_notices_is_about_their_question(
    bus: Bus, synapse: Synapse, matrix_accounts: dict[str, MatrixAccount]
) -> None:
    """A reply to the bot's "Recorded" notice for PR #101 while PR #103 is the one open question: refused as PR #101's,
    never bound to PR #103; "3" on a two-option question is refused, not recorded as words; a reply to that refusal
    binds PR #103 though another question is open too; a reply to a hint listing several questions is never bound."""
    bot = matrix_accounts["bot"].user_id
    person = await MatrixPerson(synapse.url, matrix_accounts["alice"]).start()
    try:
        async with alice_on_matrix(bus, synapse, matrix_accounts) as handler:
            _, room_id, question = await _ask(bus, handler, person, title="Review PR #101: drop v1")
            said = await person.reply(room_id, question, "1️⃣")  # a keycap typed: option 1
            confirmation, text = await _told(person, said, bot)
            assert text == "“Review PR #101: drop v1” — Recorded as option 1 “Keep the v1 API”"
            second, _, question2 = await _ask(bus, handler, person, title="Review PR #103: rename the flag")

            said = await person.reply(room_id, confirmation, "2")
            _, text = await _told(person, said, bot)
            assert text.startswith("Not recorded: you already answered “Review PR #101: drop v1”"), text
            await stays(lambda: _pending(bus, second.request_id), what="PR #103 still open")

            said = await person.reply(room_id, question2, "3")
            refusal, text = await _told(person, said, bot)
            assert text == (
                "Not recorded: there is no option 3 for “Review PR #103: rename the flag”; its options are 1\u20132."
                " To answer in your own words, write more than a number."
            )
            third, _, _ = await _ask(bus, handler, person, title="Review PR #104: bump the SDK")
            said = await person.reply(room_id, refusal, "2")
            _, text = await _told(person, said, bot)
            assert text == "“Review PR #103: rename the flag” — Recorded as option 2 “Drop v1”"
            await wait_for_record(bus, second.request_id, lambda r: r.answer == DROP)

            await _ask(bus, handler, person, title="Review PR #105: pin the runner")  # #104 and #105 open
            said = await person.say(room_id, "1")
            hint, text = await _told(person, said, bot)
            assert "2 questions are open here" in text
            said = await person.reply(room_id, hint, "1")
            _, text = await _told(person, said, bot)
            assert text.startswith("Not recorded: that message lists several questions"), text
            await stays(lambda: _pending(bus, third.request_id), what="PR #104 still open")
    finally:
        await person.close()
