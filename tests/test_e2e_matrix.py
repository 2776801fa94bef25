"""E2E-1 answered through Matrix: the five services as processes, the reviewer reachable only on a real Synapse.

One stack for the module (nats-server, SQLite journal, the five services, the shipped triggers and agents) whose
human-interaction runs its Matrix adapter against the run's one Synapse (the ``synapse`` session fixture of
``temporality_testing.fixtures``, shared with the HUM tests; the bot logs in with a password, as
``TEMPORALITY_HUMAN_MATRIX_*`` configures it) and whose user directory gives alice only a Matrix
identity. alice, and mallory who is not asked, are matrix-nio clients on the same homeserver. Each test posts
its own pull request (a fresh event id and PR number), so the tests do not depend on one another's order.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import yaml
from e2e_support import JOURNAL, ROOT, eventually, example_pr, make_stack, post_hook

from temporality_embedded import Stack
from temporality_testing.synapse import MatrixAccount, Synapse
from temporality_testing.waiting import stays

sys.path.append(str(ROOT / "services" / "human-interaction" / "tests"))  # the Matrix person of the HUM tests
from matrix_support import MatrixPerson

pytestmark = pytest.mark.e2e

KEYCAPS = ("1️⃣", "2️⃣")  # the reactions the bot offers for options 1 and 2 (channels/matrix.py)
OPTIONS = ("Keep the v1 contract", "Ship it as a breaking v2")


@pytest.fixture(scope="module")
def accounts(synapse: Synapse) -> dict[str, MatrixAccount]:
    """The bot, the reviewer and a stranger, with localparts of their own on the homeserver."""
    tag = uuid.uuid4().hex[:8]
    return {
        name: synapse.register(f"e2e-{name}-{tag}", f"{name}-password-{tag}") for name in ("bot", "alice", "mallory")
    }


@pytest.fixture(scope="module")
def matrix_stack(
    tmp_path_factory: pytest.TempPathFactory, synapse: Synapse, accounts: dict[str, MatrixAccount]
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("e2e-matrix")
    users = tmp / "users.yaml"
    users.write_text(
        yaml.safe_dump(
            {
                "users": {
                    "alice": {
                        "display_name": "Alice Example",
                        "preferred": "matrix",
                        "fallback": [],  # reachable only on Matrix
                        "channels": {"matrix": {"user_id": accounts["alice"].user_id}},
                    }
                }
            }
        ),
        encoding="utf-8",
    )
    stack = make_stack(
        tmp,
        TEMPORALITY_HUMAN_USERS_FILE=str(users),
        TEMPORALITY_HUMAN_MATRIX_HOMESERVER=synapse.url,
        TEMPORALITY_HUMAN_MATRIX_USER_ID=accounts["bot"].user_id,
        TEMPORALITY_HUMAN_MATRIX_PASSWORD=accounts["bot"].password,
        TEMPORALITY_HUMAN_MATRIX_SYNC_TIMEOUT_S="2",
    )
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client


async def _person(synapse: Synapse, account: MatrixAccount) -> AsyncIterator[MatrixPerson]:
    person = await MatrixPerson(synapse.url, account).start()
    try:
        yield person
    finally:
        await person.close()


@pytest.fixture
async def alice(synapse: Synapse, accounts: dict[str, MatrixAccount]) -> AsyncIterator[MatrixPerson]:
    async for person in _person(synapse, accounts["alice"]):
        yield person


@pytest.fixture
async def mallory(synapse: Synapse, accounts: dict[str, MatrixAccount]) -> AsyncIterator[MatrixPerson]:
    async for person in _person(synapse, accounts["mallory"]):
        yield person


# ---------------------------------------------------------------------------------------------- helpers
async def _run(http: httpx.AsyncClient, stack: Stack, run_id: str) -> dict[str, Any] | None:
    response = await http.get(f"{stack.journal_url}/runs/{run_id}", headers=JOURNAL)
    return response.json() if response.status_code == 200 else None


async def _run_in_state(http: httpx.AsyncClient, stack: Stack, run_id: str, state: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        run = await _run(http, stack, run_id)
        return run if run and run["state"] == state else None

    return await eventually(probe, timeout_s=60, what=f"run {run_id} in state {state} in the journal")


async def _journal_event(http: httpx.AsyncClient, stack: Stack, run_id: str, event_type: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        response = await http.get(f"{stack.journal_url}/runs/{run_id}/events", headers=JOURNAL)
        if response.status_code != 200:
            return None
        return next((e for e in response.json()["events"] if e["type"] == event_type), None)

    return await eventually(probe, what=f"{event_type} of {run_id} in the journal")


async def _review_pr(http: httpx.AsyncClient, stack: Stack, number: int) -> tuple[str, dict[str, Any]]:
    """Azure DevOps sends "PR #number created" (a fresh event id); the run waits for alice on Matrix."""
    payload = example_pr(id=str(uuid.uuid4()))
    payload["resource"] = {**payload["resource"], "pullRequestId": number}
    accepted = await post_hook(http, stack, payload)
    assert accepted.status_code == 202, accepted.text
    run_id = str(accepted.json()["run_id"])

    async def waiting_on_a_channel() -> dict[str, Any] | None:
        run = await _run(http, stack, run_id)
        return run if run and run["state"] == "waiting_for_human" and run["waiting"]["channel"] else None

    run = await eventually(waiting_on_a_channel, timeout_s=60, what=f"run {run_id} waiting with its channel")
    assert run["waiting"]["recipient"] == "user:alice"
    assert run["waiting"]["channel"] == "matrix"  # her only channel, and the adapter is up
    return run_id, run


async def _question(alice: MatrixPerson, bot: str, number: int) -> tuple[str, dict[str, Any]]:
    """The question about PR #number in alice's DM with the bot, as she received it."""
    return await alice.wait_for_question(bot, f"PR #{number} ", within_s=30)


def _assert_compact_question(question: dict[str, Any], number: int) -> None:
    """HUM-5: which task, why, what is established, what is missing, the numbered options and what each leads
    to, what happens without an answer, how to answer; never the raw technical context."""
    body: str = question["content"]["body"]
    html: str = question["content"]["formatted_body"]
    assert body.startswith(f"❓ Review PR #{number}: ")
    assert f"Task: review PR #{number} in orders-service" in body
    for part in ("Why I ask:", "Established:", "Missing:"):
        assert part in body
    assert f"1. {OPTIONS[0]} — The change must stay backward compatible" in body
    assert f"2. {OPTIONS[1]} — Clients must migrate" in body
    assert f"<ol><li><b>{OPTIONS[0]}</b> — " in html
    assert "No answer by" in body
    assert f"→ I go with “{OPTIONS[0]}”" in body  # the trigger's timeout default, said up front
    assert (
        "To answer: react with an option's number, vote in the poll, or reply to this message with the number" in body
    )
    for raw in ("{", "run-", "evt-", "_apis/"):  # no payload JSON, ids or API URLs leak into the message
        assert raw not in body
    assert len(body) < 2000


async def _bot_offers_options(alice: MatrixPerson, bot: str, question_id: str) -> None:
    for key in KEYCAPS:
        await alice.wait_for(
            lambda _r, e, k=key: (
                e.get("sender") == bot
                and e.get("type") == "m.reaction"
                and e["content"]["m.relates_to"] == {"rel_type": "m.annotation", "event_id": question_id, "key": k}
            ),
            what=f"the bot's {key} reaction on the question",
        )


# ---------------------------------------------------------------------------------------------- the tests
async def test_e2e_1_answered_by_a_reaction_in_the_matrix_dm(
    matrix_stack: Stack, http: httpx.AsyncClient, alice: MatrixPerson, accounts: dict[str, MatrixAccount]
) -> None:
    stack, bot = matrix_stack, accounts["bot"].user_id
    run_id, run = await _review_pr(http, stack, 4201)

    room_id, question = await _question(alice, bot, 4201)
    _assert_compact_question(question, 4201)
    question_id = str(question["event_id"])
    assert run["waiting"]["request_id"]
    await _bot_offers_options(alice, bot, question_id)

    reaction = await alice.react(room_id, question_id, KEYCAPS[1])  # "Ship it as a breaking v2"

    done = await _run_in_state(http, stack, run_id, "completed")
    assert "Decision (user:alice): Ship it as a breaking v2 [ship-v2]" in done["result"]
    answered = await _journal_event(http, stack, run_id, "human.answered")
    assert answered["data"]["request_id"] == run["waiting"]["request_id"]
    assert answered["data"]["channel"] == "matrix"
    assert answered["data"]["responder"] == "user:alice"
    assert answered["data"]["answer"]["option_id"] == "ship-v2"
    resumed = await _journal_event(http, stack, run_id, "run.resumed")
    assert resumed["data"]["reason"] == "answer"

    told = await alice.wait_for_reply_to(reaction, sender=bot)
    assert told["content"]["body"].endswith(f"Recorded: {OPTIONS[1]}")
    edit = await alice.wait_for_edit_of(question_id)
    assert edit["sender"] == bot
    assert f"✅ Answered by Alice Example: “{OPTIONS[1]}”" in edit["content"]["m.new_content"]["body"]


async def test_e2e_1_answered_by_a_text_reply_naming_an_option(
    matrix_stack: Stack, http: httpx.AsyncClient, alice: MatrixPerson, accounts: dict[str, MatrixAccount]
) -> None:
    stack, bot = matrix_stack, accounts["bot"].user_id
    run_id, run = await _review_pr(http, stack, 4202)

    room_id, question = await _question(alice, bot, 4202)
    _assert_compact_question(question, 4202)
    question_id = str(question["event_id"])

    reply = await alice.reply(room_id, question_id, OPTIONS[0].lower())  # the option's label, in her words' case

    done = await _run_in_state(http, stack, run_id, "completed")
    assert "Decision (user:alice): Keep the v1 contract [keep-v1]" in done["result"]
    answered = await _journal_event(http, stack, run_id, "human.answered")
    assert answered["data"]["request_id"] == run["waiting"]["request_id"]
    assert answered["data"]["channel"] == "matrix"
    assert answered["data"]["answer"]["option_id"] == "keep-v1"  # the machine value, not the text (HUM-6)

    told = await alice.wait_for_reply_to(reply, sender=bot)
    assert told["content"]["body"].endswith(f"Recorded as option 1 “{OPTIONS[0]}”")
    edit = await alice.wait_for_edit_of(question_id)
    assert f"✅ Answered by Alice Example: “{OPTIONS[0]}”" in edit["content"]["m.new_content"]["body"]


async def test_a_foreign_matrix_users_answer_is_refused_and_changes_nothing(
    matrix_stack: Stack,
    http: httpx.AsyncClient,
    alice: MatrixPerson,
    mallory: MatrixPerson,
    accounts: dict[str, MatrixAccount],
) -> None:
    stack, bot = matrix_stack, accounts["bot"].user_id
    run_id, run = await _review_pr(http, stack, 4203)
    room_id, question = await _question(alice, bot, 4203)
    question_id = str(question["event_id"])

    await alice.client.room_invite(room_id, mallory.account.user_id)  # alice brings someone into her DM
    await mallory.wait_for(lambda room, _e: room == room_id, what="mallory joining alice's DM")
    reaction = await mallory.react(room_id, question_id, KEYCAPS[1])

    told = await mallory.wait_for_reply_to(reaction, sender=bot)
    assert told["content"]["body"].endswith("Not recorded: only the recipient may answer.")
    _, poll = await mallory.wait_for(
        lambda room, e: room == room_id and e.get("type") == "m.poll.start" and "PR #4203 " in str(e["content"]),
        what="the question's poll",
    )
    vote = {  # MSC3381's unstable form, as Element sends it
        "m.relates_to": {"rel_type": "m.reference", "event_id": poll["event_id"]},
        "org.matrix.msc3381.poll.response": {"answers": ["ship-v2"]},
    }
    voted = await mallory.send(room_id, "org.matrix.msc3381.poll.response", vote)
    told = await mallory.wait_for_reply_to(voted, sender=bot)
    assert told["content"]["body"].endswith("Not recorded: only the recipient may answer.")
    refused = await _journal_event(http, stack, run_id, "human.answer_refused")
    assert refused["data"]["reason"] == "not_recipient"
    assert refused["data"]["request_id"] == run["waiting"]["request_id"]
    assert refused["data"]["responder"] == f"matrix:{mallory.account.user_id}"

    async def still_waiting() -> bool:
        current = await _run(http, stack, run_id)
        return current is not None and current["state"] == "waiting_for_human"

    await stays(still_waiting, settle_s=1.5, what=f"run {run_id} still waiting for alice")

    await alice.react(room_id, question_id, KEYCAPS[0])  # the recipient still can
    done = await _run_in_state(http, stack, run_id, "completed")
    assert "Decision (user:alice): Keep the v1 contract [keep-v1]" in done["result"]
    edit = await alice.wait_for_edit_of(question_id)
    assert "Answered by Alice Example" in edit["content"]["m.new_content"]["body"]


async def test_e2e_1_answered_by_a_poll_response(
    matrix_stack: Stack, http: httpx.AsyncClient, alice: MatrixPerson, accounts: dict[str, MatrixAccount]
) -> None:
    """The question comes with an ``m.poll.start`` offering the same options; a poll response binds like a reaction."""
    stack, bot = matrix_stack, accounts["bot"].user_id
    run_id, _ = await _review_pr(http, stack, 4204)
    room_id, question = await _question(alice, bot, 4204)

    _, poll = await alice.wait_for(
        lambda room, e: (
            room == room_id
            and e.get("sender") == bot
            and e.get("type") == "m.poll.start"
            and "PR #4204 " in str(e["content"]["m.poll"]["question"])
        ),
        what="the bot's poll for PR #4204",
    )
    offered = poll["content"]["m.poll"]
    assert offered["max_selections"] == 1
    assert [(a["m.id"], a["m.text"][0]["body"]) for a in offered["answers"]] == [
        ("keep-v1", OPTIONS[0]),
        ("ship-v2", OPTIONS[1]),
    ]

    relates = {"rel_type": "m.reference", "event_id": poll["event_id"]}
    response = await alice.send(room_id, "m.poll.response", {"m.relates_to": relates, "m.selections": ["ship-v2"]})

    done = await _run_in_state(http, stack, run_id, "completed")
    assert "Decision (user:alice): Ship it as a breaking v2 [ship-v2]" in done["result"]
    answered = await _journal_event(http, stack, run_id, "human.answered")
    assert answered["data"]["channel"] == "matrix"
    assert answered["data"]["answer"]["option_id"] == "ship-v2"
    told = await alice.wait_for_reply_to(response, sender=bot)
    assert told["content"]["body"].endswith(f"Recorded: {OPTIONS[1]}")
    edit = await alice.wait_for_edit_of(str(question["event_id"]))
    assert f"✅ Answered by Alice Example: “{OPTIONS[1]}”" in edit["content"]["m.new_content"]["body"]
    _, ended = await alice.wait_for(
        lambda _r, e: e.get("type") == "m.poll.end" and e["content"]["m.relates_to"]["event_id"] == poll["event_id"],
        what="the bot closing the poll",
    )
    assert ended["sender"] == bot
    assert "Answered by Alice Example" in ended["content"]["m.text"][0]["body"]
