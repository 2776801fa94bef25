"""The live tail: the journal's events as Server-Sent Events (``GET /events/stream``), resumable.

Each SSE event is one journaled CloudEvent: ``id`` = its cursor, ``events.commit_seq`` (what
``Last-Event-ID`` and ``after`` resume from), ``event`` = its CloudEvent type, ``data`` = the same JSON
as an item of ``GET /events`` (which carries ``commit_seq`` too). The stream starts with a comment
``: tail after <cursor>`` (and ``retry``), sent once the start position is fixed: an event journaled
after that comment is in the stream.

The cursor is opaque to clients: an integer that increases along the stream, not always by one. It
is not the JetStream stream sequence, which is not the order events become visible in the journal: a
redelivery (a batch that failed and was recorded one by one, a message nak'ed and redelivered later)
keeps its original sequence and commits after events with higher ones, and two journal replicas on
one PostgreSQL commit concurrently. A tail positioned by stream sequence skipped such an event.

Guarantee: every journaled event exactly once, in commit order, while connected and across
reconnects (``Last-Event-ID``), with one replica or several, on SQLite and PostgreSQL. Why it holds:
the recorder hands out ``commit_seq`` from the one-row table ``commit_counter``, which it locks as the
first statement of each write transaction (:func:`temporality_journal.recorder.lock_positions`; once
per batch, the journal writes in batches): ``SELECT … FOR UPDATE`` on PostgreSQL, a no-op ``UPDATE``
(SQLite's write lock) on SQLite, held until the commit. Journal writers (every replica) therefore
serialise per batch: a transaction reads the counter only after every transaction that took positions
before it has committed (or rolled back, and with it its counter update). Every snapshot a reader
takes holds a prefix of the positions, and "the rows after my position" never passes an event that is
still to come. Only new events get a position (a redelivered duplicate gets none).

Why not a sequence: a PostgreSQL sequence (or ``IDENTITY``) alone would not do, its values are taken at
insert, not at commit, so concurrent transactions become visible out of order. Compared with a transaction-level advisory lock plus a sequence, the counter row is the
lock and the value in one, works the same on SQLite, and never hands out a number twice (retention
may delete the newest rows; the counter stays). The price: concurrent journal replicas do not write
in parallel (the projection's row locks serialised them on shared runs already). A ``rebuild`` drops
the counter with the tables and numbers the replayed events anew: subscribers start over after one.

Where it starts: after ``Last-Event-ID`` when the client sends one (a reconnect), else after the
``after`` query parameter (a cursor; ``0``: the whole journal, then live), else after the newest event
journaled when the request arrived (a live tail from now). A database upgraded from an older journal
numbered its existing events with their stream sequence (migration ``0003``), so a cursor an older
journal sent (a stream sequence) resumes where it was.

How it is fed: the :class:`Recorder` calls :meth:`Changes.notify` once per committed batch (never per
event); every open stream then reads the rows after its position (``commit_seq`` unique index, at most
:data:`PAGE` at a time). It also reads every :data:`POLL_S` without a wake-up, so events recorded by
another journal replica on the same database arrive as well, just later. A stream ends when the client
goes away or the service stops (SIGTERM: the server does not wait for open streams).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import Any

from fastapi.sse import ServerSentEvent
from sqlalchemy import func
from sqlalchemy import select as sa_select
from sqlmodel import col, select

from temporality_journal.database import Database
from temporality_journal.models import EVENTS_TABLE, EventRecord

__all__ = ["PAGE", "POLL_S", "RETRY_MS", "Changes", "Tail"]

#: Rows read per query of one stream.
PAGE = 500
#: A stream re-reads after this long without a wake-up (events of other replicas, a missed notify).
POLL_S = 1.0
#: The reconnection delay suggested to EventSource clients (``retry:``), in milliseconds.
RETRY_MS = 2000


class Changes:
    """A wake-up signal for the open streams: :meth:`notify` wakes every waiter, once."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    def current(self) -> asyncio.Event:
        """The event the next :meth:`notify` sets: take it *before* reading, then wait on it."""
        return self._event


class Tail:
    """Streams of the journaled events for the API (see the module docstring)."""

    def __init__(
        self,
        database: Database,
        changes: Changes | None = None,
        *,
        stopping: Callable[[], bool] = lambda: False,
        poll_s: float = POLL_S,
    ) -> None:
        self.database = database
        self.changes = changes or Changes()
        self._stopping = stopping
        self._poll_s = poll_s

    async def newest_position(self) -> int:
        """The cursor of the newest event journaled (``0``: none)."""
        async with self.database.engine.connect() as conn:
            value = (await conn.execute(sa_select(func.max(EVENTS_TABLE.c.commit_seq)))).scalar()
        return int(value) if value is not None else 0

    async def _page(self, after: int, run_id: str | None, type_: str | None) -> list[EventRecord]:
        query = select(EventRecord).where(col(EventRecord.commit_seq) > after)
        if run_id is not None:
            query = query.where(col(EventRecord.run_id) == run_id)
        if type_ is not None:
            query = query.where(col(EventRecord.type) == type_)
        query = query.order_by(col(EventRecord.commit_seq)).limit(PAGE)
        async with self.database.sessions() as session:
            return list((await session.exec(query)).all())

    async def stream(
        self,
        *,
        after: int | None,
        run_id: str | None,
        type_: str | None,
        render: Callable[[EventRecord], dict[str, Any]],
        gone: Callable[[], Any],
    ) -> AsyncGenerator[ServerSentEvent, None]:
        """The SSE events after the cursor ``after`` (``None``: from now), rendered by ``render``, until
        ``gone()`` (an awaitable: the client disconnected) or the service stops."""
        position = await self.newest_position() if after is None else after
        yield ServerSentEvent(comment=f"tail after {position}", retry=RETRY_MS)
        while not self._stopping():
            woken = self.changes.current()
            rows = await self._page(position, run_id, type_)
            for row in rows:
                position = row.commit_seq  # rows come in commit_seq order, each above the last
                yield ServerSentEvent(data=render(row), event=row.type, id=str(row.commit_seq))
            if len(rows) == PAGE:
                continue
            if await gone():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), self._poll_s)
