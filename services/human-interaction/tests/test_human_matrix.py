"""The Matrix channel against a real Synapse homeserver (HUM-3, HUM-4, HUM-5): the bot is the adapter under
test (matrix-nio, in the test's loop); people are nio clients on the same homeserver."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest
from human_support import exactly, requested, stored, wait_for_record
from matrix_support import MatrixPerson
from nio import RoomLeaveError  # type: ignore[import-untyped]

from temporality_bus import Bus
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.channels.matrix import KEYCAPS, MatrixAdapter
from temporality_human_interaction.channels.refs import ChannelRefs, ref_key
from temporality_human_interaction.channels.render import MATRIX_CONTENT_LIMIT, matrix_content_size
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.inbound import AnswerRouter
from temporality_human_interaction.notifications import NotificationHandler
from temporality_human_interaction.records import HumanRequestRecord
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import (
    HumanAnswered,
    HumanNotifyRequested,
    HumanOption,
    HumanPolicy,
    HumanRequested,
    HumanRequestState,
    OptionAnswer,
    TextAnswer,
    make_event,
)
from temporality_testing.synapse import MatrixAccount, Synapse
from temporality_testing.waiting import stays

TITLE = "Review PR 42: remove the v1 API"


def _directory(accounts: dict[str, MatrixAccount]) -> Directory:
    return Directory.from_mapping(
        {
            "users": {
                "alice": {
                    "display_name": "Alice Example",
                    "inbox_token": "alice-demo-inbox-token-change-me",
                    "preferred": "matrix",
                    "fallback": ["web"],
                    "channels": {"matrix": {"user_id": accounts["alice"].user_id}, "web": {}},
                },
                "bob": {
                    "display_name": "Bob Example",
                    "preferred": "matrix",
                    "channels": {"matrix": {"user_id": accounts["bob"].user_id}},
                },
            }
        }
    )


@pytest.fixture
async def bot(
    bus: Bus, synapse: Synapse, matrix_accounts: dict[str, MatrixAccount]
) -> AsyncIterator[tuple[MatrixAdapter, RequestHandler]]:
    directory = _directory(matrix_accounts)
    adapters: dict[str, ChannelAdapter] = {}
    router = AnswerRouter(bus, directory, adapters)
    matrix = MatrixAdapter(
        bus,
        homeserver=synapse.url,
        user_id=matrix_accounts["bot"].user_id,
        password=matrix_accounts["bot"].password,
        sync_timeout_s=5,
    )
    web = WebInboxAdapter()
    for adapter in (matrix, web):
        adapter.attach(router)
    async with matrix, web:
        assert matrix.available
        adapters.update({matrix.name: matrix, web.name: web})
        yield matrix, RequestHandler(bus, directory, adapters)


async def _person(synapse: Synapse, account: MatrixAccount) -> AsyncIterator[MatrixPerson]:
    person = await MatrixPerson(synapse.url, account).start()
    try:
        yield person
    finally:
        await person.close()


@pytest.fixture
async def alice(synapse: Synapse, matrix_accounts: dict[str, MatrixAccount]) -> AsyncIterator[MatrixPerson]:
    async for person in _person(synapse, matrix_accounts["alice"]):
        yield person


@pytest.fixture
async def mallory(synapse: Synapse, matrix_accounts: dict[str, MatrixAccount]) -> AsyncIterator[MatrixPerson]:
    async for person in _person(synapse, matrix_accounts["mallory"]):
        yield person


async def _ask(
    bus: Bus, handler: RequestHandler, person: MatrixPerson, bot_id: str, **kw: object
) -> tuple[HumanRequestRecord, str, str]:
    event = requested(**kw)  # type: ignore[arg-type]
    await handler.handle(event)
    record = await stored(bus, str(event.data["request_id"]))
    assert record is not None
    copy = record.copy_on("matrix")
    assert copy is not None
    room_id, question = await person.wait_for(
        lambda _room, e: e.get("event_id") == copy.reference, what="the question event"
    )
    assert room_id == copy.address
    return record, room_id, str(question["event_id"])


async def test_reaction_answer_binds_and_the_question_is_edited_to_show_the_outcome(
    bus: Bus, bot: tuple[MatrixAdapter, RequestHandler], alice: MatrixPerson, matrix_accounts: dict[str, MatrixAccount]
) -> None:
    bot_id = matrix_accounts["bot"].user_id
    record, room_id, question_id = await _ask(bus, bot[1], alice, bot_id)
    _, question = await alice.wait_for_question(bot_id, TITLE)
    html = question["content"]["formatted_body"]
    assert "<b>❓ Review PR 42: remove the v1 API</b>" in html
    assert "<ol><li><b>Keep the v1 API</b> — The PR is asked to restore v1</li>" in html
    assert "No answer by" in html
    # The options are offered as the bot's own reactions, one keycap per option.
    for key in KEYCAPS[:2]:
        await alice.wait_for(
            lambda _r, e, k=key: (
                e.get("type") == "m.reaction"
                and e["content"]["m.relates_to"] == {"rel_type": "m.annotation", "event_id": question_id, "key": k}
            ),
            what=f"the bot's {key} reaction",
        )

    reaction = await alice.react(room_id, question_id, KEYCAPS[1])
    answered = await wait_for_record(bus, record.request_id, lambda r: r.status is HumanRequestState.ANSWERED)
    assert answered.answer == OptionAnswer(option_id="drop-v1", label="Drop v1")
    assert answered.responder == "user:alice"
    [event] = await exactly(bus, "human.answered")
    assert event.payload(HumanAnswered).channel == "matrix"

    told = await alice.wait_for_reply_to(reaction, sender=bot_id)
    assert told["content"]["body"].endswith("“Review PR 42: remove the v1 API” — Recorded: Drop v1")  # names it
    edit = await alice.wait_for_edit_of(question_id)
    assert "✅ Answered by Alice Example: “Drop v1”" in edit["content"]["m.new_content"]["body"]


async def test_rich_reply_binds_free_text_and_a_bare_number_binds_an_option(
    bus: Bus, bot: tuple[MatrixAdapter, RequestHandler], alice: MatrixPerson, matrix_accounts: dict[str, MatrixAccount]
) -> None:
    bot_id = matrix_accounts["bot"].user_id
    first, room_id, question_id = await _ask(bus, bot[1], alice, bot_id)
    await alice.reply(room_id, question_id, "Keep it until June, then drop it")
    bound = await wait_for_record(bus, first.request_id, lambda r: r.status is HumanRequestState.ANSWERED)
    assert bound.answer == TextAnswer(value="Keep it until June, then drop it")

    second, room2, _ = await _ask(bus, bot[1], alice, bot_id)
    assert room2 == room_id  # one DM room per person, created once and reused
    assert await ChannelRefs(bus).get(ref_key("matrix", "room", matrix_accounts["alice"].user_id)) == room_id
    await alice.say(room_id, "1")  # names option 1 of the newest question in the room
    bound2 = await wait_for_record(bus, second.request_id, lambda r: r.status is HumanRequestState.ANSWERED)
    assert bound2.answer == OptionAnswer(option_id="keep-v1", label="Keep the v1 API")
    await exactly(bus, "human.answered", 2)


async def test_a_person_who_left_the_dm_is_invited_to_a_new_one_and_gets_the_next_question(
    bus: Bus, bot: tuple[MatrixAdapter, RequestHandler], alice: MatrixPerson, matrix_accounts: dict[str, MatrixAccount]
) -> None:
    """A question sent into a room the person left would never be seen, yet the send succeeds: the kept DM
    is used only while they are in it, so after leaving it they are invited to a new one."""
    bot_id = matrix_accounts["bot"].user_id
    first, room_id, _ = await _ask(bus, bot[1], alice, bot_id)
    left = await alice.client.room_leave(room_id)
    assert not isinstance(left, RoomLeaveError), left

    second, room2, question2 = await _ask(bus, bot[1], alice, bot_id)  # alice accepts the new invite
    assert room2 != room_id
    assert await ChannelRefs(bus).get(ref_key("matrix", "room", matrix_accounts["alice"].user_id)) == room2
    await alice.react(room2, question2, KEYCAPS[1])
    bound = await wait_for_record(bus, second.request_id, lambda r: r.status is HumanRequestState.ANSWERED)
    assert bound.answer == OptionAnswer(option_id="drop-v1", label="Drop v1")

    third, room3, _ = await _ask(bus, bot[1], alice, bot_id)
    assert room3 == room2  # in it again: reused
    assert (await stored(bus, first.request_id)) is not None
    assert (await stored(bus, third.request_id)) is not None


async def test_two_questions_replacing_a_left_dm_at_once_open_one_new_dm(
    bus: Bus, bot: tuple[MatrixAdapter, RequestHandler], alice: MatrixPerson, matrix_accounts: dict[str, MatrixAccount]
) -> None:
    """Two questions (or replicas) find at once that alice left her DM: each opens a room, one wins the kept
    key by compare-and-set, both ask in that one; the other room is given up, its invite withdrawn."""
    bot_id = matrix_accounts["bot"].user_id
    _, room_id, _ = await _ask(bus, bot[1], alice, bot_id)
    left = await alice.client.room_leave(room_id)
    assert not isinstance(left, RoomLeaveError), left
    user_id = matrix_accounts["alice"].user_id
    first, second = await asyncio.gather(bot[0].dm_room(user_id), bot[0].dm_room(user_id))
    assert first == second != room_id
    assert await ChannelRefs(bus).get(ref_key("matrix", "room", user_id)) == first


async def test_a_foreign_users_answer_is_refused_and_they_are_told(
    bus: Bus,
    bot: tuple[MatrixAdapter, RequestHandler],
    alice: MatrixPerson,
    mallory: MatrixPerson,
    matrix_accounts: dict[str, MatrixAccount],
) -> None:
    bot_id = matrix_accounts["bot"].user_id
    record, room_id, question_id = await _ask(bus, bot[1], alice, bot_id)
    await alice.client.room_invite(room_id, mallory.account.user_id)  # alice brings someone into her DM
    await mallory.wait_for(lambda room, _e: room == room_id, what="joining alice's room")

    reaction = await mallory.react(room_id, question_id, KEYCAPS[0])
    told = await mallory.wait_for_reply_to(reaction, sender=bot_id)
    assert told["content"]["body"].endswith("Not recorded: only the recipient may answer.")
    reply = await mallory.reply(room_id, question_id, "drop it")
    told = await mallory.wait_for_reply_to(reply, sender=bot_id)
    assert "only the recipient may answer" in told["content"]["body"]

    async def still_pending() -> bool:
        current = await stored(bus, record.request_id)
        return current is not None and current.pending

    await stays(still_pending, settle_s=1.0, what="the request staying pending")

    # The recipient can still answer.
    await alice.react(room_id, question_id, KEYCAPS[0])
    await wait_for_record(bus, record.request_id, lambda r: r.status is HumanRequestState.ANSWERED)


async def test_a_restarted_adapter_resumes_its_sync_and_binds_an_answer_given_while_it_was_down(
    bus: Bus, synapse: Synapse, matrix_accounts: dict[str, MatrixAccount], alice: MatrixPerson
) -> None:
    directory = _directory(matrix_accounts)
    bot_id = matrix_accounts["bot"].user_id

    def adapter() -> MatrixAdapter:
        made = MatrixAdapter(
            bus, homeserver=synapse.url, user_id=bot_id, password=matrix_accounts["bot"].password, sync_timeout_s=5
        )
        made.attach(AnswerRouter(bus, directory, {"matrix": made}))
        return made

    async with adapter() as first:
        record, room_id, question_id = await _ask(bus, RequestHandler(bus, directory, {"matrix": first}), alice, bot_id)
    await alice.react(room_id, question_id, KEYCAPS[0])  # while no bot is running
    async with adapter():
        answered = await wait_for_record(bus, record.request_id, lambda r: r.status is HumanRequestState.ANSWERED)
        assert answered.answer == OptionAnswer(option_id="keep-v1", label="Keep the v1 API")
        await alice.wait_for_edit_of(question_id)
    await exactly(bus, "human.answered")


async def test_a_notification_arrives_as_a_notice_in_the_dm(
    bus: Bus, bot: tuple[MatrixAdapter, RequestHandler], alice: MatrixPerson, matrix_accounts: dict[str, MatrixAccount]
) -> None:
    directory = _directory(matrix_accounts)
    data = HumanNotifyRequested(
        notification_id="hn-matrix-1",
        run_id="run-1",
        agent="reviewer",
        title="Review PR 42",
        recipient="user:alice",
        message="Review finished: two comments.",
        policy=HumanPolicy(allowed_recipients=["user:alice"]),
        turn=2,
    )
    await NotificationHandler(bus, directory, {"matrix": bot[0]}).handle(make_event(data, source="/test"))
    _, notice = await alice.wait_for(
        lambda _r, e: (
            e.get("sender") == matrix_accounts["bot"].user_id
            and (e.get("content") or {}).get("msgtype") == "m.notice"
            and "Review finished" in str(e["content"].get("body"))
        ),
        what="the notification",
    )
    assert notice["content"]["body"] == "📣 Review PR 42\n\nReview finished: two comments."
    assert "m.relates_to" not in notice["content"]  # a plain notice, not a reply to anything

    # sent again under the same key (a redelivery after a crash before the once-only marker): Synapse answers the
    # repeated transaction id with the first event, so nothing new reaches the room; another key is a new event
    profile = directory.get("alice")
    assert profile is not None
    again = await bot[0].notify(profile, "📣 Review PR 42\n\nReview finished: two comments.", key="notify.hn-matrix-1")
    assert again.reference == notice["event_id"]
    other = await bot[0].notify(profile, "📣 Another one", key="notify.hn-matrix-2")
    assert other.reference != notice["event_id"]


async def test_the_question_on_matrix_is_redacted_and_truncated(
    bus: Bus, bot: tuple[MatrixAdapter, RequestHandler], alice: MatrixPerson, matrix_accounts: dict[str, MatrixAccount]
) -> None:
    """Egress (HUM-5, SEC-1) on the real homeserver: the question and its edit carry no secret, the long context
    is cut to Matrix's limit with a marker."""
    secret = "ghp_" + "Mx7Nc6Bv5Vc4Xz3Lk2Jh1" * 2
    event = requested()
    payload = event.payload(HumanRequested).model_copy(
        update={
            "title": "Rotate the leaked token",
            "context": f"The CI log prints Authorization: Bearer {secret}\n" + "log line " * 400,
            "question": f"Revoke {secret} now?",
        }
    )
    await bot[1].handle(make_event(payload, source="/temporality/run-executor", run_id=payload.run_id))
    bot_id = matrix_accounts["bot"].user_id
    room_id, question = await alice.wait_for_question(bot_id, "Rotate the leaked token")
    body, html = question["content"]["body"], question["content"]["formatted_body"]
    assert "[REDACTED:github_token]" in body
    assert "[REDACTED:" in html
    assert "more characters)" in body
    assert len(body) < 3000  # Matrix's default limit: 2,000 characters per field, plus the rest of the question

    await alice.react(room_id, str(question["event_id"]), KEYCAPS[0])
    await alice.wait_for_edit_of(str(question["event_id"]))
    assert all(secret not in str(e) for _, e in alice.seen)


async def test_a_bare_message_answers_the_rooms_one_open_question_else_says_how_to_answer(
    bus: Bus, bot: tuple[MatrixAdapter, RequestHandler], alice: MatrixPerson, matrix_accounts: dict[str, MatrixAccount]
) -> None:
    """A plain message (no reply) binds to the one question open in the DM -- an older one when the newest is
    answered --, the notice naming it; with none or several open, a notice says how to answer (and lists them)."""
    bot_id = matrix_accounts["bot"].user_id
    older, room_id, _ = await _ask(bus, bot[1], alice, bot_id, title="Review PR 41: rename the flag")
    newest, _, newest_q = await _ask(bus, bot[1], alice, bot_id)
    await alice.react(room_id, newest_q, KEYCAPS[0])
    await wait_for_record(bus, newest.request_id, lambda r: r.status is HumanRequestState.ANSWERED)

    said = await alice.say(room_id, "keep v1 please")  # free text, not a reply: the only open question takes it
    bound = await wait_for_record(bus, older.request_id, lambda r: r.status is HumanRequestState.ANSWERED)
    assert bound.answer == TextAnswer(value="keep v1 please")
    told = await alice.wait_for_reply_to(said, sender=bot_id)
    assert told["content"]["body"].endswith(
        "“Review PR 41: rename the flag” — Recorded in your own words: “keep v1 please”"
    )

    said = await alice.say(room_id, "2")  # nothing open: told how to answer, not silently dropped
    told = await alice.wait_for_reply_to(said, sender=bot_id)
    assert "To answer a question, reply to its message" in told["content"]["body"]
    assert told["content"]["body"].endswith("There is no open question here right now.")

    await _ask(bus, bot[1], alice, bot_id, title="Deploy 7: which region")
    await _ask(bus, bot[1], alice, bot_id, title="Deploy 8: how many replicas")
    said = await alice.say(room_id, "1")  # two open: not guessed
    told = await alice.wait_for_reply_to(said, sender=bot_id)
    assert re.search(
        r"2 questions are open here: “Deploy 8: how many replicas” \(run \w{8}\), “Deploy 7: which region” \(run \w{8}\)\.$",
        told["content"]["body"],
    )
    await exactly(bus, "human.answered", 2)


async def test_an_outcome_edit_over_the_matrix_event_limit_is_cut_to_fit_options_kept(
    bus: Bus, bot: tuple[MatrixAdapter, RequestHandler], alice: MatrixPerson, matrix_accounts: dict[str, MatrixAccount]
) -> None:
    """Ten options with consequences at Matrix's field cap (2,000): the question fits an event, but its edit carries
    the text twice (~90 KB, over Synapse's 64 KiB): it is cut, context and consequences first, options kept."""
    options = [
        HumanOption(id=f"opt-{n}", label=f"Option {n}", consequence=f"Consequence {n}: " + "lorem ipsum " * 165)
        for n in range(1, 11)
    ]
    bot_id = matrix_accounts["bot"].user_id
    bot[0].inbox_url = "https://temporality.example.org/#/inbox"
    record, room_id, question_id = await _ask(bus, bot[1], alice, bot_id, options=options, context="why " * 600)
    await alice.react(room_id, question_id, KEYCAPS[9])
    await wait_for_record(bus, record.request_id, lambda r: r.status is HumanRequestState.ANSWERED)
    edit = await alice.wait_for_edit_of(question_id)
    new = edit["content"]["m.new_content"]
    assert new["body"].endswith("✅ Answered by Alice Example: “Option 10” " + new["body"][-9:])
    for n in range(1, 11):
        assert f"\n{n}. Option {n}" in new["body"]
        assert f"<li><b>Option {n}</b>" in new["formatted_body"]
    assert "…(cut; full question in the inbox: https://temporality.example.org/#/inbox)" in new["body"]
    assert matrix_content_size(edit["content"]) <= MATRIX_CONTENT_LIMIT


async def test_the_question_on_matrix_says_why_the_agent_asks_escaped(
    bus: Bus, bot: tuple[MatrixAdapter, RequestHandler], alice: MatrixPerson, matrix_accounts: dict[str, MatrixAccount]
) -> None:
    """OBS-1 for the person on the real homeserver: ask_human's ``reason`` is one ``Why:`` line of the body and a
    paragraph of the HTML, where markup in it is text (escaped), never formatting."""
    event = requested(
        title="Publish release 2.0",
        reason="Publishing is <b>irreversible</b> & a person must approve",
        reason_kind="approval",
    )
    await bot[1].handle(event)
    bot_id = matrix_accounts["bot"].user_id
    _, question = await alice.wait_for_question(bot_id, "Publish release 2.0")
    body, html = question["content"]["body"], question["content"]["formatted_body"]
    assert "\nWhy: Publishing is <b>irreversible</b> & a person must approve\n" in body
    assert "<p><b>Why:</b> Publishing is &lt;b&gt;irreversible&lt;/b&gt; &amp; a person must approve</p>" in html
    assert html.index("Why:") < html.index("asks:")
