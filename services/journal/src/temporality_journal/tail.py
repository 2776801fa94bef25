"""The live tail: the journal's events as Server-Sent Events (``GET /events/stream``), resumable.

Each SSE event is one journaled CloudEvent: ``id`` = its JetStream stream sequence (the journal's
order; what ``Last-Event-ID`` resumes from), ``event`` = its CloudEvent type, ``data`` = the same JSON
as an item of ``GET /events``. The stream starts with a comment ``: tail after <seq>`` (and ``retry``),
sent once the start position is fixed: an event journaled after that comment is in the stream.

Where it starts: after ``Last-Event-ID`` when the client sends one (a reconnect), else after the
``after`` query parameter (``0``: the whole journal, then live), else after the newest event journaled
when the request arrived (a live tail from now).

How it is fed: the :class:`Recorder` calls :meth:`Changes.notify` once per committed batch (never per
event); every open stream then reads the rows after its position (``stream_seq`` index, at most
:data:`PAGE` at a time). It also reads every :data:`POLL_S` without a wake-up, so events recorded by
another journal replica on the same database arrive as well, just later. A stream ends when the client
goes away or the service stops (SIGTERM: the server does not wait for open streams).

Order caveat: a JetStream redelivery (a batch that failed and was recorded one by one) keeps its
original stream sequence, so an event may be committed after events with a higher sequence. A stream
that has already passed that sequence does not send it; ``GET /runs/{run_id}/events`` always has it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
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

    async def newest_seq(self) -> int:
        async with self.database.engine.connect() as conn:
            value = (await conn.execute(sa_select(func.max(EVENTS_TABLE.c.stream_seq)))).scalar()
        return int(value) if value is not None else 0

    async def _page(self, after: int, run_id: str | None, type_: str | None) -> list[EventRecord]:
        query = select(EventRecord).where(col(EventRecord.stream_seq) > after)
        if run_id is not None:
            query = query.where(col(EventRecord.run_id) == run_id)
        if type_ is not None:
            query = query.where(col(EventRecord.type) == type_)
        query = query.order_by(col(EventRecord.stream_seq), col(EventRecord.id)).limit(PAGE)
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
    ) -> AsyncIterator[ServerSentEvent]:
        """The SSE events after ``after`` (``None``: from now), rendered by ``render``, until ``gone()``
        (an awaitable: the client disconnected) or the service stops."""
        position = await self.newest_seq() if after is None else after
        yield ServerSentEvent(comment=f"tail after {position}", retry=RETRY_MS)
        while not self._stopping():
            woken = self.changes.current()
            rows = await self._page(position, run_id, type_)
            for row in rows:
                position = max(position, row.stream_seq)
                yield ServerSentEvent(data=render(row), event=row.type, id=str(row.stream_seq))
            if len(rows) == PAGE:
                continue
            if await gone():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), self._poll_s)
