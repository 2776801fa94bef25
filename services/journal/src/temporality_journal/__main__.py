"""``temporality-journal``: settings -> logging -> database -> bus -> consume + serve -> drain."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator

import structlog
import uvicorn

from temporality_bus import Bus, Consumer, configure_logging, mark_ready, stop_on_signals
from temporality_journal.api import create_app
from temporality_journal.database import Database
from temporality_journal.recorder import Recorder
from temporality_journal.settings import Settings
from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS, CONSUMERS

__all__ = ["NAME", "main", "run"]

NAME = "journal"
log = structlog.get_logger(__name__)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the process's stop event decides (``should_exit``)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def _serve(server: _Server, stop: asyncio.Event) -> None:
    serving = asyncio.create_task(server.serve())
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    server.should_exit = True
    await serving
    if not stop.is_set():  # the server ended by itself (e.g. the port was taken): stop everything
        raise RuntimeError("the HTTP server stopped unexpectedly")


async def _announce_ready(server: _Server, settings: Settings, stop: asyncio.Event) -> None:
    while not server.started:
        if stop.is_set():
            return
        await asyncio.sleep(0.05)  # uvicorn has no "started" event to await
    mark_ready(settings.process.ready_file)
    log.info("journal.ready", host=settings.host, port=settings.port)


async def main() -> None:
    settings = Settings()
    configure_logging(settings.log, service=NAME)
    stop = stop_on_signals()
    async with Database.open(settings.database_url) as database, Bus.connect(settings.nats, name=NAME) as bus:
        await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
        spec = CONSUMERS["journal"]
        await bus.ensure_consumer(spec)  # exists before we announce readiness
        consumer = Consumer(bus, spec, handler=Recorder(database).handle)
        app = create_app(settings, database)
        server = _Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None))
        async with asyncio.TaskGroup() as tg:  # one task fails -> all cancelled -> exit != 0
            tg.create_task(consumer.run(stop))
            tg.create_task(_serve(server, stop))
            tg.create_task(_announce_ready(server, settings, stop))
    log.info("journal.stopped")


def run() -> None:
    asyncio.run(main())


if __name__ == "__main__":
    run()
