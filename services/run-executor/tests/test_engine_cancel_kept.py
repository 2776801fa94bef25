"""A handler cancelled during a wait that swallowed the cancellation still stops (``engine._cancelled_meanwhile``).

The driver awaits its single read or batch directly (no ``asyncio.gather``, which remembers a cancellation its child
dropped); a bus request can drop one that lands with its reply (``asyncio.wait_for`` on Python 3.11)."""

from __future__ import annotations

import asyncio

import pytest

from temporality_run_executor.engine import _cancelled_meanwhile


async def test_a_cancellation_a_wait_swallowed_is_raised_after_it() -> None:
    went_on = False

    async def handler() -> None:
        nonlocal went_on
        this = asyncio.current_task()
        assert this is not None
        this.cancel()
        try:
            await asyncio.sleep(0)  # the wait the cancel lands in, which returns anyway (as a dropped one does)
        except asyncio.CancelledError:
            pass
        _cancelled_meanwhile()
        went_on = True

    task = asyncio.create_task(handler())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not went_on


async def test_no_cancellation_no_raise() -> None:
    async def handler() -> str:
        await asyncio.sleep(0)
        _cancelled_meanwhile()
        return "went on"

    assert await asyncio.create_task(handler()) == "went on"
