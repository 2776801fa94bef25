"""Schema migrations (Alembic) and the rebuild from the stream, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from journal_support import VIEWER, rerun_events, serve_journal, served_settings
from nats.js.errors import NotFoundError
from sqlalchemy import Connection, func, inspect, select, text
from sqlalchemy.ext.asyncio import create_async_engine

from temporality_bus import Bus, NatsSettings
from temporality_journal import Database, Recorder
from temporality_journal.database import MIGRATIONS_DIR, VERSION_TABLE, async_url, head_revision
from temporality_journal.models import COMMIT_COUNTER_TABLE, EVENTS_TABLE, RUNS_TABLE, JournalModel
from temporality_journal.tail import Tail
from temporality_protocol import derive_id, make_event
from temporality_protocol.catalog import CONSUMERS, EVENTS_STREAM
from temporality_protocol.events import AgentAsked, RunUsage

MakeStory = Callable[..., Any]  # journal_support.RunStory


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


def _migrate_to(revision: str) -> Callable[[Connection], None]:
    def migrate(connection: Connection) -> None:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.attributes["connection"] = connection
        command.upgrade(config, revision)

    return migrate


async def test_a_database_of_revision_0002_gets_commit_positions_in_stream_order(
    database_url: str, story: MakeStory
) -> None:
    """Upgraded in place: existing events are numbered by stream sequence (equal to it where the sequences
    are distinct), the counter continues after them, and a cursor an older journal sent still resumes."""
    s = story()
    old = [(s.requested(), 3), (s.started(), 1), (s.human_requested(), 7), (s.notified(), 7), (s.answered(), 2)]
    url = async_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database:
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url)  # not Database.open: that would migrate to the newest revision
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_migrate_to("0002"))
            for event, seq in old:  # revision 0002's events (no commit_seq), inserted out of stream order
                row = {
                    "id": event.id,
                    "type": event.type,
                    "source": event.source,
                    "time": event.time,
                    "run_id": s.run_id,
                    "stream_seq": seq,
                    "data": event.data,
                    "recorded_at": event.time,
                }
                await conn.execute(EVENTS_TABLE.insert().values(row))
        assert await Database(engine).revision() == "0002"
    finally:
        await engine.dispose()
    async with Database.open(database_url) as database:
        assert await database.revision() == head_revision()
        async with database.engine.connect() as conn:
            numbered = (await conn.execute(select(EVENTS_TABLE.c.id, EVENTS_TABLE.c.commit_seq))).all()
            counter = (await conn.execute(select(COMMIT_COUNTER_TABLE.c.last_seq))).scalar_one()
            assert await conn.run_sync(_drift) == []
        by_stream = sorted(old, key=lambda item: (item[1], item[0].id))
        assert sorted(numbered, key=lambda row: row[1]) == [
            (event.id, position) for (event, _), position in zip(by_stream, [1, 2, 3, 7, 8], strict=True)
        ]
        assert counter == 8
        newer = s.resumed()
        assert await Recorder(database).record(newer, 9)
        # an SSE client of the older journal had id 3 (a stream sequence): it resumes after that event
        stream = Tail(database).stream(
            after=3, run_id=None, type_=None, render=lambda r: {"id": r.id}, gone=anyio.Event()
        )
        try:
            assert await anext(stream) == b": tail after 3\nretry: 2000\n\n"
            got = [_fields(await anext(stream)) for _ in range(3)]
        finally:
            await stream.aclose()
        expected = [e.id for e, _ in by_stream[3:]] + [newer.id]
        assert [(json.loads(item["data"])["id"], item["id"]) for item in got] == list(
            zip(expected, ["7", "8", "9"], strict=True)
        )


async def test_a_database_of_revision_0003_gets_the_trace_columns_and_keeps_its_events(
    database_url: str, story: MakeStory
) -> None:
    """Upgraded in place from the previous head: the stored events stay (no trace context: ``null``), new ones
    keep theirs, and the schema is exactly the models'."""
    s = story()
    old = [s.requested(), s.started()]
    url = async_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database:
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url)  # not Database.open: that would migrate to the newest revision
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_migrate_to("0003"))
            columns = await conn.run_sync(lambda c: {col["name"] for col in inspect(c).get_columns("events")})
            assert "traceparent" not in columns
            for seq, event in enumerate(old, 1):  # revision 0003's rows: no trace columns
                row = {
                    "id": event.id,
                    "type": event.type,
                    "source": event.source,
                    "time": event.time,
                    "run_id": s.run_id,
                    "stream_seq": seq,
                    "commit_seq": seq,
                    "data": event.data,
                    "recorded_at": event.time,
                }
                await conn.execute(EVENTS_TABLE.insert().values(row))
            await conn.execute(COMMIT_COUNTER_TABLE.update().values(last_seq=len(old)))
        assert await Database(engine).revision() == "0003"
    finally:
        await engine.dispose()
    async with Database.open(database_url) as database:
        assert await database.revision() == head_revision()
        newer = s.human_requested().model_copy(
            update={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "k=v"}
        )
        assert await Recorder(database).record_batch([(newer, 3)]) == 1
        async with database.engine.connect() as conn:
            assert await conn.run_sync(_drift) == []
            query = select(EVENTS_TABLE.c.id, EVENTS_TABLE.c.traceparent, EVENTS_TABLE.c.tracestate)
            rows = {row[0]: (row[1], row[2]) for row in await conn.execute(query)}
        assert rows == {
            old[0].id: (None, None),
            old[1].id: (None, None),
            newer.id: ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "k=v"),
        }
        assert await _counts(database) == (3, 1)


def _fields(message: bytes) -> dict[str, str]:
    """One SSE message's fields (each once here: ``event``, ``data``, ``id``)."""
    assert message.endswith(b"\n\n")
    return dict(line.split(": ", 1) for line in message.decode().strip("\n").split("\n"))


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
    rerun = f"{s.run_id}-rerun-1"
    rerun_requested, rerun_created = rerun_events(s, rerun)
    events = [
        s.requested(),
        s.started(),
        asked,
        s.human_requested(),
        s.answered(),
        s.resumed(),
        s.completed(usage=RunUsage(turns=2, tool_calls=1, prompt_tokens=30, completion_tokens=5, total_tokens=35)),
        rerun_requested,
        rerun_created,
    ]
    async with serve_journal(settings, bus) as served:
        for event in events:
            await bus.publish(event)
        await served.wait_recorded(events[-1].id)
        async with httpx.AsyncClient(base_url=served.url, headers=VIEWER) as client:
            before = (await client.get("/events", params={"limit": 1})).json()["events"][0]["commit_seq"]
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
            replayed_rerun = (await client.get(f"/runs/{rerun}")).json()
            reruns = (await client.get("/runs", params={"rerun_of": s.run_id})).json()["runs"]
    assert run["state"] == "completed"
    # the replay projects the run's totals again (runs.usage_*, from its run.completed)
    assert run["usage"] == {
        "turns": 2,
        "tool_calls": 1,
        "prompt_tokens": 30,
        "completion_tokens": 5,
        "total_tokens": 35,
        "samplings": 0,
    }
    # the replay projects the rerun's lineage again (runs.rerun_of / rerun_requested_by)
    assert (replayed_rerun["rerun_of"], replayed_rerun["rerun_requested_by"]) == (s.run_id, "oncall")
    assert [r["run_id"] for r in reruns] == [rerun]
    assert [(a["request_id"], a["state"]) for a in asks] == [("req-rebuilt", "asked")]
    assert [e["id"] for e in trajectory] == [e.id for e in events[:-2]]
    # the replayed events are numbered after every cursor handed out before the rebuild: a subscriber's old
    # cursor gets them again (same ids) and skips none
    assert min(e["commit_seq"] for e in trajectory) > before
    assert "positions_after" in out


async def test_unknown_arguments_are_refused() -> None:
    code, out = await _journal_cli("rebuild-everything", env={})
    assert code == 2
    assert out.startswith("usage: temporality-journal [-h | --help] [rebuild | migrations | downgrade]")
    assert "unexpected argument(s): rebuild-everything; see --help" in out
