"""The registry of external agents (AP-2..AP-4, PRO-2, PRO-3), pure: the record, the decisions, the events.

No I/O here. One record per agent (KV ``agent-registry`` / ``agent.<agent_id>``). Each decision is a
function of the stored record and one request (:func:`registered`, :func:`heartbeat_seen`,
:func:`heartbeat_missed`, :func:`decommissioned`) that :meth:`temporality_bus.Store.modify` runs in its
compare-and-set loop; it moves the lifecycle only along :data:`~temporality_protocol.states.AGENT_LIFECYCLE`
and leaves the moves it made in :attr:`AgentRecord.recent`. After the commit those moves are
journaled (:func:`lifecycle_events`) with ids derived from (agent, incarnation, move number), so
journaling the same record twice -- a retried request, a redelivered timer, a second replica -- is
the same facts twice, which JetStream and the journal drop.

Coalescing (the journal is read by people and kept forever; the record stays exact): the moves an agent makes by
its own requests -- a heartbeat reporting another working state, a re-registration -- are journaled at most once
per agent and ``coalesce_s`` window. Within the window the record moves (``state``, ``seq``) but the move is
only counted (:attr:`AgentRecord.coalesced`); the first heartbeat after the window journals one move from the
state the journal last showed (:attr:`AgentRecord.journaled_state`) to the current one, ``detail`` saying how
many reports it stands for (none when the agent is back where the journal saw it). Moves that matter whatever
the rate -- registration of an incarnation, ``offline``, coming back, deregistration, decommissioning, a
re-registration that changes what the agent declares or is granted -- are always journaled, from the state the
journal last showed. So journaled ``seq`` numbers have gaps where moves were coalesced. Likewise
``agent.registered``: a re-registration that changes only informational fields (``provider``, ``model``, the
list of versions it declares) within the window of the last journaled one is stored, not journaled; the next
heartbeat after the window journals the standing registration (:attr:`AgentRecord.registration_due`).

Liveness: :attr:`AgentRecord.beat` counts registrations and heartbeats of the incarnation. Each one
arms the agent's ``agent-heartbeat`` timer at :attr:`AgentRecord.deadline` carrying that number; a
firing acts only if the record still has it (no newer heartbeat since), like the run watchdog.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from temporality_agent_collab.conformance import (
    DEFAULT_TIMEOUT_S,
    ConformanceRound,
    capability_views,
    checked_event_data,
    checked_event_id,
    evaluate,
    new_round,
    round_closed_by_timer,
)
from temporality_agent_collab.external import AllowList, ExternalAgent
from temporality_protocol import (
    AgentCard,
    AgentLifecycleChanged,
    AgentLimits,
    AgentPolicy,
    AgentReadmitted,
    AgentRefusal,
    AgentRegistered,
    AgentRegistration,
    AgentRegistrationRefused,
    ConformanceAnswers,
    Deregistration,
    Envelope,
    EventData,
    Heartbeat,
    IncompatibleProtocolVersion,
    derive_id,
    make_event,
    negotiate,
)
from temporality_protocol.events import AgentRefusalReason
from temporality_protocol.states import AGENT_LIFECYCLE, AgentLifecycleState
from temporality_protocol.version import parse_version

__all__ = [
    "SOURCE",
    "AgentRecord",
    "AlreadyDecommissioned",
    "Refused",
    "TimerPayload",
    "Transition",
    "agent_key",
    "card",
    "checked_event",
    "conformance_answered",
    "conformance_timed_out",
    "decommissioned",
    "fresh_record",
    "heartbeat_missed",
    "heartbeat_seen",
    "lifecycle_events",
    "negotiated",
    "operator_decommissioned",
    "readmitted",
    "readmitted_event",
    "refused_event",
    "registered",
    "registered_event",
    "timer_payload",
    "utcnow",
]

#: ``source`` of every event agent-collab publishes.
SOURCE = "/temporality/agent-collab"
_L = AgentLifecycleState
LifecycleReason = Literal[
    "registered", "re_registered", "heartbeat", "heartbeat_missed", "came_back", "deregistered", "decommissioned"
]


class Refused(Exception):
    """A request the registry refuses: the reply carries ``reason`` and ``detail`` (PRO-3: explicit)."""

    def __init__(self, reason: AgentRefusalReason, detail: str) -> None:
        super().__init__(detail)
        self.reason: AgentRefusalReason = reason
        self.detail = detail

    def refusal(self) -> AgentRefusal:
        return AgentRefusal(reason=self.reason, detail=self.detail)


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Transition(_Model):
    """One lifecycle move, as journaled in ``agent.lifecycle_changed``."""

    seq: Annotated[int, Field(gt=0)]
    from_state: AgentLifecycleState
    to_state: AgentLifecycleState
    reason: LifecycleReason
    at: datetime
    detail: str = ""
    active_run_id: str | None = None
    #: The operator who made the move (``decommissioned``), else ``None`` (the agent or a timer did).
    requested_by: str | None = None


class AgentRecord(_Model):
    """KV ``agent-registry`` / ``agent.<agent_id>``: one external agent's registration and lifecycle."""

    agent_id: str
    #: Registrations since the last decommissioning are one incarnation; a registration after it starts the next.
    incarnation: Annotated[int, Field(gt=0)] = 1
    #: Accepted registrations of this incarnation (a changed declaration is a new one).
    registration: Annotated[int, Field(gt=0)] = 1
    state: AgentLifecycleState = _L.CREATED
    #: Lifecycle moves of this incarnation (the last one's ``seq``).
    seq: Annotated[int, Field(ge=0)] = 0
    #: The moves the last change made, journaled after its commit.
    recent: list[Transition] = Field(default_factory=list)
    declaration: AgentRegistration
    protocol_version: str
    policy: AgentPolicy
    heartbeat_interval_s: float
    offline_after_s: float
    registered_at: datetime
    #: Registrations and heartbeats of this incarnation: the marker the liveness timer was armed with.
    beat: Annotated[int, Field(ge=0)] = 0
    last_heartbeat_at: datetime | None = None
    #: No heartbeat by then: ``offline``.
    deadline: datetime
    active_run_id: str | None = None
    resource_usage: dict[str, float] = Field(default_factory=dict)
    decommission_reason: str | None = None
    #: The operator who decommissioned this incarnation: while set, registrations are refused
    #: (``decommissioned``) until an operator readmits the agent.
    held_by: str | None = None
    #: Conformance rounds opened in this incarnation (PRO-2), and the latest one (open or ended; ``None``:
    #: none, or the declared capabilities have no probe).
    rounds: Annotated[int, Field(ge=0)] = 0
    conformance: ConformanceRound | None = None
    #: The state the journal last showed (``None``: :attr:`state`, a record from before coalescing).
    journaled_state: AgentLifecycleState | None = None
    #: When a move the agent made by its own request was last journaled (the coalescing window starts there).
    moved_journaled_at: datetime | None = None
    #: The agent's own moves since then that were stored but not journaled.
    coalesced: Annotated[int, Field(ge=0)] = 0
    #: The registration number last journaled (``agent.registered``) and when (``None``: :attr:`registration`).
    journaled_registration: int | None = None
    registration_journaled_at: datetime | None = None
    #: The last change journals ``agent.registered`` for the standing registration.
    registration_due: bool = False

    @property
    def live(self) -> bool:
        """Its liveness timer should be armed (not offline, not decommissioned)."""
        return self.state not in (_L.OFFLINE, _L.DECOMMISSIONED)

    def moved(
        self,
        moves: list[tuple[AgentLifecycleState, LifecycleReason, str]],
        at: datetime,
        *,
        requested_by: str | None = None,
    ) -> list[Transition]:
        """The transitions ``moves`` make from the current state (each checked against the state machine)."""
        out: list[Transition] = []
        state, seq = self.state, self.seq
        for target, reason, detail in moves:
            AGENT_LIFECYCLE.transition(state, target)
            seq += 1
            out.append(
                Transition(
                    seq=seq,
                    from_state=state,
                    to_state=target,
                    reason=reason,
                    at=at,
                    detail=detail,
                    active_run_id=self.active_run_id,
                    requested_by=requested_by,
                )
            )
            state = target
        return out


def _window_passed(at: datetime | None, now: datetime, window_s: float) -> bool:
    return window_s <= 0 or at is None or (now - at).total_seconds() >= window_s


def _journaled(
    current: AgentRecord, moves: list[Transition], now: datetime, *, coalesce: bool, window_s: float
) -> tuple[list[Transition], dict[str, object]]:
    """Of ``moves`` (just made from ``current``), those journaled now, and the record's bookkeeping after them
    (module docstring: coalescing). ``coalesce``: the agent's own, ordinary moves (may wait for the window)."""
    shown = current.journaled_state or current.state
    if not moves:
        return [], {}
    if coalesce and not _window_passed(current.moved_journaled_at, now, window_s):
        return [], {"coalesced": current.coalesced + len(moves)}
    out = list(moves)
    first = out[0]
    if first.from_state is not shown:  # the journal shows another state than the record had (coalesced moves)
        if first.to_state is shown:
            out = out[1:]  # back where the journal saw it: nothing to show for this move
        elif AGENT_LIFECYCLE.allowed(shown, first.to_state):
            detail = first.detail or f"{current.coalesced} earlier state reports coalesced"
            out[0] = Transition.model_validate({**first.model_dump(), "from_state": shown, "detail": detail})
    after: dict[str, object] = {"journaled_state": moves[-1].to_state, "coalesced": 0}
    if coalesce or any(t.reason == "came_back" for t in moves):
        after["moved_journaled_at"] = now
    return out, after


def _flushed(current: AgentRecord, now: datetime, window_s: float) -> tuple[list[Transition], dict[str, object]]:
    """A heartbeat that made no move: the coalesced moves' outcome journaled once the window passed."""
    shown = current.journaled_state or current.state
    if not current.coalesced or not _window_passed(current.moved_journaled_at, now, window_s):
        return [], {}
    after: dict[str, object] = {"journaled_state": current.state, "coalesced": 0, "moved_journaled_at": now}
    if shown is current.state or not AGENT_LIFECYCLE.allowed(shown, current.state):
        return [], after
    move = Transition(
        seq=current.seq,
        from_state=shown,
        to_state=current.state,
        reason="heartbeat",
        at=now,
        detail=f"the latest of {current.coalesced} state reports coalesced",
        active_run_id=current.active_run_id,
    )
    return [move], after


def _registration_flush(current: AgentRecord, now: datetime, window_s: float) -> dict[str, object]:
    """A heartbeat: the standing registration journaled when coalesced ones wait and the window passed."""
    journaled = current.journaled_registration
    waiting = journaled is not None and journaled < current.registration
    if waiting and _window_passed(current.registration_journaled_at, now, window_s):
        return {
            "registration_due": True,
            "journaled_registration": current.registration,
            "registration_journaled_at": now,
        }
    return {"registration_due": False}


def agent_key(agent_id: str) -> str:
    return f"agent.{agent_id}"


def _parseable(versions: list[str]) -> list[str]:
    ok = []
    for version in versions:
        try:
            parse_version(version)
        except ValueError:
            continue  # a version we cannot even read is one we do not speak: ignored, not fatal (PRO-3)
        ok.append(version)
    return ok


def negotiated(request: AgentRegistration, allowed: ExternalAgent) -> str:
    """The highest version common to the request and the allow-list's entry (PRO-3); :class:`Refused` else."""
    ours = allowed.speakable_versions()
    theirs = _parseable(request.declared_versions())
    try:
        return negotiate(ours, theirs)
    except IncompatibleProtocolVersion:
        detail = f"no common protocol version: agent-collab speaks {ours or 'none'} with it, it speaks {theirs}"
        raise Refused("no_common_version", detail) from None


def _policy(request: AgentRegistration, allowed: ExternalAgent) -> AgentPolicy:
    granted = allowed.limits.max_context_size
    context = request.max_context_size if granted is None else min(granted, request.max_context_size)
    tools = [t for t in dict.fromkeys(request.supported_tools) if t in allowed.allowed_tools]
    return AgentPolicy(
        allowed_tools=tools,
        limits=AgentLimits(max_context_size=context, max_concurrent_tasks=allowed.limits.max_concurrent_tasks),
    )


def fresh_record(
    request: AgentRegistration,
    allowed: ExternalAgent,
    allow_list: AllowList,
    *,
    version: str,
    grace_s: float,
    now: datetime,
    incarnation: int = 1,
    conformance_timeout_s: float = DEFAULT_TIMEOUT_S,
    coalesce_s: float = 0.0,
) -> AgentRecord:
    """A new incarnation, ``created`` -> ``registered``, with its first conformance round open (if any of its
    capabilities has a probe)."""
    interval = allow_list.interval_of(allowed)
    rnd = new_round(request.agent_id, incarnation, 1, request.capabilities, now=now, timeout_s=conformance_timeout_s)
    base = AgentRecord(
        agent_id=request.agent_id,
        incarnation=incarnation,
        declaration=request,
        protocol_version=version,
        policy=_policy(request, allowed),
        heartbeat_interval_s=interval,
        offline_after_s=interval + grace_s,
        registered_at=now,
        deadline=now + timedelta(seconds=interval + grace_s),
    )
    moves = base.moved([(_L.REGISTERED, "registered", "")], now)
    return AgentRecord.model_validate(
        {
            **base.model_dump(),
            "state": _L.REGISTERED,
            "seq": moves[-1].seq,
            "recent": moves,
            "beat": 1,
            "rounds": 1 if rnd is not None else 0,
            "conformance": rnd,
            "journaled_state": _L.REGISTERED,
            "journaled_registration": 1,
            "registration_journaled_at": now,
            "registration_due": True,
        }
    )


def registered(
    current: AgentRecord,
    request: AgentRegistration,
    allowed: ExternalAgent,
    allow_list: AllowList,
    *,
    version: str,
    grace_s: float,
    now: datetime,
    conformance_timeout_s: float = DEFAULT_TIMEOUT_S,
    coalesce_s: float = 0.0,
) -> AgentRecord | None:
    """A registration of an agent that has a record: ``None`` for a repeat of the standing one (idempotent),
    a new incarnation after decommissioning, else a re-registration (``<state>`` -> ``registered``), which
    opens a new conformance round when it changes the declared capabilities."""
    if current.state is _L.DECOMMISSIONED and current.held_by is not None:
        detail = (
            f"agent {current.agent_id!r} was decommissioned by an operator ({current.held_by}): it must be readmitted"
        )
        raise Refused("decommissioned", detail)
    if current.state is _L.DECOMMISSIONED:
        return fresh_record(
            request,
            allowed,
            allow_list,
            version=version,
            grace_s=grace_s,
            now=now,
            incarnation=current.incarnation + 1,
            conformance_timeout_s=conformance_timeout_s,
            coalesce_s=coalesce_s,
        )
    policy = _policy(request, allowed)
    interval = allow_list.interval_of(allowed)
    same = (
        current.declaration == request
        and current.protocol_version == version
        and current.policy == policy
        and current.heartbeat_interval_s == interval
        and current.offline_after_s == interval + grace_s
    )
    if same and current.state is _L.REGISTERED:
        return None
    informational = {"provider", "model", "protocol_version", "protocol_versions"}
    meaningful = not (
        current.declaration.model_dump(exclude=informational) == request.model_dump(exclude=informational)
        and current.protocol_version == version
        and current.policy == policy
        and current.heartbeat_interval_s == interval
        and current.offline_after_s == interval + grace_s
    )
    # a changed declaration from an agent still ``registered`` (no heartbeat yet) is a new registration, not a move
    made = [] if current.state is _L.REGISTERED else current.moved([(_L.REGISTERED, "re_registered", "")], now)
    moves, after = _journaled(current, made, now, coalesce=not meaningful, window_s=coalesce_s)
    due = meaningful or _window_passed(current.registration_journaled_at, now, coalesce_s)
    if due:
        after |= {
            "journaled_registration": current.registration + 1,
            "registration_journaled_at": now,
        }
    rounds, rnd = current.rounds, current.conformance
    if list(dict.fromkeys(request.capabilities)) != list(dict.fromkeys(current.declaration.capabilities)):
        rnd = new_round(
            request.agent_id,
            current.incarnation,
            rounds + 1,
            request.capabilities,
            now=now,
            timeout_s=conformance_timeout_s,
        )
        rounds += 1 if rnd is not None else 0
    return AgentRecord.model_validate(
        {
            **current.model_dump(),
            "rounds": rounds,
            "conformance": rnd,
            **after,
            "registration_due": due,
            "registration": current.registration + 1,
            "state": _L.REGISTERED,
            "seq": made[-1].seq if made else current.seq,
            "recent": moves,
            "declaration": request,
            "protocol_version": version,
            "policy": policy,
            "heartbeat_interval_s": interval,
            "offline_after_s": interval + grace_s,
            "beat": current.beat + 1,
            "deadline": now + timedelta(seconds=interval + grace_s),
        }
    )


def _check_live(current: AgentRecord, agent_id: str, version: str) -> None:
    if current.state is _L.DECOMMISSIONED and current.held_by is not None:
        raise Refused("not_registered", f"agent {agent_id!r} was decommissioned by an operator ({current.held_by})")
    if current.state is _L.DECOMMISSIONED:
        raise Refused("not_registered", f"agent {agent_id!r} was decommissioned: register again")
    if version != current.protocol_version:
        detail = f"this registration speaks protocol version {current.protocol_version}, not {version}"
        raise Refused("version_mismatch", detail)


def heartbeat_seen(current: AgentRecord, beat: Heartbeat, now: datetime, *, coalesce_s: float = 0.0) -> AgentRecord:
    """A heartbeat (AP-4): liveness re-armed, the state it reports taken (an offline agent resumes first); a move
    between working states is journaled at most once per ``coalesce_s`` (module docstring)."""
    _check_live(current, beat.agent_id, beat.protocol_version)
    moves: list[tuple[AgentLifecycleState, LifecycleReason, str]] = []
    state = current.state
    if state is _L.OFFLINE:
        moves.append((_L.RESUMING, "came_back", "a heartbeat after the agent went offline"))
        state = _L.RESUMING
    target = AgentLifecycleState(beat.current_state)
    if target is not state:
        if not AGENT_LIFECYCLE.allowed(state, target):
            raise Refused("illegal_transition", f"the agent lifecycle does not go from {state.value} to {target.value}")
        moves.append((target, "heartbeat", ""))
    made = current.moved(moves, now)
    came_back = state is not current.state
    if made:
        recent, after = _journaled(current, made, now, coalesce=not came_back, window_s=coalesce_s)
    else:
        recent, after = _flushed(current, now, coalesce_s)
    return AgentRecord.model_validate(
        {
            **current.model_dump(),
            **after,
            **_registration_flush(current, now, coalesce_s),
            "state": made[-1].to_state if made else current.state,
            "seq": made[-1].seq if made else current.seq,
            "recent": recent,
            "beat": current.beat + 1,
            "last_heartbeat_at": now,
            "deadline": now + timedelta(seconds=current.offline_after_s),
            "active_run_id": beat.active_run_id,
            "resource_usage": beat.resource_usage,
        }
    )


def heartbeat_missed(current: AgentRecord, incarnation: int, beat: int, now: datetime) -> AgentRecord | None:
    """The liveness timer armed at (``incarnation``, ``beat``) fired: ``offline``, unless a newer heartbeat
    (or registration) came since, the agent is already offline or gone, or the deadline is still ahead."""
    if current.incarnation != incarnation or current.beat != beat or not current.live or now < current.deadline:
        return None
    detail = f"no heartbeat within {current.offline_after_s:g} s"
    made = current.moved([(_L.OFFLINE, "heartbeat_missed", detail)], now)
    recent, after = _journaled(current, made, now, coalesce=False, window_s=0)
    return AgentRecord.model_validate(
        {**current.model_dump(), **after, "state": _L.OFFLINE, "seq": made[-1].seq, "recent": recent}
    )


def decommissioned(current: AgentRecord, request: Deregistration, now: datetime) -> AgentRecord | None:
    """A deregistration: ``decommissioned`` (``None``: it already is -- a repeat, idempotent; refused when an
    operator decommissioned it: that incarnation is no longer the agent's to end)."""
    if current.state is _L.DECOMMISSIONED and current.held_by is None:
        return None
    _check_live(current, request.agent_id, request.protocol_version)
    made = current.moved([(_L.DECOMMISSIONED, "deregistered", request.reason)], now)
    recent, after = _journaled(current, made, now, coalesce=False, window_s=0)
    return AgentRecord.model_validate(
        {
            **current.model_dump(),
            **after,
            "state": _L.DECOMMISSIONED,
            "seq": made[-1].seq,
            "recent": recent,
            "decommission_reason": request.reason,
        }
    )


class AlreadyDecommissioned(Exception):
    """An operator asked to decommission an agent that had already left by itself (nothing to move)."""


def operator_decommissioned(current: AgentRecord, by: str, reason: str, now: datetime) -> AgentRecord | None:
    """An operator takes the agent out of service: ``decommissioned`` (reason ``decommissioned``, ``requested_by``)
    and held -- its later messages are refused, a registration too until an operator readmits it. ``None``:
    an operator already did (a repeat); :class:`AlreadyDecommissioned` when the agent had deregistered."""
    if current.state is _L.DECOMMISSIONED:
        if current.held_by is not None:
            return None
        raise AlreadyDecommissioned(current.agent_id)
    made = current.moved([(_L.DECOMMISSIONED, "decommissioned", reason)], now, requested_by=by)
    recent, after = _journaled(current, made, now, coalesce=False, window_s=0)
    return AgentRecord.model_validate(
        {
            **current.model_dump(),
            **after,
            "state": _L.DECOMMISSIONED,
            "seq": made[-1].seq,
            "recent": recent,
            "decommission_reason": reason or f"decommissioned by {by}",
            "held_by": by,
        }
    )


def readmitted(current: AgentRecord) -> AgentRecord | None:
    """The hold lifted: the agent may register again (a new incarnation). ``None``: there was none."""
    if current.held_by is None:
        return None
    return AgentRecord.model_validate({**current.model_dump(), "held_by": None, "recent": []})


def conformance_answered(current: AgentRecord, body: ConformanceAnswers, now: datetime) -> AgentRecord | None:
    """The agent answered a conformance round: the open round ends with each probe's verdict (``None``: the
    round already ended with these answers' first arrival -- a retry, answered the same). :class:`Refused`
    for an agent not live, another version, or a round that is not open (``no_round_open``: never opened,
    superseded, or ended by its deadline)."""
    _check_live(current, body.agent_id, body.protocol_version)
    rnd = current.conformance
    if rnd is None or rnd.round != body.round:
        opened = f"round {rnd.round} is the latest" if rnd is not None else "no round was opened"
        raise Refused("no_round_open", f"conformance round {body.round} is not open for {body.agent_id!r}: {opened}")
    if not rnd.open:
        if rnd.answered_at is None:
            detail = f"conformance round {rnd.round} ended at its deadline {rnd.deadline.isoformat()} without answers"
            raise Refused("no_round_open", detail)
        return None
    return AgentRecord.model_validate({**current.model_dump(), "recent": [], "conformance": evaluate(rnd, body, now)})


def conformance_timed_out(current: AgentRecord, incarnation: int, round_no: int, now: datetime) -> AgentRecord | None:
    """The deadline timer of (``incarnation``, ``round_no``) fired: that round ends ``timeout`` if it is still
    open and its deadline has passed; ``None`` otherwise (answered, superseded, another incarnation, early)."""
    rnd = current.conformance
    if current.incarnation != incarnation or rnd is None or rnd.round != round_no or not rnd.open:
        return None
    if now < rnd.deadline:
        return None
    return AgentRecord.model_validate(
        {**current.model_dump(), "recent": [], "conformance": round_closed_by_timer(rnd, now)}
    )


# --------------------------------------------------------------------------- the events
def _event(
    data: EventData, agent_id: str, *, id: str | None, time: datetime | None = None, by: str | None = None
) -> Envelope:
    """An event about ``agent_id``: its actor is the agent, or the operator (``token:<name>``) who acted."""
    actor = f"token:{by}" if by is not None else f"agent:{agent_id}"
    return make_event(data, source=SOURCE, id=id, subject=agent_id, actor=actor, time=time)


def lifecycle_events(record: AgentRecord) -> list[Envelope]:
    """``agent.lifecycle_changed`` for each move the record's last change made (deterministic ids)."""
    return [
        _event(
            AgentLifecycleChanged(
                agent_id=record.agent_id,
                incarnation=record.incarnation,
                seq=t.seq,
                from_state=t.from_state,
                to_state=t.to_state,
                reason=t.reason,
                detail=t.detail,
                active_run_id=t.active_run_id,
                requested_by=t.requested_by,
            ),
            record.agent_id,
            id=derive_id("evt", "agent.lifecycle_changed", record.agent_id, str(record.incarnation), str(t.seq)),
            time=t.at,
            by=t.requested_by,
        )
        for t in record.recent
    ]


def registered_event(record: AgentRecord) -> Envelope:
    """``agent.registered`` for the record's standing registration (the same id however often it is built)."""
    declared = record.declaration
    data = AgentRegistered(
        agent_id=record.agent_id,
        incarnation=record.incarnation,
        registration=record.registration,
        protocol_version=record.protocol_version,
        provider=declared.provider,
        model=declared.model,
        capabilities=declared.capabilities,
        supported_tools=declared.supported_tools,
        allowed_tools=record.policy.allowed_tools,
        max_context_size=record.policy.limits.max_context_size,
        heartbeat_interval_s=record.heartbeat_interval_s,
    )
    parts = (record.agent_id, str(record.incarnation), str(record.registration))
    return _event(data, record.agent_id, id=derive_id("evt", "agent.registered", *parts))


def refused_event(
    request: AgentRegistration,
    refused: Refused,
    supported: list[str],
    *,
    count: int = 1,
    window_s: int | None = None,
    id: str | None = None,
    agent: str | None = None,
) -> Envelope:
    """``agent.registration_refused``. A refusal is a fact of one request, so it gets a fresh id (a retried
    request is another refused attempt, journaled again); a window's total (``count``, ``window_s``: see
    :class:`~temporality_agent_collab.throttle.Throttle`) gets the ``id`` given, and ``agent`` ``*`` when it counts
    the refusals of many agents."""
    reason: Literal["unknown_agent", "no_common_version", "decommissioned"] = "no_common_version"
    if refused.reason == "unknown_agent" or refused.reason == "decommissioned":
        reason = refused.reason
    agent_id = agent or request.agent_id
    data = AgentRegistrationRefused(
        agent_id=agent_id,
        reason=reason,
        detail=refused.detail,
        declared_versions=request.declared_versions(),
        supported_versions=supported,
        provider=request.provider,
        model=request.model,
        count=count,
        window_s=window_s,
    )
    if agent_id == "*":
        return make_event(data, source=SOURCE, id=id, subject=None, actor=None)
    return _event(data, agent_id, id=id)


def checked_event(record: AgentRecord) -> Envelope:
    """``agent.conformance_checked`` for the record's ended round (one fact per round: a derived id)."""
    rnd = record.conformance
    if rnd is None or rnd.open:
        raise ValueError("only an ended conformance round is journaled")
    data = checked_event_data(record.agent_id, record.incarnation, rnd)
    return _event(
        data,
        record.agent_id,
        id=checked_event_id(record.agent_id, record.incarnation, rnd.round),
        time=rnd.closed_at,
    )


def readmitted_event(record: AgentRecord, by: str, reason: str) -> Envelope:
    """``agent.readmitted`` for the incarnation that was held (one fact per incarnation: a derived id)."""
    data = AgentReadmitted(agent_id=record.agent_id, incarnation=record.incarnation, requested_by=by, reason=reason)
    parts = (record.agent_id, str(record.incarnation))
    return _event(data, record.agent_id, id=derive_id("evt", "agent.readmitted", *parts), by=by)


# --------------------------------------------------------------------------- discovery and timers
def granted(agent: AgentRecord, allow_list: AllowList) -> list[str]:
    """The tools ``agent`` may call now (AP-11): those its registration was granted (``policy.allowed_tools``) that
    the allow-list agent-collab runs with still grants. A tool the operator revoked -- the allow-list changed, then
    agent-collab restarted -- is refused from that start on, not only once the agent registers again (its
    registration then gets the narrower policy); an agent no longer listed is granted nothing."""
    listed = allow_list.get(agent.agent_id)
    if listed is None:
        return []
    return [tool for tool in agent.policy.allowed_tools if tool in listed.allowed_tools]


def card(record: AgentRecord, allow_list: AllowList) -> AgentCard:
    """The agent's card (PRO-2): a declared capability is verified only by its conformance round; the tools it
    may use are those it is granted now (:func:`granted`: a revoked tool is not advertised until it registers
    again)."""
    declared = record.declaration
    return AgentCard(
        agent_id=record.agent_id,
        kind="external",
        provider=declared.provider,
        model=declared.model,
        state=record.state,
        protocol_version=record.protocol_version,
        capabilities=capability_views(declared.capabilities, record.conformance),
        supported_tools=declared.supported_tools,
        allowed_tools=granted(record, allow_list),
        max_context_size=record.policy.limits.max_context_size,
        registered_at=record.registered_at,
        last_heartbeat_at=record.last_heartbeat_at,
        active_run_id=record.active_run_id,
    )


class TimerPayload(_Model):
    """What an ``agent-heartbeat`` timer carries: the liveness marker it was armed at."""

    agent_id: str
    incarnation: Annotated[int, Field(gt=0)]
    beat: Annotated[int, Field(ge=0)]


def timer_payload(record: AgentRecord) -> bytes:
    return json.dumps({"agent_id": record.agent_id, "incarnation": record.incarnation, "beat": record.beat}).encode()


def utcnow() -> datetime:
    return datetime.now(UTC)
