"""Rolling the journal back past a migration: ``temporality-journal downgrade <revision>`` (and ``migrations``) on
SQLite and PostgreSQL, the round trip down and up again, and a journal that finds a revision newer than it knows
refusing to start with the way back in its message instead of Alembic's ``Can't locate revision``."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from journal_support import rerun_events, write_tokens
from sqlalchemy import Connection, inspect, text

from temporality_bus import NatsSettings
from temporality_journal import Database, Recorder
from temporality_journal.database import VERSION_TABLE, SchemaTooNew, head_revision, migrations
from temporality_journal.models import JournalModel
from temporality_protocol.events import RunUsage

MakeStory = Callable[..., Any]  # journal_support.RunStory
#: A revision no journal knows: what a future journal would leave behind.
FUTURE = "0099_future"


async def _journal_cli(*args: str, env: dict[str, str], within_s: float = 60.0) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "temporality_journal",
        *args,
        env={**os.environ, "TEMPORALITY_LOG_FORMAT": "console", **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), within_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode()


def _columns(connection: Connection, table: str) -> set[str]:
    return {column["name"] for column in inspect(connection).get_columns(table)}


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


def _drift(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE, "compare_type": True})
    return list(compare_metadata(context, JournalModel.metadata))


async def _rerun_of(database: Database, run_id: str) -> str | None:
    async with database.engine.connect() as conn:
        value = (await conn.execute(text("SELECT rerun_of FROM runs WHERE run_id = :r"), {"r": run_id})).scalar()
    return None if value is None else str(value)


async def _total_tokens(database: Database, run_id: str) -> int | None:
    async with database.engine.connect() as conn:
        value = (
            await conn.execute(text("SELECT usage_total_tokens FROM runs WHERE run_id = :r"), {"r": run_id})
        ).scalar()
    return None if value is None else int(value)


async def _event_ids(database: Database) -> list[str]:
    async with database.engine.connect() as conn:
        return [str(v) for v in (await conn.execute(text("SELECT id FROM events ORDER BY stream_seq"))).scalars()]


async def test_downgrade_to_the_previous_revision_and_up_again(database_url: str, story: MakeStory) -> None:
    """The operator's case: the newer journal takes the schema to ``0005_revoked`` (what the version before
    ``0006_reruns`` knows: two steps down, ``0007_usage`` then ``0006_reruns``), the events and runs stay; the
    next start of the newer one migrates up and back-fills both."""
    s = story()
    rerun = f"{s.run_id}-rerun-1"
    used = RunUsage(turns=2, tool_calls=1, prompt_tokens=30, completion_tokens=5, total_tokens=35)
    events = [s.requested(), s.started(), s.completed(usage=used), *rerun_events(s, rerun)]
    async with Database.open(database_url) as database:
        recorder = Recorder(database)
        for seq, event in enumerate(events, start=1):
            await recorder.record(event, seq)
        assert await _rerun_of(database, rerun) == s.run_id
        assert await _total_tokens(database, s.run_id) == 35

    code, out = await _journal_cli("downgrade", "0005_revoked", env={"TEMPORALITY_DATABASE_URL": database_url})
    assert code == 0, out
    assert "journal.downgraded" in out
    assert "0007_usage -> 0005_revoked" in out
    assert "journal.downgrade_step" in out
    assert "loses=nothing" in out

    async with Database.open_unmigrated(database_url) as database:
        assert await database.revision() == "0005_revoked"
        async with database.engine.connect() as conn:
            columns = await conn.run_sync(_columns, "runs")
        assert not {"rerun_of", "rerun_requested_by", "usage_turns", "usage_total_tokens"} & columns
        assert await _event_ids(database) == [e.id for e in events]

    async with Database.open(database_url) as database:  # the newer journal's next start
        assert await database.revision() == head_revision()
        async with database.engine.connect() as conn:
            assert await conn.run_sync(_drift) == []
        assert await _rerun_of(database, rerun) == s.run_id  # back-filled from the stored events
        assert await _total_tokens(database, s.run_id) == 35  # from the stored run.completed
        assert await _event_ids(database) == [e.id for e in events]


async def test_downgrade_to_the_first_revision_says_what_is_lost_and_upgrades_back(
    database_url: str, story: MakeStory
) -> None:
    s = story()
    events = [s.requested(), s.started(), s.completed()]
    async with Database.open(database_url) as database:
        recorder = Recorder(database)
        for seq, event in enumerate(events, start=1):
            await recorder.record(event, seq)

    code, out = await _journal_cli("downgrade", "0001", env={"TEMPORALITY_DATABASE_URL": database_url})
    assert code == 0, out
    lossy = [m for m in migrations() if m.revision != "0001" and m.downgrade_loses is not None]
    assert {"0005_revoked", "0004_trace", "0003", "0002"} == {m.revision for m in lossy}
    for m in lossy:  # each step that loses data says what, as a warning
        assert m.downgrade_loses is not None
        assert m.downgrade_loses.split(" ")[0] in out
    assert out.count("journal.downgrade_step") == len(migrations()) - 1

    async with Database.open_unmigrated(database_url) as database:
        assert await database.revision() == "0001"
        async with database.engine.connect() as conn:
            tables = await conn.run_sync(_tables)
            event_columns = await conn.run_sync(_columns, "events")
        assert {"asks", "commit_counter", "revoked_sessions"}.isdisjoint(tables)
        assert {"commit_seq", "traceparent", "tracestate"}.isdisjoint(event_columns)
        assert await _event_ids(database) == [e.id for e in events]

    async with Database.open(database_url) as database:
        assert await database.revision() == head_revision()
        async with database.engine.connect() as conn:
            assert await conn.run_sync(_drift) == []
        assert await _event_ids(database) == [e.id for e in events]
        assert await database.last_position() == len(events)  # 0003 numbered them again


async def test_downgrade_refuses_a_revision_it_cannot_go_to(database_url: str) -> None:
    async with Database.open(database_url):
        pass
    env = {"TEMPORALITY_DATABASE_URL": database_url}
    code, out = await _journal_cli("downgrade", "0042_nowhere", env=env)
    assert code == 2, out
    assert "journal.downgrade_refused" in out
    assert "unknown schema revision '0042_nowhere'" in out
    code, out = await _journal_cli("downgrade", head_revision(), env=env)  # already there: nothing to do
    assert code == 0, out
    assert "migrated=False" in out
    code, out = await _journal_cli("downgrade", env=env)
    assert code == 2
    assert "usage: temporality-journal downgrade REVISION" in out
    code, out = await _journal_cli("downgrade", "--help", env=env)  # help, not a revision: nothing opened
    assert code == 0, out
    assert out.startswith("usage: temporality-journal downgrade REVISION")
    code, out = await _journal_cli("downgrade", "--to", env=env)
    assert code == 2, out
    assert "'--to' is not a revision" in out
    async with Database.open_unmigrated(database_url) as database:
        assert await database.revision() == head_revision()


async def test_migrations_lists_the_revisions_and_the_database(database_url: str) -> None:
    async with Database.open(database_url) as database:
        await database.downgrade("0004_trace")
    code, out = await _journal_cli("migrations", env={"TEMPORALITY_DATABASE_URL": database_url})
    assert code == 0, out
    listed = [line.split()[0] for line in out.splitlines() if line[:1].isdigit()]
    assert listed == [m.revision for m in migrations()]
    assert "0004_trace " in out
    assert "<- the database" in out.split("0004_trace ", 1)[1].splitlines()[0]
    assert out.rstrip().endswith("the database: at 0004_trace")


async def _stamp_future(database_url: str) -> None:
    async with Database.open(database_url) as database, database.engine.begin() as conn:
        await conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = :v"), {"v": FUTURE})


async def test_a_database_a_newer_journal_migrated_is_refused_with_the_way_back(
    tmp_path: Path, nats_settings: NatsSettings, database_url: str
) -> None:
    """The journal as a process (NATS up, so it gets as far as its setup): exit 2, one ``config.invalid`` line that
    names the revision found and the downgrade to run; the database is left as it was."""
    await _stamp_future(database_url)
    tokens = write_tokens(tmp_path / "tokens.json")
    code, out = await _journal_cli(
        env={
            "TEMPORALITY_DATABASE_URL": database_url,
            "TEMPORALITY_NATS_URL": nats_settings.url,
            "TEMPORALITY_PORT": "0",
            "TEMPORALITY_API_TOKENS_FILE": str(tokens),
        },
    )
    assert code == 2, out
    assert "config.invalid" in out
    assert f"schema revision '{FUTURE}'" in out
    assert f"temporality-journal downgrade {head_revision()}" in out
    assert "Can't locate revision" not in out
    async with Database.open_unmigrated(database_url) as database:
        assert await database.revision() == FUTURE
    # the other ways in say the same: opening it, and a downgrade by this (older) journal
    with pytest.raises(SchemaTooNew, match=f"temporality-journal downgrade {head_revision()}"):
        async with Database.open(database_url):
            pass
    code, out = await _journal_cli("downgrade", "0005_revoked", env={"TEMPORALITY_DATABASE_URL": database_url})
    assert code == 2, out
    assert "journal.downgrade_refused" in out
    assert FUTURE in out
