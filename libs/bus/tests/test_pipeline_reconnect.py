"""temporality_bus.Pipeline across a lost connection, against a real nats-server stopped and started again on
the same port and store.

A write whose frames went out on a connection that is lost fails at once with a :class:`TransientError` (its
ack can never come: the reply subscription's messages of the lost connection are gone), instead of waiting out
its timeout; a write handed over while the client reconnects goes out on the new connection and is acknowledged;
after the reconnect, the failed writes sent again (same event id, same expected revision) are stored once.

The server is frozen (SIGSTOP) before the writes go out, so it never reads them, then killed: the client sees
the connection reset with the writes unanswered, whatever the machine's load.

A write still in the client's outbound buffer when the connection is lost was never sent: nats-py writes it on
the next connection, so it is stored and acknowledged there, and it is not failed (the client's flusher is held so
the write stays in that buffer until the loss).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from temporality_bus import Bus, NatsSettings, PublishResult, TransientError
from temporality_bus.pipeline import event_write, kv_write
from temporality_embedded.natsserver import NatsServer
from temporality_protocol import Envelope, TriggerReceived, make_event
from temporality_protocol.catalog import EVENTS_STREAM, BucketSpec
from temporality_testing.waiting import eventually

BUCKET = BucketSpec("t-pipeline-reconnect", "test bucket")
TIMEOUT_S = 60.0  # the writes' own ack timeout: the waits below end long before it
WITHIN_S = 15.0


@pytest.fixture
def server(nats_server: NatsServer) -> NatsServer:
    """The test's own nats-server (``NatsServer.stop`` continues it first should a test leave it frozen)."""
    return nats_server


@pytest.fixture
async def bus(server: NatsServer) -> AsyncIterator[Bus]:
    settings = NatsSettings(url=server.url, reconnect_wait_s=0.2, drain_timeout_s=2.0)
    async with Bus.connect(settings, name="test") as connected:
        await connected.ensure([EVENTS_STREAM], [BUCKET])
        yield connected


class _Value(BaseModel):
    n: int


def _event(delivery: str) -> Envelope:
    return make_event(
        TriggerReceived(trigger_id="t", delivery_id=delivery, adapter="generic", body_bytes=0),
        source="/test",
        id=f"evt-{delivery}",
    )


def _restart(server: NatsServer) -> None:
    server.requested_port = server.port
    server.start()


async def _true(value: bool) -> bool:
    return value


async def _freeze(server: NatsServer) -> None:
    """SIGSTOP the server and wait until every thread of it is stopped (the signal is not taken at once)."""
    assert server.proc is not None
    pid = server.proc.pid
    os.kill(pid, signal.SIGSTOP)

    def states() -> list[str]:  # each thread's state letter in /proc (T: stopped)
        return [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in Path(f"/proc/{pid}/task").iterdir()]

    async def stopped() -> bool:
        return all(state in ("T", "t") for state in states())

    await eventually(stopped, WITHIN_S, "the server stopped", interval_s=0.01)


async def _on_the_socket(bus: Bus, waiting: int) -> None:
    """Wait until ``waiting`` writes wait for their acks and the client has written everything to the socket."""
    seen: list[tuple[int, int, bool]] = []

    async def written() -> bool:
        seen[:] = [(bus.pipeline.pending, bus.nc._pending_data_size, bus.nc.is_connected)]
        return bus.pipeline.pending == waiting and bus.nc._pending_data_size == 0

    try:
        await eventually(written, WITHIN_S, "the writes on the socket")
    except AssertionError as exc:
        raise AssertionError(f"{exc} (waiting, unwritten bytes, connected: {seen})") from None


async def test_writes_sent_on_a_lost_connection_fail_at_once_and_go_through_after_the_reconnect(
    bus: Bus, server: NatsServer
) -> None:
    pipeline = bus.pipeline
    (warm,) = await pipeline.send([event_write(_event("warm"))])  # the reply subscription is open and answers
    assert isinstance(warm, PublishResult)
    writes = [event_write(_event("lost")), kv_write(BUCKET.name, "claim", b"mine", revision=0)]

    await _freeze(server)  # it never reads what comes next
    sending = asyncio.create_task(pipeline.send(writes, timeout_s=TIMEOUT_S))
    await _on_the_socket(bus, 2)
    server.kill(hold_port=True)  # the connection is reset with both writes unanswered (the port held for it)

    outcomes = await asyncio.wait_for(sending, WITHIN_S)  # not the TIMEOUT_S the ack would have been waited for
    assert all(isinstance(o, TransientError) and "connection to NATS was lost" in str(o) for o in outcomes), outcomes
    assert pipeline.pending == 0

    # handed over while the client reconnects: out on the new connection, acknowledged there
    meanwhile = asyncio.create_task(pipeline.send([event_write(_event("meanwhile"))], timeout_s=TIMEOUT_S))
    await eventually(lambda: _true(pipeline.pending == 1), WITHIN_S, "the write waiting in the reconnect buffer")
    _restart(server)
    (later,) = await asyncio.wait_for(meanwhile, WITHIN_S)
    assert isinstance(later, PublishResult), later
    assert bus.nc.is_connected

    # sent again: the event by its id, the compare-and-set with its revision; each stored once
    event, claim = await pipeline.send(writes, timeout_s=TIMEOUT_S)
    assert isinstance(event, PublishResult), event
    assert not event.duplicate
    assert isinstance(claim, PublishResult), claim
    (again,) = await pipeline.send([writes[0]], timeout_s=TIMEOUT_S)
    assert isinstance(again, PublishResult)
    assert again.duplicate


async def test_a_read_in_flight_on_a_lost_connection_fails_at_once(bus: Bus, server: NatsServer) -> None:
    store = await bus.store(BUCKET, _Value)
    await store.put("k", _Value(n=1))
    await _freeze(server)
    reading = asyncio.create_task(
        bus.pipeline.request(
            f"{bus.settings.js_api_prefix}.STREAM.MSG.GET.KV_{BUCKET.name}",
            f'{{"last_by_subj": "$KV.{BUCKET.name}.k"}}'.encode(),
            timeout_s=TIMEOUT_S,
        )
    )
    await _on_the_socket(bus, 1)
    server.kill(hold_port=True)  # the port held for its restart: no other test's server takes it
    with pytest.raises(TransientError, match="connection to NATS was lost"):
        await asyncio.wait_for(reading, WITHIN_S)
    _restart(server)
    await eventually(lambda: _true(bus.nc.is_connected), WITHIN_S, "the reconnect")
    got = await store.get("k")
    assert got is not None
    assert got.value == _Value(n=1)


async def _hold_the_flusher(bus: Bus) -> None:
    """Stop nats-py's flusher task and leave a stand-in that never takes the flush queue: what is handed to the
    client's outbound buffer stays there (the reconnect cancels the stand-in and starts a flusher of its own)."""
    nc = bus.nc
    flusher = nc._flusher_task
    assert flusher is not None
    flusher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await flusher
    nc._flusher_task = asyncio.create_task(asyncio.Event().wait())


async def test_a_write_still_in_the_client_buffer_when_the_connection_is_lost_is_sent_on_the_next(
    bus: Bus, server: NatsServer
) -> None:
    pipeline = bus.pipeline
    (warm,) = await pipeline.send([event_write(_event("warm"))])  # the reply subscription is open and answers
    assert isinstance(warm, PublishResult)
    await _hold_the_flusher(bus)
    claim = kv_write(BUCKET.name, "held", b"mine", revision=0)
    sending = asyncio.create_task(pipeline.send([claim], timeout_s=TIMEOUT_S))
    await eventually(
        lambda: _true(pipeline.pending == 1 and bus.nc._pending_data_size > 0), WITHIN_S, "the write in the buffer"
    )
    await bus.nc.force_reconnect()  # the connection is dropped with the write never written to it

    (outcome,) = await asyncio.wait_for(sending, WITHIN_S)
    assert isinstance(outcome, PublishResult), outcome  # not a TransientError: sent again, it would be a Conflict
    assert outcome.seq == 1
    entry = await bus.nc.jetstream().key_value(BUCKET.name)
    stored = await entry.get("held")
    assert stored.revision == 1
    assert stored.value == b"mine"
    assert pipeline.pending == 0
