"""The saga-participants projection (COL-1), pure: the model, how each event changes it, the reply items.

No I/O here: :func:`apply` takes the current projection and one envelope and returns the next
projection (or ``None`` when nothing changes); :func:`collaborators` turns a projection into the
``get_collaborators`` items. The projector and the responder do the KV reads and writes.

Idempotency does not rest on ``applied_event_ids`` alone: every change is itself idempotent (a
terminal status is final, humans' run ids are a set, ``last_answered_at`` is a maximum), so an
event redelivered after its id fell out of the bounded list still changes nothing.
"""

from __future__ import annotations

import re
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from temporality_bus import evolve
from temporality_protocol import (
    RUN,
    AgentHandedOff,
    Collaborator,
    Envelope,
    HumanAnswered,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    RunState,
)

__all__ = [
    "APPLIED_EVENT_IDS_MAX",
    "HANDLED_TYPES",
    "TASK_MAX",
    "HumanEntry",
    "InvalidKey",
    "RunEntry",
    "RunIndex",
    "SagaParticipants",
    "apply",
    "collaborators",
    "new_saga",
    "run_key",
    "run_of",
    "saga_id_of",
    "saga_key",
]

#: How many applied event ids a saga remembers (redelivery fast path; see the module docstring).
APPLIED_EVENT_IDS_MAX = 512
#: COL-1: a collaborator's ``task`` is the run title cut to this many characters.
TASK_MAX = 200
#: The event types the projection understands (the filter of ``CONSUMERS["agent-collab-runs"]``).
HANDLED_TYPES = frozenset(
    m.EVENT_TYPE for m in (RunStarted, RunCompleted, RunFailed, RunCancelled, HumanAnswered, AgentHandedOff)
)

_KEY_TOKEN = re.compile(r"^[-/_=.a-zA-Z0-9]+$")
_TERMINAL_STATUS: dict[str, RunState] = {
    RunCompleted.EVENT_TYPE: RunState.COMPLETED,
    RunFailed.EVENT_TYPE: RunState.FAILED,
    RunCancelled.EVENT_TYPE: RunState.CANCELLED,
}
_KIND_ORDER = {"agent": 0, "run": 1, "human": 2}


class InvalidKey(ValueError):
    """A saga or run id that cannot be part of a NATS KV key (``[-/_=.a-zA-Z0-9]+``)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class RunEntry(_Model):
    """One run of the saga. ``agent``/``role``/``title`` stay ``None`` until its ``run.started`` is seen."""

    agent: str | None = None
    role: str | None = None
    title: str | None = None
    status: RunState = RunState.PENDING
    parent_run_id: str | None = None
    #: The ``run.started`` event's time: ``agent:<id>`` resolves to the agent's latest-started run (COL-6).
    started_at: datetime | None = None
    #: ``handoff``: the run was started by ``agent.handed_off`` (AP-6), its parent handed it the task.
    relation: str | None = None


class HumanEntry(_Model):
    """A person who answered in this saga: the runs they answered (sorted, unique) and when, last."""

    run_ids: list[str] = Field(default_factory=list)
    last_answered_at: datetime | None = None


class SagaParticipants(_Model):
    """KV ``collab-sagas`` / ``saga.<saga_id>``."""

    saga_id: str
    runs: dict[str, RunEntry] = Field(default_factory=dict)
    humans: dict[str, HumanEntry] = Field(default_factory=dict)
    applied_event_ids: list[str] = Field(default_factory=list)


class RunIndex(_Model):
    """KV ``collab-sagas`` / ``run.<run_id>``: which saga a run belongs to."""

    saga_id: str


# --------------------------------------------------------------------------- keys
def _checked(kind: str, value: str) -> str:
    if not _KEY_TOKEN.fullmatch(value) or value.startswith(".") or value.endswith("."):
        raise InvalidKey(f"{kind} {value!r} cannot be a KV key token ([-/_=.a-zA-Z0-9]+)")
    return value


def saga_key(saga_id: str) -> str:
    return f"saga.{_checked('saga id', saga_id)}"


def run_key(run_id: str) -> str:
    return f"run.{_checked('run id', run_id)}"


# --------------------------------------------------------------------------- events
def run_of(event: Envelope) -> str:
    """The run an event is about: ``data.run_id`` (``parent_run_id`` for ``agent.handed_off``: the handing run,
    whose saga the child joins), else the envelope's ``runid``."""
    key = "parent_run_id" if event.type == AgentHandedOff.EVENT_TYPE else "run_id"
    run_id = event.data.get(key)
    if isinstance(run_id, str) and run_id:
        return run_id
    if event.runid:
        return event.runid
    raise InvalidKey(f"event {event.id} ({event.type}) names no run")


def saga_id_of(event: Envelope) -> str:
    """The saga: the envelope's ``correlationid``, falling back to its run."""
    return event.correlationid or event.runid or run_of(event)


def new_saga(saga_id: str) -> SagaParticipants:
    return SagaParticipants(saga_id=saga_id)


def _human_id(responder: str) -> str | None:
    """``user:alice`` -> ``alice``; a bare id is taken as a user id; other schemes are not humans."""
    scheme, sep, rest = responder.partition(":")
    if not sep:
        return responder or None
    if scheme == "user" and rest:
        return rest
    return None


def _remember(applied: list[str], event_id: str) -> list[str]:
    return [*applied, event_id][-APPLIED_EVENT_IDS_MAX:]


def _next_status(current: RunState, target: RunState) -> RunState:
    """Terminal states are final (the run machine has no way out of them); otherwise the newer fact wins."""
    if current in RUN.terminal:
        return current
    return target


def apply(saga: SagaParticipants, event: Envelope) -> SagaParticipants | None:
    """The projection after ``event``, or ``None`` when it changes nothing (already applied, not ours).

    Raises :class:`temporality_protocol.InvalidEnvelope` when the event's data is invalid.
    """
    if event.type not in HANDLED_TYPES or event.id in saga.applied_event_ids:
        return None
    runs = dict(saga.runs)
    humans = dict(saga.humans)

    if event.type == RunStarted.EVENT_TYPE:
        started = event.payload(RunStarted)
        before = runs.get(started.run_id, RunEntry())
        runs[started.run_id] = evolve(
            before,
            agent=started.agent or None,
            role=started.role or None,
            title=started.title,
            parent_run_id=started.parent_run_id,
            status=_next_status(before.status, RunState.RUNNING),
            started_at=event.time,
        )
    elif event.type in _TERMINAL_STATUS:
        run_id = run_of(event)
        event.payload()  # validate the data even though only its run id and type matter here
        before = runs.get(run_id, RunEntry())
        runs[run_id] = evolve(before, status=_next_status(before.status, _TERMINAL_STATUS[event.type]))
    elif event.type == AgentHandedOff.EVENT_TYPE:  # AP-6: the child joins the saga before it starts
        handed = event.payload(AgentHandedOff)
        before = runs.get(handed.child_run_id, RunEntry())
        runs[handed.child_run_id] = evolve(
            before,
            agent=before.agent or handed.agent,
            parent_run_id=handed.parent_run_id,
            relation="handoff",
        )
    else:  # human.answered
        answered = event.payload(HumanAnswered)
        if answered.run_id not in runs:
            # The answer reached a run we have not seen start: it was waiting and is now resuming.
            runs[answered.run_id] = RunEntry(status=RunState.RESUMING)
        user_id = _human_id(answered.responder)
        if user_id is not None:
            before_h = humans.get(user_id, HumanEntry())
            last = before_h.last_answered_at
            humans[user_id] = HumanEntry(
                run_ids=sorted({*before_h.run_ids, answered.run_id}),
                last_answered_at=event.time if last is None else max(last, event.time),
            )

    return SagaParticipants(
        saga_id=saga.saga_id,
        runs=runs,
        humans=humans,
        applied_event_ids=_remember(saga.applied_event_ids, event.id),
    )


# --------------------------------------------------------------------------- reply items
def _run_item(run_id: str, run: RunEntry) -> Collaborator:
    task = run.title[:TASK_MAX] if run.title is not None else None
    handoff = run.relation == "handoff"
    extra = {"relation": "handoff", "parent_run_id": run.parent_run_id} if handoff else {}
    if run.agent:
        return Collaborator(
            id=f"agent:{run.agent}",
            kind="agent",
            role=run.role,
            task=task,
            status=run.status.value,
            run_id=run_id,
            **extra,
        )
    return Collaborator(
        id=f"run:{run_id}", kind="run", role=run.role, task=task, status=run.status.value, run_id=run_id, **extra
    )


def collaborators(saga: SagaParticipants) -> list[Collaborator]:
    """COL-1 items: one per run (``agent:<id>`` or ``run:<id>``), one per (human, run answered).

    Sorted by kind (agents, runs, humans), then id, then run id: the same projection always gives
    the same list.
    """
    items = [_run_item(run_id, run) for run_id, run in saga.runs.items()]
    items += [
        Collaborator(id=f"human:{user_id}", kind="human", status="answered", run_id=run_id)
        for user_id, human in saga.humans.items()
        for run_id in human.run_ids
    ]
    return sorted(items, key=lambda c: (_KIND_ORDER[c.kind], c.id, c.run_id or ""))
