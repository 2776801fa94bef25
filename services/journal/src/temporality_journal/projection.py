"""How each event moves a run row. Pure: no I/O, no clock (the recorder does the SQL).

=======================  ==================================================================
event                    effect on the run (``run_id``: the envelope's, else ``data.run_id``)
=======================  ==================================================================
run.requested            created ``pending`` with agent, title, trigger id, launch kind and, for
                         a rerun, ``rerun_of`` / ``rerun_requested_by`` (``launch.rerun_of`` /
                         ``launch.requested_by``); on an existing row only blank fields are filled
run.created              same as run.requested
run.started              ``running``, ``started_at``
human.requested          ``waiting_for_human``: request id, recipient, question, since =
                         the event's time; one more while the run already waits on another
                         (HUM-7: several questions of one turn) makes the wait *several*:
                         no single request id, the recipients and questions joined, the
                         channel unknown, ``since`` unchanged
human.notified           ``waiting_channel``, for the request the run waits on
human.answered/expired   ``resuming`` (RUN-3: waiting -> resuming -> running), for the
                         request the run waits on; on a several-wait nothing (the run
                         resumes when the executor says so: ``run.resumed``)
agent.asked (mode wait)  ``waiting_for_agent`` (``ask_agent`` with ``mode=wait``, COL-2): request id,
                         recipient = the address as the model wrote it (``agent:<id>``,
                         ``run:<id>``), question = the message, since = the event's time,
                         no channel; an ``async`` ask moves nothing
agent.answer.received,   ``resuming``, for the request the run waits on (an answer that comes
agent.ask_expired,       after the wait expired, ``late``, ends nothing: the expiry did)
agent.ask_undeliverable
agent.task.offered       ``waiting_for_agent`` on the run's *own* external agent (AP-5: a card with
                         ``provider.kind: external``; the run-executor parks the run while the agent
                         works on the turn): request id = the turn's wait id
                         (``<task id>.turn-<n>``, :func:`~temporality_protocol.agent_tasks.turn_wait_id`,
                         what the executor's record waits on), recipient = ``agent:<agent id>``,
                         question = the task's objective, since = the event's time, no channel
agent.task.acted         ``resuming``, for the turn the run waits on (the agent's action wakes it;
                         its ``run.resumed`` follows)
run.resumed              ``running`` -- except ``reason: recovery`` while the run waits on its own
                         external agent's turn: the agent took the task again (AP-8) or the
                         executor recovered the turn it offers again; the run still waits on it
run.completed            ``completed``, ``finished_at``, ``result``
run.failed               ``failed``, ``finished_at``, ``error`` = "<reason>: <error>"
run.cancelled            ``cancelled``, ``finished_at``, ``error`` = the reason
anything else            nothing (the recorder stores it; no run moves)
=======================  ==================================================================

What keeps the projection right under redelivery and out-of-order delivery:

- a terminal run (completed, failed, cancelled) never changes state again (a late event may only
  fill a blank descriptive field);
- an event not newer (by stream sequence) than the run's ``last_event_seq`` never changes the
  state; it may still fill blank descriptive fields (``agent``, ``title``, ``started_at`` …);
- a terminal event applies whatever its sequence: a run that ended has ended;
- ``waiting_*`` is set exactly while the state is ``waiting_for_human`` or ``waiting_for_agent``
  (``waiting_request_id`` is ``None`` while the run waits on several human requests at once, HUM-7;
  ``waiting_channel`` is set only for a person, once notified);
- projecting the same event twice gives the same row.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

from pydantic import ValidationError

from temporality_journal.models import RunSnapshot, as_utc, constructed, same, updated
from temporality_protocol import (
    RUN,
    AgentAnswerReceived,
    AgentAsked,
    AgentAskExpired,
    AgentAskUndeliverable,
    AgentTaskActed,
    AgentTaskOffered,
    Envelope,
    EventData,
    HumanAnswered,
    HumanExpired,
    HumanNotified,
    HumanRequested,
    InvalidEnvelope,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunRequested,
    RunResumed,
    RunStarted,
    RunState,
)
from temporality_protocol.agent_tasks import task_id_for, turn_wait_id

__all__ = ["PROJECTED_TYPES", "project", "project_onto", "run_id_of"]

#: The data models of the event types that move runs.
_PROJECTED_MODELS: tuple[type[EventData], ...] = (
    RunRequested,
    RunCreated,
    RunStarted,
    HumanRequested,
    HumanNotified,
    HumanAnswered,
    HumanExpired,
    AgentAsked,
    AgentAnswerReceived,
    AgentAskExpired,
    AgentAskUndeliverable,
    AgentTaskOffered,
    AgentTaskActed,
    RunResumed,
    RunCompleted,
    RunFailed,
    RunCancelled,
)
#: The event types that move runs; every other type is stored and projected nowhere.
PROJECTED_TYPES: frozenset[str] = frozenset(m.EVENT_TYPE for m in _PROJECTED_MODELS)
#: The data model of each projected type (what ``Envelope.payload`` validates ``data`` with).
_MODELS: dict[str, type[EventData]] = {m.EVENT_TYPE: m for m in _PROJECTED_MODELS}
#: The states in which a run waits on a request (and the ``waiting_*`` fields say which).
_WAITING_STATES = frozenset({RunState.WAITING_FOR_HUMAN, RunState.WAITING_FOR_AGENT})

_TERMINAL = RUN.terminal  # a property that builds the set on every call
_WAITING_CLEARED: dict[str, Any] = {
    "waiting_request_id": None,
    "waiting_recipient": None,
    "waiting_channel": None,
    "waiting_since": None,
    "waiting_question": None,
}


class _Fact(NamedTuple):
    """What the projection reads of an event besides its data (a tuple: a frozen dataclass cost ~1 us more per
    event to build)."""

    run_id: str
    time: datetime
    seq: int


def run_id_of(event: Envelope) -> str | None:
    """The run an event belongs to: the ``runid`` attribute, else a string ``data.run_id``."""
    if event.runid:
        return event.runid
    value = event.data.get("run_id")
    return value if isinstance(value, str) and value else None


def project(current: RunSnapshot | None, event: Envelope, stream_seq: int) -> RunSnapshot | None:
    """The run after ``event``; ``None`` when the event changes nothing (or belongs to no run).

    ``current`` is the run's row (``None`` when there is none yet). Raises
    :class:`temporality_protocol.InvalidEnvelope` when a projected type carries invalid ``data``.
    """
    run_id = run_id_of(event)
    if run_id is None or event.type not in PROJECTED_TYPES:
        return None
    if current is not None and current.run_id != run_id:
        raise ValueError(f"event {event.id} belongs to run {run_id}, not {current.run_id}")
    return project_onto(current, event, stream_seq, run_id)


def project_onto(current: RunSnapshot | None, event: Envelope, stream_seq: int, run_id: str) -> RunSnapshot | None:
    """:func:`project` for an event the caller knows to be of a projected type (:data:`PROJECTED_TYPES`) and of
    run ``run_id`` (:func:`run_id_of`), ``current`` that run's row or ``None``: the recorder's batch, which
    checked both once per event already. The run after ``event``, or ``None`` when it changes nothing."""
    data = _payload(event)
    fact = _Fact(run_id, as_utc(event.time), stream_seq)
    base = current if current is not None else _blank(fact)
    after = _apply(base, data, fact)
    if after is None or (current is not None and same(after, current)):
        return None
    return after


def _payload(event: Envelope) -> EventData:
    """``event.payload()`` for a projected type: its data model's validator called directly (pydantic's
    ``model_validate`` wrapper and the payload's catalogue look-up cost ~0.5 us per event), the same
    :class:`~temporality_protocol.InvalidEnvelope` on invalid data."""
    model = _MODELS[event.type]
    try:
        return model.__pydantic_validator__.validate_python(event.data)  # type: ignore[no-any-return]
    except ValidationError as exc:
        raise InvalidEnvelope(f"event {event.id} ({event.type}) has invalid data: {exc}") from exc


def _apply(run: RunSnapshot, data: EventData, fact: _Fact) -> RunSnapshot | None:
    # Each case builds one update and copies the run once (:func:`_touch`): the values come from
    # validated event data, so nothing is validated again. Dispatched on the exact data model (what
    # ``Envelope.payload`` returns): a ``match`` of class patterns paid an ABC ``isinstance`` per case.
    case = _CASES.get(type(data))
    return None if case is None else case(run, data, fact)


def _requested(run: RunSnapshot, data: RunRequested | RunCreated, fact: _Fact) -> RunSnapshot | None:
    fill = _blanks(
        run,
        agent=data.agent,
        title=data.title,
        trigger_id=data.launch.trigger_id,
        launch_kind=data.launch.kind,
        rerun_of=data.launch.rerun_of,
        rerun_requested_by=data.launch.requested_by,
    )
    if fact.time < run.created_at:
        fill["created_at"] = fact.time
    return _touch(run, fact, fill)


def _started(run: RunSnapshot, data: RunStarted, fact: _Fact) -> RunSnapshot | None:
    fill = _blanks(run, agent=data.agent, title=data.title, started_at=fact.time)
    return _move(run, fact, RunState.RUNNING, fill)


def _human_requested(run: RunSnapshot, data: HumanRequested, fact: _Fact) -> RunSnapshot | None:
    if _also_asked(run, data.request_id, fact):
        return _touch(
            run,
            fact,
            {
                "waiting_request_id": None,
                "waiting_recipient": _joined(run.waiting_recipient, data.recipient, ", "),
                "waiting_question": _joined(run.waiting_question, data.question, " | "),
                "waiting_channel": None,
            },
        )
    return _move(
        run,
        fact,
        RunState.WAITING_FOR_HUMAN,
        _blanks(run, agent=data.agent, title=data.title),
        waiting_request_id=data.request_id,
        waiting_recipient=data.recipient,
        waiting_question=data.question,
        waiting_since=fact.time,
        waiting_channel=None,
    )


def _human_notified(run: RunSnapshot, data: HumanNotified, fact: _Fact) -> RunSnapshot | None:
    if not _waits_on(run, data.request_id) or (run.waiting_channel is not None and _stale(run, fact)):
        return None
    return _touch(run, fact, {"waiting_channel": data.channel})


def _human_done(run: RunSnapshot, data: HumanAnswered | HumanExpired, fact: _Fact) -> RunSnapshot | None:
    if not _waits_on(run, data.request_id):
        return None
    return _move(run, fact, RunState.RESUMING, {})


def _agent_asked(run: RunSnapshot, data: AgentAsked, fact: _Fact) -> RunSnapshot | None:
    if data.mode != "wait":
        return None
    return _move(
        run,
        fact,
        RunState.WAITING_FOR_AGENT,
        _blanks(run, agent=data.asker_agent),
        waiting_request_id=data.request_id,
        waiting_recipient=data.to,
        waiting_question=data.message,
        waiting_since=fact.time,
        waiting_channel=None,
    )


def _agent_done(
    run: RunSnapshot, data: AgentAnswerReceived | AgentAskExpired | AgentAskUndeliverable, fact: _Fact
) -> RunSnapshot | None:
    late = isinstance(data, AgentAnswerReceived) and (data.late or data.mode != "wait")
    if late or not _waits_on(run, data.request_id, RunState.WAITING_FOR_AGENT):
        return None
    return _move(run, fact, RunState.RESUMING, {})


def _task_offered(run: RunSnapshot, data: AgentTaskOffered, fact: _Fact) -> RunSnapshot | None:
    return _move(
        run,
        fact,
        RunState.WAITING_FOR_AGENT,
        {},
        waiting_request_id=turn_wait_id(data.task_id, data.turn),
        waiting_recipient=f"agent:{data.agent_id}",
        waiting_question=data.task.objective[:_JOINED_MAX],
        waiting_since=fact.time,
        waiting_channel=None,
    )


def _task_acted(run: RunSnapshot, data: AgentTaskActed, fact: _Fact) -> RunSnapshot | None:
    if not _waits_on(run, turn_wait_id(data.task_id, data.turn), RunState.WAITING_FOR_AGENT):
        return None
    return _move(run, fact, RunState.RESUMING, {})


def _resumed(run: RunSnapshot, data: RunResumed, fact: _Fact) -> RunSnapshot | None:
    if data.reason == "recovery" and _waits_on_own_agent(run):
        return _touch(run, fact, {})  # AP-8: the agent took the task again; the run still waits on its action
    return _move(run, fact, RunState.RUNNING, {})


def _waits_on_own_agent(run: RunSnapshot) -> bool:
    """The run is parked on its own external agent's turn (``agent.task.offered``), not on an ``ask_agent``."""
    wait = run.waiting_request_id
    return (
        run.state == RunState.WAITING_FOR_AGENT
        and wait is not None
        and wait.startswith(f"{task_id_for(run.run_id)}.turn-")
    )


def _completed(run: RunSnapshot, data: RunCompleted, fact: _Fact) -> RunSnapshot | None:
    return _finish(run, fact, RunState.COMPLETED, result=data.result)


def _failed(run: RunSnapshot, data: RunFailed, fact: _Fact) -> RunSnapshot | None:
    return _finish(run, fact, RunState.FAILED, error=f"{data.reason}: {data.error}")


def _cancelled(run: RunSnapshot, data: RunCancelled, fact: _Fact) -> RunSnapshot | None:
    return _finish(run, fact, RunState.CANCELLED, error=data.reason)


#: What each projected data model does to a run (exactly the models of :data:`PROJECTED_TYPES`).
_CASES: dict[type[EventData], Callable[[RunSnapshot, Any, _Fact], RunSnapshot | None]] = {
    RunRequested: _requested,
    RunCreated: _requested,
    RunStarted: _started,
    HumanRequested: _human_requested,
    HumanNotified: _human_notified,
    HumanAnswered: _human_done,
    HumanExpired: _human_done,
    AgentAsked: _agent_asked,
    AgentAnswerReceived: _agent_done,
    AgentAskExpired: _agent_done,
    AgentAskUndeliverable: _agent_done,
    AgentTaskOffered: _task_offered,
    AgentTaskActed: _task_acted,
    RunResumed: _resumed,
    RunCompleted: _completed,
    RunFailed: _failed,
    RunCancelled: _cancelled,
}


#: A new run's fields before its first event: every field ``None`` but those :func:`_blank` sets.
_BLANK: dict[str, Any] = dict.fromkeys(RunSnapshot.model_fields)


def _blank(fact: _Fact) -> RunSnapshot:
    """A new run (``pending``, created and updated at the event's time), not validated: its values are the
    event's validated id and aware UTC time (validating the snapshot cost ~8 us, once per run)."""
    return constructed(
        RunSnapshot,
        {**_BLANK, "run_id": fact.run_id, "state": RUN.initial, "created_at": fact.time, "updated_at": fact.time},
    )


def _stale(run: RunSnapshot, fact: _Fact) -> bool:
    return run.last_event_seq is not None and fact.seq <= run.last_event_seq


def _also_asked(run: RunSnapshot, request_id: str, fact: _Fact) -> bool:
    """HUM-7: a further question of the turn the run is parked on (it already waits on another request)."""
    return run.state == RunState.WAITING_FOR_HUMAN and run.waiting_request_id != request_id and not _stale(run, fact)


#: A several-wait's joined ``waiting_question`` is cut to this many characters.
_JOINED_MAX = 4096


def _joined(shown: str | None, more: str, sep: str) -> str:
    """``shown`` with ``more`` added (once), cut to :data:`_JOINED_MAX` characters."""
    parts = shown.split(sep) if shown else []
    return sep.join([*parts, more] if more not in parts else parts)[:_JOINED_MAX]


def _waits_on(run: RunSnapshot, request_id: str, state: RunState = RunState.WAITING_FOR_HUMAN) -> bool:
    return run.state == state and run.waiting_request_id == request_id


def _blanks(run: RunSnapshot, **values: Any) -> dict[str, Any]:
    """The ``values`` for the fields that are still blank."""
    return {k: v for k, v in values.items() if v is not None and getattr(run, k) is None}


def _touch(run: RunSnapshot, fact: _Fact, update: dict[str, Any]) -> RunSnapshot:
    """``run`` with ``update``, noting that ``fact`` was applied (``updated_at``, ``last_event_seq``)
    unless the run is terminal (terminal runs only take ``update``, blank fields filled)."""
    if update.get("state", run.state) not in _TERMINAL:
        last = fact.seq if run.last_event_seq is None else max(run.last_event_seq, fact.seq)
        update = {**update, "updated_at": max(run.updated_at, fact.time), "last_event_seq": last}
    return updated(run, update) if update else run


def _move(run: RunSnapshot, fact: _Fact, state: RunState, fill: dict[str, Any], **fields: Any) -> RunSnapshot:
    """``state`` (with ``fields``) unless the run is terminal or ``fact`` is stale; ``fill`` either way."""
    if run.state in _TERMINAL or _stale(run, fact):
        return _touch(run, fact, fill)
    update: dict[str, Any] = {**fill, "state": state}
    if state not in _WAITING_STATES:
        update.update(_WAITING_CLEARED)
    update.update(fields)
    return _touch(run, fact, update)


def _finish(run: RunSnapshot, fact: _Fact, state: RunState, **fields: Any) -> RunSnapshot | None:
    if run.state in _TERMINAL:
        return None
    last = fact.seq if run.last_event_seq is None else max(run.last_event_seq, fact.seq)
    return updated(
        run,
        {
            "updated_at": max(run.updated_at, fact.time),
            "last_event_seq": last,
            "state": state,
            "finished_at": fact.time,
            **_WAITING_CLEARED,
            **fields,
        },
    )
