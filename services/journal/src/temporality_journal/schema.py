"""``temporality-journal migrations`` and ``temporality-journal downgrade <revision>``: the read model's schema
revisions, and the way back to an older journal's (rolling back, docs/operations.md).

A journal migrates its database to its newest revision at every start; an **older** journal cannot use a
database a newer one migrated (it refuses to start, naming the revision it needs: since ``0006_reruns``,
:class:`temporality_journal.database.SchemaTooNew`; before, with Alembic's ``Can't locate revision``). So a
rollback takes the schema down **with the newer version** (it has the downgrade steps), every journal replica
stopped, before the older one starts:

* ``migrations`` prints every revision this journal knows (newest first), what each adds, what undoing it loses,
  and which one the database is at (it connects to ``TEMPORALITY_DATABASE_URL``, nothing else; a database it
  cannot reach is named, the list printed all the same, exit 1).
* ``downgrade <revision>`` runs the downgrade steps from the database's revision to ``<revision>`` in one
  transaction (a failure leaves the schema as it was), logging each step undone (``journal.downgrade_step``,
  a warning naming what is lost when a step loses data) and ``journal.downgraded``. Exit 0 done (or nothing
  to do), 2 bad settings or a revision it cannot go to, 1 the database failed.

Nothing here touches NATS: the durable consumer keeps its position, the older journal resumes where this one
stopped.
"""

from __future__ import annotations

import sys

import structlog
from pydantic import ValidationError

from temporality_journal.database import Database, SchemaTooNew, migrations
from temporality_journal.settings import Settings
from temporality_service import LogSettings, configure_logging

__all__ = ["downgrade_main", "migrations_main"]

log = structlog.get_logger(__name__)


def _settings() -> Settings | None:
    try:
        settings = Settings()
    except ValidationError as exc:
        configure_logging(LogSettings.model_construct(level="info", format="json"), service="journal")
        log.error("settings.invalid", error=str(exc))
        return None
    configure_logging(settings.log, service="journal")
    return settings


async def _current(settings: Settings) -> str | None:
    async with Database.open_unmigrated(
        settings.database_url, settings.database_tls(), settings.database_durability()
    ) as database:
        return await database.revision()


async def migrations_main() -> int:
    settings = _settings()
    if settings is None:
        return 2
    try:
        current: str | None = await _current(settings)
        error = None
    except Exception as exc:
        current, error = None, repr(exc)
    known = migrations()
    lines = ["revision      adds / what a downgrade below it loses"]
    for m in known:
        mark = "  <- the database" if m.revision == current else ""
        lines.append(f"{m.revision:<13} {m.adds.replace('``', '`')}{mark}")
        lines.append(f"{'':<13}   downgrade loses: {m.downgrade_loses or 'nothing (the next upgrade restores it)'}")
    if error is not None:
        lines.append(f"the database: cannot read its revision ({error})")
    elif current is None:
        lines.append("the database: no schema revision (new, or made before migrations)")
    elif current not in {m.revision for m in known}:
        lines.append(f"the database: at {current!r}, newer than this journal knows (a newer version migrated it)")
    else:
        lines.append(f"the database: at {current}")
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
    return 1 if error is not None else 0


async def downgrade_main(target: str) -> int:
    settings = _settings()
    if settings is None:
        return 2
    try:
        async with Database.open_unmigrated(
            settings.database_url, settings.database_tls(), settings.database_durability()
        ) as database:
            before = await database.revision()
            steps = await database.downgrade(target)
    except (ValueError, SchemaTooNew) as exc:
        log.error("journal.downgrade_refused", error=str(exc), detail="nothing was changed")
        return 2
    except Exception as exc:
        log.error("journal.downgrade_failed", error=repr(exc), detail="one transaction: the schema is as it was")
        return 1
    for step in steps:
        if step.downgrade_loses is None:
            log.info("journal.downgrade_step", revision=step.revision, loses="nothing")
        else:
            log.warning("journal.downgrade_step", revision=step.revision, loses=step.downgrade_loses)
    log.info(
        "journal.downgraded",
        revision=target,
        migrated=f"{before} -> {target}" if steps else False,
        next_step="start the journal version whose newest revision this is (it migrates no further)",
    )
    return 0
