"""Executor "processes" for crash-injection tests (RUN-3, AP-7, AP-8): each has its own NATS connection,
engine and consumers, and a :class:`Crash` fault kills it at one point of the driver (the engine's test
seam ``crash_point``) the way kill -9 would: its connection closes at once, so nothing more is published,
acked or released (its lease stays behind), and a fresh process on the same bus and store takes over."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

import pytest
from executor_support import consumers_running, start_consumers

from temporality_bus import Bus, NatsSettings
from temporality_run_executor.agents import AgentCard, AgentDirectory
from temporality_run_executor.engine import Engine
from temporality_run_executor.providers.factory import ProviderCache
from temporality_run_executor.tools import Tool


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
    crash: Crash | None = None

    async def end(self) -> None:
        """Stop it: gracefully if it is alive; a killed one's work is cancelled, as kill -9 ends it (on its
        closed connection a request in flight would otherwise wait out its full timeout, reaching nothing)."""
        self.stop.set()
        if self.crash is not None and self.crash.crashed.is_set():
            pending = set(self.tasks)
            while pending:  # a consumer first ends its fetch, then waits for its handlers: cancel until done
                _, pending = await asyncio.wait(pending, timeout=0.1)
                for task in pending:
                    task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.stack.aclose()
        await self.cache.aclose()


#: The processes' ack wait, and so their lease: how long what a killed process held (its unacked messages,
#: its run's lease) stays behind before the next process takes over. Short, as the takeover is what the
#: crash tests wait for; the live process renews both every third of it.
TAKEOVER_S = 1.0


async def start_process(
    settings: NatsSettings,
    name: str,
    cards: Sequence[AgentCard],
    crash: Crash | None = None,
    card_tools: Mapping[str, list[Tool]] | None = None,
) -> Process:
    """An executor serving ``cards`` (their MCP tools: ``card_tools``) with fast retries (backoff 0.05, 0.1 s)
    and an ack wait and lease of :data:`TAKEOVER_S`, its consumers running."""
    stack = contextlib.AsyncExitStack()
    settings = settings.model_copy(update={"ack_wait_s": TAKEOVER_S})
    bus = await stack.enter_async_context(Bus.connect(settings, name=name))
    cache = ProviderCache()
    engine = await Engine.open(bus, AgentDirectory(list(cards)), cache, max_deliver=8, card_tools=card_tools)
    process = Process(engine, bus, stack, cache, crash=crash)
    if crash is not None:
        crash.bus = bus
        engine.crash_point = crash
    consumers, tasks = start_consumers(bus, engine, process.stop, max_deliver=8)
    process.tasks.extend(tasks)
    await consumers_running(consumers)
    return process


@pytest.fixture
async def processes() -> AsyncIterator[list[Process]]:
    """The processes a test starts (append them): each ended after the test, killed or not."""
    started: list[Process] = []
    yield started
    for process in started:
        await process.end()
