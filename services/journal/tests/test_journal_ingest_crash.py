"""The journal process killed mid-ingest (SIGKILL: a batch committing, the next one prefetched, neither
acked) and started again: JetStream redelivers what it held, and the journal ends with every event once
and the runs exactly as recording the events one by one gives them. SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from temporality_bus import Bus, NatsSettings
from temporality_journal import Database, Recorder
from temporality_protocol import Envelope
from temporality_protocol.catalog import EVENTS_STREAM

MakeStory = Callable[..., Any]  # journal_support.RunStory
Rows = tuple[list[dict[str, Any]], list[dict[str, Any]]]

RUNS = 250  # x 8 events: long enough an ingest that the kill lands in the middle of it


async def _count(database: Database) -> int:
    async with database.engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM events"))).scalar_one())


async def _rows(database: Database) -> Rows:
    async with database.engine.connect() as conn:
        events = [dict(r._mapping) for r in await conn.execute(text("SELECT * FROM events ORDER BY id"))]
        runs = [dict(r._mapping) for r in await conn.execute(text("SELECT * FROM runs ORDER BY run_id"))]
    for event in events:
        del event["recorded_at"]
        del event["commit_seq"]  # the commit order (a restart may commit redeliveries later): checked apart
    return events, runs


async def _start(env: dict[str, str], log: Path) -> asyncio.subprocess.Process:
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "temporality_journal", env=env, stdout=out, stderr=out
        )


async def _until(probe: Callable[[], Any], proc: asyncio.subprocess.Process, within_s: float, what: str) -> None:
    """Poll the database (the other process's work has no event to await), bounded."""
    try:
        async with asyncio.timeout(within_s):
            while not await probe():
                assert proc.returncode is None, f"the journal exited with {proc.returncode}"
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {within_s} s") from None


# two process starts, 2,000 events ingested twice over (the processes', then one by one for the reference), each
# wait bounded below (60 s + 90 s): the suite's 120 s default is too short at a load of ~18 on two cores
@pytest.mark.timeout(300)
async def test_a_journal_killed_mid_ingest_loses_nothing_and_doubles_nothing(
    tmp_path: Path, bus: Bus, nats_settings: NatsSettings, database: Database, story: MakeStory
) -> None:
    stories = [story(title=f"Run {i}") for i in range(RUNS)]
    steps: list[Callable[[Any], Envelope]] = [
        lambda s: s.requested(),
        lambda s: s.created(),
        lambda s: s.started(),
        lambda s: s.human_requested(),
        lambda s: s.notified("web"),
        lambda s: s.answered(),
        lambda s: s.resumed(),
        lambda s: s.completed(),
    ]
    events = [step(s) for step in steps for s in stories]  # the runs interleaved, as a pipeline makes them
    seqs = [result.seq for result in await bus.publish_many(events)]
    total = len(events)

    env = {
        **os.environ,
        "TEMPORALITY_NATS_URL": nats_settings.url,
        "TEMPORALITY_DATABASE_URL": str(database.engine.url.render_as_string(hide_password=False)),
        "TEMPORALITY_JOURNAL_PORT": "0",
        "TEMPORALITY_JOURNAL_BATCH_SIZE": "64",
        "TEMPORALITY_NATS_ACK_WAIT_S": "2",  # what the killed process held comes back after 2 s
        "TEMPORALITY_LOG_FORMAT": "console",
    }
    log = tmp_path / "journal.log"
    proc = await _start(env, log)
    try:

        async def started() -> bool:
            return await _count(database) > 0

        await _until(started, proc, 60, "the first batch committed")
        proc.kill()  # mid-ingest: no graceful stop, nothing in hand acked
        await proc.wait()
        at_kill = await _count(database)
        assert 0 < at_kill < total, f"the kill landed outside the ingest ({at_kill} of {total})"
        held = await bus.js.consumer_info(EVENTS_STREAM.name, "journal")
        assert held.num_ack_pending > 0  # delivered to the killed process, never acked: they must come back

        proc = await _start(env, log)

        async def drained() -> bool:
            return await _count(database) >= total

        await _until(drained, proc, 90, "every event recorded after the restart")
        assert await _count(database) == total
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    recovered = await _rows(database)
    async with database.engine.connect() as conn:
        positions = [row[0] for row in await conn.execute(text("SELECT commit_seq FROM events ORDER BY commit_seq"))]
    assert positions == list(range(1, total + 1))  # the killed transaction's positions went with it
    assert sorted(row["id"] for row in recovered[0]) == sorted(event.id for event in events)
    assert {run["state"] for run in recovered[1]} == {"completed"}

    async with database.engine.begin() as conn:  # the reference: the same events recorded one by one
        await conn.execute(text("DELETE FROM events"))
        await conn.execute(text("DELETE FROM runs"))
    recorder = Recorder(database)
    for event, seq in zip(events, seqs, strict=True):
        await recorder.record(event, seq)
    assert recovered == await _rows(database)
