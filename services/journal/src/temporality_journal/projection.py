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
run.completed            ``completed``, ``finished_at``, ``result``, ``usage_*`` (``usage``)
run.failed               ``failed``, ``finished_at``, ``error`` = "<reason>: <error>", ``usage_*``
run.cancelled            ``cancelled``, ``finished_at``, ``error`` = the reason, ``usage_*``
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

from temporality_journal.models import RunSnapshot, as_utc, constructed, updated
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
from temporality_protocol.events import RunUsage

__all__ = ["PROJECTED_TYPES", "project", "project_onto", "run_id_of", "update_onto"]

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
    run ``run_id`` (:func:`run_id_of`), ``current`` that run's row or ``None``. The run after ``event``, or ``None``
    when it changes nothing."""
    found = update_onto(current, event, stream_seq, run_id)
    if found is None:
        return None
    run, update = found
    if current is not None and not _changes(current, update):
        return None
    return updated(run, update) if update else run


def update_onto(
    current: RunSnapshot | None, event: Envelope, stream_seq: int, run_id: str
) -> tuple[RunSnapshot, dict[str, Any]] | None:
    """What ``event`` does to its run (the caller checked its type and run, as for :func:`project_onto`): the row
    it applies to -- ``current``, or a new run's blank row when ``current`` is ``None`` -- and the fields it sets
    there (some perhaps to the value they have), for the caller to apply: :func:`~temporality_journal.models.updated`,
    or in place on a row of its own (the recorder's batch copies a run once per batch, not once per event).
    ``None`` when the event leaves the run as it is. Raises :class:`temporality_protocol.InvalidEnvelope` on
    invalid ``data``."""
    validate, case = _STEPS[event.type]
    try:
        data = validate(event.data)
    except ValidationError as exc:
        raise InvalidEnvelope(f"event {event.id} ({event.type}) has invalid data: {exc}") from exc
    fact = _Fact(run_id, as_utc(event.time), stream_seq)
    base = current if current is not None else _blank(fact)
    # the case builds one update (a new dict, which the helpers below add to) and copies nothing: the values come
    # from validated event data, so nothing is validated again
    update = case(base, data, fact)
    return None if update is None else (base, update)


def _changes(run: RunSnapshot, update: dict[str, Any]) -> bool:
    """Whether ``update`` sets a field of ``run`` to another value (what :func:`~temporality_journal.models.same`
    of the copy and ``run`` would tell, without making the copy). A name that is not a field is a bug:
    :class:`ValueError`."""
    if not update.keys() <= _FIELDS:
        raise ValueError(f"RunSnapshot has no field {sorted(update.keys() - _FIELDS)}")
    values = run.__dict__
    for name, value in update.items():
        old = values[name]
        if old is not value and old != value:
            return True
    return False


def _requested(run: RunSnapshot, data: RunRequested | RunCreated, fact: _Fact) -> dict[str, Any] | None:
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


def _started(run: RunSnapshot, data: RunStarted, fact: _Fact) -> dict[str, Any] | None:
    fill = _blanks(run, agent=data.agent, title=data.title, started_at=fact.time)
    return _move(run, fact, RunState.RUNNING, fill)


def _human_requested(run: RunSnapshot, data: HumanRequested, fact: _Fact) -> dict[str, Any] | None:
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


def _human_notified(run: RunSnapshot, data: HumanNotified, fact: _Fact) -> dict[str, Any] | None:
    if not _waits_on(run, data.request_id) or (run.waiting_channel is not None and _stale(run, fact)):
        return None
    return _touch(run, fact, {"waiting_channel": data.channel})


def _human_done(run: RunSnapshot, data: HumanAnswered | HumanExpired, fact: _Fact) -> dict[str, Any] | None:
    if not _waits_on(run, data.request_id):
        return None
    return _move(run, fact, RunState.RESUMING, {})


def _agent_asked(run: RunSnapshot, data: AgentAsked, fact: _Fact) -> dict[str, Any] | None:
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
) -> dict[str, Any] | None:
    late = isinstance(data, AgentAnswerReceived) and (data.late or data.mode != "wait")
    if late or not _waits_on(run, data.request_id, RunState.WAITING_FOR_AGENT):
        return None
    return _move(run, fact, RunState.RESUMING, {})


def _task_offered(run: RunSnapshot, data: AgentTaskOffered, fact: _Fact) -> dict[str, Any] | None:
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


def _task_acted(run: RunSnapshot, data: AgentTaskActed, fact: _Fact) -> dict[str, Any] | None:
    if not _waits_on(run, turn_wait_id(data.task_id, data.turn), RunState.WAITING_FOR_AGENT):
        return None
    return _move(run, fact, RunState.RESUMING, {})


def _resumed(run: RunSnapshot, data: RunResumed, fact: _Fact) -> dict[str, Any] | None:
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


def _completed(run: RunSnapshot, data: RunCompleted, fact: _Fact) -> dict[str, Any] | None:
    return _finish(run, fact, RunState.COMPLETED, result=data.result, **_usage(data.usage))


def _failed(run: RunSnapshot, data: RunFailed, fact: _Fact) -> dict[str, Any] | None:
    return _finish(run, fact, RunState.FAILED, error=f"{data.reason}: {data.error}", **_usage(data.usage))


def _cancelled(run: RunSnapshot, data: RunCancelled, fact: _Fact) -> dict[str, Any] | None:
    return _finish(run, fact, RunState.CANCELLED, error=data.reason, **_usage(data.usage))


def _usage(usage: RunUsage | None) -> dict[str, Any]:
    """The ``usage_*`` fields of a terminal event's ``usage`` (none without one: an older executor's event)."""
    if usage is None:
        return {}
    return {
        "usage_turns": usage.turns,
        "usage_tool_calls": usage.tool_calls,
        "usage_prompt_tokens": usage.prompt_tokens,
        "usage_completion_tokens": usage.completion_tokens,
        "usage_total_tokens": usage.total_tokens,
        "usage_samplings": usage.samplings,
    }


#: What each projected data model does to a run (exactly the models of :data:`PROJECTED_TYPES`).
_CASES: dict[type[EventData], Callable[[RunSnapshot, Any, _Fact], dict[str, Any] | None]] = {
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


#: Each projected type's steps: its data model's validator (called directly: pydantic's ``model_validate`` wrapper and
#: ``Envelope.payload``'s catalogue look-up cost ~0.5 us per event; the same model, the same errors) and what its
#: data does to a run (dispatched on the type: a ``match`` of class patterns paid an ABC ``isinstance`` per case).
_STEPS: dict[str, tuple[Callable[[Any], Any], Callable[[RunSnapshot, Any, _Fact], dict[str, Any] | None]]] = {
    event_type: (model.__pydantic_validator__.validate_python, _CASES[model]) for event_type, model in _MODELS.items()
}
#: A new run's fields before its first event: every field ``None`` but those :func:`_blank` sets.
_BLANK: dict[str, Any] = dict.fromkeys(RunSnapshot.model_fields)
_FIELDS = frozenset(_BLANK)


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
    """The ``values`` for the fields that are still blank (a new dict)."""
    current = run.__dict__
    return {k: v for k, v in values.items() if v is not None and current[k] is None}


def _touch(run: RunSnapshot, fact: _Fact, update: dict[str, Any]) -> dict[str, Any]:
    """``update`` (a dict of the caller's own, added to), noting that ``fact`` was applied (``updated_at``,
    ``last_event_seq``) unless the run is terminal (terminal runs only take ``update``, blank fields filled)."""
    if update.get("state", run.state) not in _TERMINAL:
        last = run.last_event_seq
        update["updated_at"] = max(run.updated_at, fact.time)
        update["last_event_seq"] = fact.seq if last is None else max(last, fact.seq)
    return update


def _move(run: RunSnapshot, fact: _Fact, state: RunState, fill: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """``state`` (with ``fields``) unless the run is terminal or ``fact`` is stale; ``fill`` either way (a dict of
    the caller's own, added to)."""
    if run.state in _TERMINAL or _stale(run, fact):
        return _touch(run, fact, fill)
    fill["state"] = state
    if state not in _WAITING_STATES:
        fill.update(_WAITING_CLEARED)
    fill.update(fields)
    return _touch(run, fact, fill)


def _finish(run: RunSnapshot, fact: _Fact, state: RunState, **fields: Any) -> dict[str, Any] | None:
    if run.state in _TERMINAL:
        return None
    last = fact.seq if run.last_event_seq is None else max(run.last_event_seq, fact.seq)
    return {
        "updated_at": max(run.updated_at, fact.time),
        "last_event_seq": last,
        "state": state,
        "finished_at": fact.time,
        **_WAITING_CLEARED,
        **fields,
    }
