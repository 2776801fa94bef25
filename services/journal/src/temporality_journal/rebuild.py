"""``temporality-journal rebuild``: drop the read model and replay the event stream from the start.

Run it with every journal replica **stopped** and NATS **running** (``temporality up --rebuild-journal``
does both for the embedded stack; compose / Helm: the journal scaled to 0). The steps, in this order:

1. **Connect to NATS, bounded**: two tries per server, each at most ``TEMPORALITY_NATS_CONNECT_TIMEOUT_S``
   (at most :data:`CONNECT_TIMEOUT_CAP_S`), whatever ``TEMPORALITY_NATS_MAX_RECONNECT_ATTEMPTS`` says (the
   service's default, -1, retries forever: a rebuild against a stopped server hung and never said so). No
   answer: exit 1, *nothing changed*.
2. **Check the events stream** (``TEMPORALITY_EVENTS``): it must exist and still hold every event ever stored in
   it -- its first sequence is 1, no message deleted from inside it (``num_deleted`` 0), and its last sequence is
   not below the highest stream sequence the database recorded (a stream deleted and made again starts at 1).
   Otherwise what only the database still has would be lost: exit 1, *nothing changed*, unless ``--accept-loss``
   (then the rebuild keeps only what the stream still retains, and says so in its log).
3. **Delete the journal's durable consumer**, *then*
4. **drop and re-create the tables** -- drop, migrations to the newest revision, the commit counter set after the
   last position handed out before -- in **one transaction** (PostgreSQL's DDL is transactional; on SQLite the
   transaction is opened before the first ``DROP``, so the DDL is inside it too), and log the schema revision.

Why this order: the next journal start creates the durable consumer again only when it is missing, with deliver
policy *all*, and records into whatever tables it finds (creating them if missing). So

* a failure (or a kill) before step 3 leaves both as they were: nothing changed;
* between 3 and 4 the consumer is gone and the tables are untouched: the next start replays the *whole* stream
  into them; ingest is idempotent by event id, so nothing is doubled and nothing lost (but the rows were not
  rebuilt: run the rebuild again for that);
* inside 4 the transaction is rolled back: as between 3 and 4;
* after 4: the intended state, empty tables and a full replay.

The other order (tables first, as before) emptied the database and then, with the consumer left at the stream's
end, the next start replayed nothing: the journal stayed empty for good.

Same environment as the service (``TEMPORALITY_DATABASE_URL``, ``TEMPORALITY_NATS_*``). Exit 0 when done, 2 for
bad settings, 1 when NATS or the database fails or the stream would lose events (the log line
``journal.rebuild_failed`` or ``journal.rebuild_refused`` says which and what changed).

``TEMPORALITY_TEST_REBUILD_CRASH_AT`` is for the tests only (never set it): ``consumer_deleted`` or
``tables_dropped`` kills the process with ``SIGKILL`` at that point, to show what the next start does then.
"""

from __future__ import annotations

import os
import re
import signal
from contextlib import AsyncExitStack

import structlog
from nats.js.api import StreamInfo
from nats.js.errors import NotFoundError
from pydantic import ValidationError
from sqlalchemy import text

from temporality_bus import Bus, NatsSettings
from temporality_journal.database import Database
from temporality_journal.models import EVENTS_TABLE
from temporality_journal.settings import Settings
from temporality_protocol.catalog import CONSUMERS, EVENTS_STREAM
from temporality_service import LogSettings, configure_logging

__all__ = [
    "ACCEPT_LOSS",
    "CONNECT_TIMEOUT_CAP_S",
    "RebuildRefused",
    "delete_durable",
    "main",
    "rebuild",
    "replay_into_empty",
    "stream_loss",
]

log = structlog.get_logger(__name__)

#: The argument that lets a rebuild go on although the events stream no longer holds every event.
ACCEPT_LOSS = "--accept-loss"
#: The longest one connect try to NATS may take (``TEMPORALITY_NATS_CONNECT_TIMEOUT_S`` when shorter).
CONNECT_TIMEOUT_CAP_S = 3.0
#: Test-only: where to ``SIGKILL`` the process (see the module docstring).
_CRASH_AT = "TEMPORALITY_TEST_REBUILD_CRASH_AT"


class RebuildRefused(Exception):
    """The rebuild stopped before it changed anything (the message says why and what to do)."""


def _crash_point(name: str) -> None:
    if os.environ.get(_CRASH_AT) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _shown(url: str) -> str:
    """The server URLs without user and password (the embedded stack puts them into the URL)."""
    return re.sub(r"//[^@/,]*@", "//", url)


def bounded(settings: NatsSettings) -> NatsSettings:
    """``settings`` with a first connect that gives up: 2 tries per server, each at most
    :data:`CONNECT_TIMEOUT_CAP_S`, 1 s apart at most."""
    return settings.model_copy(
        update={
            "max_reconnect_attempts": 1,
            "connect_timeout_s": min(settings.connect_timeout_s, CONNECT_TIMEOUT_CAP_S),
            "reconnect_wait_s": min(settings.reconnect_wait_s, 1.0),
        }
    )


def stream_loss(info: StreamInfo | None, database_max_seq: int) -> str | None:
    """Why the events stream no longer holds every event the database may have (``None``: it does)."""
    if info is None:
        return f"the events stream {EVENTS_STREAM.name} does not exist on this NATS server"
    state = info.state
    if state.first_seq > 1:
        return (
            f"the events stream {EVENTS_STREAM.name} starts at sequence {state.first_seq}: the events before it were "
            "removed (max_age, limits or a purge)"
        )
    if state.num_deleted:
        return f"{state.num_deleted} events were deleted from inside the events stream {EVENTS_STREAM.name}"
    if database_max_seq > state.last_seq:
        return (
            f"the database recorded stream sequence {database_max_seq} but the events stream {EVENTS_STREAM.name} "
            f"ends at {state.last_seq} (the stream was deleted and made again?)"
        )
    return None


async def delete_durable(bus: Bus) -> bool:
    """Delete the journal's durable consumer (whether it existed): the next consumer start creates it again with
    deliver policy *all*, so the journal records the events stream from its first message (ingest is idempotent
    by event id). The rebuild's step 3, and :func:`replay_into_empty`'s."""
    try:
        await bus.js.delete_consumer(EVENTS_STREAM.name, CONSUMERS["journal"].durable)
    except NotFoundError:
        return False
    return True


async def replay_into_empty(bus: Bus, database: Database) -> bool:
    """At a journal start, before its consumer starts: when the read model never recorded anything (no commit
    position handed out: a new database, or one lost -- a deleted ``journal.db``, the chart's SQLite in an
    ``emptyDir`` after the pod was replaced) while the durable consumer had acknowledged events, delete the
    durable so the consumer replays the stream from its first message, as after a rebuild; without this the
    journal resumed where the durable was and missed all history, silently. Logs the warning
    ``journal.replaying_stream`` (and ``journal.replay_incomplete`` with how many events the stream no longer
    holds, its limits having removed them). A purge by retention keeps the commit counter, so it never triggers
    this; a fresh install has no durable (or one that acknowledged nothing): nothing to do. Replicas decide one
    at a time (:meth:`Database.serialised`): a second one finds the durable gone, or new, or the first one's
    events recorded. ``True`` when it deleted the durable."""
    durable = CONSUMERS["journal"].durable
    async with database.serialised():
        if await database.last_position() > 0:
            return False
        try:
            consumer = await bus.js.consumer_info(EVENTS_STREAM.name, durable)
        except NotFoundError:
            return False
        acknowledged = consumer.ack_floor.stream_seq if consumer.ack_floor is not None else 0
        if not acknowledged:
            return False
        try:
            info: StreamInfo | None = await bus.js.stream_info(EVENTS_STREAM.name)
        except Exception as exc:  # only for the count of what is gone: the replay goes on without it
            log.warning("journal.replay_stream_unknown", error=repr(exc))
            info = None
        log.warning(
            "journal.replaying_stream",
            consumer=durable,
            acknowledged_up_to=acknowledged,
            detail=f"the journal database holds no events but its durable consumer had acknowledged the events "
            f"stream up to sequence {acknowledged} (the database was lost or replaced): recording the stream again "
            "from its first message (idempotent by event id)",
        )
        if info is not None:
            gone = info.state.first_seq - 1 + (info.state.num_deleted or 0)
            if gone > 0:
                log.warning(
                    "journal.replay_incomplete",
                    missing_events=gone,
                    stream_first_seq=info.state.first_seq,
                    detail=f"the events stream {EVENTS_STREAM.name} no longer holds {gone} of its events (max_age, "
                    "limits or a purge removed them): the journal cannot get those back from it; restore the "
                    "database from a backup for them (docs/operations.md, Backup and restore)",
                )
        return await delete_durable(bus)


async def _max_stream_seq(database: Database) -> int:
    async with database.engine.connect() as conn:
        value = (await conn.execute(text(f"SELECT MAX(stream_seq) FROM {EVENTS_TABLE.name}"))).scalar()
    return int(value or 0)


async def rebuild(settings: Settings, *, accept_loss: bool = False) -> None:
    """Connect to NATS, check the stream, delete the journal's durable consumer, then drop and re-create the
    read model (see the module docstring). Raises :class:`RebuildRefused` when nothing was changed."""
    durable = CONSUMERS["journal"].durable
    shown = _shown(settings.nats.url)
    async with AsyncExitStack() as stack:
        try:
            bus = await stack.enter_async_context(Bus.connect(bounded(settings.nats), name="journal-rebuild"))
        except Exception as exc:
            raise RebuildRefused(
                f"NATS at {shown} did not answer ({exc!r}): start nats-server (with `temporality up`: run "
                "`temporality up --rebuild-journal` instead, see docs/journal.md) and run the rebuild again; "
                "nothing was changed"
            ) from exc
        try:
            info: StreamInfo | None = await bus.js.stream_info(EVENTS_STREAM.name)
        except NotFoundError:
            info = None
        database = await stack.enter_async_context(
            Database.open(settings.database_url, settings.database_tls(), settings.database_durability())
        )
        last = await database.last_position()
        loss = stream_loss(info, await _max_stream_seq(database))
        if loss is not None and not accept_loss:
            raise RebuildRefused(
                f"{loss}; a rebuild would lose what only the database still has. Nothing was changed. Run "
                f"`temporality-journal rebuild {ACCEPT_LOSS}` to rebuild from what the stream retains"
            )
        if loss is not None:
            log.warning("journal.rebuild_accepting_loss", reason=loss)
        deleted = await delete_durable(bus)
        log.info("journal.rebuild_consumer_deleted", consumer=durable, existed=deleted)
        _crash_point("consumer_deleted")
        await database.reset_read_model(last, before_commit=lambda: _crash_point("tables_dropped"))
        revision = await database.revision()
    log.info(
        "journal.rebuild_ready",
        consumer=durable,
        consumer_deleted=deleted,
        positions_after=last,
        revision=revision,
        stream_first_seq=info.state.first_seq if info is not None else None,
        stream_last_seq=info.state.last_seq if info is not None else None,
        next_step="start the journal",
    )


async def main(*, accept_loss: bool = False) -> int:
    try:
        settings = Settings()
    except ValidationError as exc:
        configure_logging(LogSettings.model_construct(level="info", format="json"), service="journal")
        log.error("settings.invalid", error=str(exc))
        return 2
    configure_logging(settings.log, service="journal")
    try:
        await rebuild(settings, accept_loss=accept_loss)
    except RebuildRefused as exc:
        log.error("journal.rebuild_refused", error=str(exc))
        return 1
    except Exception as exc:
        log.error(
            "journal.rebuild_failed",
            error=repr(exc),
            detail="the tables are replaced in one transaction: they are as before, or rebuilt; the next start "
            "replays the stream if the consumer was deleted (see the log line journal.rebuild_consumer_deleted)",
        )
        return 1
    return 0
