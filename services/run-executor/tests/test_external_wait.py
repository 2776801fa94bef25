"""The wait for an external agent's action (AP-5) is pushed, not polled: a KV watch of the task's key wakes
the turn when the record changes; the record is read again now and then all the same (``reread_s``), and at
once when the watch ended or the connection came back, so an update the watch missed can only delay a run.

The tests call :meth:`ExternalAgents.complete` itself on a real nats-server and play agent-collab and the
agent: they write the task's record in KV ``agent-tasks`` once the turn is offered. ``emit`` records what
the executor would publish (the engine's publishing is tested with the engine, see test_external_replay).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import structlog.testing
from nats.js.kv import KeyValue

from temporality_bus import Bus, Store
from temporality_embedded.natsserver import NatsServer
from temporality_protocol import AgentTask, AgentTaskOffered, HumanPolicy, LaunchSource, RunState
from temporality_protocol.agent_tasks import StoredAction, TaskRecord, task_id_for, task_key
from temporality_protocol.catalog import BUCKET_AGENT_TASKS, BUCKET_RUNS
from temporality_protocol.states import AgentTaskState
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.external import ExternalAgents
from temporality_run_executor.machine import Agent, CallProvider, ProviderFailed, ProviderReplied
from temporality_run_executor.providers.base import ToolSpec, TurnContext
from temporality_run_executor.records import CancelRequest, RunRecord
from temporality_run_executor.tools import BUILTIN_TOOLS, ToolPolicy, ToolRegistry
from temporality_testing.waiting import stays

AGENT_ID = "wait-bot"
CARD = AgentCard(
    id="ext",
    role="External",
    system_prompt="Decide with a person.",
    tools=ToolPolicy(allow=["ask_human"]),
    provider=ProviderConfig(kind="external", agent_id=AGENT_ID),
)
T0 = datetime(2026, 12, 1, tzinfo=UTC)
#: Far longer than any test waits: an action that reaches the run did not come by the safety re-read.
NEVER_S = 3600.0
WAIT_S = 30.0


def _run(run_id: str) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        state=RunState.RUNNING,
        agent=CARD.id,
        title="Decide",
        launch=LaunchSource(kind="webhook", trigger_id="t"),
        human=HumanPolicy(allowed_recipients=["user:alice"]),
        correlation_id=run_id,
        created_at=T0,
        updated_at=T0,
    )


def _call(run_id: str) -> CallProvider:
    return CallProvider(
        turn=1,
        messages=[],
        tools=[ToolSpec(name="ask_human", description="", parameters={})],
        budget_s=600.0,
        context=TurnContext(run_id=run_id, agent=CARD.id, title="Decide", turn=1),
    )


def _record(run_id: str) -> TaskRecord:
    """The task as agent-collab records the offer: no action yet."""
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
    return TaskRecord(
        agent_id=AGENT_ID,
        task_id=task.task_id,
        run_id=run_id,
        correlation_id=run_id,
        task=task,
        state=AgentTaskState.WORKING,
        take=1,
        session_id="s1",
        created_at=T0,
        updated_at=T0,
    )


def _acted(record: TaskRecord) -> TaskRecord:
    result = StoredAction(turn=1, action_id="a1", kind="result", result="Decided", at=T0)
    return record.model_copy(update={"state": AgentTaskState.COMPLETED, "actions": [*record.actions, result]})


async def _until(check: Callable[[], Awaitable[bool] | bool], what: str, timeout_s: float = WAIT_S) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                held = check()
                if inspect.isawaitable(held):
                    held = await held
                if held:
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what}") from None


class _Turn:
    """One turn of a run waiting in :meth:`ExternalAgents.complete`, and what it emitted."""

    def __init__(self, bus: Bus, run_id: str, *, reread_s: float) -> None:
        self.run_id = run_id
        self.key = task_key(AGENT_ID, task_id_for(run_id))
        self.emitted: list[Any] = []
        self.agents = ExternalAgents(bus, self._emit, reread_s=reread_s)
        agent = Agent(CARD, ToolRegistry(BUILTIN_TOOLS), hosted=frozenset())
        self.task = asyncio.create_task(self.agents.complete(_run(run_id), agent, _call(run_id)))

    async def _emit(self, run: RunRecord, data: Any, *id_parts: str) -> None:
        self.emitted.append(data)

    def offered(self) -> bool:
        return any(isinstance(e, AgentTaskOffered) for e in self.emitted)

    def watched(self) -> KeyValue.KeyWatcher | None:
        return self.agents.watchers.get(self.key)

    async def outcome(self, what: str) -> ProviderReplied | ProviderFailed:
        try:
            return await asyncio.wait_for(asyncio.shield(self.task), WAIT_S)
        except TimeoutError:
            raise AssertionError(f"the turn did not end: {what}") from None

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def _tasks(bus: Bus) -> Store[TaskRecord]:
    return await bus.store(BUCKET_AGENT_TASKS, TaskRecord)


def _decided(outcome: ProviderReplied | ProviderFailed) -> str | None:
    assert isinstance(outcome, ProviderReplied), outcome
    return outcome.reply.content


async def test_the_agent_s_action_wakes_the_waiting_turn(bus: Bus) -> None:
    """No re-read in the test's time: the record's creation (no action) and then the action reach the turn
    through the watch alone, and the turn is over once the watch's last consumer is gone."""
    tasks = await _tasks(bus)
    turn = _Turn(bus, "run-wait-push", reread_s=NEVER_S)
    try:
        await _until(turn.offered, "the turn offered")
        await _until(lambda: turn.watched() is not None, "the turn watching its task")
        await tasks.create(turn.key, _record(turn.run_id))  # agent-collab records the offer: nothing to do yet
        await stays(
            lambda: not turn.task.done(), settle_s=0.5, what="a record without an action leaving the turn waiting"
        )
        await tasks.modify(turn.key, _acted)
        assert _decided(await turn.outcome("the action written")) == "Decided"
        assert turn.agents.watchers == {}  # the watch stopped with the turn
    finally:
        await turn.stop()


async def test_a_turn_whose_watch_ended_reads_and_watches_again(bus: Bus) -> None:
    """The watch is stopped under the waiting turn (as nats-py ends one): the turn reads the record and watches
    again at once, and the action written afterwards reaches it (no periodic re-read in the test's time)."""
    tasks = await _tasks(bus)
    await tasks.create(task_key(AGENT_ID, task_id_for("run-wait-ended")), _record("run-wait-ended"))
    turn = _Turn(bus, "run-wait-ended", reread_s=NEVER_S)
    try:
        await _until(lambda: turn.watched() is not None, "the turn watching its task")
        first = turn.watched()
        assert first is not None
        await first.stop()  # type: ignore[no-untyped-call]
        await _until(lambda: turn.watched() not in (None, first), "a new watch")
        await tasks.modify(turn.key, _acted)
        assert _decided(await turn.outcome("the action written after the first watch ended")) == "Decided"
    finally:
        await turn.stop()


async def test_a_silently_dead_watch_is_covered_by_the_safety_re_read(bus: Bus) -> None:
    """The watch's consumer is deleted on the server: the watch delivers nothing more (nats-py notices only
    after many seconds, if at all). The action written then reaches the turn through the re-read."""
    tasks = await _tasks(bus)
    await tasks.create(task_key(AGENT_ID, task_id_for("run-wait-dead")), _record("run-wait-dead"))
    stream = f"KV_{BUCKET_AGENT_TASKS.name}"
    with structlog.testing.capture_logs() as logs:
        turn = _Turn(bus, "run-wait-dead", reread_s=0.5)
        try:
            await _until(lambda: turn.watched() is not None, "the turn watching its task")

            async def consumer_created() -> bool:
                return bool(await bus.js.consumers_info(stream))

            await _until(consumer_created, "the watch's consumer on the server")
            await _until(lambda: any(e["event"] == "external.record_changed" for e in logs), "the watch delivering")
            for info in await bus.js.consumers_info(stream):
                await bus.js.delete_consumer(stream, info.name)
            logs.clear()  # from here on: what ends the wait
            await tasks.modify(turn.key, _acted)
            assert _decided(await turn.outcome("the action written under a dead watch")) == "Decided"
        finally:
            await turn.stop()
    seen = [entry["event"] for entry in logs]
    # the action was read, not pushed: the dead watch delivered nothing
    assert "external.record_read" in seen, seen
    assert "external.record_changed" not in seen, seen


async def test_a_turn_survives_a_restart_of_the_server_and_sees_the_action_after_it(
    bus: Bus, nats_server: NatsServer
) -> None:
    """The server restarts (same port, same store) while the turn waits: the turn does not fail, it watches
    again once the connection is back, and the action written after the restart reaches it."""
    tasks = await _tasks(bus)
    await tasks.create(task_key(AGENT_ID, task_id_for("run-wait-restart")), _record("run-wait-restart"))
    turn = _Turn(bus, "run-wait-restart", reread_s=NEVER_S)
    try:
        await _until(lambda: turn.watched() is not None, "the turn watching its task")
        first = turn.watched()
        nats_server.requested_port = nats_server.port  # come back on the same port
        await asyncio.to_thread(nats_server.stop)
        await _until(lambda: not bus.nc.is_connected, "the bus gone")
        await asyncio.to_thread(nats_server.start)
        await _until(lambda: bus.nc.is_connected, "the bus back")
        await _until(lambda: turn.watched() not in (None, first), "the turn watching again after the reconnect")
        assert not turn.task.done()  # the outage did not end the turn

        async def acted() -> bool:
            try:
                await tasks.modify(turn.key, _acted)
            except Exception:  # JetStream still settling after the restart: try again
                return False
            return True

        await _until(acted, "the action written after the restart")
        assert _decided(await turn.outcome("the action written after the restart")) == "Decided"
    finally:
        await turn.stop()


async def test_a_task_that_ends_ends_the_wait(bus: Bus) -> None:
    """``record.over`` (the task cancelled in agent-collab) reaches the waiting turn through the watch."""
    tasks = await _tasks(bus)
    await tasks.create(task_key(AGENT_ID, task_id_for("run-wait-over")), _record("run-wait-over"))
    turn = _Turn(bus, "run-wait-over", reread_s=NEVER_S)
    try:
        await _until(lambda: turn.watched() is not None, "the turn watching its task")
        await tasks.modify(turn.key, lambda r: r.model_copy(update={"state": AgentTaskState.CANCELLED}))
        outcome = await turn.outcome("the task cancelled")
        assert isinstance(outcome, ProviderFailed)
        assert outcome.error == "the task ended (cancelled)"
    finally:
        await turn.stop()


async def test_an_action_already_stored_needs_no_watch(bus: Bus) -> None:
    """A replay whose action is stored (a crash after the agent acted): used at once, the turn never offered."""
    tasks = await _tasks(bus)
    key = task_key(AGENT_ID, task_id_for("run-wait-stored"))
    await tasks.create(key, _acted(_record("run-wait-stored")))
    turn = _Turn(bus, "run-wait-stored", reread_s=NEVER_S)
    try:
        assert _decided(await turn.outcome("the stored action")) == "Decided"
        assert not turn.offered()
        assert turn.agents.watchers == {}
    finally:
        await turn.stop()


async def test_a_cancel_recorded_on_the_run_ends_the_wait_at_once(bus: Bus) -> None:
    """The run's own record is watched beside the task's: the cancel the executor records on it (as its cancel
    handler does for a driven run) ends the turn through the watch alone -- no re-read in the test's time,
    nothing from the agent -- and both watches are gone with the turn."""
    runs = await bus.store(BUCKET_RUNS, RunRecord)
    await runs.create("run-wait-cancel", _run("run-wait-cancel"))
    turn = _Turn(bus, "run-wait-cancel", reread_s=NEVER_S)
    try:
        await _until(lambda: turn.watched() is not None, "the turn watching its task")
        await stays(lambda: not turn.task.done(), settle_s=0.5, what="the turn waiting for its agent")
        asked = CancelRequest(reason="not needed", requested_by="user:alice", requested_at=T0, event_id="evt-c")
        await runs.modify("run-wait-cancel", lambda r: r.model_copy(update={"cancel": asked}))
        outcome = await turn.outcome("the cancel recorded on the run")
        assert isinstance(outcome, ProviderFailed)
        assert outcome.error == f"the run was cancelled while external agent {AGENT_ID} worked on turn 1"
        assert outcome.permanent
        assert turn.agents.watchers == {}
        assert [type(e).__name__ for e in turn.emitted] == ["AgentTaskOffered"]  # offered once, nothing else
    finally:
        await turn.stop()
