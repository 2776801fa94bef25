"""Cross-service fixtures (the stacks themselves: :func:`e2e_support.make_stack`, started by each module; the
traced stack the tracing scenarios share: ``tracing_support``, defined there and registered here once, so that
one stack serves every module)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from tracing_support import session_http_fixture, traced_stack_fixture

__all__ = ["http", "session_http_fixture", "traced_stack_fixture"]


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client
