"""Cross-service fixtures: the five services as separate processes over a real nats-server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import nats
import pytest
from e2e_support import make_stack

from temporality_embedded import Stack
from temporality_testing.events import EventLog


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = make_stack(tmp_path)
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client


@pytest.fixture
async def stack_events(stack: Stack) -> AsyncIterator[EventLog]:
    nc = await nats.connect(stack.nats.url)
    log = await EventLog(nc).start()
    try:
        yield log
    finally:
        await log.stop()
        await nc.drain()
