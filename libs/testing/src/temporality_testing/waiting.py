"""Waiting on another process's view, both ways, always bounded.

* :func:`eventually`: poll until a condition holds (a run is in the journal, a record changed): a cross-process
  assertion never reads an eventually-consistent view once.
* :func:`stays`: a settle window, the other half: an assertion that "nothing more happens" (still one delivery,
  still one event) is checked first, so it cannot pass vacuously, and then polled over a bounded window instead
  of being read once.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx

__all__ = ["eventually", "stays"]

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    timeout_s: float = 30,
    what: str = "condition",
    *,
    interval_s: float = 0.1,
) -> T:
    """Poll ``probe`` until it returns something truthy and return that; AssertionError naming ``what`` (and the
    last value or error seen) after ``timeout_s``.

    A probe's HTTP call that fails in transport counts as "not yet" within the bound: on a loaded machine one slow
    answer is not a failure, and neither is a keep-alive connection the server closed just as the probe reused it
    (``RemoteProtocolError``: "Server disconnected without sending a response"); a server that stays away still
    fails the wait, with its last error."""
    last: T | None = None
    error: httpx.TransportError | None = None
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    last, error = await probe(), None
                except httpx.TransportError as exc:
                    last, error = None, exc
                if last:
                    return last
                await asyncio.sleep(interval_s)
    except TimeoutError:
        seen = f"last error: {error!r}" if error is not None else f"last value: {last!r}"
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; {seen}") from None


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
