"""The run-executor's side of agent collaboration over a real nats-server, with scripted agents: the
``agent.*`` events are published and read on the bus directly, as agent-collab would (COL-2..COL-5),
and the per-run lease with two engines over one bus (issue 6)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from executor_support import REVIEWER, HeldProvider, RunExecutor, run_record, run_requested

from temporality_bus import Bus, Delivery
from temporality_protocol import (
    AgentAnswerReceived,
    AgentAsked,
    AgentMessageReceived,
    AgentReplied,
    Envelope,
    EventData,
    HumanAnswered,
    HumanRequested,
    OptionAnswer,
    RunState,
    make_event,
)
from temporality_protocol.catalog import BUCKET_CHECKPOINTS, BUCKET_RUNS
from temporality_run_executor.agents import AgentCard, AgentDirectory, ProviderConfig
from temporality_run_executor.engine import Engine
from temporality_run_executor.machine import LeaseHeld
from temporality_run_executor.providers import AssistantTurn, Provider, ToolSpec, TurnContext
from temporality_run_executor.providers.script import Script
from temporality_run_executor.records import Checkpoint, Lease, Message, RunRecord, ToolCall
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog


def _card(agent_id: str, steps: list[dict[str, Any]]) -> AgentCard:
    script = Script.model_validate({"steps": steps})
    return AgentCard(
        id=agent_id,
        role=agent_id,
        system_prompt="You collaborate.",
        tools=ToolPolicy(allow=["*"]),
        provider=ProviderConfig(kind="scripted", script=script),
    )


#: Asks agent:helper and waits; then says what came back and which messages it was shown.
WAITER = _card(
    "waiter",
    [
        {
            "id": "ask",
            "call": {"tool": "ask_agent", "args": {"to": "agent:helper", "message": "Keep v1?", "mode": "wait"}},
        },
        {
            "id": "done",
            "answer": "{{ results.ask.status }}: {{ results.ask.answer }} | mail: {{ join(',', run.mail[].kind) }}",
        },
    ],
)
#: Waits for a person, then answers the first request it received -- twice (the second is refused).
HELPER = _card(
    "helper",
    [
        {"id": "hold", "call": {"tool": "ask_human", "args": {"recipient": "user:alice", "question": "Go on?"}}},
        {
            "id": "reply",
            "when": "length(run.asks) > `0`",
            "call": {"tool": "answer_agent", "args": {"request_id": "{{ run.asks[0] }}", "answer": "Yes, keep v1."}},
        },
        {
            "id": "again",
            "when": "results.reply != null",
            "call": {"tool": "answer_agent", "args": {"request_id": "{{ results.reply.request_id }}", "answer": "No."}},
        },
        {"id": "done", "answer": "reply={{ results.reply.status }} again={{ results.again.error }}"},
    ],
)


def _event(data: EventData, run_id: str, event_id: str) -> Envelope:
    return make_event(data, source="/test/agent-collab", id=event_id, run_id=run_id)


def _message(recipient: str, request_id: str, mode: str = "wait") -> AgentMessageReceived:
    return AgentMessageReceived(
        request_id=request_id,
        asker_run_id="run-asker",
        asker_agent="waiter",
        to="agent:helper",
        resolved_run_id=recipient,
        resolved_agent="helper",
        recipient_run_id=recipient,
        mode=mode,
        timeout_s=300,
        message="Keep v1?",
    )


async def _checkpoint(bus: Bus, run_id: str) -> Checkpoint:
    got = await (await bus.store(BUCKET_CHECKPOINTS, Checkpoint)).get(run_id)
    assert got is not None
    return got.value


async def _until(what: str, check: Any, timeout_s: float = 10.0) -> None:
    """Wait (bounded) until the async ``check`` holds."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                if await check():
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not {what} within {timeout_s}s") from None


async def test_a_wait_ask_parks_the_run_keeps_other_messages_and_resumes_with_the_answer(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    await executor(cards=[WAITER])
    event = run_requested(agent="waiter")
    run_id = event.runid
    assert run_id
    await bus.publish(event)
    (asked_event,) = await event_log.wait_for("agent.asked", run_id=run_id)
    asked = asked_event.payload(AgentAsked)
    assert (asked.mode, asked.to, asked.asker_run_id) == ("wait", "agent:helper", run_id)
    assert asked.request_id.startswith("req-")
    await run_record(bus, run_id, RunState.WAITING_FOR_AGENT, timeout_s=10.0)
    # a question for it while it waits for something else: queued, never dropped, the run stays parked
    await bus.publish(_event(_message(run_id, "req-other"), run_id, "evt-msg-other"))

    async def queued() -> bool:
        return [m.request_id for m in (await _checkpoint(bus, run_id)).inbox] == ["req-other"]

    await _until("queued", queued)
    record = await (await bus.store(BUCKET_RUNS, RunRecord)).get(run_id)
    assert record is not None
    assert record.value.state is RunState.WAITING_FOR_AGENT
    assert record.value.lease is None  # nobody drives a parked run
    answer = AgentAnswerReceived(
        request_id=asked.request_id,
        asker_run_id=run_id,
        replier_run_id="run-helper",
        replier_agent="helper",
        outcome="answer",
        answer="Yes, keep v1.",
        mode="wait",
        waited_s=1.0,
    )
    for _ in range(2):  # redelivered: applied once
        await bus.publish(_event(answer, run_id, "evt-answer-1"))
    (done,) = await event_log.wait_for("run.completed", run_id=run_id)
    assert done.data["result"] == "answered: Yes, keep v1. | mail: ask"
    await event_log.caught_up()
    assert len(event_log.of_type("run.resumed", run_id)) == 1
    assert len(event_log.of_type("agent.asked", run_id)) == 1
    ckpt = await _checkpoint(bus, run_id)
    framed = [m.content or "" for m in ckpt.messages if m.role == "user"][-1]
    assert framed.startswith("[agent message] type: ask | request_id: req-other | from: agent:waiter (run run-asker)")


async def test_an_ask_waits_for_the_next_boundary_and_is_answered_once(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    await executor(cards=[HELPER])
    event = run_requested(agent="helper")
    run_id = event.runid
    assert run_id
    await bus.publish(event)
    (requested,) = await event_log.wait_for("human.requested", run_id=run_id)
    await run_record(bus, run_id, RunState.WAITING_FOR_HUMAN, timeout_s=10.0)
    # parked on a person: the ask is kept until the run resumes (a second copy, another event id, is the same ask)
    await bus.publish(_event(_message(run_id, "req-ask-1"), run_id, "evt-msg-1"))
    await bus.publish(_event(_message(run_id, "req-ask-1"), run_id, "evt-msg-1-copy"))

    async def queued() -> bool:
        return len((await _checkpoint(bus, run_id)).inbox) == 1

    await _until("queued", queued)
    human = requested.payload(HumanRequested)
    answered = HumanAnswered(
        request_id=human.request_id,
        run_id=run_id,
        recipient=human.recipient,
        responder=human.recipient,
        answer=OptionAnswer(option_id="go"),
        channel="web",
        waited_s=1.0,
    )
    await bus.publish(_event(answered, run_id, "evt-human-1"))
    (done,) = await event_log.wait_for("run.completed", run_id=run_id)
    assert done.data["result"] == "reply=sent again=request req-ask-1 is already answered: a request is answered once"
    await event_log.caught_up()
    (replied,) = event_log.of_type("agent.replied", run_id)
    reply = replied.payload(AgentReplied)
    assert (reply.request_id, reply.outcome, reply.answer, reply.replier_agent) == (
        "req-ask-1",
        "answer",
        "Yes, keep v1.",
        "helper",
    )
    ckpt = await _checkpoint(bus, run_id)
    assert [(r.request_id, r.answered) for r in ckpt.received] == [("req-ask-1", True)]


# --------------------------------------------------------------------------- the lease (issue 6)
class _Gate(HeldProvider):
    """Holds its first turn until released; counts its calls."""

    async def answer(
        self, messages: list[Message], tools: list[ToolSpec], *, budget_s: float | None, context: TurnContext | None
    ) -> AssistantTurn:
        return AssistantTurn(content="done")


class _Redelivery(Delivery):
    """The same ``run.requested`` delivered again (as after a NATS failover that lost its ack)."""

    def __init__(self) -> None:
        self.num_delivered = 2
        self.stream_seq = 1


async def test_a_redelivery_while_the_first_driver_is_mid_turn_does_not_drive_the_run(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    first, second = _Gate(), _Gate()
    second.release.set()
    await executor(provider_for=lambda card: first, lease_s=1.0)  # a turn longer than its lease
    # a second replica (no consumers of its own: the redelivery is handed to it directly)
    other = await Engine.open(bus, AgentDirectory([REVIEWER]), lambda card: second, max_deliver=8)
    event = run_requested()
    run_id = event.runid
    assert run_id
    await bus.publish(event)
    try:
        await asyncio.wait_for(first.entered.wait(), 10)
        runs = await bus.store(BUCKET_RUNS, RunRecord)
        record = await runs.get(run_id)
        assert record is not None
        assert record.value.lease is not None
        taken = record.value.lease.expires_at

        async def kept_fresh() -> bool:  # the lease it took has run out, and it was renewed meanwhile
            got = await runs.get(run_id)
            lease = got.value.lease if got is not None else None
            return datetime.now(UTC) > taken and lease is not None and lease.expires_at > datetime.now(UTC)

        await _until("renewed mid-turn", kept_fresh)
        with pytest.raises(LeaseHeld):  # retried later, counted as a lost race (never fails the run)
            await other.on_run_requested(event, _Redelivery())
        assert second.calls == 0
    finally:
        first.release.set()  # never left hanging, whatever failed
    await run_record(bus, run_id, RunState.COMPLETED, timeout_s=10.0)
    await other.on_run_requested(event, _Redelivery())  # finished: a duplicate, acked
    assert second.calls == 0
    done = await (await bus.store(BUCKET_RUNS, RunRecord)).get(run_id)
    assert done is not None
    assert done.value.lease is None


async def test_a_lease_nobody_renews_is_taken_over_as_recovery(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    gate = _Gate()
    gate.release.set()
    await executor(cards=[])  # the consumers (nothing for them to do here)
    engine = await Engine.open(bus, AgentDirectory([REVIEWER]), lambda card: gate, max_deliver=8)
    event = run_requested()
    run_id = event.runid
    assert run_id
    runs = await bus.store(BUCKET_RUNS, RunRecord)
    now = datetime.now(UTC)
    # a driver died mid-turn 1: its lease runs out in a moment, and nobody renews it
    record = RunRecord(
        run_id=run_id,
        state=RunState.RUNNING,
        agent="reviewer",
        title="t",
        launch=event.payload().launch,  # type: ignore[attr-defined]
        correlation_id=run_id,
        created_at=now,
        updated_at=now,
        collab=True,
        lease=Lease(holder="dead/driver", expires_at=now + timedelta(seconds=0.8)),
    )
    await runs.put(run_id, record)
    ckpt = Checkpoint(checkpoint_id="ckpt-0", run_id=run_id, turn=0, saved_at=now, messages=[])
    await (await bus.store(BUCKET_CHECKPOINTS, Checkpoint)).put(run_id, ckpt)
    await engine.on_run_requested(event, _Redelivery())  # waits it out, then recovers: no delivery spent
    (resumed,) = await event_log.wait_for("run.resumed", run_id=run_id)
    assert resumed.data["reason"] == "recovery"
    await event_log.wait_for("run.completed", run_id=run_id)
    assert gate.calls == 1


class _SlowFirstTurn(Provider):
    """Turn 1 (held until released) reads the input; turn 2 reports the agent messages it was shown."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(
        self,
        messages: list[Message],
        tools: list[ToolSpec],
        *,
        budget_s: float | None = None,
        context: TurnContext | None = None,
    ) -> AssistantTurn:
        if not any(m.role == "assistant" for m in messages):
            self.entered.set()
            await self.release.wait()
            return AssistantTurn(tool_calls=[ToolCall(id="c1", name="get_input")])
        framed = [m.content or "" for m in messages if m.role == "user" and "[agent message]" in (m.content or "")]
        return AssistantTurn(content=f"{len(framed)} message(s); last: {messages[-1].role}")


async def test_a_message_arriving_mid_turn_waits_for_the_boundary_and_is_kept_by_the_commit(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    provider = _SlowFirstTurn()
    await executor(provider_for=lambda card: provider)
    event = run_requested()
    run_id = event.runid
    assert run_id
    await bus.publish(event)
    await asyncio.wait_for(provider.entered.wait(), 10)
    await bus.publish(_event(_message(run_id, "req-mid"), run_id, "evt-msg-mid"))

    async def queued() -> bool:
        return len((await _checkpoint(bus, run_id)).inbox) == 1

    await _until("queued mid-turn", queued)
    provider.release.set()  # the turn commits against a checkpoint the message changed: merged, not lost
    (done,) = await event_log.wait_for("run.completed", run_id=run_id)
    assert done.data["result"] == "1 message(s); last: user"
    await event_log.caught_up()
    assert not event_log.of_type("run.resumed", run_id)  # no recovery: the turn was never replayed
