"""Read your bus writes: ``min_seq`` on the journal's reads waits (bounded) until the journal has recorded that far.

A NATS subscriber (DC-6) that sees ``run.completed`` at stream sequence ``N`` and then asks the journal for
the run's trajectory may be ahead of it: the journal records the stream in batches behind the bus, so the
answer can still lack the last events (``run.completed`` itself). With ``min_seq=N`` (the subscriber's
``msg.metadata.sequence.stream``) ``GET /runs/{id}``, ``GET /runs/{id}/events`` and ``GET /events`` first
wait until the journal has recorded up to ``N``, at most :data:`WAIT_S`; then they answer as usual. Not by
then: :class:`JournalBehind`, a 503 with ``Retry-After`` and how far the journal is (``recorded_seq``).

**The journal's mark** is the highest stream sequence in ``events`` (:meth:`CatchUp.recorded`: ``max`` over
the ``stream_seq`` index, one index probe on SQLite and PostgreSQL), read from the database, so it holds
for every replica on it and needs nothing of the recorder. It is exact for the usual deployment, one
journal consumer: the consumer records its batches in stream order and commits each before it takes the
next, so once sequence ``N`` is stored every lower one the journal stores is stored too. Where it is not:

- several journal replicas consume one durable together and commit concurrently: another replica may have
  committed a higher sequence while the batch holding ``N`` is still open (the wait ends early; the event
  at ``N`` is in the answer only once that batch commits -- a subscriber that must have it checks for its
  CloudEvent id and asks again);
- a sequence the journal never stores -- a republished event it already has under an earlier sequence (the
  bus dedupes a republished id for 10 minutes only), a message that is not a CloudEvent (dead-lettered:
  its ``bus.dead_lettered`` comes later on the stream) -- is passed only once a later event is recorded:
  on a bus idle after it, the read answers 503 after :data:`WAIT_S`.

Why not the runs' ``last_event_seq``: it is the projection's staleness guard, the sequence of the latest
event that moved the run *while it was live* -- the event that ends a run, and events that move no run
(``run.tool_called`` ...), leave it as it was -- so it never reaches the sequence of ``run.completed``.
Why not the journal consumer's ack floor on the server: an extra NATS request per check, and the read
would depend on NATS being reachable; the database is what the answer is read from anyway.

How it waits: the recorder wakes the live tail once per committed batch (:class:`~temporality_journal.tail.
Changes`); the wait takes the same wake-up and also reads again every :data:`POLL_S` (another replica's
commits, or an app without the recorder's wake-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

import structlog
from sqlalchemy import func
from sqlalchemy import select as sa_select

from temporality_journal.database import Database
from temporality_journal.models import EVENTS_TABLE
from temporality_journal.tail import Changes
from temporality_service import Unavailable

__all__ = ["POLL_S", "RETRY_AFTER_S", "WAIT_S", "CatchUp", "JournalBehind"]

log = structlog.get_logger(__name__)

#: The longest a read with ``min_seq`` waits for the journal to record that far (then 503).
WAIT_S = 5.0
#: Without a wake-up, the journal's mark is read again after this long.
POLL_S = 0.2
#: The ``Retry-After`` of the 503 (seconds).
RETRY_AFTER_S = 1


class JournalBehind(Unavailable):
    """503 ``journal_behind``: the journal has not recorded up to ``min_seq`` within the wait."""

    code = "journal_behind"

    def __init__(self, min_seq: int, recorded: int, waited_s: float) -> None:
        super().__init__(
            f"the journal has recorded the event stream up to sequence {recorded}, not yet up to min_seq {min_seq} "
            f"(waited {waited_s:.1f} s): retry after {RETRY_AFTER_S} s, or read without min_seq",
            retry_after_s=RETRY_AFTER_S,
        )
        self._extra = {"min_seq": min_seq, "recorded_seq": recorded}


class CatchUp:
    """Waits for the journal in ``database`` to record up to a stream sequence (see the module docstring).
    ``changes``: the recorder's wake-up per committed batch (the live tail's), if this process records."""

    def __init__(
        self,
        database: Database,
        changes: Changes | None = None,
        *,
        wait_s: float = WAIT_S,
        poll_s: float = POLL_S,
    ) -> None:
        self.database = database
        self.changes = changes
        self.wait_s = wait_s
        self.poll_s = poll_s

    async def recorded(self) -> int:
        """The highest JetStream stream sequence the journal has recorded (``0``: none yet)."""
        async with self.database.engine.connect() as conn:
            value = (await conn.execute(sa_select(func.max(EVENTS_TABLE.c.stream_seq)))).scalar()
        return int(value) if value is not None else 0

    async def wait(self, min_seq: int) -> int:
        """Until the journal has recorded up to ``min_seq`` (its mark, returned); :class:`JournalBehind` after
        :attr:`wait_s` without."""
        started = time.monotonic()
        deadline = started + self.wait_s
        while True:
            woken = self.changes.current() if self.changes is not None else None  # before reading: no lost wake-up
            recorded = await self.recorded()
            if recorded >= min_seq:
                return recorded
            left = deadline - time.monotonic()
            if left <= 0:
                waited = time.monotonic() - started
                log.info("journal.behind", min_seq=min_seq, recorded_seq=recorded, waited_s=round(waited, 3))
                raise JournalBehind(min_seq, recorded, math.floor(waited * 10) / 10)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(self.poll_s, left)):
                    if woken is None:
                        await asyncio.Event().wait()  # no wake-up here: the timeout is the poll
                    else:
                        await woken.wait()
