"""``temporality-journal``: the recorder consumer and the run/trajectory API, started by the service runtime.

``configure`` checks the database URL and reads the role tokens (``TEMPORALITY_API_TOKENS_FILE``) and, with
OIDC sign-in configured, its secret files (:mod:`temporality_journal.signin`): an unusable URL or file is a
configuration error (exit 2) before anything connects.

``setup`` opens one shared HTTP client to the trigger-gateway when ``TEMPORALITY_JOURNAL_GATEWAY_URL`` is set
(closed with the other resources): the console's ``/gateway/`` proxy (:mod:`temporality_journal.gateway`);
likewise one to human-interaction when ``TEMPORALITY_JOURNAL_HUMAN_URL`` is set: the ``/human/`` inbox proxy
(:mod:`temporality_journal.human`).

``temporality-journal rebuild`` (``python -m temporality_journal rebuild``) drops the read model and
makes the next start replay the stream from the beginning (``rebuild --accept-loss`` also when the stream no
longer holds every event): :mod:`temporality_journal.rebuild`. ``temporality-journal migrations`` lists the
schema revisions and the database's; ``temporality-journal downgrade <revision>`` takes the schema back to an
older journal's revision before a rollback: :mod:`temporality_journal.schema`.

A database a newer journal migrated (a revision this one does not know) stops the start with exit 2 and a
``config.invalid`` line naming the downgrade to run (:class:`temporality_journal.database.SchemaTooNew`).
A start on a read model that never recorded anything while the durable consumer had acknowledged events (a
lost or new database) replays the stream from its first message: :func:`temporality_journal.rebuild.replay_into_empty`.

In the service's own process the runtime freezes what the start made out of the cyclic garbage collector once
``setup`` is done (``temporality_service.runtime.run_until``'s ``freeze_heap``): full collections under ingest
no longer walk it (docs/journal.md, *Ingest rate*).
"""

from __future__ import annotations

import functools
import gc
import sys

from sqlalchemy.exc import ArgumentError

from temporality_journal.api import create_app
from temporality_journal.backlog import Backlog
from temporality_journal.database import Database, SchemaTooNew, connect_args
from temporality_journal.gateway import gateway_client
from temporality_journal.human import human_client
from temporality_journal.metrics import JournalMetrics
from temporality_journal.rebuild import ACCEPT_LOSS, replay_into_empty
from temporality_journal.rebuild import main as rebuild_main
from temporality_journal.recorder import Recorder
from temporality_journal.retention import Retention
from temporality_journal.schema import downgrade_main, migrations_main
from temporality_journal.settings import Settings
from temporality_journal.signin import SignIn, SignInConfigError
from temporality_journal.tail import Changes, Tail
from temporality_protocol.catalog import SERVICES
from temporality_service import ApiAuth, ConfigError, Runtime, Setup, TokenFileError, serve
from temporality_service.cli import check_arguments
from temporality_service.runtime import run as run_loop

__all__ = ["SPEC", "configure", "run"]

SPEC = SERVICES["journal"]


def configure(settings: Settings) -> Setup[Settings]:
    try:
        connect_args(settings.database_url, settings.database_tls())
    except (ValueError, ArgumentError) as exc:
        raise ConfigError(f"TEMPORALITY_DATABASE_URL / TEMPORALITY_DATABASE_SSL*: {exc}") from exc
    try:
        auth = ApiAuth.from_settings(settings.api)
    except TokenFileError as exc:
        raise ConfigError(f"TEMPORALITY_API_TOKENS_FILE: {exc}") from exc
    try:
        signin = SignIn.from_settings(settings)  # None without OIDC and password sign-in
    except SignInConfigError as exc:
        raise ConfigError(str(exc)) from exc

    async def setup(rt: Runtime[Settings]) -> None:
        try:
            database = await rt.resources.enter_async_context(
                Database.open(rt.settings.database_url, rt.settings.database_tls(), rt.settings.database_durability())
            )
        except SchemaTooNew as exc:  # a newer journal migrated it: say how to roll back (exit 2)
            raise ConfigError(str(exc)) from exc
        # a lost (or new) database while the durable consumer had moved on: replay the stream from its start
        await replay_into_empty(rt.bus, database)
        changes = Changes()  # the recorder wakes the live tail once per committed batch
        # runs by state (max() across replicas), runs finished: see .metrics; none with metrics off
        runs = JournalMetrics(rt.metrics) if rt.metrics is not None else None
        recorder = Recorder(database, on_commit=changes.notify, on_finished=runs.finished if runs else None)
        rt.consumer(
            "journal",
            handler=recorder.handle,
            batch_handler=recorder.handle_batch,
            batch_size=rt.settings.batch_size,
            batch_linger_s=rt.settings.batch_linger_ms / 1000,
        )
        # Open SSE streams end once the server stops accepting (SIGTERM), instead of holding up the drain.
        tail = Tail(database, changes, stopping=lambda: rt.server is not None and rt.server.should_exit)
        client = gateway_client(rt.settings)  # the console's way to the trigger admin API
        gateway = await rt.resources.enter_async_context(client) if client is not None else None
        inbox_client = human_client(rt.settings)  # the console's way to the web inbox
        human = await rt.resources.enter_async_context(inbox_client) if inbox_client is not None else None
        # refused API access into the audit trail, rate-limited: the runtime's, as every service's
        rt.http(create_app(rt.settings, database, rt.bus, auth, tail, gateway, human, rt.access_audit, signin))
        rt.ready_check("database", database.ping)
        # how far the recorder is behind the bus, for the console's banner (cached; never waits for NATS)
        rt.readiness.add_field("backlog", Backlog(rt.bus, rt.settings.behind_warn_events).report)
        if rt.metrics is not None and runs is not None:
            rt.metrics.refresh_every("runs by state", functools.partial(runs.refresh, database))
        days, audit_days = rt.settings.retention_days, rt.settings.audit_retention_days
        if days > 0 or audit_days > 0:  # 0 and 0: keep everything, no purge
            await rt.resources.enter_async_context(Retention(database, days, audit_days=audit_days).running())

    return setup


COMMANDS = {
    "rebuild": "drop the read model and rebuild it by replaying the streams (docs/journal.md), then exit; "
    f"refused while the stream misses events unless given {ACCEPT_LOSS} (rebuild {ACCEPT_LOSS})",
    "migrations": "list the schema revisions this journal knows, what a downgrade below each loses, and the "
    "database's revision, then exit",
    "downgrade": "downgrade REVISION: take the database's schema down to an older journal's revision before "
    "rolling back to it (every journal replica stopped; docs/operations.md), then exit",
}


#: The cyclic collector's thresholds in the journal's own process (Python's default: 700, 10, 10). A young collection
#: walks every container object allocated since the last one and still alive: while a backlog drains, the decoded
#: envelopes of the batch being recorded and of the one prefetched. At the default the collector ran ~145 young and
#: ~13 older collections per 10,000 events, ~3 us of CPU per event (~7 % of the journal's; ``gc.callbacks`` under
#: bench/journal.py, batches of 1,000); at 10,000 still 9-10 collections of ~2-3 ms each, a batch's objects alive
#: each time; at 50,000 none: the batches are freed (by reference counting) before that many pile up. Garbage in
#: reference cycles is found the same, later (every 50,000 container allocations more than freed).
GC_THRESHOLDS = (50_000, 10, 10)


def run() -> None:
    args = sys.argv[1:]
    if args == ["rebuild", ACCEPT_LOSS]:  # the commands with an argument (the service CLI takes none)
        sys.exit(run_loop(rebuild_main(accept_loss=True)))
    if len(args) == 2 and args[0] == "downgrade":
        if args[1] in ("-h", "--help"):
            sys.stdout.write(f"usage: temporality-journal downgrade REVISION\n\n{COMMANDS['downgrade']}\n")
            sys.exit(0)
        if args[1].startswith("-"):  # an option, never a revision: nothing is opened
            sys.stderr.write(f"temporality-journal downgrade: {args[1]!r} is not a revision (no options)\n")
            sys.exit(2)
        sys.exit(run_loop(downgrade_main(args[1])))
    command = check_arguments(SPEC, Settings, commands=COMMANDS)
    if command == "rebuild":
        sys.exit(run_loop(rebuild_main()))
    if command == "migrations":
        sys.exit(run_loop(migrations_main()))
    if command == "downgrade":  # without its revision
        sys.stderr.write(
            "usage: temporality-journal downgrade REVISION (`temporality-journal migrations` lists them)\n"
        )
        sys.exit(2)
    gc.set_threshold(*GC_THRESHOLDS)  # this process only (the tests run the service in theirs through run_until)
    serve(SPEC, Settings, configure)


if __name__ == "__main__":
    run()
