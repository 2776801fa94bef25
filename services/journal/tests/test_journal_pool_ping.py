"""The PostgreSQL pool pings a connection only after it sat idle (``PING_AFTER_IDLE_S``): one that died while
idle is replaced before use, as ``pool_pre_ping`` did; one handed back moments ago is reused without the
ping's three round trips (the recorder's next batch), and a batch that meets it dead runs once more on a new
one."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from temporality_journal import Database, Recorder, database
from temporality_testing.postgres import fresh_postgres_database


async def _backend_pid(db: Database) -> int:
    async with db.engine.connect() as conn:
        return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())


async def _terminate(url: str, pid: int) -> None:
    admin = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(False))
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1, 5000)", pid)  # waits (5 s at most) for its end
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


async def test_a_batch_whose_connection_died_moments_ago_is_recorded_on_a_new_one(
    monkeypatch: pytest.MonkeyPatch, story: Any
) -> None:
    async with fresh_postgres_database("journal_ping") as url, Database.open(url) as db:
        monkeypatch.setattr(database, "PING_AFTER_IDLE_S", 3600.0)  # not pinged: the batch meets it dead
        pid = await _backend_pid(db)
        await _terminate(url, pid)
        s = story()
        events = [(event, seq) for seq, event in enumerate([s.requested(), s.created(), s.started()], start=1)]
        assert await Recorder(db).record_batch(events) == 3  # once more, on a new connection: no fallback
        async with db.engine.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM events"))).scalar_one() == 3
            assert (await conn.execute(text("SELECT state FROM runs"))).scalar_one() == "running"
            assert (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one() != pid
