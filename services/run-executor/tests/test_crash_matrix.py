"""Crash injection at every action boundary of a run (RUN-3, AP-7, AP-8), over a real nats-server.

Each case runs the E2E-1 Reviewer (turn 1 ``get_input``, turn 2 ``ask_human`` -> parked, the answer,
turn 3 the review) in an executor "process" of its own -- its own NATS connection, engine and consumers
-- and kills it at exactly one point of the driver (the engine's test seam ``crash_point``): the
connection is closed at once (nothing more is published, acked or released: the lease stays behind),
and the handler stops. A fresh executor on the same bus and store then takes over through redelivery,
and each case proves:

* one ``human.requested``, with the deterministic request id (run, turn 2, call 0): never asked twice;
* one terminal event (``run.completed``), no failure, nothing dead-lettered;
* no turn lost or applied twice: the checkpoint holds each turn once (two tool calls, each call's result
  once, the answer applied once), the totals say 3 turns and 2 tool calls, one ``run.tool_called`` (``get_input``);
* the lease recovers: where the dead driver held the run, its lease was still there after the crash,
  and the fresh executor drove the run to its end all the same (the lease gone when it finished).

The second matrix does the same around ``ask_agent`` in wait mode (``agent.asked``, ``waiting_for_agent``,
the routed ``agent.answer.received``). Bugs it found (fixed): a kill between a turn's checkpoint and its
``run.checkpointed`` lost that event; a kill after an agent's answer was applied left the run in
``resuming`` (the redelivered answer was taken for a duplicate). Since the end is committed before its terminal
event (``tests/test_terminal_race.py``), a kill between the two is a case of its own: the redelivered answer meets
the finished run and publishes ``run.completed`` from its record, disarms the watchdog the dead driver left armed
and marks the event published on the record -- and, like a kill after the end before the ack, journals no
``run.input_after_end`` for the answer it applied. Every case ends with the record marked and no watchdog armed,
and every event of the run caused by an earlier one of the run -- each copy of it (the dead driver's, the
recovery's) with the same causation (``causation_support.Wire``: a core subscription sees the copies JetStream
drops as duplicates).
"""

from __future__ import annotations

import asyncio

import pytest
from causation_support import Wire, assert_caused
from executor_processes import Crash, Process, start_process
from executor_support import REVIEWER, disarmed, keep_v1, run_record, run_requested, settled

from temporality_bus import Bus, NatsSettings
from temporality_protocol import (
    AgentAnswerReceived,
    AgentAsked,
    HumanRequested,
    RunCompleted,
    RunState,
    RunUsage,
    derive_id,
    make_event,
)
from temporality_protocol.catalog import BUCKET_CHECKPOINTS
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.machine import ask_request_id
from temporality_run_executor.providers.script import Script
from temporality_run_executor.records import Checkpoint
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays

#: Asks agent:architect and waits (``ask_agent`` mode ``wait``: the run parks in ``waiting_for_agent``), then
#: finishes with the answer.
ASKER = AgentCard(
    id="asker",
    role="Asker",
    system_prompt="You ask the architect.",
    tools=ToolPolicy(allow=["ask_agent"]),
    provider=ProviderConfig(
        kind="scripted",
        script=Script.model_validate(
            {
                "steps": [
                    {
                        "id": "ask",
                        "call": {
                            "tool": "ask_agent",
                            "args": {"to": "agent:architect", "message": "Is v1 still used?", "mode": "wait"},
                        },
                    },
                    {"id": "done", "answer": "architect: {{ results.ask.answer }}"},
                ]
            }
        ),
    ),
)


async def _start(settings: NatsSettings, name: str, crash: Crash | None = None) -> Process:
    return await start_process(settings, name, [REVIEWER, ASKER], crash)


# (the seam, its nth passing, the phase whose handler dies, whether the dead driver holds the lease)
BOUNDARIES = [
    # run.requested's handler: the start (its record created running and leased without a read first; after the
    # cancel marker's read, the first checkpoint sent with run.created, the watchdog and run.started, their acks
    # awaited before turn 1 is committed): until the checkpoint exists the redelivery starts it again
    pytest.param("effect:CreateRun", 1, "start", True, id="record-created-running-and-leased"),
    pytest.param("effect:AdoptCancelMarker", 1, "start", True, id="cancel-marker-read-not-started"),
    pytest.param("effect:CreateCheckpoint", 1, "start", True, id="first-checkpoint-written-run-started-unacked"),
    pytest.param("published:run.started", 1, "start", True, id="run-started-stored-before-turn1"),
    # turn 1 (get_input), turn 2 (ask_human), the park
    pytest.param("provider_replied", 1, "start", True, id="turn1-provider-answered-not-stored"),
    pytest.param("tool_returned", 1, "start", True, id="turn1-tool-ran-not-checkpointed"),
    pytest.param("effect:SaveCheckpoint", 1, "start", True, id="turn1-checkpoint-written-not-published"),
    pytest.param("published:run.checkpointed", 1, "start", True, id="turn1-checkpointed-published"),
    pytest.param("provider_replied", 2, "start", True, id="turn2-ask-answered-by-provider-not-stored"),
    pytest.param("effect:SaveCheckpoint", 2, "start", True, id="turn2-ask-checkpointed-not-published"),
    pytest.param("published:human.requested", 1, "start", True, id="human-requested-published-not-recorded"),
    pytest.param("effect:Transition:waiting_for_human", 1, "start", False, id="parked-not-acked"),
    pytest.param("handled:Requested", 1, "start", False, id="run-requested-done-not-acked"),
    # human.answered's handler: the resume, turn 3 (the review), the end
    pytest.param("published:run.resumed", 1, "answer", False, id="resumed-published-not-recorded"),
    # the answer goes into the checkpoint first, then resuming + lease + running in one compare-and-set (whose
    # seams all pass after it): a kill after the checkpoint leaves the run waiting, unleased
    pytest.param("effect:ApplyResult", 1, "answer", False, id="answer-applied-run-still-waiting"),
    pytest.param("effect:Transition:resuming", 1, "answer", True, id="resumed-and-running-before-turn3"),
    pytest.param("provider_replied", 1, "answer", True, id="turn3-final-answer-not-stored"),
    # the end: the record first (its lease dropped), then run.completed built from it -- a kill in between leaves
    # the event to the redelivered answer, which meets the finished run and publishes it from the record
    pytest.param("effect:Transition:completed", 1, "answer", False, id="completed-recorded-not-published"),
    pytest.param("published:run.completed", 1, "answer", False, id="completed-recorded-and-published-not-acked"),
    # then the record marks the event published: the redelivered answer publishes nothing again
    pytest.param("effect:MarkPublished", 1, "answer", False, id="completed-published-and-marked-not-acked"),
    pytest.param("handled:HumanOutcome", 1, "answer", False, id="answer-done-not-acked"),
]


@pytest.mark.parametrize(("point", "nth", "phase", "leased"), BOUNDARIES)
async def test_a_crash_at_each_boundary_loses_nothing_and_repeats_nothing(
    bus: Bus,
    event_log: EventLog,
    nats_settings: NatsSettings,
    processes: list[Process],
    point: str,
    nth: int,
    phase: str,
    leased: bool,
) -> None:
    wire = await Wire().start(bus.nc)
    crash = Crash(point, nth, armed=phase == "start")
    first = await _start(nats_settings, "executor-1", crash)
    processes.append(first)
    event = run_requested()
    run_id = event.runid
    assert run_id
    request_id = derive_id("hr", run_id, "2", "0")  # turn 2, call 0: the same on every replay
    await bus.publish(event)
    if phase == "answer":
        await run_record(bus, run_id, lambda r: r.state is RunState.WAITING_FOR_HUMAN)
        crash.armed = True
        await bus.publish(make_event(keep_v1(run_id, request_id, waited_s=2.0), source="/test", id=f"evt-ans-{run_id}"))
    await asyncio.wait_for(crash.crashed.wait(), 30)
    await first.end()

    at_crash = await run_record(bus, run_id, lambda r: True)
    if leased:  # the dead driver's lease is left behind: the next one must wait it out, then take over
        assert at_crash.lease is not None
        assert at_crash.lease.holder.startswith(first.engine.name)
    else:
        assert at_crash.lease is None

    second = await _start(nats_settings, "executor-2")
    processes.append(second)
    if phase == "start":
        await run_record(bus, run_id, lambda r: r.state is RunState.WAITING_FOR_HUMAN)
        await bus.publish(make_event(keep_v1(run_id, request_id, waited_s=2.0), source="/test", id=f"evt-ans-{run_id}"))
    (completed,) = await event_log.wait_for("run.completed", run_id=run_id, timeout_s=60)
    # finished, and its event marked published on the record (the end's last change; the recovery's too)
    done = await run_record(bus, run_id, lambda r: r.ending is not None and r.ending.published)
    assert done.state is RunState.COMPLETED
    # and its watchdog off: a recovery that republished the event disarmed it too (left armed, it fires after
    # the compute limit plus grace, past the events stream's duplicate window)
    await disarmed(bus, run_id)
    await settled(bus)
    await event_log.caught_up()

    def once(event_type: str) -> bool:
        return len([e for e in event_log.events if e.runid == run_id and e.type == event_type]) == 1

    def exactly_once() -> bool:
        terminal = [e for e in event_log.events if e.runid == run_id and e.type in ("run.failed", "run.cancelled")]
        return once("run.completed") and once("human.requested") and not terminal

    await stays(exactly_once, settle_s=1.0, what=f"one question and one ending for {run_id}")
    (asked,) = event_log.of_type("human.requested", run_id)
    assert asked.payload(HumanRequested).request_id == request_id
    assert not event_log.of_type("bus.dead_lettered")
    assert not event_log.of_type("run.input_after_end", run_id)  # a redelivered answer it applied is no late input

    # no turn lost or applied twice
    ckpt = await (await bus.store(BUCKET_CHECKPOINTS, Checkpoint)).get(run_id)
    assert ckpt is not None
    saved = ckpt.value
    assert (saved.turn, saved.tool_calls, saved.applied_requests, saved.pending) == (2, 2, [request_id], None)
    roles = [m.role for m in saved.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool"]
    results = [m.tool_call_id for m in saved.messages if m.role == "tool"]
    assert results == ["call-read", "call-ask"]
    # get_input's run.tool_called once (ask_human's call is the park: human.requested, checked above)
    assert [e.data["tool"] for e in event_log.of_type("run.tool_called", run_id)] == ["get_input"]
    assert sorted(e.data["turn"] for e in event_log.of_type("run.checkpointed", run_id)) == [1, 2]
    assert completed.payload(RunCompleted).usage == RunUsage(turns=3, tool_calls=2)
    assert "Keep the v1 contract" in completed.data["result"]
    # the lease: the fresh executor drove it to the end and let go
    assert done.lease is None
    assert done.usage == RunUsage(turns=3, tool_calls=2)
    # what each event says caused it: an earlier event of the run, and the same in every copy the crash and the
    # recovery published (a journal deduplicating by id keeps the first: a second causation would be lost there)
    await bus.nc.flush()
    assert not wire.same_causation()
    assert_caused(event_log.events, run_id)


# (the seam, its nth passing, the phase whose handler dies, whether the dead driver holds the lease)
AGENT_BOUNDARIES = [
    pytest.param("provider_replied", 1, "start", True, id="ask-agent-answered-by-provider-not-stored"),
    pytest.param("effect:SaveCheckpoint", 1, "start", True, id="ask-agent-checkpointed-not-published"),
    pytest.param("published:agent.asked", 1, "start", True, id="agent-asked-published-not-recorded"),
    pytest.param("effect:Transition:waiting_for_agent", 1, "start", False, id="parked-on-agent-not-acked"),
    pytest.param("published:run.resumed", 1, "answer", False, id="agent-resumed-published-not-recorded"),
    pytest.param("effect:Transition:resuming", 1, "answer", False, id="agent-resuming-recorded-not-applied"),
    pytest.param("effect:ApplyResult", 1, "answer", True, id="agent-answer-applied-not-running"),
    pytest.param("effect:Transition:running", 1, "answer", True, id="agent-running-again-before-turn2"),
    pytest.param("provider_replied", 1, "answer", True, id="after-agent-final-answer-not-stored"),
    pytest.param("effect:Transition:completed", 1, "answer", False, id="after-agent-completed-recorded-not-published"),
    pytest.param("published:run.completed", 1, "answer", False, id="after-agent-completed-published-not-acked"),
    pytest.param("effect:MarkPublished", 1, "answer", False, id="after-agent-completed-marked-not-acked"),
    pytest.param("handled:AgentNews", 1, "answer", False, id="agent-answer-done-not-acked"),
]


@pytest.mark.parametrize(("point", "nth", "phase", "leased"), AGENT_BOUNDARIES)
async def test_a_crash_around_a_waiting_ask_agent_asks_once_and_ends_once(
    bus: Bus,
    event_log: EventLog,
    nats_settings: NatsSettings,
    processes: list[Process],
    point: str,
    nth: int,
    phase: str,
    leased: bool,
) -> None:
    """The same for ``ask_agent`` in wait mode: one ``agent.asked`` (request id from run, turn 1, call 0),
    the answer (as agent-collab routes it) applied once, one ending."""
    wire = await Wire().start(bus.nc)
    crash = Crash(point, nth, armed=phase == "start")
    first = await _start(nats_settings, "executor-1", crash)
    processes.append(first)
    event = run_requested(agent="asker")
    run_id = event.runid
    assert run_id
    request_id = ask_request_id(run_id, 1, 0)
    answer = AgentAnswerReceived(
        request_id=request_id,
        asker_run_id=run_id,
        replier_run_id="run-architect",
        replier_agent="architect",
        outcome="answer",
        answer="yes, by two clients",
        mode="wait",
        waited_s=2.0,
    )
    answered = make_event(answer, source="/test", id=f"evt-agent-answer-{run_id}", run_id=run_id)
    await bus.publish(event)
    if phase == "answer":
        await run_record(bus, run_id, lambda r: r.state is RunState.WAITING_FOR_AGENT)
        crash.armed = True
        await bus.publish(answered)
    await asyncio.wait_for(crash.crashed.wait(), 30)
    await first.end()

    at_crash = await run_record(bus, run_id, lambda r: True)
    if leased:
        assert at_crash.lease is not None
        assert at_crash.lease.holder.startswith(first.engine.name)
    else:
        assert at_crash.lease is None

    second = await _start(nats_settings, "executor-2")
    processes.append(second)
    if phase == "start":
        await run_record(bus, run_id, lambda r: r.state is RunState.WAITING_FOR_AGENT)
        await bus.publish(answered)
    (completed,) = await event_log.wait_for("run.completed", run_id=run_id, timeout_s=60)
    done = await run_record(bus, run_id, lambda r: r.ending is not None and r.ending.published)
    assert done.state is RunState.COMPLETED
    await disarmed(bus, run_id)
    await settled(bus)
    await event_log.caught_up()

    def exactly_once() -> bool:
        mine = [e.type for e in event_log.events if e.runid == run_id]
        ended = [t for t in mine if t in ("run.completed", "run.failed", "run.cancelled")]
        return ended == ["run.completed"] and mine.count("agent.asked") == 1

    await stays(exactly_once, settle_s=1.0, what=f"one ask and one ending for {run_id}")
    (asked,) = event_log.of_type("agent.asked", run_id)
    assert asked.payload(AgentAsked).request_id == request_id
    assert not event_log.of_type("bus.dead_lettered")
    assert not event_log.of_type("run.input_after_end", run_id)
    ckpt = await (await bus.store(BUCKET_CHECKPOINTS, Checkpoint)).get(run_id)
    assert ckpt is not None
    saved = ckpt.value
    assert (saved.turn, saved.tool_calls, saved.applied_requests, saved.pending) == (1, 1, [request_id], None)
    assert [m.role for m in saved.messages] == ["system", "user", "assistant", "tool"]
    assert sorted(e.data["turn"] for e in event_log.of_type("run.checkpointed", run_id)) == [1]
    assert completed.data["result"] == "architect: yes, by two clients"
    assert completed.payload(RunCompleted).usage == RunUsage(turns=2, tool_calls=1)
    assert len(event_log.of_type("run.resumed", run_id)) >= 1
    assert done.lease is None
    await bus.nc.flush()
    assert not wire.same_causation()
    assert_caused(event_log.events, run_id)
