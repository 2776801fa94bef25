"""Schema migrations (Alembic) and the rebuild from the stream, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from journal_support import VIEWER, serve_journal, served_settings
from nats.js.errors import NotFoundError
from sqlalchemy import Connection, func, select, text

from temporality_bus import Bus, NatsSettings
from temporality_journal import Database, Recorder
from temporality_journal.database import VERSION_TABLE, head_revision
from temporality_journal.models import EVENTS_TABLE, RUNS_TABLE, JournalModel
from temporality_protocol import derive_id, make_event
from temporality_protocol.catalog import CONSUMERS, EVENTS_STREAM
from temporality_protocol.events import AgentAsked

MakeStory = Callable[..., Any]  # conftest.RunStory


def _drift(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE, "compare_type": True})
    return list(compare_metadata(context, JournalModel.metadata))


async def _counts(database: Database) -> tuple[int, int]:
    async with database.engine.connect() as conn:
        events = (await conn.execute(select(func.count()).select_from(EVENTS_TABLE))).scalar_one()
        runs = (await conn.execute(select(func.count()).select_from(RUNS_TABLE))).scalar_one()
    return int(events), int(runs)


async def test_migrations_make_exactly_the_models_schema(database: Database) -> None:
    assert await database.revision() == head_revision()
    async with database.engine.connect() as conn:
        assert await conn.run_sync(_drift) == []
    await database.create_tables()  # a second start: nothing to do, nothing lost
    assert await database.revision() == head_revision()


async def test_a_database_made_before_migrations_is_stamped_and_kept(database_url: str, story: MakeStory) -> None:
    s = story()
    async with Database.open(database_url) as database:
        assert await Recorder(database).record(s.requested(), 1)
        async with database.engine.begin() as conn:  # what create_all left behind: tables, no version
            await conn.execute(text(f"DROP TABLE {VERSION_TABLE}"))
        assert await database.revision() is None
    async with Database.open(database_url) as database:
        assert await database.revision() == head_revision()
        assert await _counts(database) == (1, 1)


async def _journal_cli(*args: str, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "temporality_journal",
        *args,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_rebuild_drops_the_read_model_and_the_next_start_replays_the_stream(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, database_url: str, story: MakeStory
) -> None:
    settings = served_settings(tmp_path, nats_settings, database_url)
    s = story()
    asked = make_event(
        AgentAsked(request_id="req-rebuilt", asker_run_id=s.run_id, asker_agent=s.agent, to="agent:x", message="?"),
        source="/temporality/test",
        id=derive_id("evt", s.run_id, "asked"),
        run_id=s.run_id,
    )
    events = [s.requested(), s.started(), asked, s.human_requested(), s.answered(), s.resumed(), s.completed()]
    async with serve_journal(settings, bus) as served:
        for event in events:
            await bus.publish(event)
        await served.wait_recorded(events[-1].id)
    async with Database.open(database_url) as database:  # a read model gone wrong
        async with database.engine.begin() as conn:
            await conn.execute(text("DELETE FROM runs"))
            await conn.execute(text("DELETE FROM asks"))

    code, out = await _journal_cli(
        "rebuild",
        env={
            "TEMPORALITY_NATS_URL": nats_settings.url,
            "TEMPORALITY_DATABASE_URL": database_url,
            "TEMPORALITY_LOG_FORMAT": "console",
        },
    )
    assert code == 0, out
    assert "journal.rebuild_ready" in out
    async with Database.open(database_url) as database:
        assert await _counts(database) == (0, 0)
        assert await database.revision() == head_revision()
    with pytest.raises(NotFoundError):
        await bus.js.consumer_info(EVENTS_STREAM.name, CONSUMERS["journal"].durable)

    async with serve_journal(settings, bus) as served:
        await served.wait_recorded(events[-1].id)
        async with httpx.AsyncClient(base_url=served.url, headers=VIEWER) as client:
            run = (await client.get(f"/runs/{s.run_id}")).json()
            trajectory = (await client.get(f"/runs/{s.run_id}/events")).json()["events"]
            asks = (await client.get(f"/runs/{s.run_id}/asks")).json()["sent"]
    assert run["state"] == "completed"
    assert [(a["request_id"], a["state"]) for a in asks] == [("req-rebuilt", "asked")]
    assert [e["id"] for e in trajectory] == [e.id for e in events]


async def test_unknown_arguments_are_refused() -> None:
    code, out = await _journal_cli("rebuild-everything", env={})
    assert code == 2
    assert "usage: temporality-journal [rebuild]" in out
