"""An external agent's ``handoff`` action (AP-6) survives a crash of the executor at each point of the handing
turn: the action is read from agent-collab's task record, and a replayed turn reads the same action and derives
the same call id -- one ``agent.handed_off``, one child run, one completion of the handing run.

The test plays agent-collab and the agent: the task's record in KV ``agent-tasks`` holds the handoff for turn 1
before the run starts (so the executor finds it at its offer and uses it at once). Each case kills an executor
"process" at one point of the driver (the engine's test seam); a fresh one takes over through redelivery.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from executor_processes import Crash, Process, start_process
from executor_support import settled

from temporality_bus import Bus, NatsSettings
from temporality_protocol import (
    AgentTask,
    HumanPolicy,
    LaunchSource,
    RunRequested,
    TaskHandoff,
    make_event,
)
from temporality_protocol.agent_tasks import StoredAction, TaskRecord, task_id_for, task_key
from temporality_protocol.catalog import BUCKET_AGENT_TASKS
from temporality_protocol.states import AgentTaskState
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.machine import handoff_ids
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog

AGENT = "handoff-task-bot"
T0 = datetime(2026, 12, 1, tzinfo=UTC)
HANDOFF: dict[str, Any] = {
    "agent": "finisher",
    "objective": "Write the verdict",
    "completed_steps": ["read the diff"],
    "acceptance_criteria": ["a verdict"],
}
EXTERNAL = AgentCard(
    id="ext",
    role="External",
    system_prompt="Hand it on.",
    tools=ToolPolicy(allow=["handoff_to_agent"]),
    provider=ProviderConfig(kind="external", agent_id=AGENT),
)
FINISHER = AgentCard(
    id="finisher",
    role="finisher",
    system_prompt="Finish it.",
    tools=ToolPolicy(allow=["get_input"]),
    provider=ProviderConfig(
        kind="scripted",
        script={
            "steps": [
                {"id": "input", "call": {"tool": "get_input", "args": {}}},
                {"id": "done", "answer": "did {{ results.input.handoff.objective }}"},
            ]
        },
    ),
)


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
    action = StoredAction(turn=1, action_id="a1", kind="handoff", handoff=TaskHandoff(**HANDOFF), at=T0)
    return TaskRecord(
        agent_id=AGENT,
        task_id=task.task_id,
        run_id=run_id,
        correlation_id="saga-ext-ho",
        task=task,
        state=AgentTaskState.ACTED,
        take=1,
        session_id="s1",
        actions=[action],
        created_at=T0,
        updated_at=T0,
    )


POINTS = [
    pytest.param("published:agent.handed_off", id="handed-off-published-not-checkpointed"),
    pytest.param("published:run.requested", id="child-requested-not-checkpointed"),
    pytest.param("published:run.completed", id="completed-not-recorded"),
]


@pytest.mark.parametrize("point", POINTS)
async def test_a_replayed_external_handoff_makes_one_child(
    point: str, bus: Bus, event_log: EventLog, nats_settings: NatsSettings, processes: list[Process]
) -> None:
    run_id = f"run-ext-ho-{point.replace(':', '-').replace('.', '-')}"
    tasks = await bus.store(BUCKET_AGENT_TASKS, TaskRecord)
    await tasks.create(task_key(AGENT, task_id_for(run_id)), _record(run_id))
    crash = Crash(point)
    processes.append(await start_process(nats_settings, "executor-1", [EXTERNAL, FINISHER], crash))
    data = RunRequested(
        run_id=run_id,
        agent="ext",
        title="Review PR 42",
        launch=LaunchSource(kind="webhook", trigger_id="t"),
        human=HumanPolicy(allowed_recipients=["user:alice"]),
    )
    await bus.publish(make_event(data, source="/test", id=f"evt-rr-{run_id}", run_id=run_id, correlation_id="saga-x"))
    await asyncio.wait_for(crash.crashed.wait(), 30)
    processes.append(await start_process(nats_settings, "executor-2", [EXTERNAL, FINISHER]))
    handoff_id, child = handoff_ids(run_id, "ext-1-0")

    (ended,) = await event_log.wait_for("run.completed", run_id=run_id, timeout_s=60)
    assert json.loads(ended.data["result"]) == {"status": "handed_off", "child_run_id": child}
    (finished,) = await event_log.wait_for("run.completed", run_id=child, timeout_s=60)
    assert finished.data["result"] == "did Write the verdict"
    assert finished.correlationid == "saga-x"
    await settled(bus, timeout_s=60)

    (handed,) = event_log.of_type("agent.handed_off")
    assert (handed.runid, handed.data["handoff_id"], handed.data["child_run_id"]) == (run_id, handoff_id, child)
    assert handed.data["document"]["completed_steps"] == ["read the diff"]
    children = [e for e in event_log.of_type("run.requested") if e.data.get("parent_run_id") == run_id]
    assert [e.runid for e in children] == [child]
    assert len(event_log.of_type("run.created", run_id=child)) == 1
    assert len(event_log.of_type("run.completed", run_id=run_id)) == 1
    assert len(event_log.of_type("run.completed", run_id=child)) == 1
    assert not event_log.of_type("agent.task.offered", run_id=run_id)  # the stored action was used at once
    assert not event_log.of_type("run.failed")
    assert not event_log.of_type("bus.dead_lettered")
