"""The provider call of an external card (AP-5) never waits for the agent: :meth:`ExternalAgents.complete` offers the
turn and says what the task's record holds now, :meth:`ExternalAgents.look` reads the action of the turn a run is
parked on. On a real nats-server; the test plays agent-collab (it writes the task's record in KV ``agent-tasks``).
``emit`` records what the executor would publish (the engine's publishing is tested with the engine: see
``test_external_replay.py`` and ``tests/test_external_parking.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from executor_support import RunExecutor, run_record, run_requested, settled
from machine_support import make_run

from temporality_bus import Bus, Store
from temporality_protocol import (
    AgentTask,
    AgentTaskActed,
    AgentTaskOffered,
    LaunchSource,
    RunResumed,
    RunState,
    derive_id,
    make_event,
)
from temporality_protocol.agent_tasks import StoredAction, TaskRecord, task_id_for, task_key
from temporality_protocol.catalog import BUCKET_AGENT_TASKS, EVENTS_STREAM
from temporality_protocol.states import AgentTaskState
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.external import ExternalAgents, agent_elapsed_s
from temporality_run_executor.machine import (
    Agent,
    AgentWorking,
    CallProvider,
    LookForAction,
    ProviderFailed,
    ProviderReplied,
)
from temporality_run_executor.providers.base import ToolSpec, TurnContext
from temporality_run_executor.records import RunRecord
from temporality_run_executor.tools import BUILTIN_TOOLS, ToolPolicy, ToolRegistry
from temporality_testing.events import EventLog

AGENT_ID = "turn-bot"
CARD = AgentCard(
    id="ext",
    role="External",
    system_prompt="Decide with a person.",
    tools=ToolPolicy(allow=["ask_human"]),
    provider=ProviderConfig(kind="external", agent_id=AGENT_ID),
)
AGENT = Agent(CARD, ToolRegistry(BUILTIN_TOOLS), hosted=frozenset())
T0 = datetime(2026, 12, 1, tzinfo=UTC)
#: A call returns without waiting for the agent: far below any agent's thinking, far above a few KV round trips.
PROMPT_S = 10.0
WAIT_S = 30.0


def _run(run_id: str, **changes: Any) -> RunRecord:
    """A running run of the external agent's card, made at this module's :data:`T0`."""
    fields: dict[str, Any] = {
        "agent": CARD.id,
        "title": "Decide",
        "launch": LaunchSource(kind="webhook", trigger_id="t"),
        "created_at": T0,
        "updated_at": T0,
    }
    return make_run(run_id, **(fields | changes))


def _call(run_id: str, turn: int = 1) -> CallProvider:
    return CallProvider(
        turn=turn,
        messages=[],
        tools=[ToolSpec(name="ask_human", description="", parameters={})],
        budget_s=600.0,
        context=TurnContext(run_id=run_id, agent=CARD.id, title="Decide", turn=turn),
    )


def _record(run_id: str, **changes: Any) -> TaskRecord:
    """The task as agent-collab records the offer, taken: no action yet."""
    task = AgentTask(
        run_id=run_id,
        task_id=task_id_for(run_id),
        objective="Decide",
        context={},
        constraints={},
        acceptance_criteria=[],
        timeout_s=600,
        priority="normal",
    )
    fields: dict[str, Any] = {
        "agent_id": AGENT_ID,
        "task_id": task.task_id,
        "run_id": run_id,
        "correlation_id": run_id,
        "task": task,
        "state": AgentTaskState.WORKING,
        "take": 1,
        "session_id": "s1",
        "created_at": T0,
        "updated_at": T0,
    }
    return TaskRecord(**(fields | changes))


def _result(turn: int = 1, at: datetime = T0, take: int = 1) -> StoredAction:
    return StoredAction(turn=turn, action_id=f"a{turn}", kind="result", result="Decided", take=take, at=at)


class _Emitted:
    def __init__(self) -> None:
        self.events: list[tuple[Any, tuple[str, ...]]] = []
        #: Each event's causation, in the same order.
        self.causes: list[str | None] = []

    async def __call__(self, run: RunRecord, data: Any, *id_parts: str, causation: str | None = None) -> None:
        self.events.append((data, id_parts))
        self.causes.append(causation)

    def of(self, kind: type) -> list[Any]:
        return [data for data, _ in self.events if isinstance(data, kind)]


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    try:
        async with asyncio.timeout(WAIT_S):
            while not await check():  # noqa: ASYNC110 - polling the server's view
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out after {WAIT_S}s waiting for {what}") from None


async def _tasks(bus: Bus) -> Store[TaskRecord]:
    return await bus.store(BUCKET_AGENT_TASKS, TaskRecord)


async def test_a_turn_nobody_acted_on_is_offered_and_the_call_returns_at_once(bus: Bus) -> None:
    """No record yet (agent-collab has not seen the offer), then a record without an action: offered each time
    (the same id: the stream keeps one), and the call says the agent is working instead of waiting for it."""
    emitted = _Emitted()
    agents = ExternalAgents(bus, emitted)
    started = time.monotonic()
    assert await agents.complete(_run("run-turn-new"), AGENT, _call("run-turn-new")) == AgentWorking(1, AGENT_ID)
    await (await _tasks(bus)).create(task_key(AGENT_ID, task_id_for("run-turn-new")), _record("run-turn-new"))
    assert await agents.complete(_run("run-turn-new"), AGENT, _call("run-turn-new")) == AgentWorking(1, AGENT_ID)
    assert time.monotonic() - started < PROMPT_S
    offers = emitted.of(AgentTaskOffered)
    assert [o.turn for o in offers] == [1, 1]
    assert [parts for data, parts in emitted.events] == [("1",), ("1",)]  # one event id per (run, turn)


async def test_an_action_already_stored_is_the_reply_and_the_turn_is_not_offered(bus: Bus) -> None:
    """A replay (a crash after the agent acted): the stored action at once, no second offer; the turn's compute
    is the agent's working time from the turn's offer (as agent-collab recorded it) to its action."""
    emitted = _Emitted()
    offered_at = T0 - timedelta(seconds=30)
    stored = _record("run-turn-stored", offered_at=offered_at, actions=[_result(at=offered_at + timedelta(seconds=7))])
    await (await _tasks(bus)).create(task_key(AGENT_ID, task_id_for("run-turn-stored")), stored)
    outcome = await ExternalAgents(bus, emitted).complete(_run("run-turn-stored"), AGENT, _call("run-turn-stored"))
    assert isinstance(outcome, ProviderReplied)
    assert outcome.reply.content == "Decided"
    assert outcome.elapsed_s == 7.0
    assert emitted.events == []
    # a record from before offered_at: no start known, nothing counted (as before)
    old = _record("run-turn-stored-old", actions=[_result()])
    await (await _tasks(bus)).create(task_key(AGENT_ID, task_id_for("run-turn-stored-old")), old)
    replay = await ExternalAgents(bus, emitted).complete(
        _run("run-turn-stored-old"), AGENT, _call("run-turn-stored-old")
    )
    assert isinstance(replay, ProviderReplied)
    assert replay.elapsed_s == 0.0


async def test_a_task_that_ended_without_an_action_fails_the_turn(bus: Bus) -> None:
    await (await _tasks(bus)).create(
        task_key(AGENT_ID, task_id_for("run-turn-over")), _record("run-turn-over", state=AgentTaskState.CANCELLED)
    )
    outcome = await ExternalAgents(bus, _Emitted()).complete(_run("run-turn-over"), AGENT, _call("run-turn-over"))
    assert outcome == ProviderFailed(turn=1, error="the task ended (cancelled)", permanent=True)


async def test_the_look_reads_the_parked_turn_s_action_and_counts_the_agent_s_time(bus: Bus) -> None:
    """The turn's compute is the agent's working time, from the park to the action -- not the time the executor
    took to wake the run; a look before the action finds nothing."""
    run_id = "run-turn-look"
    tasks = await _tasks(bus)
    key = task_key(AGENT_ID, task_id_for(run_id))
    parked_at = datetime.now(UTC) - timedelta(seconds=40)
    run = _run(run_id, state=RunState.WAITING_FOR_AGENT, waiting_since=parked_at)
    agents = ExternalAgents(bus, _Emitted())
    assert (await agents.look(run, AGENT, LookForAction(1))).outcome is None
    await tasks.create(key, _record(run_id))
    assert (await agents.look(run, AGENT, LookForAction(1, deadline=True))).outcome is None
    await tasks.put(key, _record(run_id, actions=[_result(at=parked_at + timedelta(seconds=12))]))
    looked = await agents.look(run, AGENT, LookForAction(1))
    assert isinstance(looked.outcome, ProviderReplied)
    assert looked.outcome.elapsed_s == 12.0


def test_the_agent_s_time_is_never_negative_nor_in_the_future() -> None:
    action = _result(at=T0 + timedelta(seconds=5))
    assert agent_elapsed_s(action, T0, T0 + timedelta(seconds=60)) == 5.0
    assert agent_elapsed_s(action, T0, T0 + timedelta(seconds=2)) == 2.0  # an action "after now": now
    assert agent_elapsed_s(action, T0 + timedelta(seconds=9), T0 + timedelta(seconds=60)) == 0.0
    assert agent_elapsed_s(action, None, T0) == 0.0


async def test_an_agent_that_came_back_is_announced_as_the_run_resuming(bus: Bus) -> None:
    """AP-8: the action for turn 2 came under take 2 (the agent restarted with its checkpoint after acting on turn
    1): ``run.resumed`` (recovery) once per take, whether the offer or the wake-up reads it first."""
    run_id = "run-turn-takes"
    emitted = _Emitted()
    agents = ExternalAgents(bus, emitted)
    record = _record(run_id, take=2, session_id="s2", actions=[_result(turn=1), _result(turn=2, take=2)])
    await (await _tasks(bus)).create(task_key(AGENT_ID, task_id_for(run_id)), record)
    run = _run(run_id, state=RunState.WAITING_FOR_AGENT, waiting_since=T0)
    await agents.look(run, AGENT, LookForAction(2))
    await agents.complete(_run(run_id), AGENT, _call(run_id, turn=2))
    resumed = emitted.of(RunResumed)
    assert [(r.reason, r.from_turn) for r in resumed] == [("recovery", 1), ("recovery", 1)]
    assert {parts for data, parts in emitted.events if isinstance(data, RunResumed)} == {
        ("external", task_id_for(run_id), "2")
    }
    # whichever reads it, the take follows from the turn's offer (the same causation: one event)
    offered = derive_id("evt", run_id, AgentTaskOffered.EVENT_TYPE, "2")
    assert {c for (data, _), c in zip(emitted.events, emitted.causes, strict=True) if isinstance(data, RunResumed)} == {
        offered
    }


async def test_an_action_that_comes_before_the_park_is_committed_still_wakes_the_run(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    """A fast agent: its action (and ``agent.task.acted``) arrives while the parking driver is between arming the
    run's timer and committing the park. The wake-up finds the run running under that driver's live lease and waits
    for it; once the park is committed it wakes the run. Nothing is lost, nothing happens twice."""
    run_id = "run-turn-fast"
    reached, release = asyncio.Event(), asyncio.Event()

    async def between_arm_and_park(point: str) -> None:
        if point == "effect:ArmAgentDeadline" and not reached.is_set():
            reached.set()
            await asyncio.wait_for(release.wait(), WAIT_S)

    engine = await executor([CARD])
    engine.crash_point = between_arm_and_park  # the test seam: here it only holds the driver, it kills nothing
    await bus.publish(run_requested(run_id, agent=CARD.id))
    await asyncio.wait_for(reached.wait(), WAIT_S)

    # agent-collab: the action committed, then the fact
    await (await _tasks(bus)).create(task_key(AGENT_ID, task_id_for(run_id)), _record(run_id, actions=[_result()]))
    acted = AgentTaskActed(
        run_id=run_id, task_id=task_id_for(run_id), agent_id=AGENT_ID, turn=1, action_id="a1", kind="result"
    )
    await bus.publish(make_event(acted, source="/test", id=f"evt-acted-{run_id}", run_id=run_id))

    async def in_flight() -> bool:  # the wake-up is being handled while the park is held back
        info = await bus.js.consumer_info(EVENTS_STREAM.name, "run-executor-agents")
        return info.num_ack_pending >= 1 or info.ack_floor.stream_seq >= 1

    await _until(in_flight, "the action's event delivered")
    assert (await run_record(bus, run_id)).state is not RunState.WAITING_FOR_AGENT  # the park is held back
    release.set()
    (done,) = await event_log.wait_for("run.completed", run_id=run_id, timeout_s=WAIT_S)
    assert done.data["result"] == "Decided"
    await settled(bus, timeout_s=WAIT_S)
    assert len(event_log.of_type("run.completed", run_id=run_id)) == 1
    assert [e.data["turn"] for e in event_log.of_type("agent.task.offered", run_id=run_id)] == [1]
    assert not event_log.of_type("run.failed", run_id=run_id)
