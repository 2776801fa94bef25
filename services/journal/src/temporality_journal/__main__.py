"""``temporality-journal``: the recorder consumer and the run/trajectory API, started by the service runtime."""

from __future__ import annotations

from sqlalchemy.exc import ArgumentError

from temporality_journal.api import create_app
from temporality_journal.database import Database, async_url
from temporality_journal.recorder import Recorder
from temporality_journal.settings import Settings
from temporality_protocol.catalog import SERVICES
from temporality_service import ConfigError, Runtime, Setup, serve

__all__ = ["SPEC", "configure", "run"]

SPEC = SERVICES["journal"]


def configure(settings: Settings) -> Setup[Settings]:
    try:
        async_url(settings.database_url)
    except (ValueError, ArgumentError) as exc:
        raise ConfigError(f"TEMPORALITY_DATABASE_URL: {exc}") from exc

    async def setup(rt: Runtime[Settings]) -> None:
        database = await rt.resources.enter_async_context(Database.open(rt.settings.database_url))
        recorder = Recorder(database)
        rt.consumer(
            "journal",
            handler=recorder.handle,
            batch_handler=recorder.handle_batch,
            batch_size=rt.settings.batch_size,
        )
        rt.http(create_app(rt.settings, database))
        rt.ready_check("database", database.ping)

    return setup


def run() -> None:
    serve(SPEC, Settings, configure)


if __name__ == "__main__":
    run()
