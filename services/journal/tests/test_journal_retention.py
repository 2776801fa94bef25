"""Retention of the read model (issue 9): finished runs older than the setting go, live runs never do."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from journal_support import VIEWER, serve_journal, served_settings
from sqlalchemy import Table, func, select

from temporality_bus import Bus, NatsSettings
from temporality_journal import Database, Recorder, Settings
from temporality_journal.models import ASKS_TABLE, EVENTS_TABLE, RUNS_TABLE
from temporality_journal.retention import Purged, Retention
from temporality_protocol import HumanRejected, RunCancelRequested, TriggerCreated, make_event
from temporality_protocol.events import AgentAsked

MakeStory = Callable[..., Any]  # journal_support.RunStory
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


async def _count(database: Database, table: Table, **where: str) -> int:
    query = select(func.count()).select_from(table)
    for column, value in where.items():
        query = query.where(table.c[column] == value)
    async with database.engine.connect() as conn:
        return int((await conn.execute(query)).scalar_one())


async def _seed(database: Database, story: MakeStory) -> tuple[Any, Any, Any, Any]:
    old = story(at=NOW - timedelta(days=40))
    older = story(at=NOW - timedelta(days=50))
    waiting = story(at=NOW - timedelta(days=60))  # waits for a person since then: never purged
    recent = story(at=NOW - timedelta(days=10))
    ask = make_event(
        AgentAsked(request_id="req-old", asker_run_id=old.run_id, asker_agent="reviewer", to="agent:x", message="?"),
        source="/temporality/test",
        run_id=old.run_id,
        time=NOW - timedelta(days=40),
    )
    trigger_old = make_event(
        TriggerCreated(trigger_id="t", revision=1, changed_by="root"), source="/t", time=NOW - timedelta(days=45)
    )
    trigger_new = make_event(
        TriggerCreated(trigger_id="t", revision=2, changed_by="root"), source="/t", time=NOW - timedelta(days=1)
    )
    events = [
        *(e for s in (old, older, recent) for e in (s.requested(), s.started(), s.completed())),
        waiting.requested(),
        waiting.started(),
        waiting.human_requested(),
        ask,
        trigger_old,
        trigger_new,
    ]
    await Recorder(database).record_batch([(e, i + 1) for i, e in enumerate(events)])
    return old, older, waiting, recent


async def test_finished_runs_older_than_the_retention_are_purged_in_batches(
    database: Database, story: MakeStory
) -> None:
    old, older, waiting, recent = await _seed(database, story)
    retention = Retention(database, 30, clock=lambda: NOW, batch_size=1)
    purged = await retention.purge()
    assert (purged.runs, purged.events, purged.asks) == (2, 7, 1)  # 2 runs x 3 events, the ask (not the audit)
    assert purged.batches >= 2  # one run per transaction
    for gone in (old, older):
        assert await _count(database, RUNS_TABLE, run_id=gone.run_id) == 0
        assert await _count(database, EVENTS_TABLE, run_id=gone.run_id) == 0
    assert await _count(database, RUNS_TABLE, run_id=waiting.run_id) == 1
    assert await _count(database, EVENTS_TABLE, run_id=waiting.run_id) == 3
    assert await _count(database, RUNS_TABLE, run_id=recent.run_id) == 1
    assert await _count(database, EVENTS_TABLE, type="trigger.created") == 2  # audited: kept, however old
    assert await _count(database, ASKS_TABLE) == 0
    assert await retention.purge() == Purged()  # a second pass finds nothing


async def test_the_audit_trail_outlives_the_table_retention_and_has_its_own(
    database: Database, story: MakeStory
) -> None:
    cancelled = story(at=NOW - timedelta(days=40))
    cancel = make_event(
        RunCancelRequested(run_id=cancelled.run_id, reason="closed", requested_by="oncall"),
        source="/t",
        run_id=cancelled.run_id,
        time=NOW - timedelta(days=40),
    )
    very_old = make_event(
        TriggerCreated(trigger_id="t", revision=1, changed_by="root"), source="/t", time=NOW - timedelta(days=400)
    )
    refused = [  # human.rejected is audited for recipient_not_allowed only
        make_event(
            HumanRejected(
                request_id=f"hreq-{reason}", run_id=cancelled.run_id, recipient="user:eve", reason=reason, detail="x"
            ),
            source="/t",
            run_id=cancelled.run_id,
            time=NOW - timedelta(days=40),
        )
        for reason in ("recipient_not_allowed", "invalid_request")
    ]
    events = [cancelled.requested(), cancelled.started(), cancel, *refused, cancelled.cancelled(), very_old]
    await Recorder(database).record_batch([(e, i + 1) for i, e in enumerate(events)])

    purged = await Retention(database, 30, clock=lambda: NOW).purge()
    assert (purged.runs, purged.events, purged.audit) == (1, 4, 0)  # requested, started, the other refusal, cancelled
    kept = {r.id for r in await _rows(database)}
    assert kept == {cancel.id, refused[0].id, very_old.id}  # the run's audited events and the old trigger change

    purged = await Retention(database, 30, audit_days=365, clock=lambda: NOW).purge()
    assert (purged.runs, purged.events, purged.audit) == (0, 0, 1)  # only the audit older than a year
    assert {r.id for r in await _rows(database)} == {cancel.id, refused[0].id}
    assert await Retention(database, 0, audit_days=30, clock=lambda: NOW).purge() == Purged(audit=2, batches=1)
    assert await _rows(database) == []


async def _rows(database: Database) -> list[Any]:
    async with database.engine.connect() as conn:
        return list((await conn.execute(select(EVENTS_TABLE.c.id))).all())


async def test_the_background_purge_runs_at_start(database: Database, story: MakeStory) -> None:
    old, *_ = await _seed(database, story)
    passes: list[Purged] = []
    done = asyncio.Event()

    def on_pass(purged: Purged) -> None:
        passes.append(purged)
        done.set()

    retention = Retention(database, 30, clock=lambda: NOW, interval_s=3600, on_pass=on_pass)
    async with retention.running():
        await asyncio.wait_for(done.wait(), 10)
    assert [p.runs for p in passes] == [2]
    assert await _count(database, RUNS_TABLE, run_id=old.run_id) == 0
    assert await _count(database, RUNS_TABLE) == 2  # the waiting and the recent run


def test_retention_is_off_by_default_and_refuses_nonsense(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (Settings().retention_days, Settings().audit_retention_days) == (0, 0)
    monkeypatch.setenv("TEMPORALITY_JOURNAL_AUDIT_RETENTION_DAYS", "3650")
    assert Settings().audit_retention_days == 3650
    with pytest.raises(ValueError, match="at least one day"):
        Retention(None, 0)  # type: ignore[arg-type]
    monkeypatch.setenv("TEMPORALITY_JOURNAL_RETENTION_DAYS", "14")
    assert Settings().retention_days == 14
    monkeypatch.setenv("TEMPORALITY_JOURNAL_RETENTION_DAYS", "-1")
    with pytest.raises(ValueError, match="retention_days"):
        Settings()


async def test_the_service_purges_when_retention_is_set(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, story: MakeStory
) -> None:
    settings = served_settings(tmp_path, nats_settings).model_copy(update={"retention_days": 30})
    old, fresh = story(at=datetime.now(UTC) - timedelta(days=40)), story()
    async with Database.open(settings.database_url) as database:
        events = [e for s in (old, fresh) for e in (s.requested(), s.started(), s.completed())]
        await Recorder(database).record_batch([(e, i + 1) for i, e in enumerate(events)])
    async with serve_journal(settings, bus) as served, httpx.AsyncClient(base_url=served.url, headers=VIEWER) as client:
        for _ in range(200):  # the purge runs in the service's own task: poll the API, bounded
            if (await client.get(f"/runs/{old.run_id}")).status_code == 404:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the finished run older than the retention was not purged")
        assert (await client.get(f"/runs/{fresh.run_id}")).status_code == 200
