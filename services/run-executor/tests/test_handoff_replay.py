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
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from temporality_bus import Bus, Consumer, NatsSettings
from temporality_protocol import (
    AgentHandedOff,
    HumanPolicy,
    LaunchSource,
    RunCompleted,
    RunRequested,
    make_event,
)
from temporality_protocol.catalog import BUCKET_RUNS, CONSUMERS
from temporality_run_executor.agents import AgentCard, AgentDirectory, ProviderConfig
from temporality_run_executor.engine import Engine
from temporality_run_executor.machine import handoff_ids
from temporality_run_executor.providers.factory import ProviderCache
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


class ProcessKilled(Exception):
    """What the killed executor's handler ends with (its connection is already closed)."""


@dataclass
class Crash:
    """At the first time the driver passes ``point``, the process dies."""

    point: str
    bus: Bus | None = None
    crashed: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, point: str) -> None:
        if point != self.point or self.crashed.is_set():
            return
        self.crashed.set()
        assert self.bus is not None
        await self.bus.nc.close()  # kill -9: no ack, no nak, no lease release, no further publish
        raise ProcessKilled(point)


@dataclass
class Process:
    bus: Bus
    stack: contextlib.AsyncExitStack
    cache: ProviderCache
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def end(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.stack.aclose()
        await self.cache.aclose()


async def _start(settings: NatsSettings, name: str, crash: Crash | None = None) -> Process:
    stack = contextlib.AsyncExitStack()
    bus = await stack.enter_async_context(Bus.connect(settings, name=name))
    cache = ProviderCache()
    engine = await Engine.open(bus, AgentDirectory([LEAD, FINISHER]), cache, max_deliver=8)
    process = Process(bus, stack, cache)
    if crash is not None:
        crash.bus = bus
        engine.crash_point = crash
    consumers: list[Consumer] = []
    for durable, handler in (
        ("run-executor-requests", engine.on_run_requested),
        ("run-executor-human", engine.on_human_event),
        ("run-executor-agents", engine.on_agent_event),
    ):
        spec = dataclasses.replace(CONSUMERS[durable], max_deliver=8, backoff_s=(0.05, 0.1))
        consumers.append(Consumer(bus, spec, handler=handler, max_inflight=4, on_dead_letter=engine.on_dead_letter))
    watchdog = dataclasses.replace(CONSUMERS["run-executor-watchdog"], backoff_s=(0.05, 0.1))
    consumers.append(Consumer(bus, watchdog, raw_handler=engine.on_watchdog, max_inflight=4))
    process.tasks.extend(asyncio.create_task(c.run(process.stop)) for c in consumers)
    await asyncio.wait_for(asyncio.gather(*(c.running.wait() for c in consumers)), 30)
    return process


@pytest.fixture
async def processes() -> AsyncIterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        await process.end()


async def _idle(bus: Bus, timeout_s: float = 60) -> None:
    """Every executor consumer has settled everything stored so far (bounded wait)."""
    async with asyncio.timeout(timeout_s):
        for durable in ("run-executor-requests", "run-executor-human", "run-executor-agents"):
            while True:
                info = await bus.js.consumer_info("TEMPORALITY_EVENTS", durable)
                if info.num_pending == 0 and info.num_ack_pending == 0:
                    break
                await asyncio.sleep(0.05)


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
    _, child = handoff_ids(lead, "call-handoff")

    (ended,) = await event_log.wait_for("run.completed", run_id=lead, timeout_s=60)
    assert json.loads(ended.payload(RunCompleted).result) == {"status": "handed_off", "child_run_id": child}
    (finished,) = await event_log.wait_for("run.completed", run_id=child, timeout_s=60)
    assert finished.payload(RunCompleted).result == "did Write the verdict"
    assert finished.correlationid == "saga-r"
    await _idle(bus)

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
