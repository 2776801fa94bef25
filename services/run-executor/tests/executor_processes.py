"""Executor "processes" for crash-injection tests (RUN-3, AP-7, AP-8): each has its own NATS connection,
engine and consumers, and a :class:`Crash` fault kills it at one point of the driver (the engine's test
seam ``crash_point``) the way kill -9 would: its connection closes at once, so nothing more is published,
acked or released (its lease stays behind), and a fresh process on the same bus and store takes over."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from temporality_bus import Bus, Consumer, NatsSettings
from temporality_protocol.catalog import CONSUMERS
from temporality_run_executor.agents import AgentCard, AgentDirectory
from temporality_run_executor.engine import Engine
from temporality_run_executor.providers.factory import ProviderCache


class ProcessKilled(Exception):
    """What the killed executor's handler ends with (its connection is already closed: nothing it does
    afterwards reaches the server)."""


@dataclass
class Crash:
    """The fault: at the ``nth`` time the driver passes ``point`` (counted once armed), the process dies."""

    point: str
    nth: int = 1
    armed: bool = True
    hits: int = 0
    bus: Bus | None = None
    crashed: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, point: str) -> None:
        if not self.armed or point != self.point or self.crashed.is_set():
            return
        self.hits += 1
        if self.hits < self.nth:
            return
        self.crashed.set()
        assert self.bus is not None
        await self.bus.nc.close()  # kill -9: no ack, no nak, no lease release, no further publish
        raise ProcessKilled(point)


@dataclass
class Process:
    """One executor process: a connection of its own, the engine, its four consumers."""

    engine: Engine
    bus: Bus
    stack: contextlib.AsyncExitStack
    cache: ProviderCache
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def end(self) -> None:
        """Stop it (gracefully if it is alive; a killed one's tasks just end)."""
        self.stop.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.stack.aclose()
        await self.cache.aclose()


async def start_process(
    settings: NatsSettings, name: str, cards: Sequence[AgentCard], crash: Crash | None = None
) -> Process:
    """An executor serving ``cards`` with fast retries (backoff 0.05, 0.1 s), its consumers running."""
    stack = contextlib.AsyncExitStack()
    bus = await stack.enter_async_context(Bus.connect(settings, name=name))
    cache = ProviderCache()
    engine = await Engine.open(bus, AgentDirectory(list(cards)), cache, max_deliver=8)
    process = Process(engine, bus, stack, cache)
    if crash is not None:
        crash.bus = bus
        engine.crash_point = crash
    consumers: list[Consumer] = []
    for durable, handler in (
        ("run-executor-requests", engine.on_run_requested),
        ("run-executor-human", engine.on_human_event),
        ("run-executor-agents", engine.on_agent_event),
    ):
        spec = dataclasses.replace(CONSUMERS[durable], max_deliver=8, backoff_s=(0.05, 0.1))
        consumers.append(Consumer(bus, spec, handler=handler, max_inflight=4, on_dead_letter=engine.on_dead_letter))
    watchdog = dataclasses.replace(CONSUMERS["run-executor-watchdog"], backoff_s=(0.05, 0.1))
    consumers.append(Consumer(bus, watchdog, raw_handler=engine.on_watchdog, max_inflight=4))
    process.tasks.extend(asyncio.create_task(c.run(process.stop)) for c in consumers)
    await asyncio.wait_for(asyncio.gather(*(c.running.wait() for c in consumers)), 30)
    return process
