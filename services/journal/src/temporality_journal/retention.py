"""Retention of the read model (issue 9): purge what finished longer ago than ``TEMPORALITY_JOURNAL_RETENTION_DAYS``.

``0`` (the default) keeps everything forever and starts no purge. Otherwise, once at start and then every
:data:`PURGE_INTERVAL_S`, :meth:`Retention.purge` deletes, ``batch_size`` runs per transaction:

- every **finished** run (``completed``, ``failed``, ``cancelled``) whose ``finished_at`` is older than
  the cut-off: its row in ``runs``, its events in ``events`` and the asks it sent (``asks``). A run that
  is pending, running, waiting or resuming is never touched, however old;
- events that belong to no run (``trigger.*``, ``bus.*``, directory changes …) older than the cut-off,
  and asks whose asker the journal never knew as a run, finished before the cut-off.

**The audit trail is kept**: an event ``GET /audit`` lists (:func:`temporality_journal.audit.audited`:
trigger and directory changes, cancel requests, refusals, dead letters, refused API access …) is never
deleted by this table retention, with its run or without. It has a retention of its own,
``TEMPORALITY_JOURNAL_AUDIT_RETENTION_DAYS`` (default ``0``: kept forever; meant to be longer than the
table's): audited events older than that are deleted, whatever the table retention.

Events of a run the journal has no row for (it never saw the run start) are kept. Every pass that
deleted something logs ``retention.purged`` with the counts. Purging is idempotent, so replicas may
purge at the same time. The events stream has its own retention (``max_age``); a rebuild
(``temporality-journal rebuild``) restores whatever the stream still holds, purged rows included.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import structlog
from sqlalchemy import delete, select

from temporality_journal.audit import audited, not_audited
from temporality_journal.database import Database
from temporality_journal.models import ASKS_TABLE, EVENTS_TABLE, RUNS_TABLE
from temporality_protocol import RUN

__all__ = ["PURGE_BATCH", "PURGE_INTERVAL_S", "Purged", "Retention"]

log = structlog.get_logger(__name__)

#: How often the journal purges (seconds), after a first pass at start.
PURGE_INTERVAL_S = 3600.0
#: Runs (and run-less events) deleted per transaction.
PURGE_BATCH = 500
_TERMINAL = sorted(state.value for state in RUN.terminal)


@dataclass(frozen=True)
class Purged:
    """What one :meth:`Retention.purge` deleted."""

    runs: int = 0
    events: int = 0
    asks: int = 0
    batches: int = 0
    #: Audited events deleted by the audit retention (not counted in ``events``).
    audit: int = 0

    def __add__(self, other: Purged) -> Purged:
        return Purged(
            self.runs + other.runs,
            self.events + other.events,
            self.asks + other.asks,
            self.batches + other.batches,
            self.audit + other.audit,
        )


class Retention:
    """Deletes finished runs' rows and events older than ``days`` (0: none), and audited events older than
    ``audit_days`` (0: none; see the module docstring)."""

    def __init__(
        self,
        database: Database,
        days: int,
        *,
        audit_days: int = 0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        batch_size: int = PURGE_BATCH,
        interval_s: float = PURGE_INTERVAL_S,
        on_pass: Callable[[Purged], None] | None = None,
    ) -> None:
        """``clock`` gives now (tests inject one); ``on_pass`` is called after every pass of :meth:`run`."""
        if days < 0 or audit_days < 0 or not (days or audit_days):
            raise ValueError("retention needs at least one day (0 means: keep everything, no Retention)")
        self._database = database
        self._days = days
        self._audit_days = audit_days
        self._clock = clock
        self._batch = batch_size
        self._interval_s = interval_s
        self._on_pass = on_pass

    def cutoff(self) -> datetime:
        """Finished before this instant: purged."""
        return self._clock() - timedelta(days=self._days)

    def audit_cutoff(self) -> datetime:
        """Audited events before this instant: purged (only with ``audit_days``)."""
        return self._clock() - timedelta(days=self._audit_days)

    async def purge(self) -> Purged:
        """One pass: every batch until nothing older than the cut-off is left; logs what it deleted."""
        cutoff = self.cutoff()
        total = Purged()
        while self._days:
            batch = await self._purge_runs(cutoff)
            total += batch
            if batch.runs < self._batch:
                break
        while self._days:
            batch = await self._purge_runless(cutoff)
            total += batch
            if batch.events + batch.asks < self._batch:
                break
        while self._audit_days:
            batch = await self._purge_audit(self.audit_cutoff())
            total += batch
            if batch.audit < self._batch:
                break
        if total.runs or total.events or total.asks or total.audit:
            log.info(
                "retention.purged",
                cutoff=cutoff.isoformat() if self._days else None,
                days=self._days,
                audit_days=self._audit_days,
                runs=total.runs,
                events=total.events,
                asks=total.asks,
                audit=total.audit,
                batches=total.batches,
            )
        else:
            log.debug("retention.nothing_to_purge", cutoff=cutoff.isoformat())
        return total

    async def _purge_runs(self, cutoff: datetime) -> Purged:
        runs = RUNS_TABLE.c
        async with self._database.engine.begin() as conn:
            ids: Sequence[str] = (
                (
                    await conn.execute(
                        select(runs.run_id)
                        .where(runs.state.in_(_TERMINAL), runs.finished_at < cutoff)
                        .order_by(runs.finished_at, runs.run_id)
                        .limit(self._batch)
                    )
                )
                .scalars()
                .all()
            )
            if not ids:
                return Purged()
            # the run's audited events (its cancel request, a refused recipient) stay: the audit has its own retention
            events = await conn.execute(delete(EVENTS_TABLE).where(EVENTS_TABLE.c.run_id.in_(ids), not_audited()))
            asks = await conn.execute(delete(ASKS_TABLE).where(ASKS_TABLE.c.asker_run_id.in_(ids)))
            # the state is terminal, so no event can have moved the run meanwhile; re-checked all the same
            deleted = await conn.execute(
                delete(RUNS_TABLE).where(runs.run_id.in_(ids), runs.state.in_(_TERMINAL), runs.finished_at < cutoff)
            )
        return Purged(runs=deleted.rowcount, events=events.rowcount, asks=asks.rowcount, batches=1)

    async def _purge_runless(self, cutoff: datetime) -> Purged:
        events, asks = EVENTS_TABLE.c, ASKS_TABLE.c
        async with self._database.engine.begin() as conn:
            event_ids = (
                (
                    await conn.execute(
                        select(events.id)
                        .where(events.run_id.is_(None), events.time < cutoff, not_audited())
                        .order_by(events.time, events.id)
                        .limit(self._batch)
                    )
                )
                .scalars()
                .all()
            )
            ask_ids = (
                (
                    await conn.execute(
                        select(asks.request_id)
                        .where(
                            asks.finished_at < cutoff,
                            asks.asker_run_id.is_(None) | asks.asker_run_id.not_in(select(RUNS_TABLE.c.run_id)),
                        )
                        .order_by(asks.finished_at, asks.request_id)
                        .limit(self._batch)
                    )
                )
                .scalars()
                .all()
            )
            if not event_ids and not ask_ids:
                return Purged()
            deleted_events = await conn.execute(delete(EVENTS_TABLE).where(events.id.in_(event_ids)))
            deleted_asks = await conn.execute(delete(ASKS_TABLE).where(asks.request_id.in_(ask_ids)))
        return Purged(events=deleted_events.rowcount, asks=deleted_asks.rowcount, batches=1)

    async def _purge_audit(self, cutoff: datetime) -> Purged:
        events = EVENTS_TABLE.c
        async with self._database.engine.begin() as conn:
            ids = (
                (
                    await conn.execute(
                        select(events.id)
                        .where(audited(), events.time < cutoff)
                        .order_by(events.time, events.id)
                        .limit(self._batch)
                    )
                )
                .scalars()
                .all()
            )
            if not ids:
                return Purged()
            deleted = await conn.execute(delete(EVENTS_TABLE).where(events.id.in_(ids)))
        return Purged(audit=deleted.rowcount, batches=1)

    async def run(self, stop: asyncio.Event) -> None:
        """Purge now, then every ``interval_s`` until ``stop`` is set; a failed pass is logged and retried."""
        while not stop.is_set():
            try:
                purged = await self.purge()
            except Exception as exc:  # a database outage must not stop the journal; the next pass retries
                log.warning("retention.purge_failed", error=repr(exc))
            else:
                if self._on_pass is not None:
                    self._on_pass(purged)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_s)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run :meth:`run` in the background for the duration of the block (the service's resources)."""
        stop = asyncio.Event()
        task = asyncio.create_task(self.run(stop), name="journal-retention")
        log.info("retention.started", days=self._days, audit_days=self._audit_days, interval_s=self._interval_s)
        try:
            yield
        finally:
            stop.set()
            await task
