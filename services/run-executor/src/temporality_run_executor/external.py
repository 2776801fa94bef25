"""Runs executed by an external agent (AP-5): the turn's "provider" is an agent outside the executor.

A card with ``provider: {kind: external, agent_id: <id>}`` is driven by the run machine exactly like a hosted
one -- the run record, its state machine, every ``run.*`` event, the tool loop, ``ask_human`` parking at zero
cost and the answer handed back as the tool result all stay the executor's. Only the provider call differs,
and it never waits for the agent:

1. :meth:`ExternalAgents.complete` (called by the engine where it would call a model) publishes
   ``agent.task.offered`` for the turn (id from the run and the turn: a replay republishes the same event) --
   on turn 1 the AP-5 task (objective, context, constraints, acceptance criteria, timeout, priority), after
   that the outcomes of the agent's last tool calls (``inputs``: the person's answer...), and on any turn the agent
   messages framed at its boundary (``messages``, COL-4: an answer to an async ask, an ask to answer) -- unless the task's
   record in KV ``agent-tasks`` already holds the agent's action for the turn (a replay after a crash: used at
   once, no second question, no second result). agent-collab records the offer; the agent takes it over the
   signed Agent Protocol.
2. No action yet: :class:`~temporality_run_executor.machine.AgentWorking`. The machine **parks** the run
   (``waiting_for_agent`` on :func:`~temporality_protocol.agent_tasks.turn_wait_id`, its lease dropped, the
   handler done and its message acked: no executor slot, no memory, zero compute while the agent works) and
   arms the run's timer (:meth:`~temporality_run_executor.watchdog.RunWatchdog.arm_until`) at its compute
   budget left.
3. agent-collab commits the agent's action, then publishes ``agent.task.acted``; the executor's consumer
   ``run-executor-agents`` gets it and the machine asks for :meth:`ExternalAgents.look`: the action read from
   the record becomes the turn's provider reply -- ``tool_calls`` the turn's tool calls, ``handoff`` one
   ``handoff_to_agent`` call (AP-6: decided by the machine as a hosted model's), ``result`` the final
   answer, ``failure`` a failed run (``provider_error``) -- and the run wakes (``resuming`` -> ``running``,
   one compare-and-set guarded by the wait id, so a duplicate or redelivered wake-up resumes it once). The
   turn's compute is the agent's working time: from the park to the action's time. The timer firing reads the
   record the same way; no action by then: ``compute_timeout``.

A new *take* of the task under another agent session since the last turn's action (the agent crashed and came
back with its checkpoint, AP-8) is announced as ``run.resumed`` (``reason: recovery``; id from the take) when
the executor next reads the task's record for the run: at the offer, or when the action wakes the run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import structlog

from temporality_bus import Bus, Store
from temporality_protocol import AgentTask, AgentTaskOffered, RunResumed, TaskInput
from temporality_protocol.agent_tasks import StoredAction, TaskRecord, external_call_id, task_id_for, task_key
from temporality_protocol.catalog import BUCKET_AGENT_TASKS
from temporality_run_executor.machine import (
    Agent,
    AgentLooked,
    AgentWorking,
    CallProvider,
    LookForAction,
    ProviderFailed,
    ProviderReplied,
    event_id,
)
from temporality_run_executor.providers.base import AssistantTurn
from temporality_run_executor.records import Message, RunRecord, ToolCall
from temporality_run_executor.tools import HANDOFF_TO_AGENT

__all__ = ["ExternalAgents", "agent_elapsed_s", "inputs_of", "messages_of", "task_of", "turn_of"]

log = structlog.get_logger(__name__)

Emit = Callable[..., Awaitable[None]]
_PRIORITIES = ("low", "normal", "high")
Outcome = ProviderReplied | ProviderFailed


def task_of(run: RunRecord, agent: Agent, call: CallProvider) -> AgentTask:
    """AP-5: the task the run gives its external agent."""
    raw = run.input.get("acceptance_criteria")
    handoff = run.input.get("handoff")
    if raw is None and isinstance(handoff, dict):  # a handoff's child (AP-6): the document's criteria
        raw = handoff.get("acceptance_criteria")
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


def messages_of(messages: list[Message]) -> list[str]:
    """The agent messages (COL-4) delivered at this turn's boundary: the user messages framed into the
    conversation after the last assistant message (on turn 1, after the run's first input)."""
    last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=None)
    if last is None:
        last = next((i for i, m in enumerate(messages) if m.role == "user"), len(messages))
    return [m.content for m in messages[last + 1 :] if m.role == "user" and m.content]


def turn_of(action: StoredAction) -> AssistantTurn | str:
    """The action as the machine's provider reply; a failure is its error text."""
    if action.kind == "tool_calls":
        calls = [
            ToolCall(id=external_call_id(action.turn, i), name=call.name, arguments=call.arguments)
            for i, call in enumerate(action.calls)
        ]
        return AssistantTurn(content=None, tool_calls=calls)
    if action.kind == "handoff" and action.handoff is not None:
        # AP-6: exactly a hosted model's handoff_to_agent call -- the same rules, the same derived ids (from the
        # run and this call id: a replay of the turn is the same handoff and the same child)
        arguments = action.handoff.model_dump(mode="json")
        return AssistantTurn(
            content=None,
            tool_calls=[ToolCall(id=external_call_id(action.turn, 0), name=HANDOFF_TO_AGENT, arguments=arguments)],
        )
    if action.kind == "result":
        return AssistantTurn(content=action.result or "")
    return f"the external agent failed the task: {action.error or '(no reason given)'}"


def agent_elapsed_s(action: StoredAction, since: datetime | None, now: datetime) -> float:
    """The agent's working time on a turn: from the run's park (``since``) to the action (its time, at most
    ``now``). An executor that was down or slow to wake the run adds nothing."""
    if since is None:
        return 0.0
    return max((min(action.at, now) - since).total_seconds(), 0.0)


class ExternalAgents:
    """The engine's provider call for external cards (see the module docstring). ``emit(run, data, *id_parts)``
    publishes a run's event."""

    def __init__(self, bus: Bus, emit: Emit) -> None:
        self._bus = bus
        self._emit = emit
        self._store: Store[TaskRecord] | None = None

    async def _tasks(self) -> Store[TaskRecord]:
        if self._store is None:
            self._store = await self._bus.store(BUCKET_AGENT_TASKS, TaskRecord)
        return self._store

    async def complete(self, run: RunRecord, agent: Agent, call: CallProvider) -> Outcome | AgentWorking:
        """Offer the turn (unless its action is stored) and say what the record holds now -- never wait."""
        external_id = agent.card.provider.agent_id
        assert external_id is not None  # an external card names its agent (validated at load)
        task_id = task_id_for(run.run_id)
        tasks = await self._tasks()
        with structlog.contextvars.bound_contextvars(task_id=task_id, agent=external_id, turn=call.turn):
            found = await tasks.get(task_key(external_id, task_id))
            record = found.value if found is not None else None
            if record is None or record.action_for(call.turn) is None:
                offer = AgentTaskOffered(
                    run_id=run.run_id,
                    task_id=task_id,
                    agent_id=external_id,
                    turn=call.turn,
                    task=task_of(run, agent, call),
                    inputs=inputs_of(call.messages) if call.turn > 1 else [],
                    messages=messages_of(call.messages),
                )
                await self._emit(run, offer, str(call.turn), causation=call.cause)  # what the turn follows from
                log.info("external.turn_offered")
            if record is None:
                return AgentWorking(turn=call.turn, agent_id=external_id)
            # an action already stored (a replay, a driver that died before its park): the agent's time counts
            # from the turn's offer as agent-collab recorded it
            since = record.offered_at if record.turn == call.turn else None
            outcome = await self._decided(run, record, call.turn, since=since)
            return outcome if outcome is not None else AgentWorking(turn=call.turn, agent_id=external_id)

    async def look(self, run: RunRecord, agent: Agent, looking: LookForAction) -> AgentLooked:
        """The agent's action for the turn the run is parked on, read from the task's record (``None``: none yet)."""
        external_id = agent.card.provider.agent_id
        assert external_id is not None
        task_id = task_id_for(run.run_id)
        with structlog.contextvars.bound_contextvars(task_id=task_id, agent=external_id, turn=looking.turn):
            found = await (await self._tasks()).get(task_key(external_id, task_id))
            outcome = None
            if found is not None:
                outcome = await self._decided(run, found.value, looking.turn, since=run.waiting_since)
            log.info("external.looked", acted=outcome is not None, deadline=looking.deadline)
            return AgentLooked(turn=looking.turn, outcome=outcome, deadline=looking.deadline)

    async def _decided(
        self, run: RunRecord, record: TaskRecord, turn: int, *, since: datetime | None
    ) -> Outcome | None:
        """The turn's outcome if the record holds one (the action; the task over without one), announcing the
        takes since the last turn's action (AP-8)."""
        previous = record.action_for(turn - 1)
        await self._announce_takes(run, record, turn, previous.take if previous is not None else 1)
        action = record.action_for(turn)
        if action is not None:
            return self._reply(turn, action, agent_elapsed_s(action, since, datetime.now(UTC)))
        if record.over:
            return ProviderFailed(turn=turn, error=f"the task ended ({record.state.value})", permanent=True)
        return None

    async def _announce_takes(self, run: RunRecord, record: TaskRecord, turn: int, announced: int) -> None:
        """AP-8: every take after the first is the agent resuming from its checkpoint: ``run.resumed``."""
        # the agent took the offered turn up again: what the take follows from is that offer (whichever path reads it)
        offered = event_id(run.run_id, AgentTaskOffered.EVENT_TYPE, str(turn))
        for take in range(announced + 1, record.take + 1):
            resumed = RunResumed(run_id=run.run_id, reason="recovery", from_turn=max(turn - 1, 0))
            await self._emit(run, resumed, "external", record.task_id, str(take), causation=offered)
            log.info("external.agent_resumed", take=take, checkpoint_id=record.checkpoint_id)

    @staticmethod
    def _reply(turn: int, action: StoredAction, elapsed_s: float) -> Outcome:
        reply = turn_of(action)
        if isinstance(reply, str):
            return ProviderFailed(turn=turn, error=reply, permanent=True)
        return ProviderReplied(turn=turn, reply=reply, elapsed_s=elapsed_s)
