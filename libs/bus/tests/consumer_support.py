"""What the consumer tests share: a durable on ``run.failed``, its events, a runner started and stopped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporality_bus import Bus, Consumer
from temporality_protocol import Envelope, RunFailed, make_event
from temporality_protocol.catalog import EVENTS_STREAM, ConsumerSpec, subject_for


def failed_spec(durable: str, *, max_deliver: int = 8) -> ConsumerSpec:
    """A test durable on ``run.failed`` events, redelivering after 0.1 s."""
    return ConsumerSpec(
        durable, EVENTS_STREAM.name, (subject_for("run.failed"),), "test", max_deliver=max_deliver, backoff_s=(0.1,)
    )


def failed(run_id: str) -> Envelope:
    return make_event(RunFailed(run_id=run_id, reason="r", error="e"), source="/test", id=f"evt-{run_id}")


async def publish_failed(bus: Bus, prefix: str, count: int) -> list[str]:
    """``count`` ``run.failed`` events (runs ``<prefix>0`` ...), published in order: their event ids."""
    ids = []
    for i in range(count):
        event = failed(f"{prefix}{i}")
        await bus.publish(event)
        ids.append(event.id)
    return ids


@asynccontextmanager
async def running(consumer: Consumer, stop_within_s: float = 15) -> AsyncIterator[None]:
    """The consumer's runner for the block; stopped (gracefully) after it."""
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, stop_within_s)
