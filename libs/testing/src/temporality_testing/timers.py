"""Timers for tests: a timers stream for the test namespaces no service owns (:data:`TEST_TIMERS_STREAM`, which
the ``bus`` fixture creates), and whether a timer is armed (its schedule subject's last message is a schedule,
not a cancel's rollup, which stays until it expires: ``temporality_bus.Timers.cancel``)."""

from __future__ import annotations

from nats.js.errors import NotFoundError

from temporality_bus import Bus
from temporality_protocol.catalog import TIMER_SCHEDULE_PREFIX, timers_stream, timers_stream_of

__all__ = ["TEST_NAMESPACES", "TEST_TIMERS_STREAM", "armed_schedules"]

#: The timer namespaces the library tests use (no service's): each test namespace lives in this one stream,
#: like a service's namespaces in its own (``TEMPORALITY_TIMERS_<SERVICE>``).
TEST_NAMESPACES = ("test", "ns-a", "ns-b", "trcont", "trlink", "trnone", "trout", "troff", "hooktest")
TEST_TIMERS_STREAM = timers_stream("TEST_TIMERS", TEST_NAMESPACES, "Timers of the library tests")


def _stream_of(subject: str) -> str:
    namespace = subject.removeprefix(f"{TIMER_SCHEDULE_PREFIX}.").split(".", 1)[0]
    return TEST_TIMERS_STREAM.name if namespace in TEST_NAMESPACES else timers_stream_of(namespace)


async def armed_schedules(bus: Bus, subject: str) -> int:
    """How many schedules are armed on ``subject`` (0 or 1: one per subject; a wildcard counts each subject),
    in the timers stream of its namespace."""
    stream = _stream_of(subject)
    info = await bus.js.stream_info(stream, subjects_filter=subject)
    armed = 0
    for each in info.state.subjects or {}:
        try:
            last = await bus.js.get_last_msg(stream, each)
        except NotFoundError:  # fired (or expired) meanwhile
            continue
        if last.headers and "Nats-Schedule" in last.headers:
            armed += 1
    return armed
