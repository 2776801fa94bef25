"""Two journals starting together on an empty PostgreSQL database: one migrates, the other waits for it and says
it migrated nothing (``database.ready migrated=False``), because it reads the revision under the migrations' lock.

The race is made certain, not hoped for: the test holds the migrations' advisory lock itself until both starts
wait for it (each logged ``database.migration_lock_waiting``), so both have connected and looked at the empty
database before either can migrate. SQLite has no such lock (the journal on SQLite runs as one replica).
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import structlog.testing
from sqlalchemy import inspect
from sqlalchemy.engine import make_url

from temporality_journal import Database
from temporality_journal.database import _DDL_LOCK_KEY, head_revision
from temporality_testing.postgres import fresh_postgres_database
from temporality_testing.waiting import eventually


async def _start(url: str) -> set[str]:
    """One journal start's database part (:meth:`Database.open`): the tables it then sees."""
    async with Database.open(url) as database, database.engine.connect() as conn:
        return await conn.run_sync(lambda sync: set(inspect(sync).get_table_names()))


def _events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


async def test_of_two_journals_starting_on_an_empty_database_only_the_one_that_migrated_says_so() -> None:
    head = head_revision()
    async with fresh_postgres_database("f2_journal_race") as url:
        holder = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(False), timeout=5)
        try:
            await holder.execute("SELECT pg_advisory_lock($1)", _DDL_LOCK_KEY)  # a third party migrating
            with structlog.testing.capture_logs() as logs:
                starts = [asyncio.create_task(_start(url)) for _ in range(2)]
                try:
                    await eventually(
                        lambda: asyncio.sleep(0, len(_events(logs, "database.migration_lock_waiting")) == 2),
                        timeout_s=30,
                        what="both journals waiting for the migrations' lock",
                    )
                    assert not _events(logs, "database.migrating")  # nobody migrates while the lock is held
                    await holder.execute("SELECT pg_advisory_unlock($1)", _DDL_LOCK_KEY)
                    async with asyncio.timeout(60):
                        tables = await asyncio.gather(*starts)
                finally:
                    for task in starts:
                        task.cancel()
        finally:
            await holder.close()
    assert all({"events", "runs"} <= seen for seen in tables), tables
    ready = _events(logs, "database.ready")
    assert sorted(str(entry["migrated"]) for entry in ready) == sorted([f"none -> {head}", "False"]), ready
    assert {entry["revision"] for entry in ready} == {head}
    migrating = _events(logs, "database.migrating")
    assert [(entry["revision"], entry["to"]) for entry in migrating] == [("none", head)], migrating
