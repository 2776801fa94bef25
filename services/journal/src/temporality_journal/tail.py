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
the tables but keeps numbering after the last position handed out: a subscriber resuming with an older
cursor gets the replayed events again (the same CloudEvent ids: at-least-once across a rebuild) and skips none.

Where it starts: after ``Last-Event-ID`` when the client sends one (a reconnect), else after the
``after`` query parameter (a cursor; ``0``: the whole journal, then live), else after the newest event
journaled when the request arrived (a live tail from now). A database upgraded from an older journal
numbered its existing events with their stream sequence (migration ``0003``), so a cursor an older
journal sent (a stream sequence) resumes where it was.

How it is fed: the :class:`Recorder` calls :meth:`Changes.notify` once per committed batch (never per
event); every open stream then reads the rows after its position (``commit_seq`` unique index, at most
:data:`PAGE` at a time). It also reads every :data:`POLL_S` without a wake-up, so events recorded by
another journal replica on the same database arrive as well, just later. After :data:`KEEPALIVE_S`
without an event the stream sends the comment ``: ping`` (proxies keep the connection open).

How it is sent: :class:`EventStreamResponse`, our own ASGI response, not FastAPI's ``EventSourceResponse``
(0.165's raised ``BrokenResourceError`` from its keep-alive task when a client went away while its events
were being written: a logged server error for an ordinary hang-up). One task reads the request's
``http.disconnect`` and sets ``gone``; the stream looks at it between events and while it waits, and ends
by itself: it is never cancelled in the middle of a database query. A stream ends when the client goes
away or the service stops (SIGTERM: the server does not wait for open streams). sse-starlette (in the lock
through ``mcp``) is not used for the same reason: it cancels the generator's task group on disconnect
(docs/journal.md, "Why the journal's own SSE response").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import anyio
import structlog
from sqlalchemy import ColumnElement, func
from sqlalchemy import select as sa_select
from sqlmodel import col, select
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from temporality_journal.database import Database
from temporality_journal.models import EVENTS_TABLE, EventRecord

__all__ = [
    "KEEPALIVE_S",
    "PAGE",
    "POLL_S",
    "RECHECK_S",
    "RETRY_MS",
    "SESSION_ENDED",
    "SSE_ITEM_SCHEMA",
    "Changes",
    "EventStreamResponse",
    "Tail",
    "sse_event",
]

log = structlog.get_logger(__name__)

#: Rows read per query of one stream.
PAGE = 500
#: A stream re-reads after this long without a wake-up (events of other replicas, a missed notify).
POLL_S = 1.0
#: The reconnection delay suggested to EventSource clients (``retry:``), in milliseconds.
RETRY_MS = 2000
#: An idle stream sends the comment ``: ping`` after this long without anything else.
KEEPALIVE_S = 15.0
#: A stream opened with a sign-in session checks it again at least this often (and before each batch it sends,
#: at most once a second): a session signed out, expired or ended by the directory ends the stream.
RECHECK_S = 30.0
#: The least time between two checks before batches (a busy journal commits many batches a second).
_BATCH_RECHECK_S = 1.0
#: The comment a stream ends with when its session no longer holds (the client's reconnect is then a 401).
SESSION_ENDED = b": session ended\n\n"
#: One SSE message as OpenAPI 3.2 describes it (an ``itemSchema`` of ``text/event-stream``).
SSE_ITEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "data": {"type": "string"},
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer", "minimum": 0},
    },
}
#: What an idle stream sends (a comment: EventSource clients ignore it).
KEEPALIVE = b": ping\n\n"


def _lines(value: str) -> list[str]:
    return value.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def sse_event(
    *,
    data: str | None = None,
    event: str | None = None,
    id: str | None = None,
    retry: int | None = None,
    comment: str | None = None,
) -> bytes:
    """One SSE message in the ``text/event-stream`` wire format (comment, event, data, id, retry; a blank
    line ends it). ``data`` may hold line breaks (one ``data:`` line each); ``event`` and ``id`` must not."""
    for name, value in (("event", event), ("id", id)):
        if value is not None and ("\n" in value or "\r" in value or "\0" in value):
            raise ValueError(f"an SSE {name} must be one line without NUL")
    lines = [f": {line}" for line in _lines(comment)] if comment is not None else []
    if event is not None:
        lines.append(f"event: {event}")
    if data is not None:
        lines += [f"data: {line}" for line in _lines(data)]
    if id is not None:
        lines.append(f"id: {id}")
    if retry is not None:
        lines.append(f"retry: {retry}")
    return ("\n".join(lines) + "\n\n").encode("utf-8")


class EventStreamResponse(Response):
    """A ``text/event-stream`` response of a stream of SSE messages that ends cleanly when the client goes.

    ``content`` is made by the caller around ``gone`` (this response's :attr:`gone`, passed in): the task
    reading the request sets it on ``http.disconnect``, and the stream is expected to look at it and end.
    The stream is never cancelled by a hang-up; it is closed (``aclose``) when the response ends for any
    reason. Writes after a hang-up are not attempted; a write the server refuses (``OSError``) is a hang-up
    too."""

    #: None, so that FastAPI's OpenAPI adds no ``schema`` beside the route's own ``itemSchema``; the
    #: ``Content-Type`` header is set in ``__init__``.
    media_type = None

    def __init__(
        self,
        content: AsyncIterator[bytes],
        gone: anyio.Event,
        status_code: int = 200,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.content = content
        self.gone = gone
        self.status_code = status_code
        self.background = None
        self.init_headers(
            {
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                **(headers or {}),
            }
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watch() -> None:
            while True:
                message: Message = await receive()
                if message["type"] == "http.disconnect":
                    self.gone.set()
                    return

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(watch)
                try:
                    await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                    async for chunk in self.content:
                        if self.gone.is_set():
                            break
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    if not self.gone.is_set():
                        await send({"type": "http.response.body", "body": b"", "more_body": False})
                except OSError:
                    self.gone.set()  # the server says the client is gone (ASGI spec 2.4)
                tasks.cancel_scope.cancel()
        finally:
            aclose = getattr(self.content, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


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

    async def _page(
        self, after: int, run_id: str | None, type_: str | None, where: Sequence[ColumnElement[bool]]
    ) -> list[EventRecord]:
        query = select(EventRecord).where(col(EventRecord.commit_seq) > after, *where)
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
        gone: anyio.Event,
        keepalive_s: float = KEEPALIVE_S,
        where: Sequence[ColumnElement[bool]] = (),
        still_admitted: Callable[[], Awaitable[bool]] | None = None,
        recheck_s: float | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """The SSE messages of the events after the cursor ``after`` (``None``: from now), each rendered by
        ``render``, until ``gone`` is set (the client went away) or the service stops; ``: ping`` after
        ``keepalive_s`` without anything sent. ``where``: further conditions on ``events`` (``audited=true``: only
        what the audit trail lists); the cursor is the same commit order. ``still_admitted``: the caller's
        credential check (a sign-in session's), run again every ``recheck_s`` (:data:`RECHECK_S`) and before each batch (at most once a
        second); once it fails the stream sends the comment ``: session ended`` and ends."""
        recheck_s = RECHECK_S if recheck_s is None else recheck_s
        newest = await self.newest_position()
        position = newest if after is None else after
        ahead = position > newest
        if ahead:
            # A cursor this journal never handed out: a journal started afresh or restored from an older backup
            # numbers from its own last position. Waiting for the count to pass it would skip every event until
            # then, silently: the stream goes on from the newest event instead, and says so.
            log.warning("tail.cursor_ahead", cursor=position, newest=newest)
            asked, position = position, newest
        yield sse_event(comment=f"tail after {position}", retry=RETRY_MS)
        if ahead:
            yield sse_event(
                comment=f"cursor {asked} is past this journal's newest event {newest} (a journal started afresh "
                f"or restored?): resumed after {newest}"
            )
        sent_at = checked_at = time.monotonic()
        while not self._stopping() and not gone.is_set():
            woken = self.changes.current()
            rows = await self._page(position, run_id, type_, where)
            since_check = time.monotonic() - checked_at
            if still_admitted is not None and (since_check >= recheck_s or (rows and since_check >= _BATCH_RECHECK_S)):
                if not await still_admitted():
                    yield SESSION_ENDED
                    return
                checked_at = time.monotonic()
            for row in rows:
                position = row.commit_seq  # rows come in commit_seq order, each above the last
                yield sse_event(data=json.dumps(render(row)), event=row.type, id=str(row.commit_seq))
                sent_at = time.monotonic()
            if len(rows) == PAGE:
                continue
            if time.monotonic() - sent_at >= keepalive_s:
                yield KEEPALIVE
                sent_at = time.monotonic()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_s):
                    await _first(woken.wait(), gone.wait())


async def _first(*waits: Any) -> None:
    """Until the first of the awaitables ``waits`` is done (the others are cancelled)."""
    async with anyio.create_task_group() as tasks:

        async def one(wait: Any) -> None:
            await wait
            tasks.cancel_scope.cancel()

        for wait in waits:
            tasks.start_soon(one, wait)
