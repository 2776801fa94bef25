"""The tasks of external agents as agent-collab keeps them in KV ``agent-tasks`` (AP-5, AP-7): the record the
run-executor reads to learn an agent's action for a run's turn. agent-collab alone writes it.

Keys: ``task.<agent id>.<task id>`` (:class:`TaskRecord`), ``run.<run id>`` (:class:`TaskRef`: which task a run
has), ``ckpt.<task id>`` (:class:`~temporality_protocol.events.StoredCheckpoint`: the agent's last checkpoint).
A run has one task, its id derived from the run id (:func:`task_id_for`).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from temporality_protocol.events import AgentTask, TaskHandoff, TaskInput, TaskToolCall
from temporality_protocol.ids import derive_id
from temporality_protocol.states import AGENT_TASK, AgentTaskState

__all__ = [
    "HANDOFF_TO_AGENT",
    "StoredAction",
    "TaskRecord",
    "TaskRef",
    "checkpoint_key",
    "external_call_id",
    "handoff_ids",
    "run_key",
    "task_id_for",
    "task_key",
    "turn_wait_id",
]


#: The tool a handoff is (AP-6), a hosted model's call or an external agent's ``handoff`` action.
HANDOFF_TO_AGENT = "handoff_to_agent"


def external_call_id(turn: int, index: int) -> str:
    """The tool call id the run-executor gives call ``index`` of an external agent's action on ``turn`` (a
    ``handoff`` action is call 0)."""
    return f"ext-{turn}-{index}"


def handoff_ids(run_id: str, call_id: str) -> tuple[str, str]:
    """AP-6: ``(handoff id, child run id)`` of the ``handoff_to_agent`` call ``call_id`` of the run -- the same
    on every retry or replay of the call, so it never makes two children. agent-collab tells an external agent
    its handoff's child from it (``TaskActionReply.child_run_id``) before the run-executor has carried it out."""
    return derive_id("ho", run_id, HANDOFF_TO_AGENT, call_id), derive_id("run", run_id, HANDOFF_TO_AGENT, call_id)


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class StoredAction(_Model):
    """One turn-closing action the agent sent (tool calls, a result, a failure or a handoff)."""

    turn: int
    action_id: str
    kind: str
    calls: list[TaskToolCall] = Field(default_factory=list)
    result: str | None = None
    error: str | None = None
    #: ``handoff`` (AP-6): the target and the document; the run carries it out as ``handoff_to_agent``.
    handoff: TaskHandoff | None = None
    #: The task's take (:attr:`TaskRecord.take`) it was sent under: a later take resumed after it.
    take: int = 1
    at: datetime


class TaskRecord(_Model):
    """``task.<agent id>.<task id>``: the dialogue of one task (:data:`~temporality_protocol.states.AGENT_TASK`)."""

    agent_id: str
    task_id: str
    run_id: str
    #: The run's saga (the streaming events carry it, AP-9).
    correlation_id: str
    task: AgentTask
    state: AgentTaskState = AgentTaskState.OFFERED
    #: The turn open now (offered, taken, or acted on and waiting for its tools).
    turn: int = 1
    #: When agent-collab recorded the offer of :attr:`turn` (``None``: a record from before this field): the
    #: start of the agent's working time when the run-executor finds the turn's action already stored at the offer.
    offered_at: datetime | None = None
    #: The outcomes of the last action's tool calls, handed to the agent with the open turn.
    inputs: list[TaskInput] = Field(default_factory=list)
    #: Agent messages delivered to the run at the open turn's boundary (COL-4), handed to the agent with it.
    messages: list[str] = Field(default_factory=list)
    #: Every turn-closing action, oldest first (one per turn).
    actions: list[StoredAction] = Field(default_factory=list)
    #: The agent process that holds it, and how many times it was taken (> 1: resumed, AP-8).
    session_id: str | None = None
    take: int = 0
    #: ``<take>.<turn>`` of the last ``agent.task.taken`` known to be published: a poll publishes it until
    #: this says so (a publish that failed after the take was stored is sent again, never lost).
    taken_announced: str | None = None
    #: The turn of the last action whose ``agent.task.acted`` is known published (``None``: none yet, or a record
    #: from before this field): an action stored but not announced -- agent-collab died between the two -- is
    #: announced at agent-collab's next start, so the run parked on it wakes then, not at its timer.
    acted_announced: int | None = None
    checkpoint_id: str | None = None
    #: Why it ended, when it ended without the agent's result or failure (the run was cancelled, ...).
    ended: str | None = None
    #: A task cancelled with its run: handed to the agent once (``state: cancelled`` in a task poll) so it stops.
    cancel_told: bool = False
    created_at: datetime
    updated_at: datetime

    @property
    def over(self) -> bool:
        return self.state in AGENT_TASK.terminal

    def action_for(self, turn: int) -> StoredAction | None:
        return next((a for a in self.actions if a.turn == turn), None)


class TaskRef(_Model):
    """``run.<run id>``: the task a run has."""

    agent_id: str
    task_id: str


def task_id_for(run_id: str) -> str:
    """A run's task id: stable across retries and replays (one task per run)."""
    return derive_id("task", run_id)


def task_key(agent_id: str, task_id: str) -> str:
    return f"task.{agent_id}.{task_id}"


def run_key(run_id: str) -> str:
    return f"run.{run_id}"


def checkpoint_key(task_id: str) -> str:
    return f"ckpt.{task_id}"


def turn_wait_id(task_id: str, turn: int) -> str:
    """What a run parked on its external agent's action for ``turn`` waits on (the run record's
    ``waiting_request_id``): one id per task and turn, so a wake-up for another turn is told apart."""
    return f"{task_id}.turn-{turn}"
