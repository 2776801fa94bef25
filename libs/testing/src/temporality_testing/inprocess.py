"""Services run in the test's own event loop, started and stopped with bounds.

A service's main here is a callable ``main(stop, ready)`` that serves until ``stop`` is set and sets
``ready`` once it serves — ``temporality_service.run_until`` with its spec, settings and set-up bound::

    def main(stop: asyncio.Event, ready: asyncio.Event) -> Awaitable[None]:
        return run_until(SPEC, settings, configure(settings), stop, ready=ready)

    async with serving(("run-executor", main)):
        ...  # the service is ready here; it is stopped (and its error, if any, raised) on the way out
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

__all__ = ["Main", "serving"]

#: ``main(stop, ready)``: serve until ``stop``; set ``ready`` once serving.
Main = Callable[[asyncio.Event, asyncio.Event], Awaitable[None]]


@asynccontextmanager
async def serving(
    *mains: tuple[str, Main], ready_within_s: float = 60.0, stop_within_s: float = 30.0
) -> AsyncIterator[None]:
    """Start each ``(name, main)`` in turn, each ready before the next starts; yield; then stop them all.

    A main that ends before it is ready raises its error here (AssertionError naming it if it ended
    quietly, or was not ready within ``ready_within_s``). On the way out every main still running is
    told to stop and awaited (bounded by ``stop_within_s``): an error it ends with is raised.
    """
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        for name, main in mains:
            ready = asyncio.Event()

            async def run(main: Main = main, ready: asyncio.Event = ready) -> None:
                await main(stop, ready)

            task = asyncio.create_task(run(), name=f"serving {name}")
            waiting = asyncio.create_task(ready.wait())
            done, _ = await asyncio.wait([task, waiting], timeout=ready_within_s, return_when="FIRST_COMPLETED")
            waiting.cancel()
            if task in done:
                task.result()  # its error, if it failed to start
            else:
                tasks.append(task)
            assert ready.is_set(), f"{name} not ready within {ready_within_s} s"
        yield
    finally:
        stop.set()
        if tasks:
            await asyncio.wait_for(asyncio.gather(*tasks), stop_within_s)
