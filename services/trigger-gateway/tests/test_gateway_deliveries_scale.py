"""The deliveries listing reads only what a page needs (issue 7): the trigger's keys (headers only), ordered
by the index keys' receipt times, then one read per record shown. Real nats-server; the records are written
as :meth:`Deliveries.record` writes them (the record and its index key)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from unittest.mock import patch

from temporality_bus import Bus
from temporality_protocol.catalog import BUCKET_DELIVERIES
from temporality_trigger_gateway.deliveries import Deliveries, DeliveryRecord, delivery_key, index_key

BASE = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


def _record(trigger_id: str, n: int, at: datetime) -> DeliveryRecord:
    return DeliveryRecord(
        trigger_id=trigger_id,
        delivery_id=f"dlv-{n:024x}",
        kind="webhook",
        adapter="generic",
        source_event_id=f"evt-{n}",
        state="accepted",
        run_id=f"run-{n}",
        received_at=at,
        updated_at=at,
    )


async def _write(bus: Bus, records: list[DeliveryRecord], *, indexed: bool = True) -> None:
    kv = await bus.kv(BUCKET_DELIVERIES)
    puts = []
    for r in records:
        puts.append(kv.put(delivery_key(r.trigger_id, r.delivery_id), r.model_dump_json().encode()))
        if indexed:
            puts.append(kv.put(index_key(r.trigger_id, r.received_at, r.delivery_id), r.delivery_id.encode()))
    for start in range(0, len(puts), 500):
        await asyncio.gather(*puts[start : start + 500])


async def test_a_page_of_5000_deliveries_reads_only_its_own_records(bus: Bus) -> None:
    busy = [_record("busy", n, BASE + timedelta(milliseconds=n)) for n in range(5000)]
    legacy = [_record("busy", 9000 + n, BASE - timedelta(seconds=n + 1)) for n in range(3)]  # no index entry
    await _write(bus, busy)
    await _write(bus, legacy, indexed=False)
    await _write(bus, [_record("busy-too", n, BASE + timedelta(hours=1, milliseconds=n)) for n in range(20)])
    deliveries = Deliveries(bus)
    store = await deliveries.store()

    with patch.object(store, "get", wraps=store.get) as reads:
        page, cursor = await deliveries.newest("busy", before=None, limit=50)
    assert [r.delivery_id for r in page] == [r.delivery_id for r in reversed(busy[-50:])]  # newest first
    assert cursor == (busy[-50].received_at, busy[-50].delivery_id)
    assert reads.await_count == 50 + len(legacy)  # the page, plus the records written before the index

    with patch.object(store, "get", wraps=store.get) as reads:
        second, _ = await deliveries.newest("busy", before=cursor, limit=50)
    assert [r.delivery_id for r in second] == [r.delivery_id for r in reversed(busy[-100:-50])]
    assert reads.await_count == 50 + len(legacy)

    with patch.object(store, "get", wraps=store.get) as reads:  # the last page: the oldest, then the legacy ones
        last, end = await deliveries.newest("busy", before=(busy[2].received_at, busy[2].delivery_id), limit=10)
    assert [r.delivery_id for r in last] == [busy[1].delivery_id, busy[0].delivery_id] + [r.delivery_id for r in legacy]
    assert end is None
    assert reads.await_count == 2 + len(legacy)


async def test_paging_through_mixed_records_visits_each_once_in_order(bus: Bus) -> None:
    indexed = [_record("small", n, BASE + timedelta(seconds=2 * n)) for n in range(7)]
    legacy = [_record("small", 100 + n, BASE + timedelta(seconds=2 * n + 1)) for n in range(3)]  # interleaved
    await _write(bus, indexed)
    await _write(bus, legacy, indexed=False)
    deliveries = Deliveries(bus)
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page, cursor = await deliveries.newest("small", before=cursor, limit=4)
        seen += [r.delivery_id for r in page]
        if cursor is None:
            break
    expected = sorted(indexed + legacy, key=lambda r: (r.received_at, r.delivery_id), reverse=True)
    assert seen == [r.delivery_id for r in expected]
    assert await deliveries.newest("nothing-here", before=None, limit=4) == ([], None)
