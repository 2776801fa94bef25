"""What the timers stream holds, for tests: whether a timer is armed (its schedule subject's last message is a
schedule, not a cancel's rollup, which stays until it expires: ``temporality_bus.Timers.cancel``)."""

from __future__ import annotations

from nats.js.errors import NotFoundError

from temporality_bus import Bus
from temporality_protocol.catalog import TIMERS_STREAM

__all__ = ["armed_schedules"]


async def armed_schedules(bus: Bus, subject: str) -> int:
    """How many schedules are armed on ``subject`` (0 or 1: one per subject; a wildcard counts each subject)."""
    info = await bus.js.stream_info(TIMERS_STREAM.name, subjects_filter=subject)
    armed = 0
    for each in info.state.subjects or {}:
        try:
            last = await bus.js.get_last_msg(TIMERS_STREAM.name, each)
        except NotFoundError:  # fired (or expired) meanwhile
            continue
        if last.headers and "Nats-Schedule" in last.headers:
            armed += 1
    return armed
