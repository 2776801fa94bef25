"""Reruns in the journal: a rerun's run row says what it runs again and who asked (``rerun_of``,
``rerun_requested_by``, projected from ``run.requested`` / ``run.created``, back-filled by migration
``0006_reruns``), ``GET /runs?rerun_of=`` lists a run's reruns, the rerun is in the audit trail (``run_rerun``), and
``/events/stream?audited=true`` tails only what the audit trail lists -- on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from journal_support import OPERATOR, VIEWER, rerun_events, serve_journal, served_settings
from sqlalchemy import Connection, select
from sqlalchemy.ext.asyncio import create_async_engine

from temporality_bus import Bus, NatsSettings
from temporality_journal import Database
from temporality_journal.database import MIGRATIONS_DIR, VERSION_TABLE, async_url, head_revision
from temporality_journal.models import EVENTS_TABLE, RUNS_TABLE, JournalModel
from temporality_protocol import (
    HumanRejected,
    derive_id,
    make_event,
)

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal


async def test_a_rerun_s_run_says_what_it_reruns_and_who_asked_and_a_run_lists_its_reruns(
    journal: Journal, story: MakeStory
) -> None:
    original, other = story(), story(title="Another PR")
    first = f"{original.run_id}-rerun-1"
    second = f"{original.run_id}-rerun-2"
    first_requested, first_created = rerun_events(original, first)
    second_requested, _ = rerun_events(original, second, by="user:alice", n=2)
    # the executor's run.created of the first rerun arrives before the gateway's run.requested: same row either way
    await journal.recorder.record_batch(
        [
            (original.requested(), 1),
            (original.failed(), 2),
            (other.requested(), 3),
            (first_created, 5),
            (first_requested, 4),
            (second_requested, 6),
        ]
    )
    client = journal.client
    run = await journal.run(first)
    assert (run["rerun_of"], run["rerun_requested_by"]) == (original.run_id, "oncall")
    assert (run["trigger_id"], run["launch_kind"], run["state"]) == (original.trigger_id, "webhook", "pending")
    plain = await journal.run(original.run_id)
    assert (plain["rerun_of"], plain["rerun_requested_by"]) == (None, None)

    listed = {r["run_id"]: r for r in (await client.get("/runs")).json()["runs"]}
    assert listed[second]["rerun_of"] == original.run_id
    assert listed[second]["rerun_requested_by"] == "user:alice"
    assert listed[other.run_id]["rerun_of"] is None

    reruns = (await client.get("/runs", params={"rerun_of": original.run_id})).json()
    assert [r["run_id"] for r in reruns["runs"]] == [second, first]  # newest first
    assert (await client.get("/runs", params={"rerun_of": first})).json()["runs"] == []
    bad = await client.get("/runs", params={"rerun_of": "x" * 201})
    assert bad.status_code == 422

    # the OpenAPI document describes the fields and the filter
    document = (await client.get("/openapi.json")).json()
    view = document["components"]["schemas"]["RunView"]["properties"]
    assert {"rerun_of", "rerun_requested_by"} <= view.keys()
    assert "rerun_of" in {p["name"] for p in document["paths"]["/runs"]["get"]["parameters"]}


async def test_a_rerun_is_in_the_audit_trail_with_who_asked_the_trigger_the_delivery_and_both_runs(
    journal: Journal, story: MakeStory
) -> None:
    original = story()
    rerun = f"{original.run_id}-rerun-1"
    requested, created = rerun_events(original, rerun)
    await journal.recorder.record_batch(
        [(original.requested(), 1), (original.created(), 2), (original.failed(), 3), (requested, 4), (created, 5)]
    )
    client = journal.client

    async def audit(**params: Any) -> list[dict[str, Any]]:
        response = await client.get("/audit", params=params, headers=OPERATOR)
        assert response.status_code == 200, response.text
        entries: list[dict[str, Any]] = response.json()["entries"]
        return entries

    (entry,) = await audit()  # the plain run.requested / run.created and the rerun's run.created are not audited
    assert (entry["id"], entry["type"], entry["kind"]) == (requested.id, "run.requested", "run_rerun")
    assert (entry["actor"], entry["event_actor"]) == ("oncall", "service:trigger-gateway")
    assert (entry["target"], entry["run_id"]) == (original.run_id, rerun)
    assert entry["summary"] == (
        f"run {original.run_id} rerun as run {rerun} (trigger {original.trigger_id}, delivery dlv-1-rerun-1)"
    )
    assert entry["details"]["launch"]["requested_by"] == "oncall"
    assert [e["id"] for e in await audit(kind="run_rerun")] == [requested.id]
    assert [e["id"] for e in await audit(type="run.requested")] == [requested.id]
    assert [e["id"] for e in await audit(actor="oncall")] == [requested.id]
    assert await audit(actor="someone-else") == []
    assert await audit(kind="cancellation") == []


def _migrate_to(revision: str) -> Callable[[Connection], None]:
    def migrate(connection: Connection) -> None:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.attributes["connection"] = connection
        command.upgrade(config, revision)

    return migrate


def _drift(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE, "compare_type": True})
    return list(compare_metadata(context, JournalModel.metadata))


async def test_a_database_of_revision_0005_gets_the_rerun_columns_back_filled_from_its_events(
    database_url: str, story: MakeStory
) -> None:
    """Upgraded in place: the runs already projected get ``rerun_of`` / ``rerun_requested_by`` from their stored
    run events (no rebuild needed); the other runs keep ``null``; the schema is exactly the models'."""
    original = story()
    rerun = f"{original.run_id}-rerun-1"
    requested, created = rerun_events(original, rerun, by="user:alice")
    url = async_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database:
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url)  # not Database.open: that would migrate to the newest revision
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_migrate_to("0005_revoked"))
            for seq, event in enumerate([original.requested(), requested, created], 1):
                row = {
                    "id": event.id,
                    "type": event.type,
                    "source": event.source,
                    "time": event.time,
                    "run_id": event.runid,
                    "stream_seq": seq,
                    "commit_seq": seq,
                    "data": event.data,
                    "recorded_at": event.time,
                }
                await conn.execute(EVENTS_TABLE.insert().values(row))
            for run_id, event in ((original.run_id, original.requested()), (rerun, requested)):
                await conn.execute(  # revision 0005's runs: only the columns it had (no rerun_*)
                    RUNS_TABLE.insert().values(
                        run_id=run_id,
                        state="pending",
                        created_at=event.time,
                        updated_at=event.time,
                        trigger_id=original.trigger_id,
                    )
                )
        assert await Database(engine).revision() == "0005_revoked"
    finally:
        await engine.dispose()
    async with Database.open(database_url) as database:
        assert await database.revision() == head_revision()
        async with database.engine.connect() as conn:
            assert await conn.run_sync(_drift) == []
            t = RUNS_TABLE.c
            rows = dict(
                (r[0], (r[1], r[2])) for r in await conn.execute(select(t.run_id, t.rerun_of, t.rerun_requested_by))
            )
        assert rows == {original.run_id: (None, None), rerun: (original.run_id, "user:alice")}
        await database.create_tables()  # a second start: nothing to do
        assert await database.revision() == head_revision()


@asynccontextmanager
async def _open_tail(client: httpx.AsyncClient, **params: Any) -> AsyncIterator[AsyncIterator[str]]:
    async with client.stream("GET", "/events/stream", params=params) as response:
        assert response.status_code == 200, await response.aread()
        lines = response.aiter_lines()
        async with asyncio.timeout(20):
            async for line in lines:
                if line.startswith(": tail after"):
                    break
        yield lines


async def _next_data(lines: AsyncIterator[str], within_s: float = 20.0) -> dict[str, Any]:
    async with asyncio.timeout(within_s):
        async for line in lines:
            if line.startswith("data: "):
                data: dict[str, Any] = json.loads(line.removeprefix("data: "))
                return data
    raise AssertionError("the stream ended")


async def test_the_audited_tail_sends_only_what_the_audit_trail_lists(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, database_url: str, story: MakeStory
) -> None:
    """``/events/stream?audited=true``: a rerun's ``run.requested`` and a permission refusal come through; a plain
    run's events, the rerun's ``run.created`` and a refusal that is not a permission one do not."""
    original = story()
    rerun = f"{original.run_id}-rerun-1"
    requested, created = rerun_events(original, rerun)
    not_audited = make_event(
        HumanRejected(request_id="h-1", run_id=rerun, recipient="user:bob", reason="no_channel", detail="none"),
        source="/temporality/test",
        id=derive_id("evt", rerun, "rejected", "no_channel"),
        run_id=rerun,
    )
    refused = make_event(
        HumanRejected(
            request_id="h-2", run_id=rerun, recipient="user:eve", reason="recipient_not_allowed", detail="no"
        ),
        source="/temporality/test",
        id=derive_id("evt", rerun, "rejected", "not_allowed"),
        run_id=rerun,
    )
    settings = served_settings(tmp_path, nats_settings, database_url)
    async with (
        serve_journal(settings, bus) as served,
        httpx.AsyncClient(base_url=served.url, headers=OPERATOR, timeout=30) as client,
    ):
        async with _open_tail(client, audited="true") as audited:
            for event in (original.requested(), original.failed(), requested, created, not_audited, refused):
                await bus.publish(event)
            first, second = await _next_data(audited), await _next_data(audited)
        assert [(first["id"], first["type"]), (second["id"], second["type"])] == [
            (requested.id, "run.requested"),
            (refused.id, "human.rejected"),
        ]
        assert first["data"]["launch"]["rerun_of"] == original.run_id
        # from the start: the same two, nothing else, in commit order
        async with _open_tail(client, audited="true", after=0) as replay:
            assert (await _next_data(replay))["id"] == requested.id
            assert (await _next_data(replay))["id"] == refused.id
        bad = await client.get("/events/stream", params={"audited": "perhaps"})
        assert bad.status_code == 422
        # the audit trail is the operator's: a viewer's audited tail is refused, as its /audit is
        assert (await client.get("/events/stream", params={"audited": "true"}, headers=VIEWER)).status_code == 403
