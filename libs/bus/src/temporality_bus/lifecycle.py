"""Process lifecycle: SIGTERM/SIGINT set a stop event; consumers finish their message and drain."""

from __future__ import annotations

import asyncio
import signal

__all__ = ["stop_on_signals"]


def stop_on_signals(loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Event:
    """An event set by the first SIGTERM or SIGINT."""
    loop = loop or asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop
