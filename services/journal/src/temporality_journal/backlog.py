"""How far the journal is behind the bus: its durable consumer's events not yet recorded, for ``/readyz``.

The console asks ``/readyz`` every 10 s (docs/console.md) and shows "recording N events behind the bus" above
``TEMPORALITY_JOURNAL_BEHIND_WARN_EVENTS``. The count is the durable consumer's ``num_pending`` (not yet delivered)
plus ``num_ack_pending`` (delivered, not yet recorded and acknowledged), read from the server at most every
:data:`REFRESH_S` and only while someone asks: ``/readyz`` answers the last value at once and never waits for NATS
(a hung or lost bus leaves the last value, with the time it was read)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog

from temporality_bus import Bus
from temporality_protocol.catalog import CONSUMERS

__all__ = ["REFRESH_S", "Backlog"]

log = structlog.get_logger(__name__)

#: The count is read from the server at most this often (only when ``/readyz`` is asked).
REFRESH_S = 5.0


class Backlog:
    def __init__(
        self, bus: Bus, warn_above: int, refresh_s: float = REFRESH_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.bus = bus
        self.warn_above = warn_above
        self.refresh_s = refresh_s
        self._clock = clock
        self.pending: int | None = None
        self.checked_at: datetime | None = None
        self._read_at = float("-inf")
        self._reading: asyncio.Task[None] | None = None

    def report(self) -> dict[str, Any]:
        """The last count (``None`` before the first read), the threshold the console warns above, and when it was
        read; starts a read in the background when the last one is older than :attr:`refresh_s`."""
        now = self._clock()
        if now - self._read_at >= self.refresh_s and (self._reading is None or self._reading.done()):
            self._read_at = now
            self._reading = asyncio.get_running_loop().create_task(self._read())
        return {
            "pending": self.pending,
            "warn_above": self.warn_above,
            "checked_at": self.checked_at.isoformat().replace("+00:00", "Z") if self.checked_at else None,
        }

    async def _read(self) -> None:
        spec = CONSUMERS["journal"]
        try:
            info = await self.bus.js.consumer_info(spec.stream, spec.durable, timeout=2.0)
        except Exception as exc:  # NATS lost, hung, or the consumer not made yet: keep the last value
            log.debug("journal.backlog_unavailable", error=repr(exc)[:300])
            return
        self.pending = (info.num_pending or 0) + (info.num_ack_pending or 0)
        self.checked_at = datetime.now(UTC)
