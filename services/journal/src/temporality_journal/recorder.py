"""The journal consumer's handler: store every event once and project it, in one transaction.

The consumer acks only after :meth:`Recorder.handle` returns, i.e. after the commit; a crash
before that redelivers the event, and the insert-if-new makes the redelivery change nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime

import structlog
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlmodel import col
from sqlmodel.ext.asyncio.session import AsyncSession

from temporality_bus import Delivery
from temporality_journal.database import Database
from temporality_journal.models import EventRecord, RunRecord, as_utc
from temporality_journal.projection import PROJECTED_TYPES, project, run_id_of
from temporality_protocol import Envelope, InvalidEnvelope

__all__ = ["Recorder"]

log = structlog.get_logger(__name__)


class Recorder:
    """Writes events into ``events`` and their projection into ``runs``. Idempotent by event id."""

    def __init__(self, database: Database) -> None:
        self._database = database
        self._insert = postgresql_insert if database.dialect == "postgresql" else sqlite_insert

    async def handle(self, event: Envelope, delivery: Delivery) -> None:
        """The :class:`temporality_bus.Consumer` handler."""
        await self.record(event, delivery.stream_seq)

    async def record(self, event: Envelope, stream_seq: int) -> bool:
        """Store ``event`` and apply it to its run; ``False`` (and no change) when its id is known."""
        async with self._database.sessions() as session, session.begin():
            if not await self._store(session, event, stream_seq):
                log.debug("event.duplicate", ce_id=event.id)
                return False
            await self._project(session, event, stream_seq)
        log.debug("event.recorded", ce_id=event.id, ce_type=event.type, stream_seq=stream_seq)
        return True

    async def _store(self, session: AsyncSession, event: Envelope, stream_seq: int) -> bool:
        statement = (
            self._insert(EventRecord)
            .values(
                id=event.id,
                type=event.type,
                source=event.source,
                time=as_utc(event.time),
                run_id=run_id_of(event),
                correlation_id=event.correlationid,
                causation_id=event.causationid,
                actor=event.actor,
                tenant=event.tenant,
                subject=event.subject,
                stream_seq=stream_seq,
                data=event.data,
                recorded_at=datetime.now(UTC),
            )
            .on_conflict_do_nothing(index_elements=["id"])
            .returning(col(EventRecord.id))
        )
        result = await session.exec(statement)
        return result.first() is not None

    async def _project(self, session: AsyncSession, event: Envelope, stream_seq: int) -> None:
        run_id = run_id_of(event)
        if run_id is None or event.type not in PROJECTED_TYPES:
            return
        row = await session.get(RunRecord, run_id, with_for_update=True)  # serialises replicas on PostgreSQL
        try:
            after = project(row.snapshot() if row is not None else None, event, stream_seq)
        except InvalidEnvelope as exc:  # stored as it came; a read model must not lose the fact
            log.warning("run.projection_skipped", ce_id=event.id, run_id=run_id, error=str(exc))
            return
        if after is None:
            return
        moved = row is None or row.state != after.state
        if row is None:
            session.add(RunRecord(**after.model_dump()))
        else:
            row.sqlmodel_update(after.model_dump(exclude={"run_id"}))
        if moved:
            log.info("run.moved", run_id=run_id, state=after.state.value, ce_type=event.type)
