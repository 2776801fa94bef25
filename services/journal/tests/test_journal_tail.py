"""The live tail over Server-Sent Events, against the journal service on a real port and a real bus.

The commit-order tests write through more than one :class:`Recorder` on one database: the served
journal's own (fed by the bus) and "replicas" opened beside it, which is what a second journal replica
is, and what a JetStream redelivery looks like to the database (an event committed after events with
higher stream sequences).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import structlog
from journal_support import VIEWER, serve_journal, served_settings
from sqlalchemy import text

from temporality_bus import Bus, NatsSettings
from temporality_journal import Database, Recorder
from temporality_journal.tail import Tail
from temporality_protocol import Envelope
from temporality_testing.postgres import fresh_postgres_database

MakeStory = Callable[..., Any]  # journal_support.RunStory
Served = Any  # conftest.ServedJournal


@dataclass
class Sse:
    id: str | None
    event: str | None
    data: Any
    comment: str | None


class SseReader:
    """Reads an open ``text/event-stream`` response one event (or comment block) at a time, bounded."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.lines = response.aiter_lines()

    async def next(self, within_s: float = 20.0) -> Sse:
        fields: dict[str, list[str]] = {}
        async with asyncio.timeout(within_s):
            async for line in self.lines:
                if line == "":
                    if fields:
                        data = "\n".join(fields["data"]) if "data" in fields else None
                        return Sse(
                            id=fields.get("id", [None])[-1],
                            event=fields.get("event", [None])[-1],
                            data=json.loads(data) if data is not None else None,
                            comment="\n".join(fields[""]) if "" in fields else None,
                        )
                    continue
                name, _, value = line.partition(":")
                fields.setdefault(name, []).append(value.removeprefix(" "))
        raise AssertionError("the stream ended")

    async def next_event(self, within_s: float = 20.0) -> Sse:
        """The next event with data (skipping keep-alive comments)."""
        async with asyncio.timeout(within_s):
            while True:
                item = await self.next(within_s)
                if item.data is not None:
                    return item


@asynccontextmanager
async def tail(served: Served, headers: dict[str, str] | None = None, **params: Any) -> AsyncIterator[SseReader]:
    """An open tail whose start position is fixed (its first comment was read)."""
    async with (
        httpx.AsyncClient(base_url=served.url, headers=VIEWER, timeout=30) as client,
        client.stream("GET", "/events/stream", params=params, headers=headers or {}) as response,
    ):
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        reader = SseReader(response)
        first = await reader.next()
        assert first.comment is not None
        assert first.comment.startswith("tail after ")
        yield reader


async def test_live_events_arrive_in_stream_order_with_their_sequence(served_journal: Served, story: MakeStory) -> None:
    a, b = story(), story()
    async with tail(served_journal) as everything, tail(served_journal, run_id=a.run_id) as only_a:
        sent = [a.requested(), b.requested(), a.started(), a.human_requested()]
        for event in sent:
            await served_journal.bus.publish(event)

        got = [await everything.next_event() for _ in sent]
        assert [(g.event, g.data["id"]) for g in got] == [(e.type, e.id) for e in sent]
        seqs = [int(g.id or "") for g in got]
        assert seqs == sorted(seqs)
        assert [g.data["stream_seq"] for g in got] == seqs
        assert got[3].data["data"]["question"] == "Merge it?"
        assert got[3].data["run_id"] == a.run_id

        mine = [await only_a.next_event() for _ in range(3)]
        assert [m.data["id"] for m in mine] == [sent[0].id, sent[2].id, sent[3].id]


async def test_resume_after_last_event_id_and_replay_from_the_start(served_journal: Served, story: MakeStory) -> None:
    s = story()
    sent = [s.requested(), s.started(), s.human_requested(), s.answered()]
    for event in sent:
        await served_journal.bus.publish(event)
    await served_journal.wait_recorded(sent[-1].id)
    await served_journal.wait_recorded(sent[0].id)

    async with tail(served_journal, after=0) as replay:
        got = [await replay.next_event() for _ in sent]
    assert [g.data["id"] for g in got] == [e.id for e in sent]

    # a reconnect: Last-Event-ID wins over the URL's ``after``
    async with tail(served_journal, headers={"Last-Event-ID": got[1].id or ""}, after=0) as resumed:
        rest = [await resumed.next_event() for _ in sent[2:]]
        assert [r.data["id"] for r in rest] == [e.id for e in sent[2:]]
        later = s.resumed()
        await served_journal.bus.publish(later)
        assert (await resumed.next_event()).data["id"] == later.id

    async with tail(served_journal, after=0, type="human.answered") as answers:
        assert (await answers.next_event()).data["id"] == sent[3].id


async def test_a_cursor_past_the_newest_event_resumes_from_the_newest_and_says_so(
    served_journal: Served, story: MakeStory
) -> None:
    """A cursor saved from another journal (started afresh, restored from an older backup) is past this one's newest
    event: the stream goes on from its newest event, with a comment saying so, instead of waiting silently until
    the count passes the cursor (a subscriber review saw nothing for as long as it watched)."""
    s = story()
    first = s.requested()
    await served_journal.bus.publish(first)
    await served_journal.wait_recorded(first.id)
    async with tail(served_journal, headers={"Last-Event-ID": "999999"}) as ahead:
        note = await ahead.next()
        assert note.comment is not None
        assert note.comment.startswith("cursor 999999 is past this journal's newest event")
        later = s.started()
        await served_journal.bus.publish(later)
        assert (await ahead.next_event()).data["id"] == later.id  # not the event before, nor nothing


async def test_tail_refuses_bad_input_and_anonymous_callers(served_journal: Served) -> None:
    async with httpx.AsyncClient(base_url=served_journal.url, headers=VIEWER, timeout=10) as client:
        for value in ("abc", "-1", "1.5", "99999999999999999999", "0x10", "1 2"):
            response = await client.get("/events/stream", headers={"Last-Event-ID": value})
            assert response.status_code == 422, (value, response.text)
            assert response.json()["error"] == "invalid_last_event_id"
        bad_after = await client.get("/events/stream", params={"after": "-3"})
        assert bad_after.status_code == 422
        assert bad_after.json()["error"] == "invalid_request"
        anonymous = await client.get("/events/stream", headers={"Authorization": ""})
        assert anonymous.status_code == 401
        assert anonymous.json()["error"] == "unauthorized"


async def test_stopping_the_service_ends_open_streams(served_journal: Served) -> None:
    async with tail(served_journal) as open_stream:
        served_journal.stop.set()
        async with asyncio.timeout(20):
            async for _ in open_stream.lines:
                pass  # keep-alives until the stream ends
        await asyncio.wait_for(served_journal.task, 20)


# --------------------------------------------------------------------------- commit order, not stream order
async def _eventually(check: Callable[[], Awaitable[bool]], what: str, within_s: float = 20.0) -> None:
    """Poll ``check`` until it holds, bounded."""
    try:
        async with asyncio.timeout(within_s):  # another process's state: polled
            for _ in itertools.count():
                if await check():
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {within_s}s: {what}") from None


def _ids(items: list[Sse]) -> list[str]:
    return [item.data["id"] for item in items]


def _increasing(items: list[Sse]) -> bool:
    cursors = [int(item.id or "") for item in items]
    return cursors == sorted(set(cursors))


async def test_an_event_committed_late_with_a_lower_stream_seq_reaches_open_and_resumed_tails(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, database_url: str, story: MakeStory
) -> None:
    """The old gap: a tail positioned by stream sequence never sent an event committed after events with
    higher sequences (a JetStream redelivery keeps its sequence). Positioned by commit order, it does."""
    s = story()
    first = [s.requested(), s.started(), s.human_requested()]
    redelivered, after_it, from_the_bus = s.notified(), s.answered(), s.resumed()
    settings = served_settings(tmp_path, nats_settings, database_url)
    async with serve_journal(settings, bus) as served, Database.open(database_url) as database:
        replica = Recorder(database)  # a second journal replica on the same database
        async with tail(served) as live:
            for seq, event in enumerate(first, 101):
                assert await replica.record(event, seq)
            got = [await live.next_event() for _ in first]
            assert _ids(got) == [e.id for e in first]
            # the message of a failed batch, redelivered: recorded after 101..103 with its own, lower sequence
            assert await replica.record(redelivered, 100)
            got.append(await live.next_event())
            assert got[-1].data["id"] == redelivered.id
            assert got[-1].data["stream_seq"] == 100
            assert await replica.record_batch([(after_it, 104)]) == 1
            got.append(await live.next_event())
            await bus.publish(from_the_bus)  # the served journal's own recorder, the bus's own (low) sequence
            got.append(await live.next_event())
        order = [*first, redelivered, after_it, from_the_bus]
        assert _ids(got) == [e.id for e in order]  # commit order, each once
        assert _increasing(got)
        assert [g.data["commit_seq"] for g in got] == [int(g.id or "") for g in got]

        # a reconnect after the second event gets the rest in commit order, the late one included, once
        async with tail(served, headers={"Last-Event-ID": got[1].id or ""}) as resumed:
            rest = [await resumed.next_event() for _ in order[2:]]
            assert _ids(rest) == [e.id for e in order[2:]]
            sentinel = s.completed()
            await bus.publish(sentinel)
            assert (await resumed.next_event()).data["id"] == sentinel.id  # nothing sent twice before it
        async with tail(served, after=0) as replay:  # ``after`` takes the same cursor
            everything = [await replay.next_event() for _ in range(len(order) + 1)]
        assert _ids(everything) == [*(e.id for e in order), sentinel.id]
        assert [g.id for g in everything[: len(got)]] == [g.id for g in got]


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """A fresh PostgreSQL database (skipped when unreachable, failed under ``TEMPORALITY_REQUIRE_POSTGRES=1``)."""
    async with fresh_postgres_database("journal_tail") as url:
        yield url


async def _lock_waiters(database: Database) -> int:
    """How many sessions on this database wait for a lock (PostgreSQL's view of the other connections)."""
    async with database.engine.connect() as conn:
        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        return int((await conn.execute(text(query))).scalar_one())


async def _waiters_at_least(database: Database, count: int) -> bool:
    return await _lock_waiters(database) >= count


async def test_two_writers_on_postgres_cannot_make_the_tail_skip(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, postgres_url: str, story: MakeStory
) -> None:
    """Replica A has taken its positions and inserted its events but not committed (held up on a run's row
    lock); replica B, with higher stream sequences, must wait for A's commit instead of committing first
    and moving the tail past A's events (what a sequence assigned at insert, or the stream sequence, did)."""
    x, y = story(), story()
    settings = served_settings(tmp_path, nats_settings, postgres_url)
    async with (
        serve_journal(settings, bus) as served,
        Database.open(postgres_url) as db_a,
        Database.open(postgres_url) as db_b,
        Database.open(postgres_url) as db_lock,
    ):
        replica_a, replica_b = Recorder(db_a), Recorder(db_b)
        assert await replica_a.record(x.requested(), 1)  # the run row A's projection will wait on
        a_events, b_events = [x.started(), x.human_requested()], [y.requested(), y.started()]
        async with tail(served) as live, db_lock.engine.connect() as holder:
            await holder.begin()
            await holder.execute(text("SELECT run_id FROM runs WHERE run_id = :r FOR UPDATE"), {"r": x.run_id})
            writing_a = asyncio.create_task(replica_a.record_batch([(e, seq) for seq, e in enumerate(a_events, 10)]))
            await _eventually(lambda: _waiters_at_least(db_lock, 1), "A waits on the run's row")
            writing_b = asyncio.create_task(replica_b.record_batch([(e, seq) for seq, e in enumerate(b_events, 20)]))
            await _eventually(lambda: _waiters_at_least(db_lock, 2), "B waits for A's commit")
            assert not writing_b.done()
            await holder.commit()
            assert await asyncio.wait_for(writing_a, 20) == 2
            assert await asyncio.wait_for(writing_b, 20) == 2
            got = [await live.next_event() for _ in range(4)]
            assert _ids(got) == [e.id for e in [*a_events, *b_events]]
            assert _increasing(got)
            sentinel = y.completed()
            await bus.publish(sentinel)
            assert (await live.next_event()).data["id"] == sentinel.id  # nothing skipped, nothing twice
        async with tail(served, headers={"Last-Event-ID": got[0].id or ""}) as resumed:
            rest = [await resumed.next_event() for _ in range(4)]
        assert _ids(rest) == [*_ids(got[1:]), sentinel.id]


async def test_concurrent_writers_reach_the_tail_each_event_once_in_commit_order(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, database_url: str, story: MakeStory
) -> None:
    """Two replicas writing batches at once, stream sequences interleaved and out of order: an open tail
    and a replay from the start both get every event exactly once, in one increasing cursor order."""
    settings = served_settings(tmp_path, nats_settings, database_url)
    rng = random.Random(7)
    writers: list[list[list[tuple[Envelope, int]]]] = [[], []]
    seq = 0
    for _ in range(12):
        for batches in writers:
            s = story()
            batch = []
            for event in (s.requested(), s.started(), s.human_requested(), s.answered()):
                seq += 1
                batch.append((event, seq))
            batches.append(batch)
    for batches in writers:
        rng.shuffle(batches)  # each writer commits its batches out of stream order
    expected = {event.id for batches in writers for batch in batches for event, _ in batch}
    async with (
        serve_journal(settings, bus) as served,
        Database.open(database_url) as db_a,
        Database.open(database_url) as db_b,
    ):
        async with tail(served) as live:

            async def write(recorder: Recorder, batches: list[list[tuple[Envelope, int]]]) -> None:
                for batch in batches:
                    assert await recorder.record_batch(batch) == len(batch)

            await asyncio.gather(write(Recorder(db_a), writers[0]), write(Recorder(db_b), writers[1]))
            got = [await live.next_event() for _ in expected]
            sentinel = story().requested()
            await bus.publish(sentinel)
            assert (await live.next_event()).data["id"] == sentinel.id
        assert set(_ids(got)) == expected
        assert len(_ids(got)) == len(expected)
        assert _increasing(got)
        async with tail(served, after=0) as replay:
            again = [await replay.next_event() for _ in expected]
        assert [(g.id, g.data["id"]) for g in again] == [(g.id, g.data["id"]) for g in got]


# --------------------------------------------------------------------------- a client that goes away
def _server_errors(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        entry
        for entry in logs
        if entry.get("event") == "http.internal_error"
        or entry.get("log_level") in ("error", "critical")
        or "Exception in ASGI" in str(entry.get("event"))
    ]


async def test_a_client_that_disconnects_mid_stream_ends_its_stream_without_an_error(
    served_journal: Served, story: MakeStory
) -> None:
    """A tail whose client goes away (mid-stream, while events are flowing and while idle) ends quietly:
    no error logged, and the service goes on serving tails and requests."""
    s = story()
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            # mid-stream: events flowing when the client hangs up
            async with tail(served_journal, after=0) as reader:
                burst = [s.requested(), s.started(), s.human_requested()]
                for event in burst:
                    await served_journal.bus.publish(event)
                await reader.next_event()
            # idle: nothing to send when the client hangs up
            async with tail(served_journal) as reader:
                pass
            # at once: the client hangs up right after sending the request
            await _hang_up_after_request(served_journal.url)
        # the events published after the hang-ups still reach a new tail, and plain requests are served
        later = s.answered()
        async with tail(served_journal) as reader:
            await served_journal.bus.publish(later)
            assert (await reader.next_event()).data["id"] == later.id
        async with httpx.AsyncClient(base_url=served_journal.url, headers=VIEWER, timeout=10) as client:
            assert (await client.get("/events", params={"run_id": s.run_id})).status_code == 200
        # every abandoned stream has ended (its tail.closed is logged) before the logs are judged
        await _eventually(_closed_streams(logs, 9), "the nine abandoned streams ended", within_s=20)
    assert _server_errors(logs) == []


def _closed_streams(logs: list[dict[str, Any]], count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return sum(1 for entry in logs if entry.get("event") == "tail.closed") >= count

    return check


async def _hang_up_after_request(url: str) -> None:
    """A raw HTTP/1.1 client that sends a tail request and closes the connection without reading."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    _reader, writer = await asyncio.open_connection(host, port)
    token = VIEWER["Authorization"]
    writer.write(f"GET /events/stream?after=0 HTTP/1.1\r\nHost: {host}\r\nAuthorization: {token}\r\n\r\n".encode())
    await writer.drain()
    writer.close()
    await writer.wait_closed()


async def test_a_client_that_hangs_up_on_a_long_backlog_ends_its_stream_without_an_error(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, story: MakeStory
) -> None:
    """A replay from the start of a backlog far larger than the socket buffers, abandoned after one event:
    the server is blocked writing when the client goes; the stream ends, nothing is logged as an error."""
    settings = served_settings(tmp_path, nats_settings)
    async with serve_journal(settings, bus) as served, Database.open(settings.database_url) as database:
        replica = Recorder(database)
        batch = []
        for seq in range(1, 6001):
            s = story(title=f"run {seq} " + "x" * 180)
            batch.append((s.requested(), seq))
        assert await replica.record_batch(batch) == len(batch)
        with structlog.testing.capture_logs() as logs:
            for _ in range(3):
                async with tail(served, after=0) as reader:
                    await reader.next_event()
            await _eventually(_closed_streams(logs, 3), "the three abandoned replays ended", within_s=30)
            async with tail(served, after=len(batch) - 1) as reader:
                assert (await reader.next_event()).data["id"] == batch[-1][0].id
        assert _server_errors(logs) == []


async def test_an_idle_stream_sends_keep_alives_and_ends_when_its_client_is_gone(database: Database) -> None:
    """Between events an idle stream sends ``: ping`` comments; once ``gone`` is set it ends by itself
    (while waiting, not only after an event)."""
    gone = anyio.Event()
    stream = Tail(database, poll_s=0.05).stream(
        after=None, run_id=None, type_=None, render=lambda row: {}, gone=gone, keepalive_s=0.2
    )
    async with asyncio.timeout(10):
        assert await anext(stream) == b": tail after 0\nretry: 2000\n\n"
        assert await anext(stream) == b": ping\n\n"
        assert await anext(stream) == b": ping\n\n"
        gone.set()
        with pytest.raises(StopAsyncIteration):
            await anext(stream)


async def test_a_head_request_never_opens_a_stream(served_journal: Served) -> None:
    """HEAD is not routed (405, ``Allow: GET``): a stream opened for HEAD would never end for the client (the
    server waits for the last body part, which a tail only sends when it ends) -- sse-starlette had to special-case
    it (its issue 218); the journal's own response never sees one (docs/journal.md, the SSE choice)."""
    async with httpx.AsyncClient(base_url=served_journal.url, headers=VIEWER, timeout=10) as client:
        head = await client.head("/events/stream")
        assert head.status_code == 405, head.text
        assert head.headers["allow"] == "GET"
