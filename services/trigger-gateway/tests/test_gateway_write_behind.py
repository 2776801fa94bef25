"""The write-behind queue (:mod:`temporality_trigger_gateway.behind`) against a real nats-server: what a
launch writes after its answer (the claim's mark, the delivery's record) reaches the bus whatever else is in
the same round, and :meth:`WriteBehind.settled` always ends."""

from __future__ import annotations

import asyncio

import httpx
from gateway_support import eventually, fixture_bytes, post

from temporality_bus import Bus, BusError, PermanentError, PublishResult
from temporality_bus.pipeline import kv_write
from temporality_embedded.natsserver import NatsServer
from temporality_protocol.catalog import BUCKET_DELIVERIES
from temporality_trigger_gateway.behind import Settle, WriteBehind
from temporality_trigger_gateway.deliveries import Deliveries

BUCKET = BUCKET_DELIVERIES.name


def _collect(into: list[list[PublishResult | BusError]]) -> Settle:
    async def settle(results: list[PublishResult | BusError]) -> None:
        into.append(results)

    return settle


async def _stored(bus: Bus, key: str) -> bytes | None:
    kv = await bus.kv(BUCKET_DELIVERIES)
    try:
        return (await kv.get(key)).value
    except Exception:
        return None


async def test_a_write_too_large_for_the_server_fails_alone_and_the_round_s_others_are_written(bus: Bus) -> None:
    await Deliveries(bus).store()  # the bucket exists
    behind = WriteBehind(bus)
    outcomes: list[list[PublishResult | BusError]] = []
    too_large = b"x" * (bus.nc.max_payload + 1)
    behind.add([kv_write(BUCKET, "wb.a", b"a")], _collect(outcomes))
    behind.add([kv_write(BUCKET, "wb.big", too_large)], _collect(outcomes))
    behind.add([kv_write(BUCKET, "wb.c", b"c"), kv_write(BUCKET, "wb.d", b"d")], _collect(outcomes))
    await behind.settled()
    assert [[type(r) for r in job] for job in outcomes] == [
        [PublishResult],
        [PermanentError],
        [PublishResult, PublishResult],
    ]
    assert [await _stored(bus, k) for k in ("wb.a", "wb.big", "wb.c", "wb.d")] == [b"a", None, b"c", b"d"]


async def test_settled_writes_what_a_cancelled_round_left_queued(bus: Bus) -> None:
    await Deliveries(bus).store()
    behind = WriteBehind(bus)
    outcomes: list[list[PublishResult | BusError]] = []
    behind.add([kv_write(BUCKET, "wb.e", b"e")], _collect(outcomes))
    task = behind._task
    assert task is not None
    task.cancel()  # e.g. the loop shutting down before the round started
    await asyncio.gather(task, return_exceptions=True)
    assert behind.pending == 1
    await asyncio.wait_for(behind.settled(), 10)
    assert behind.pending == 0
    assert [[type(r) for r in job] for job in outcomes] == [[PublishResult]]
    assert await _stored(bus, "wb.e") == b"e"


async def test_a_delivery_that_failed_while_the_bus_was_away_is_listed_once_it_is_back(
    nats_server: NatsServer, bus: Bus, client: httpx.AsyncClient
) -> None:
    """A webhook answered 503 because NATS is away: its ``failed`` record could not be written then, and is written
    in the background once the server is back (no awaited round trip added to any answer)."""
    deliveries = Deliveries(bus)
    await deliveries.store()
    nats_server.stop(hold_port=True)
    try:
        answer = await post(client, fixture_bytes("pr-created.json"))
        assert answer.status_code == 503, answer.text
    finally:
        nats_server.requested_port = nats_server.port  # the same server (port, store) comes back
        nats_server.start()

    async def listed() -> list[str]:
        try:
            page, _ = await deliveries.newest("ado-pr-review", before=None, limit=10)
        except Exception:  # still reconnecting
            return []
        return [record.state for record in page]

    assert await eventually(listed, timeout_s=30, what="the failed delivery listed") == ["failed"]
