"""A run executed by an external agent (AP-5) survives a crash at each point of its turns: the agent's action
for a turn is read from agent-collab's task record, and a replayed turn reads the same action -- one question,
one completion (exactly once on the executor's side).

The test plays agent-collab and the agent: it writes the task's record in KV ``agent-tasks`` (the action for
turn 1 is there before the run starts; the result for turn 2 once the executor has offered turn 2 and parked
the run on it, then ``agent.task.acted``, which wakes the run) and plays the person (``human.answered``). Each case kills an executor "process" at one point of the driver (the
engine's test seam); a fresh one takes over through redelivery.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from executor_processes import Crash, Process, start_process
from executor_support import run_record, run_requested, settled

from temporality_bus import Bus, NatsSettings
from temporality_protocol import (
    AgentTask,
    AgentTaskActed,
    HumanAnswered,
    HumanRequested,
    OptionAnswer,
    RunCompleted,
    RunState,
    TaskToolCall,
    make_event,
)
from temporality_protocol.agent_tasks import StoredAction, TaskRecord, task_id_for, task_key
from temporality_protocol.catalog import BUCKET_AGENT_TASKS
from temporality_protocol.states import AgentTaskState
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog

AGENT = "task-bot"
CARD = AgentCard(
    id="ext",
    role="External",
    system_prompt="Decide with a person.",
    tools=ToolPolicy(allow=["ask_human"]),
    provider=ProviderConfig(kind="external", agent_id=AGENT),
)
T0 = datetime(2026, 12, 1, tzinfo=UTC)
ASK = TaskToolCall(name="ask_human", arguments={"recipient": "user:alice", "question": "Go ahead?"})


def _record(run_id: str) -> TaskRecord:
    task = AgentTask(
        run_id=run_id,
        task_id=task_id_for(run_id),
        objective="t",
        context={},
        constraints={},
        acceptance_criteria=[],
        timeout_s=60,
        priority="normal",
    )
    ask = StoredAction(turn=1, action_id="a1", kind="tool_calls", calls=[ASK], at=T0)
    return TaskRecord(
        agent_id=AGENT,
        task_id=task.task_id,
        run_id=run_id,
        correlation_id=run_id,
        task=task,
        state=AgentTaskState.ACTED,
        take=1,
        session_id="s1",
        actions=[ask],
        created_at=T0,
        updated_at=T0,
    )


POINTS = [
    pytest.param("provider_replied", id="action-read-not-committed"),
    pytest.param("published:human.requested", id="question-published-not-parked"),
    pytest.param("published:run.completed", id="completed-not-recorded"),
]


@pytest.mark.parametrize("point", POINTS)
async def test_a_replayed_external_turn_asks_once_and_completes_once(
    point: str, bus: Bus, event_log: EventLog, nats_settings: NatsSettings, processes: list[Process]
) -> None:
    run_id = f"run-ext-replay-{point.replace(':', '-').replace('.', '-')}"
    tasks = await bus.store(BUCKET_AGENT_TASKS, TaskRecord)
    key = task_key(AGENT, task_id_for(run_id))
    await tasks.create(key, _record(run_id))
    crash = Crash(point)
    processes.append(await start_process(nats_settings, "executor-1", [CARD], crash))
    await bus.publish(run_requested(run_id, agent="ext"))

    if point != "published:run.completed":  # a crash in turn 1: another executor takes over
        await asyncio.wait_for(crash.crashed.wait(), 30)
        processes.append(await start_process(nats_settings, "executor-2", [CARD]))
    (asked,) = await event_log.wait_for("human.requested", run_id=run_id, timeout_s=60)
    await run_record(bus, run_id, RunState.WAITING_FOR_HUMAN, timeout_s=60)  # parked: the turn committed
    request = asked.payload(HumanRequested)
    answered = HumanAnswered(
        request_id=request.request_id,
        run_id=run_id,
        recipient=request.recipient,
        responder=request.recipient,
        answer=OptionAnswer(option_id="yes"),
        channel="web",
        waited_s=0.1,
    )
    await bus.publish(make_event(answered, source="/test", id=f"evt-ha-{run_id}", run_id=run_id))

    # the executor offers turn 2 with the answer; "the agent" sends its result
    (offered,) = await event_log.wait_for(
        "agent.task.offered", run_id=run_id, where=lambda e: e.data["turn"] == 2, timeout_s=60
    )
    assert [i["tool"] for i in offered.data["inputs"]] == ["ask_human"]
    result = StoredAction(turn=2, action_id="a2", kind="result", result="Decided", at=T0)
    await tasks.modify(key, lambda cur: cur.model_copy(update={"turn": 2, "actions": [*cur.actions, result]}))
    # record first, then the fact (as agent-collab does): it wakes the run parked on turn 2
    acted = AgentTaskActed(
        run_id=run_id, task_id=task_id_for(run_id), agent_id=AGENT, turn=2, action_id="a2", kind="result"
    )
    await bus.publish(make_event(acted, source="/test", id=f"evt-acted-{run_id}", run_id=run_id))
    if point == "published:run.completed":
        await asyncio.wait_for(crash.crashed.wait(), 30)
        processes.append(await start_process(nats_settings, "executor-2", [CARD]))
    (done,) = await event_log.wait_for("run.completed", run_id=run_id, timeout_s=60)
    assert done.payload(RunCompleted).result == "Decided"
    await settled(bus, timeout_s=60)
    assert len(event_log.of_type("human.requested", run_id=run_id)) == 1
    assert len(event_log.of_type("run.completed", run_id=run_id)) == 1
    assert not event_log.of_type("run.failed", run_id=run_id)
    # turn 1's action was already stored: it was never offered; turn 2 once (a replay republishes its id)
    assert [e.data["turn"] for e in event_log.of_type("agent.task.offered", run_id=run_id)] == [2]
