"""Ask routing against a real nats-server: agent-collab in-process, the run-executor's side played by the test.

The test publishes what the run-executor will publish (``run.started`` and terminal events, ``agent.asked``,
``agent.replied``) and waits on what agent-collab produces (COL-2..COL-9, PRO-1).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr

from temporality_agent_collab.__main__ import SPEC, configure
from temporality_agent_collab.asks import RELAY_MAX_TURNS, AskRecord, ask_key
from temporality_agent_collab.router import AskRouter
from temporality_agent_collab.settings import Settings
from temporality_bus import Bus, Delivery, NatsSettings, TransientError
from temporality_embedded.natsserver import NatsServer
from temporality_protocol import (
    AgentAnswerReceived,
    AgentAsked,
    AgentAskExpired,
    AgentAskUndeliverable,
    AgentMessageReceived,
    AgentReplied,
    AgentReplyUndeliverable,
    CollaboratorsQuery,
    CollaboratorsReply,
    Envelope,
    EventData,
    RunCompleted,
    RunFailed,
    RunRequested,
    RunStarted,
    decode,
    derive_id,
    encode,
    make_event,
)
from temporality_protocol.catalog import (
    ALL_BUCKETS,
    ALL_STREAMS,
    BUCKET_COLLAB,
    CONSUMERS,
    DLQ_STREAM,
    EVENTS_STREAM,
    RPC_GET_COLLABORATORS,
    TIMER_NS_AGENT_ASK,
    TIMER_SCHEDULE_PREFIX,
)
from temporality_protocol.permissions import permissions_for
from temporality_protocol.states import AgentAskState
from temporality_service import run_until
from temporality_testing.events import EventLog
from temporality_testing.facts import answered_by
from temporality_testing.timers import armed_schedules
from temporality_testing.waiting import eventually, stays

SAGA = derive_id("run", "ask-lead")
LEAD = SAGA
REVIEWER = derive_id("run", "ask-reviewer")
OTHER_SAGA = derive_id("run", "ask-foreign")
T0 = datetime.now(UTC) - timedelta(minutes=5)
WAIT_S = 15.0

MESSAGE_RECEIVED = AgentMessageReceived.EVENT_TYPE
ANSWER_RECEIVED = AgentAnswerReceived.EVENT_TYPE
UNDELIVERABLE = AgentAskUndeliverable.EVENT_TYPE
REPLY_UNDELIVERABLE = AgentReplyUndeliverable.EVENT_TYPE
OUTPUTS = (MESSAGE_RECEIVED, ANSWER_RECEIVED, UNDELIVERABLE, REPLY_UNDELIVERABLE, AgentAskExpired.EVENT_TYPE)


# --------------------------------------------------------------------------- what the run-executor publishes
def _ev(data: EventData, run_id: str, saga: str, *, id: str | None = None, time: datetime | None = None) -> Envelope:
    return make_event(data, source="/temporality/run-executor", run_id=run_id, correlation_id=saga, id=id, time=time)


def started(run_id: str, agent: str, *, saga: str = SAGA, parent: str | None = None, at: datetime = T0) -> Envelope:
    data = RunStarted(run_id=run_id, agent=agent, role=agent, title=f"{agent}'s task", parent_run_id=parent)
    return _ev(data, run_id, saga, id=derive_id("evt", "run.started", run_id), time=at)


def completed(run_id: str, *, saga: str = SAGA) -> Envelope:
    return _ev(RunCompleted(run_id=run_id, result="done", turns=2), run_id, saga, id=derive_id("evt", "done", run_id))


def asked(
    request: str,
    to: str,
    *,
    asker: str = LEAD,
    agent: str = "planner",
    mode: str = "async",
    timeout_s: int = 300,
    message: str = "Is PR 42 safe to merge?",
    saga: str = SAGA,
) -> Envelope:
    data = AgentAsked.model_validate(
        {
            "request_id": request,
            "asker_run_id": asker,
            "asker_agent": agent,
            "to": to,
            "mode": mode,
            "timeout_s": timeout_s,
            "message": message,
            "turn": 2,
        }
    )
    return _ev(data, asker, saga, id=derive_id("evt", "agent.asked", request))


def replied(
    request: str,
    *,
    by: str = REVIEWER,
    agent: str = "reviewer",
    answer: str = "yes",
    outcome: str = "answer",
    n: int = 0,
) -> Envelope:
    data = AgentReplied.model_validate(
        {"request_id": request, "replier_run_id": by, "replier_agent": agent, "answer": answer, "outcome": outcome}
    )
    return _ev(data, by, SAGA, id=derive_id("evt", "agent.replied", request, by, str(n)))


async def publish(bus: Bus, *events: Envelope) -> None:
    for event in events:
        await bus.publish(event)


def of(log: EventLog, event_type: str, request: str) -> list[Envelope]:
    return [e for e in log.of_type(event_type) if e.data.get("request_id") == request]


async def one(log: EventLog, event_type: str, request: str) -> Envelope:
    (event,) = await log.wait_for(event_type, where=lambda e: e.data.get("request_id") == request, timeout_s=WAIT_S)
    return event


# --------------------------------------------------------------------------- agent-collab in-process
Collab = Callable[[], Awaitable[Callable[[], Awaitable[None]]]]


@pytest.fixture
async def start_collab(nats_settings: NatsSettings) -> AsyncIterator[Collab]:
    """Start agent-collab through the runtime (``run_until``); returns a stop function. All stopped at teardown."""
    tasks: list[tuple[asyncio.Event, asyncio.Task[None]]] = []

    async def start() -> Callable[[], Awaitable[None]]:
        settings = Settings(nats=nats_settings)
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(run_until(SPEC, settings, configure(settings), stop, ready=ready))
        tasks.append((stop, task))
        ready_wait = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait([task, ready_wait], timeout=10, return_when="FIRST_COMPLETED")
        ready_wait.cancel()
        if task in done:
            task.result()
        assert ready.is_set(), "agent-collab not ready within 10 s"

        async def stopped() -> None:
            stop.set()
            await asyncio.wait_for(task, 15)

        return stopped

    yield start
    for stop, _ in tasks:
        stop.set()
    for _, task in tasks:
        await asyncio.wait_for(task, 15)


@pytest.fixture
async def collab(start_collab: Collab) -> Callable[[], Awaitable[None]]:
    return await start_collab()


@pytest.fixture
async def saga(bus: Bus, collab: object) -> None:
    """A lead (planner) and its delegated reviewer, both running, plus a foreign saga with an auditor."""
    await publish(
        bus,
        started(LEAD, "planner"),
        started(REVIEWER, "reviewer", parent=LEAD),
        started(OTHER_SAGA, "auditor", saga=OTHER_SAGA),
    )


# --------------------------------------------------------------------------- tests
async def test_async_ask_to_a_live_agent_and_its_answer(bus: Bus, event_log: EventLog, saga: None) -> None:
    await publish(bus, asked("req-live", "agent:reviewer"))
    received = await one(event_log, MESSAGE_RECEIVED, "req-live")
    assert received.runid == REVIEWER  # the recipient's trajectory
    assert received.correlationid == SAGA
    msg = received.payload(AgentMessageReceived)
    assert (msg.resolved_run_id, msg.recipient_run_id, msg.resolved_agent) == (REVIEWER, REVIEWER, "reviewer")
    assert (msg.mode, msg.relay, msg.relay_run, msg.expires_at) == ("async", False, None, None)
    assert (msg.asker_run_id, msg.asker_agent, msg.message) == (LEAD, "planner", "Is PR 42 safe to merge?")

    await publish(bus, replied("req-live", answer="yes, merge it"))
    answer = await one(event_log, ANSWER_RECEIVED, "req-live")
    assert answer.runid == LEAD
    got = answer.payload(AgentAnswerReceived)
    assert (got.outcome, got.answer, got.replier_run_id, got.late, got.relay) == (
        "answer",
        "yes, merge it",
        REVIEWER,
        False,
        False,
    )
    record = await (await bus.store(BUCKET_COLLAB, AskRecord)).get(ask_key("req-live"))
    assert record is not None
    assert record.value.state is AgentAskState.ANSWERED


@pytest.mark.parametrize("to", ["agent:reviewer", f"run:{REVIEWER}", REVIEWER])
async def test_the_three_address_forms(bus: Bus, event_log: EventLog, saga: None, to: str) -> None:
    await publish(bus, asked("req-forms", to))
    msg = (await one(event_log, MESSAGE_RECEIVED, "req-forms")).payload(AgentMessageReceived)
    assert msg.recipient_run_id == REVIEWER
    assert msg.to == to


async def test_agent_address_resolves_the_latest_started_run(bus: Bus, event_log: EventLog, saga: None) -> None:
    newer = derive_id("run", "ask-reviewer-2")
    older = derive_id("run", "ask-reviewer-0")
    await publish(
        bus,
        started(newer, "reviewer", parent=LEAD, at=T0 + timedelta(minutes=2)),
        started(older, "reviewer", parent=LEAD, at=T0 - timedelta(minutes=2)),  # published later, started earlier
        asked("req-latest", "agent:reviewer"),
    )
    msg = (await one(event_log, MESSAGE_RECEIVED, "req-latest")).payload(AgentMessageReceived)
    assert msg.recipient_run_id == newer


@pytest.mark.parametrize(
    ("to", "reason"),
    [
        ("agent:auditor", "unknown_addressee"),  # exists, but in another saga (COL-7)
        (f"run:{OTHER_SAGA}", "unknown_addressee"),
        (OTHER_SAGA, "unknown_addressee"),
        ("agent:ghost", "unknown_addressee"),
        ("run:run-nobody", "unknown_addressee"),
        ("human:alice", "invalid_address"),
        ("agent:", "invalid_address"),
        ("agent:planner", "self_addressed"),
    ],
)
async def test_foreign_unknown_and_invalid_addressees_are_refused(
    bus: Bus, event_log: EventLog, saga: None, to: str, reason: str
) -> None:
    await publish(bus, asked("req-refused", to))
    refused = await one(event_log, UNDELIVERABLE, "req-refused")
    assert refused.runid == LEAD
    data = refused.payload(AgentAskUndeliverable)
    assert (data.reason, data.to, data.asker_run_id) == (reason, to, LEAD)
    assert data.detail
    assert "auditor" not in data.detail or to == "agent:auditor"  # nothing about the foreign saga leaks
    assert OTHER_SAGA not in data.detail or OTHER_SAGA in to
    await event_log.caught_up()
    assert of(event_log, MESSAGE_RECEIVED, "req-refused") == []
    assert event_log.of_type(RunRequested.EVENT_TYPE) == []


async def test_an_ask_from_a_run_agent_collab_never_saw_is_undeliverable(
    bus: Bus, event_log: EventLog, saga: None
) -> None:
    stranger = derive_id("run", "never-started")
    await publish(bus, asked("req-stranger", "agent:reviewer", asker=stranger))
    data = (await one(event_log, UNDELIVERABLE, "req-stranger")).payload(AgentAskUndeliverable)
    assert data.reason == "asker_unknown"


async def test_an_ask_to_a_finished_agent_starts_numbered_relay_runs(bus: Bus, event_log: EventLog, saga: None) -> None:
    await publish(bus, completed(REVIEWER), asked("req-relay-1", "agent:reviewer"))
    (request,) = await event_log.wait_for(RunRequested.EVENT_TYPE, timeout_s=WAIT_S)
    relay_run = f"{REVIEWER}/ask/01"
    assert request.runid == relay_run
    assert request.correlationid == SAGA
    run = request.payload(RunRequested)
    assert (run.run_id, run.agent, run.parent_run_id) == (relay_run, "reviewer", REVIEWER)
    assert run.relay is not None
    assert (run.relay.request_id, run.relay.asker_run_id, run.relay.target_run_id) == ("req-relay-1", LEAD, REVIEWER)
    assert (run.relay.max_turns, run.relay.may_delegate, run.relay.on_asker_end) == (RELAY_MAX_TURNS, False, "abandon")
    assert run.human.allowed_recipients == []  # never wider than the initiator's
    (incoming,) = run.input["incoming_asks"]
    assert incoming["request_id"] == "req-relay-1"
    assert incoming["from"] == "agent:planner"
    assert incoming["message"] == "Is PR 42 safe to merge?"
    assert "expires_at" not in incoming  # an async ask has no deadline
    assert "answer_agent" in run.input["instructions"]
    assert "req-relay-1" in run.input["instructions"]

    msg = (await one(event_log, MESSAGE_RECEIVED, "req-relay-1")).payload(AgentMessageReceived)
    assert (msg.relay, msg.relay_run, msg.recipient_run_id, msg.resolved_run_id) == (
        True,
        relay_run,
        relay_run,
        REVIEWER,
    )

    # a second ask to the same finished run: the next number
    await publish(bus, asked("req-relay-2", f"run:{REVIEWER}"))
    second = await event_log.wait_for(RunRequested.EVENT_TYPE, count=2, timeout_s=WAIT_S)
    assert sorted(e.runid or "" for e in second) == [relay_run, f"{REVIEWER}/ask/02"]

    # the relay run starts (the run-executor), answers and ends at once; the answer reaches the asker
    await publish(
        bus,
        started(relay_run, "reviewer", parent=REVIEWER),
        replied("req-relay-1", by=relay_run, answer="it was safe when I reviewed it"),
        completed(relay_run),
    )
    answer = (await one(event_log, ANSWER_RECEIVED, "req-relay-1")).payload(AgentAnswerReceived)
    assert (answer.relay, answer.relay_run, answer.replier_run_id) == (True, relay_run, relay_run)
    # its end right after the answer is not taken for a failure, whichever consumer saw what first
    await _settled(bus, "agent-collab-runs")
    await _no_schedule(bus, "req-relay-1.relay")
    await _settled(bus, "agent-collab-ask-timers")
    await event_log.caught_up()
    assert of(event_log, UNDELIVERABLE, "req-relay-1") == []
    # agent:reviewer still means the original reviewer (relay runs are never resolution targets)
    await publish(bus, asked("req-relay-3", "agent:reviewer"))
    third = await event_log.wait_for(RunRequested.EVENT_TYPE, count=3, timeout_s=WAIT_S)
    assert f"{REVIEWER}/ask/03" in {e.runid for e in third}


async def test_a_relay_run_that_ends_without_answering_is_undeliverable(
    bus: Bus, event_log: EventLog, saga: None
) -> None:
    ask = asked("req-relay-x", "agent:reviewer", mode="wait", timeout_s=60)
    await publish(bus, completed(REVIEWER), ask)
    msg = (await one(event_log, MESSAGE_RECEIVED, "req-relay-x")).payload(AgentMessageReceived)
    assert msg.relay_run is not None
    # the relay run is told the wait's deadline, as a delivered ask is ("(until …)")
    (request,) = await event_log.wait_for(RunRequested.EVENT_TYPE, timeout_s=WAIT_S)
    (incoming,) = request.payload(RunRequested).input["incoming_asks"]
    assert datetime.fromisoformat(incoming["expires_at"]) == ask.time + timedelta(seconds=60)
    await publish(
        bus,
        started(msg.relay_run, "reviewer", parent=REVIEWER),
        _ev(RunFailed(run_id=msg.relay_run, reason="max_turns", error="used all 6 turns"), msg.relay_run, SAGA),
    )
    refused = await one(event_log, UNDELIVERABLE, "req-relay-x")
    assert refused.runid == LEAD
    data = refused.payload(AgentAskUndeliverable)
    assert data.reason == "relay_failed"
    assert msg.relay_run in data.detail
    await _no_schedule(bus, "req-relay-x")  # the asker no longer waits: its timeout is cancelled


async def test_wait_mode_expires_and_a_late_reply_still_arrives(bus: Bus, event_log: EventLog, saga: None) -> None:
    await publish(bus, asked("req-wait", "agent:reviewer", mode="wait", timeout_s=1))
    msg = (await one(event_log, MESSAGE_RECEIVED, "req-wait")).payload(AgentMessageReceived)
    assert msg.mode == "wait"
    assert msg.expires_at is not None
    expired = await one(event_log, AgentAskExpired.EVENT_TYPE, "req-wait")
    assert expired.runid == LEAD
    data = expired.payload(AgentAskExpired)
    assert (data.recipient_run_id, data.timeout_s) == (REVIEWER, 1)

    await publish(bus, replied("req-wait", answer="sorry, late"))  # the request stayed open (COL-2)
    answer = (await one(event_log, ANSWER_RECEIVED, "req-wait")).payload(AgentAnswerReceived)
    assert (answer.late, answer.mode, answer.answer) == (True, "wait", "sorry, late")


async def test_a_wait_answered_in_time_cancels_its_timer(bus: Bus, event_log: EventLog, saga: None) -> None:
    await publish(bus, asked("req-in-time", "agent:reviewer", mode="wait", timeout_s=30))
    await one(event_log, MESSAGE_RECEIVED, "req-in-time")
    schedule = f"{TIMER_SCHEDULE_PREFIX}.{TIMER_NS_AGENT_ASK}.req-in-time"
    assert await armed_schedules(bus, schedule) == 1  # armed before the message went out
    await publish(bus, replied("req-in-time"))
    answer = (await one(event_log, ANSWER_RECEIVED, "req-in-time")).payload(AgentAnswerReceived)
    assert answer.late is False
    assert await armed_schedules(bus, schedule) == 0  # cancelled before the answer went out


async def test_a_second_answer_is_refused(bus: Bus, event_log: EventLog, saga: None) -> None:
    await publish(bus, asked("req-twice", "agent:reviewer"))
    await one(event_log, MESSAGE_RECEIVED, "req-twice")
    await publish(bus, replied("req-twice", answer="first"))
    await one(event_log, ANSWER_RECEIVED, "req-twice")
    await publish(bus, replied("req-twice", answer="second", n=1))
    refused = await one(event_log, REPLY_UNDELIVERABLE, "req-twice")
    assert refused.runid == REVIEWER
    assert refused.payload(AgentReplyUndeliverable).reason == "already_answered"
    await event_log.caught_up()
    (answer,) = of(event_log, ANSWER_RECEIVED, "req-twice")
    assert answer.payload(AgentAnswerReceived).answer == "first"


async def test_only_the_recipient_may_answer_and_only_requests_that_exist(
    bus: Bus, event_log: EventLog, saga: None
) -> None:
    await publish(bus, asked("req-mine", "agent:reviewer"))
    await one(event_log, MESSAGE_RECEIVED, "req-mine")
    await publish(bus, replied("req-mine", by=OTHER_SAGA, agent="auditor"), replied("req-nobody"))
    wrong = (await one(event_log, REPLY_UNDELIVERABLE, "req-mine")).payload(AgentReplyUndeliverable)
    assert wrong.reason == "not_received"
    unknown = (await one(event_log, REPLY_UNDELIVERABLE, "req-nobody")).payload(AgentReplyUndeliverable)
    assert unknown.reason == "unknown_request"
    await event_log.caught_up()
    assert of(event_log, ANSWER_RECEIVED, "req-mine") == []


async def test_a_reply_after_the_asker_finished_is_recorded_not_delivered(
    bus: Bus, event_log: EventLog, saga: None
) -> None:
    await publish(bus, asked("req-gone", "agent:reviewer"))
    await one(event_log, MESSAGE_RECEIVED, "req-gone")
    await publish(bus, completed(LEAD), replied("req-gone", answer="too late for you"))
    refused = (await one(event_log, REPLY_UNDELIVERABLE, "req-gone")).payload(AgentReplyUndeliverable)
    assert (refused.reason, refused.asker_run_id) == ("asker_finished", LEAD)
    assert "nowhere to deliver" in refused.detail
    await event_log.caught_up()
    assert of(event_log, ANSWER_RECEIVED, "req-gone") == []
    record = await (await bus.store(BUCKET_COLLAB, AskRecord)).get(ask_key("req-gone"))
    assert record is not None
    assert record.value.state is AgentAskState.REPLY_UNDELIVERABLE
    assert record.value.answer == "too late for you"  # the reply is kept with the request


async def _collaborators(bus: Bus, run_id: str) -> dict[str, tuple[str, str | None]]:
    """``get_collaborators`` for ``run_id``: item id -> (status, run id); empty while the run is unknown."""
    raw = await bus.request(RPC_GET_COLLABORATORS, CollaboratorsQuery(run_id=run_id).model_dump_json().encode())
    reply = CollaboratorsReply.model_validate_json(raw)
    return {c.id: (c.status, c.run_id) for c in reply.collaborators}


async def test_a_run_that_never_collaborated_is_a_full_collaborator_when_another_joins_its_saga_later(
    bus: Bus, event_log: EventLog, collab: object
) -> None:
    """Why agent-collab projects every run although most never collaborate (docs/agent-collaboration.md, "What a run
    that never collaborates costs agent-collab"): nothing at a run's start -- nor at its end -- tells a run that
    stays alone from the first run of a saga another run joins later, and that later run still needs the first's
    agent, status and the people who answered it: in ``get_collaborators``, to address it (a relay of the finished
    run) and to tell its own reply ``asker_finished`` after it ended."""
    solo = derive_id("run", "solo-then-joined")
    late = derive_id("run", "joins-solo-later")
    answered = make_event(
        answered_by("alice", solo, "req-alice"),
        source="/temporality/human-interaction",
        run_id=solo,
        correlation_id=solo,
    )
    await publish(bus, started(solo, "planner", saga=solo), answered, completed(solo, saga=solo))
    alone = {"agent:planner": ("completed", solo), "human:alice": ("answered", solo)}

    async def alone_seen() -> bool:
        return await _collaborators(bus, solo) == alone

    await eventually(alone_seen, WAIT_S, "the solo run, finished, and alice in get_collaborators")

    # long after it ended, another run joins its saga (correlationid = the solo run)
    await publish(bus, started(late, "reviewer", saga=solo, parent=solo, at=T0 + timedelta(minutes=1)))
    joined = alone | {"agent:reviewer": ("running", late)}

    async def joined_seen() -> bool:
        return await _collaborators(bus, late) == joined

    await eventually(joined_seen, WAIT_S, "the late run's collaborators: the solo run, alice, itself")

    # the late run asks the (finished) solo run's agent: a relay run of it, in its saga
    await publish(bus, asked("req-joined", "agent:planner", asker=late, agent="reviewer", saga=solo))
    (request,) = await event_log.wait_for(RunRequested.EVENT_TYPE, timeout_s=WAIT_S)
    relay_run = f"{solo}/ask/01"
    assert (request.runid, request.correlationid) == (relay_run, solo)
    relay = request.payload(RunRequested)
    assert (relay.agent, relay.parent_run_id) == ("planner", solo)
    await one(event_log, MESSAGE_RECEIVED, "req-joined")

    # the asker ends before the relay replies: the reply is asker_finished
    reply = AgentReplied.model_validate(
        {"request_id": "req-joined", "replier_run_id": relay_run, "replier_agent": "planner", "answer": "late"}
    )
    await publish(
        bus,
        started(relay_run, "planner", saga=solo, parent=solo, at=T0 + timedelta(minutes=2)),
        completed(late, saga=solo),
        _ev(reply, relay_run, solo, id=derive_id("evt", "agent.replied", "req-joined", relay_run)),
    )
    refused = (await one(event_log, REPLY_UNDELIVERABLE, "req-joined")).payload(AgentReplyUndeliverable)
    assert (refused.reason, refused.asker_run_id) == ("asker_finished", late)
    await event_log.caught_up()
    assert of(event_log, ANSWER_RECEIVED, "req-joined") == []


async def test_a_refusal_is_carried_to_the_asker(bus: Bus, event_log: EventLog, saga: None) -> None:
    await publish(bus, asked("req-no", "agent:reviewer"))
    await one(event_log, MESSAGE_RECEIVED, "req-no")
    await publish(bus, replied("req-no", outcome="refusal", answer="out of my scope: ask the release manager"))
    answer = (await one(event_log, ANSWER_RECEIVED, "req-no")).payload(AgentAnswerReceived)
    assert (answer.outcome, answer.answer) == ("refusal", "out of my scope: ask the release manager")
    record = await (await bus.store(BUCKET_COLLAB, AskRecord)).get(ask_key("req-no"))
    assert record is not None
    assert record.value.state is AgentAskState.REFUSED


async def test_redelivered_inputs_and_a_restart_produce_no_duplicate_output(
    bus: Bus, event_log: EventLog, start_collab: Collab
) -> None:
    stop = await start_collab()
    inputs = [
        started(LEAD, "planner"),
        started(REVIEWER, "reviewer", parent=LEAD),
        asked("req-d-live", "agent:reviewer"),
        asked("req-d-wait", "agent:reviewer", mode="wait", timeout_s=1),
        asked("req-d-ghost", "agent:ghost"),
    ]
    await publish(bus, *inputs)
    await one(event_log, MESSAGE_RECEIVED, "req-d-live")
    await publish(bus, replied("req-d-live"))
    await one(event_log, ANSWER_RECEIVED, "req-d-live")
    await stop()  # mid-way: the wait has not expired yet (or has: either way nothing doubles)

    finished = derive_id("run", "ask-finished")
    later = [
        started(finished, "archivist", parent=LEAD),
        completed(finished),
        asked("req-d-relay", "agent:archivist"),
        replied("req-d-live", n=0),  # the same reply event again
    ]
    await publish(bus, *later)
    # the same CloudEvents again under new message ids: JetStream cannot dedupe them, agent-collab must
    for n, event in enumerate([*inputs, *later]):
        await bus.publish_raw(event.nats_subject, encode(event), {"Nats-Msg-Id": f"again-{n}"})
    await start_collab()
    await one(event_log, AgentAskExpired.EVENT_TYPE, "req-d-wait")
    await one(event_log, MESSAGE_RECEIVED, "req-d-relay")
    for n, event in enumerate([*inputs, *later]):  # and once more, while it runs
        await bus.publish_raw(event.nats_subject, encode(event), {"Nats-Msg-Id": f"third-{n}"})
    await _settled(bus, "agent-collab-asks")
    await event_log.caught_up()
    produced = Counter((e.type, e.data.get("request_id"), e.runid) for e in event_log.events if e.type in OUTPUTS)
    assert produced == {
        (MESSAGE_RECEIVED, "req-d-live", REVIEWER): 1,
        (ANSWER_RECEIVED, "req-d-live", LEAD): 1,
        (MESSAGE_RECEIVED, "req-d-wait", REVIEWER): 1,
        (AgentAskExpired.EVENT_TYPE, "req-d-wait", LEAD): 1,
        (UNDELIVERABLE, "req-d-ghost", LEAD): 1,
        (MESSAGE_RECEIVED, "req-d-relay", f"{finished}/ask/01"): 1,
    }
    assert [e.runid for e in event_log.of_type(RunRequested.EVENT_TYPE)] == [f"{finished}/ask/01"]


async def _settled(bus: Bus, durable: str, within_s: float = WAIT_S) -> None:
    """The consumer has handled everything on its stream (nothing pending, nothing in flight)."""
    spec = CONSUMERS[durable]
    async with asyncio.timeout(within_s):
        while True:
            info = await bus.js.consumer_info(spec.stream, durable)
            if info.num_pending == 0 and info.num_ack_pending == 0:
                return
            await asyncio.sleep(0.05)


async def _no_schedule(bus: Bus, key: str, within_s: float = WAIT_S) -> None:
    """No ``agent-ask`` timer is armed under ``key`` (it fired, was cancelled, or never was)."""
    schedule = f"{TIMER_SCHEDULE_PREFIX}.{TIMER_NS_AGENT_ASK}.{key}"
    async with asyncio.timeout(within_s):
        while True:
            if not await armed_schedules(bus, schedule):
                return
            await asyncio.sleep(0.05)


async def test_an_ask_with_invalid_data_is_dead_lettered(bus: Bus, event_log: EventLog, saga: None) -> None:
    good = asked("req-poison", "agent:reviewer")
    bad = good.model_copy(update={"id": "evt-poison", "data": {**good.data, "timeout_s": 99999}})
    await bus.publish(bad)
    durable = CONSUMERS["agent-collab-asks"].durable
    dlq = await bus.js.pull_subscribe(f"temporality.dlq.{durable}", durable="t-dlq", stream=DLQ_STREAM.name)
    (msg,) = await dlq.fetch(1, timeout=WAIT_S)
    assert decode(msg.data).id == "evt-poison"
    await dlq.unsubscribe()
    # the asker is told (a `wait` asker would otherwise stay parked), under the request's one terminal id
    told = (await one(event_log, UNDELIVERABLE, "req-poison")).payload(AgentAskUndeliverable)
    assert (told.reason, told.asker_run_id, told.to) == ("routing_failed", LEAD, "agent:reviewer")
    assert "could not read the ask" in told.detail
    # and the router goes on
    await publish(bus, good)
    await one(event_log, MESSAGE_RECEIVED, "req-poison")


async def test_an_ask_given_up_after_its_deliveries_is_undeliverable_once(bus: Bus, event_log: EventLog) -> None:
    """The runner's dead-letter hook for a readable ask (every delivery spent, e.g. the saga projection stayed
    behind): the decision ``routing_failed`` is stored, so the asker is told once and a late reply is refused."""
    router = await AskRouter.open(bus)
    event = asked("req-given-up", "agent:reviewer", mode="wait", timeout_s=60)
    await bus.publish(event)
    sub = await bus.js.pull_subscribe(event.subject, durable="t-given-up", stream=EVENTS_STREAM.name)
    (msg,) = await sub.fetch(1, timeout=WAIT_S)
    delivery = Delivery(msg)
    for _ in range(2):  # the runner gives a message up again if the hook's publish failed: the same answer
        await router.on_dead_letter(event, delivery, TransientError("the saga projection stayed behind"))
    await sub.unsubscribe()
    told = (await one(event_log, UNDELIVERABLE, "req-given-up")).payload(AgentAskUndeliverable)
    assert (told.reason, told.asker_run_id) == ("routing_failed", LEAD)
    assert "the saga projection stayed behind" in told.detail
    record = await (await bus.store(BUCKET_COLLAB, AskRecord)).get(ask_key("req-given-up"))
    assert record is not None
    assert record.value.state is AgentAskState.UNDELIVERABLE
    await stays(lambda: len(of(event_log, UNDELIVERABLE, "req-given-up")) == 1, what="one undeliverable")
    # an event that is not an ask, or names no request, has nobody to tell: nothing published
    await router.on_dead_letter(replied("req-given-up"), delivery, TransientError("x"))
    unaddressed = event.model_copy(update={"id": "evt-unaddressed", "data": {"to": "agent:reviewer"}})
    await router.on_dead_letter(unaddressed, delivery, TransientError("x"))
    await stays(lambda: len(event_log.of_type(UNDELIVERABLE)) == 1, what="nothing more told")


async def test_routing_works_under_agent_collabs_own_nats_user(tmp_path: Path) -> None:
    """SEC-1: everything the router does (run.requested, timers armed and cancelled, consumer positions) is
    allowed by the permissions the catalogue derives for agent-collab; nothing needs a wider user."""
    server = NatsServer(
        tmp_path / "nats",
        users={
            "agent-collab": ("collab-password", permissions_for("agent-collab")),
            "admin": ("admin-password", None),
        },
    )
    server.start()
    try:
        admin = NatsSettings(url=server.url, user="admin", password=SecretStr("admin-password"), drain_timeout_s=2)
        own = NatsSettings(
            url=server.url, user="agent-collab", password=SecretStr("collab-password"), ack_wait_s=2, drain_timeout_s=2
        )
        async with Bus.connect(admin, name="test-admin") as bus:
            await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
            log = await EventLog(bus.nc).start()
            settings = Settings(nats=own)
            stop, ready = asyncio.Event(), asyncio.Event()
            task = asyncio.create_task(run_until(SPEC, settings, configure(settings), stop, ready=ready))
            try:
                await asyncio.wait_for(ready.wait(), 10)
                await publish(
                    bus,
                    started(LEAD, "planner"),
                    started(REVIEWER, "reviewer", parent=LEAD),
                    completed(REVIEWER),
                    asked("req-perm", "agent:reviewer", mode="wait", timeout_s=30),
                )
                (request,) = await log.wait_for(RunRequested.EVENT_TYPE, timeout_s=WAIT_S)
                await one(log, MESSAGE_RECEIVED, "req-perm")
                await publish(bus, replied("req-perm", by=request.runid or ""))
                await one(log, ANSWER_RECEIVED, "req-perm")  # after the timer was cancelled (a stream purge)
                await _no_schedule(bus, "req-perm")
            finally:
                stop.set()
                await asyncio.wait_for(task, 15)
                await log.stop()
    finally:
        server.stop()
