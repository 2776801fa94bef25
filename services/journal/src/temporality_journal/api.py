"""The journal's HTTP API (JSON): runs by state, one run with whom/where/how long it waits, trajectories.

==============================  ==========================================================
``GET /healthz``, ``/readyz``   liveness / readiness (the runtime's; ``/readyz`` pings the database)
``GET /runs?state=&limit=``     runs, newest first (422 on an unknown state)
``GET /runs/{run_id}``          one run; ``waiting`` while it waits for a human (404 unknown)
``GET /runs/{run_id}/events``   the run's trajectory in stream order (``after`` = stream seq)
``GET /events?type=&run_id=``   recent events, newest first (``type=bus.dead_lettered``: the
                                dead-letter view)
==============================  ==========================================================

Every error is ``{"error": "<code>", "detail": "<sentence>"}``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import structlog
from fastapi import FastAPI, Query
from pydantic import BaseModel
from sqlmodel import col, select

from temporality_journal.database import Database
from temporality_journal.models import EventRecord, RunRecord
from temporality_journal.settings import Settings
from temporality_protocol import RunState
from temporality_service import ErrorBody, NonNegativeInt64, NotFound, install_error_handlers

__all__ = [
    "EventList",
    "EventView",
    "RunList",
    "RunView",
    "Trajectory",
    "Waiting",
    "create_app",
]

log = structlog.get_logger(__name__)

MAX_LIMIT = 1000
MAX_TRAJECTORY = 10_000


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

    @app.get("/runs", response_model=RunList)
    async def list_runs(
        state: Annotated[RunState | None, Query(description="Only runs in this state")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    ) -> RunList:
        query = select(RunRecord)
        if state is not None:
            query = query.where(col(RunRecord.state) == state.value)
        query = query.order_by(col(RunRecord.created_at).desc(), col(RunRecord.run_id).desc()).limit(limit)
        async with database.sessions() as session:
            records = (await session.exec(query)).all()
        now = datetime.now(UTC)
        return RunList(runs=[RunView.of(r, now) for r in records])

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

    return app
