"""Text the databases cannot hold is made storable; what they refuse for good is dead-lettered, not retried forever.

Every test runs on SQLite and on PostgreSQL (the ``database`` fixture's parametrization).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any

import pytest
import structlog
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from temporality_bus import PermanentError
from temporality_journal import Database, EventRecord, Recorder, RunRecord
from temporality_journal.recorder import unfixable
from temporality_protocol import Envelope, RunState
from temporality_testing.waiting import stays

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal

FFFD = "\ufffd"


def _event(event_id: str, *, data: dict[str, Any], **attributes: Any) -> Envelope:
    return Envelope(
        id=event_id,
        source="/temporality/test",
        type=attributes.pop("type", "scm.pull_request.updated"),
        time=datetime.now(UTC),
        data=data,
        **attributes,
    )


async def _stored(database: Database, event_id: str) -> EventRecord | None:
    async with database.sessions() as session:
        return await session.get(EventRecord, event_id)


def _sanitized_logs(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == "event.sanitized"]


# --------------------------------------------------------------------------- NUL and unpaired surrogates
async def test_nul_in_data_and_attributes_is_replaced_and_the_event_journaled(
    journal: Journal, story: MakeStory
) -> None:
    s = story(title="Fix \x00 in the parser")  # a PR title with a NUL: data and the projected runs.title
    odd = _event(
        f"evt-nul-{s.run_id}",
        runid=s.run_id,
        subject="pr/42\x00",
        actor="user:\x00mallory",
        correlationid="corr-\x00",
        data={
            "title": "a\x00b",
            "nested": {"key\x00": ["x\x00", {"deep\x00": "\x00\x00"}, 7, None, True, 1.5]},
            "clean": "untouched",
        },
    )
    with structlog.testing.capture_logs() as logs:
        await journal.send(s.requested(), odd)

    run = await journal.run(s.run_id)
    assert run["state"] == "pending"
    assert run["title"] == f"Fix {FFFD} in the parser"

    found = (await journal.client.get("/events", params={"run_id": s.run_id})).json()["events"]
    assert [e["type"] for e in found] == ["scm.pull_request.updated", "run.requested"]
    stored = found[0]
    assert stored["id"] == odd.id
    assert stored["subject"] == f"pr/42{FFFD}"
    assert stored["actor"] == f"user:{FFFD}mallory"
    assert stored["correlation_id"] == f"corr-{FFFD}"
    assert stored["data"] == {
        "title": f"a{FFFD}b",
        "nested": {f"key{FFFD}": [f"x{FFFD}", {f"deep{FFFD}": FFFD * 2}, 7, None, True, 1.5]},
        "clean": "untouched",
    }
    assert found[1]["data"]["title"] == f"Fix {FFFD} in the parser"

    warnings = _sanitized_logs(logs)
    assert [(w["ce_id"], w["log_level"]) for w in warnings] == [
        (s.requested().id, "warning"),  # one warning per event, however many strings changed
        (odd.id, "warning"),
    ]
    assert warnings[1]["fields"] == ["actor", "correlationid", "data", "subject"]


async def test_recording_a_sanitized_event_is_idempotent_and_warns_once_per_recording(database: Database) -> None:
    recorder = Recorder(database)
    event = _event("evt-nul-\x00-id", data={"k\x00": "v\x00"}, tenant="t\x00")
    with structlog.testing.capture_logs() as logs:
        assert await recorder.record(event, 1) is True
        assert await recorder.record(event, 2) is False  # the same (replaced) id: a duplicate
        assert await recorder.record(_event("evt-clean", data={"k": "v"}), 3) is True

    row = await _stored(database, f"evt-nul-{FFFD}-id")
    assert row is not None
    assert (row.data, row.tenant, row.stream_seq) == ({f"k{FFFD}": f"v{FFFD}"}, f"t{FFFD}", 1)
    assert [w["ce_id"] for w in _sanitized_logs(logs)] == [f"evt-nul-{FFFD}-id"] * 2
    assert _sanitized_logs(logs)[0]["fields"] == ["data", "id", "tenant"]


async def test_unpaired_surrogates_are_replaced_and_pairs_kept(database: Database) -> None:
    # json.loads turns "\ud800" escapes into lone surrogates; neither database can encode them.
    event = _event("evt-surrogates", data={"t": "a\ud800b", "ok": "\U0001f600"}, subject="pr/\udfff")
    assert await Recorder(database).record(event, 1) is True
    row = await _stored(database, event.id)
    assert row is not None
    assert (row.data, row.subject) == ({"t": f"a{FFFD}b", "ok": "\U0001f600"}, f"pr/{FFFD}")


# --------------------------------------------------------------------------- errors retrying cannot fix
async def _refuse_type(database: Database, event_type: str) -> None:
    """Make the database refuse events of ``event_type`` the way it refuses bad data: a constraint."""
    async with database.engine.begin() as conn:
        if database.dialect == "postgresql":
            statement = f"ALTER TABLE events ADD CONSTRAINT refuse_test CHECK (type <> '{event_type}')"
        else:
            statement = (
                "CREATE TRIGGER refuse_test BEFORE INSERT ON events "
                f"WHEN NEW.type = '{event_type}' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            )
        await conn.execute(text(statement))


async def test_an_event_the_database_refuses_is_dead_lettered_and_journaled(journal: Journal, story: MakeStory) -> None:
    await _refuse_type(journal.database, "test.refused")
    s = story()
    refused = _event(f"evt-refused-{s.run_id}", type="test.refused", runid=s.run_id, data={"run_id": s.run_id})
    await journal.bus.publish(refused)

    dead_id = await journal.wait_type("bus.dead_lettered")
    dead = (await journal.client.get("/events", params={"type": "bus.dead_lettered"})).json()["events"]
    assert [e["id"] for e in dead] == [dead_id]
    assert dead[0]["run_id"] == s.run_id  # visible in the run's trajectory
    assert dead[0]["data"]["consumer"] == "journal"
    assert dead[0]["data"]["original_id"] == refused.id
    assert dead[0]["data"]["original_type"] == "test.refused"
    assert dead[0]["data"]["deliveries"] == 1
    assert f"PermanentError: the journal cannot store event {refused.id}: " in dead[0]["data"]["error"]
    # given up at once, not redelivered: still one delivery after a settle window past the retry backoff
    await stays(lambda: journal.handled[refused.id] == 1, settle_s=1.5, what=f"one delivery of {refused.id}")
    assert await _stored(journal.database, refused.id) is None

    await journal.send(s.requested())  # the journal goes on
    assert (await journal.run(s.run_id))["state"] == "pending"


async def test_recorder_raises_permanent_error_with_the_database_error_as_cause(database: Database) -> None:
    await _refuse_type(database, "test.refused")
    with pytest.raises(PermanentError, match="cannot store event evt-refused") as info:
        await Recorder(database).record(_event("evt-refused", type="test.refused", data={}), 1)
    assert isinstance(info.value.__cause__, DBAPIError)
    assert "INSERT" not in str(info.value)  # the driver's message, not the statement and its parameters


async def test_a_refused_dead_letter_of_the_journal_is_retried_not_dead_lettered_again(database: Database) -> None:
    await _refuse_type(database, "bus.dead_lettered")
    recorder = Recorder(database)
    ours = _event("evt-dlq-journal", type="bus.dead_lettered", data={"consumer": "journal", "error": "x"})
    with pytest.raises(DBAPIError):  # not PermanentError: the consumer naks and retries it
        await recorder.record(ours, 1)
    theirs = _event("evt-dlq-other", type="bus.dead_lettered", data={"consumer": "notifier", "error": "x"})
    with pytest.raises(PermanentError):
        await recorder.record(theirs, 2)


async def _error_of(database: Database, statement: str, **params: Any) -> DBAPIError:
    with pytest.raises(DBAPIError) as info:
        async with database.engine.begin() as conn:
            await conn.execute(text(statement), params)
    return info.value


async def test_unfixable_tells_bad_data_and_constraints_from_races_and_outages(database: Database) -> None:
    now = datetime.now(UTC)
    async with database.sessions() as session, session.begin():
        session.add(RunRecord(run_id="run-1", state=RunState.PENDING, created_at=now, updated_at=now))

    # Two writers creating the same run at once: the loser's retry finds the row.
    with pytest.raises(DBAPIError) as info:
        async with database.sessions() as session, session.begin():
            session.add(RunRecord(run_id="run-1", state=RunState.PENDING, created_at=now, updated_at=now))
    assert not unfixable(info.value)

    assert unfixable(await _error_of(database, "INSERT INTO runs (run_id, state) VALUES ('run-2', NULL)"))
    assert not unfixable(await _error_of(database, "SELECT * FROM no_such_table"))
    if database.dialect == "postgresql":  # asyncpg reports these as untyped DBAPIErrors with a SQLSTATE
        assert unfixable(await _error_of(database, "SELECT CAST(:v AS text)", v="a\x00"))  # 22021
        assert unfixable(await _error_of(database, "SELECT CAST(:v AS jsonb)", v='"\\u0000"'))  # 22P05
        assert unfixable(await _error_of(database, "SELECT CAST(:v AS jsonb)", v='"\\ud800"'))  # 22P02
        # 54000: an index row over PostgreSQL's limit (a huge event type) will never fit
        huge = secrets.token_urlsafe(8_000)  # incompressible: past the ~2.7 kB btree row limit
        assert unfixable(
            await _error_of(
                database,
                "INSERT INTO events (id, type, source, time, stream_seq, commit_seq, recorded_at, data) "
                "VALUES ('big', :t, 's', now(), 1, 1, now(), '{}')",
                t=huge,
            )
        )
