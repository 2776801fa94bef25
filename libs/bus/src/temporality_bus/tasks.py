"""Ending background tasks for sure on Python 3.11.

``asyncio.wait_for`` before Python 3.12 drops a cancellation that lands as the awaited future completes
(CPython gh-86296): the cancelled task gets the result instead of ``CancelledError`` and goes on. nats-py waits
that way on every request reply and watch read, so a service's background loop cancelled once (a lease's
renewals, a KV watch's follow) could go on running, and whoever awaited its end hung.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["cancel_and_wait"]

#: How long a cancelled task gets to end before it is cancelled again.
RECANCEL_S = 0.1


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait for its end, cancelling again every :data:`RECANCEL_S` until it ends; its
    ``CancelledError`` is swallowed, any other exception it ended with is raised."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=RECANCEL_S)
    with contextlib.suppress(asyncio.CancelledError):
        await task
