"""A batch's commit positions: gapless over new events only, the counter at the last one, also when a batch
repeats events already stored (PostgreSQL finds them, numbers the rest and moves the counter in the insert's
own statement; SQLite in three). Every test runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import text

from temporality_journal import Database, Recorder
from temporality_protocol import Envelope

MakeStory = Callable[..., Any]  # journal_support.RunStory


async def _positions(database: Database) -> tuple[list[tuple[str, int, int]], int]:
    """``(id, stream_seq, commit_seq)`` of every event by position, and the counter's last position."""
    async with database.engine.connect() as conn:
        rows = await conn.execute(text("SELECT id, stream_seq, commit_seq FROM events ORDER BY commit_seq"))
        events = [(str(r[0]), int(r[1]), int(r[2])) for r in rows]
        last = (await conn.execute(text("SELECT last_seq FROM commit_counter WHERE id = 1"))).scalar_one()
    return events, int(last)


def _trajectory(story: MakeStory) -> list[Envelope]:
    s = story()
    return [s.requested(), s.created(), s.started(), s.human_requested(), s.notified("web"), s.answered()]


async def test_a_batch_partly_stored_numbers_only_its_new_events(database: Database, story: MakeStory) -> None:
    recorder = Recorder(database)
    first, second = _trajectory(story), _trajectory(story)
    batch1 = [(event, seq) for seq, event in enumerate(first, 1)]
    assert await recorder.record_batch(batch1) == len(first)
    events, last = await _positions(database)
    assert [e[2] for e in events] == list(range(1, len(first) + 1))
    assert last == len(first)

    # redelivered: half of the first batch again (later stream sequences), interleaved with new events
    again = [(event, 100 + i) for i, event in enumerate(first[3:])]
    new = [(event, 200 + i) for i, event in enumerate(second)]
    mixed = [again[0], new[0], again[1], new[1], new[2], again[2], *new[3:]]
    assert await recorder.record_batch(mixed) == len(second)

    events, last = await _positions(database)
    assert [e[2] for e in events] == list(range(1, len(first) + len(second) + 1))  # no gap, no repeat
    assert last == len(first) + len(second)
    assert [e[0] for e in events] == [e.id for e in first] + [e.id for e in second]  # new ones in stream order
    assert [e[1] for e in events[: len(first)]] == list(range(1, len(first) + 1))  # the stored rows kept as they were


async def test_a_batch_entirely_stored_moves_nothing(database: Database, story: MakeStory) -> None:
    recorder = Recorder(database)
    events = [(event, seq) for seq, event in enumerate(_trajectory(story), 1)]
    await recorder.record_batch(events)
    before = await _positions(database)
    assert await recorder.record_batch(events) == 0
    assert await recorder.record_batch([(event, seq + 50) for event, seq in events]) == 0
    assert await _positions(database) == before  # the counter too: no position handed out for nothing
