"""Serve an ASGI app with uvicorn on a loopback port for the length of a ``with`` block: what the test peers
that speak real HTTP (the OpenAI, Telegram and OIDC emulators, the OTLP receiver) share."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import uvicorn

__all__ = ["served_asgi"]


@asynccontextmanager
async def served_asgi(
    app: Any,
    port: int,
    *,
    lifespan: Literal["auto", "on", "off"] = "auto",
    before_stop: Callable[[], Awaitable[None]] | None = None,
) -> AsyncIterator[uvicorn.Server]:
    """``app`` served on ``127.0.0.1:port`` until the block ends (started within 10 s: a server that fails to
    start raises its error here). ``before_stop`` runs first on the way out (wake long polls, say)."""
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan=lifespan)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("the server stopped before it started")
                await asyncio.sleep(0.01)
        yield server
    finally:
        if before_stop is not None:
            await before_stop()
        server.should_exit = True
        await task
