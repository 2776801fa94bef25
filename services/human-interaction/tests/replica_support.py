"""A human-interaction replica served in-process (the service's own ``configure``/``setup`` under the runtime, on
the test's nats-server), and its ``/metrics`` read as samples."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prometheus_client.parser import text_string_to_metric_families

from temporality_human_interaction import Settings
from temporality_human_interaction.__main__ import SPEC, configure
from temporality_service import Runtime, run_until

__all__ = ["Samples", "replica", "samples_of", "value_of"]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples_of(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value_of(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset({"service": SPEC.name, **labels}.items())), 0.0)


@asynccontextmanager
async def replica(settings: Settings) -> AsyncIterator[str]:
    """One human-interaction replica, served in-process until the block ends; yields its URL."""
    runtimes: list[Runtime[Settings]] = []
    setup = configure(settings)

    async def _setup(rt: Runtime[Settings]) -> None:
        await setup(rt)
        runtimes.append(rt)

    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run_until(SPEC, settings, _setup, stop, ready=ready))
    try:
        waiter = asyncio.ensure_future(ready.wait())
        await asyncio.wait({waiter, task}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            waiter.cancel()
            task.result()
        assert ready.is_set(), "human-interaction was not ready within 60 s"
        server = runtimes[0].server
        assert server is not None
        yield server.url
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
