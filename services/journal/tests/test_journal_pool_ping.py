"""The PostgreSQL pool pings a connection only after it sat idle (``PING_AFTER_IDLE_S``): one that died while
idle is replaced before use, as ``pool_pre_ping`` did; one handed back moments ago is reused without the
ping's three round trips (the recorder's next batch)."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from temporality_journal import Database, database
from temporality_testing.postgres import fresh_postgres_database


async def _backend_pid(db: Database) -> int:
    async with db.engine.connect() as conn:
        return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())


async def _terminate(url: str, pid: int) -> None:
    admin = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(False))
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await admin.close()


async def test_a_connection_that_died_idle_is_replaced_before_use(monkeypatch: pytest.MonkeyPatch) -> None:
    async with fresh_postgres_database("journal_ping") as url, Database.open(url) as db:
        pid = await _backend_pid(db)
        await _terminate(url, pid)
        monkeypatch.setattr(database, "PING_AFTER_IDLE_S", 0.0)  # it counts as idle: pinged, found dead
        assert await _backend_pid(db) != pid  # a new connection answered; the statement never saw the dead one


async def test_a_connection_handed_back_moments_ago_is_reused_without_a_ping(monkeypatch: pytest.MonkeyPatch) -> None:
    async with fresh_postgres_database("journal_ping") as url, Database.open(url) as db:
        monkeypatch.setattr(database, "PING_AFTER_IDLE_S", 3600.0)  # never idle long enough: no ping
        pid = await _backend_pid(db)
        assert await _backend_pid(db) == pid  # the same connection taken again
        await _terminate(url, pid)
        # not pinged: the statement itself meets the dead connection (what the recorder's batch falls back on)
        with pytest.raises(DBAPIError) as failed:
            await _backend_pid(db)
        assert failed.value.connection_invalidated
        assert await _backend_pid(db) != pid  # and the pool replaced it for the next one
