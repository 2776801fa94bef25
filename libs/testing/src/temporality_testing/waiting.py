"""Settle windows: a condition that already holds must go on holding for a bounded while.

The other half of waiting on a condition (``tests/e2e_support.eventually``, ``EventLog.wait_for``): an
assertion that "nothing more happens" (still one delivery, still one event) is checked first, so it
cannot pass vacuously, and then polled over a bounded window instead of being read once.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

__all__ = ["stays"]


async def stays(
    check: Callable[[], Awaitable[bool] | bool],
    *,
    settle_s: float = 2.0,
    interval_s: float = 0.1,
    what: str = "condition",
) -> None:
    """``check`` (sync or async) holds now and keeps holding for ``settle_s``; AssertionError as soon as it does not."""
    loop = asyncio.get_running_loop()
    until = loop.time() + settle_s
    while True:
        held = check()
        if inspect.isawaitable(held):
            held = await held
        if not held:
            raise AssertionError(f"{what} stopped holding within the {settle_s}s settle window")
        if loop.time() >= until:
            return
        await asyncio.sleep(interval_s)
