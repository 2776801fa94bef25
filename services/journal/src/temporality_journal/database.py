"""The journal's database: an async engine (aiosqlite or asyncpg), its tables, a session factory.

The schema is versioned with Alembic (``temporality_journal/migrations``): :meth:`Database.open`
upgrades to the newest revision under a PostgreSQL advisory lock (replicas starting together migrate
once). A database made by an older journal with ``create_all`` (tables, no version table) is stamped
with the revision its tables match first (``0001``; ``0002`` with ``asks``; ``0003`` with
``commit_counter``; ``0004_trace`` with ``events.traceparent``). :meth:`Database.reset_read_model` drops the tables and the version table and re-creates them: the
last step of a rebuild (``temporality-journal rebuild``, see :mod:`temporality_journal.rebuild`); it keeps
``revoked_sessions`` (sign-outs, :mod:`temporality_journal.revocation`: not in the streams, so not rebuilt).
A database at a revision this journal does not know (a newer journal migrated it) raises :class:`SchemaTooNew`,
whose message names the way back: :meth:`Database.downgrade` (``temporality-journal downgrade <revision>``, run by
the newer journal; :mod:`temporality_journal.schema`). A start that must wait for another replica's migration
logs ``database.migration_lock_waiting``.

**TLS to PostgreSQL** (:class:`DatabaseTls`): libpq's ``sslmode``, ``sslrootcert``, ``sslcert`` and ``sslkey``,
given in the URL's query (``postgresql://…?sslmode=verify-full&sslrootcert=/ca.pem``) or as the journal's
settings (``TEMPORALITY_DATABASE_SSLMODE`` …, which win over the URL), become asyncpg's ``ssl`` argument:
``disable``/``allow``/``prefer``/``require`` as asyncpg's own modes (``require`` encrypts without checking the
server), ``verify-ca`` (the server's certificate chains to ``sslrootcert``, or the system's CAs) and
``verify-full`` (and names the host) as an :class:`ssl.SSLContext`; ``sslcert``/``sslkey`` are a client
certificate. ``require`` with an ``sslrootcert`` verifies the chain, as libpq does. A file that cannot be
read is a configuration error at start.

**Commit durability** (:class:`DatabaseDurability`, docs/operations.md#durability-and-retention): every SQLite
connection the engine opens runs ``PRAGMA synchronous=NORMAL`` (the default: WAL fsynced at checkpoints, a power
cut may take the last commits) or ``FULL`` (fsync at every commit); ``OFF`` is not offered (a power cut may
corrupt the file). Every PostgreSQL connection is opened with ``synchronous_commit`` set (asyncpg's
``server_settings``: part of the connection's start-up, no extra round trip) when one is chosen; unset, the
server's (or role's) own applies.

**Case-insensitive text search** (:meth:`Database.folded`, the run search ``q``): SQLite's ``lower()`` and
``LIKE`` fold ASCII only, so every SQLite connection gets ``temporality_casefold(text)`` (Python's
``str.casefold``, registered at connect and called only by the queries that search; the recorder's writes never
call it). PostgreSQL's ``lower()`` folds by the database's collation: a database made with ``LC_CTYPE=C`` folds
ASCII only, so :meth:`Database.open` checks once whether the default collation lowers ``ÄЖ``, and otherwise folds
with the first of ``und-x-icu``, ``C.utf8``, ``C.UTF-8``, ``en_US.utf8`` that does (none: the default, and a
warning ``database.fold_ascii_only``).
"""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, get_args

import structlog
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from pydantic_core import to_json
from sqlalchemy import ColumnElement, Connection, String, event, func, inspect, literal, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlmodel.ext.asyncio.session import AsyncSession

from temporality_journal.models import JournalModel

__all__ = [
    "BASELINE_REVISION",
    "DOWNGRADE_COMMAND",
    "KEPT_BY_REBUILD",
    "MIGRATIONS_DIR",
    "VERSION_TABLE",
    "Database",
    "DatabaseDurability",
    "DatabaseTls",
    "Migration",
    "PostgresSynchronousCommit",
    "SchemaTooNew",
    "SqliteSynchronous",
    "SslMode",
    "async_url",
    "connect_args",
    "head_revision",
    "migrations",
]

log = structlog.get_logger(__name__)

#: Serialises ``CREATE TABLE`` between journal replicas starting together on one PostgreSQL.
_DDL_LOCK_KEY = 0x7E3A_0A11
#: Serialises the start's "replay the stream into an empty read model?" decision between replicas
#: (:meth:`Database.serialised`, :func:`temporality_journal.rebuild.replay_into_empty`).
_START_LOCK_KEY = 0x7E3A_0A12
#: The command that takes the schema back to an older journal's revision (named in :class:`SchemaTooNew`).
DOWNGRADE_COMMAND = "temporality-journal downgrade"
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
#: Where Alembic keeps the schema revision (``migrations/env.py`` uses the same name).
VERSION_TABLE = "journal_schema_version"
#: The schema ``create_all`` made before migrations existed.
BASELINE_REVISION = "0001"
#: The revision that added ``asks`` (an unversioned database that has it is stamped there).
ASKS_REVISION = "0002"
#: The revision that added ``events.commit_seq`` and ``commit_counter`` (the live tail's commit order).
COMMIT_ORDER_REVISION = "0003"
#: The revision that added ``events.traceparent`` and ``events.tracestate``.
TRACE_CONTEXT_REVISION = "0004_trace"
_ASYNC_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "postgres": "postgresql+asyncpg",
    "postgresql": "postgresql+asyncpg",
}


#: libpq's ``sslmode`` values.
SslMode = Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]
_SSL_MODES: tuple[str, ...] = get_args(SslMode)
#: The libpq TLS parameters a URL's query may carry (taken out of it: asyncpg knows none of them).
_TLS_PARAMETERS = ("sslmode", "sslrootcert", "sslcert", "sslkey")


#: SQLite's ``PRAGMA synchronous`` the journal may run with (``off`` is refused: a power cut may corrupt the file).
SqliteSynchronous = Literal["normal", "full"]
#: PostgreSQL's ``synchronous_commit`` values.
PostgresSynchronousCommit = Literal["on", "off", "local", "remote_write", "remote_apply"]


@dataclass(frozen=True)
class DatabaseDurability:
    """When a commit returns, per backend (see the module docstring); the defaults are the journal's as it was:
    SQLite ``NORMAL``, PostgreSQL the server's own."""

    sqlite_synchronous: SqliteSynchronous = "normal"
    #: ``None``: not set on the connection (the server's, or the role's, ``synchronous_commit``)
    postgres_synchronous_commit: PostgresSynchronousCommit | None = None


@dataclass(frozen=True)
class DatabaseTls:
    """TLS to PostgreSQL, libpq's way (see the module docstring); all ``None``: the URL decides, else asyncpg's
    default (``prefer``)."""

    sslmode: SslMode | None = None
    sslrootcert: Path | None = None
    sslcert: Path | None = None
    sslkey: Path | None = None

    def over(self, base: DatabaseTls) -> DatabaseTls:
        """These settings, each one unset taken from ``base`` (the URL's)."""
        return replace(
            base,
            **{name: getattr(self, name) for name in _TLS_PARAMETERS if getattr(self, name) is not None},
        )

    def ssl_argument(self) -> str | ssl.SSLContext | None:
        """asyncpg's ``ssl``: ``None`` (its default), a mode name, or a context that verifies. Raises
        :class:`ValueError` for an unreadable file or a key without a certificate."""
        if (self.sslcert is None) != (self.sslkey is None):
            raise ValueError("sslcert and sslkey go together (a client certificate and its key)")
        mode = self.sslmode
        if mode == "require" and self.sslrootcert is not None:
            mode = "verify-ca"  # libpq: a root certificate given with require verifies the chain
        if mode is None and self.sslrootcert is None and self.sslcert is None:
            return None
        if mode in ("disable", "allow", "prefer") or (mode in ("require", None) and self.sslcert is None):
            return mode or "prefer"
        verify = mode in ("verify-ca", "verify-full") or (mode is None and self.sslrootcert is not None)
        try:
            if verify:
                context = ssl.create_default_context(
                    cafile=str(self.sslrootcert) if self.sslrootcert is not None else None
                )
                context.check_hostname = mode == "verify-full"
            else:  # require with a client certificate: encrypted, the server not checked
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if self.sslcert is not None and self.sslkey is not None:
                context.load_cert_chain(str(self.sslcert), str(self.sslkey))
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot use the database TLS files: {exc}") from exc
        return context


def connect_args(url: str, tls: DatabaseTls | None = None) -> tuple[URL, dict[str, Any]]:
    """The driver URL without libpq's TLS parameters, and the engine's ``connect_args`` (``ssl`` for asyncpg)
    from those parameters and ``tls`` (which wins). SQLite: the URL as it is, no arguments (TLS given for
    SQLite is refused: :class:`ValueError`)."""
    parsed = async_url(url)
    query = parsed.query
    from_url: dict[str, Any] = {}
    for name in _TLS_PARAMETERS:
        value = query.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ValueError(f"the database URL gives {name} more than once")
        from_url[name] = value if name == "sslmode" else Path(value)
    if "sslmode" in from_url and from_url["sslmode"] not in _SSL_MODES:
        raise ValueError(f"sslmode {from_url['sslmode']!r} is not one of {', '.join(_SSL_MODES)}")
    effective = (tls or DatabaseTls()).over(DatabaseTls(**from_url))
    if parsed.get_backend_name() != "postgresql":
        if effective != DatabaseTls():
            raise ValueError("TLS settings (sslmode, sslrootcert, sslcert, sslkey) apply to PostgreSQL only")
        return parsed, {}
    parsed = parsed.difference_update_query(_TLS_PARAMETERS)
    argument = effective.ssl_argument()
    return parsed, ({} if argument is None else {"ssl": argument})


def async_url(url: str) -> URL:
    """Parse ``url`` and pick the async driver for a bare ``sqlite://`` / ``postgresql://`` URL."""
    parsed = make_url(url)
    driver = _ASYNC_DRIVERS.get(parsed.drivername)
    if driver is not None:
        parsed = parsed.set(drivername=driver)
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise ValueError(f"unsupported database {parsed.get_backend_name()!r}: use SQLite or PostgreSQL")
    return parsed


def _sqlite_pragmas(synchronous: SqliteSynchronous) -> Any:
    """The engine's ``connect`` listener: the pragmas every SQLite connection runs with."""
    statement = f"PRAGMA synchronous={synchronous.upper()}"  # one of two literals: nothing from outside

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Unicode case folding for the searches (SQLite's lower() and LIKE fold ASCII only): called by queries only
        dbapi_connection.create_function(SQLITE_CASEFOLD, 1, _casefold, deterministic=True)
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")  # API readers never block the recorder
        cursor.execute("PRAGMA busy_timeout=5000")
        cursor.execute(statement)
        cursor.close()

    return on_connect


#: The SQL function every SQLite connection has: Python's ``str.casefold`` (``NULL`` for ``NULL``).
SQLITE_CASEFOLD = "temporality_casefold"
#: Collations PostgreSQL may fold with when the database's own folds ASCII only (``LC_CTYPE=C``), in order.
_PG_FOLD_COLLATIONS = ("und-x-icu", "C.utf8", "C.UTF-8", "en_US.utf8")
#: What a collation that folds Unicode makes of the probe (upper case A-umlaut and Cyrillic Zhe).
_FOLD_PROBE, _FOLD_PROBED = "\u00c4\u0416", "\u00e4\u0436"


def _casefold(value: object) -> str | None:
    return value.casefold() if isinstance(value, str) else None


async def _pg_fold_collation(conn: Any) -> str | None:
    """``None`` when the database's default collation lowers Unicode, else the first of
    :data:`_PG_FOLD_COLLATIONS` that does (``None`` too when none does: ASCII only, with a warning)."""
    probe = {"probe": _FOLD_PROBE}
    if (await conn.execute(text("SELECT lower(CAST(:probe AS text))"), probe)).scalar() == _FOLD_PROBED:
        return None
    names = (
        await conn.execute(
            text("SELECT collname FROM pg_collation WHERE collname = ANY(:names)"), {"names": list(_PG_FOLD_COLLATIONS)}
        )
    ).scalars()
    known = set(names)
    for name in (n for n in _PG_FOLD_COLLATIONS if n in known):
        quoted = '"' + name.replace('"', '""') + '"'
        lowered = (await conn.execute(text(f"SELECT lower(CAST(:probe AS text) COLLATE {quoted})"), probe)).scalar()
        if lowered == _FOLD_PROBED:
            return name
    log.warning("database.fold_ascii_only", detail="no collation lowers non-ASCII letters: search folds ASCII only")
    return None


def _json_text(value: Any) -> str:
    """Compact UTF-8 JSON (pydantic-core's writer, several times cheaper than ``json.dumps``): the text the
    recorder's batch insert binds too, so every path stores the same text for the same data."""
    return to_json(value).decode()


#: A pooled PostgreSQL connection idle at least this long is pinged before it is handed out (see
#: :func:`_ping_if_idle`).
PING_AFTER_IDLE_S = 1.0


def _checked_in(_dbapi_connection: Any, record: Any) -> None:
    record.info["temporality_checked_in"] = time.monotonic()


def _ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    """SQLAlchemy's pre-ping (``pool_pre_ping``), except for a connection handed back less than
    :data:`PING_AFTER_IDLE_S` ago: the recorder's next batch, every few milliseconds under ingest, paid three
    round trips (asyncpg's ping is ``BEGIN``, ``;``, ``ROLLBACK``) and ~4 % of the journal's CPU per batch for
    it. A connection that went idle (the API's, a quiet journal's) is pinged as before, and one that fails the
    ping is replaced (``DisconnectionError``: the pool's documented pessimistic check); a connection lost in
    between fails its statement as it could after any ping, and is replaced (the recorder's batch runs once more
    on a new one; an API request fails once)."""
    checked_in = record.info.get("temporality_checked_in")
    if checked_in is not None and time.monotonic() - checked_in < PING_AFTER_IDLE_S:
        return
    try:
        dbapi_connection.ping()
    except Exception as exc:
        raise DisconnectionError(f"the pooled connection failed its ping: {exc!r}") from exc


def _engine(url: URL, args: dict[str, Any], durability: DatabaseDurability) -> AsyncEngine:
    if url.get_backend_name() != "sqlite":
        commit = durability.postgres_synchronous_commit
        if commit is not None:
            args = args | {"server_settings": {**args.get("server_settings", {}), "synchronous_commit": commit}}
        engine = create_async_engine(url, connect_args=args)
        event.listen(engine.sync_engine.pool, "checkin", _checked_in)
        event.listen(engine.sync_engine.pool, "checkout", _ping_if_idle)
        return engine
    if url.database and url.database != ":memory:" and not url.database.startswith("file:"):
        Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    # JSON as UTF-8 text (not \u-escaped): what the recorder's one-statement batch insert binds, so every
    # path stores the same text for the same data (PostgreSQL's jsonb normalises it either way)
    engine = create_async_engine(url, json_serializer=_json_text)
    event.listen(engine.sync_engine, "connect", _sqlite_pragmas(durability.sqlite_synchronous))
    return engine


def _alembic(connection: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest schema revision this journal knows."""
    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    if head is None:
        raise RuntimeError(f"no schema revision in {MIGRATIONS_DIR}")
    return head


class SchemaTooNew(Exception):
    """The database is at a schema revision this journal does not know: a newer journal migrated it."""

    def __init__(self, found: str) -> None:
        self.found = found
        head = head_revision()
        super().__init__(
            f"the journal database is at schema revision {found!r}, which this journal does not know (its newest is "
            f"{head!r}): a newer journal version migrated it. To run this version, stop every journal replica and "
            f"run `{DOWNGRADE_COMMAND} {head}` with the NEWER journal version (it has the downgrade steps; "
            "docs/operations.md, Rolling back), then start this one. Nothing was changed"
        )


def _version_of(connection: Connection) -> str | None:
    if VERSION_TABLE not in inspect(connection).get_table_names():
        return None
    value = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
    return None if value is None else str(value)


def _known(revision: str) -> bool:
    return revision in {script.revision for script in ScriptDirectory(str(MIGRATIONS_DIR)).walk_revisions()}


@dataclass(frozen=True)
class Migration:
    """One schema revision, as ``temporality-journal migrations`` lists it and ``downgrade`` undoes it."""

    revision: str
    down_revision: str | None
    #: the first line of the migration's docstring: what it adds
    adds: str
    #: what undoing it loses (its module's ``DOWNGRADE_LOSES``); ``None``: nothing (the next upgrade restores it)
    downgrade_loses: str | None


def migrations() -> list[Migration]:
    """Every schema revision this journal knows, newest first."""
    found = []
    for script in ScriptDirectory(str(MIGRATIONS_DIR)).walk_revisions():
        down = script.down_revision
        if down is not None and not isinstance(down, str):
            raise RuntimeError(f"revision {script.revision} merges branches: not supported")
        doc = (script.module.__doc__ or "").strip().splitlines()
        found.append(
            Migration(
                revision=script.revision,
                down_revision=down,
                adds=doc[0] if doc else "",
                downgrade_loses=getattr(script.module, "DOWNGRADE_LOSES", None),
            )
        )
    return found


def _downgrade_steps(found: str, target: str) -> list[Migration]:
    """The migrations undone going from ``found`` down to ``target``, newest first. Raises :class:`ValueError`
    for an unknown ``target`` or one that is not below ``found``."""
    by_revision = {m.revision: m for m in migrations()}
    if target not in by_revision:
        raise ValueError(
            f"unknown schema revision {target!r}; this journal knows {', '.join(by_revision)} "
            "(`temporality-journal migrations` lists them)"
        )
    steps: list[Migration] = []
    revision: str | None = found
    while revision != target:
        if revision is None:
            raise ValueError(
                f"revision {target!r} is newer than the database's {found!r}: nothing to downgrade (a journal "
                "start upgrades the database)"
            )
        step = by_revision[revision]
        steps.append(step)
        revision = step.down_revision
    return steps


def _upgrade(connection: Connection) -> str | None:
    """Bring the schema to the newest revision; the revision it was at (``None``: not versioned). Run under the
    migrations' lock (PostgreSQL), so what it found is what this start migrated from: a replica that waited for
    another's migration finds the newest revision and migrates nothing."""
    tables = set(inspect(connection).get_table_names())
    config = _alembic(connection)
    found = _version_of(connection)
    if found is not None and not _known(found):
        raise SchemaTooNew(found)  # instead of Alembic's "Can't locate revision identified by …"
    head = head_revision()
    if found != head:
        # a migration may take a while (0003 rewrites every event): the log says why the start waits
        log.info("database.migrating", revision=found or "none", to=head)
    if "events" in tables and VERSION_TABLE not in tables:
        # ``create_all`` made the models' tables of its day: with ``asks`` that is revision 0002's schema
        if "traceparent" in {column["name"] for column in inspect(connection).get_columns("events")}:
            revision = TRACE_CONTEXT_REVISION
        elif "commit_counter" in tables:
            revision = COMMIT_ORDER_REVISION
        else:
            revision = ASKS_REVISION if "asks" in tables else BASELINE_REVISION
        log.info("database.stamped", revision=revision, reason="tables made before migrations existed")
        command.stamp(config, revision)
    command.upgrade(config, "head")
    return found


#: Tables :meth:`Database.reset_read_model` keeps: not rebuilt from the streams (the sign-outs are in no stream).
KEPT_BY_REBUILD = frozenset({"revoked_sessions"})


def _drop(connection: Connection) -> None:
    tables = [table for table in JournalModel.metadata.sorted_tables if table.name not in KEPT_BY_REBUILD]
    JournalModel.metadata.drop_all(connection, tables=tables)
    connection.execute(text(f"DROP TABLE IF EXISTS {VERSION_TABLE}"))


class Database:
    """An engine plus ``sessions``, a factory of :class:`sqlmodel.ext.asyncio.session.AsyncSession`."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.sessions = async_sessionmaker(engine, class_=AsyncSession, expire_on_commit=False)
        #: PostgreSQL: the collation :meth:`folded` lowers with (``None``: the database's own).
        self.fold_collation: str | None = None

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def folded(self, expr: Any) -> ColumnElement[str]:
        """``expr`` case-folded for a case-insensitive comparison that knows more than ASCII: SQLite's
        ``temporality_casefold`` (Python's ``str.casefold``), PostgreSQL's ``lower()`` in
        :attr:`fold_collation`. Fold both sides of a comparison with it."""
        if self.dialect == "sqlite":
            return getattr(func, SQLITE_CASEFOLD)(expr)  # type: ignore[no-any-return]
        if self.fold_collation is not None:
            expr = expr.collate(self.fold_collation)
        return func.lower(expr)

    def contains_folded(self, expr: Any, needle: str) -> ColumnElement[bool]:
        """``expr`` contains ``needle``, case-insensitively (:meth:`folded`), no wildcard in ``needle``."""
        position = func.instr if self.dialect == "sqlite" else func.strpos
        folded_needle = self.folded(literal(needle, String()))
        return position(self.folded(expr), folded_needle) > 0

    async def _choose_fold_collation(self) -> None:
        if self.dialect == "postgresql":
            async with self.engine.connect() as conn:
                self.fold_collation = await _pg_fold_collation(conn)

    @classmethod
    @asynccontextmanager
    async def open(
        cls, url: str, tls: DatabaseTls | None = None, durability: DatabaseDurability | None = None
    ) -> AsyncIterator[Database]:
        """Connect (``tls``: over the URL's TLS parameters, see :func:`connect_args`; ``durability``: every
        connection's commit mode, the journal's defaults when ``None``), create the tables if absent, and
        dispose of the engine on exit."""
        parsed, args = connect_args(url, tls)
        engine = _engine(parsed, args, durability or DatabaseDurability())
        try:
            database = cls(engine)
            before = await database.create_tables()
            await database._choose_fold_collation()
            revision = await database.revision()
            # after an upgrade the log says whether Alembic migrated anything: "0005_revoked -> 0006_reruns",
            # "none -> …" for a new (or unversioned) database, false when it was at the newest revision already --
            # also for a replica that started with another on an older database and waited for its migration
            # (``before`` is read under the migrations' lock, see :func:`_upgrade`)
            migrated = f"{before or 'none'} -> {revision}" if before != revision else False
            log.info(
                "database.ready",
                dialect=database.dialect,
                database=parsed.database,
                revision=revision,
                migrated=migrated,
            )
            yield database
        finally:
            await engine.dispose()

    @classmethod
    @asynccontextmanager
    async def open_unmigrated(
        cls, url: str, tls: DatabaseTls | None = None, durability: DatabaseDurability | None = None
    ) -> AsyncIterator[Database]:
        """Connect as :meth:`open` does but leave the schema as it is (``temporality-journal migrations`` and
        ``downgrade``: :mod:`temporality_journal.schema`); dispose of the engine on exit."""
        parsed, args = connect_args(url, tls)
        engine = _engine(parsed, args, durability or DatabaseDurability())
        try:
            yield cls(engine)
        finally:
            await engine.dispose()

    async def create_tables(self) -> str | None:
        """Bring the schema to the newest revision (Alembic), creating it in an empty database. The revision the
        database was at when this start held the migrations' lock (``None``: not versioned): the newest one when
        another replica migrated it meanwhile."""
        async with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                key = {"key": _DDL_LOCK_KEY}
                if not (await conn.execute(text("SELECT pg_try_advisory_xact_lock(:key)"), key)).scalar():
                    # another replica migrates (or a downgrade runs): the log says why this start waits
                    log.info("database.migration_lock_waiting", detail="another journal holds the migrations' lock")
                    await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), key)
            return await conn.run_sync(_upgrade)

    async def revision(self) -> str | None:
        """The schema revision the database is at (``None``: not versioned)."""
        async with self.engine.connect() as conn:
            return await conn.run_sync(_version_of)

    async def reset_read_model(self, after: int, *, before_commit: Callable[[], None] | None = None) -> None:
        """Drop the read model (every journal table but :data:`KEPT_BY_REBUILD`, and the schema version), create it
        again at the newest revision and number the next journaled events after ``after`` (cursors never go back),
        in **one** transaction: a failure or a kill leaves the tables as they were. ``before_commit`` runs last
        inside it (the rebuild's test-only crash point). A rebuild's last step (:mod:`.rebuild`)."""
        async with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _DDL_LOCK_KEY})
            else:
                # Python's sqlite3 opens a transaction before DML only, so this no-op statement opens it; the DDL
                # that follows is then inside it (sqlite3 no longer commits before DDL) and rolled back with it
                await conn.execute(text("DELETE FROM commit_counter WHERE 1 = 0"))
            await conn.run_sync(_drop)
            await conn.run_sync(_upgrade)
            await conn.execute(
                text("UPDATE commit_counter SET last_seq = :p WHERE id = 1 AND last_seq < :p"), {"p": after}
            )
            if before_commit is not None:
                before_commit()

    async def downgrade(self, target: str) -> list[Migration]:
        """Take the schema down to revision ``target`` (Alembic's downgrade steps, newest first), in **one**
        transaction under the migrations' lock: a failure leaves the schema as it was. Returns the migrations
        undone (none when the database is at ``target``). Raises :class:`SchemaTooNew` for a revision this
        journal does not know, :class:`ValueError` for an unknown or newer ``target`` or an unversioned
        database. Run it with every journal replica stopped (a running one would migrate it up again at its
        next start, and writes columns the older schema lacks)."""
        async with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _DDL_LOCK_KEY})
            found = await conn.run_sync(_version_of)
            if found is None:
                raise ValueError("the database has no journal schema revision: nothing to downgrade")
            if not _known(found):
                raise SchemaTooNew(found)
            steps = _downgrade_steps(found, target)
            if not steps:
                return []
            if self.dialect == "sqlite":
                # a no-op DML statement opens the transaction (Python's sqlite3 opens one before DML only): the
                # DDL that follows, batch mode's table copies included, is inside it and rolled back with it
                await conn.execute(text(f"DELETE FROM {VERSION_TABLE} WHERE 1 = 0"))

            def downgrade(connection: Connection) -> None:
                command.downgrade(_alembic(connection), target)

            await conn.run_sync(downgrade)
        return steps

    @asynccontextmanager
    async def serialised(self) -> AsyncIterator[None]:
        """One journal replica at a time in here (PostgreSQL: a transaction-scoped advisory lock, held by a
        connection of its own until the block ends; SQLite: one process per file, nothing to take)."""
        if self.dialect != "postgresql":
            yield
            return
        async with self.engine.begin() as conn:
            await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _START_LOCK_KEY})
            yield

    async def last_position(self) -> int:
        """The last commit position handed out (``commit_counter``, or the highest ``events.commit_seq`` if
        higher); 0 for an empty journal."""
        async with self.engine.connect() as conn:
            counter = (await conn.execute(text("SELECT MAX(last_seq) FROM commit_counter"))).scalar()
            newest = (await conn.execute(text("SELECT MAX(commit_seq) FROM events"))).scalar()
        return max(int(counter or 0), int(newest or 0))

    async def ping(self) -> None:
        """Raise unless the database answers."""
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
