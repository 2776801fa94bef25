"""``temporality-agent-collab``: the projector consumer and the get_collaborators responder in one process.

settings -> logging -> connect -> ensure layout -> responder + consumer -> ready -> (SIGTERM) ->
unsubscribe the responder -> stop the consumer -> drain the connection.
"""

from __future__ import annotations

import asyncio

import structlog

from temporality_agent_collab.projector import Projector
from temporality_agent_collab.rpc import CollaboratorsResponder
from temporality_agent_collab.settings import Settings
from temporality_bus import Bus, Consumer, configure_logging, mark_ready, stop_on_signals
from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS, CONSUMERS

__all__ = ["NAME", "main", "run", "serve"]

NAME = "agent-collab"
CONSUMER = CONSUMERS["agent-collab-runs"]
#: Pause before re-binding the consumer after a fetch timeout escaped it.

log = structlog.get_logger(__name__)


async def serve(bus: Bus, settings: Settings, stop: asyncio.Event, *, ready: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set on an already-connected bus whose layout is ensured.

    Once the responder listens and the consumer runs, writes the ready file and sets ``ready``.
    """
    projector = await Projector.open(bus)
    responder = await CollaboratorsResponder.open(bus)
    consumer = Consumer(bus, CONSUMER, handler=projector.handle, max_inflight=settings.max_inflight)
    consumer_stop = asyncio.Event()

    async def _shutdown() -> None:
        await stop.wait()
        log.info("collab.stopping")
        await responder.stop(settings.responder_drain_s)  # first: no new requests reach this replica
        consumer_stop.set()

    await bus.ensure_consumer(CONSUMER)
    await responder.start()
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(consumer.run(consumer_stop))
            tg.create_task(_shutdown())
            mark_ready(settings.process.ready_file)
            if ready is not None:
                ready.set()
            log.info("collab.ready")
    finally:
        await responder.stop(settings.responder_drain_s)


async def main() -> None:
    settings = Settings()
    configure_logging(settings.log, service=NAME)
    async with Bus.connect(settings.nats, name=NAME) as bus:
        await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
        await serve(bus, settings, stop_on_signals())
    log.info("collab.stopped")


def run() -> None:
    asyncio.run(main())


if __name__ == "__main__":
    run()
