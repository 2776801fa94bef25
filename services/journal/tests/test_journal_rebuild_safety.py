"""``temporality-journal rebuild`` never leaves the read model emptied without the replay set up: NATS first
(bounded), the stream checked for lost events, the durable consumer deleted before the tables are replaced in
one transaction; a kill between the steps still ends in a full replay at the next start. Real nats-server, real
SQLite and PostgreSQL, the real CLI in a subprocess."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from alembic import command
from alembic.config import Config
from journal_support import serve_journal, served_settings
from nats.js.errors import NotFoundError
from sqlalchemy import Connection, func, select, text

from temporality_bus import Bus, NatsSettings
from temporality_journal import Database
from temporality_journal.database import MIGRATIONS_DIR, head_revision
from temporality_journal.models import EVENTS_TABLE, RUNS_TABLE
from temporality_protocol import Envelope
from temporality_protocol.catalog import CONSUMERS, EVENTS_STREAM

MakeStory = Callable[..., Any]  # journal_support.RunStory
DURABLE = CONSUMERS["journal"].durable


async def _counts(database_url: str) -> tuple[int, int]:
    async with Database.open(database_url) as database, database.engine.connect() as conn:
        events = (await conn.execute(select(func.count()).select_from(EVENTS_TABLE))).scalar_one()
        runs = (await conn.execute(select(func.count()).select_from(RUNS_TABLE))).scalar_one()
    return int(events), int(runs)


async def _wait_counts(database_url: str, expected: tuple[int, int], within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while (got := await _counts(database_url)) != expected:
        assert time.monotonic() < deadline, f"the journal holds {got} (events, runs), expected {expected}"
        await asyncio.sleep(0.2)


async def _rebuild(*args: str, env: dict[str, str], within_s: float = 60.0) -> tuple[int, str, float]:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "temporality_journal",
        "rebuild",
        *args,
        env={**os.environ, "TEMPORALITY_LOG_FORMAT": "console", **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), within_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), time.monotonic() - started


def _env(nats_url: str, database_url: str) -> dict[str, str]:
    return {"TEMPORALITY_NATS_URL": nats_url, "TEMPORALITY_DATABASE_URL": database_url}


async def _recorded_runs(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, database_url: str, story: MakeStory, runs: int = 2
) -> list[Envelope[Any]]:
    """``runs`` finished runs published and recorded by the real journal (stopped again at the end)."""
    events: list[Envelope[Any]] = []
    for _ in range(runs):
        s = story()
        events += [s.requested(), s.started(), s.completed()]
    async with serve_journal(served_settings(tmp_path, nats_settings, database_url), bus) as served:
        for event in events:
            await bus.publish(event)
        await served.wait_recorded(events[-1].id)
    assert await _counts(database_url) == (len(events), runs)
    return events


async def _consumer_exists(bus: Bus) -> bool:
    try:
        await bus.js.consumer_info(EVENTS_STREAM.name, DURABLE)
    except NotFoundError:
        return False
    return True


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_nats_unreachable_fails_fast_and_changes_nothing(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, database_url: str, story: MakeStory
) -> None:
    """The documented mistake (the embedded stack stopped, its NATS with it): exit 1 within seconds, the
    database as it was (the old order emptied it and then retried NATS forever)."""
    events = await _recorded_runs(tmp_path, nats_settings, bus, database_url, story)
    url = f"nats://127.0.0.1:{_closed_port()}"
    # "fails fast" is that it ends at all (the old order retried NATS forever): bounded by _rebuild's wait,
    # never by a wall-clock figure a loaded CI machine can miss
    code, out, _ = await _rebuild(env=_env(url, database_url), within_s=90.0)
    assert code == 1, out
    assert "journal.rebuild_refused" in out
    assert f"NATS at {url} did not answer" in out
    assert "nothing was changed" in out
    assert await _counts(database_url) == (len(events), 2)
    assert await _consumer_exists(bus)  # the fixture's server: untouched as well


async def test_the_url_in_the_message_has_no_password(tmp_path: Path, database_url: str) -> None:
    url = f"nats://admin:s3cret@127.0.0.1:{_closed_port()}"
    code, out, _ = await _rebuild(env=_env(url, database_url))
    assert code == 1, out
    assert "s3cret" not in out
    assert "did not answer" in out


async def test_a_stream_missing_its_first_events_is_refused_unless_the_loss_is_accepted(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, database_url: str, story: MakeStory
) -> None:
    events = await _recorded_runs(tmp_path, nats_settings, bus, database_url, story)
    await bus.js.purge_stream(EVENTS_STREAM.name, seq=2)  # as max_age or limits would: sequence 1 is gone
    env = _env(nats_settings.url, database_url)

    code, out, _ = await _rebuild(env=env)
    assert code == 1, out
    assert "journal.rebuild_refused" in out
    assert "starts at sequence 2" in out
    assert "--accept-loss" in out
    assert await _counts(database_url) == (len(events), 2)
    assert await _consumer_exists(bus)

    code, out, _ = await _rebuild("--accept-loss", env=env)
    assert code == 0, out
    assert "journal.rebuild_accepting_loss" in out
    assert "journal.rebuild_ready" in out
    assert await _counts(database_url) == (0, 0)
    assert not await _consumer_exists(bus)
    async with serve_journal(served_settings(tmp_path, nats_settings, database_url), bus) as served:
        await served.wait_recorded(events[-1].id)
        await _wait_counts(database_url, (len(events) - 1, 2))  # all but the purged run.requested


async def test_a_stream_made_again_is_refused(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, database_url: str, story: MakeStory
) -> None:
    """Deleted and created again (empty, starting at 1): the database's events are nowhere else."""
    events = await _recorded_runs(tmp_path, nats_settings, bus, database_url, story, runs=1)
    info = await bus.js.stream_info(EVENTS_STREAM.name)
    await bus.js.delete_stream(EVENTS_STREAM.name)
    await bus.js.add_stream(info.config)
    code, out, _ = await _rebuild(env=_env(nats_settings.url, database_url))
    assert code == 1, out
    assert f"recorded stream sequence {len(events)}" in out
    assert await _counts(database_url) == (len(events), 1)


async def test_the_happy_path_logs_the_revision_and_the_next_start_replays_everything(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, database_url: str, story: MakeStory
) -> None:
    events = await _recorded_runs(tmp_path, nats_settings, bus, database_url, story)
    code, out, _ = await _rebuild(env=_env(nats_settings.url, database_url))
    assert code == 0, out
    ready = next(line for line in out.splitlines() if "journal.rebuild_ready" in line)
    assert f"revision={head_revision()}" in ready
    # the database was at the newest revision already: the start-up line says no migration ran
    opened = next(line for line in out.splitlines() if "database.ready" in line)
    assert f"revision={head_revision()}" in opened
    assert "migrated=False" in opened
    assert await _counts(database_url) == (0, 0)
    assert not await _consumer_exists(bus)
    async with serve_journal(served_settings(tmp_path, nats_settings, database_url), bus) as served:
        await served.wait_recorded(events[-1].id)
        await _wait_counts(database_url, (len(events), 2))


@pytest.mark.parametrize("crash_at", ["consumer_deleted", "tables_dropped"])
async def test_a_rebuild_killed_between_its_steps_still_ends_in_a_full_replay(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, database_url: str, story: MakeStory, crash_at: str
) -> None:
    """SIGKILL after the consumer's deletion (before the tables), or inside the tables' transaction: the tables
    are as they were, the consumer is gone, and the next start replays the whole stream into them."""
    events = await _recorded_runs(tmp_path, nats_settings, bus, database_url, story)
    async with Database.open(database_url) as database, database.engine.begin() as conn:  # a read model gone wrong
        await conn.execute(text("DELETE FROM events WHERE id = :id"), {"id": events[0].id})
    damaged = (len(events) - 1, 2)
    assert await _counts(database_url) == damaged

    code, out, _ = await _rebuild(
        env={**_env(nats_settings.url, database_url), "TEMPORALITY_TEST_REBUILD_CRASH_AT": crash_at}
    )
    assert code == -9, out
    assert "journal.rebuild_consumer_deleted" in out
    assert await _counts(database_url) == damaged  # untouched, or the transaction rolled back
    assert not await _consumer_exists(bus)

    async with serve_journal(served_settings(tmp_path, nats_settings, database_url), bus):
        await _wait_counts(database_url, (len(events), 2))  # the lost event is back: the whole stream replayed


def _downgrade_to(revision: str) -> Callable[[Connection], None]:
    def migrate(connection: Connection) -> None:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.attributes["connection"] = connection
        command.downgrade(config, revision)

    return migrate


async def _ready_line(database_url: str) -> dict[str, Any]:
    with structlog.testing.capture_logs() as logs:
        async with Database.open(database_url):
            pass
    return next(entry for entry in logs if entry["event"] == "database.ready")


async def test_database_ready_names_the_revision_and_what_alembic_migrated(database_url: str) -> None:
    head = head_revision()
    ready = await _ready_line(database_url)
    assert (ready["revision"], ready["migrated"]) == (head, f"none -> {head}")
    ready = await _ready_line(database_url)  # the next start: nothing to migrate
    assert (ready["revision"], ready["migrated"]) == (head, False)
    async with Database.open(database_url) as database, database.engine.begin() as conn:
        await conn.run_sync(_downgrade_to("0005_revoked"))  # a database of the previous release
    ready = await _ready_line(database_url)
    assert (ready["revision"], ready["migrated"]) == (head, f"0005_revoked -> {head}")
