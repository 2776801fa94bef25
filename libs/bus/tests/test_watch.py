"""KvWatch against a real nats-server: snapshot first, then every change; readiness follows the watch."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.kv import KeyValue

from temporality_bus import Bus, KvWatch, entry_value
from temporality_protocol.catalog import BucketSpec

BUCKET = BucketSpec("watch-test", "KvWatch's test bucket")


class View:
    """What a service would serve: key -> value, kept by the watch."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.forgotten: set[str] = set()
        self.loads = 0
        self.changes = asyncio.Condition()

    async def apply(self, entry: KeyValue.Entry) -> None:
        value = entry_value(entry)
        if value is None:
            self.values.pop(entry.key, None)
        else:
            self.values[entry.key] = value

    async def forget(self, seen: set[str]) -> None:
        for gone in set(self.values) - seen:
            self.forgotten.add(gone)
            del self.values[gone]

    async def loaded(self) -> None:
        self.loads += 1

    async def changed(self) -> None:
        async with self.changes:
            self.changes.notify_all()

    async def wait(self, expected: dict[str, bytes], timeout_s: float = 5.0) -> None:
        async with self.changes, asyncio.timeout(timeout_s):
            await self.changes.wait_for(lambda: self.values == expected)


async def test_the_snapshot_is_applied_before_watching_returns_then_every_change_follows(bus: Bus) -> None:
    kv = await bus.ensure_bucket(BUCKET)
    await kv.put("a", b"1")
    await kv.put("b", b"2")
    view = View()
    view.values["stale"] = b"deleted while nobody watched"
    watch = KvWatch(
        bus, kv, "test store", apply=view.apply, forget=view.forget, loaded=view.loaded, changed=view.changed
    )
    with pytest.raises(RuntimeError, match="not watched yet"):
        await watch.check()  # not ready before the snapshot
    async with watch.watching():
        assert view.values == {"a": b"1", "b": b"2"}, "the whole snapshot, before watching() returns"
        assert view.forgotten == {"stale"}
        assert view.loads == 1
        await watch.check()
        await kv.put("c", b"3")
        await kv.delete("a")
        await kv.put("b", b"22")
        await view.wait({"b": b"22", "c": b"3"})


async def test_a_marker_before_the_entries_does_not_cut_the_snapshot_short(bus: Bus) -> None:
    """nats-py signals "initial values done" (``None``) from the consumer's pending count; when the server
    has already sent the entries but the client has not read them yet, the marker comes first (seen in CI:
    a watch that returned an empty view of a bucket holding keys). Reproduced on the real server by putting
    that early marker in front of the real watcher's queue: the snapshot must still hold every key."""
    kv = await bus.ensure_bucket(BucketSpec("watch-early-marker", "KvWatch's early-marker bucket"))
    await kv.put("a", b"1")
    await kv.put("b", b"2")
    await kv.delete("b")
    await kv.put("c", b"3")
    watchall = kv.watchall

    async def marker_first(**kwargs: object) -> KeyValue.KeyWatcher:
        watcher = await watchall(**kwargs)  # type: ignore[arg-type]
        watcher._updates.put_nowait(None)  # the race, made certain
        return watcher

    kv.watchall = marker_first  # type: ignore[method-assign]
    view = View()
    async with KvWatch(bus, kv, "test store", apply=view.apply, forget=view.forget, loaded=view.loaded).watching():
        assert view.values == {"a": b"1", "c": b"3"}, "the whole snapshot, before watching() returns"
        assert view.loads == 1


async def test_leaving_the_watch_ends_it_even_when_a_cancellation_is_dropped(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before Python 3.12, ``asyncio.wait_for`` (nats-py's ``KeyWatcher.updates``) drops a cancellation that lands
    as its update arrives, and the watch went on following: leaving ``watching()`` (a service's stop) hung while
    writes kept arriving. Here every watch read drops the first cancellation it gets, as that race does."""
    kv = await bus.ensure_bucket(BUCKET)
    view = View()
    updates = KeyValue.KeyWatcher.updates
    dropped: list[bool] = []

    async def drops_one_cancel(self: KeyValue.KeyWatcher, timeout: float = 5.0) -> object:  # noqa: ASYNC109
        try:
            return await updates(self, timeout)  # type: ignore[no-untyped-call]
        except asyncio.CancelledError:
            if dropped:
                raise
            dropped.append(True)
            return None  # "an update arrived": the cancellation is gone

    async with KvWatch(bus, kv, "test store", apply=view.apply, forget=view.forget).watching():
        monkeypatch.setattr(KeyValue.KeyWatcher, "updates", drops_one_cancel)
        await asyncio.sleep(0)
    assert dropped == [True]  # it ended although its first cancellation was dropped
