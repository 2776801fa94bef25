"""Matrix polls on a real Synapse (HUM-3): every question comes with an ``m.poll.start`` offering its options; a
poll response binds the option it selects like a reaction, in the stable and in MSC3381's unstable form."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from human_support import exactly, requested, stored, wait_for_record
from matrix_support import MatrixPerson, alice_on_matrix

from temporality_bus import Bus
from temporality_human_interaction.channels.matrix import poll_selection
from temporality_human_interaction.channels.refs import ChannelRefs, ref_key
from temporality_human_interaction.inbox import RetentionSweeper
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import HumanRequestState, OptionAnswer
from temporality_testing.synapse import MatrixAccount, Synapse
from temporality_testing.waiting import stays


@pytest.fixture
async def asked(
    bus: Bus, synapse: Synapse, matrix_accounts: dict[str, MatrixAccount]
) -> AsyncIterator[tuple[RequestHandler, MatrixPerson]]:
    """The bot (the adapter under test) with alice reachable on Matrix, and alice's client."""
    person = await MatrixPerson(synapse.url, matrix_accounts["alice"]).start()
    try:
        async with alice_on_matrix(bus, synapse, matrix_accounts) as handler:
            yield handler, person
    finally:
        await person.close()


def test_poll_selection_reads_both_forms_and_nothing_else() -> None:
    relates = {"m.relates_to": {"rel_type": "m.reference", "event_id": "$p"}}
    assert poll_selection("m.poll.response", {**relates, "m.selections": ["drop-v1"]}) == "drop-v1"
    unstable = {**relates, "org.matrix.msc3381.poll.response": {"answers": ["keep-v1"]}}
    assert poll_selection("org.matrix.msc3381.poll.response", unstable) == "keep-v1"
    assert poll_selection("m.poll.response", {**relates, "m.selections": []}) is None  # a retracted vote
    assert poll_selection("m.poll.response", {**relates, "m.selections": [7]}) is None
    assert poll_selection("m.poll.response", unstable) is None  # the unstable body under the stable type


async def test_a_poll_vote_binds_its_option_and_the_poll_is_closed(
    bus: Bus, asked: tuple[RequestHandler, MatrixPerson], matrix_accounts: dict[str, MatrixAccount]
) -> None:
    handler, alice = asked
    bot = matrix_accounts["bot"].user_id
    event = requested()
    await handler.handle(event)
    record = await stored(bus, str(event.data["request_id"]))
    assert record is not None
    copy = record.copy_on("matrix")
    assert copy is not None
    assert copy.address is not None
    room_id = copy.address

    def is_poll(room: str, e: dict[str, Any]) -> bool:
        return room == room_id and e.get("sender") == bot and e.get("type") == "m.poll.start"

    _, poll = await alice.wait_for(is_poll, what="the bot's poll")
    content = poll["content"]
    assert content["m.poll"]["kind"] == "m.disclosed"
    assert content["m.poll"]["max_selections"] == 1
    assert content["m.poll"]["question"] == {"m.text": [{"body": "Should the v1 API stay for one more release?"}]}
    assert [a["m.id"] for a in content["m.poll"]["answers"]] == ["keep-v1", "drop-v1"]
    assert content["m.text"][0]["body"].splitlines()[1:] == ["1. Keep the v1 API", "2. Drop v1"]  # the fallback

    def vote(answer: str) -> dict[str, Any]:  # MSC3381's unstable form, as Element sends it
        return {
            "m.relates_to": {"rel_type": "m.reference", "event_id": poll["event_id"]},
            "org.matrix.msc3381.poll.response": {"answers": [answer]},
        }

    await alice.send(room_id, "org.matrix.msc3381.poll.response", vote("no-such-option"))

    async def still_pending() -> bool:
        current = await stored(bus, record.request_id)
        return current is not None and current.pending

    await stays(still_pending, settle_s=1.0, what="the request staying pending after a vote for no option")

    voted = await alice.send(room_id, "org.matrix.msc3381.poll.response", vote("drop-v1"))
    answered = await wait_for_record(bus, record.request_id, lambda r: r.status is HumanRequestState.ANSWERED)
    assert answered.answer == OptionAnswer(option_id="drop-v1", label="Drop v1")
    assert answered.responder == "user:alice"
    await exactly(bus, "human.answered")
    told = await alice.wait_for_reply_to(voted, sender=bot)
    assert told["content"]["body"].endswith("Recorded: Drop v1")

    _, ended = await alice.wait_for(
        lambda _r, e: e.get("type") == "m.poll.end" and e["content"]["m.relates_to"]["event_id"] == poll["event_id"],
        what="the bot closing the poll",
    )
    assert ended["sender"] == bot
    assert ended["content"]["m.text"][0]["body"].startswith("✅ Answered by Alice Example: “Drop v1”")

    # the retention purge takes the poll's references with the request
    refs = ChannelRefs(bus)
    poll_keys = [ref_key("matrix", "event", poll["event_id"]), ref_key("matrix", "poll", copy.reference)]
    assert [await refs.get(k) for k in poll_keys] == [record.request_id, poll["event_id"]]
    later = answered.expires_at + timedelta(days=2)
    sweeper = RetentionSweeper(bus, retention=timedelta(days=1), every_s=3600, clock=lambda: later)
    assert await sweeper.sweep() == 1
    assert [await refs.get(k) for k in poll_keys] == [None, None]
    assert await stored(bus, record.request_id) is None
