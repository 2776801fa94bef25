"""Tasks for external agents (AP-5), their checkpoints (AP-7), recovery (AP-8) and streaming events (AP-9).

A run whose agent card says ``provider: {kind: external, agent_id: ...}`` is still the run-executor's: it
keeps the run record and publishes every ``run.*`` event. Where a hosted run calls its model, it offers the
external agent the turn (``agent.task.offered``: the AP-5 task on turn 1, the outcomes of the agent's last
tool calls after) and parks the run until the agent's action is in KV ``agent-tasks``: the
``agent.task.acted`` published here after the action is committed wakes it (the run-executor's consumer
``run-executor-agents``). This module is agent-collab's half:

==========================================  ==================================================================
consumer ``agent-collab-tasks``             ``agent.task.offered`` -> the task's record (``offered``, turn N)
``temporality.rpc.agents.*.tasks``          a registered, online agent takes its tasks (``working``): each
                                            with the open turn, its inputs, the last checkpoint; a task held
                                            under another ``session_id`` is resumed (``agent.task.taken``
                                            ``resumed: true``; the run-executor publishes ``run.resumed``)
``temporality.rpc.agents.*.act``            the agent acts on the open turn -- ``tool_calls`` (``acted``; the
                                            run runs them, ``ask_human`` parks it), ``handoff`` (``acted``; the
                                            run hands its task on, AP-6), ``result`` (``completed``),
                                            ``failure`` (``failed``) -- or stores a ``checkpoint`` or a
                                            streaming ``event``, each journaled; out of order: refused,
                                            journaled as ``agent.task.refused``
``run.completed|failed|cancelled``          the task ends with its run (``agent.task.ended``; later actions:
                                            ``task_ended``); a cancelled task the agent had taken is in its
                                            next poll once more, ``state: cancelled``: stop working on it
==========================================  ==================================================================

Every message passes the signature gate first (AP-11). Record first, then effects: the decision is committed
with :meth:`~temporality_bus.Store.modify`, then its events are published with ids derived from the task and
the agent's ``action_id``, then the reply is sent. The same action again finds it stored and is answered
``duplicate: true`` -- a replay never asks a second question nor completes twice.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import structlog
from pydantic import ValidationError

from temporality_agent_collab.external import AllowList
from temporality_agent_collab.gate import MessageGate, SignedResponder
from temporality_agent_collab.hints import claimed, json_field
from temporality_agent_collab.participants import InvalidKey, RunIndex, SagaParticipants, saga_key
from temporality_agent_collab.participants import run_key as saga_run_key
from temporality_agent_collab.registry import SOURCE, AgentRecord, agent_key, granted, utcnow
from temporality_agent_collab.rpc import QUEUE_GROUP
from temporality_bus import (
    AlreadyExists,
    Bus,
    Delivery,
    Failure,
    NotFound,
    PermanentError,
    Request,
    Responder,
    Store,
    evolve,
)
from temporality_bus.responder import validation_detail
from temporality_protocol import (
    RUN,
    AgentRefusal,
    AgentTaskActed,
    AgentTaskCheckpointed,
    AgentTaskEnded,
    AgentTaskOffered,
    AgentTaskRefused,
    AgentTaskStreamed,
    AgentTaskTaken,
    Envelope,
    EventData,
    RunCancelled,
    RunCompleted,
    RunFailed,
    StoredCheckpoint,
    TaskAction,
    TaskActionReply,
    TaskAssignment,
    TaskPoll,
    TaskPollReply,
    TaskRefusal,
    derive_id,
    make_event,
)
from temporality_protocol.agent_tasks import (
    HANDOFF_TO_AGENT,
    StoredAction,
    TaskRecord,
    TaskRef,
    checkpoint_key,
    external_call_id,
    handoff_ids,
    run_key,
    task_key,
)
from temporality_protocol.catalog import (
    BUCKET_AGENT_TASKS,
    BUCKET_AGENTS,
    BUCKET_COLLAB,
    RPC_AGENTS_TASKS_ACT,
    RPC_AGENTS_TASKS_POLL,
)
from temporality_protocol.events import TaskRefusalReason
from temporality_protocol.states import AGENT_TASK, AgentLifecycleState, AgentTaskState

__all__ = ["MAX_CHECKPOINT_BYTES", "TaskBoard", "TaskRefused", "acted", "child_run_id", "offered", "taken"]

log = structlog.get_logger(__name__)

_T = AgentTaskState
#: A checkpoint larger than this (its JSON) is refused (``malformed_request``): KV is not a blob store.
MAX_CHECKPOINT_BYTES = 256 * 1024
MODIFY_ATTEMPTS = 32
_CLOSING = frozenset({"tool_calls", "result", "failure", "handoff"})
#: The tool a ``handoff`` action is carried out as (AP-6): the agent must be granted it.
HANDOFF_TOOL = HANDOFF_TO_AGENT


class TaskRefused(Exception):
    def __init__(self, reason: TaskRefusalReason, detail: str) -> None:
        super().__init__(detail)
        self.reason: TaskRefusalReason = reason
        self.detail = detail


# --------------------------------------------------------------------------- pure dialogue steps
def offered(current: TaskRecord, offer: AgentTaskOffered, now: datetime) -> TaskRecord | None:
    """The run-executor offers turn ``offer.turn``: the next turn after an action, else nothing changes
    (a redelivered or stale offer, or one for a task that has ended)."""
    if current.over or offer.turn <= current.turn:
        return None
    if current.state is not _T.ACTED or offer.turn != current.turn + 1:
        log.warning("agent_task.offer_out_of_order", state=current.state.value, turn=current.turn, offered=offer.turn)
        return None
    AGENT_TASK.transition(current.state, _T.OFFERED)
    return current.model_copy(
        update={
            "state": _T.OFFERED,
            "turn": offer.turn,
            "inputs": offer.inputs,
            "messages": offer.messages,
            "offered_at": now,
            "updated_at": now,
        }
    )


def taken(current: TaskRecord, session_id: str, now: datetime) -> TaskRecord | None:
    """The agent polled its tasks under ``session_id``: an offered turn is taken; a task held under another
    session is taken again (a resume, AP-8). ``None``: nothing changes."""
    if current.over:
        return None
    changes: dict[str, Any] = {}
    if current.state is _T.OFFERED:
        AGENT_TASK.transition(current.state, _T.WORKING)
        changes["state"] = _T.WORKING
    if current.session_id != session_id:
        changes |= {"session_id": session_id, "take": current.take + 1}
    if not changes:
        return None
    return current.model_copy(update={**changes, "updated_at": now})


def acted(current: TaskRecord, body: TaskAction, allowed_tools: list[str], now: datetime) -> TaskRecord | None:
    """A turn-closing action (tool calls, a result, a failure), checked against the dialogue. ``None``: the
    same action was already taken (a duplicate); :class:`TaskRefused` when it is out of order."""
    if any(a.action_id == body.action_id for a in current.actions):
        return None
    if current.over:
        raise TaskRefused("task_ended", f"task {current.task_id} has ended ({current.state.value})")
    if current.state is _T.OFFERED and current.take == 0:
        raise TaskRefused("not_taken", f"task {current.task_id} was not taken yet: poll for it first")
    if body.turn != current.turn:
        raise TaskRefused("wrong_turn", f"task {current.task_id} is at turn {current.turn}, not {body.turn}")
    if current.state is not _T.WORKING:
        raise TaskRefused("turn_closed", f"turn {current.turn} of task {current.task_id} already has an action")
    refused = [call.name for call in body.calls if call.name not in allowed_tools]
    if body.kind == "handoff" and HANDOFF_TOOL not in allowed_tools:
        refused.append(HANDOFF_TOOL)
    if refused:
        raise TaskRefused("tool_not_allowed", f"tools {refused} are not granted (granted: {allowed_tools})")
    # a handoff closes the turn like tool calls: the run carries it out (and ends, handed off, or offers the
    # next turn with the refusal as its input); the task ends with the run
    target = {"tool_calls": _T.ACTED, "handoff": _T.ACTED, "result": _T.COMPLETED, "failure": _T.FAILED}[body.kind]
    AGENT_TASK.transition(current.state, target)
    action = StoredAction(
        turn=body.turn,
        action_id=body.action_id,
        kind=body.kind,
        calls=body.calls,
        result=body.result,
        error=body.error,
        handoff=body.handoff if body.kind == "handoff" else None,
        take=current.take,
        at=now,
    )
    return current.model_copy(update={"state": target, "actions": [*current.actions, action], "updated_at": now})


def child_run_id(record: TaskRecord, action: StoredAction) -> str | None:
    """A handoff action's child run id (AP-6), derived as the run-executor derives it when it carries the action
    out as its turn's ``handoff_to_agent`` call: the run and the call id. ``None`` for any other action."""
    if action.kind != "handoff":
        return None
    return handoff_ids(record.run_id, external_call_id(action.turn, 0))[1]


def _ended_by_run(current: TaskRecord, event_type: str) -> TaskRecord | None:
    if current.over:
        return None
    target = {"run.completed": _T.COMPLETED, "run.failed": _T.FAILED}.get(event_type, _T.CANCELLED)
    return current.model_copy(update={"state": target, "ended": event_type, "updated_at": utcnow()})


def _holds(current: TaskRecord) -> None:
    """Checkpoints and streaming events come from the agent that holds the task, while it lasts."""
    if current.over:
        raise TaskRefused("task_ended", f"task {current.task_id} has ended ({current.state.value})")
    if current.take == 0:
        raise TaskRefused("not_taken", f"task {current.task_id} was not taken yet: poll for it first")


# --------------------------------------------------------------------------- the I/O shell
class TaskBoard:
    """The task responders, the offer consumer and the run-end hook. Build with :meth:`open`."""

    def __init__(
        self,
        bus: Bus,
        tasks: Store[TaskRecord],
        refs: Store[TaskRef],
        checkpoints: Store[StoredCheckpoint],
        agents: Store[AgentRecord],
        gate: MessageGate,
        sagas: Store[SagaParticipants],
        run_index: Store[RunIndex],
        allow_list: AllowList,
    ) -> None:
        self._bus = bus
        self._tasks = tasks
        self._refs = refs
        self._checkpoints = checkpoints
        self._agents = agents
        self.gate = gate
        #: agent-collab's saga projection (``agent-collab-runs``): whether a task's run has finished.
        self._sagas = sagas
        self._run_index = run_index
        #: The allow-list agent-collab started with: an agent's grant is its registration's within it (AP-11).
        self._allow_list = allow_list
        #: The test seam: awaited with the name of a point of :meth:`act` (``act:committed``: the action is stored,
        #: its ``agent.task.acted`` not yet published). ``None`` -- always, in the service -- does nothing; a
        #: crash test's process sets it to exit there the way kill -9 would.
        self.crash_point: Callable[[str], Awaitable[None]] | None = None

    @classmethod
    async def open(cls, bus: Bus, gate: MessageGate, allow_list: AllowList) -> TaskBoard:
        return cls(
            bus,
            await bus.store(BUCKET_AGENT_TASKS, TaskRecord),
            await bus.store(BUCKET_AGENT_TASKS, TaskRef),
            await bus.store(BUCKET_AGENT_TASKS, StoredCheckpoint),
            await bus.store(BUCKET_AGENTS, AgentRecord),
            gate,
            await bus.store(BUCKET_COLLAB, SagaParticipants),
            await bus.store(BUCKET_COLLAB, RunIndex),
            allow_list,
        )

    def responders(self, *, queue: str = QUEUE_GROUP, max_inflight: int = 8) -> list[Responder[Any, Any]]:
        common: dict[str, Any] = {"gate": self.gate, "queue": queue, "max_inflight": max_inflight}

        def refusal(r: AgentRefusal) -> TaskRefusal:
            return TaskRefusal(reason=r.reason, detail=r.detail, retry_after_s=r.retry_after_s)

        def failed(f: Failure) -> TaskRefusal:
            if f.kind == "malformed":
                return TaskRefusal(reason="malformed_request", detail=f"malformed request: {f.detail}"[:4096])
            return TaskRefusal(reason="internal_error", detail=f"internal error: {f.detail}"[:4096])

        return [
            SignedResponder(
                self._bus,
                RPC_AGENTS_TASKS_POLL,
                request_model=TaskPoll,
                handler=self._on_poll,
                refused=lambda agent_id, r, _raw: TaskPollReply(agent_id=agent_id, accepted=False, refusal=refusal(r)),
                on_error=lambda f: TaskPollReply(
                    agent_id=claimed(f.raw, "agent_id"), accepted=False, refusal=failed(f)
                ),
                negotiate_versions=False,
                **common,
            ),
            SignedResponder(
                self._bus,
                RPC_AGENTS_TASKS_ACT,
                request_model=TaskAction,
                handler=self._on_act,
                refused=lambda agent_id, r, raw: TaskActionReply(
                    agent_id=agent_id, task_id=claimed(raw, "task_id"), accepted=False, refusal=refusal(r)
                ),
                on_error=lambda f: TaskActionReply(
                    agent_id=claimed(f.raw, "agent_id"),
                    task_id=claimed(f.raw, "task_id"),
                    accepted=False,
                    refusal=failed(f),
                ),
                negotiate_versions=False,
                on_malformed=self._malformed,
                **common,
            ),
        ]

    # ------------------------------------------------------------------ the run-executor's side
    async def on_offered(self, event: Envelope, delivery: Delivery | None = None) -> None:
        """``agent.task.offered`` (consumer ``agent-collab-tasks``): the task's record at the offered turn."""
        offer = event.payload(AgentTaskOffered)
        _check_keys(offer)
        key = task_key(offer.agent_id, offer.task_id)
        now = utcnow()
        with structlog.contextvars.bound_contextvars(run_id=offer.run_id, task_id=offer.task_id):
            if await self._tasks.get(key) is None:
                fresh = TaskRecord(
                    agent_id=offer.agent_id,
                    task_id=offer.task_id,
                    run_id=offer.run_id,
                    correlation_id=event.correlationid or offer.run_id,
                    task=offer.task,
                    turn=offer.turn,
                    inputs=offer.inputs,
                    messages=offer.messages,
                    offered_at=now,
                    created_at=now,
                    updated_at=now,
                )
                try:
                    await self._tasks.create(key, fresh)
                    log.info("agent_task.offered", turn=offer.turn, agent_id=offer.agent_id)
                except AlreadyExists:
                    pass
                try:
                    await self._refs.create(
                        run_key(offer.run_id), TaskRef(agent_id=offer.agent_id, task_id=offer.task_id)
                    )
                except AlreadyExists:
                    pass
                return
            result = await self._tasks.modify(key, lambda cur: offered(cur, offer, now), attempts=MODIFY_ATTEMPTS)
            if result.changed:
                log.info("agent_task.offered", turn=offer.turn, agent_id=offer.agent_id)

    async def on_run_event(self, event: Envelope) -> None:
        """A run ended: so does its task (an action after it is refused ``task_ended``)."""
        data = event.payload()
        if not isinstance(data, RunCompleted | RunFailed | RunCancelled):
            return
        ref = await self._refs.get(run_key(data.run_id))
        if ref is None:
            return
        key = task_key(ref.value.agent_id, ref.value.task_id)
        try:
            result = await self._tasks.modify(key, lambda cur: _ended_by_run(cur, event.type), attempts=MODIFY_ATTEMPTS)
        except NotFound:
            return
        record = result.value
        if record.ended != event.type:
            return  # it had ended on its own (the agent's result or failure): the run merely follows
        # record first, then the fact (again on a redelivery: the id is the task's, the stream keeps one)
        ended = AgentTaskEnded(
            run_id=record.run_id,
            task_id=record.task_id,
            agent_id=record.agent_id,
            turn=record.turn,
            state=record.state.value,  # a terminal state: completed|failed|cancelled
            cause=event.type,
            taken=record.take > 0,
        )
        await self._bus.publish(self._event(record, ended, "ended", causation=event.id))  # the run's end
        if result.changed:
            log.info("agent_task.ended_with_run", run_id=data.run_id, state=record.state.value)

    # ------------------------------------------------------------------ the agent's side
    async def _agent(self, agent_id: str, version: str) -> AgentRecord:
        found = await self._agents.get(agent_key(agent_id))
        record = found.value if found is not None else None
        if record is None or record.state is AgentLifecycleState.DECOMMISSIONED:
            raise TaskRefused("not_registered", f"agent {agent_id!r} is not registered")
        if record.state is AgentLifecycleState.OFFLINE:
            raise TaskRefused("not_registered", f"agent {agent_id!r} is offline: register or heartbeat first")
        if version != record.protocol_version:
            raise TaskRefused("version_mismatch", f"registered with protocol {record.protocol_version}, not {version}")
        return record

    async def _on_poll(self, request: Request[TaskPoll]) -> TaskPollReply:
        body = request.body
        with structlog.contextvars.bound_contextvars(agent_id=body.agent_id):
            try:
                return await self.poll(body)
            except TaskRefused as refused:
                log.info("agent_task.poll_refused", reason=refused.reason)
                return TaskPollReply(
                    agent_id=body.agent_id,
                    accepted=False,
                    refusal=TaskRefusal(reason=refused.reason, detail=refused.detail),
                )

    async def poll(self, body: TaskPoll) -> TaskPollReply:
        """The tasks the agent holds, each taken (journaled ``agent.task.taken`` when it is taken anew)."""
        await self._agent(body.agent_id, body.protocol_version)
        prefix = f"task.{body.agent_id}."
        assignments: list[TaskAssignment] = []
        now = utcnow()
        for key in sorted(k for k in await self._tasks.keys() if k.startswith(prefix)):
            try:
                found = await self._tasks.get(key)
            except ValidationError as exc:  # one unreadable record must not cost the agent all its other tasks
                log.error("agent_task.unreadable", key=key, error=validation_detail(exc)[:512])
                continue
            if found is None:
                continue
            if found.value.over:
                cancelled = await self._tell_cancelled(key, found.value)
                if cancelled is not None:
                    assignments.append(cancelled)
                continue
            result = await self._tasks.modify(
                key, lambda cur: taken(cur, body.session_id, now), attempts=MODIFY_ATTEMPTS
            )
            record = result.value
            if record.over:
                continue
            await self._announce_taken(key, record)
            saved = await self._checkpoints.get(checkpoint_key(record.task_id))
            assignments.append(
                TaskAssignment(
                    task=record.task,
                    state=record.state.value,
                    turn=record.turn,
                    inputs=record.inputs,
                    acted=record.action_for(record.turn) is not None,
                    checkpoint=saved.value if saved is not None else None,
                    resumed=record.take > 1,
                    messages=record.messages or None,
                )
            )
        return TaskPollReply(agent_id=body.agent_id, accepted=True, tasks=assignments)

    async def _tell_cancelled(self, key: str, record: TaskRecord) -> TaskAssignment | None:
        """A task cancelled with its run that the agent had taken: handed over once more, ``state: cancelled``,
        so the agent stops working on it (marked told first: a lost reply leaves it to ``task_ended``)."""
        if record.state is not _T.CANCELLED or record.take == 0 or record.cancel_told:
            return None

        def told(cur: TaskRecord) -> TaskRecord | None:
            return None if cur.cancel_told else evolve(cur, cancel_told=True)

        result = await self._tasks.modify(key, told, attempts=MODIFY_ATTEMPTS)
        if not result.changed:
            return None  # another poll (a replica) told it
        log.info("agent_task.cancel_told", task_id=record.task_id, run_id=record.run_id)
        return TaskAssignment(
            task=record.task,
            state=record.state.value,
            turn=record.turn,
            inputs=[],
            acted=record.action_for(record.turn) is not None,
            resumed=False,
        )

    async def _on_act(self, request: Request[TaskAction]) -> TaskActionReply:
        body = request.body
        with structlog.contextvars.bound_contextvars(agent_id=body.agent_id, task_id=body.task_id, turn=body.turn):
            try:
                return await self.act(body)
            except TaskRefused as refused:
                await self._bus.publish(self._refused_event(body, refused))
                log.info("agent_task.refused", reason=refused.reason, kind=body.kind)
                return TaskActionReply(
                    agent_id=body.agent_id,
                    task_id=body.task_id,
                    accepted=False,
                    refusal=TaskRefusal(reason=refused.reason, detail=refused.detail),
                )

    async def act(self, body: TaskAction) -> TaskActionReply:
        agent = await self._agent(body.agent_id, body.protocol_version)
        key = task_key(body.agent_id, body.task_id)
        found = await self._tasks.get(key)
        if found is None:
            raise TaskRefused("unknown_task", f"no task {body.task_id!r} was assigned to {body.agent_id!r}")
        if body.kind in _CLOSING:
            now = utcnow()
            allowed = granted(agent, self._allow_list)
            result = await self._tasks.modify(key, lambda cur: acted(cur, body, allowed, now), attempts=MODIFY_ATTEMPTS)
            record = result.value
            stored = next(a for a in record.actions if a.action_id == body.action_id)
            if result.changed and self.crash_point is not None:
                await self.crash_point("act:committed")
            # again for a duplicate (its event may be the one lost): the id is the turn's, the stream keeps one
            await self._bus.publish(self._acted_event(record, stored))
            await self._acted_announced(key, record, stored.turn)
            if result.changed:
                log.info("agent_task.acted", kind=body.kind, state=record.state.value)
            return TaskActionReply(
                agent_id=body.agent_id,
                task_id=body.task_id,
                accepted=True,
                duplicate=not result.changed,
                state=record.state.value,
                child_run_id=child_run_id(record, stored),
            )
        record = found.value
        _holds(record)
        if body.kind == "checkpoint":
            return await self._checkpoint(record, body)
        return await self._stream(record, body)

    async def _checkpoint(self, record: TaskRecord, body: TaskAction) -> TaskActionReply:
        """AP-7: stored (the last one wins), then journaled; the same checkpoint again changes nothing."""
        sent = body.checkpoint
        assert sent is not None
        checkpoint_id = sent.checkpoint_id or derive_id("ackpt", record.task_id, body.action_id)
        stored = StoredCheckpoint(
            checkpoint_id=checkpoint_id,
            run_id=record.run_id,
            task_id=record.task_id,
            turn=body.turn,
            timestamp=sent.timestamp or utcnow(),
            execution_state=sent.execution_state,
            memory_snapshot=sent.memory_snapshot,
            artifact_references=sent.artifact_references,
        )
        size = len(stored.model_dump_json().encode())
        if size > MAX_CHECKPOINT_BYTES:
            raise TaskRefused("malformed_request", f"checkpoint of {size} bytes: at most {MAX_CHECKPOINT_BYTES}")
        before = await self._checkpoints.get(checkpoint_key(record.task_id))
        duplicate = before is not None and before.value.checkpoint_id == checkpoint_id
        if not duplicate:
            await self._checkpoints.put(checkpoint_key(record.task_id), stored)
            await self._tasks.modify(
                task_key(record.agent_id, record.task_id),
                lambda cur: cur.model_copy(update={"checkpoint_id": checkpoint_id}),
                attempts=MODIFY_ATTEMPTS,
            )
        data = AgentTaskCheckpointed(
            run_id=record.run_id,
            task_id=record.task_id,
            agent_id=record.agent_id,
            turn=body.turn,
            checkpoint_id=checkpoint_id,
            artifact_references=stored.artifact_references,
            size_bytes=size,
        )
        await self._bus.publish(self._event(record, data, "checkpointed", checkpoint_id))
        log.info("agent_task.checkpointed", checkpoint_id=checkpoint_id, duplicate=duplicate)
        return TaskActionReply(
            agent_id=record.agent_id,
            task_id=record.task_id,
            accepted=True,
            duplicate=duplicate,
            state=record.state.value,
            checkpoint_id=checkpoint_id,
        )

    async def _stream(self, record: TaskRecord, body: TaskAction) -> TaskActionReply:
        """AP-9: journaled with the saga's correlation id and its request id (the same ``action_id``: one event, and
        the reply to the repeat says ``duplicate: true`` while JetStream's duplicate window remembers the first)."""
        sent = body.event
        assert sent is not None
        data = AgentTaskStreamed(
            run_id=record.run_id,
            task_id=record.task_id,
            agent_id=record.agent_id,
            turn=body.turn,
            kind=sent.kind,
            correlation_id=record.correlation_id,
            request_id=sent.request_id or record.task_id,
            message=sent.message,
            data=sent.data,
        )
        published = await self._bus.publish(self._event(record, data, "streamed", body.action_id))
        # the same action again within the journal's duplicate window is the same event: say so, as for the others
        return TaskActionReply(
            agent_id=record.agent_id,
            task_id=record.task_id,
            accepted=True,
            duplicate=published.duplicate,
            state=record.state.value,
        )

    # ------------------------------------------------------------------ events
    def _event(
        self, record: TaskRecord, data: EventData, *parts: str, turn: int | None = None, causation: str | None = None
    ) -> Envelope:
        """A fact of the task, caused by the run's ``agent.task.offered`` of ``turn`` (the open turn unless said; its
        id is the run-executor's, derived from the run and the turn) unless ``causation`` says otherwise."""
        offered = derive_id(
            "evt", record.run_id, AgentTaskOffered.EVENT_TYPE, str(record.turn if turn is None else turn)
        )
        return make_event(
            data,
            source=SOURCE,
            id=derive_id("evt", "agent.task", record.task_id, *parts),
            run_id=record.run_id,
            correlation_id=record.correlation_id,
            causation_id=causation or offered,
            actor=f"agent:{record.agent_id}",
            subject=record.agent_id,
        )

    async def _acted_announced(self, key: str, record: TaskRecord, turn: int) -> None:
        """Note in the record that turn ``turn``'s ``agent.task.acted`` is published (after the publish)."""
        if record.acted_announced is not None and record.acted_announced >= turn:
            return

        def announced(cur: TaskRecord) -> TaskRecord | None:
            return (
                None
                if cur.acted_announced is not None and cur.acted_announced >= turn
                else evolve(cur, acted_announced=turn)
            )

        await self._tasks.modify(key, announced, attempts=MODIFY_ATTEMPTS)

    async def announce_actions(self) -> int:
        """At start: publish ``agent.task.acted`` for every task's last action that is truly un-announced -- stored
        by an agent-collab that died before its publish, the agent never sending it again -- so the run parked on it
        wakes now rather than at its compute budget's timer's last read. The event id is the turn's (a replica doing
        the same, or a publish that did happen, is one event). Returns how many were announced.

        An action not marked announced (``acted_announced``: written after each publish; ``None`` in records from
        before the field) is announced only when nothing shows its run has taken it up: a task whose run ended it
        (``ended``), a task whose run has since offered a later turn (the run read the action and went on), and a
        task whose run has finished in agent-collab's saga projection (the agent's result or failure already
        carried out, or the run ended otherwise) are only marked, so no later start looks at them again and none
        is re-announced -- the old records are not all republished at the first start after an upgrade."""
        count = 0
        for key in sorted(k for k in await self._tasks.keys() if k.startswith("task.")):
            try:
                found = await self._tasks.get(key)
            except Exception as exc:  # one unreadable record must not keep agent-collab from starting
                log.warning("agent_task.unreadable", key=key, error=f"{type(exc).__name__}: {exc}")
                continue
            record = found.value if found is not None else None
            if record is None or not record.actions or record.ended is not None:
                continue
            last = record.actions[-1]
            if record.acted_announced is not None and record.acted_announced >= last.turn:
                continue
            taken_up = await self._taken_up(record, last)
            if taken_up is not None:
                await self._acted_announced(key, record, last.turn)
                log.info("agent_task.acted_settled", task_id=record.task_id, run_id=record.run_id, why=taken_up)
                continue
            await self._bus.publish(self._acted_event(record, last))
            await self._acted_announced(key, record, last.turn)
            log.info("agent_task.acted_announced", task_id=record.task_id, run_id=record.run_id, turn=last.turn)
            count += 1
        return count

    async def _taken_up(self, record: TaskRecord, last: StoredAction) -> str | None:
        """Why the run needs no announcement of ``last`` (it took the action up, or it has finished), if it does
        not; ``None``: nothing says so (the run may still be parked on it)."""
        if record.turn > last.turn:
            return "later_turn_offered"
        if await self._run_finished(record.run_id):
            return "run_finished"
        return None

    async def _run_finished(self, run_id: str) -> bool:
        """The run has finished as far as agent-collab's saga projection knows (unknown: not finished)."""
        try:
            indexed = await self._run_index.get(saga_run_key(run_id))
            if indexed is None:
                return False
            saga = await self._sagas.get(saga_key(indexed.value.saga_id))
        except InvalidKey:
            return False
        entry = saga.value.runs.get(run_id) if saga is not None else None
        return entry is not None and entry.status in RUN.terminal

    async def _announce_taken(self, key: str, record: TaskRecord) -> None:
        """Publish ``agent.task.taken`` for the record's take and turn unless it is known published, then say
        so in the record: a publish that failed after the take was stored is sent again at the next poll (the
        event id is the same: the stream and the journal keep one)."""
        mark = f"{record.take}.{record.turn}"
        if record.taken_announced == mark:
            return
        await self._bus.publish(self._taken_event(record))

        def announced(cur: TaskRecord) -> TaskRecord | None:
            if (cur.take, cur.turn) != (record.take, record.turn) or cur.taken_announced == mark:
                return None  # taken again or moved on meanwhile: that poll announces its own
            return evolve(cur, taken_announced=mark)

        await self._tasks.modify(key, announced, attempts=MODIFY_ATTEMPTS)

    def _taken_event(self, record: TaskRecord) -> Envelope:
        data = AgentTaskTaken(
            run_id=record.run_id,
            task_id=record.task_id,
            agent_id=record.agent_id,
            turn=record.turn,
            take=record.take,
            session_id=record.session_id or "",
            resumed=record.take > 1,
            checkpoint_id=record.checkpoint_id,
        )
        return self._event(record, data, "taken", str(record.take), str(record.turn))

    def _acted_event(self, record: TaskRecord, action: StoredAction) -> Envelope:
        detail = action.result if action.kind == "result" else action.error if action.kind == "failure" else ""
        tools = [call.name for call in action.calls]
        if action.handoff is not None:
            detail, tools = f"to {action.handoff.agent}: {action.handoff.objective}", [HANDOFF_TOOL]
        data = AgentTaskActed(
            run_id=record.run_id,
            task_id=record.task_id,
            agent_id=record.agent_id,
            turn=action.turn,
            action_id=action.action_id,
            kind=action.kind,
            tools=tools,
            detail=(detail or "")[:4096],
        )
        return self._event(record, data, "acted", str(action.turn), turn=action.turn)

    async def _malformed(self, agent_id: str, raw: bytes, detail: str) -> None:
        """A task action whose body its schema refuses (a ``result`` without ``result``, a ``handoff`` without its
        document): journaled ``agent.task.refused`` ``malformed_request`` like every other refused action, before
        the reply. The same body again is the same event (its id is the body's digest)."""
        turn: Any = json_field(raw, "turn")
        data = AgentTaskRefused(
            agent_id=agent_id,
            task_id=claimed(raw, "task_id") or None,
            turn=turn if isinstance(turn, int) and not isinstance(turn, bool) else None,
            action_id=claimed(raw, "action_id") or None,
            kind=claimed(raw, "kind") or None,
            reason="malformed_request",
            detail=f"malformed request: {detail}"[:4096],
        )
        seen = json.dumps([agent_id, hashlib.sha256(raw).hexdigest(), "malformed_request"])
        await self._bus.publish(
            make_event(
                data,
                source=SOURCE,
                id=derive_id("evt", "agent.task.refused", hashlib.sha256(seen.encode()).hexdigest()),
                subject=agent_id,
                actor=f"agent:{agent_id}",
            )
        )
        log.info("agent_task.refused", reason="malformed_request", kind=data.kind)

    @staticmethod
    def _refused_event(body: TaskAction, refused: TaskRefused) -> Envelope:
        """``agent.task.refused``: the same message refused for the same reason is one event."""
        seen = json.dumps([body.agent_id, body.task_id, body.turn, body.action_id, body.kind, refused.reason])
        data = AgentTaskRefused(
            agent_id=body.agent_id,
            task_id=body.task_id,
            turn=body.turn,
            action_id=body.action_id,
            kind=body.kind,
            reason=refused.reason,
            detail=refused.detail[:4096],
        )
        return make_event(
            data,
            source=SOURCE,
            id=derive_id("evt", "agent.task.refused", hashlib.sha256(seen.encode()).hexdigest()),
            subject=body.agent_id,
            actor=f"agent:{body.agent_id}",
        )


#: One subject token (an agent id, a task id): what a ``task.<agent id>.<task id>`` key is made of.
_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")
#: A run id as a KV key token (``run.<run id>``; relay run ids contain ``/``).
_RUN_TOKEN = re.compile(r"^[-/_=.a-zA-Z0-9]+$")


def _check_keys(offer: AgentTaskOffered) -> None:
    """An offer whose ids cannot make its record's keys can never be stored: a :class:`PermanentError` (dead-lettered
    at once, naming the id), not a KV error retried until the deliveries run out."""
    for name, value, pattern in (
        ("agent_id", offer.agent_id, _TOKEN),
        ("task_id", offer.task_id, _TOKEN),
        ("run_id", offer.run_id, _RUN_TOKEN),
    ):
        if not pattern.fullmatch(value) or value.startswith(".") or value.endswith("."):
            raise PermanentError(f"agent.task.offered: {name} {value[:128]!r} cannot be part of a KV key")
