"""A run's totals in the journal: ``usage`` (turns, tool calls, tokens, samplings) on ``GET /runs/{run_id}`` and
``GET /runs``, projected from the run's terminal event (``runs.usage_*``), null while the run is live and for a
terminal event without one, back-filled by migration ``0007_usage`` -- on SQLite and PostgreSQL. The rebuild from
the stream fills it too (test_journal_rebuild)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, select
from sqlalchemy.ext.asyncio import create_async_engine

from temporality_journal import Database
from temporality_journal.database import MIGRATIONS_DIR, VERSION_TABLE, async_url, head_revision
from temporality_journal.models import EVENTS_TABLE, RUNS_TABLE, JournalModel
from temporality_protocol.events import RunUsage

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal

USED = RunUsage(turns=3, tool_calls=2, prompt_tokens=420, completion_tokens=55, total_tokens=475, samplings=1)


async def test_a_finished_run_shows_what_it_used_and_a_live_one_shows_null(journal: Journal, story: MakeStory) -> None:
    done, failed, cancelled, old, live = (story() for _ in range(5))
    await journal.send(
        done.requested(),
        done.started(),
        done.completed(usage=USED),
        failed.requested(),
        failed.failed(usage=RunUsage(turns=1, prompt_tokens=10, completion_tokens=0, total_tokens=10)),
        cancelled.requested(),
        cancelled.cancelled(usage=RunUsage()),  # cancelled before it started: all zeros
        old.requested(),
        old.completed(),  # an older executor's event: no usage
        live.requested(),
        live.started(),
    )
    run = await journal.run(done.run_id)
    assert run["state"] == "completed"
    assert run["usage"] == USED.model_dump()
    assert (await journal.run(failed.run_id))["usage"] == {
        "turns": 1,
        "tool_calls": 0,
        "prompt_tokens": 10,
        "completion_tokens": 0,
        "total_tokens": 10,
        "samplings": 0,
    }
    assert (await journal.run(cancelled.run_id))["usage"] == RunUsage().model_dump()
    assert (await journal.run(old.run_id))["usage"] is None
    assert (await journal.run(live.run_id))["usage"] is None

    listed = {r["run_id"]: r["usage"] for r in (await journal.client.get("/runs")).json()["runs"]}
    assert listed[done.run_id] == USED.model_dump()
    assert listed[live.run_id] is None
    assert listed[old.run_id] is None

    # a second terminal event (a redelivery, a late cancellation) changes nothing: a run that ended has ended
    await journal.send(done.cancelled(usage=RunUsage(turns=99)))
    assert (await journal.run(done.run_id))["usage"] == USED.model_dump()

    document = (await journal.client.get("/openapi.json")).json()
    view = document["components"]["schemas"]["RunView"]["properties"]
    assert "usage" in view
    assert "RunUsage" in document["components"]["schemas"]


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


async def test_a_database_of_revision_0006_gets_the_usage_back_filled_from_its_terminal_events(
    database_url: str, story: MakeStory
) -> None:
    """Upgraded in place: the finished runs get their totals from their stored terminal event (no rebuild
    needed); a live run and one whose terminal event has no usage keep null; the schema is exactly the models'."""
    done, old, live = story(), story(), story()
    events = [
        done.requested(),
        done.completed(usage=USED),
        old.requested(),
        old.failed(),  # ``"usage": null``, as an older executor's event reads once stored (a JSON null)
        live.requested(),
        live.started(),
    ]
    url = async_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database:
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url)  # not Database.open: that would migrate to the newest revision
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_migrate_to("0006_reruns"))
            for seq, event in enumerate(events, 1):
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
            for s, state in ((done, "completed"), (old, "failed"), (live, "running")):
                await conn.execute(  # revision 0006's runs: only the columns it had (no usage_*)
                    RUNS_TABLE.insert().values(
                        run_id=s.run_id, state=state, created_at=events[0].time, updated_at=events[0].time
                    )
                )
        assert await Database(engine).revision() == "0006_reruns"
    finally:
        await engine.dispose()
    assert "usage" in events[3].data
    assert events[3].data["usage"] is None
    async with Database.open(database_url) as database:
        assert await database.revision() == head_revision()
        async with database.engine.connect() as conn:
            assert await conn.run_sync(_drift) == []
            t = RUNS_TABLE.c
            columns = [t.usage_turns, t.usage_tool_calls, t.usage_prompt_tokens, t.usage_completion_tokens]
            columns += [t.usage_total_tokens, t.usage_samplings]
            rows = {r[0]: tuple(r[1:]) for r in await conn.execute(select(t.run_id, *columns))}
        assert rows == {
            done.run_id: (3, 2, 420, 55, 475, 1),
            old.run_id: (None,) * 6,
            live.run_id: (None,) * 6,
        }
        await database.create_tables()  # a second start: nothing to do
        assert await database.revision() == head_revision()
