"""The journal's database: an async engine (aiosqlite or asyncpg), its tables, a session factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy import event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlmodel.ext.asyncio.session import AsyncSession

from temporality_journal.models import JournalModel

__all__ = ["Database", "async_url"]

log = structlog.get_logger(__name__)

#: Serialises ``CREATE TABLE`` between journal replicas starting together on one PostgreSQL.
_DDL_LOCK_KEY = 0x7E3A_0A11
_ASYNC_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "postgres": "postgresql+asyncpg",
    "postgresql": "postgresql+asyncpg",
}


def async_url(url: str) -> URL:
    """Parse ``url`` and pick the async driver for a bare ``sqlite://`` / ``postgresql://`` URL."""
    parsed = make_url(url)
    driver = _ASYNC_DRIVERS.get(parsed.drivername)
    if driver is not None:
        parsed = parsed.set(drivername=driver)
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise ValueError(f"unsupported database {parsed.get_backend_name()!r}: use SQLite or PostgreSQL")
    return parsed


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # API readers never block the recorder
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _engine(url: URL) -> AsyncEngine:
    if url.get_backend_name() != "sqlite":
        return create_async_engine(url, pool_pre_ping=True)
    if url.database and url.database != ":memory:" and not url.database.startswith("file:"):
        Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url)
    event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


class Database:
    """An engine plus ``sessions``, a factory of :class:`sqlmodel.ext.asyncio.session.AsyncSession`."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.sessions = async_sessionmaker(engine, class_=AsyncSession, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @classmethod
    @asynccontextmanager
    async def open(cls, url: str) -> AsyncIterator[Database]:
        """Connect, create the tables if absent, and dispose of the engine on exit."""
        parsed = async_url(url)
        engine = _engine(parsed)
        try:
            database = cls(engine)
            await database.create_tables()
            log.info("database.ready", dialect=database.dialect, database=parsed.database)
            yield database
        finally:
            await engine.dispose()

    async def create_tables(self) -> None:
        async with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _DDL_LOCK_KEY})
            await conn.run_sync(JournalModel.metadata.create_all)

    async def ping(self) -> None:
        """Raise unless the database answers."""
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
