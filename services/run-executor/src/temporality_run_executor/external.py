"""Runs executed by an external agent (AP-5): the turn's "provider" is an agent outside the executor.

A card with ``provider: {kind: external, agent_id: <id>}`` is driven by the run machine exactly like a hosted
one -- the run record, its state machine, every ``run.*`` event, the tool loop, ``ask_human`` parking at zero
cost and the answer handed back as the tool result all stay the executor's. Only the provider call differs
(:meth:`ExternalAgents.complete`, called by the engine where it would call a model):

1. ``agent.task.offered`` is published for the turn (id from the run and the turn: a replay republishes the
   same event): on turn 1 the AP-5 task (objective, context, constraints, acceptance criteria, timeout,
   priority), after that the outcomes of the agent's last tool calls (``inputs``: the person's answer...).
   agent-collab records it in KV ``agent-tasks``; the agent takes it over the signed Agent Protocol.
2. The executor waits -- its lease on the run kept fresh, as during any provider call -- until the task's
   record holds the agent's action for this turn: ``tool_calls`` become the turn's tool calls, ``result`` the
   final answer, ``failure`` a failed run (``provider_error``). An action already stored (a replay after a
   crash) is used at once: no second question, no second result. The wait is pushed, not polled: a KV watch
   of the task's one key wakes it when the record changes and costs nothing meanwhile (see
   :class:`_Changes`); the record is read again every :data:`REREAD_S` anyway, and at once whenever the
   watch ended or the connection was re-established (then watched again), so a lost update can only delay
   a run, never hold it.
3. While it waits, a new *take* of the task under another agent session since the last turn's action (the
   agent crashed and came back with its checkpoint, AP-8) is announced as ``run.resumed`` (``reason:
   recovery``; id from the take): the run continues with the recovered agent. A run parked on a person when
   its agent comes back stays ``waiting_for_human``; its ``run.resumed`` (recovery) follows the answer's, when
   the run next waits for the agent.

A cancel ends the wait at once: the run's own record is watched alongside the task's (the same push, re-read
and reconnect discipline), and the moment it holds a cancel the turn ends (``ProviderFailed``; the machine,
reading the record afresh, cancels the run: ``run.cancelled``). agent-collab ends the task with the run
(``agent.task.ended``) and tells the agent at its next poll (``state: cancelled``).

The wait is bounded by the run's remaining compute budget (the card's ``limits.max_compute_s``): an agent that
is offline (or never comes) does not hold the run forever; past it (and a last read of the record) the run
fails ``provider_error``. A kill of the executor mid-wait loses nothing: the message comes back, the turn is
offered again (deduplicated) and the wait resumes. Nor does a bus that fails mid-wait (the server restarting)
end it: the record is read and watched again every :data:`RETRY_S` until the bus is back, within the same
deadline (only the last read, at the deadline, fails the delivery instead: it comes back).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

import nats.errors
import structlog
from nats.js.kv import KeyValue
from pydantic import BaseModel

from temporality_bus import Bus, Store, entry_value
from temporality_protocol import AgentTask, AgentTaskOffered, RunResumed, TaskInput
from temporality_protocol.agent_tasks import StoredAction, TaskRecord, task_id_for, task_key
from temporality_protocol.catalog import BUCKET_AGENT_TASKS, BUCKET_RUNS, BucketSpec
from temporality_run_executor.machine import Agent, CallProvider, ProviderFailed, ProviderReplied
from temporality_run_executor.providers.base import AssistantTurn
from temporality_run_executor.records import Message, RunRecord, ToolCall

__all__ = ["RECONNECT_CHECK_S", "REREAD_S", "RETRY_S", "ExternalAgents", "inputs_of", "task_of", "turn_of"]

log = structlog.get_logger(__name__)

#: How often a waiting executor reads the task's record although its watch said nothing: the safety net under
#: the watch (an update it missed can delay the run by this much, never hold it).
REREAD_S = 5.0
#: How often the wait checks whether the connection was re-established (a local counter, no round trip): the
#: watch's ordered consumer notices a restarted server only after ~20 s on its own, so it is watched again.
RECONNECT_CHECK_S = 1.0
#: After a read or a watch that failed (the bus is away), how long before trying again.
RETRY_S = 1.0
Emit = Callable[..., Awaitable[None]]
_PRIORITIES = ("low", "normal", "high")
#: What a read or a watch raises while the bus is away (nats-py raises its own and the builtin TimeoutError).
_BUS_DOWN = (nats.errors.Error, TimeoutError)
M = TypeVar("M", bound=BaseModel)
Outcome = ProviderReplied | ProviderFailed


def task_of(run: RunRecord, agent: Agent, call: CallProvider) -> AgentTask:
    """AP-5: the task the run gives its external agent."""
    raw = run.input.get("acceptance_criteria")
    criteria = [str(c) for c in raw] if isinstance(raw, list) else []
    priority = run.input.get("priority")
    return AgentTask(
        run_id=run.run_id,
        task_id=task_id_for(run.run_id),
        objective=run.title,
        context={
            "input": run.input,
            "people": list(run.human.allowed_recipients),
            "instructions": agent.card.instructions(),
            "launched_by": {"kind": run.launch.kind, "trigger_id": run.launch.trigger_id},
        },
        constraints={
            "tools": [spec.name for spec in call.tools],
            "max_turns": agent.card.limits.max_turns,
            "max_compute_s": agent.card.limits.max_compute_s,
        },
        acceptance_criteria=criteria,
        timeout_s=round(call.budget_s, 3),
        priority=priority if priority in _PRIORITIES else "normal",
    )


def inputs_of(messages: list[Message]) -> list[TaskInput]:
    """The outcomes of the last assistant message's tool calls: the tool messages that follow it."""
    last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=None)
    if last is None:
        return []
    names = {call.id: call.name for call in messages[last].tool_calls}
    return [
        TaskInput(tool_call_id=m.tool_call_id or "", tool=names.get(m.tool_call_id or "", ""), content=m.content or "")
        for m in messages[last + 1 :]
        if m.role == "tool"
    ]


def turn_of(action: StoredAction) -> AssistantTurn | str:
    """The action as the machine's provider reply; a failure is its error text."""
    if action.kind == "tool_calls":
        calls = [
            ToolCall(id=f"ext-{action.turn}-{i}", name=call.name, arguments=call.arguments)
            for i, call in enumerate(action.calls)
        ]
        return AssistantTurn(content=None, tool_calls=calls)
    if action.kind == "result":
        return AssistantTurn(content=action.result or "")
    return f"the external agent failed the task: {action.error or '(no reason given)'}"


class ExternalAgents:
    """The engine's provider call for external cards. ``emit(run, data, *id_parts)`` publishes a run's event.

    ``reread_s``: the safety re-read of a waiting turn's record (:data:`REREAD_S`)."""

    def __init__(self, bus: Bus, emit: Emit, *, reread_s: float = REREAD_S) -> None:
        self._bus = bus
        self._emit = emit
        self._reread_s = reread_s
        self._store: Store[TaskRecord] | None = None
        self._runs: Store[RunRecord] | None = None
        #: The live watch of each turn waiting here, by task key (one driver waits per run).
        self.watchers: dict[str, KeyValue.KeyWatcher] = {}

    async def _tasks(self) -> Store[TaskRecord]:
        if self._store is None:
            self._store = await self._bus.store(BUCKET_AGENT_TASKS, TaskRecord)
        return self._store

    async def _run_records(self) -> Store[RunRecord]:
        if self._runs is None:
            self._runs = await self._bus.store(BUCKET_RUNS, RunRecord)
        return self._runs

    async def complete(self, run: RunRecord, agent: Agent, call: CallProvider) -> ProviderReplied | ProviderFailed:
        external_id = agent.card.provider.agent_id
        assert external_id is not None  # an external card names its agent (validated at load)
        started = time.monotonic()
        task_id = task_id_for(run.run_id)
        key = task_key(external_id, task_id)
        tasks = await self._tasks()
        with structlog.contextvars.bound_contextvars(task_id=task_id, agent=external_id, turn=call.turn):
            found = await tasks.get(key)
            if found is None or found.value.action_for(call.turn) is None:
                offer = AgentTaskOffered(
                    run_id=run.run_id,
                    task_id=task_id,
                    agent_id=external_id,
                    turn=call.turn,
                    task=task_of(run, agent, call),
                    inputs=inputs_of(call.messages) if call.turn > 1 else [],
                )
                await self._emit(run, offer, str(call.turn))
                log.info("external.turn_offered")
            # takes after the one the last turn's action came under are the agent resuming (AP-8)
            previous = found.value.action_for(call.turn - 1) if found is not None else None
            announced = previous.take if previous is not None else 1
            deadline = started + call.budget_s

            async def decided(record: TaskRecord | None) -> ProviderReplied | ProviderFailed | None:
                nonlocal announced
                if record is None:
                    return None
                announced = await self._announce_takes(run, record, call.turn, announced)
                action = record.action_for(call.turn)
                if action is not None:
                    return self._reply(call, action, time.monotonic() - started)
                if record.over:
                    return ProviderFailed(
                        turn=call.turn, error=f"the task ended ({record.state.value})", permanent=True
                    )
                return None

            outcome = await decided(found.value if found is not None else None)
            if outcome is not None:
                return outcome

            over = asyncio.Event()  # set when the wait ends either way (see _unless_cancelled)

            async def acted() -> Outcome | None:
                changes = _Changes(
                    self._bus,
                    tasks,
                    BUCKET_AGENT_TASKS,
                    TaskRecord,
                    key,
                    reread_s=self._reread_s,
                    watchers=self.watchers,
                )
                try:
                    while time.monotonic() < deadline:
                        if over.is_set():
                            return None
                        outcome = await decided(await changes.next(until=deadline))
                        if outcome is not None:
                            return outcome
                    # a last read (which must succeed: a bus that is away fails the delivery, not the run)
                    last = await tasks.get(key)
                    return await decided(last.value if last is not None else None)
                finally:
                    await changes.close()

            ended = await self._unless_cancelled(run, acted(), deadline, over)
            if ended == "cancelled":
                log.info("external.wait_cancelled")
                detail = f"the run was cancelled while external agent {external_id} worked on turn {call.turn}"
                return ProviderFailed(turn=call.turn, error=detail, permanent=True)
            if isinstance(ended, ProviderReplied | ProviderFailed):
                return ended
            detail = f"external agent {external_id} did not act on turn {call.turn} within {call.budget_s:.0f} s"
            log.warning("external.no_action", budget_s=call.budget_s)
            return ProviderFailed(turn=call.turn, error=detail, permanent=True)

    async def _unless_cancelled(
        self, run: RunRecord, waiting: Coroutine[Any, Any, Outcome | None], deadline: float, over: asyncio.Event
    ) -> Outcome | str | None:
        """``waiting``'s outcome, or ``"cancelled"`` as soon as the run's record holds a cancel (watched like the
        task's record: pushed, re-read now and then, watched again after a reconnect).

        ``over`` is set when either ends, and both loops check it at every step: a task cancellation alone can be
        lost (Python 3.11's ``asyncio.wait_for``, under nats-py's watch, swallows a cancel that comes as an
        update arrives -- and the run's record changes at every lease renewal)."""
        runs = await self._run_records()
        record = _Changes(self._bus, runs, BUCKET_RUNS, RunRecord, run.run_id, reread_s=self._reread_s, watchers={})

        async def cancelled() -> bool:
            try:
                while time.monotonic() < deadline and not over.is_set():
                    current = await record.next(until=deadline)
                    if current is not None and current.cancel is not None:
                        return True
                return False
            finally:
                await record.close()

        acting = asyncio.create_task(waiting)
        stopping = asyncio.create_task(cancelled())
        try:
            await asyncio.wait((acting, stopping), return_when=asyncio.FIRST_COMPLETED)
            if acting.done():
                return acting.result()
            if stopping.result():
                return "cancelled"
            return await acting  # the budget ran out before a cancel: the wait's own last read decides
        finally:
            over.set()
            for task in (acting, stopping):
                task.cancel()
            await asyncio.gather(acting, stopping, return_exceptions=True)

    async def _announce_takes(self, run: RunRecord, record: TaskRecord, turn: int, announced: int) -> int:
        """AP-8: every take after the first is the agent resuming from its checkpoint: ``run.resumed``."""
        for take in range(announced + 1, record.take + 1):
            resumed = RunResumed(run_id=run.run_id, reason="recovery", from_turn=max(turn - 1, 0))
            await self._emit(run, resumed, "external", record.task_id, str(take))
            log.info("external.agent_resumed", take=take, checkpoint_id=record.checkpoint_id)
        return max(announced, record.take)

    @staticmethod
    def _reply(call: CallProvider, action: StoredAction, elapsed_s: float) -> ProviderReplied | ProviderFailed:
        reply = turn_of(action)
        if isinstance(reply, str):
            return ProviderFailed(turn=call.turn, error=reply, permanent=True)
        return ProviderReplied(turn=call.turn, reply=reply, elapsed_s=elapsed_s)


class _Changes(Generic[M]):
    """The successive states of one record (the task's; the run's, for a cancel) while a turn waits: pushed by a KV watch of its key, read
    again every ``reread_s`` all the same, and read and watched again at once when the watch ended or the
    connection was re-established. nats-py's "caught up" marker is never relied on (see
    :mod:`temporality_bus.listing`): a watch delivers the key's current value, whenever it comes, and every
    change after it; each one is simply the record's newest known state."""

    def __init__(
        self,
        bus: Bus,
        store: Store[M],
        bucket: BucketSpec,
        model: type[M],
        key: str,
        *,
        reread_s: float,
        watchers: dict[str, KeyValue.KeyWatcher],
    ) -> None:
        self._bus = bus
        self._store = store
        self._bucket = bucket
        self._model = model
        self._key = key
        self._reread_s = reread_s
        self._watchers = watchers
        self._watcher: KeyValue.KeyWatcher | None = None
        self._reconnects = 0
        self._started = False
        now = time.monotonic()
        self._read_at = now + reread_s  # the caller has just read the record
        self._watch_at = now  # when to (try to) watch again while there is no watch

    def _reconnected(self) -> bool:
        return int(self._bus.nc.stats.get("reconnects", 0)) != self._reconnects

    async def next(self, *, until: float) -> M | None:
        """The record's next known state: a change the watch pushes, or a read (when one is due, or after a
        new watch). ``None``: nothing new (no record, a read that failed, or ``until`` came)."""
        while True:
            now = time.monotonic()
            if now >= until:
                return None
            if self._watcher is None or self._reconnected():
                if now < self._watch_at:  # the last watch failed: try again a little later
                    await asyncio.sleep(min(self._watch_at, until) - now)
                    continue
                first = not self._started
                await self._watch()
                if not first:  # after a watch that ended or failed: read what it may have missed
                    return await self._read()
                continue
            if now >= self._read_at:
                return await self._read()
            timeout = min(self._read_at, until, now + RECONNECT_CHECK_S) - now
            try:
                entry = await self._watcher.updates(timeout=timeout)  # type: ignore[no-untyped-call]
            except nats.errors.TimeoutError:
                continue
            if isinstance(entry, type(KeyValue.KeyWatcher.STOP_ITER)):
                log.info("external.watch_ended")
                await self._unwatch()
                continue
            if entry is None:  # nats-py's "caught up" marker: it proves nothing, and nothing needs it
                continue
            value = entry_value(entry)
            log.debug("external.record_changed", revision=entry.revision)
            return self._model.model_validate_json(value) if value is not None else None

    async def _read(self) -> M | None:
        try:
            found = await self._store.get(self._key)
        except _BUS_DOWN as exc:
            log.warning("external.read_failed", error=f"{type(exc).__name__}: {exc}")
            self._read_at = time.monotonic() + min(RETRY_S, self._reread_s)
            return None
        self._read_at = time.monotonic() + self._reread_s
        log.debug("external.record_read", found=found is not None)
        return found.value if found is not None else None

    async def _watch(self) -> None:
        """(Re)start the watch of the key; on failure, try again after :data:`RETRY_S` (reads meanwhile)."""
        again = self._started
        self._started = True
        await self._unwatch()
        self._reconnects = int(self._bus.nc.stats.get("reconnects", 0))
        try:
            kv = await self._bus.kv(self._bucket)
            self._watcher = await kv.watch(self._key)
        except _BUS_DOWN as exc:
            log.warning("external.watch_failed", error=f"{type(exc).__name__}: {exc}")
            self._watch_at = time.monotonic() + RETRY_S
            return
        self._watchers[self._key] = self._watcher
        if again:
            log.info("external.watching_again")

    async def _unwatch(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is None:
            return
        if self._watchers.get(self._key) is watcher:
            del self._watchers[self._key]
        with contextlib.suppress(Exception):  # the bus is away: the server drops the consumer on its own
            await watcher.stop()  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await self._unwatch()
