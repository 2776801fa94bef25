"""EventLog(since=...) reads only what the server stored from that moment on (a test sharing a stack with
others waits on its own events), on a real nats-server."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from temporality_bus import Bus
from temporality_protocol import Envelope, TriggerReceived, make_event
from temporality_testing.events import EventLog


def _received(delivery: str) -> Envelope:
    return make_event(
        TriggerReceived(trigger_id="t", delivery_id=delivery, adapter="generic", body_bytes=2), source="/test"
    )


async def test_a_log_since_a_moment_sees_only_what_was_stored_after_it(bus: Bus) -> None:
    await bus.publish(_received("before"))
    everything = await EventLog(bus.nc).start()
    try:
        await everything.wait_for("trigger.received", timeout_s=10)
        since = datetime.now(UTC)  # after "before" was stored (the server stamps it before it reaches us)
        recent = await EventLog(bus.nc, since=since).start()
        try:
            await bus.publish(_received("after"))
            (seen,) = await recent.wait_for("trigger.received", timeout_s=10)
            assert seen.data["delivery_id"] == "after"
            both = await everything.wait_for("trigger.received", count=2, timeout_s=10)
            assert [e.data["delivery_id"] for e in both] == ["before", "after"]
            assert [e.data["delivery_id"] for e in recent.events] == ["after"]  # "before" never came
            with pytest.raises(ValueError, match="whole stream"):
                await recent.caught_up()
        finally:
            await recent.stop()
    finally:
        await everything.stop()
