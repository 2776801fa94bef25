"""The timeout policy chain (HUM-8) on real timers: reminders, escalation, then fail / default / cancel.

Every test runs the request and timer consumers in-process on a real nats-server, with the web inbox
and the Telegram emulator as channels, and short steps (1 s: JetStream schedules fire on whole seconds).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from directory_support import Replica, replica
from human_support import (
    BOB_TELEGRAM,
    DAVE_TELEGRAM,
    events_of,
    exactly,
    people,
    requested,
    running,
    stored,
    wait_for_record,
)
from pydantic import ValidationError

from temporality_bus import Bus, Consumer
from temporality_human_interaction.chain import ChainRunner, configured_steps, plan
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.channels.telegram import TelegramAdapter
from temporality_human_interaction.deadlines import DeadlineHandler
from temporality_human_interaction.records import HumanRequestRecord
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import (
    HumanAnswered,
    HumanEscalated,
    HumanExpired,
    HumanPolicy,
    HumanReasked,
    HumanRequested,
    HumanRequestState,
    OptionAnswer,
    RunCancelRequested,
    TimeoutPolicy,
    derive_id,
)
from temporality_protocol.catalog import CONSUMERS
from temporality_protocol.events import Escalate, Renotify
from temporality_testing.telegram_emulator import BOT_ID, TelegramEmulator

BOB, DAVE = BOB_TELEGRAM, DAVE_TELEGRAM
ALICE_WEB = {"Authorization": "Bearer alice-demo-inbox-token-change-me"}
BOB_WEB = {"Authorization": "Bearer bob-demo-inbox-token-change-me"}

USERS: dict[str, Any] = people({"reviewers": {"display_name": "Reviewers", "members": ["bob", "dave"]}})


@dataclass
class Service:
    """One in-process human-interaction replica: directory, API, channels, the request and timer consumers."""

    replica: Replica
    adapters: dict[str, ChannelAdapter]


@pytest.fixture
async def emulator() -> AsyncIterator[TelegramEmulator]:
    async with TelegramEmulator().serve() as tg:
        yield tg


@asynccontextmanager
async def service(bus: Bus, emulator: TelegramEmulator) -> AsyncIterator[Service]:
    """The parts ``__main__.setup`` wires, with the consumers running (stopped, and the adapters closed, at exit)."""
    adapters: dict[str, ChannelAdapter] = {}
    async with replica(bus, USERS, adapters=adapters) as r:
        web = WebInboxAdapter()
        telegram = TelegramAdapter(bus, token=emulator.token, base_url=emulator.base_url, poll_timeout_s=1)
        for adapter in (web, telegram):
            adapter.attach(r.router)
        async with web, telegram:
            adapters.update({web.name: web, telegram.name: telegram})
            intake = RequestHandler(bus, r.directory, adapters)
            timers = DeadlineHandler(
                bus, on_outcome=r.router.show_outcome, chain=ChainRunner(bus, r.directory, adapters)
            )
            consumers = (
                Consumer(bus, CONSUMERS["human-interaction-requests"], handler=intake.handle, fetch_timeout_s=0.2),
                Consumer(bus, CONSUMERS["human-interaction-deadlines"], raw_handler=timers.handle, fetch_timeout_s=0.2),
            )
            async with running(*consumers):
                yield Service(r, adapters)


def _chain(
    action: str = "fail",
    *,
    every_s: int | None = None,
    reminders: int = 2,
    escalate_to: str | None = None,
    after_s: int = 1,
) -> TimeoutPolicy:
    return TimeoutPolicy(
        action=action,  # type: ignore[arg-type]
        default_option="keep-v1" if action == "default" else None,
        renotify=Renotify(every_s=every_s, max=reminders) if every_s is not None else None,
        escalate=Escalate(to=escalate_to, after_s=after_s) if escalate_to is not None else None,
    )


def _bot_messages(emulator: TelegramEmulator, chat_id: int) -> list[dict[str, Any]]:
    return [m for (chat, _), m in sorted(emulator.messages.items()) if chat == chat_id and m["from"]["id"] == BOT_ID]


def _sent_texts(emulator: TelegramEmulator, chat_id: int) -> list[str]:
    """The text of every ``sendMessage`` to ``chat_id``, as sent (the messages themselves are edited later)."""
    return [str(p["text"]) for m, p in emulator.calls if m == "sendMessage" and int(p["chat_id"]) == chat_id]


# --------------------------------------------------------------------------- the policy model
def test_existing_timeout_configs_keep_their_meaning_and_the_chain_is_validated() -> None:
    assert TimeoutPolicy.model_validate({"action": "fail"}) == TimeoutPolicy()
    default = TimeoutPolicy.model_validate({"action": "default", "default_option": "keep-v1"})
    assert (default.action, default.default_option, default.renotify, default.escalate) == (
        "default",
        "keep-v1",
        None,
        None,
    )
    chain = HumanPolicy.model_validate(
        {
            "allowed_recipients": ["user:alice"],
            "on_timeout": {
                "renotify": {"every_s": 900, "max": 2},
                "escalate": {"to": "group:api-owners", "after_s": 1800},
                "action": "cancel",
            },
        }
    ).on_timeout
    assert chain.renotify == Renotify(every_s=900, max=2)
    assert chain.escalate == Escalate(to="group:api-owners", after_s=1800)
    for bad in (
        {"renotify": {"every_s": 0, "max": 2}},
        {"renotify": {"every_s": 60, "max": 0}},
        {"escalate": {"to": "bob", "after_s": 60}},
        {"escalate": {"to": "user:bob", "after_s": 0}},
        {"action": "default"},
        {"action": "explode"},
    ):
        with pytest.raises(ValidationError):
            TimeoutPolicy.model_validate(bad)


def test_the_plan_is_reminders_then_escalation_and_never_reaches_past_the_deadline() -> None:
    event = requested(
        expires_in_s=3600, on_timeout=_chain(every_s=900, reminders=3, escalate_to="user:bob", after_s=900)
    )
    record = HumanRequestRecord.from_requested(event, event.payload(HumanRequested))
    steps = plan(record)
    assert [(s.kind, s.attempt, round((s.at - record.created_at).total_seconds())) for s in steps] == [
        ("reask", 1, 900),
        ("reask", 2, 1800),
        ("reask", 3, 2700),
        # the escalation would be at 3600 = the deadline: the deadline wins
    ]
    assert [s.tag for s in steps] == ["reask-1", "reask-2", "reask-3"]
    assert configured_steps(record.policy.on_timeout) == 4


# --------------------------------------------------------------------------- on real timers
async def test_renotify_twice_then_default(bus: Bus, emulator: TelegramEmulator) -> None:
    async with service(bus, emulator):
        event = requested(
            # reminders due at 1 s and 2 s, the deadline at 8 s: a loaded machine that fires the second reminder
            # late still fires it before the deadline ends the request (3 s once let the deadline win)
            recipient="user:bob",
            allowed=("user:bob",),
            expires_in_s=8,
            on_timeout=_chain("default", every_s=1),
        )
        request_id = str(event.data["request_id"])
        await bus.publish(event)

        first, second = await events_of(bus, "human.reasked", wait_for=2, within_s=30)
        assert [e.payload(HumanReasked).attempt for e in (first, second)] == [1, 2]
        assert second.id == derive_id("evt", request_id, "reasked", "2")
        assert second.payload(HumanReasked).channels == ["telegram"]
        assert second.payload(HumanReasked).of == 2
        [expired] = await events_of(bus, "human.expired", wait_for=1, within_s=30)
        assert expired.payload(HumanExpired).action == "default"
        assert expired.payload(HumanExpired).default_answer == OptionAnswer(
            option_id="keep-v1", label="Keep the v1 API"
        )

        sent = _bot_messages(emulator, BOB.id)
        assert [text.splitlines()[0] for text in _sent_texts(emulator, BOB.id)] == [
            "❓ Review PR 42: remove the v1 API",
            "🔔 Reminder 1 of 2: still waiting for your answer.",
            "🔔 Reminder 2 of 2: still waiting for your answer.",
        ]
        for message in sent:  # the question and both reminders say it expired
            await emulator.wait_for_edit(message, lambda m: "⌛ Expired" in m["text"])
        record = await stored(bus, request_id)
        assert record is not None
        assert record.chain_done == 2
        assert [c.tag for c in record.deliveries] == ["", "reask-1", "reask-2"]


async def test_escalate_to_another_user_who_answers(bus: Bus, emulator: TelegramEmulator) -> None:
    async with service(bus, emulator) as s:
        event = requested(
            recipient="user:alice", allowed=("user:alice",), expires_in_s=30, on_timeout=_chain(escalate_to="user:bob")
        )
        request_id = str(event.data["request_id"])
        await bus.publish(event)
        await wait_for_record(bus, request_id, lambda r: r.channel == "web")
        early = await s.replica.client.post(
            f"/requests/{request_id}/answer", json={"option_id": "drop-v1"}, headers=BOB_WEB
        )
        assert early.status_code == 403  # before the escalation Bob may not answer

        [escalated] = await events_of(bus, "human.escalated", wait_for=1, within_s=10)
        payload = escalated.payload(HumanEscalated)
        assert (payload.recipient, payload.to, payload.members, payload.channels) == (
            "user:alice",
            "user:bob",
            ["user:bob"],
            ["telegram"],
        )
        inbox = (await s.replica.client.get("/inbox", headers=BOB_WEB)).json()["requests"]
        assert [i["id"] for i in inbox] == [request_id]  # the target's inbox lists it once it escalated
        forwarded = await emulator.wait_for_message(BOB.id, lambda m: m["text"].startswith("↪ Forwarded to you"))
        assert "Alice Example has not answered yet" in forwarded["text"]
        press = await emulator.press(BOB, forwarded, emulator.buttons(forwarded)[1]["callback_data"])
        assert (await emulator.wait_for_callback_answer(press))["text"] == "Recorded: Drop v1"

        [answered] = await exactly(bus, "human.answered", settle_s=0.3)
        assert (answered.payload(HumanAnswered).recipient, answered.payload(HumanAnswered).responder) == (
            "user:alice",
            "user:bob",
        )
        await emulator.wait_for_edit(forwarded, lambda m: "✅ Answered by Bob Example" in m["text"])
        late = await s.replica.client.post(
            f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE_WEB
        )
        assert late.status_code == 409
        assert "already answered by Bob Example (user:bob)" in late.json()["detail"]


async def test_escalate_to_a_group_any_member_answers_and_the_others_are_edited(
    bus: Bus, emulator: TelegramEmulator
) -> None:
    async with service(bus, emulator):
        event = requested(
            recipient="user:alice",
            allowed=("user:alice",),
            expires_in_s=30,
            on_timeout=_chain(escalate_to="group:reviewers"),
        )
        request_id = str(event.data["request_id"])
        await bus.publish(event)
        [escalated] = await events_of(bus, "human.escalated", wait_for=1, within_s=10)
        assert escalated.payload(HumanEscalated).members == ["user:bob", "user:dave"]
        bobs = await emulator.wait_for_message(BOB.id, lambda m: m["text"].startswith("↪ Forwarded"))
        daves = await emulator.wait_for_message(DAVE.id, lambda m: m["text"].startswith("↪ Forwarded"))
        press = await emulator.press(DAVE, daves, emulator.buttons(daves)[0]["callback_data"])
        assert (await emulator.wait_for_callback_answer(press))["text"] == "Recorded: Keep the v1 API"
        await emulator.wait_for_edit(bobs, lambda m: "✅ Answered by Dave Example" in m["text"])
        [answered] = await exactly(bus, "human.answered", settle_s=0.3)
        assert answered.payload(HumanAnswered).responder == "user:dave"
        record = await stored(bus, request_id)
        assert record is not None
        assert (record.escalated_to, record.escalation_members) == ("group:reviewers", ["user:bob", "user:dave"])


async def test_terminal_cancel_asks_to_cancel_the_run_and_a_late_answer_is_refused_and_recorded(
    bus: Bus, emulator: TelegramEmulator
) -> None:
    async with service(bus, emulator) as s:
        event = requested(recipient="user:bob", allowed=("user:bob",), expires_in_s=2, on_timeout=_chain("cancel"))
        request_id = str(event.data["request_id"])
        await bus.publish(event)
        question = await emulator.wait_for_message(BOB.id)
        button = emulator.buttons(question)[0]["callback_data"]  # what Bob's client shows before it expires
        assert "the task is cancelled" in question["text"]  # what the person is told will happen
        [cancel] = await events_of(bus, "run.cancel_requested", wait_for=1, within_s=10)
        assert cancel.id == derive_id("evt", request_id, "cancel_requested")
        assert cancel.runid == event.runid
        assert cancel.causationid == event.id
        payload = cancel.payload(RunCancelRequested)
        assert payload.run_id == event.runid
        assert payload.reason.startswith(f"human_timeout: nobody answered {request_id}")
        assert payload.requested_by == "service:human-interaction"
        [expired] = await events_of(bus, "human.expired", wait_for=1, within_s=10)
        assert expired.payload(HumanExpired).action == "cancel"

        await emulator.wait_for_edit(question, lambda m: "⌛ Expired" in m["text"])
        press = await emulator.press(BOB, question, button)  # pressed after the terminal outcome
        told = (await emulator.wait_for_callback_answer(press))["text"]
        assert told.startswith("Not recorded: expired at ")
        assert told.endswith("without an answer — the run was cancelled."), told  # what the run did, said
        late = await s.replica.client.post(
            f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=BOB_WEB
        )
        assert late.status_code == 409
        assert late.json()["error"] == "expired"
        record = await stored(bus, request_id)
        assert record is not None
        assert [(a.responder, a.channel, a.refused) for a in record.late_answers] == [
            ("user:bob", "telegram", "expired"),
            ("user:bob", "web", "expired"),
        ]
        assert record.late_answers[1].answer == OptionAnswer(option_id="keep-v1", label="Keep the v1 API")
        await exactly(bus, "human.answered", 0, settle_s=0.2)


async def test_an_answer_between_steps_stops_the_chain(bus: Bus, emulator: TelegramEmulator) -> None:
    async with service(bus, emulator) as s:
        event = requested(
            recipient="user:alice",
            allowed=("user:alice",),
            expires_in_s=60,
            on_timeout=_chain(every_s=2, reminders=3, escalate_to="user:bob"),
        )
        request_id = str(event.data["request_id"])
        await bus.publish(event)
        [reasked, *_] = await events_of(bus, "human.reasked", wait_for=1, within_s=10)
        assert reasked.payload(HumanReasked).channels == ["web"]
        answer = await s.replica.client.post(
            f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE_WEB
        )
        assert answer.status_code == 200
        record = await stored(bus, request_id)
        assert record is not None
        assert record.status is HumanRequestState.ANSWERED
        # The steps taken before the answer was recorded: the first reminder, and on a loaded machine maybe
        # the next one too (they are 2 s apart). The record is the truth; the chain takes nothing after it.
        taken = record.chain_done
        assert taken >= 1
        await asyncio.sleep(2.5)  # longer than a step: a chain still running would take its next one here
        after = await stored(bus, request_id)
        assert after is not None
        assert after.chain_done == taken
        assert after.status is HumanRequestState.ANSWERED
        await exactly(bus, "human.reasked", min(taken, 3), settle_s=0)
        await exactly(bus, "human.escalated", 1 if taken > 3 else 0, settle_s=0)
        assert after.escalated_to == ("user:bob" if taken > 3 else None)


async def test_a_restart_mid_chain_loses_nothing(bus: Bus, emulator: TelegramEmulator) -> None:
    event = requested(
        # reminders due at 1 s and 2 s, the deadline at 20 s: the restart (a stop and a start, slow on a loaded
        # machine) must come before the deadline, not before the second reminder (3 s, then 8 s, let the
        # deadline win: at load 12 the restart took longer than 6 s)
        recipient="user:bob",
        allowed=("user:bob",),
        expires_in_s=20,
        on_timeout=_chain("default", every_s=1, reminders=2),
    )
    request_id = str(event.data["request_id"])
    async with service(bus, emulator):
        await bus.publish(event)
        await events_of(bus, "human.reasked", wait_for=1, within_s=10)
    # stopped between the first and the second reminder; a new process takes over from the stored record
    async with service(bus, emulator):
        await events_of(bus, "human.reasked", wait_for=2, within_s=20)
        [expired] = await events_of(bus, "human.expired", wait_for=1, within_s=30)
        assert expired.payload(HumanExpired).action == "default"
        await exactly(bus, "human.reasked", 2, settle_s=0.3)
    record = await stored(bus, request_id)
    assert record is not None
    assert record.chain_done == 2
    assert [c.tag for c in record.deliveries] == ["", "reask-1", "reask-2"]
    assert len(_bot_messages(emulator, BOB.id)) == 3


async def test_redelivered_and_duplicated_step_firings_take_the_step_once(bus: Bus) -> None:
    async with replica(bus, USERS) as r, WebInboxAdapter() as web:
        adapters: dict[str, ChannelAdapter] = {web.name: web}
        event = requested(
            recipient="user:alice", allowed=("user:alice",), expires_in_s=3600, on_timeout=_chain(every_s=60)
        )
        request_id = str(event.data["request_id"])
        await RequestHandler(bus, r.directory, adapters).handle(event)  # no consumer runs: the timers never fire

        def later() -> datetime:
            return datetime.now(UTC) + timedelta(seconds=90)  # reminder 1 is due, reminder 2 is not

        replicas = [DeadlineHandler(bus, clock=later, chain=ChainRunner(bus, r.directory, adapters)) for _ in "ab"]
        fired = json.dumps({"request_id": request_id, "step": 0}).encode()
        await asyncio.gather(*(h.handle(fired) for h in replicas))  # two replicas, one step
        await replicas[0].handle(fired)  # and a redelivery after it is done
        [reasked] = await exactly(bus, "human.reasked", settle_s=0.3)
        assert reasked.payload(HumanReasked).attempt == 1
        record = await stored(bus, request_id)
        assert record is not None
        assert record.chain_done == 1
        assert [c.tag for c in record.deliveries] == ["", "reask-1"]

        early = json.dumps({"request_id": request_id, "step": 1}).encode()
        await replicas[1].handle(early)  # reminder 2 fired before it is due: re-armed, not taken
        assert (await stored(bus, request_id)) == record  # handle() returned: nothing else is on its way
        await exactly(bus, "human.reasked", 1, settle_s=0)
