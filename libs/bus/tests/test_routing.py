"""Messages routed off nats-py's parser (:mod:`temporality_bus.routing`): a failing route loses its message, not
the connection."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from temporality_bus import Bus
from temporality_bus.routing import _route, _unroute


async def test_a_route_that_raises_drops_its_message_and_the_connection_reads_on(bus: Bus) -> None:
    nc = bus.nc
    routed: list[bytes] = []

    def on_raw(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        if data == b"bad":
            raise ValueError("a route that fails")
        routed.append(data)

    inbox = await nc.subscribe("t.routing.inbox")
    plain = await nc.subscribe("t.routing.plain")
    assert _route(nc, inbox._id, on_raw)
    try:
        with capture_logs() as logs:
            await nc.publish("t.routing.inbox", b"bad")
            await nc.publish("t.routing.inbox", b"good")
            await nc.publish("t.routing.plain", b"still read")
            await nc.flush()
            got = await plain.next_msg(timeout=5)  # the read loop went on after the failing route
        assert got.data == b"still read"
        assert routed == [b"good"]
        assert [e["event"] for e in logs if e["log_level"] == "error"] == ["bus.routed_message_failed"]
        assert nc.is_connected
        await asyncio.wait_for(nc.flush(), 5)
    finally:
        _unroute(nc, inbox._id)
        await inbox.unsubscribe()
        await plain.unsubscribe()
