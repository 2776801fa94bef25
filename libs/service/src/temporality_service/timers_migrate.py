"""``python -m temporality_service.timers_migrate``: move an older release's timers into the per-service streams.

Upgrading from a release that kept every service's timers in one ``TEMPORALITY_TIMERS`` stream
(:func:`temporality_bus.timers.migrate_legacy_timers` says how, and why it is safe to run again or concurrently).
It connects with ``TEMPORALITY_NATS_*`` (URL, user, password, TLS, stream replicas: the per-service streams it
creates get those), as the NATS user ``timers-migrate``
(:func:`temporality_protocol.permissions.timers_migration_permissions`: exactly what the migration needs) or any
user with full access. Every service image holds it: the chart's migration Job and compose's one-shot
``timers-migrate`` run it in one of them; ``temporality timers-migrate`` is the same.

Exit 0 when the timers were moved or there was nothing to move, 1 when it failed (said on standard output;
nothing is lost: run it again).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
from typing import TextIO

import nats.errors
from pydantic import ValidationError

from temporality_bus import Bus, NatsSettings
from temporality_bus.errors import TransientError
from temporality_bus.timers import LegacyMigration, migrate_legacy_timers
from temporality_protocol.permissions import TIMERS_MIGRATION_USER, service_inbox
from temporality_service.logs import configure_logging
from temporality_service.settings import LogSettings

__all__ = ["CONNECT_ATTEMPTS", "main", "migrate", "run"]

#: Connection attempts (``reconnect_wait_s`` apart) before it gives up: a server still starting is waited for
#: a while, a refused password does not hang the Job.
CONNECT_ATTEMPTS = 30


def migrate(settings: NatsSettings) -> LegacyMigration | None:
    """Run :func:`~temporality_bus.timers.migrate_legacy_timers` as ``settings``' user; ``None`` when there was
    nothing to move. Raises :class:`TransientError` when it could not connect or a step failed. Blocking: it runs
    its own event loop in a thread (callable from a running loop)."""
    if settings.max_reconnect_attempts < 0:
        settings = settings.model_copy(update={"max_reconnect_attempts": CONNECT_ATTEMPTS})

    async def moved() -> LegacyMigration | None:
        try:
            # its replies below _INBOX.timers-migrate, the only inbox its user may read; not the user name's default:
            # with a credentials or nkey seed file there is no user name (the inbox would be plain _INBOX)
            inbox = service_inbox(TIMERS_MIGRATION_USER)
            async with Bus.connect(settings, name=TIMERS_MIGRATION_USER, inbox_prefix=inbox) as bus:
                return await migrate_legacy_timers(bus)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise TransientError(
                f"cannot connect to NATS at {settings.url} as {settings.user} (is it up, are the user and password "
                f"the server's?): {exc!r}"
            ) from exc

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, moved()).result()


def run(settings: NatsSettings, stdout: TextIO | None = None) -> int:
    """Migrate (:func:`migrate`) and say what was done (on ``stdout``, default ``sys.stdout``): 0 when moved or
    nothing to move, 1 when it failed."""
    stdout = stdout or sys.stdout
    try:
        report = migrate(settings)
    except TransientError as exc:
        stdout.write(f"error: {exc}\n")
        return 1
    if report is None:
        stdout.write("nothing to migrate: no TEMPORALITY_TIMERS stream of an older release\n")
    else:
        stdout.write(
            f"migrated TEMPORALITY_TIMERS: {report.schedules} schedules armed again, {report.firings} unconsumed "
            f"firings fired again, {report.skipped} skipped (a newer message on their subject); the stream is "
            "deleted\n"
        )
    return 0


def main(argv: list[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args:
        (stderr or sys.stderr).write(
            "usage: python -m temporality_service.timers_migrate  (settings: TEMPORALITY_NATS_*)\n"
        )
        return 2
    configure_logging(LogSettings(), service=TIMERS_MIGRATION_USER)  # TEMPORALITY_LOG_LEVEL, _FORMAT; on stderr
    try:
        settings = NatsSettings()
    except ValidationError as exc:  # e.g. a credentials file and a password both set
        (stderr or sys.stderr).write(f"error: NATS settings: {exc.errors()[0]['msg']}\n")
        return 2
    return run(settings, stdout)


if __name__ == "__main__":
    sys.exit(main())
