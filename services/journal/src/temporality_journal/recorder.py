"""The journal consumer's handler: store every event once and project it, in one transaction.

The consumer acks only after :meth:`Recorder.handle` returns, i.e. after the commit; a crash
before that redelivers the event, and the insert-if-new makes the redelivery change nothing.

Text the databases cannot hold is replaced before storing: U+0000 (PostgreSQL refuses it in
``text`` and ``jsonb``) and unpaired surrogates (neither database can encode them) become U+FFFD,
in every string of ``data`` (keys too) and in every text attribute, so a PR titled with a NUL is
still journaled. A database error that retrying cannot fix (:func:`unfixable`) is raised as
:class:`temporality_bus.PermanentError`: the consumer dead-letters and journals it instead of
redelivering it forever (the journal consumer has no delivery limit) -- except the dead letter
of such an event: refusing that too would dead-letter it again, and again, so it is retried.

:meth:`Recorder.handle_batch` is the consumer's batch handler: a batch of events in one
transaction -- one ``INSERT`` of the events not stored yet (on PostgreSQL one statement
that also leaves out the ids stored already and moves the commit counter, the envelopes passed as one JSON
text, ``data`` nested in it, each envelope the bytes it was received as when they hold nothing to replace,
else serialized by pydantic-core; on SQLite the ids stored already looked up, then one positional
``executemany``; never the ORM; an envelope whose JSON, as the consumer received it, has no ``\\u`` escape holds nothing to replace
and skips the sanitizing check), the affected runs read once, projected in memory in
stream order with :func:`project`'s steps (:func:`update_onto`: nothing validated again; each run copied once per
batch, on its first change, and changed in place for its later events), written back
(PostgreSQL: one upsert, its rows one JSON text; SQLite: one upsert ``executemany``'d, positional values;
both driver SQL); the same for the asks of the ``agent.*`` events (:func:`project_ask`, table ``asks``)
-- committed once, then acked by the runner. A batch without ``agent.*`` events runs on the pooled
connection's driver connection itself (:meth:`Recorder._record_batch_driver`): on PostgreSQL three round trips
on asyncpg's (:func:`_pg_batch`: ``BEGIN`` with the counter's lock; the events' insert with the batch's runs
read -- while the server runs it, the batch is projected on a guess, the runs as this recorder last committed them,
used only if the statement's answer confirms it; the runs' upsert with ``COMMIT``), SQLAlchemy's six otherwise; on SQLite three
calls into aiosqlite's thread (:func:`_sqlite_batch`: the counter's lock with the ids' lookup; the insert, the counter
and the runs' read; the runs' upsert and ``COMMIT``), where one per statement made seven and SQLAlchemy about four
per statement. Every write transaction (a batch, or one event) first
locks ``commit_counter`` (:func:`lock_positions`, or :data:`_PG_BEGIN_AND_LOCK`), which serialises the journal's writers until the
commit, and hands the events it stores the next commit positions (``events.commit_seq``, in stream
order within a batch; an event already stored gets none): the live tail's order
(:mod:`temporality_journal.tail`). Any error rolls the whole batch back and raises: the runner then
records the events one by one through :meth:`Recorder.handle`, where an unstorable event is
dead-lettered alone and a database outage is retried with backoff.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import structlog
from pydantic_core import to_json
from sqlalchemy import BigInteger, Column, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlmodel import col
from sqlmodel.ext.asyncio.session import AsyncSession

from temporality_bus import Delivery, PermanentError, evolve
from temporality_journal.asks import project_ask, request_id_of
from temporality_journal.database import Database
from temporality_journal.metrics import finished_as
from temporality_journal.models import (
    ASKS_TABLE,
    EVENTS_TABLE,
    RUNS_TABLE,
    AskSnapshot,
    EventRecord,
    RunRecord,
    RunSnapshot,
    UTCDateTime,
    as_utc,
    constructed,
    same,
    updated,
)
from temporality_journal.projection import PROJECTED_TYPES, project, run_id_of, update_onto
from temporality_protocol import RUN, BusDeadLettered, Envelope, InvalidEnvelope, RunState
from temporality_protocol.catalog import CONSUMERS

__all__ = ["REPLACEMENT_CHARACTER", "Recorder", "advance_positions", "lock_positions", "sanitize", "unfixable"]

log = structlog.get_logger(__name__)

#: What replaces a character the databases cannot store.
REPLACEMENT_CHARACTER = "\ufffd"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
#: PostgreSQL's SQLSTATE for a unique violation: in this schema only a primary key (``events.id``,
#: ``runs.run_id``), i.e. two writers inserting the same id at once; a retry finds the row.
_PG_UNIQUE_VIOLATION = "23505"
_SQLITE_UNIQUE_VIOLATIONS = frozenset({"SQLITE_CONSTRAINT_PRIMARYKEY", "SQLITE_CONSTRAINT_UNIQUE"})
_JOURNAL_CONSUMER = CONSUMERS["journal"].durable
_FINAL = RUN.terminal
_RUN_COLUMNS = tuple(RunSnapshot.model_fields)
_ASK_COLUMNS = tuple(AskSnapshot.model_fields)
#: ``events`` columns in the order of SQLite's positional insert (then ``data``, ``recorded_at``).
_EVENT_COLUMNS = (
    "id",
    "type",
    "source",
    "time",
    "run_id",
    "correlation_id",
    "causation_id",
    "actor",
    "tenant",
    "subject",
    "traceparent",
    "tracestate",
    "stream_seq",
    "commit_seq",
)
#: The envelope attributes :data:`_PG_INSERT_EVENTS` reads from each serialized envelope, with their
#: ``events`` column and type (``run_id`` and ``stream_seq`` come beside the envelope).
_PG_ENVELOPE_FIELDS = (
    ("id", "id", "text"),
    ("type", "type", "text"),
    ("source", "source", "text"),
    ("time", "time", "timestamptz"),
    ("correlationid", "correlation_id", "text"),
    ("causationid", "causation_id", "text"),
    ("actor", "actor", "text"),
    ("tenant", "tenant", "text"),
    ("subject", "subject", "text"),
    ("traceparent", "traceparent", "text"),
    ("tracestate", "tracestate", "text"),
    ("data", "data", "jsonb"),
)
_PG_INSERTED = (*(column for _, column, _ in _PG_ENVELOPE_FIELDS), "run_id", "stream_seq")
#: Fields not read from the envelope's JSON: ``time`` is the model's (``[3]``, RFC 3339 with its offset as
#: pydantic writes it), never the text the publisher sent -- the model's parser is lax (a Unix time as a number or a numeric
#: string; fractions past microseconds truncated) and PostgreSQL's is another (``20261204`` a date, fractions
#: rounded): the row must hold the time the projection and a rebuild (the typed path) use.
_PG_SELECTED = {"time": "(a.r->>3)::timestamptz"}
#: PostgreSQL: a batch's events in one statement and one round trip, under :func:`lock_positions`' lock
#: (``$2``: the last position handed out, ``$3``: ``recorded_at``): the rows whose id is not stored yet
#: (no other journal writer adds any under the lock) get the next positions in the batch's order (stream
#: order, ``ord``), are inserted, and the counter moves to the last position used; the new ids come back.
#: A plain ``INSERT``, no ``ON CONFLICT DO NOTHING``: the ``NOT EXISTS`` under the lock already leaves out every
#: stored id (the recorder is the only writer of ``events``, every one of its transactions under that lock, and a
#: batch's ids are distinct), and what ``ON CONFLICT`` adds to each row (a probe of ``events_pkey`` for a
#: conflict before the insert, the speculative insertion's token and its confirmation) cost ~15-25 % of the statement's server time
#: (6 December, late: ``EXPLAIN ANALYZE`` of a 1,000-event batch on 20,000 rows, 8 alternated runs, median 36 ->
#: 27 ms, fastest 19 -> 16 ms). Should an id turn up stored all the same, the statement fails with a unique
#: violation and nothing is written: the batch falls back to :meth:`Recorder.record` per event, whose insert keeps
#: ``ON CONFLICT DO NOTHING``. ``$1`` is one JSON text (:func:`_pg_batch_json`): an array of
#: ``[envelope, stream_seq, run_id, time]``, each envelope the JSON it was received as, or serialized by its model
#: when it had to be sanitized (``data`` nested). The text is cast to ``jsonb`` once, on the way in: the server
#: parses it once and every later step (the elements, each envelope's fields, ``data``, stored as ``jsonb``) reads
#: the parsed value. As ``json`` (until 2026-12-05) it was text, and each ``->``/``->>`` and ``json_to_record``
#: parsed its element's text again and ``data`` was parsed once more into ``jsonb``: five or six parses of each
#: envelope, about half of the statement's time on the server. (A clean envelope has no ``\u`` escape, so no
#: U+0000, which ``jsonb`` refuses; a sanitized one has none left.) Before, ``data`` was serialized on its own for
#: the storability check, then again as a string inside the batch's JSON (escaped, unescaped, parsed again),
#: and each row's dict was built in Python.


def _pg_insert_events(last: str, recorded_at: str) -> str:
    """The CTEs of :data:`_PG_INSERT_EVENTS` (``batch``, ``inserted``, ``counter``), the positions counted after
    ``last`` and ``recorded_at`` the given SQL expressions."""
    return (
        "WITH batch AS ("
        f"SELECT {', '.join(_PG_SELECTED.get(field, f'b.{field}') + f' AS {column}' for field, column, _ in _PG_ENVELOPE_FIELDS)}, "
        "a.r->>2 AS run_id, (a.r->>1)::bigint AS stream_seq, row_number() OVER (ORDER BY a.ord) AS position "
        "FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS a(r, ord) "
        "CROSS JOIN LATERAL jsonb_to_record(a.r->0) AS b("
        f"{', '.join(f'{field} {kind}' for field, _, kind in _PG_ENVELOPE_FIELDS if field not in _PG_SELECTED)}) "
        "WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.id = b.id)"
        "), inserted AS ("
        f"INSERT INTO events ({', '.join(_PG_INSERTED)}, commit_seq, recorded_at) "
        f"SELECT {', '.join(_PG_INSERTED)}, {last} + position, {recorded_at} "
        "FROM batch RETURNING id, commit_seq"
        "), counter AS ("
        "UPDATE commit_counter SET last_seq = (SELECT max(commit_seq) FROM inserted) "
        "WHERE id = 1 AND EXISTS (SELECT 1 FROM inserted)"
        ")"
    )


_PG_INSERT_EVENTS = _pg_insert_events("$2::bigint", "$3::timestamptz") + " SELECT id FROM inserted"
#: SQLite: a batch's new events in one ``INSERT … ON CONFLICT DO NOTHING``, one parameter row per event (the
#: driver's ``executemany``: one statement prepared once, whatever the batch's size), the values positional (the
#: same columns as PostgreSQL's, then ``data`` as JSON text and ``recorded_at``; :func:`_sqlite_event_rows`).
#: Until 6 December one multi-row ``VALUES (…), (…) … RETURNING id`` per batch: a statement text per batch size,
#: compiled anew for every size a trickle brings, and ids returned that the lookup before it knows already
#: (under the write lock, the ids not stored yet are exactly the ones it inserts).
_SQLITE_INSERT_EVENT = (
    f"INSERT INTO events ({', '.join(_EVENT_COLUMNS)}, data, recorded_at) "
    f"VALUES ({', '.join('?' * (len(_EVENT_COLUMNS) + 2))}) ON CONFLICT (id) DO NOTHING"
)


#: The ids of a batch already stored: one array on PostgreSQL, ``IN (?, …)`` on SQLite.
_PG_KNOWN_IDS = "SELECT id FROM events WHERE id = ANY($1::text[])"


@functools.lru_cache(maxsize=8)
def _sqlite_known_ids(count: int) -> str:
    return f"SELECT id FROM events WHERE id IN ({', '.join('?' * count)})"


def _pg_type(column: Column[Any]) -> str:
    if isinstance(column.type, UTCDateTime):
        return "timestamptz"
    return "bigint" if isinstance(column.type, BigInteger) else "text"


#: PostgreSQL: a batch's new and changed runs in one upsert, the rows as one JSON text (see
#: :data:`_PG_INSERT_EVENTS`).
_PG_UPSERT_RUNS = (
    f"INSERT INTO runs ({', '.join(_RUN_COLUMNS)}) SELECT * FROM json_to_recordset($1::json) AS b("
    + ", ".join(f"{name} {_pg_type(RUNS_TABLE.c[name])}" for name in _RUN_COLUMNS)
    + ") ON CONFLICT (run_id) DO UPDATE SET "
    + ", ".join(f"{name} = EXCLUDED.{name}" for name in _RUN_COLUMNS if name != "run_id")
)
#: PostgreSQL: a batch's runs, locked in one order (``run_id``) between writers, as the driver reads them
#: (``timestamptz`` comes back as aware UTC datetimes, the other columns as stored).
_PG_SELECT_RUNS = (
    f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs WHERE run_id = ANY($1::text[]) ORDER BY run_id FOR UPDATE"
)

#: PostgreSQL's batch on the driver's own connection (:func:`_pg_batch`), three round trips
#: (:data:`_PG_BEGIN_AND_LOCK`, this, :func:`_pg_upsert_and_commit`). The second: :func:`_pg_insert_events` counting from the locked counter, plus the batch's runs read and locked
#: (``$3``: the runs of the batch's projected events, new or not, in one order), all in one result: a first row of
#: the inserted events' ids as one array (empty when none) with nulls, then a row per run, a null array with the
#: run's columns. (Until 7 December a row per inserted id, each with the runs' 20 columns null: receiving and
#: decoding those rows cost ~0.9 us per event of the event loop's CPU, the array ~0.2.)
_PG_RECORD_BATCH = (
    _pg_insert_events("(SELECT last_seq FROM commit_counter WHERE id = 1)", "$2::timestamptz")
    + f", runs_read AS (SELECT {', '.join(_RUN_COLUMNS)} FROM runs WHERE run_id = ANY($3::text[]) "
    "ORDER BY run_id FOR UPDATE) "
    + "SELECT (SELECT coalesce(array_agg(id), '{}') FROM inserted), "
    + f"{', '.join(['NULL'] * len(_RUN_COLUMNS))} "
    + f"UNION ALL SELECT NULL, {', '.join(_RUN_COLUMNS)} FROM runs_read"
)


def _pg_upsert_and_commit(runs: list[RunSnapshot]) -> str:
    """The third round trip of :func:`_pg_batch`: the new and changed runs' upsert
    (:data:`_PG_UPSERT_RUNS`) and ``COMMIT``, one simple query; just ``COMMIT`` when no run changed.

    The runs' JSON goes in as a dollar-quoted literal (a simple query has no parameters), its tag one that does
    not occur in the text: nothing in it is read as SQL, whatever a title or a result holds."""
    if not runs:
        return "COMMIT"
    payload = _pg_runs_json(runs)
    tag = "runs"
    while f"${tag}$" in payload:
        tag += "_"
    return _PG_UPSERT_RUNS.replace("$1::json", f"${tag}${payload}${tag}$::json", 1) + "; COMMIT"


#: SQLite: a batch's new and changed runs in one upsert, one parameter row per run (the driver's
#: ``executemany``, positional values made by :func:`_sqlite_run_values`).
_SQLITE_UPSERT_RUNS = (
    f"INSERT INTO runs ({', '.join(_RUN_COLUMNS)}) VALUES ({', '.join('?' * len(_RUN_COLUMNS))}) "
    "ON CONFLICT (run_id) DO UPDATE SET "
    + ", ".join(f"{name} = excluded.{name}" for name in _RUN_COLUMNS if name != "run_id")
)
#: The positions in :data:`_RUN_COLUMNS` of ``state`` and of the datetimes (SQLite stores those as text).
_RUN_STATE = _RUN_COLUMNS.index("state")
_RUN_DATETIMES = tuple(i for i, name in enumerate(_RUN_COLUMNS) if isinstance(RUNS_TABLE.c[name].type, UTCDateTime))


@functools.lru_cache(maxsize=64)
def _sqlite_select_runs(count: int) -> str:
    """SQLite: a batch's ``count`` runs, in one order (``run_id``), as the driver reads them (datetimes as text)."""
    return f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs WHERE run_id IN ({', '.join('?' * count)}) ORDER BY run_id"


def _sqlite_datetime(value: datetime) -> str:
    """How :class:`~temporality_journal.models.UTCDateTime` stores a datetime on SQLite (naive UTC in
    SQLAlchemy's SQLite ``DATETIME`` text format), so rows inserted here read back as any other."""
    # ``YYYY-MM-DD HH:MM:SS.ffffff``: the first 26 characters of ``isoformat`` (the year always four digits, the
    # fraction six), which a UTC time (an envelope's ``Z``, a time read back) has as they are: no copy made. A time
    # at another offset is converted first; a naive one is UTC already. ``replace(tzinfo=None)`` and ``astimezone``
    # on each time cost ~1 us more per event (the f-string of each field ~2 us).
    if value.tzinfo is not UTC and value.utcoffset():
        value = value.astimezone(UTC)
    return value.isoformat(" ", "microseconds")[:26]


#: PostgreSQL: the counter's row lock. SQLite has no row locks: a no-op write takes the database's write lock.
#: Driver SQL (no statement compiled, cached or wrapped by SQLAlchemy per transaction).
_LOCK_COUNTER_POSTGRESQL = "SELECT last_seq FROM commit_counter WHERE id = 1 FOR UPDATE"
_LOCK_COUNTER_SQLITE = "UPDATE commit_counter SET last_seq = last_seq WHERE id = 1 RETURNING last_seq"
_ADVANCE_COUNTER_POSTGRESQL = "UPDATE commit_counter SET last_seq = $1 WHERE id = 1"
_ADVANCE_COUNTER_SQLITE = "UPDATE commit_counter SET last_seq = ? WHERE id = 1"
#: The first round trip of :func:`_pg_batch`: ``BEGIN`` and the counter's lock in one simple
#: query (its status ``SELECT 1``: the row is there and locked). The lock is a statement of its own: a statement's
#: snapshot is taken when it starts, so the events' statement waiting for the lock itself would not see what the
#: writer it waited for committed (ids stored, runs created).
_PG_BEGIN_AND_LOCK = f"BEGIN; SET LOCAL plan_cache_mode = force_custom_plan; {_LOCK_COUNTER_POSTGRESQL}"


_COUNTER_MISSING = "the journal's commit_counter row is missing (see docs/journal.md, Schema and rebuild)"


async def lock_positions(conn: AsyncConnection) -> int:
    """Lock the commit counter until this transaction ends; the last position handed out so far.

    The first statement of every write transaction of the recorder: the lock (PostgreSQL's row lock,
    SQLite's write lock) serialises the journal's writers, every replica, so a transaction sees the
    counter only once every transaction that took positions before it has committed or rolled back:
    positions are handed out in commit order (see :mod:`temporality_journal.tail`).
    """
    lock = _LOCK_COUNTER_POSTGRESQL if conn.dialect.name == "postgresql" else _LOCK_COUNTER_SQLITE
    last = (await conn.exec_driver_sql(lock)).scalar()
    if last is None:
        raise RuntimeError(_COUNTER_MISSING)
    return int(last)


async def advance_positions(conn: AsyncConnection, last: int) -> None:
    """Record ``last`` as the last position handed out (under :func:`lock_positions`' lock; rolled back with it)."""
    advance = _ADVANCE_COUNTER_POSTGRESQL if conn.dialect.name == "postgresql" else _ADVANCE_COUNTER_SQLITE
    await conn.exec_driver_sql(advance, (last,))


def _storable_text(value: str) -> str:
    if _UNSTORABLE.search(value) is None:
        return value
    value = value.replace("\x00", REPLACEMENT_CHARACTER)
    # Pairs surrogates that form a character and replaces the unpaired ones.
    return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


class _Scrubber:
    """Rebuilds JSON-like values with storable strings, counting the strings it had to change."""

    def __init__(self) -> None:
        self.changed = 0

    def text(self, value: str) -> str:
        clean = _storable_text(value)
        if clean is not value:
            self.changed += 1
        return clean

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            # Should a clean key collide with another after replacement, the later entry wins.
            return {self.text(k) if isinstance(k, str) else k: self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value


def sanitize(event: Envelope) -> tuple[Envelope, list[str]]:
    """``event`` with U+0000 and unpaired surrogates replaced by U+FFFD, and the fields that changed.

    Every string of ``data`` (recursively, keys included) and every text attribute; ``event``
    itself when nothing had to change. The replacement is deterministic, so a redelivered event
    still maps to the same stored id.
    """
    event, changed, _dumped = _cleaned(event)
    return event, changed


def _cleaned(event: Envelope) -> tuple[Envelope, list[str], str | None]:
    """:func:`sanitize`, plus ``data`` as JSON text (``None`` when it is not JSON-serializable).

    The common case (nothing to replace) serializes ``data`` once, for the check and for the insert.
    """
    dumped = _storable_dump(event)
    if dumped is not None:
        return event, [], dumped
    scrubber = _Scrubber()
    update: dict[str, Any] = {}
    for name in type(event).model_fields:
        value = getattr(event, name)
        if isinstance(value, str):
            clean = scrubber.text(value)
            if clean is not value:
                update[name] = clean
    before = scrubber.changed
    data = scrubber.value(event.data)
    if scrubber.changed > before:
        update["data"] = data
    if update:
        event = evolve(event, **update)
    try:
        dumped = to_json(event.data).decode()
    except ValueError:  # not JSON-serializable
        dumped = None
    return event, sorted(update), dumped


def _storable_dump(event: Envelope) -> str | None:
    """``event.data`` as JSON text when nothing in ``event`` needs replacing, else ``None``.

    One serialization of ``data`` by pydantic-core (Rust; the text the engine's ``json_serializer`` makes
    too), then one scan of it, not a walk: it escapes U+0000 as ``\\u0000`` and refuses a lone surrogate
    (it cannot be UTF-8); a false alarm (a string holding a literal backslash-u0000) only takes the slow,
    exact path.
    """
    # one search over the text attributes joined (joining never pairs two lone surrogates)
    if _UNSTORABLE.search("".join([v for v in event.__dict__.values() if isinstance(v, str)])) is not None:
        return None
    try:
        dumped = to_json(event.data)
    except ValueError:  # a lone surrogate, or not JSON-serializable
        return None
    if b"\\u0000" in dumped:
        return None
    return dumped.decode()


def unfixable(exc: DBAPIError) -> bool:
    """Whether retrying cannot make the statement succeed: bad data or a violated constraint.

    PostgreSQL SQLSTATE class 22 (data exception), class 54 (program limit exceeded) and class 23
    (integrity constraint violation),
    or SQLAlchemy's :class:`~sqlalchemy.exc.DataError` / :class:`~sqlalchemy.exc.IntegrityError`
    (SQLite), except a unique violation: only ids are unique here, and two writers inserting the
    same id at once is a race a retry resolves. Anything else (connection lost, database locked
    or down, serialization failure, disk full) may heal and is left to the consumer's backoff.
    """
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate:  # PostgreSQL (asyncpg leaves most errors untyped)
        if sqlstate.startswith(("22", "54")):  # data exception; program limit exceeded (e.g. index row size)
            return True
        return sqlstate.startswith("23") and sqlstate != _PG_UNIQUE_VIOLATION
    if isinstance(exc, IntegrityError):
        return getattr(exc.orig, "sqlite_errorname", None) not in _SQLITE_UNIQUE_VIOLATIONS
    return isinstance(exc, DataError)


def _journal_dead_letter(event: Envelope) -> bool:
    """Whether ``event`` reports a message the journal's own consumer gave up on."""
    return event.type == BusDeadLettered.EVENT_TYPE and event.data.get("consumer") == _JOURNAL_CONSUMER


def _describe(exc: DBAPIError) -> str:
    """The driver's own message (never the statement or its parameters), one line, storable."""
    orig = exc.orig
    lines = str(orig).strip().splitlines() or [""]
    sqlstate = getattr(orig, "sqlstate", None)
    code = f" [SQLSTATE {sqlstate}]" if sqlstate else ""
    return _storable_text(f"{type(orig).__name__}{code}: {lines[0]}"[:512])


class Recorder:
    """Writes events into ``events`` and their projections into ``runs`` and ``asks``. Idempotent by event id."""

    def __init__(
        self,
        database: Database,
        on_commit: Callable[[], None] | None = None,
        on_finished: Callable[[list[tuple[str, str]]], None] | None = None,
    ) -> None:
        """``on_commit`` is called after each commit that stored new events (once per batch, never per
        event): the live tail's wake-up (:class:`temporality_journal.tail.Changes`). ``on_finished`` gets the
        ``(outcome, reason)`` of each run a commit moved into a final state
        (:func:`temporality_journal.metrics.finished_as`; the finished-runs counter), once per commit."""
        self._database = database
        #: PostgreSQL: what :func:`_pg_batch` projects a batch onto while its statement runs
        self._guesses = _Guesses()
        self._insert = postgresql_insert if database.dialect == "postgresql" else sqlite_insert
        self._on_commit = on_commit
        self._on_finished = on_finished

    async def handle(self, event: Envelope, delivery: Delivery) -> None:
        """The :class:`temporality_bus.Consumer` handler."""
        await self.record(event, delivery.stream_seq)

    async def handle_batch(self, batch: list[tuple[Envelope, Delivery]]) -> None:
        """The :class:`temporality_bus.Consumer` batch handler (all-or-nothing; see the module docstring).

        Each envelope comes with the bytes it was decoded from (``delivery.msg.data``): :func:`_plain` reads
        off them that it has nothing to replace."""
        await self.record_batch(
            [(event, delivery.stream_seq) for event, delivery in batch],
            raw=[delivery.msg.data for _, delivery in batch],
        )

    async def record_batch(self, batch: list[tuple[Envelope, int]], *, raw: list[bytes] | None = None) -> int:
        """Store the events (``(event, stream_seq)``) and project them in one transaction; how many were new.

        ``raw``, when given, is the JSON each envelope was decoded from (same order as ``batch``): an envelope
        whose text has no ``\\u`` escape (:func:`_plain`) is stored without checking its strings one by one.
        The same result as :meth:`record` one by one in stream order. A connection found dead (invalidated by
        the failed statement: a database restart since its last use) gets the batch once more on a new one;
        any other database error, or a second one, is raised with nothing written (the caller falls back to
        :meth:`record` per event).
        """
        if raw is not None and len(raw) != len(batch):
            raise ValueError(f"{len(raw)} raw envelopes for a batch of {len(batch)}")
        # (``_plain`` inlined: a call per event)
        texts: list[bytes | None] = (
            [None] * len(batch) if raw is None else [t if b"\\u" not in t else None for t in raw]
        )
        items: Iterable[tuple[tuple[Envelope, int], bytes | None]] = zip(batch, texts, strict=True)
        seqs = [seq for _, seq in batch]
        if seqs != sorted(seqs):  # the consumer's batches come in stream order: sorted only when they do not
            items = sorted(items, key=_by_seq)
        rows: list[_Row] = []
        seen: set[str] = set()
        for (event, stream_seq), text in items:
            if text is not None:  # nothing to replace; data serialized once, where it is stored
                dumped, serializable = None, True
            else:
                dumped = _storable_dump(event)
                if dumped is None:  # something to replace (or not serializable): the exact, slower path
                    event, sanitized, dumped = _cleaned(event)
                    if sanitized:
                        log.warning(
                            "event.sanitized",
                            ce_id=event.id,
                            ce_type=event.type,
                            fields=sanitized,
                            replacement="U+FFFD",
                        )
                serializable = dumped is not None
            if event.id in seen:  # the same id twice in one batch: the first one counts, as one by one
                continue
            seen.add(event.id)
            rows.append(_Row(event, stream_seq, dumped, serializable, text))
        if not rows:
            return 0
        finished: list[tuple[str, str]] = []
        now = datetime.now(UTC)
        # every event serializable and none of an ask: on the driver's own connection (PostgreSQL: three round
        # trips; SQLite: one call into aiosqlite's thread per statement)
        driver = all(row.serializable and not row.ask for row in rows)
        asks = 0
        for attempt in (1, 2):
            try:
                if driver:
                    fresh, moved = await self._record_batch_driver(rows, now, finished)
                    break
                async with self._database.engine.begin() as conn:
                    last = await lock_positions(conn)
                    fresh = await self._insert_events(conn, rows, last, now)  # still in stream order
                    moved = await self._project_batch(conn, fresh, finished)
                    asks = await self._project_asks(conn, fresh)
                break
            except _ConnectionLost as exc:  # as below, on the driver's connection
                if attempt == 2:
                    raise
                log.warning("batch.connection_lost", error=str(exc.__cause__), events=len(rows))
                finished.clear()
            except DBAPIError as exc:
                # a pooled connection lost since its last use (a database restart or failover: the pool pings
                # only connections idle a second or more, :func:`~temporality_journal.database._ping_if_idle`)
                # is invalidated by the failed statement: the batch once more on a fresh one (had the server
                # committed before the connection died, the retry finds every id stored and adds nothing)
                if attempt == 2 or not exc.connection_invalidated:
                    raise
                log.warning("batch.connection_lost", error=str(exc.orig), events=len(rows))
                finished.clear()
        if fresh and self._on_commit is not None:
            self._on_commit()
        if finished and self._on_finished is not None:
            self._on_finished(finished)
        # one line per batch (each run's move is logged at debug): per-event info lines cost more than the SQL
        log.info("batch.recorded", events=len(rows), new=len(fresh), runs_moved=moved, asks_changed=asks)
        return len(fresh)

    async def _record_batch_driver(
        self, rows: list[_Row], now: datetime, finished: list[tuple[str, str]]
    ) -> tuple[list[tuple[Envelope, int]], int]:
        """:meth:`record_batch` in one transaction on the pooled connection's driver connection (asyncpg's or
        aiosqlite's), outside SQLAlchemy: :meth:`_pg_batch` or :meth:`_sqlite_batch`, which commit. The new events
        (stream order) and how many runs moved state.

        On any error the transaction is rolled back before the connection goes back to the pool, or the
        connection is invalidated when that fails (or it is closed, or the task was cancelled): SQLAlchemy never
        sees this transaction, so its own reset on check-in would not end it on PostgreSQL (on SQLite it calls the
        driver's rollback, a second net). A connection found dead raises
        :class:`_ConnectionLost` (the caller tries once more on a new one)."""
        postgresql = self._database.dialect == "postgresql"
        async with self._database.engine.connect() as conn:
            pooled = await conn.get_raw_connection()
            driver = pooled.driver_connection
            assert driver is not None
            try:
                if postgresql:
                    return await _pg_batch(driver, rows, now, finished, self._guesses)
                return await _sqlite_batch(driver, rows, now, finished)
            except Exception as exc:
                lost = _closed(driver)
                if not lost:
                    try:
                        await (driver.execute("ROLLBACK") if postgresql else driver.rollback())
                    except Exception:  # could not end the transaction: the connection must not be reused
                        lost = True
                if lost:
                    await conn.invalidate()
                    if _closed(driver):
                        raise _ConnectionLost(repr(exc)) from exc
                raise
            except BaseException:  # cancelled mid-transaction: closed at once, never handed back mid-transaction
                if postgresql:
                    driver.terminate()
                await conn.invalidate()  # SQLite: closing the connection rolls its transaction back
                raise

    async def _insert_events(
        self, conn: AsyncConnection, rows: list[_Row], last: int, now: datetime
    ) -> list[tuple[Envelope, int]]:
        """Insert ``rows`` unless their id is stored already, at commit positions after ``last``
        (:func:`lock_positions`, in the order of ``rows``); the new ones, as ``(event, stream_seq)``.

        The ids stored already are left out first (under the lock no other journal writer adds any), so
        positions go to new events only: a redelivered batch leaves no gap in the cursor. Every statement is
        the driver's own SQL (``exec_driver_sql``: nothing compiled or bound per value by SQLAlchemy).

        PostgreSQL: :data:`_PG_INSERT_EVENTS`, the lookup, the insert and the counter's move in one
        statement and one round trip, one array per column, ``data`` passed as the JSON text
        :func:`_storable_dump` made anyway (cast to ``jsonb`` by the server). SQLite: ``id IN (?, …)``, then
        :data:`_SQLITE_INSERT_EVENT` ``executemany``'d with positional values (``data`` the same JSON text,
        datetimes in the text SQLAlchemy would store), then the counter. A
        ``data`` that is not JSON-serializable: the lookup, SQLAlchemy core's multi-row insert with the same
        semantics, the counter.
        """
        postgresql = self._database.dialect == "postgresql"
        if postgresql and all(row.serializable for row in rows):
            result = await conn.exec_driver_sql(_PG_INSERT_EVENTS, (_pg_batch_json(rows), last, now))
            new = {row[0] for row in result}
            return [(row.event, row.stream_seq) for row in rows if row.event.id in new]
        ids = [row.event.id for row in rows]
        if postgresql:
            found = await conn.exec_driver_sql(_PG_KNOWN_IDS, (ids,))
        else:
            found = await conn.exec_driver_sql(_sqlite_known_ids(len(ids)), tuple(ids))
        known = {row[0] for row in found}
        if known:
            rows = [row for row in rows if row.event.id not in known]
        if not rows:
            return []
        used = len(rows)  # positions handed out
        if not all(row.serializable for row in rows):
            dicts = [
                {**_event_row(row.event, row.stream_seq, now), "commit_seq": last + offset}
                for offset, row in enumerate(rows, 1)
            ]
            result = await conn.execute(
                self._insert(EVENTS_TABLE).on_conflict_do_nothing(index_elements=["id"]).returning(EVENTS_TABLE.c.id),
                dicts,
            )
            new = {row[0] for row in result}
            rows = [row for row in rows if row.event.id in new]
        else:  # SQLite: the driver's executemany, nothing built per value by SQLAlchemy; under the write lock
            # every id not stored yet is inserted
            await conn.exec_driver_sql(_SQLITE_INSERT_EVENT, _sqlite_event_rows(rows, last, now))
        await advance_positions(conn, last + used)
        return [(row.event, row.stream_seq) for row in rows]

    async def _project_batch(
        self, conn: AsyncConnection, fresh: list[tuple[Envelope, int]], finished: list[tuple[str, str]]
    ) -> int:
        """Project ``fresh`` (new events, stream order) onto their runs; how many state moves. Appends the
        ``(outcome, reason)`` of each run that moved into a final state to ``finished``."""
        projected = _projected(fresh)
        if not projected:
            return 0
        run_ids = sorted({run_id for _, _, run_id in projected})  # one lock order between replicas
        postgresql = self._database.dialect == "postgresql"
        # the rows as stored, copied into snapshots without validating them again
        before: dict[str, RunSnapshot]
        if postgresql:  # the driver's values: nothing converted per value by SQLAlchemy
            found = await conn.exec_driver_sql(_PG_SELECT_RUNS, (run_ids,))
            before = {row[0]: _run_snapshot(dict(zip(_RUN_COLUMNS, row, strict=True))) for row in found}
        else:  # the driver's values too, the datetimes parsed from SQLite's text here
            found = await conn.exec_driver_sql(_sqlite_select_runs(len(run_ids)), tuple(run_ids))
            before = {row[0]: _run_snapshot(_sqlite_run_read(row)) for row in found}
        moved, writes = _project_runs(projected, before, finished)
        if postgresql:  # one array per column, as the events' insert; the new and the changed runs at once
            # (no other writer creates or moves runs meanwhile: every writer holds the commit counter's lock
            # until its commit, and the changed rows are locked above besides)
            if writes:
                await conn.exec_driver_sql(_PG_UPSERT_RUNS, (_pg_runs_json(writes),))
            return moved
        if writes:  # SQLite: the same upsert, one parameter row per run (no other writer: the write lock)
            await conn.exec_driver_sql(_SQLITE_UPSERT_RUNS, [_sqlite_run_values(run) for run in writes])
        return moved

    async def _project_asks(self, conn: AsyncConnection, fresh: list[tuple[Envelope, int]]) -> int:
        """Project the ``agent.*`` events of ``fresh`` (stream order) onto their asks; how many asks changed."""
        projected = [(event, seq, rid) for event, seq in fresh if (rid := request_id_of(event)) is not None]
        if not projected:
            return 0
        ids = sorted({rid for _, _, rid in projected})  # one lock order between replicas
        query = (
            select(ASKS_TABLE)
            .where(ASKS_TABLE.c.request_id.in_(ids))
            .order_by(ASKS_TABLE.c.request_id)
            .with_for_update()
        )
        before: dict[str, AskSnapshot] = {
            row.request_id: AskSnapshot.model_validate(dict(row._mapping)) for row in await conn.execute(query)
        }
        asks: dict[str, AskSnapshot] = dict(before)
        for event, seq, rid in projected:
            try:
                after = project_ask(asks.get(rid), event, seq)
            except InvalidEnvelope as exc:  # stored as it came; a read model must not lose the fact
                log.warning("ask.projection_skipped", ce_id=event.id, request_id=rid, error=str(exc))
                continue
            if after is not None:
                log.debug("ask.moved", request_id=rid, state=after.state.value, ce_type=event.type)
                asks[rid] = after
        created = [_ask_row(ask) for rid, ask in asks.items() if rid not in before]
        changed = [_ask_row(ask) for rid, ask in asks.items() if rid in before and ask != before[rid]]
        if created:  # a plain insert: a replica creating the same ask meanwhile fails the batch (retried)
            await conn.execute(ASKS_TABLE.insert(), created)
        if changed:  # rows locked above
            upsert = self._insert(ASKS_TABLE)
            await conn.execute(
                upsert.on_conflict_do_update(
                    index_elements=["request_id"],
                    set_={name: upsert.excluded[name] for name in _ASK_COLUMNS if name != "request_id"},
                ),
                changed,
            )
        return len(created) + len(changed)

    async def record(self, event: Envelope, stream_seq: int) -> bool:
        """Store ``event`` and apply it to its run; ``False`` (and no change) when its id is known.

        Raises :class:`temporality_bus.PermanentError` when the database refuses the event for good.
        """
        event, sanitized = sanitize(event)
        if sanitized:
            log.warning("event.sanitized", ce_id=event.id, ce_type=event.type, fields=sanitized, replacement="U+FFFD")
        finished: list[tuple[str, str]] = []
        try:
            async with self._database.sessions() as session, session.begin():
                if not await self._store(session, event, stream_seq):
                    log.debug("event.duplicate", ce_id=event.id)
                    return False
                await self._project(session, event, stream_seq, finished)
                await self._project_asks(await session.connection(), [(event, stream_seq)])
        except DBAPIError as exc:
            if not unfixable(exc):
                raise
            if _journal_dead_letter(event):  # giving up would journal one more refused dead letter, forever
                log.error("event.dead_letter_unstorable", ce_id=event.id, error=_describe(exc))
                raise
            raise PermanentError(f"the journal cannot store event {event.id}: {_describe(exc)}") from exc
        if self._on_commit is not None:
            self._on_commit()
        if finished and self._on_finished is not None:
            self._on_finished(finished)
        log.debug("event.recorded", ce_id=event.id, ce_type=event.type, stream_seq=stream_seq)
        return True

    async def _store(self, session: AsyncSession, event: Envelope, stream_seq: int) -> bool:
        conn = await session.connection()
        position = await lock_positions(conn) + 1
        statement = (
            self._insert(EventRecord)
            .values(**_event_row(event, stream_seq, datetime.now(UTC)), commit_seq=position)
            .on_conflict_do_nothing(index_elements=["id"])
            .returning(col(EventRecord.id))
        )
        result = await session.exec(statement)
        if result.first() is None:  # known already: no position used
            return False
        await advance_positions(conn, position)
        return True

    async def _project(
        self, session: AsyncSession, event: Envelope, stream_seq: int, finished: list[tuple[str, str]]
    ) -> None:
        run_id = run_id_of(event)
        if run_id is None or event.type not in PROJECTED_TYPES:
            return
        row = await session.get(RunRecord, run_id, with_for_update=True)  # serialises replicas on PostgreSQL
        try:
            after = project(row.snapshot() if row is not None else None, event, stream_seq)
        except InvalidEnvelope as exc:  # stored as it came; a read model must not lose the fact
            log.warning("run.projection_skipped", ce_id=event.id, run_id=run_id, error=str(exc))
            return
        if after is None:
            return
        moved = row is None or row.state != after.state
        if row is None:
            session.add(RunRecord(**after.model_dump()))
        else:
            row.sqlmodel_update(after.model_dump(exclude={"run_id"}))
        if moved:
            log.info("run.moved", run_id=run_id, state=after.state.value, ce_type=event.type)
            if after.state in _FINAL:
                finished.append(finished_as(after.state, event))


def _closed(driver: Any) -> bool:
    """Whether the driver connection is closed (asyncpg tells; aiosqlite's is closed only by the pool)."""
    is_closed = getattr(driver, "is_closed", None)
    return bool(is_closed()) if is_closed is not None else False


async def _pg_batch(
    driver: Any,
    rows: list[_Row],
    now: datetime,
    finished: list[tuple[str, str]],
    guesses: _Guesses,
) -> tuple[list[tuple[Envelope, int]], int]:
    """PostgreSQL's batch in three round trips on asyncpg's connection (SQLAlchemy sends ``BEGIN``, each
    statement and ``COMMIT`` apart: six): ``BEGIN`` and the counter's lock (:data:`_PG_BEGIN_AND_LOCK`); the
    events' insert with the batch's runs read and locked (:data:`_PG_RECORD_BATCH`); the runs' upsert and
    ``COMMIT`` (:func:`_pg_upsert_and_commit`).

    While the server runs the second, the batch is projected on a guess (:meth:`_Guesses.guess`): every event new,
    each run as this recorder last committed it (a run it does not know: absent). The guess is used only when the
    statement's answer confirms it -- every event inserted, every run read exactly as guessed (under the counter's
    lock: no other writer meanwhile) --, else the projection is made again from what was read: the same runs either
    way. ``guesses`` learns the batch's runs after the commit."""
    locking = asyncio.ensure_future(driver.execute(_PG_BEGIN_AND_LOCK))
    try:
        # the batch's JSON and its runs made while the lock's round trip is under way (on the critical path before)
        await asyncio.sleep(0)  # the lock on its way to the server first
        payload = _pg_batch_json(rows)
        run_ids = sorted({run_id for row in rows if row.projected and (run_id := row.run_id) is not None})
        status = await locking
    finally:
        if not locking.done():  # cancelled or failed meanwhile (the caller closes the connection)
            locking.cancel()
            locking.add_done_callback(_retrieved)
    if status != "SELECT 1":
        raise RuntimeError(_COUNTER_MISSING)
    statement = asyncio.ensure_future(driver.fetch(_PG_RECORD_BATCH, payload, now, run_ids))
    try:
        await asyncio.sleep(0)  # the statement on its way to the server before the projection takes the loop
        guess = guesses.guess(rows, run_ids)
        result = await statement
    finally:
        if not statement.done():  # cancelled meanwhile: the statement too (the caller closes the connection)
            statement.cancel()
            statement.add_done_callback(_retrieved)
    new: set[str] = set()
    before: dict[str, RunSnapshot] = {}
    for record in result:
        if record[0] is not None:  # the inserted ids (the first row)
            new.update(record[0])
        else:
            values = dict(zip(_RUN_COLUMNS, tuple(record)[1:], strict=True))
            before[values["run_id"]] = _run_snapshot(values)
    fresh_rows = [row for row in rows if row.event.id in new] if len(new) < len(rows) else rows
    projection: _Projection | None = None
    if guess is not None and fresh_rows is rows and _as_guessed(before, guess.before):
        projection = guess
    else:
        projection = _project(_projected_rows(fresh_rows), before)
    if guess is not None:
        guesses.judged(projection is guess)
    projection.log_lines()
    finished.extend(projection.finished)
    await driver.execute(_pg_upsert_and_commit(projection.writes()))
    guesses.remember(run_ids, projection.runs)
    return [(row.event, row.stream_seq) for row in fresh_rows], projection.moved


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Take a left statement's outcome (its error is the cancellation's: not worth a "never retrieved" warning)."""
    if not task.cancelled():
        task.exception()


class _Guesses:
    """What :func:`_pg_batch` guesses a batch's runs are: each run as this recorder last committed it (``None``:
    known absent), the most recent ones -- a backlog's batches mostly continue the runs of the batches before them.
    Not remembered: a run in a final state (it rarely gets another event, and its ``result`` or ``error`` can be
    long), nor one of more than :data:`MAX_RUN_CHARS` characters of texts: their guess falls back. At most
    :data:`MAX_RUNS` runs and :data:`MAX_CHARS` characters of their texts (the oldest forgotten first). Measured
    (6 December 2026, deep ``sys.getsizeof`` of the runs remembered): a run of short texts 2.2-2.3 KB, 4,096 of
    them ~9 MB; runs with 4,096-character questions: 250 kept, 1.6 MB (ASCII) to 5.7 MB (2-byte characters, each
    string also holding its cached UTF-8 form). A guess that proved wrong (the runs are older than that, another
    replica writes too) costs the projection's CPU once more for nothing: after one, the next batches are not
    guessed (1, 2, 4 … up to :data:`MAX_SKIP` of them, back to none after a right one)."""

    MAX_RUNS = 4096
    MAX_CHARS = 1 << 20  # of the remembered runs' texts (str fields)
    MAX_RUN_CHARS = MAX_CHARS // 64  # of one run's texts (a larger one would push out 64 others or more)
    MAX_SKIP = 64

    __slots__ = ("_backoff", "_chars", "_sizes", "_skip", "runs")

    def __init__(self) -> None:
        self.runs: dict[str, RunSnapshot | None] = {}
        self._sizes: dict[str, int] = {}  # each remembered run's texts' characters (:func:`_chars_of`)
        self._chars = 0  # their sum
        self._skip = 0  # batches still not to guess
        self._backoff = 0  # how many the next wrong guess skips

    def guess(self, rows: list[_Row], run_ids: list[str]) -> _Projection | None:
        """The batch's projection if every event is new and every run is as last committed here; ``None`` when
        there is nothing to guess (no run), guessing is backing off, or the guess failed."""
        if not run_ids:
            return None
        if self._skip:
            self._skip -= 1
            return None
        runs = self.runs
        assumed = {run_id: run for run_id in run_ids if (run := runs.get(run_id)) is not None}
        try:
            return _project(_projected_rows(rows), assumed)
        except Exception as exc:  # the guess must not fail the batch: the projection is made again from the rows read
            # (which raises the error itself if it is the code's): no error line, no traceback of its own
            log.debug("batch.projection_guess_failed", error=repr(exc))
            return None

    def judged(self, right: bool) -> None:
        """Whether the batch's guess held: back off after a wrong one."""
        if right:
            self._backoff = 0
        else:
            self._backoff = min(max(1, 2 * self._backoff), self.MAX_SKIP)
            self._skip = self._backoff

    def remember(self, run_ids: list[str], after: dict[str, RunSnapshot]) -> None:
        """Note each of ``run_ids`` as just committed (``after``: the batch's runs after it; a run not in it stays
        absent; a run in a final state or of too long texts is forgotten), the most recent last, keeping at most
        :data:`MAX_RUNS` runs and :data:`MAX_CHARS` characters of texts."""
        runs = self.runs
        sizes = self._sizes
        chars = self._chars
        for run_id in run_ids:
            if runs.pop(run_id, _FORGOTTEN) is not _FORGOTTEN:
                chars -= sizes.pop(run_id, 0)
            run = after.get(run_id)
            if run is None:
                runs[run_id] = None
            elif run.state not in _FINAL and (size := _chars_of(run)) <= self.MAX_RUN_CHARS:
                runs[run_id] = run
                sizes[run_id] = size
                chars += size
        excess = len(runs) - self.MAX_RUNS
        if excess > 0 or chars > self.MAX_CHARS:
            forgotten: list[str] = []
            for run_id in runs:  # the oldest first
                if excess <= 0 and chars <= self.MAX_CHARS:
                    break
                forgotten.append(run_id)
                excess -= 1
                chars -= sizes.pop(run_id, 0)
            for run_id in forgotten:
                del runs[run_id]
        self._chars = chars


_FORGOTTEN: Any = object()  # what :meth:`_Guesses.remember` finds for a run it does not remember
#: A run's text fields (every ``str`` field but ``state``), read at once
_RUN_TEXTS = operator.itemgetter(
    *(name for name, field in RunSnapshot.model_fields.items() if field.annotation in (str, str | None))
)


def _chars_of(run: RunSnapshot) -> int:
    """The characters of ``run``'s texts (what can be long)."""
    return sum(map(len, filter(None, _RUN_TEXTS(run.__dict__))))


def _as_guessed(read: dict[str, RunSnapshot], assumed: dict[str, RunSnapshot]) -> bool:
    """Whether the runs read are exactly the ones the guess assumed (the same runs present, field for field)."""
    return read.keys() == assumed.keys() and all(same(run, assumed[run_id]) for run_id, run in read.items())


async def _sqlite_batch(
    driver: Any, rows: list[_Row], now: datetime, finished: list[tuple[str, str]]
) -> tuple[list[tuple[Envelope, int]], int]:
    """SQLite's batch on aiosqlite's connection: the counter's lock (the driver's implicit ``BEGIN``, then the
    write lock, :data:`_LOCK_COUNTER_SQLITE`), the batch's ids stored already, the others' insert
    (:data:`_SQLITE_INSERT_EVENT`, ``executemany``), the counter moved, the runs read; projected here; the runs
    upserted (:data:`_SQLITE_UPSERT_RUNS`, ``executemany``), ``COMMIT``. No other writer meanwhile: the write lock,
    held from the first statement to the commit.

    Three calls into aiosqlite's thread (:func:`_in_sqlite_thread`): the lock with the ids' lookup; the insert,
    the counter and the runs' read; the upsert with the commit -- each call a hand-over to that thread and a
    wake-up of the event loop, which cost more than the statements of a live batch of a few dozen events (one call
    per statement, seven, before 6 December, late). The events' and runs' values are made on the event loop, the
    projection too (its log lines keep the batch's context): the thread runs only the statements, as before (made
    there, the values' Python work contended with the loop's for the GIL: 1.13-1.17x CPU per event in a backlog).
    With an aiosqlite that lacks the thread's entry point, one call per statement
    (:func:`_sqlite_batch_per_statement`)."""
    if not _runs_in_sqlite_thread(driver):
        return await _sqlite_batch_per_statement(driver, rows, now, finished)
    last, known = await _in_sqlite_thread(driver, _sqlite_lock_and_look_up, [r.event.id for r in rows])
    new = [row for row in rows if row.event.id not in known] if known else rows
    projected = _projected_rows(new)
    run_ids = sorted({run_id for _, _, run_id in projected})
    found = await _in_sqlite_thread(
        driver, _sqlite_insert_and_read, _sqlite_event_rows(new, last, now), last + len(new), run_ids
    )
    moved = 0
    writes: list[RunSnapshot] = []
    if projected:
        before = {row[0]: _run_snapshot(_sqlite_run_read(row)) for row in found}
        moved, writes = _project_runs(projected, before, finished)
    await _in_sqlite_thread(driver, _sqlite_upsert_and_commit, [_sqlite_run_values(run) for run in writes])
    return [(row.event, row.stream_seq) for row in new], moved


def _runs_in_sqlite_thread(driver: Any) -> bool:
    """Whether ``driver`` (aiosqlite's connection) has the entry point :func:`_in_sqlite_thread` uses."""
    return callable(getattr(driver, "_execute", None)) and hasattr(type(driver), "_conn")


async def _in_sqlite_thread(driver: Any, function: Callable[..., Any], *args: Any) -> Any:
    """``function(sqlite3_connection, *args)`` in aiosqlite's thread, as each of its own methods runs there (its
    ``_execute``, with the ``sqlite3`` connection it holds): one hand-over for several statements."""
    return await driver._execute(lambda: function(driver._conn, *args))


def _sqlite_lock_and_look_up(conn: Any, ids: list[str]) -> tuple[int, set[str]]:
    """In aiosqlite's thread: lock the counter; its last position and which of ``ids`` are stored already."""
    lock = conn.execute(_LOCK_COUNTER_SQLITE).fetchall()
    if not lock:
        raise RuntimeError(_COUNTER_MISSING)
    if not conn.in_transaction:  # an autocommit connection would write half a batch on a failure: never
        raise RuntimeError("the journal's SQLite connection is in autocommit mode: a batch needs one transaction")
    return int(lock[0][0]), {row[0] for row in conn.execute(_sqlite_known_ids(len(ids)), ids).fetchall()}


def _sqlite_insert_and_read(conn: Any, values: list[tuple[Any, ...]], last: int, run_ids: list[str]) -> list[Any]:
    """In aiosqlite's thread: insert the new events (positional values), move the counter to ``last``; the
    ``runs`` rows of ``run_ids``."""
    if values:
        conn.executemany(_SQLITE_INSERT_EVENT, values)
        conn.execute(_ADVANCE_COUNTER_SQLITE, (last,))
    if not run_ids:
        return []
    return list(conn.execute(_sqlite_select_runs(len(run_ids)), run_ids).fetchall())


def _sqlite_upsert_and_commit(conn: Any, values: list[tuple[Any, ...]]) -> None:
    """In aiosqlite's thread: upsert the projected runs (positional values), ``COMMIT``."""
    if values:
        conn.executemany(_SQLITE_UPSERT_RUNS, values)
    conn.commit()


async def _sqlite_batch_per_statement(
    driver: Any, rows: list[_Row], now: datetime, finished: list[tuple[str, str]]
) -> tuple[list[tuple[Envelope, int]], int]:
    """:func:`_sqlite_batch` through aiosqlite's public methods, one call into its thread per statement."""
    lock = await driver.execute_fetchall(_LOCK_COUNTER_SQLITE)
    if not lock:
        raise RuntimeError(_COUNTER_MISSING)
    if not driver.in_transaction:  # an autocommit connection would write half a batch on a failure: never
        raise RuntimeError("the journal's SQLite connection is in autocommit mode: a batch needs one transaction")
    last = int(lock[0][0])
    known = {row[0] for row in await driver.execute_fetchall(_sqlite_known_ids(len(rows)), [r.event.id for r in rows])}
    new = [row for row in rows if row.event.id not in known] if known else rows
    if new:
        await driver.executemany(_SQLITE_INSERT_EVENT, _sqlite_event_rows(new, last, now))
        await driver.execute(_ADVANCE_COUNTER_SQLITE, (last + len(new),))
    fresh = [(row.event, row.stream_seq) for row in new]
    moved = 0
    projected = _projected_rows(new)
    if projected:
        run_ids = sorted({run_id for _, _, run_id in projected})
        found = await driver.execute_fetchall(_sqlite_select_runs(len(run_ids)), run_ids)
        before = {row[0]: _run_snapshot(_sqlite_run_read(row)) for row in found}
        moved, writes = _project_runs(projected, before, finished)
        if writes:
            await driver.executemany(_SQLITE_UPSERT_RUNS, [_sqlite_run_values(run) for run in writes])
    await driver.commit()
    return fresh, moved


class _ConnectionLost(Exception):
    """The driver's connection died under :meth:`Recorder._record_batch_driver` (its cause the driver's error)."""


def _projected(fresh: list[tuple[Envelope, int]]) -> list[tuple[Envelope, int, str]]:
    """The events of ``fresh`` the run projection applies to, with their run."""
    return [
        (event, seq, run_id)
        for event, seq in fresh
        if event.type in PROJECTED_TYPES and (run_id := run_id_of(event)) is not None
    ]


def _projected_rows(rows: list[_Row]) -> list[tuple[Envelope, int, str]]:
    """:func:`_projected` of a batch's rows, from what each row read once."""
    return [(row.event, row.stream_seq, run_id) for row in rows if row.projected and (run_id := row.run_id) is not None]


class _Projection:
    """A batch's run projection (:func:`_project`): the runs before (as read, or as guessed) and after, how many
    state moves, the ``(outcome, reason)`` of each run that moved into a final state, the events skipped, the
    moves to log at debug (only when debug is on). Nothing is logged until :meth:`log_lines`: a guess may be
    refused, or its batch cancelled."""

    __slots__ = ("before", "finished", "moved", "moves", "runs", "skipped")

    def __init__(self, before: dict[str, RunSnapshot]) -> None:
        self.before = before
        self.runs: dict[str, RunSnapshot] = dict(before)
        self.moved = 0
        self.finished: list[tuple[str, str]] = []
        self.skipped: list[tuple[str, str, str]] = []
        self.moves: list[tuple[str, str, str]] = []  # (run id, state, event type)

    def writes(self) -> list[RunSnapshot]:
        """The new and the changed runs (new first), to write back."""
        before = self.before
        created = [run for run_id, run in self.runs.items() if run_id not in before]
        changed = [run for run_id, run in self.runs.items() if run_id in before and not same(run, before[run_id])]
        return created + changed

    def log_lines(self) -> None:
        """Log the events whose data the projection refused, and its moves at debug: for the projection written
        only, once (a guess not used logs nothing)."""
        for ce_id, run_id, error in self.skipped:
            log.warning("run.projection_skipped", ce_id=ce_id, run_id=run_id, error=error)
        if self.moves:
            debug = log.bind()  # resolved once: a lazy logger resolves itself at every call
            for run_id, state, ce_type in self.moves:
                debug.debug("run.moved", run_id=run_id, state=state, ce_type=ce_type)


def _project(projected: list[tuple[Envelope, int, str]], before: dict[str, RunSnapshot]) -> _Projection:
    """Project ``projected`` (stream order) onto the runs ``before`` (as stored; a run not in it is new), in
    memory; nothing logged (:meth:`_Projection.log_lines` does). ``before``'s rows are left as they are: a run's
    first change in the batch copies it (:func:`~temporality_journal.models.updated`), its later ones change that
    copy in place -- one copy per run and batch instead of one per event (~2 us per projected event)."""
    result = _Projection(before)
    runs = result.runs
    own: set[str] = set()  # the runs whose row in ``runs`` this batch made (a copy, or a new run's blank row)
    # each move's debug line only when it is written (its arguments cost ~0.4 us per projected event)
    trace = getattr(log.bind(), "is_enabled_for", lambda _level: True)(logging.DEBUG)
    for event, seq, run_id in projected:
        current = runs.get(run_id)
        try:  # type and run checked by _projected
            found = update_onto(current, event, seq, run_id)
        except InvalidEnvelope as exc:  # stored as it came; a read model must not lose the fact
            result.skipped.append((event.id, run_id, str(exc)))
            continue
        if found is None:
            continue
        run, update = found
        was = None if current is None else current.state  # (read before a change in place)
        if current is None or run_id in own:  # a new run's blank row, or this batch's copy (a field set to the
            # value it has changes nothing; a run copied for nothing is left out by writes())
            run.__dict__.update(update)
        else:
            run = updated(current, update)
        runs[run_id] = run
        own.add(run_id)
        state = run.state
        if was is None or was != state:
            result.moved += 1
            if trace:
                result.moves.append((run_id, state.value, event.type))
            if state in _FINAL:
                result.finished.append(finished_as(state, event))
    return result


def _project_runs(
    projected: list[tuple[Envelope, int, str]], before: dict[str, RunSnapshot], finished: list[tuple[str, str]]
) -> tuple[int, list[RunSnapshot]]:
    """Project ``projected`` (stream order) onto the runs ``before`` (as stored; a run not in it is new), in
    memory: how many state moves, and the new and changed runs to write. Appends the ``(outcome, reason)`` of
    each run that moved into a final state to ``finished``."""
    result = _project(projected, before)
    result.log_lines()
    finished.extend(result.finished)
    return result.moved, result.writes()


def _event_row(event: Envelope, stream_seq: int, recorded_at: datetime) -> dict[str, Any]:
    return {
        "id": event.id,
        "type": event.type,
        "source": event.source,
        "time": as_utc(event.time),
        "run_id": run_id_of(event),
        "correlation_id": event.correlationid,
        "causation_id": event.causationid,
        "actor": event.actor,
        "tenant": event.tenant,
        "subject": event.subject,
        "traceparent": event.traceparent,
        "tracestate": event.tracestate,
        "stream_seq": stream_seq,
        "data": event.data,
        "recorded_at": recorded_at,
    }


class _Row:
    """An event of a batch on its way into ``events``: ``dumped`` is its ``data`` as JSON text when the
    storability check made it (``None``: not made, or not made because ``data`` is not JSON-serializable,
    which ``serializable`` tells apart); ``raw`` the JSON the envelope was decoded from when it holds nothing
    to replace (:func:`_plain`), else ``None``."""

    __slots__ = ("ask", "dumped", "event", "projected", "raw", "run_id", "serializable", "stream_seq")

    def __init__(
        self, event: Envelope, stream_seq: int, dumped: str | None, serializable: bool, raw: bytes | None = None
    ) -> None:
        self.event = event
        self.stream_seq = stream_seq
        self.dumped = dumped
        self.serializable = serializable
        self.raw = raw
        #: :func:`run_id_of` the event, read once (the batch needs it three or four times)
        self.run_id = run_id_of(event)
        #: whether the run projection applies to it (:func:`_projected`)
        self.projected = self.run_id is not None and event.type in PROJECTED_TYPES
        #: whether it is an event of an ask (:func:`~temporality_journal.asks.request_id_of`): such a batch takes
        #: SQLAlchemy's path
        self.ask = request_id_of(event) is not None

    def data_text(self) -> str:
        """``data`` as JSON text (pydantic-core's, as the engine's ``json_serializer`` writes it); only for a
        serializable row."""
        return self.dumped if self.dumped is not None else to_json(self.event.data).decode()


def _by_seq(item: tuple[tuple[Envelope, int], object]) -> int:
    return item[0][1]


def _plain(raw: bytes) -> bool:
    """Whether the envelope decoded from the JSON ``raw`` certainly holds nothing to replace (:func:`sanitize`).

    In JSON text U+0000 and a lone surrogate can only be written as ``\\u`` escapes: a raw control character
    in a string, or a surrogate encoded as UTF-8, is invalid JSON that the decoder refuses (and ``data_base64``,
    whose bytes would not show here, is refused too). So text without any ``\\u`` decodes to storable strings
    only, keys and attributes included, and ``data`` is JSON-serializable since it came from JSON. An escape
    (pydantic-core writes one only for a control character) sends the envelope through the exact check.
    """
    return b"\\u" not in raw


def _pg_batch_json(rows: list[_Row]) -> str:
    """``$1`` of :data:`_PG_INSERT_EVENTS`: ``[envelope, stream_seq, run_id, time]`` per row, one JSON text. The
    envelope is the JSON it was decoded from when it holds nothing to replace (``raw``: the consumer's bytes,
    validated by the envelope's model on the way in, not serialized again), else its model's serialization by
    pydantic-core (the sanitized copy); ``time`` is always the model's (:data:`_PG_SELECTED`)."""
    parts = [
        b"[%b,%d,%b,%b]"
        % (
            row.raw if row.raw is not None else to_json(row.event),
            row.stream_seq,
            to_json(row.run_id),
            to_json(row.event.time),
        )
        for row in rows
    ]
    return (b"[" + b",".join(parts) + b"]").decode()


def _sqlite_event_rows(rows: list[_Row], last: int, now: datetime) -> list[tuple[Any, ...]]:
    """The parameter rows of :data:`_SQLITE_INSERT_EVENT`, at the commit positions after ``last``."""
    recorded_at = _sqlite_datetime(now)
    return [
        (
            (e := row.event).id,
            e.type,
            e.source,
            _sqlite_datetime(e.time),
            row.run_id,
            e.correlationid,
            e.causationid,
            e.actor,
            e.tenant,
            e.subject,
            e.traceparent,
            e.tracestate,
            row.stream_seq,
            position,
            row.data_text(),
            recorded_at,
        )
        for position, row in enumerate(rows, last + 1)
    ]


def _run_snapshot(values: dict[str, Any]) -> RunSnapshot:
    """A ``runs`` row (every column; datetimes aware UTC) as a snapshot, not validated again (the journal
    wrote it from a validated snapshot)."""
    values["state"] = RunState(values["state"])
    return constructed(RunSnapshot, values)


def _pg_runs_json(runs: list[RunSnapshot]) -> str:
    """``$1`` of :data:`_PG_UPSERT_RUNS`: the runs as one JSON array of objects keyed by the columns of
    ``runs`` (one string for the driver to encode, as the events' insert)."""
    return to_json([_run_row(run) for run in runs]).decode()


def _sqlite_run_values(run: RunSnapshot) -> tuple[Any, ...]:
    """A run as :data:`_SQLITE_UPSERT_RUNS`' positional values: ``state`` its value, datetimes the text
    :class:`~temporality_journal.models.UTCDateTime` stores on SQLite (:func:`_sqlite_datetime`)."""
    values = run.__dict__
    row = [values[name] for name in _RUN_COLUMNS]
    row[_RUN_STATE] = run.state.value
    for i in _RUN_DATETIMES:
        if row[i] is not None:
            row[i] = _sqlite_datetime(row[i])
    return tuple(row)


def _sqlite_run_read(row: Sequence[Any]) -> dict[str, Any]:
    """A ``runs`` row as SQLite's driver returns it (:func:`_sqlite_select_runs`), keyed by column, its
    datetimes aware UTC (the naive UTC text :class:`~temporality_journal.models.UTCDateTime` stores)."""
    values = list(row)
    for i in _RUN_DATETIMES:
        if values[i] is not None:
            values[i] = datetime.fromisoformat(values[i]).replace(tzinfo=UTC)
    return dict(zip(_RUN_COLUMNS, values, strict=True))


def _run_row(run: RunSnapshot) -> dict[str, Any]:
    row = run.__dict__.copy()  # exactly the columns (the batch's snapshots are made by constructed/updated)
    row["state"] = run.state.value
    return row


def _ask_row(ask: AskSnapshot) -> dict[str, Any]:
    row = {name: getattr(ask, name) for name in _ASK_COLUMNS}
    row["state"] = ask.state.value
    return row
