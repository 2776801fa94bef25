"""Messages routed off nats-py's parser (:mod:`temporality_bus.routing`): a failing route loses its message, not
the connection; the fast parser reads what a real server writes."""

from __future__ import annotations

import asyncio
import random

import nats
from nats.aio.msg import Msg
from structlog.testing import capture_logs

from temporality_bus import Bus, NatsSettings
from temporality_bus.routing import _parse_headers, _route, _unroute
from temporality_testing.waiting import eventually


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


async def test_a_routed_and_an_unrouted_subscription_read_every_message_in_order(nats_settings: NatsSettings) -> None:
    """Against a real server, the fast parser (one routed and one plain subscription on a connection) reads
    messages of every size up to near ``max_payload``, half with headers, in reads the socket cuts as it likes,
    while ``flush()`` PINGs and PONGs go back and forth: each arrives once, in order, byte for byte."""
    reader = await nats.connect(nats_settings.url)
    writer = await nats.connect(nats_settings.url)
    routed: list[tuple[str, bytes, dict[str, str] | None]] = []
    plain: list[tuple[str, bytes, dict[str, str] | None]] = []

    def on_raw(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        routed.append((subject.decode(), data, _parse_headers(headers) if headers is not None else None))

    async def on_plain(msg: Msg) -> None:
        plain.append((msg.subject, msg.data, msg.headers))

    async def ping() -> None:
        while True:
            await reader.flush(5)

    try:
        routed_sub = await reader.subscribe("t.live.routed.*")
        await reader.subscribe("t.live.plain.*", cb=on_plain)
        assert _route(reader, routed_sub._id, on_raw)
        assert "parse" in vars(reader._ps)
        await reader.flush(5)  # the server has both subscriptions before the first message is written
        rng = random.Random(3)
        sizes = [0, 1, 2, 100, 4094, 4096, 32768, 65535, 65536, 300_000, reader.max_payload - 200]
        sent: dict[str, list[tuple[str, bytes, dict[str, str] | None]]] = {"routed": [], "plain": []}
        pinging = asyncio.create_task(ping())
        try:
            for i in range(400):
                size = rng.choice(sizes)
                data = rng.randbytes(size)
                headers = {"K": str(i), "Nats-Msg-Id": f"m-{i}"} if i % 2 else None
                kind = "routed" if rng.random() < 0.6 else "plain"
                await writer.publish(f"t.live.{kind}.{i}", data, headers=headers)
                sent[kind].append((f"t.live.{kind}.{i}", data, headers))
                if i % 50 == 0:
                    await writer.flush(5)
            await writer.flush(5)

            async def all_there() -> bool:
                return len(routed) >= len(sent["routed"]) and len(plain) >= len(sent["plain"])

            await eventually(all_there, 30, "every message read", interval_s=0.02)
            assert not pinging.done()  # the PINGs alongside went on without an error
        finally:
            pinging.cancel()
        assert routed == sent["routed"]
        assert plain == sent["plain"]
        assert reader.is_connected
        assert reader.last_error is None
    finally:
        await reader.close()
        await writer.close()
