"""The journal records a batch of events in one transaction, with the rows of one-by-one recording.

Every test runs on SQLite and on PostgreSQL (the ``database`` fixture's parametrization).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import aiosqlite
import pytest
import structlog
from journal_support import OPERATOR
from sqlalchemy import event as sa_event
from sqlalchemy import text

from temporality_bus import PermanentError
from temporality_journal import Database, Recorder
from temporality_journal import recorder as recorder_module
from temporality_journal.models import RunSnapshot
from temporality_journal.projection import project, run_id_of
from temporality_journal.recorder import _as_guessed, _Guesses, _Row
from temporality_protocol import RUN, AgentAsked, Envelope, RunState, decode, encode, make_event
from temporality_testing.waiting import stays

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal

Rows = tuple[list[dict[str, Any]], list[dict[str, Any]]]


def _event(event_id: str, *, data: dict[str, Any], **attributes: Any) -> Envelope:
    return Envelope(
        id=event_id,
        source="/temporality/test",
        type=attributes.pop("type", "scm.pull_request.updated"),
        time=datetime.now(UTC),
        data=data,
        **attributes,
    )


def _mixed(story: MakeStory) -> list[tuple[Envelope, int]]:
    """Events of four runs, interleaved, with what makes projection tricky: duplicates, an event of no
    run, a stale (older) event arriving late, an answer to a request nobody waits on, a NUL."""
    a, b, c, d = story(), story(), story(title="Fix \x00 parser"), story()
    a_started = a.started()
    events = [
        a.requested(),
        b.requested(),
        a.created(),
        c.requested(),
        a_started,
        b.started(),
        _event("evt-no-run", data={"note": "belongs to no run"}),
        a.human_requested(),
        c.started(),
        a.notified("matrix"),
        b.failed(),
        a.notified("web"),
        c.answered(),  # c waits on nothing: no move
        a.answered(),
        b.started("started-after-failure"),  # terminal is sticky
        a.resumed(),
        d.started(),  # a run first seen by a later event
        d.requested(),
        c.cancelled(),
        a.completed(),
        _event(f"evt-pr-{a.run_id}", runid=a.run_id, data={"run_id": a.run_id}),  # stored, projected nowhere
    ]
    numbered = [(event, seq) for seq, event in enumerate(events, start=1)]
    numbered.append((a_started, len(events) + 1))  # a redelivery (same id, a later sequence)
    numbered.append((events[0], len(events) + 2))
    return numbered


async def _rows(database: Database, *, recorded_at: bool = False) -> Rows:
    async with database.engine.connect() as conn:
        events = [dict(r._mapping) for r in await conn.execute(text("SELECT * FROM events ORDER BY id"))]
        runs = [dict(r._mapping) for r in await conn.execute(text("SELECT * FROM runs ORDER BY run_id"))]
    if not recorded_at:
        for event in events:
            del event["recorded_at"]
    return events, runs


async def _clear(database: Database) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(text("DELETE FROM events"))
        await conn.execute(text("DELETE FROM runs"))
        await conn.execute(text("UPDATE commit_counter SET last_seq = 0"))  # positions from 1, as when fresh


async def test_a_batch_of_mixed_events_gives_the_rows_of_one_by_one(database: Database, story: MakeStory) -> None:
    recorder = Recorder(database)
    events = _mixed(story)
    for event, seq in events:
        await recorder.record(event, seq)
    expected = await _rows(database)
    assert len(expected[0]) == len(events) - 2
    assert sorted(run["state"] for run in expected[1]) == ["cancelled", "completed", "failed", "running"]

    await _clear(database)
    assert await recorder.record_batch(events) == len(events) - 2
    assert await _rows(database) == expected

    await _clear(database)  # in several batches: later ones update the runs earlier ones created
    for start in range(0, len(events), 5):
        await recorder.record_batch(events[start : start + 5])
    assert await _rows(database) == expected

    await _clear(database)  # as the consumer hands them over: with the JSON each was decoded from
    raw = [encode(event) for event, _ in events]
    assert 0 < sum(b"\\u" in text for text in raw) < len(raw)  # the NUL's escapes take the exact check
    assert await recorder.record_batch(events, raw=raw) == len(events) - 2
    assert await _rows(database) == expected


async def test_envelopes_stored_as_received_give_the_rows_of_one_by_one(database: Database, story: MakeStory) -> None:
    """PostgreSQL's batch takes a clean envelope's bytes as received (not serialized again): JSON written
    another way -- keys in another order, blanks, an attribute the envelope ignores, a time with another
    offset, as a Unix time (a number, a numeric string) or with nine fractional digits, which the envelope's
    model and PostgreSQL read differently -- still gives the rows one by one gives."""
    s = story()
    written: list[bytes] = []
    times: list[Callable[[datetime], object]] = [
        lambda t: t.astimezone(timezone(timedelta(hours=2))).isoformat(),
        lambda t: int(t.timestamp()),  # PostgreSQL: an error (the model: a Unix time)
        lambda t: str(int(t.timestamp()) // 10_000),  # 6 digits: PostgreSQL reads a date (the model: a Unix time)
        lambda t: f"{t:%Y-%m-%dT%H:%M:%S}.9999995Z",  # PostgreSQL rounds to the next second, the model truncates
    ]
    for event, time_as in zip([s.requested(), s.created(), s.started(), s.completed()], times, strict=True):
        fields = json.loads(encode(event))
        fields["time"] = time_as(event.time)
        fields["someextension"] = "ignored"
        written.append(json.dumps(dict(reversed(fields.items())), indent=1).encode())
    assert not any(b"\\u" in raw for raw in written)  # every one clean: taken as received
    events = [(decode(raw), seq) for seq, raw in enumerate(written, start=1)]
    recorder = Recorder(database)
    for event, seq in events:
        await recorder.record(event, seq)
    expected = await _rows(database)
    assert [run["state"] for run in expected[1]] == ["completed"]
    await _clear(database)
    assert await recorder.record_batch(events, raw=written) == len(events)
    assert await _rows(database) == expected


async def test_full_batches_of_interleaved_runs_give_the_rows_of_one_by_one(
    database: Database, story: MakeStory
) -> None:
    """Batches the size the journal fetches (PostgreSQL: the one-statement ``unnest`` insert of the events), of
    trajectories interleaved as a pipeline makes them, one redelivered half-way: the rows of one by one."""
    stories = [story(title=f"Run {i} \u00e9\u4e2d \U0001f600") for i in range(40)]
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
    trajectories = [[step(s) for step in steps] for s in stories]
    flat = [trajectory[i] for i in range(len(steps)) for trajectory in trajectories]
    flat += [_event(f"evt-note-{i}", runid=s.run_id, data={"run_id": s.run_id, "n": i}) for i, s in enumerate(stories)]
    events = [(event, seq) for seq, event in enumerate(flat, start=1)]
    events[150:150] = events[100:120]  # redelivered within the stream: stored once, projected once
    recorder = Recorder(database)
    for event, seq in events:
        await recorder.record(event, seq)
    expected = await _rows(database)
    assert len(expected[0]) == len(flat)
    assert {run["state"] for run in expected[1]} == {"completed"}

    for raw in (False, True):  # True: with the JSON each was decoded from, as the consumer hands them over
        await _clear(database)
        new = 0
        for start in range(0, len(events), 128):
            batch = events[start : start + 128]
            new += await recorder.record_batch(batch, raw=[encode(e) for e, _ in batch] if raw else None)
        assert new == len(flat)
        assert await _rows(database) == expected


async def test_a_redelivered_batch_changes_nothing(database: Database, story: MakeStory) -> None:
    recorder = Recorder(database)
    events = _mixed(story)
    await recorder.record_batch(events)
    before = await _rows(database, recorded_at=True)
    assert await recorder.record_batch(events) == 0
    assert await recorder.record_batch([(event, seq + 1000) for event, seq in reversed(events)]) == 0
    assert await _rows(database, recorded_at=True) == before


async def _refuse_type(database: Database, event_type: str) -> None:
    async with database.engine.begin() as conn:
        if database.dialect == "postgresql":
            statement = f"ALTER TABLE events ADD CONSTRAINT refuse_test CHECK (type <> '{event_type}')"
        else:
            statement = (
                "CREATE TRIGGER refuse_test BEFORE INSERT ON events "
                f"WHEN NEW.type = '{event_type}' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            )
        await conn.execute(text(statement))


async def test_a_batch_with_an_unstorable_event_writes_nothing_and_raises(database: Database, story: MakeStory) -> None:
    await _refuse_type(database, "test.refused")
    s = story()
    refused = _event("evt-refused", type="test.refused", runid=s.run_id, data={})
    recorder = Recorder(database)
    try:
        await recorder.record_batch([(s.requested(), 1), (refused, 2), (s.started(), 3)])
    except PermanentError:
        raise AssertionError("the batch raises the database error; the runner's fallback decides") from None
    except Exception:
        pass
    else:
        raise AssertionError("the batch was recorded despite the refused event")
    assert await _rows(database) == ([], [])  # rolled back as a whole


async def test_a_refused_batch_is_rolled_back_on_its_connection_and_the_next_batch_records_alone(
    database: Database, story: MakeStory
) -> None:
    """The batch runs on the pooled connection's driver connection, outside SQLAlchemy: when the database
    refuses an event after others were inserted, the transaction is rolled back there before the connection
    goes back to the pool -- the next batch, on the same connection, must not commit the refused batch's rows
    nor find its lock still held (SQLite: the write lock; another connection writes at once too)."""
    await _refuse_type(database, "test.refused")
    a, b = story(), story()
    refused = _event("evt-refused-mid", type="test.refused", runid=a.run_id, data={})
    recorder = Recorder(database)
    for _ in range(3):  # the pool hands the same connection back each time
        try:
            await recorder.record_batch([(a.requested(), 1), (a.started(), 2), (refused, 3), (a.human_requested(), 4)])
        except PermanentError:
            raise AssertionError("the batch raises the database error; the runner's fallback decides") from None
        except Exception:
            pass
        else:
            raise AssertionError("the batch was recorded despite the refused event")
    assert await recorder.record_batch([(b.requested(), 5), (b.started(), 6), (b.requested(), 7)]) == 2
    events, runs = await _rows(database)
    assert sorted(e["id"] for e in events) == sorted([b.requested().id, b.started().id])
    assert [(r["run_id"], r["state"]) for r in runs] == [(b.run_id, "running")]
    async with database.engine.connect() as conn:
        assert (await conn.execute(text("SELECT last_seq FROM commit_counter"))).scalar_one() == 2
    async with Database.open(database.engine.url.render_as_string(False)) as other, other.engine.begin() as conn:
        await conn.execute(text("UPDATE commit_counter SET last_seq = last_seq"))  # nobody holds the lock


async def test_a_batch_runs_outside_sqlalchemy_unless_it_holds_an_ask(database: Database, story: MakeStory) -> None:
    """A batch of run events is written on the driver's own connection: no statement of it goes through
    SQLAlchemy's execution (its listeners see none); a batch holding an ``agent.*`` event takes SQLAlchemy's
    path, which they see."""
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    s = story()
    recorder = Recorder(database)
    sa_event.listen(database.engine.sync_engine, "before_cursor_execute", seen)
    try:
        assert await recorder.record_batch([(s.requested(), 1), (s.started(), 2), (s.requested(), 3)]) == 2
        assert statements == []
        ask = AgentAsked(
            request_id="areq-outside",
            asker_run_id=s.run_id,
            asker_agent="reviewer",
            to="agent:triager",
            message="which label?",
        )
        asked = make_event(ask, source="/temporality/agent-collab", id="evt-asked-outside", run_id=s.run_id)
        assert await recorder.record_batch([(asked, 4), (s.human_requested(), 5)]) == 2
        assert any("commit_counter" in statement for statement in statements)
    finally:
        sa_event.remove(database.engine.sync_engine, "before_cursor_execute", seen)
    _, runs = await _rows(database)
    assert [r["state"] for r in runs] == ["waiting_for_human"]


async def test_a_poison_event_in_a_batch_is_dead_lettered_alone(idle_journal: Journal, story: MakeStory) -> None:
    journal = idle_journal
    await _refuse_type(journal.database, "test.refused")
    s = story()
    refused = _event(f"evt-refused-{s.run_id}", type="test.refused", runid=s.run_id, data={"run_id": s.run_id})
    before, after = [s.requested(), s.started()], [s.human_requested(), s.notified("web")]
    for event in (*before, refused, *after):
        await journal.bus.publish(event)
    await journal.start()

    dead_id = await journal.wait_type("bus.dead_lettered")
    for event in (*before, *after):
        await journal.wait_handled(event.id)
    assert any(refused.id in batch and len(batch) > 1 for batch in journal.batches)  # batched with others
    # Terminated at its first handling: never retried after. (Under load the batch's settlement can come after
    # the 2 s ack wait, and the server hands the message out once more before it hears of it; that copy is
    # found poison again and dead-lettered under the same id. What must not happen is redelivery after that.)
    handled = journal.handled[refused.id]
    assert handled <= 2, f"{refused.id} handled {handled} times: retried, not terminated"
    await stays(lambda: journal.handled[refused.id] == handled, settle_s=1.5, what=f"no redelivery of {refused.id}")
    dead = (await journal.client.get("/events", params={"type": "bus.dead_lettered"}, headers=OPERATOR)).json()[
        "events"
    ]
    assert [e["id"] for e in dead] == [dead_id]
    assert dead[0]["data"]["original_id"] == refused.id
    assert dead[0]["data"]["deliveries"] == 1

    run = await journal.run(s.run_id)
    assert run["state"] == "waiting_for_human"
    assert run["waiting"]["channel"] == "web"
    stored = (await journal.client.get("/events", params={"run_id": s.run_id})).json()["events"]
    assert refused.id not in {e["id"] for e in stored}


async def test_an_outage_of_the_database_is_retried_and_nothing_dead_lettered(
    idle_journal: Journal, story: MakeStory
) -> None:
    journal = idle_journal
    async with journal.database.engine.begin() as conn:  # the table is gone: every statement fails
        await conn.execute(text("ALTER TABLE events RENAME TO events_away"))
    s = story()
    events = [s.requested(), s.started(), s.human_requested()]
    for event in events:
        await journal.bus.publish(event)
    await journal.start()
    # each event fails in its batch and again one by one, is nak'ed and comes back: twice at least
    for event in events:
        await journal.wait_handled(event.id, times=2)
    async with journal.database.engine.begin() as conn:
        await conn.execute(text("ALTER TABLE events_away RENAME TO events"))

    await journal.wait_type("human.requested")
    assert (await journal.run(s.run_id))["state"] == "waiting_for_human"
    stored = (await journal.client.get("/events", params={"run_id": s.run_id})).json()["events"]
    assert sorted(e["id"] for e in stored) == sorted(e.id for e in events)
    assert (await journal.client.get("/events", params={"type": "bus.dead_lettered"}, headers=OPERATOR)).json()[
        "events"
    ] == []


async def test_run_texts_that_look_like_sql_quoting_are_stored_as_they_are(
    database: Database, story: MakeStory
) -> None:
    """PostgreSQL's batch writes its runs in a simple query, their JSON dollar-quoted (``$runs$…$runs$``): a title
    holding the tag, quotes or a statement is text, stored as one by one stores it."""
    titles = ["Fix $runs$ quoting $runs_$", "it's '); DROP TABLE runs; --", "$$ $1 $runs", "ends with $runs"]
    stories = [story(title=title) for title in titles]
    steps = [s.requested() for s in stories] + [s.started() for s in stories]
    events = [(event, seq) for seq, event in enumerate(steps, start=1)]
    recorder = Recorder(database)
    for event, seq in events:
        await recorder.record(event, seq)
    expected = await _rows(database)
    assert sorted(run["title"] for run in expected[1]) == sorted(titles)

    await _clear(database)
    assert await recorder.record_batch(events) == len(events)
    assert await _rows(database) == expected
    await _clear(database)  # the runs exist already: the upsert's update branch
    await recorder.record_batch(events[: len(stories)])
    assert await recorder.record_batch(events[len(stories) :]) == len(stories)
    assert await _rows(database) == expected


#: Texts and numbers a JSON text carries with escapes or at its limits (PostgreSQL's batch passes its rows as one).
_AWKWARD_TEXTS = [
    "quotes \" and ' and `",
    "back\\slash \\u0041 and \\n written out",
    "line\nbreak\ttab\r\u2028\u2029",
    "emoji \U0001f600 CJK \u6f22\u5b57 accents \u00e9\u00e8",
    "$[0] json_extract(value, '$[1]') ->> 2",
    "",
]
_AWKWARD_NUMBERS = [0, -1, 2**63 - 1, -(2**63), 0.1, -0.0, 1e300, 1.7976931348623157e308, 5e-324, 123456789.123456789]


async def test_texts_and_numbers_a_json_text_escapes_are_stored_as_one_by_one_stores_them(
    database: Database, story: MakeStory
) -> None:
    """A batch stores every text attribute and ``data`` -- quotes, backslashes, control characters, characters
    outside the BMP, numbers at the limits of a 64-bit integer or a double -- as one by one stores them, of the same
    SQL types on SQLite: PostgreSQL's batch passes its rows as one JSON text (unpacked by the server), SQLite's binds
    them (a variant passing them as one JSON text, unpacked by ``json_each``, was measured on 6 December and
    dropped; this test was written for it)."""
    s = story(title=_AWKWARD_TEXTS[0])
    steps = [s.requested(), s.started()]
    for i, awkward in enumerate(_AWKWARD_TEXTS):
        steps.append(
            _event(
                f"evt-awkward-{i}",
                runid=s.run_id,
                subject=awkward,
                tenant=awkward,
                actor=f"user:{awkward}",
                data={awkward: [awkward, {"nested": awkward}], "numbers": _AWKWARD_NUMBERS, "none": None},
            )
        )
    steps.append(s.completed())
    events = [(event, seq) for seq, event in enumerate(steps, start=1)]
    raw = [encode(event) for event, _ in events]
    recorder = Recorder(database)
    for event, seq in events:
        await recorder.record(event, seq)
    expected = await _rows(database)
    types = await _column_types(database)
    for batch_raw in (None, raw):
        await _clear(database)
        assert await recorder.record_batch(events, raw=batch_raw) == len(events)
        assert await _rows(database) == expected
        assert await _column_types(database) == types
    stored = {row["id"]: row for row in expected[0]}
    assert stored["evt-awkward-3"]["subject"] == _AWKWARD_TEXTS[3]
    if database.dialect == "sqlite":  # (PostgreSQL's jsonb keeps numbers as numeric: 1e300 an integer, -0.0 is 0)
        assert json.loads(stored["evt-awkward-1"]["data"])["numbers"] == _AWKWARD_NUMBERS


async def _column_types(database: Database) -> list[tuple[Any, ...]]:
    """Each stored event's SQL type per column (SQLite's ``typeof``; PostgreSQL's are the columns')."""
    if database.dialect != "sqlite":
        return []
    columns = ["id", "type", "source", "time", "run_id", "correlation_id", "causation_id", "actor", "tenant"]
    columns += ["subject", "traceparent", "tracestate", "stream_seq", "commit_seq", "data", "recorded_at"]
    query = f"SELECT {', '.join(f'typeof({c})' for c in columns)} FROM events ORDER BY id"
    async with database.engine.connect() as conn:
        return [tuple(row) for row in await conn.execute(text(query))]


async def test_a_sqlite_connection_in_autocommit_mode_writes_no_batch(database: Database, story: MakeStory) -> None:
    """A batch must be one transaction: on an SQLite connection made autocommit (each statement its own commit, so
    a failure mid-batch would leave half of it) the batch refuses before writing anything."""
    if database.dialect != "sqlite":
        pytest.skip("SQLite's driver-level autocommit only")
    s = story()
    recorder = Recorder(database)
    async with database.engine.connect() as conn:
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        driver.isolation_level = None  # the pool hands this connection to the batch below
    try:
        with pytest.raises(RuntimeError, match="autocommit"):
            await recorder.record_batch([(s.requested(), 1), (s.started(), 2)])
        assert await _rows(database) == ([], [])
    finally:
        await database.engine.dispose()


async def test_a_sqlite_batch_is_three_calls_into_the_driver_thread_with_the_rows_of_one_by_one(
    database: Database, story: MakeStory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite a batch hands its statements to aiosqlite's thread in three calls (the lock with the ids' lookup;
    the events' insert with the runs' read; the runs' upsert with the commit), not one per statement: with the
    installed aiosqlite that path is taken (one more call: the pool's rollback when the connection goes back). Through it, and through the
    per-statement path kept for an aiosqlite without that entry point, the rows of one by one."""
    if database.dialect != "sqlite":
        pytest.skip("SQLite's driver thread only")
    events = _mixed(story)
    recorder = Recorder(database)
    for event, seq in events:
        await recorder.record(event, seq)
    expected = await _rows(database)

    calls: list[str] = []
    real = aiosqlite.Connection._execute

    async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(getattr(fn, "__name__", repr(fn)))
        return await real(self, fn, *args, **kwargs)

    for per_statement in (False, True):
        await _clear(database)
        with monkeypatch.context() as patch:
            patch.setattr(aiosqlite.Connection, "_execute", counted)
            if per_statement:
                patch.setattr(recorder_module, "_runs_in_sqlite_thread", lambda _driver: False)
            calls.clear()
            assert await recorder.record_batch(events) == len(events) - 2
            made = len(calls)
        assert await _rows(database) == expected
        if per_statement:
            assert made >= 8, calls  # lock, ids, insert, counter, runs read, upsert, commit, the pool's rollback
        else:
            assert made == 4, calls

    await _clear(database)  # the three-call path also in several batches, later ones updating earlier ones' runs
    for start in range(0, len(events), 5):
        await recorder.record_batch(events[start : start + 5])
    assert await _rows(database) == expected


async def test_two_replicas_recording_batches_in_turn_give_the_rows_of_one_by_one(
    database: Database, story: MakeStory
) -> None:
    """Two recorders (two replicas) record the batches of interleaved runs in turn, so each batch finds runs the
    other one created or moved since its recorder's last batch. PostgreSQL projects a batch onto the runs as its
    recorder last committed them while the events' statement runs; the runs read under the lock must overrule
    that guess whenever they differ: the rows of one by one."""
    stories = [story() for _ in range(6)]
    steps: list[Callable[[Any], Envelope]] = [
        lambda s: s.requested(),
        lambda s: s.started(),
        lambda s: s.human_requested(),
        lambda s: s.notified("web"),
        lambda s: s.answered(),
        lambda s: s.resumed(),
        lambda s: s.completed(),
    ]
    flat = [step(s) for step in steps for s in stories]
    events = [(event, seq) for seq, event in enumerate(flat, start=1)]
    one_by_one = Recorder(database)
    for event, seq in events:
        await one_by_one.record(event, seq)
    expected = await _rows(database)
    assert {run["state"] for run in expected[1]} == {"completed"}

    await _clear(database)
    replicas = [Recorder(database), Recorder(database)]
    for turn, start in enumerate(range(0, len(events), 4)):
        await replicas[turn % 2].record_batch(events[start : start + 4])
    assert await _rows(database) == expected

    await _clear(database)  # one recorder, but runs moved meanwhile by one-by-one recording (its other path)
    recorder = Recorder(database)
    for turn, start in enumerate(range(0, len(events), 4)):
        batch = events[start : start + 4]
        if turn % 3 == 2:
            for event, seq in batch:
                await recorder.record(event, seq)
        else:
            await recorder.record_batch(batch)
    assert await _rows(database) == expected


async def test_a_projected_event_with_invalid_data_is_stored_and_its_skip_logged_once(
    database: Database, story: MakeStory
) -> None:
    """An event of a projected type whose data its model refuses is stored and projects nothing, logged once per
    recording -- also when the batch is projected twice (PostgreSQL: the guess made while the statement runs, then,
    one event of the batch being stored already, again from what the statement found)."""
    s = story()

    def invalid(event_id: str) -> Envelope:
        return _event(event_id, type="run.started", runid=s.run_id, data={"run_id": s.run_id})

    recorder = Recorder(database)
    await recorder.record_batch([(s.requested(), 1)])
    requested_again = (s.requested(), 1)  # stored already: the batch's projection is made from the rows read
    for event_id, batch in (
        ("evt-invalid-1", [(invalid("evt-invalid-1"), 2)]),
        ("evt-invalid-2", [requested_again, (s.started(), 3), (invalid("evt-invalid-2"), 4)]),
    ):
        with structlog.testing.capture_logs() as logs:
            await recorder.record_batch(batch)
        skipped = [entry for entry in logs if entry["event"] == "run.projection_skipped"]
        assert [entry["ce_id"] for entry in skipped] == [event_id]
    events, runs = await _rows(database)
    assert {"evt-invalid-1", "evt-invalid-2"} <= {event["id"] for event in events}
    assert [run["state"] for run in runs] == ["running"]


def test_a_batch_projection_leaves_the_runs_it_starts_from_as_they_were(story: MakeStory) -> None:
    """The batch's projection copies a run once and changes that copy in place for the run's later events: the runs
    it starts from (as read, or as a guess remembered them) stay as they were, and the runs after it, its moves and
    finished runs are those of :func:`project` one event at a time."""
    events: list[tuple[Envelope, int]] = []
    for event, seq in _mixed(story):  # the first of each id, as the batch keeps it
        if all(event.id != e.id for e, _ in events):
            events.append((event, seq))
    first, rest = events[:9], events[9:]

    def fold(runs: dict[str, RunSnapshot], batch: list[tuple[Envelope, int]]) -> tuple[int, list[str]]:
        moved, finished = 0, []
        for event, seq in batch:
            run_id = run_id_of(event)
            after = project(runs.get(run_id), event, seq) if run_id is not None else None
            if after is None or run_id is None:
                continue
            if run_id not in runs or runs[run_id].state != after.state:
                moved += 1
                if after.state in RUN.terminal:
                    finished.append(run_id)
            runs[run_id] = after
        return moved, finished

    before: dict[str, RunSnapshot] = {}
    fold(before, first)
    kept = {run_id: run.model_dump() for run_id, run in before.items()}
    expected = dict(before)
    moved, finished = fold(expected, rest)

    result = recorder_module._project(recorder_module._projected(rest), before)
    assert {run_id: run.model_dump() for run_id, run in before.items()} == kept
    assert {run_id: run.model_dump() for run_id, run in result.runs.items()} == {
        run_id: run.model_dump() for run_id, run in expected.items()
    }
    assert result.moved == moved
    assert len(result.finished) == len(finished) > 0
    assert {run.run_id for run in result.writes()} == {
        run_id for run_id, run in expected.items() if run_id not in before or run != before[run_id]
    }


def test_after_a_wrong_guess_the_next_batches_are_not_guessed_for_a_while(story: MakeStory) -> None:
    """PostgreSQL's guessed projection backs off after a wrong guess (1, 2, 4 … batches, up to 64): runs older than
    what the recorder remembers, or a second replica, would otherwise cost every batch its projection twice."""
    guesses = _Guesses()
    s = story()
    rows = [_Row(s.requested(), 1, None, True)]
    run_ids = [s.run_id]

    def guessed_in(batches: int) -> int:
        return sum(guesses.guess(rows, run_ids) is not None for _ in range(batches))

    assert guesses.guess(rows, []) is None  # no run: nothing to guess
    assert guessed_in(3) == 3
    for skipped in (1, 2, 4, 8):
        guesses.judged(False)
        assert guessed_in(skipped) == 0
        assert guessed_in(1) == 1
    for _ in range(10):
        guesses.judged(False)
    assert guessed_in(64) == 0
    assert guessed_in(1) == 1
    guesses.judged(True)
    assert guessed_in(3) == 3


@contextmanager
def _debug_logs() -> Iterator[list[dict[str, Any]]]:
    """The log entries written meanwhile, debug ones included."""
    wrapper_class = structlog.get_config()["wrapper_class"]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with structlog.testing.capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(wrapper_class=wrapper_class)


async def test_a_batch_logs_the_moves_of_the_projection_it_writes_once(database: Database, story: MakeStory) -> None:
    """Each state move is logged (at debug) once, for the projection written -- not also for a guess made while
    the statement ran (PostgreSQL) and then refused: a redelivered event in the batch, or a run another replica
    moved since (here: it finished it, so a late ``run.started`` moves nothing)."""
    s, t = story(), story()
    recorder = Recorder(database)
    await recorder.record_batch([(s.requested(), 1)])
    with _debug_logs() as logs:
        await recorder.record_batch([(s.requested(), 1), (s.started(), 2)])  # one event stored already
    moves = [(entry["run_id"], entry["state"]) for entry in logs if entry["event"] == "run.moved"]
    assert moves == [(s.run_id, "running")]

    replicas = [Recorder(database), Recorder(database)]
    await replicas[0].record_batch([(t.requested(), 3)])
    await replicas[1].record_batch([(t.started(), 4), (t.completed(), 5)])
    with _debug_logs() as logs:
        await replicas[0].record_batch([(t.started("started-late"), 6)])  # guessed: requested, read: completed
    assert [entry for entry in logs if entry["event"] == "run.moved"] == []
    assert {run["run_id"]: run["state"] for run in (await _rows(database))[1]} == {
        s.run_id: "running",
        t.run_id: "completed",
    }


async def test_a_guess_that_fails_is_logged_at_debug_and_the_batch_projected_from_the_runs_read(
    database: Database, story: MakeStory
) -> None:
    """An unexpected error in PostgreSQL's guessed projection does not fail the batch, and is no error of its own
    (the projection from the runs read follows, and raises it if it is the code's): one debug line, no traceback."""
    if database.dialect != "postgresql":
        pytest.skip("only PostgreSQL's batch guesses")
    s = story()
    recorder = Recorder(database)
    await recorder.record_batch([(s.requested(), 1)])
    recorder._guesses.runs[s.run_id] = RunSnapshot.model_construct(run_id=s.run_id)  # no state: no projection
    with _debug_logs() as logs:
        await recorder.record_batch([(s.started(), 2)])
    failed = [entry for entry in logs if entry["event"] == "batch.projection_guess_failed"]
    assert len(failed) == 1
    assert failed[0]["log_level"] == "debug"
    assert "exc_info" not in failed[0]
    assert [run["state"] for run in (await _rows(database))[1]] == ["running"]


def _run(run_id: str, state: RunState, **texts: str) -> RunSnapshot:
    at = datetime(2026, 12, 6, tzinfo=UTC)
    return RunSnapshot(run_id=run_id, state=state, created_at=at, updated_at=at, **texts)


def test_the_guess_remembers_no_finished_run_and_a_bounded_amount_of_text() -> None:
    """A run in a final state is not remembered (it rarely gets another event; its guess falls back), nor a run of
    very long texts, and the runs remembered hold at most :data:`_Guesses.MAX_CHARS` characters of text, the most
    recent kept."""
    guesses = _Guesses()
    finished = {
        f"run-{state.value}": _run(f"run-{state.value}", state, result="r" * 16_384, error="e" * 100_000)
        for state in (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED)
    }
    running = _run("run-running", RunState.RUNNING)
    guesses.remember(sorted([*finished, "run-running", "run-absent"]), {**finished, "run-running": running})
    assert guesses.runs == {"run-absent": None, "run-running": running}

    question = "q" * 4096
    waiting = {
        f"run-{i:04}": _run(f"run-{i:04}", RunState.WAITING_FOR_HUMAN, waiting_question=question) for i in range(4096)
    }
    for run_id, run in waiting.items():
        guesses.remember([run_id], {run_id: run})
    texts = sum(
        len(v) for run in guesses.runs.values() if run is not None for v in run.__dict__.values() if type(v) is str
    )
    assert texts <= _Guesses.MAX_CHARS
    assert guesses.runs["run-4095"] is waiting["run-4095"]
    assert "run-0000" not in guesses.runs

    huge = _run("run-huge", RunState.RUNNING, title="t" * (_Guesses.MAX_RUN_CHARS + 1))
    guesses.remember(["run-4095", "run-huge"], {"run-4095": waiting["run-4095"], "run-huge": huge})
    assert "run-huge" not in guesses.runs  # not remembered, and no reason to forget the others
    assert guesses.runs["run-4094"] is waiting["run-4094"]


def _other(value: Any) -> Any:
    """A value of ``value``'s type that differs from it."""
    if isinstance(value, RunState):
        return RunState.RUNNING if value is not RunState.RUNNING else RunState.COMPLETED
    if isinstance(value, datetime):
        return value + timedelta(microseconds=1)
    if isinstance(value, int):
        return value + 1
    assert isinstance(value, str)
    return value + "x"


@pytest.mark.parametrize("field", list(RunSnapshot.model_fields))
def test_a_guess_is_refused_when_a_run_read_differs_in_one_field(field: str) -> None:
    """PostgreSQL's guess is used only when every run read is exactly as guessed: one field differing (any field of
    the run) refuses it."""
    at = datetime(2026, 12, 6, 8, tzinfo=UTC)
    guessed = RunSnapshot(
        run_id="run-1",
        state=RunState.WAITING_FOR_HUMAN,
        agent="reviewer",
        title="Review",
        trigger_id="trg-1",
        launch_kind="webhook",
        rerun_of="run-0",
        rerun_requested_by="oncall",
        created_at=at,
        updated_at=at + timedelta(seconds=3),
        started_at=at + timedelta(seconds=1),
        finished_at=at + timedelta(seconds=4),
        result="merged",
        error="none",
        usage_turns=3,
        usage_tool_calls=2,
        usage_prompt_tokens=420,
        usage_completion_tokens=55,
        usage_total_tokens=475,
        usage_samplings=1,
        waiting_request_id="req-1",
        waiting_recipient="alice",
        waiting_channel="web",
        waiting_since=at + timedelta(seconds=2),
        waiting_question="Merge?",
        last_event_seq=7,
    )
    assert all(value is not None for value in guessed.__dict__.values())  # every field set, so each can differ
    read = guessed.model_copy(update={field: _other(getattr(guessed, field))})
    assert _as_guessed({"run-1": guessed.model_copy()}, {"run-1": guessed})
    assert not _as_guessed({"run-1": read}, {"run-1": guessed})
