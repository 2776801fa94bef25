"""A journal started on a lost (or new, empty) database while its durable consumer had moved on replays the events
stream from its first message (:func:`temporality_journal.rebuild.replay_into_empty`), over a real nats-server, on
SQLite (the file deleted, as the chart's ``emptyDir`` loses it) and PostgreSQL (a new, empty database)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog
from journal_support import serve_journal, served_settings
from sqlalchemy import text

from temporality_bus import Bus, NatsSettings
from temporality_journal import Database
from temporality_protocol import Envelope
from temporality_protocol.catalog import CONSUMERS, EVENTS_STREAM
from temporality_testing.postgres import fresh_postgres_database

MakeStory = Callable[..., Any]  # journal_support.RunStory


@asynccontextmanager
async def _second_database(kind: str, tmp_path: Path) -> AsyncIterator[str]:
    """The database the journal finds after the loss: the same SQLite path with its files deleted, or a new
    PostgreSQL database."""
    if kind == "sqlite":
        path = tmp_path / "journal" / "journal.db"
        yield f"sqlite+aiosqlite:///{path}"
        return
    async with fresh_postgres_database("journal-lost") as url:
        yield url


@asynccontextmanager
async def _first_database(kind: str, tmp_path: Path) -> AsyncIterator[str]:
    if kind == "sqlite":
        path = tmp_path / "journal" / "journal.db"
        yield f"sqlite+aiosqlite:///{path}"
        for file in path.parent.glob("journal.db*"):  # the database and its -wal / -shm
            file.unlink()
        return
    async with fresh_postgres_database("journal-first") as url:
        yield url


async def _recorded_ids(database_url: str) -> list[str]:
    async with Database.open(database_url) as database, database.engine.connect() as conn:
        return [str(v) for v in (await conn.execute(text("SELECT id FROM events ORDER BY stream_seq"))).scalars()]


async def _wait_all_recorded(database_url: str, wanted: list[str], within_s: float = 60.0) -> list[str]:
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        ids = await _recorded_ids(database_url)
        if sorted(ids) == sorted(wanted) or asyncio.get_running_loop().time() > deadline:
            return ids
        await asyncio.sleep(0.2)


def _story_events(story: MakeStory, runs: int) -> list[Envelope]:
    events: list[Envelope] = []
    for _ in range(runs):
        s = story()
        events += [s.requested(), s.created(), s.started(), s.completed()]
    return events


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_lost_database_gets_the_whole_stream_again(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, story: MakeStory, kind: str
) -> None:
    events = _story_events(story, 3)
    async with _first_database(kind, tmp_path) as first:
        async with serve_journal(served_settings(tmp_path, nats_settings, first), bus) as served:
            for event in events:
                await bus.publish(event)
            await served.wait_recorded(events[-1].id)
        consumer = await bus.js.consumer_info(EVENTS_STREAM.name, CONSUMERS["journal"].durable)
        assert consumer.ack_floor is not None
        assert consumer.ack_floor.stream_seq == len(events)  # the durable had moved past every event

    async with _second_database(kind, tmp_path) as second:
        later = _story_events(story, 1)
        with structlog.testing.capture_logs() as logs:
            async with serve_journal(served_settings(tmp_path, nats_settings, second), bus):
                for event in later:
                    await bus.publish(event)
                wanted = [e.id for e in events + later]
                ids = await _wait_all_recorded(second, wanted)
        assert ids == wanted  # all the history again, in stream order, each once
        replaying = [entry for entry in logs if entry["event"] == "journal.replaying_stream"]
        assert len(replaying) == 1
        assert replaying[0]["log_level"] == "warning"
        assert replaying[0]["acknowledged_up_to"] == len(events)
        assert not [entry for entry in logs if entry["event"] == "journal.replay_incomplete"]

        # the next start on the same (now full) database replays nothing again
        with structlog.testing.capture_logs() as logs:
            async with serve_journal(served_settings(tmp_path, nats_settings, second), bus):
                pass
        assert not [entry for entry in logs if entry["event"] == "journal.replaying_stream"]
        assert await _recorded_ids(second) == wanted


async def test_a_replay_says_how_many_events_the_stream_no_longer_holds(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, story: MakeStory
) -> None:
    events = _story_events(story, 2)
    async with _first_database("sqlite", tmp_path) as first:
        async with serve_journal(served_settings(tmp_path, nats_settings, first), bus) as served:
            for event in events:
                await bus.publish(event)
            await served.wait_recorded(events[-1].id)
    await bus.js.purge_stream(EVENTS_STREAM.name, seq=4)  # its limits removed the first three

    async with _second_database("sqlite", tmp_path) as second:
        with structlog.testing.capture_logs() as logs:
            async with serve_journal(served_settings(tmp_path, nats_settings, second), bus):
                ids = await _wait_all_recorded(second, [e.id for e in events[3:]])
        assert ids == [e.id for e in events[3:]]
        incomplete = [entry for entry in logs if entry["event"] == "journal.replay_incomplete"]
        assert len(incomplete) == 1
        assert incomplete[0]["log_level"] == "warning"
        assert incomplete[0]["missing_events"] == 3


async def test_a_new_install_and_a_purged_journal_replay_nothing(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, story: MakeStory
) -> None:
    """A new database on a new stream (no durable yet), and a journal whose retention deleted every event (the
    commit counter remembers it recorded them): the durable is kept, nothing replayed."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'journal' / 'journal.db'}"
    events = _story_events(story, 1)
    with structlog.testing.capture_logs() as logs:
        async with serve_journal(served_settings(tmp_path, nats_settings, url), bus) as served:
            for event in events:
                await bus.publish(event)
            await served.wait_recorded(events[-1].id)
    assert not [entry for entry in logs if entry["event"] == "journal.replaying_stream"]
    async with Database.open(url) as database, database.engine.begin() as conn:
        await conn.execute(text("DELETE FROM events"))
        await conn.execute(text("DELETE FROM runs"))
    with structlog.testing.capture_logs() as logs:
        async with serve_journal(served_settings(tmp_path, nats_settings, url), bus):
            consumer = await bus.js.consumer_info(EVENTS_STREAM.name, CONSUMERS["journal"].durable)
    assert not [entry for entry in logs if entry["event"] == "journal.replaying_stream"]
    assert consumer.ack_floor is not None
    assert consumer.ack_floor.stream_seq == len(events)
    assert await _recorded_ids(url) == []
