"""HUM-8 and HUM-9 across the five service processes: the timeout chain, a run cancelled while its question
waits, and an agent's ``notify``, with people on Telegram (the Bot API emulator of ``temporality_testing``,
which human-interaction's Telegram adapter talks to over HTTP as it would to api.telegram.org).

Each test starts its own stack (nats-server, SQLite journal, the five services as processes) from the shipped
configuration plus what it needs: a directory in which alice and bob prefer Telegram (the web inbox as their
fallback), a trigger whose questions have a short timeout chain (a reminder, an escalation to bob, then
``fail``), and an agent that only notifies. The emulator runs in the test's event loop, so the stack is started
and stopped in a worker thread. Every assertion on another process waits for its condition.
"""

from __future__ import annotations

import asyncio
import copy
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_support import ALICE, API_TOKENS, CONFIG, JOURNAL, eventually, example_pr, make_stack, post_hook

from temporality_bus import Bus, NatsSettings
from temporality_embedded import Stack
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRef, ChannelRefs
from temporality_human_interaction.parking import parked_key
from temporality_human_interaction.policies import policy_key
from temporality_protocol import HumanOption, HumanPolicy, HumanRequested, make_event, new_id
from temporality_testing.telegram_emulator import TelegramEmulator, TelegramUser
from temporality_testing.waiting import stays

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ALICE_TG = TelegramUser(1001, "Alice")
BOB_TG = TelegramUser(1002, "Bob")
BOB = {"Authorization": "Bearer bob-demo-inbox-token-change-me"}
OPERATOR = {"Authorization": f"Bearer {API_TOKENS[1].token.get_secret_value()}", "X-Temporality-Console": "1"}

#: The shipped trigger with a timeout chain: a reminder at +3 s, bob asked at +6 s, the run failed at +12 s.
CHAIN_TRIGGER = "ado-pr-chain"
CHAIN_POLICY = {
    "renotify": {"every_s": 3, "max": 1},
    "escalate": {"to": "user:bob", "after_s": 3},
    "action": "fail",
}
CHAIN_TIMEOUT_S = 12
#: The trigger launching :data:`NOTIFIER`, an agent that tells alice something and finishes without waiting.
NOTIFY_TRIGGER = "ado-pr-notify"
NOTIFIER = "notifier"
NOTE = "PR #42 was reviewed automatically; nothing needs your decision."

USERS = {
    "users": {
        name: {
            "display_name": f"{name.title()} Example",
            "inbox_token": f"{name}-demo-inbox-token-change-me",
            "preferred": "telegram",
            "fallback": ["web"],
            "channels": {"telegram": {"chat_id": person.id}, "web": {}},
        }
        for name, person in (("alice", ALICE_TG), ("bob", BOB_TG))
    }
}


def _config(config: Path) -> Path:
    """The shipped config, alice and bob on Telegram, the chain trigger, the notifier and its trigger."""
    shutil.copytree(CONFIG, config)
    (config / "users.yaml").write_text(yaml.safe_dump(USERS), encoding="utf-8")
    agents = yaml.safe_load((config / "agents.yaml").read_text())
    reviewer = next(a for a in agents["agents"] if a["id"] == "reviewer")
    notifier = copy.deepcopy(reviewer) | {"id": NOTIFIER, "skills": []}
    notifier["tools"] = {"allow": ["get_input", "notify"]}
    notifier["provider"] = {
        "kind": "scripted",
        "script": {
            "steps": [
                {"id": "read", "call": {"tool": "get_input"}},
                {
                    "id": "tell",
                    "call": {"tool": "notify", "args": {"recipient": "{{ run.people[0] }}", "message": NOTE}},
                },
                {"id": "done", "answer": "Told {{ run.people[0] }}."},
            ]
        },
    }
    agents["agents"].append(notifier)
    (config / "agents.yaml").write_text(yaml.safe_dump(agents))
    triggers = yaml.safe_load((config / "triggers.yaml").read_text())
    shipped = next(t for t in triggers["triggers"] if t["id"] == "ado-pr-review")
    chain = copy.deepcopy(shipped) | {"id": CHAIN_TRIGGER}
    chain["human"] |= {"default_timeout_s": CHAIN_TIMEOUT_S, "on_timeout": CHAIN_POLICY}
    triggers["triggers"] += [chain, copy.deepcopy(shipped) | {"id": NOTIFY_TRIGGER, "agent": NOTIFIER}]
    (config / "triggers.yaml").write_text(yaml.safe_dump(triggers))
    return config


@pytest.fixture
async def tg() -> AsyncIterator[TelegramEmulator]:
    async with TelegramEmulator().serve() as emulator:
        yield emulator


@pytest.fixture
async def stack(tmp_path: Path, tg: TelegramEmulator) -> AsyncIterator[Stack]:
    s = make_stack(
        tmp_path,
        config_dir=_config(tmp_path / "config"),
        TEMPORALITY_HUMAN_TELEGRAM_TOKEN=tg.token,
        TEMPORALITY_HUMAN_TELEGRAM_BASE_URL=tg.base_url,
        TEMPORALITY_HUMAN_TELEGRAM_POLL_TIMEOUT_S="1",
    )
    await asyncio.to_thread(s.start, 120)  # the emulator answers the bot's calls meanwhile
    try:
        yield s
    finally:
        await asyncio.to_thread(s.stop)


# ---------------------------------------------------------------------------------------------- helpers
def _new_pr() -> dict[str, Any]:
    return example_pr(id=str(uuid.uuid4()))


async def _launch(http: httpx.AsyncClient, stack: Stack, trigger: str) -> str:
    accepted = await post_hook(http, stack, _new_pr(), trigger=trigger)
    assert accepted.status_code == 202, accepted.text
    return str(accepted.json()["run_id"])


async def _events(http: httpx.AsyncClient, stack: Stack, run_id: str) -> list[dict[str, Any]]:
    response = await http.get(f"{stack.journal_url}/runs/{run_id}/events", headers=JOURNAL)
    return list(response.json()["events"]) if response.status_code == 200 else []


async def _journaled(
    http: httpx.AsyncClient, stack: Stack, run_id: str, event_type: str, *, count: int = 1, timeout_s: float = 90
) -> list[dict[str, Any]]:
    """The run's ``event_type`` events once the journal holds ``count`` of them."""

    async def probe() -> list[dict[str, Any]] | None:
        found = [e for e in await _events(http, stack, run_id) if e["type"] == event_type]
        return found if len(found) >= count else None

    return await eventually(probe, timeout_s=timeout_s, what=f"{count} x {event_type} of {run_id} in the journal")


async def _run_state(http: httpx.AsyncClient, stack: Stack, run_id: str, state: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        response = await http.get(f"{stack.journal_url}/runs/{run_id}", headers=JOURNAL)
        run = response.json() if response.status_code == 200 else None
        return run if run and run["state"] == state else None

    return await eventually(probe, timeout_s=90, what=f"run {run_id} {state} in the journal")


def _bot_messages(tg: TelegramEmulator, chat_id: int, where: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    return [m for (chat, _), m in sorted(tg.messages.items()) if chat == chat_id and m["from"]["is_bot"] and where(m)]


def _about(run_marker: str) -> Callable[[dict[str, Any]], bool]:
    return lambda m: run_marker in m.get("text", "")


async def _press_first_button(tg: TelegramEmulator, person: TelegramUser, message: dict[str, Any]) -> dict[str, Any]:
    """``person`` presses the question's first button as their client still shows it; what the bot answered."""
    query = await tg.press(person, message, message["reply_markup"]["inline_keyboard"][0][0]["callback_data"])
    return await tg.wait_for_callback_answer(query, within_s=30)


async def _answer_on_the_web(
    http: httpx.AsyncClient, stack: Stack, request_id: str, who: dict[str, str]
) -> httpx.Response:
    return await http.post(
        f"{stack.human_url}/requests/{request_id}/answer", json={"option_id": "ship-v2"}, headers=who
    )


# ---------------------------------------------------------------------------------------------- HUM-8
async def test_an_unanswered_question_is_re_notified_escalated_then_expires_and_a_late_answer_is_refused(
    stack: Stack, tg: TelegramEmulator, http: httpx.AsyncClient
) -> None:
    run_id = await _launch(http, stack, CHAIN_TRIGGER)
    [requested] = await _journaled(http, stack, run_id, "human.requested")
    request_id = requested["data"]["request_id"]
    assert requested["data"]["recipient"] == "user:alice"
    title = requested["data"]["title"]

    # the question reaches alice's preferred channel
    question = await tg.wait_for_message(ALICE_TG.id, lambda m: "reply_markup" in m, within_s=60)
    assert title in question["text"]
    assert "the task fails" in question["text"] or "No answer by" in question["text"]

    # nobody answers: a reminder, as a new message to alice (a new message notifies the phone)
    reminder = await tg.wait_for_message(ALICE_TG.id, lambda m: m["text"].startswith("🔔 Reminder 1 of 1"), within_s=60)
    assert reminder["message_id"] != question["message_id"]
    [reasked] = await _journaled(http, stack, run_id, "human.reasked")
    assert (reasked["data"]["attempt"], reasked["data"]["of"], reasked["data"]["channels"]) == (1, 1, ["telegram"])

    # then the escalation recipient is asked too, on their own preferred channel
    forwarded = await tg.wait_for_message(BOB_TG.id, lambda m: m["text"].startswith("↪ Forwarded to you"), within_s=60)
    assert "Alice Example has not answered yet" in forwarded["text"]
    [escalated] = await _journaled(http, stack, run_id, "human.escalated")
    assert (escalated["data"]["to"], escalated["data"]["members"]) == ("user:bob", ["user:bob"])
    inbox = await http.get(f"{stack.human_url}/inbox", headers=BOB)
    assert request_id in [r["id"] for r in inbox.json()["requests"]]  # bob may answer now

    # the deadline: the terminal step fails the run; every copy says it expired, its buttons gone
    [expired] = await _journaled(http, stack, run_id, "human.expired")
    assert expired["data"]["action"] == "fail"
    failed = await _run_state(http, stack, run_id, "failed")
    assert failed["error"].startswith("human_request_expired")
    for copy_ in (question, reminder, forwarded):
        edited = await tg.wait_for_edit(copy_, lambda m: "⌛ Expired" in m["text"], within_s=60)
        assert not tg.buttons(edited)

    # a late answer on any channel is refused, saying why, and journaled; nothing resumes
    told = await _press_first_button(tg, BOB_TG, forwarded)
    assert told["text"].startswith("Not recorded: expired at"), told
    late = await _answer_on_the_web(http, stack, request_id, ALICE)
    assert (late.status_code, late.json()["error"]) == (409, "expired")
    refused = await _journaled(http, stack, run_id, "human.answer_refused", count=2)
    assert {(e["data"]["responder"], e["data"]["reason"]) for e in refused} == {
        ("user:bob", "expired"),
        ("user:alice", "expired"),
    }

    async def resumed_or_answered() -> bool:
        return any(e["type"] in {"human.answered", "run.resumed"} for e in await _events(http, stack, run_id))

    await stays(lambda: _not(resumed_or_answered), settle_s=3, what="no answer bound, no resume")
    assert (await _run_state(http, stack, run_id, "failed"))["state"] == "failed"


async def _not(probe: Callable[[], Any]) -> bool:
    return not await probe()


async def test_a_run_cancelled_while_its_question_waits_cancels_the_question(
    stack: Stack, tg: TelegramEmulator, http: httpx.AsyncClient
) -> None:
    run_id = await _launch(http, stack, "ado-pr-review")  # the shipped trigger: an hour to answer
    [requested] = await _journaled(http, stack, run_id, "human.requested")
    request_id = requested["data"]["request_id"]
    question = await tg.wait_for_message(ALICE_TG.id, lambda m: "reply_markup" in m, within_s=60)
    await _run_state(http, stack, run_id, "waiting_for_human")

    cancel = await http.post(
        f"{stack.journal_url}/runs/{run_id}/cancel", json={"reason": "superseded by PR 43"}, headers=OPERATOR
    )
    assert cancel.status_code == 202, cancel.text
    await _run_state(http, stack, run_id, "cancelled")

    # alice's chat shows the question is no longer open, and its buttons are gone
    edited = await tg.wait_for_edit(question, lambda m: "🚫 Cancelled" in m["text"], within_s=60)
    assert not tg.buttons(edited)
    assert await eventually(
        lambda: _inbox_lacks(http, stack, request_id), timeout_s=60, what="the question out of alice's inbox"
    )

    # a late answer -- a button an old client still shows, a reply, the web -- is refused clearly
    told = await _press_first_button(tg, ALICE_TG, question)
    assert "the request is cancelled" in told["text"], told
    assert told["show_alert"] == "true"
    await tg.reply(ALICE_TG, question, "keep v1 please")
    said = await tg.wait_for_message(ALICE_TG.id, lambda m: m["text"].startswith("Not recorded"), within_s=30)
    assert "cancelled" in said["text"]
    late = await _answer_on_the_web(http, stack, request_id, ALICE)
    assert (late.status_code, late.json()["error"]) == (409, "cancelled")
    refused = await _journaled(http, stack, run_id, "human.answer_refused", count=1)
    assert {e["data"]["reason"] for e in refused} == {"cancelled"}

    async def moved_on() -> bool:
        types = {e["type"] for e in await _events(http, stack, run_id)}
        return bool(types & {"human.answered", "run.resumed", "run.completed", "run.failed"})

    await stays(lambda: _not(moved_on), settle_s=3, what="nothing bound, nothing resumed")
    assert (await _run_state(http, stack, run_id, "cancelled"))["state"] == "cancelled"


async def _inbox_lacks(http: httpx.AsyncClient, stack: Stack, request_id: str) -> bool:
    response = await http.get(f"{stack.human_url}/inbox", headers=ALICE)
    return response.status_code == 200 and request_id not in [r["id"] for r in response.json()["requests"]]


# ---------------------------------------------------------------------------------------------- HUM-9
async def test_notify_reaches_the_preferred_channel_without_parking_the_run_and_is_journaled(
    stack: Stack, tg: TelegramEmulator, http: httpx.AsyncClient
) -> None:
    run_id = await _launch(http, stack, NOTIFY_TRIGGER)
    told = await tg.wait_for_message(ALICE_TG.id, lambda m: NOTE in m["text"], within_s=90)
    assert told["text"].startswith("📣 ")
    assert "reply_markup" not in told  # nothing to answer

    done = await _run_state(http, stack, run_id, "completed")
    assert done["result"] == "Told user:alice."
    [notify] = await _journaled(http, stack, run_id, "human.notify_requested")
    assert (notify["data"]["recipient"], notify["data"]["message"]) == ("user:alice", NOTE)
    # which channel carried it, journaled in the run by human-interaction (nothing failed before it)
    [delivered] = await _journaled(http, stack, run_id, "human.notification_delivered")
    assert delivered["data"]["notification_id"] == notify["data"]["notification_id"]
    assert (delivered["data"]["person"], delivered["data"]["channel"]) == ("user:alice", "telegram")
    assert (delivered["data"]["fallback_from"], delivered["data"]["failed_attempts"]) == (None, [])
    types = [e["type"] for e in await _events(http, stack, run_id)]
    assert "human.requested" not in types  # a notification is no question: the run never waited
    assert "run.resumed" not in types
    assert types.index("human.notify_requested") < types.index("run.completed")
    assert _bot_messages(tg, BOB_TG.id, lambda m: True) == []  # only the recipient was told


# ------------------------------------------------------------------------------- a sweep at start
async def test_a_parked_request_whose_wake_up_was_lost_is_taken_in_when_the_service_starts(
    stack: Stack, tg: TelegramEmulator, http: httpx.AsyncClient
) -> None:
    """A request parked for its run's policy whose wake-up never fired (a rolling upgrade) is taken in by the
    sweep the service runs as it starts, not a sweep interval (an hour by default) later."""
    run_id, request_id = new_id("run"), new_id("hreq")
    title = f"Parked question {request_id}"
    event = make_event(
        HumanRequested(
            request_id=request_id,
            run_id=run_id,
            agent="reviewer",
            title=title,
            recipient="user:alice",
            question="Keep the v1 contract?",
            options=[HumanOption(id="keep-v1", label="Keep v1"), HumanOption(id="ship-v2", label="Ship v2")],
            timeout_s=3600,
            expires_at=datetime.now(UTC) + timedelta(hours=1),
            policy=HumanPolicy(allowed_recipients=["user:alice"]),
            turn=1,
        ),
        source="/temporality/run-executor",
        run_id=run_id,
    )
    async with Bus.connect(NatsSettings(url=stack.nats.url), name="e2e-test") as bus:
        refs = ChannelRefs(bus)
        # as a replica left it: the request parked, its run's policy projected long ago, no timer to wake it
        await refs.claim(parked_key(run_id, request_id), event.model_dump_json())
        policy = HumanPolicy(allowed_recipients=["user:alice"]).model_dump_json()
        long_ago = datetime.now(UTC) - timedelta(minutes=10)
        kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
        await kv.put(policy_key(run_id), ChannelRef(value=policy, created_at=long_ago).model_dump_json().encode())

    await asyncio.to_thread(stack.restart, "human-interaction", 60)
    asked = await tg.wait_for_message(ALICE_TG.id, lambda m: title in m["text"], within_s=60)
    assert "reply_markup" in asked
    assert await eventually(
        lambda: _inbox_has(http, stack, request_id), timeout_s=30, what="the request in alice's inbox"
    )


async def _inbox_has(http: httpx.AsyncClient, stack: Stack, request_id: str) -> bool:
    response = await http.get(f"{stack.human_url}/inbox", headers=ALICE)
    return response.status_code == 200 and request_id in [r["id"] for r in response.json()["requests"]]
