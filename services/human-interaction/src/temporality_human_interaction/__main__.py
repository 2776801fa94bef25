"""``temporality-human-interaction``: settings -> logging -> directory -> connect -> adapters -> consume + serve.

One TaskGroup holds both consumers and the HTTP server: if any of them dies, the others are
cancelled and the process exits non-zero. SIGTERM/SIGINT set ``stop``: consumers finish their
message, uvicorn stops accepting, adapters shut down, the bus drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import structlog
import uvicorn

from temporality_bus import Bus, Consumer, configure_logging, mark_ready, stop_on_signals
from temporality_human_interaction.api import create_app
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.deadlines import DeadlineHandler
from temporality_human_interaction.directory import Directory, DirectoryError
from temporality_human_interaction.events import SERVICE
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.settings import Settings
from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS, CONSUMERS

__all__ = ["build_adapters", "main", "run"]

log = structlog.get_logger(__name__)

REQUESTS_CONSUMER = CONSUMERS["human-interaction-requests"]
DEADLINES_CONSUMER = CONSUMERS["human-interaction-deadlines"]


def build_adapters() -> list[ChannelAdapter]:
    """The transports this build ships. Matrix and Telegram join here when their adapters exist."""
    return [WebInboxAdapter()]


class _Server(uvicorn.Server):
    """uvicorn that leaves signals to us and says when it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # stop_on_signals owns SIGTERM/SIGINT; we set should_exit ourselves

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.listening.set()


async def _serve(server: _Server, stop: asyncio.Event) -> None:
    try:
        await server.serve()
    except SystemExit as exc:  # uvicorn exits the process when it cannot bind
        raise RuntimeError(f"the HTTP server failed to start (exit {exc.code})") from exc
    if not stop.is_set():
        raise RuntimeError("the HTTP server stopped on its own")


async def main() -> None:
    settings = Settings()
    configure_logging(settings.log, service=SERVICE)
    try:
        directory = Directory.from_yaml(settings.users_file)
    except DirectoryError as exc:
        log.error("directory.invalid", error=str(exc), file=str(settings.users_file))
        raise SystemExit(2) from exc
    log.info("directory.loaded", users=len(directory), file=str(settings.users_file))
    stop = stop_on_signals()

    async with Bus.connect(settings.nats, name=SERVICE) as bus, contextlib.AsyncExitStack() as adapters_stack:
        await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
        adapters: dict[str, ChannelAdapter] = {}
        for adapter in build_adapters():
            adapters[adapter.name] = await adapters_stack.enter_async_context(adapter)
        log.info("channels.ready", channels=sorted(n for n, a in adapters.items() if a.available))

        requests = RequestHandler(bus, directory, adapters)
        deadlines = DeadlineHandler(bus)
        for spec in (REQUESTS_CONSUMER, DEADLINES_CONSUMER):  # durable before we say ready: nothing is missed
            await bus.ensure_consumer(spec)
        server = _Server(
            uvicorn.Config(
                create_app(settings, bus, directory), host=settings.host, port=settings.port, log_config=None
            )
        )
        async with asyncio.TaskGroup() as tg:
            tg.create_task(
                Consumer(bus, REQUESTS_CONSUMER, handler=requests.handle, max_inflight=settings.max_inflight).run(stop)
            )
            tg.create_task(Consumer(bus, DEADLINES_CONSUMER, raw_handler=deadlines.handle).run(stop))
            tg.create_task(_serve(server, stop))
            await server.listening.wait()
            mark_ready(settings.process.ready_file)
            log.info("service.ready", host=settings.host, port=settings.port)
            await stop.wait()
            log.info("service.stopping")
            server.should_exit = True


def run() -> None:
    asyncio.run(main())


if __name__ == "__main__":
    run()
