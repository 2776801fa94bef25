"""A handoff (AP-6) survives a crash at each point of its turn and never makes a second child.

Each case runs ``lead`` (turn 1: ``handoff_to_agent`` to ``finisher``) in an executor "process" of its own
-- its own NATS connection, engine and consumers -- and kills it at one point of the driver (the engine's
test seam ``crash_point``: the connection is closed at once, nothing more is published or acked). A fresh
executor on the same bus takes over through redelivery: the turn is replayed, the same call makes the same
handoff id and child run id, and the events it republishes carry the same ids. Each case proves one
``agent.handed_off``, one child ``run.requested`` and one child run (record and ``run.created``), the child
completing with the document, and the parent completing once, handed off.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from executor_processes import Crash, Process, start_process
from executor_support import settled

from temporality_bus import Bus, NatsSettings
from temporality_protocol import (
    AgentHandedOff,
    HumanPolicy,
    LaunchSource,
    RunCompleted,
    RunRequested,
    make_event,
)
from temporality_protocol.agent_tasks import external_call_id
from temporality_protocol.catalog import BUCKET_RUNS
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.machine import handoff_ids
from temporality_run_executor.records import RunRecord
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog

HANDOFF: dict[str, Any] = {
    "agent": "finisher",
    "objective": "Write the verdict",
    "completed_steps": ["read the diff"],
    "acceptance_criteria": ["a verdict"],
}


def _card(agent: str, steps: list[dict[str, Any]]) -> AgentCard:
    return AgentCard(
        id=agent,
        role=agent,
        system_prompt="You work together.",
        tools=ToolPolicy(allow=["*"]),
        provider=ProviderConfig(kind="scripted", script={"steps": steps}),
    )


LEAD = _card(
    "lead",
    [
        {"id": "handoff", "call": {"tool": "handoff_to_agent", "args": HANDOFF}},
        {"id": "done", "answer": "not reached: the run ends with its handoff"},
    ],
)
FINISHER = _card(
    "finisher",
    [
        {"id": "input", "call": {"tool": "get_input", "args": {}}},
        {"id": "done", "answer": "did {{ results.input.handoff.objective }}"},
    ],
)


async def _start(settings: NatsSettings, name: str, crash: Crash | None = None) -> Process:
    return await start_process(settings, name, [LEAD, FINISHER], crash)


POINTS = [
    pytest.param("provider_replied", id="handoff-chosen-not-published"),
    pytest.param("published:agent.handed_off", id="handed-off-published-not-checkpointed"),
    pytest.param("published:run.requested", id="child-requested-not-checkpointed"),
    pytest.param("effect:SaveCheckpoint", id="turn-committed-parent-not-completed"),
    pytest.param("published:run.completed", id="parent-completed-not-recorded"),
]


@pytest.mark.parametrize("point", POINTS)
async def test_a_replayed_handoff_makes_no_second_child(
    point: str, bus: Bus, event_log: EventLog, nats_settings: NatsSettings, processes: list[Process]
) -> None:
    crash = Crash(point)
    processes.append(await _start(nats_settings, "executor-1", crash))
    lead = "run-lead-replay"
    data = RunRequested(
        run_id=lead,
        agent="lead",
        title="Review PR 42",
        launch=LaunchSource(kind="webhook", trigger_id="t"),
        human=HumanPolicy(allowed_recipients=["user:alice"]),
    )
    await bus.publish(make_event(data, source="/test", id=f"evt-rr-{lead}", run_id=lead, correlation_id="saga-r"))
    await asyncio.wait_for(crash.crashed.wait(), 30)
    processes.append(await _start(nats_settings, "executor-2"))
    _, child = handoff_ids(lead, external_call_id(1, 0))  # turn 1, call 0

    (ended,) = await event_log.wait_for("run.completed", run_id=lead, timeout_s=60)
    assert json.loads(ended.payload(RunCompleted).result) == {"status": "handed_off", "child_run_id": child}
    (finished,) = await event_log.wait_for("run.completed", run_id=child, timeout_s=60)
    assert finished.payload(RunCompleted).result == "did Write the verdict"
    assert finished.correlationid == "saga-r"
    await settled(bus, timeout_s=60)

    assert len(event_log.of_type("agent.handed_off")) == 1
    assert event_log.of_type("agent.handed_off")[0].payload(AgentHandedOff).child_run_id == child
    children = [e for e in event_log.of_type("run.requested") if e.payload(RunRequested).parent_run_id == lead]
    assert [e.runid for e in children] == [child]
    assert len(event_log.of_type("run.created", run_id=child)) == 1
    assert len(event_log.of_type("run.completed", run_id=lead)) == 1
    assert len(event_log.of_type("run.completed", run_id=child)) == 1
    assert not event_log.of_type("run.failed")
    assert not event_log.of_type("bus.dead_lettered")
    runs = await bus.store(BUCKET_RUNS, RunRecord)
    records = [got.value for key in await runs.keys() if (got := await runs.get(key)) is not None]
    assert sorted(r.run_id for r in records) == sorted([lead, child])
    assert {r.run_id: r.parent_run_id for r in records}[child] == lead
