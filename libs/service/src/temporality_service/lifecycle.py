"""Process lifecycle: SIGTERM/SIGINT set a stop event; the ready file says "serving" and goes at stop."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

__all__ = ["clear_ready", "mark_ready", "stop_on_signals"]


def stop_on_signals(loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Event:
    """An event set by the first SIGTERM or SIGINT."""
    loop = loop or asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def mark_ready(path: Path | None, url: str | None = None) -> None:
    """Write ``path`` atomically to say the process is ready: the pid, then the HTTP server's URL when it
    has one (so a launcher that asked for port 0 learns the port); no-op without a path."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(f"{os.getpid()}\n" + (f"{url}\n" if url else ""))
    tmp.replace(path)


def clear_ready(path: Path | None) -> None:
    """Remove the ready file (the process is stopping): a restarted process never inherits it."""
    if path is not None:
        path.unlink(missing_ok=True)
