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
   record holds the agent's action for this turn, reading the record every :data:`POLL_S`: ``tool_calls``
   become the turn's tool calls, ``result`` the final answer, ``failure`` a failed run (``provider_error``).
   An action already stored (a replay after a crash) is used at once: no second question, no second result.
3. While it waits, a new *take* of the task under another agent session since the last turn's action (the
   agent crashed and came back with its checkpoint, AP-8) is announced as ``run.resumed`` (``reason:
   recovery``; id from the take): the run continues with the recovered agent. A run parked on a person when
   its agent comes back stays ``waiting_for_human``; its ``run.resumed`` (recovery) follows the answer's, when
   the run next waits for the agent.

The wait is bounded by the run's remaining compute budget (the card's ``limits.max_compute_s``): an agent that
is offline (or never comes) does not hold the run forever; past it the run fails ``provider_error``. A kill of
the executor mid-wait loses nothing: the message comes back, the turn is offered again (deduplicated) and the
wait resumes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from temporality_bus import Bus, Store
from temporality_protocol import AgentTask, AgentTaskOffered, RunResumed, TaskInput
from temporality_protocol.agent_tasks import StoredAction, TaskRecord, task_id_for, task_key
from temporality_protocol.catalog import BUCKET_AGENT_TASKS
from temporality_run_executor.machine import Agent, CallProvider, ProviderFailed, ProviderReplied
from temporality_run_executor.providers.base import AssistantTurn
from temporality_run_executor.records import Message, RunRecord, ToolCall

__all__ = ["POLL_S", "ExternalAgents", "inputs_of", "task_of", "turn_of"]

log = structlog.get_logger(__name__)

#: How often the waiting executor reads the task's record.
POLL_S = 0.1
Emit = Callable[..., Awaitable[None]]
_PRIORITIES = ("low", "normal", "high")


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
    """The engine's provider call for external cards. ``emit(run, data, *id_parts)`` publishes a run's event."""

    def __init__(self, bus: Bus, emit: Emit, *, poll_s: float = POLL_S) -> None:
        self._bus = bus
        self._emit = emit
        self._poll_s = poll_s
        self._store: Store[TaskRecord] | None = None

    async def _tasks(self) -> Store[TaskRecord]:
        if self._store is None:
            self._store = await self._bus.store(BUCKET_AGENT_TASKS, TaskRecord)
        return self._store

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
            while True:
                record = found.value if found is not None else None
                if record is not None:
                    announced = await self._announce_takes(run, record, call.turn, announced)
                    action = record.action_for(call.turn)
                    if action is not None:
                        return self._reply(call, action, time.monotonic() - started)
                    if record.over:
                        return ProviderFailed(
                            turn=call.turn, error=f"the task ended ({record.state.value})", permanent=True
                        )
                if time.monotonic() >= deadline:
                    detail = (
                        f"external agent {external_id} did not act on turn {call.turn} within {call.budget_s:.0f} s"
                    )
                    log.warning("external.no_action", budget_s=call.budget_s)
                    return ProviderFailed(turn=call.turn, error=detail, permanent=True)
                await asyncio.sleep(self._poll_s)
                found = await tasks.get(key)

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
