"""``temporality-trigger-gateway``: settings → logging → triggers → connect → serve → drain."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Iterator

import structlog
import uvicorn

from temporality_bus import Bus, configure_logging, mark_ready, stop_on_signals
from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS
from temporality_trigger_gateway.api import create_app
from temporality_trigger_gateway.errors import TriggerConfigError
from temporality_trigger_gateway.settings import Settings
from temporality_trigger_gateway.triggers import load_triggers

__all__ = ["NAME", "main", "run"]

NAME = "trigger-gateway"
log = structlog.get_logger(__name__)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers (the process's stop event owns SIGTERM/SIGINT) and with a
    ``listening`` event set once the sockets accept connections."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.listening.set()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


async def main() -> None:
    settings = Settings()
    configure_logging(settings.log, service=NAME)
    try:
        triggers = load_triggers(settings.triggers_file)
    except TriggerConfigError as exc:
        log.error("triggers.invalid", error=str(exc))
        raise SystemExit(2) from None
    async with Bus.connect(settings.nats, name=NAME) as bus:
        await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
        stop = stop_on_signals()
        app = create_app(settings, bus, triggers)
        server = _Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off"))
        sock = _bind(settings.host, settings.port)
        host, port = sock.getsockname()[:2]
        async with asyncio.TaskGroup() as tg:
            serving = tg.create_task(server.serve(sockets=[sock]))
            listening = tg.create_task(server.listening.wait())
            await asyncio.wait({serving, listening}, return_when=asyncio.FIRST_COMPLETED)
            if server.listening.is_set():
                log.info(
                    "gateway.serving", url=f"http://{host}:{port}", hooks=f"http://{host}:{port}/hooks/<trigger_id>"
                )
                mark_ready(settings.process.ready_file)
                stopping = tg.create_task(stop.wait())
                await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
            listening.cancel()
            server.should_exit = True
    log.info("gateway.stopped")


def run() -> None:
    try:
        asyncio.run(main())
    except KeyboardInterrupt:  # pragma: no cover - SIGINT before the handlers were installed
        sys.exit(130)


if __name__ == "__main__":
    run()
