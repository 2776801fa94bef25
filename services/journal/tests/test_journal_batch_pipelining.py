"""The journal's consumer prefetches the next batch while one commits: a batch whose commit fails must neither be
acked nor overtaken by the batch fetched behind it; nothing lost, nothing doubled, runs projected in stream order.

Real parts only: the journal's consumer on a real nats-server, the recorder on SQLite and on PostgreSQL (the
``database`` fixture's parametrization), the fault made by the database itself -- on PostgreSQL a deferred
constraint trigger that refuses the first ``COMMIT`` storing a chosen event (a transient error: the batch falls
back to one by one, where the event's own commit passes), on SQLite a trigger that refuses the event for good
(the batch falls back to one by one and the event is dead-lettered alone).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from sqlalchemy import text

from temporality_journal import Database, Recorder
from temporality_journal.models import RunSnapshot
from temporality_journal.projection import PROJECTED_TYPES, project, run_id_of
from temporality_protocol import Envelope
from temporality_protocol.catalog import CONSUMERS, EVENTS_STREAM
from temporality_testing.postgres import fresh_postgres_database
from temporality_testing.waiting import eventually

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal

RUNS = 20  # 8 events each: 160, more than two of the fixture's batches (64)


async def _fail_first_commit_with(database: Database, event_id: str) -> None:
    async with database.engine.begin() as conn:
        if database.dialect == "postgresql":
            await conn.execute(text("CREATE SEQUENCE fault_commits"))
            await conn.execute(
                text(
                    "CREATE FUNCTION fail_first_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    "IF nextval('fault_commits') = 1 THEN "
                    "RAISE EXCEPTION 'commit refused once by the test' USING ERRCODE = '40001'; END IF; "
                    "RETURN NULL; END $$"
                )
            )
            # deferred: fires at COMMIT, after every statement of the batch succeeded
            await conn.execute(
                text(
                    "CREATE CONSTRAINT TRIGGER fail_first_commit AFTER INSERT ON events DEFERRABLE INITIALLY DEFERRED "
                    f"FOR EACH ROW WHEN (NEW.id = '{event_id}') EXECUTE FUNCTION fail_first_commit()"
                )
            )
        else:
            await conn.execute(
                text(
                    "CREATE TRIGGER refuse_test BEFORE INSERT ON events "
                    f"WHEN NEW.id = '{event_id}' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
                )
            )


async def _stored(database: Database) -> list[tuple[str, int, int]]:
    """``(id, stream_seq, commit_seq)`` of every stored event, in commit order."""
    async with database.engine.connect() as conn:
        rows = await conn.execute(text("SELECT id, stream_seq, commit_seq FROM events ORDER BY commit_seq"))
        return [(str(r[0]), int(r[1]), int(r[2])) for r in rows]


async def test_a_batch_whose_commit_fails_is_neither_acked_nor_overtaken_by_the_prefetched_one(
    idle_journal: Journal, story: MakeStory
) -> None:
    journal = idle_journal
    database: Database = journal.database
    stories = [story() for _ in range(RUNS)]
    steps: list[Callable[[Any], Envelope]] = [
        lambda s: s.requested(),
        lambda s: s.created(),
        lambda s: s.started(),
        lambda s: s.human_requested(),
        lambda s: s.notified("web"),
        lambda s: s.answered(channel="web"),
        lambda s: s.resumed(),
        lambda s: s.completed(),
    ]
    events = [step(s) for step in steps for s in stories]  # interleaved, as a pipeline publishes them
    faulty = events[30]  # in the first batch, with more batches behind it
    await _fail_first_commit_with(database, faulty.id)
    for event in events:
        await journal.bus.publish(event)
    await journal.start()

    postgresql = database.dialect == "postgresql"
    kept = [e for e in events if postgresql or e.id != faulty.id]  # SQLite: the faulty one is dead-lettered
    for event in kept:
        await journal.wait_handled(event.id)
    if not postgresql:
        await journal.wait_type("bus.dead_lettered")

    # the faulty batch was handed over, failed, and was followed by the batch prefetched behind it
    first = next(i for i, batch in enumerate(journal.batches) if faulty.id in batch)
    assert len(journal.batches[first]) > 1, journal.batches
    assert len(journal.batches) > first + 1, journal.batches

    # every message settled: the consumer holds nothing un-acked and the server has nothing left to deliver
    async def settled() -> bool:
        info = await journal.bus.js.consumer_info(EVENTS_STREAM.name, CONSUMERS["journal"].durable)
        return info.num_ack_pending == 0 and info.num_pending == 0

    await eventually(settled, 30, "every message acked")

    if postgresql:  # the fault fired twice: the batch's commit (refused), the faulty event's own (passed)
        async with database.engine.connect() as conn:
            assert (await conn.execute(text("SELECT last_value FROM fault_commits"))).scalar_one() == 2
    assert all(faulty.id not in batch for batch in journal.batches[first + 1 :])  # never redelivered

    stored = await _stored(database)
    ours = [row for row in stored if row[0] in {e.id for e in events}]
    assert sorted(row[0] for row in ours) == sorted(e.id for e in kept)  # nothing lost, nothing doubled
    # committed in stream order (the failed batch, redone one by one, before the prefetched batch), positions gapless
    assert [row[1] for row in stored] == sorted(row[1] for row in stored)
    assert [row[2] for row in stored] == list(range(1, len(stored) + 1))

    # every run as the events projected in stream order make it
    seq_of = {row[0]: row[1] for row in ours}
    expected: dict[str, RunSnapshot] = {}
    for event in sorted((e for e in kept if e.type in PROJECTED_TYPES), key=lambda e: seq_of[e.id]):
        run_id = run_id_of(event)
        assert run_id is not None
        after = project(expected.get(run_id), event, seq_of[event.id])
        if after is not None:
            expected[run_id] = after
    async with database.engine.connect() as conn:
        rows = await conn.execute(text("SELECT run_id, state, last_event_seq FROM runs"))
        found = {str(r[0]): (str(r[1]), int(r[2])) for r in rows}
    assert found == {run_id: (run.state.value, run.last_event_seq) for run_id, run in expected.items()}


async def test_a_batch_cancelled_mid_transaction_leaves_nothing_and_its_connection_is_not_reused(
    story: MakeStory,
) -> None:
    """PostgreSQL's batch runs its transaction on the asyncpg connection, where SQLAlchemy's reset on check-in
    would not end it: a batch cancelled inside its transaction (the counter's lock taken, its events' statement
    waiting on a run's row, locked by another session) must not leave that transaction open -- its lock would
    stop every later batch -- nor hand the connection back to the pool mid-transaction."""
    async with fresh_postgres_database("journal_cancel") as url, Database.open(url) as db, Database.open(url) as other:
        s = story()
        assert await Recorder(db).record(s.requested(), 1)
        events = [(s.created(), 2), (s.started(), 3)]
        async with other.engine.connect() as holder:
            await holder.begin()
            await holder.execute(text("SELECT run_id FROM runs WHERE run_id = :r FOR UPDATE"), {"r": s.run_id})
            writing = asyncio.create_task(Recorder(db).record_batch(events))

            async def waiting() -> bool:
                async with other.engine.connect() as conn:
                    query = (
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    )
                    return int((await conn.execute(text(query))).scalar_one()) >= 1

            await eventually(waiting, 30, "the batch waits on the run's row, the counter's lock taken")
            writing.cancel()
            await asyncio.gather(writing, return_exceptions=True)
            assert writing.cancelled()
            await holder.rollback()
        # the next batch takes the counter's lock (nobody holds it any more) on a connection in no transaction
        assert await asyncio.wait_for(Recorder(db).record_batch(events), 30) == 2
        async with db.engine.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM events"))).scalar_one() == 3
            assert (await conn.execute(text("SELECT state FROM runs"))).scalar_one() == "running"
            assert (await conn.execute(text("SELECT last_seq FROM commit_counter"))).scalar_one() == 3
