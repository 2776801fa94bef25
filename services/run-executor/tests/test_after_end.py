"""Inputs that reach a run after it ended (over a real nats-server): journaled, acked, never applied.

A person's answer to a cancelled run's request, an agent's message or answer for a completed run: each
becomes one ``run.input_after_end`` (the run's state, what came, its id as the causation, who sent it),
however often it is delivered; the run does not move, and nothing is dead-lettered.
"""

from __future__ import annotations

import json

from executor_support import PR_WITH_CONTRACT_CHANGE, RunExecutor, keep_v1, run_record, run_requested, settled

from temporality_bus import Bus
from temporality_protocol import (
    CONTENT_TYPE,
    AgentAnswerReceived,
    AgentMessageReceived,
    Envelope,
    HumanRequested,
    RunCancelRequested,
    RunInputAfterEnd,
    RunState,
    derive_id,
    encode,
    make_event,
)
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays


async def _twice(bus: Bus, event: Envelope) -> None:
    """Published, then the very same CloudEvent once more (as after a lost ack)."""
    await bus.publish(event)
    headers = {"Nats-Msg-Id": f"{event.id}#again", "Content-Type": CONTENT_TYPE, "Ce-Type": event.type}
    await bus.publish_raw(event.nats_subject, encode(event), headers)


async def _journaled_once(bus: Bus, event_log: EventLog, run_id: str, inputs: int) -> list[RunInputAfterEnd]:
    await event_log.wait_for("run.input_after_end", run_id=run_id, count=inputs)
    await settled(bus)
    await event_log.caught_up()

    def exactly() -> bool:
        return len(event_log.of_type("run.input_after_end", run_id)) == inputs

    await stays(exactly, settle_s=1.0, what=f"{inputs} run.input_after_end for {run_id}")
    assert not event_log.of_type("bus.dead_lettered")
    return [e.payload(RunInputAfterEnd) for e in event_log.of_type("run.input_after_end", run_id)]


async def test_an_answer_for_a_cancelled_run_is_journaled_not_applied(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    await executor()
    event = run_requested()
    run_id = event.runid
    assert run_id
    await bus.publish(event)
    (requested,) = await event_log.wait_for("human.requested", run_id=run_id)
    await run_record(bus, run_id, RunState.WAITING_FOR_HUMAN)
    cancel = RunCancelRequested(run_id=run_id, reason="wrong PR", requested_by="on-call")
    await bus.publish(make_event(cancel, source="/test", run_id=run_id))
    await run_record(bus, run_id, RunState.CANCELLED)
    request_id = requested.payload(HumanRequested).request_id
    answered = keep_v1(run_id, request_id, waited_s=5.0)
    answer = make_event(answered, source="/test", id=f"evt-ans-{run_id}", run_id=run_id)
    await _twice(bus, answer)
    (after,) = await _journaled_once(bus, event_log, run_id, 1)
    assert after == RunInputAfterEnd(
        run_id=run_id,
        state="cancelled",
        input_type="human.answered",
        input_id=answer.id,
        request_id=request_id,
        sender="user:alice",
        detail=f"run {run_id} is cancelled: the answer to {request_id} was not applied",
    )
    (journaled,) = event_log.of_type("run.input_after_end", run_id)
    assert journaled.causationid == answer.id
    assert (await run_record(bus, run_id, RunState.CANCELLED)).waiting_request_id is None
    assert not event_log.of_type("run.resumed", run_id)


async def test_agent_messages_for_a_completed_run_are_journaled_not_applied(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    await executor()
    pr = json.loads(json.dumps(PR_WITH_CONTRACT_CHANGE))
    pr["pull_request"]["title"], pr["pull_request"]["description"] = "Fix typo", "Spelling."
    event = run_requested(pr=pr)
    run_id = event.runid
    assert run_id
    await bus.publish(event)
    await event_log.wait_for("run.completed", run_id=run_id)
    done = await run_record(bus, run_id, RunState.COMPLETED)
    ask_id, answer_id = derive_id("req", "run-architect", "1"), derive_id("req", run_id, "ask_agent", "1", "0")
    message = AgentMessageReceived(
        request_id=ask_id,
        asker_run_id="run-architect",
        asker_agent="architect",
        to="agent:reviewer",
        resolved_run_id=run_id,
        resolved_agent="reviewer",
        recipient_run_id=run_id,
        mode="async",
        timeout_s=300,
        message="Is v1 still used?",
    )
    reply = AgentAnswerReceived(
        request_id=answer_id,
        asker_run_id=run_id,
        replier_run_id="run-architect",
        replier_agent="architect",
        outcome="answer",
        answer="Yes, by two clients.",
        mode="async",
        waited_s=12.0,
    )
    await _twice(bus, make_event(message, source="/test", id="evt-msg-1", run_id=run_id))
    await _twice(bus, make_event(reply, source="/test", id="evt-reply-1", run_id=run_id))
    journaled = await _journaled_once(bus, event_log, run_id, 2)
    by_type = {j.input_type: j for j in journaled}
    assert set(by_type) == {"agent.message.received", "agent.answer.received"}
    asked = by_type["agent.message.received"]
    assert (asked.state, asked.input_id, asked.request_id, asked.sender) == (
        "completed",
        "evt-msg-1",
        ask_id,
        "agent:architect",
    )
    answered = by_type["agent.answer.received"]
    assert (answered.input_id, answered.request_id) == ("evt-reply-1", answer_id)
    assert answered.detail == f"run {run_id} is completed: the answer to {answer_id} was not applied"
    after = await run_record(bus, run_id, RunState.COMPLETED)
    assert (after.result, after.updated_at) == (done.result, done.updated_at)  # not touched
