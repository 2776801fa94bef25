"""``temporality-journal rebuild``: drop the read model and replay the event stream from the start.

Run it with every journal replica **stopped** (``make up`` stopped, or the Deployment scaled to 0):

1. :meth:`Database.drop` removes the ``events`` and ``runs`` tables and the schema version, and the
   migrations create them again, empty, at the newest revision; the commit counter goes on from the last
   position handed out before (the live tail's cursors never go back: a subscriber resuming with a cursor
   from before the rebuild gets the replayed events again, with their CloudEvent ids, and skips none);
2. the journal's durable consumer is deleted from ``TEMPORALITY_EVENTS``.

The next journal to start creates the consumer again (deliver policy *all*), so it records the whole
stream from its first retained message and projects every run anew; ingest is batched and idempotent,
so it catches up at its normal rate. The stream keeps events forever by default (``max_age`` 0); a
shorter retention rebuilds only what is still retained. Same environment as the service
(``TEMPORALITY_DATABASE_URL``, ``TEMPORALITY_NATS_*``). Exit 0 when done, 2 for bad settings, 1 when
the database or NATS fails.
"""

from __future__ import annotations

import structlog
from nats.js.errors import NotFoundError
from pydantic import ValidationError

from temporality_bus import Bus
from temporality_journal.database import Database
from temporality_journal.settings import Settings
from temporality_protocol.catalog import CONSUMERS, EVENTS_STREAM
from temporality_service import LogSettings, configure_logging

__all__ = ["main", "rebuild"]

log = structlog.get_logger(__name__)


async def rebuild(settings: Settings) -> None:
    """Drop and re-create the read model, then delete the journal's durable consumer (see the module docstring)."""
    async with Database.open(
        settings.database_url, settings.database_tls(), settings.database_durability()
    ) as database:
        last = await database.last_position()
        await database.drop()
        await database.create_tables()
        await database.continue_positions_after(last)
    durable = CONSUMERS["journal"].durable
    async with Bus.connect(settings.nats, name="journal-rebuild") as bus:
        try:
            await bus.js.delete_consumer(EVENTS_STREAM.name, durable)
            deleted = True
        except NotFoundError:
            deleted = False
    log.info(
        "journal.rebuild_ready",
        consumer=durable,
        consumer_deleted=deleted,
        positions_after=last,
        next_step="start the journal",
    )


async def main() -> int:
    try:
        settings = Settings()
    except ValidationError as exc:
        configure_logging(LogSettings.model_construct(level="info", format="json"), service="journal")
        log.error("settings.invalid", error=str(exc))
        return 2
    configure_logging(settings.log, service="journal")
    try:
        await rebuild(settings)
    except Exception as exc:
        log.error("journal.rebuild_failed", error=repr(exc))
        return 1
    return 0
