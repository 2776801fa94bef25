"""Listing a KV bucket's live keys against a real nats-server: complete even when nats-py's "caught up"
marker comes before the entries (the race behind an empty inbox listing in CI), deletes and purges left
out, a filter applied by the server, an empty listing returned at once."""

from __future__ import annotations

import asyncio
from typing import Any

from nats.js.kv import KeyValue
from pydantic import BaseModel

from temporality_bus import Bus, Store, live_entries, live_keys
from temporality_bus.listing import stream_subjects
from temporality_protocol.catalog import BucketSpec


class Item(BaseModel):
    n: int


async def _bucket(bus: Bus, name: str) -> KeyValue:
    kv = await bus.ensure_bucket(BucketSpec(name, f"listing test {name}"))
    await kv.put("open.alice.r1", b"1")
    await kv.put("open.alice.r2", b"2")
    await kv.put("open.alice.r3", b"3")
    await kv.delete("open.alice.r2")
    await kv.purge("open.alice.r3")
    await kv.put("open.bob.r4", b"4")
    await kv.put("open.alice.r5", b"5")
    return kv


def _marker_first(kv: KeyValue) -> None:
    """Put nats-py's marker in front of the real watcher's queue: the race, made certain."""
    watch = kv.watch

    async def marker_first(keys: str, **kwargs: object) -> KeyValue.KeyWatcher:
        watcher = await watch(keys, **kwargs)  # type: ignore[arg-type]
        watcher._updates.put_nowait(None)
        return watcher

    kv.watch = marker_first  # type: ignore[method-assign]


async def test_the_live_keys_under_a_filter_without_deletes_or_purges(bus: Bus) -> None:
    kv = await _bucket(bus, "listing-live")
    assert await live_keys(kv, "open.alice.*") == ["open.alice.r1", "open.alice.r5"]
    assert await live_keys(kv) == ["open.alice.r1", "open.bob.r4", "open.alice.r5"]
    entries = await live_entries(kv, "open.>")
    assert [(e.key, e.value) for e in entries] == [
        ("open.alice.r1", b"1"),
        ("open.bob.r4", b"4"),
        ("open.alice.r5", b"5"),
    ]
    assert await live_keys(kv, "open.carol.*") == []  # no message under it: at once, not after a timeout


async def test_a_marker_before_the_entries_does_not_cut_the_listing_short(bus: Bus) -> None:
    kv = await _bucket(bus, "listing-early-marker")
    _marker_first(kv)
    assert await live_keys(kv, "open.alice.*") == ["open.alice.r1", "open.alice.r5"]
    assert [e.value for e in await live_entries(kv, "open.bob.*")] == [b"4"]


async def test_a_marker_first_over_only_deleted_keys_is_an_empty_listing(bus: Bus) -> None:
    """The deletes are delivered (the last message of their key), so the listing still sees its end."""
    kv = await bus.ensure_bucket(BucketSpec("listing-deleted", "listing test: only deletes"))
    await kv.put("a", b"1")
    await kv.delete("a")
    _marker_first(kv)
    assert await asyncio.wait_for(live_keys(kv, timeout_s=30), 20) == []


async def test_store_keys_lists_the_live_keys(bus: Bus) -> None:
    kv = await bus.ensure_bucket(BucketSpec("listing-store", "listing test: Store.keys"))
    store = Store(kv, "listing-store", Item)
    assert await store.keys() == []
    await store.create("x.1", Item(n=1))
    await store.create("y.2", Item(n=2))
    await store.create("x.3", Item(n=3))
    await kv.delete("x.3")
    _marker_first(kv)
    assert await store.keys() == ["x.1", "y.2"]
    assert await store.keys("x.*") == ["x.1"]


async def test_a_usually_empty_listing_makes_no_watcher_when_nothing_is_stored(bus: Bus) -> None:
    """``usually_empty``: nothing under the filter -> one STREAM.INFO and no consumer on the server; something
    under it (a live key, or only a delete) -> the same listing as without it."""
    kv = await _bucket(bus, "listing-probe")
    seen: list[str] = []

    async def on_api(msg: Any) -> None:
        seen.append(msg.subject)

    sub = await bus.nc.subscribe("$JS.API.>", cb=on_api)
    try:
        assert await live_keys(kv, "parked.run-1.*", usually_empty=True) == []
        assert await live_keys(kv, "open.alice.*", usually_empty=True) == ["open.alice.r1", "open.alice.r5"]
        assert await live_keys(kv, "open.alice.r2", usually_empty=True) == []  # only its delete is stored
        await bus.nc.flush()
    finally:
        await sub.unsubscribe()
    creates = [s for s in seen if ".CONSUMER.CREATE." in s]
    infos = [s for s in seen if s.startswith("$JS.API.STREAM.INFO.")]
    assert len(infos) >= 3
    assert len(creates) == 2, seen  # the two filters with messages stored under them; none for parked.run-1.*


async def test_stream_subjects_reads_every_page_past_the_server_s_100000(bus: Bus) -> None:
    """nats-server lists at most 100,000 subjects per ``STREAM.INFO`` answer, and nats-py's ``stream_info`` reads
    the first page only (the timers migration read its schedules that way, then deleted the legacy stream)."""
    count = 100_050
    await bus.js.add_stream(name="T_PAGED", subjects=["paged.>"])
    for start in range(0, count, 5_000):
        await bus.publish_raw_many([(f"paged.{n}", b"", {}) for n in range(start, min(start + 5_000, count))])
    first_page = (await bus.js.stream_info("T_PAGED", subjects_filter="paged.>")).state.subjects or {}
    assert len(first_page) == 100_000  # what nats-py alone sees
    subjects = await stream_subjects(bus.js, "T_PAGED", "paged.>")
    assert len(subjects) == count
    assert set(subjects) == {f"paged.{n}" for n in range(count)}
    assert set(subjects.values()) == {1}
    assert await stream_subjects(bus.js, "T_PAGED", "paged.7") == {"paged.7": 1}
    assert await stream_subjects(bus.js, "T_PAGED", "nothing.>") == {}
