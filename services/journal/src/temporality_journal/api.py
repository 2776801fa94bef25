"""The journal's HTTP API (JSON): runs by state, one run with whom/where/how long it waits, trajectories.

==================================  ======================================================
``GET /healthz``, ``/readyz``       liveness / readiness (the runtime's; ``/readyz`` pings the
                                    database)
``GET /runs``                       runs, newest first; ``state``, ``trigger_id``, ``agent``,
                                    ``since``/``until`` (created_at), ``q`` (title), ``limit``;
                                    paged by ``before`` = the previous page's ``next_before``
``GET /runs/waiting``               UI-1: the runs waiting for a human, the oldest wait first
``GET /runs/{run_id}``              one run; ``waiting`` while it waits for a human (404 unknown)
``GET /runs/{run_id}/events``       the run's trajectory in stream order (``after`` = stream seq)
``GET /events?type=&run_id=``       recent events, newest first (``type=bus.dead_lettered``: the
                                    dead-letter view)
``GET /triggers``                   UI-2: per trigger id, its deliveries and runs
``GET /triggers/{id}/deliveries``   one trigger's deliveries, newest first, paged by ``before``
``GET /analytics/human``            OBS-1: how often runs ask humans, how long they wait, what
==================================  ======================================================

Read-only over ``events`` and ``runs`` (no extra columns); the trigger and analytics views aggregate
in Python over the rows they select (:mod:`temporality_journal.insights`).

Every error is ``{"error": "<code>", "detail": "<sentence>"}``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import structlog
from fastapi import FastAPI, Path, Query
from pydantic import BaseModel, Field
from sqlalchemy import ColumnElement, and_, or_
from sqlalchemy import select as sa_select
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from temporality_journal.database import Database
from temporality_journal.insights import (
    HUMAN_TYPES,
    TRIGGER_TYPES,
    DeliveryView,
    EventRow,
    HumanAnalytics,
    RunRow,
    TriggerView,
    decode_cursor,
    deliveries_of,
    encode_cursor,
    human_analytics,
    triggers_of,
)
from temporality_journal.models import EVENTS_TABLE, RUNS_TABLE, EventRecord, RunRecord, as_utc
from temporality_journal.settings import Settings
from temporality_protocol import RunState
from temporality_service import ErrorBody, NonNegativeInt64, NotFound, Unprocessable, install_error_handlers

__all__ = [
    "DeliveryList",
    "EventList",
    "EventView",
    "RunList",
    "RunView",
    "Trajectory",
    "TriggerList",
    "Waiting",
    "WaitingList",
    "create_app",
]

log = structlog.get_logger(__name__)

MAX_LIMIT = 1000
MAX_TRAJECTORY = 10_000
MAX_TEXT_PARAM = 200
#: Refuses NUL (no database text holds it) in string query and path parameters.
NO_NUL = r"^[^\x00]*$"


# --------------------------------------------------------------------------- response bodies
class Waiting(BaseModel):
    """UI-1: whom the run waits for, on which channel, for what, since when."""

    request_id: str | None
    recipient: str | None
    channel: str | None
    question: str | None
    since: datetime | None
    waiting_s: float | None


class RunView(BaseModel):
    run_id: str
    state: RunState
    agent: str | None
    title: str | None
    trigger_id: str | None
    launch_kind: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    result: str | None
    error: str | None
    last_event_seq: int | None
    waiting: Waiting | None

    @classmethod
    def of(cls, record: RunRecord, now: datetime) -> RunView:
        waiting = None
        if record.state == RunState.WAITING_FOR_HUMAN:
            since = record.waiting_since
            waiting = Waiting(
                request_id=record.waiting_request_id,
                recipient=record.waiting_recipient,
                channel=record.waiting_channel,
                question=record.waiting_question,
                since=since,
                waiting_s=None if since is None else round(max((now - since).total_seconds(), 0.0), 3),
            )
        return cls(
            run_id=record.run_id,
            state=RunState(record.state),
            agent=record.agent,
            title=record.title,
            trigger_id=record.trigger_id,
            launch_kind=record.launch_kind,
            created_at=record.created_at,
            updated_at=record.updated_at,
            started_at=record.started_at,
            finished_at=record.finished_at,
            result=record.result,
            error=record.error,
            last_event_seq=record.last_event_seq,
            waiting=waiting,
        )


class RunList(BaseModel):
    runs: list[RunView]
    next_before: str | None = Field(
        default=None, description="Pass as ``before`` for the next (older) page; null on the last page"
    )


class WaitingList(BaseModel):
    runs: list[RunView] = Field(description="Runs in waiting_for_human, the longest waiting first")


class TriggerList(BaseModel):
    triggers: list[TriggerView]


class DeliveryList(BaseModel):
    trigger_id: str
    deliveries: list[DeliveryView]
    next_before: str | None = Field(default=None, description="Pass as ``before`` for the next (older) page")


class EventView(BaseModel):
    id: str
    type: str
    time: datetime
    source: str
    actor: str | None
    run_id: str | None
    subject: str | None
    correlation_id: str | None
    causation_id: str | None
    tenant: str | None
    stream_seq: int
    recorded_at: datetime
    data: dict[str, Any]

    @classmethod
    def of(cls, record: EventRecord) -> EventView:
        return cls.model_validate(record, from_attributes=True)


class Trajectory(BaseModel):
    run_id: str
    events: list[EventView]


class EventList(BaseModel):
    events: list[EventView]


def _run_not_found(run_id: str) -> NotFound:
    return NotFound(f"no run {run_id[:200]!r} in the journal", code="run_not_found")


# --------------------------------------------------------------------------- app
def create_app(settings: Settings, database: Database) -> FastAPI:
    """The journal API over ``database`` (already open; the caller owns its lifecycle)."""
    app = FastAPI(
        title="Temporality journal",
        description="Every event, the runs they move, and the trajectories (read model)",
        version="0.1.0",
        responses={422: {"model": ErrorBody}},
    )
    app.state.settings = settings
    app.state.database = database
    install_error_handlers(app)

    @app.get(
        "/runs",
        response_model=RunList,
        description="Runs, newest first (by created_at, then run id). Filters combine with AND; page with "
        "``before`` = the previous page's ``next_before``.",
    )
    async def list_runs(
        state: Annotated[RunState | None, Query(description="Only runs in this state")] = None,
        trigger_id: Annotated[str | None, _text("Only runs launched by this trigger")] = None,
        agent: Annotated[str | None, _text("Only runs of this agent")] = None,
        since: Annotated[datetime | None, Query(description="Only runs created at or after (ISO 8601)")] = None,
        until: Annotated[datetime | None, Query(description="Only runs created before (ISO 8601)")] = None,
        q: Annotated[str | None, _text("Case-insensitive substring of the title")] = None,
        before: Annotated[str | None, _text("Opaque cursor: the next_before of the previous page")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="At most this many runs")] = 100,
    ) -> RunList:
        conditions = _run_filters(agent=agent, trigger_id=trigger_id, since=since, until=until)
        if state is not None:
            conditions.append(col(RunRecord.state) == state.value)
        if q:
            conditions.append(col(RunRecord.title).icontains(q, autoescape=True))
        if before is not None:
            cursor = decode_cursor(before)
            conditions.append(
                or_(
                    col(RunRecord.created_at) < cursor.time,
                    and_(col(RunRecord.created_at) == cursor.time, col(RunRecord.run_id) < cursor.key),
                )
            )
        query = (
            select(RunRecord)
            .where(*conditions)
            .order_by(col(RunRecord.created_at).desc(), col(RunRecord.run_id).desc())
            .limit(limit + 1)
        )
        async with database.sessions() as session:
            records = list((await session.exec(query)).all())
        more = len(records) > limit
        records = records[:limit]
        now = datetime.now(UTC)
        next_before = encode_cursor(records[-1].created_at, records[-1].run_id) if more else None
        return RunList(runs=[RunView.of(r, now) for r in records], next_before=next_before)

    # Declared before /runs/{run_id}, which would otherwise take "waiting" for a run id.
    @app.get(
        "/runs/waiting",
        response_model=WaitingList,
        description="UI-1: the runs waiting for a human, the oldest wait first; each with ``waiting`` (whom, "
        "which channel, what question, since when, waiting seconds).",
    )
    async def waiting_runs(
        agent: Annotated[str | None, _text("Only runs of this agent")] = None,
        trigger_id: Annotated[str | None, _text("Only runs launched by this trigger")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="At most this many runs")] = 100,
    ) -> WaitingList:
        conditions = _run_filters(agent=agent, trigger_id=trigger_id, since=None, until=None)
        query = (
            select(RunRecord)
            .where(col(RunRecord.state) == RunState.WAITING_FOR_HUMAN.value, *conditions)
            .order_by(col(RunRecord.waiting_since).asc(), col(RunRecord.run_id).asc())
            .limit(limit)
        )
        async with database.sessions() as session:
            records = (await session.exec(query)).all()
        now = datetime.now(UTC)
        return WaitingList(runs=[RunView.of(r, now) for r in records])

    @app.get("/runs/{run_id}", response_model=RunView, responses={404: {"model": ErrorBody}})
    async def get_run(run_id: str) -> RunView:
        async with database.sessions() as session:
            record = await session.get(RunRecord, run_id)
        if record is None:
            raise _run_not_found(run_id)
        return RunView.of(record, datetime.now(UTC))

    @app.get("/runs/{run_id}/events", response_model=Trajectory, responses={404: {"model": ErrorBody}})
    async def run_events(
        run_id: str,
        after: Annotated[NonNegativeInt64, Query(description="Only events after this stream sequence")] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_TRAJECTORY)] = MAX_TRAJECTORY,
    ) -> Trajectory:
        query = (
            select(EventRecord)
            .where(col(EventRecord.run_id) == run_id, col(EventRecord.stream_seq) > after)
            .order_by(col(EventRecord.stream_seq), col(EventRecord.time), col(EventRecord.id))
            .limit(limit)
        )
        async with database.sessions() as session:
            records = (await session.exec(query)).all()
            if not records and await session.get(RunRecord, run_id) is None:
                known = (
                    await session.exec(select(EventRecord.id).where(EventRecord.run_id == run_id).limit(1))
                ).first()
                if known is None:
                    raise _run_not_found(run_id)
        return Trajectory(run_id=run_id, events=[EventView.of(r) for r in records])

    @app.get("/events", response_model=EventList)
    async def list_events(
        type_: Annotated[str | None, Query(alias="type", description="Only this event type")] = None,
        run_id: Annotated[str | None, Query(description="Only this run's events")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    ) -> EventList:
        query = select(EventRecord)
        if type_ is not None:
            query = query.where(col(EventRecord.type) == type_)
        if run_id is not None:
            query = query.where(col(EventRecord.run_id) == run_id)
        query = query.order_by(col(EventRecord.stream_seq).desc(), col(EventRecord.time).desc()).limit(limit)
        async with database.sessions() as session:
            records = (await session.exec(query)).all()
        return EventList(events=[EventView.of(r) for r in records])

    @app.get(
        "/triggers",
        response_model=TriggerList,
        description="UI-2, what the journal knows from events: per trigger id (seen in a trigger.* event or on "
        "a run), its deliveries (received, accepted, rejected by reason, the last one's time), its last run and "
        "its runs (completed, failed, cancelled, needed a human). A trigger's source, event, agent and enabled "
        "flag belong to the trigger API (not built yet), not to the journal.",
    )
    async def list_triggers() -> TriggerList:
        async with database.sessions() as session:
            events = await _event_rows(session, col(EventRecord.type).in_(TRIGGER_TYPES))
            runs = await _run_rows(session, [col(RunRecord.trigger_id).is_not(None)])
            asked = set(
                (
                    await session.exec(
                        select(EventRecord.run_id)
                        .where(col(EventRecord.type) == "human.requested", col(EventRecord.run_id).is_not(None))
                        .distinct()
                    )
                ).all()
            )
        return TriggerList(triggers=triggers_of(events, runs, {a for a in asked if a is not None}))

    @app.get(
        "/triggers/{trigger_id}/deliveries",
        response_model=DeliveryList,
        description="One trigger's deliveries, newest first: delivery id, the source's event type, outcome "
        "(accepted / rejected / received), reason, run id, time. An unknown trigger has none (200, empty).",
    )
    async def trigger_deliveries(
        trigger_id: Annotated[str, Path(max_length=MAX_TEXT_PARAM, pattern=NO_NUL)],
        before: Annotated[str | None, _text("Opaque cursor: the next_before of the previous page")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="At most this many deliveries")] = 100,
    ) -> DeliveryList:
        cursor = decode_cursor(before) if before is not None else None
        data = EVENTS_TABLE.c.data
        async with database.sessions() as session:
            events = await _event_rows(
                session, col(EventRecord.type).in_(TRIGGER_TYPES), data["trigger_id"].as_string() == trigger_id
            )
        deliveries = deliveries_of(events)
        if cursor is not None:
            deliveries = [d for d in deliveries if (d.time, d.delivery_id) < (cursor.time, cursor.key)]
        page = deliveries[:limit]
        more = len(deliveries) > limit
        return DeliveryList(
            trigger_id=trigger_id,
            deliveries=page,
            next_before=encode_cursor(page[-1].time, page[-1].delivery_id) if more else None,
        )

    @app.get(
        "/analytics/human",
        response_model=HumanAnalytics,
        description="OBS-1 over the runs created in [since, until) (optionally one agent's / one trigger's) "
        "and all their human requests: how many runs asked a human, requests answered / expired / rejected / "
        "pending, the wait-time distribution of answered requests (nearest-rank percentiles; histogram "
        "buckets by exclusive upper bound in seconds, the last open), the most frequent questions, and the "
        "same counts per agent and per trigger.",
    )
    async def human_stats(
        since: Annotated[datetime | None, Query(description="Runs created at or after (ISO 8601)")] = None,
        until: Annotated[datetime | None, Query(description="Runs created before (ISO 8601)")] = None,
        agent: Annotated[str | None, _text("Only runs of this agent")] = None,
        trigger_id: Annotated[str | None, _text("Only runs launched by this trigger")] = None,
        top: Annotated[int, Query(ge=1, le=100, description="How many of the most frequent questions")] = 10,
    ) -> HumanAnalytics:
        conditions = _run_filters(agent=agent, trigger_id=trigger_id, since=since, until=until)
        run_ids = select(RunRecord.run_id).where(*conditions)
        async with database.sessions() as session:
            runs = await _run_rows(session, conditions)
            events = await _event_rows(
                session, col(EventRecord.type).in_(HUMAN_TYPES), col(EventRecord.run_id).in_(run_ids)
            )
        return human_analytics(
            runs,
            events,
            since=_utc(since, "since"),
            until=_utc(until, "until"),
            top=top,
        )

    return app


def _text(description: str) -> Any:
    """A bounded string query parameter without NUL."""
    return Query(description=description, max_length=MAX_TEXT_PARAM, pattern=NO_NUL)


def _run_filters(
    *, agent: str | None, trigger_id: str | None, since: datetime | None, until: datetime | None
) -> list[ColumnElement[bool]]:
    since, until = _utc(since, "since"), _utc(until, "until")
    if since is not None and until is not None and since > until:
        raise Unprocessable("query.since: must not be after until")
    conditions: list[ColumnElement[bool]] = []
    if agent is not None:
        conditions.append(col(RunRecord.agent) == agent)
    if trigger_id is not None:
        conditions.append(col(RunRecord.trigger_id) == trigger_id)
    if since is not None:
        conditions.append(col(RunRecord.created_at) >= since)
    if until is not None:
        conditions.append(col(RunRecord.created_at) < until)
    return conditions


def _utc(value: datetime | None, name: str) -> datetime | None:
    """``value`` in UTC (naive: taken as UTC); 422 when it has no UTC equivalent (year 1 or 9999 at an offset)."""
    if value is None:
        return None
    try:
        return as_utc(value)
    except OverflowError:
        raise Unprocessable(f"query.{name}: out of the representable range in UTC") from None


async def _event_rows(session: AsyncSession, *conditions: ColumnElement[bool]) -> list[EventRow]:
    t = EVENTS_TABLE.c
    query = sa_select(t.type, t.time, t.run_id, t.data).where(*conditions).order_by(t.stream_seq)
    rows = (await (await session.connection()).execute(query)).all()
    return [EventRow(type=t, time=as_utc(tm), run_id=r, data=d if isinstance(d, dict) else {}) for t, tm, r, d in rows]


async def _run_rows(session: AsyncSession, conditions: list[ColumnElement[bool]]) -> list[RunRow]:
    t = RUNS_TABLE.c
    query = sa_select(t.run_id, t.state, t.agent, t.trigger_id, t.created_at).where(*conditions)
    rows = (await (await session.connection()).execute(query)).all()
    return [RunRow(run_id=i, state=str(s), agent=a, trigger_id=t, created_at=as_utc(c)) for i, s, a, t, c in rows]
