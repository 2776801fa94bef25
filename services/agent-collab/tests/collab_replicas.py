"""agent-collab in-process through the runtime, as many replicas as a test starts (a helper, not a test module)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from temporality_agent_collab.__main__ import SPEC, configure
from temporality_agent_collab.settings import Settings
from temporality_bus import NatsSettings
from temporality_service import run_until

__all__ = ["StartCollab", "collab_replicas"]

#: ``await start(allow_file, **settings)``: one more agent-collab replica (that allow-list of external agents,
#: heartbeat grace 0, any other settings given), ready; returns its stop function.
StartCollab = Callable[..., Awaitable[Callable[[], Awaitable[None]]]]


@asynccontextmanager
async def collab_replicas(nats_settings: NatsSettings) -> AsyncIterator[StartCollab]:
    """Yields ``start``; every replica it started is stopped on exit."""
    tasks: list[tuple[asyncio.Event, asyncio.Task[None]]] = []

    async def start(allow_file: Path, **overrides: Any) -> Callable[[], Awaitable[None]]:
        settings = Settings(nats=nats_settings, external_agents_file=allow_file, heartbeat_grace_s=0, **overrides)
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(run_until(SPEC, settings, configure(settings), stop, ready=ready))
        tasks.append((stop, task))
        ready_wait = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait([task, ready_wait], timeout=10, return_when="FIRST_COMPLETED")
        ready_wait.cancel()
        if task in done:
            task.result()
        assert ready.is_set(), "agent-collab not ready within 10 s"

        async def stopped() -> None:
            stop.set()
            await asyncio.wait_for(task, 15)

        return stopped

    try:
        yield start
    finally:
        for stop, _ in tasks:
            stop.set()
        for _, task in tasks:
            await asyncio.wait_for(task, 15)
