"""The journal's SQL tables (SQLModel): ``events``, every CloudEvent once; ``runs`` and ``asks``, their projections;
``commit_counter``, the last commit position handed out (``events.commit_seq``, :mod:`temporality_journal.tail`).

The tables live in their own SQLAlchemy registry, so the journal creates exactly its own tables
even when other SQLModel models share the process (tests import every service).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import JSON, BigInteger, Boolean, Column, DateTime, Dialect, Index, String, Table
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import registry
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

from temporality_protocol import RunState
from temporality_protocol.states import AgentAskState

__all__ = [
    "ASKS_TABLE",
    "COMMIT_COUNTER_TABLE",
    "EVENTS_TABLE",
    "REVOKED_SESSIONS_TABLE",
    "RUNS_TABLE",
    "AskRecord",
    "AskSnapshot",
    "CommitCounter",
    "EventRecord",
    "JournalModel",
    "RevokedSession",
    "RunRecord",
    "RunSnapshot",
    "UTCDateTime",
    "as_utc",
    "constructed",
    "same",
    "updated",
]


def as_utc(value: datetime) -> datetime:
    """An aware UTC datetime; a naive one is taken to be UTC already."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


_Snapshot = TypeVar("_Snapshot", bound=SQLModel)


def updated(snapshot: _Snapshot, changes: dict[str, Any]) -> _Snapshot:
    """A copy of ``snapshot`` with ``changes``, not validated again: for the projections, whose values
    come from validated event data and the snapshot's own fields (``evolve`` would dump and re-validate
    the whole row, the projection's main cost). A name that is not a field is a bug: :class:`ValueError`.
    """
    cls = type(snapshot)
    fields = _fields_of(cls)
    if not changes.keys() <= fields:
        raise ValueError(f"{cls.__name__} has no field {sorted(changes.keys() - fields)}")
    # What ``model_copy(update=…)`` does, without its detours: SQLModel's ``__new__`` and ``__setattr__``
    # (several times the cost of the copy itself, once per projected event). The snapshots have no extra
    # and no private attributes (they are not table models: no SQLAlchemy instance state either).
    values = snapshot.__dict__.copy()
    values.update(changes)
    return _snapshot_of(cls, values, snapshot.__pydantic_fields_set__ | changes.keys())


#: Each snapshot class's field names (``model_fields`` is a property that costs more than the copy).
_FIELD_NAMES: dict[type[SQLModel], frozenset[str]] = {}


def _fields_of(cls: type[SQLModel]) -> frozenset[str]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = frozenset(cls.model_fields)
    return names


def _snapshot_of(cls: type[_Snapshot], values: dict[str, Any], fields_set: set[str]) -> _Snapshot:
    snapshot = object.__new__(cls)
    _set = object.__setattr__
    _set(snapshot, "__dict__", values)
    _set(snapshot, "__pydantic_fields_set__", fields_set)
    _set(snapshot, "__pydantic_extra__", None)
    _set(snapshot, "__pydantic_private__", None)
    return snapshot


def same(a: SQLModel, b: SQLModel) -> bool:
    """``a == b`` for two snapshots (:func:`updated`, :func:`constructed`: no extra, no private attributes,
    ``__dict__`` exactly the fields): one dict comparison in C, where pydantic's ``__eq__`` runs Python first."""
    return type(a) is type(b) and a.__dict__ == b.__dict__


def constructed(cls: type[_Snapshot], values: dict[str, Any]) -> _Snapshot:
    """A snapshot of exactly the fields in ``values`` (every field of ``cls``), not validated: for rows the
    journal itself wrote from validated snapshots. What ``model_construct`` gives, without its defaults pass
    and SQLModel's ``__new__``. A missing or unknown field is a bug: :class:`ValueError`."""
    if values.keys() != _fields_of(cls):
        raise ValueError(f"{cls.__name__} needs exactly its fields, got {sorted(values)}")
    return _snapshot_of(cls, values, set(values))


class UTCDateTime(TypeDecorator[datetime]):
    """Stores UTC (``timestamptz`` on PostgreSQL, naive UTC text on SQLite); always reads aware UTC."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        utc = as_utc(value)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else as_utc(value)


class JournalModel(SQLModel, registry=registry()):
    """Base of the journal's models: its own registry and metadata."""


class EventRecord(JournalModel, table=True):
    """One CloudEvent, stored once (the primary key is the CloudEvent id)."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_run_id_stream_seq", "run_id", "stream_seq"),)

    id: str = Field(primary_key=True)
    type: str = Field(index=True)
    source: str
    time: datetime = Field(sa_type=UTCDateTime)
    run_id: str | None = Field(default=None)
    correlation_id: str | None = None
    causation_id: str | None = None
    actor: str | None = None
    tenant: str | None = None
    subject: str | None = None
    stream_seq: int = Field(sa_type=BigInteger, index=True)
    #: The journal's commit order, unique and increasing in the order the rows became visible (the live
    #: tail's cursor, its SSE ``id``): handed out by the recorder from :class:`CommitCounter`, see
    #: :mod:`temporality_journal.tail`. ``stream_seq`` is JetStream's order, which a redelivery breaks.
    commit_seq: int = Field(sa_type=BigInteger, unique=True, index=True)
    #: The CloudEvents Distributed Tracing extension of the event as it came (W3C ``traceparent`` and
    #: ``tracestate`` of the span that published it): from an event to its trace. ``None``: published
    #: with no trace context (or before revision 0004).
    traceparent: str | None = None
    tracestate: str | None = None
    data: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column(JSON().with_variant(JSONB(), "postgresql"), nullable=False)
    )
    recorded_at: datetime = Field(sa_type=UTCDateTime)


class CommitCounter(JournalModel, table=True):
    """The one row (``id = 1``) holding the last ``events.commit_seq`` handed out; never decreases.

    Each write transaction of the recorder first locks it (``SELECT … FOR UPDATE`` on PostgreSQL, a no-op
    ``UPDATE`` -- the database's write lock -- on SQLite), held until the commit, so the journal's writers
    serialise per batch and positions are handed out in commit order
    (:func:`temporality_journal.recorder.lock_positions`).
    """

    __tablename__ = "commit_counter"

    id: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    last_seq: int = Field(sa_type=BigInteger)


class RunSnapshot(JournalModel):
    """A run as the journal sees it: what :func:`temporality_journal.projection.project` reads and returns.

    Invariant: the ``waiting_*`` fields are set exactly while ``state`` is ``waiting_for_human`` or
    ``waiting_for_agent`` (``waiting_channel`` only for a person).
    """

    run_id: str = Field(primary_key=True)
    state: RunState = Field(sa_type=String(32), index=True)
    agent: str | None = None
    title: str | None = None
    trigger_id: str | None = None
    launch_kind: str | None = None
    #: A rerun (the trigger-gateway's ``{"rerun": n}`` on an accepted delivery): the run it runs again
    #: (``launch.rerun_of``), and who asked for it (``launch.requested_by``: a token name or ``user:<id>``).
    #: ``None`` for every other run. Indexed: "the reruns of run X" (``GET /runs?rerun_of=X``).
    rerun_of: str | None = Field(default=None, index=True)
    rerun_requested_by: str | None = None
    created_at: datetime = Field(sa_type=UTCDateTime, index=True)
    updated_at: datetime = Field(sa_type=UTCDateTime)
    started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime, index=True)
    result: str | None = None
    error: str | None = None
    #: What the whole run used (the terminal event's ``usage``, :class:`temporality_protocol.events.RunUsage`):
    #: set by ``run.completed`` / ``run.failed`` / ``run.cancelled``, ``None`` before the end and for a terminal
    #: event without ``usage`` (older executors). Not moved by the per-turn ``run.streamed`` metrics.
    usage_turns: int | None = Field(default=None, sa_type=BigInteger)
    usage_tool_calls: int | None = Field(default=None, sa_type=BigInteger)
    usage_prompt_tokens: int | None = Field(default=None, sa_type=BigInteger)
    usage_completion_tokens: int | None = Field(default=None, sa_type=BigInteger)
    usage_total_tokens: int | None = Field(default=None, sa_type=BigInteger)
    usage_samplings: int | None = Field(default=None, sa_type=BigInteger)
    waiting_request_id: str | None = None
    waiting_recipient: str | None = None
    waiting_channel: str | None = None
    waiting_since: datetime | None = Field(default=None, sa_type=UTCDateTime)
    waiting_question: str | None = None
    #: The highest stream sequence of an event projected onto this run; older events never move the state.
    last_event_seq: int | None = Field(default=None, sa_type=BigInteger)


class RunRecord(RunSnapshot, table=True):
    """The ``runs`` table: one row per run, moved by the projection."""

    __tablename__ = "runs"

    def snapshot(self) -> RunSnapshot:
        return RunSnapshot.model_validate(self, from_attributes=True)


class AskSnapshot(JournalModel):
    """One ``ask_agent`` request as the journal sees it (COL-9): who asked whom, what became of it.

    What :func:`temporality_journal.projection.project_ask` reads and returns. ``state`` follows
    :data:`temporality_protocol.AGENT_ASK`; ``to_address`` is the address as the model wrote it (``to``), ``resolved_*``
    what agent-collab resolved it to, ``recipient_run_id`` who got it (the relay run when ``relay``).
    ``reason``/``detail`` say why it went nowhere (``agent.ask_undeliverable``, or
    ``agent.reply_undeliverable`` with ``asker_finished``).
    """

    request_id: str = Field(primary_key=True)
    state: AgentAskState = Field(sa_type=String(32), index=True)
    correlation_id: str | None = Field(default=None, index=True)
    asker_run_id: str | None = Field(default=None, index=True)
    asker_agent: str | None = None
    to_address: str | None = None
    mode: str | None = None
    timeout_s: int | None = None
    message: str | None = None
    truncated: bool | None = Field(default=None, sa_type=Boolean)
    resolved_run_id: str | None = None
    resolved_agent: str | None = None
    recipient_run_id: str | None = Field(default=None, index=True)
    relay: bool | None = Field(default=None, sa_type=Boolean)
    relay_run: str | None = None
    expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    replier_run_id: str | None = None
    replier_agent: str | None = None
    outcome: str | None = None
    answer: str | None = None
    late: bool | None = Field(default=None, sa_type=Boolean)
    waited_s: float | None = None
    reason: str | None = None
    detail: str | None = None
    asked_at: datetime = Field(sa_type=UTCDateTime, index=True)
    delivered_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    expired_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    replied_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    updated_at: datetime = Field(sa_type=UTCDateTime)
    #: The highest stream sequence of an event projected onto this ask.
    last_event_seq: int | None = Field(default=None, sa_type=BigInteger)


class AskRecord(AskSnapshot, table=True):
    """The ``asks`` table: one row per ``ask_agent`` request id, moved by the projection."""

    __tablename__ = "asks"

    def snapshot(self) -> AskSnapshot:
        return AskSnapshot.model_validate(self, from_attributes=True)


class RevokedSession(JournalModel, table=True):
    """A signed-out sign-in session (:mod:`temporality_journal.revocation`): its cookie admits nothing any more,
    on every replica. Kept until the session would have expired anyway (``expires_at``), then deleted.

    Not part of the read model: the streams do not hold sign-outs, so a rebuild keeps this table
    (:meth:`temporality_journal.database.Database.reset_read_model`)."""

    __tablename__ = "revoked_sessions"

    session_id: str = Field(primary_key=True, max_length=64)
    expires_at: datetime = Field(sa_type=UTCDateTime, index=True)
    revoked_at: datetime = Field(sa_type=UTCDateTime)


#: The tables as SQLAlchemy core objects (batch inserts, upserts and aggregate queries).
EVENTS_TABLE: Table = EventRecord.metadata.tables["events"]
RUNS_TABLE: Table = RunRecord.metadata.tables["runs"]
ASKS_TABLE: Table = AskRecord.metadata.tables["asks"]
COMMIT_COUNTER_TABLE: Table = CommitCounter.metadata.tables["commit_counter"]
REVOKED_SESSIONS_TABLE: Table = RevokedSession.metadata.tables["revoked_sessions"]
