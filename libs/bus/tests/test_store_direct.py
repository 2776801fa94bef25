"""Store reads through direct gets on a bucket of one replica (real nats-server): the same answers as the
``STREAM.MSG.GET`` path for a value, a missing key, a deleted and a purged one, and ``current``'s shortcut; a
bucket that does not allow direct reads is still read through the API."""

from __future__ import annotations

from collections.abc import Callable

from nats.aio.msg import Msg
from nats.js import api as jsapi
from pydantic import BaseModel, ConfigDict

from temporality_bus import Bus, Store, Versioned
from temporality_bus.connection import _direct_reads
from temporality_protocol.catalog import BucketSpec
from temporality_testing.waiting import eventually

BUCKET = BucketSpec("t-direct", "test bucket: direct reads")


class Item(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    count: int = 0


async def _tapped(bus: Bus) -> list[str]:
    """The subjects of every JetStream read request sent on this server from now on (a core subscription sees them)."""
    seen: list[str] = []

    async def on(msg: Msg) -> None:
        seen.append(msg.subject)

    await bus.nc.subscribe("$JS.API.DIRECT.GET.>", cb=on)
    await bus.nc.subscribe("$JS.API.STREAM.MSG.GET.>", cb=on)
    await bus.nc.flush()
    return seen


async def _until(done: Callable[[], bool], what: str) -> None:
    async def probe() -> bool:
        return done()

    await eventually(probe, 10, what, interval_s=0.01)


async def _both(store: Store[Item], other: Store[Item], key: str) -> tuple[Versioned[Item] | None, ...]:
    return await store.get(key), await other.get(key)


async def test_direct_reads_answer_as_the_api_does(bus: Bus) -> None:
    await bus.ensure(buckets=[BUCKET])
    store = await bus.store(BUCKET, Item)
    info = await bus.js.stream_info(f"KV_{BUCKET.name}")
    assert info.config.allow_direct
    assert _direct_reads(info)
    through_api = Store(
        await bus.kv(BUCKET), BUCKET.name, Item, pipeline=bus.pipeline, nc=bus.nc, api_prefix=bus.settings.js_api_prefix
    )
    seen = await _tapped(bus)

    rev = await store.create("a", Item(name="a"))
    rev2 = await store.update("a", Item(name="a", count=1), rev)
    await store.create("gone", Item(name="gone"))
    kv = await bus.kv(BUCKET)
    await kv.delete("gone")
    await store.create("purged", Item(name="purged"))
    await store.purge("purged")

    assert await _both(store, through_api, "a") == (Versioned(Item(name="a", count=1), rev2),) * 2
    for key in ("missing", "gone", "purged"):
        assert await _both(store, through_api, key) == (None, None), key

    # every read of each store seen by the tap (its copies come on their own subscription: waited for)
    await _until(lambda: len(seen) >= 8, "the tap's copies of eight reads")
    direct = [s for s in seen if ".DIRECT.GET." in s]
    assert len(direct) == 4
    assert all(s.startswith(f"$JS.API.DIRECT.GET.KV_{BUCKET.name}.$KV.{BUCKET.name}.") for s in direct)
    assert len([s for s in seen if ".STREAM.MSG.GET." in s]) == 4  # the through_api store's four reads only


async def test_current_keeps_known_while_unchanged(bus: Bus) -> None:
    await bus.ensure(buckets=[BUCKET])
    store = await bus.store(BUCKET, Item)
    rev = await store.create("c", Item(name="c"))
    known = Versioned(Item(name="c"), rev)
    assert await store.current("c", known) is known
    rev2 = await store.update("c", Item(name="c", count=2), rev)
    assert await store.current("c", known) == Versioned(Item(name="c", count=2), rev2)
    await store.purge("c")
    assert await store.current("c", known) is None


async def test_a_bucket_without_direct_reads_is_read_through_the_api(bus: Bus) -> None:
    """A bucket that does not allow direct reads (made before them, opened by a user of it that is not its owner:
    only the owner's start updates it, ``test_bucket_layout.py``) is read through the API."""
    await bus.js.create_key_value(jsapi.KeyValueConfig(bucket="t-legacy", storage=jsapi.StorageType.FILE))
    legacy = BucketSpec("t-legacy", "test bucket made without direct reads")
    assert await bus.find_layout(buckets=[legacy]) == []
    store = await bus.store(legacy, Item)
    seen = await _tapped(bus)
    rev = await store.create("k", Item(name="k"))
    assert await store.get("k") == Versioned(Item(name="k"), rev)
    await _until(lambda: len(seen) >= 1, "the tap's copy of the read")
    assert seen == [f"$JS.API.STREAM.MSG.GET.KV_{legacy.name}"]
    assert not (await bus.js.stream_info(f"KV_{legacy.name}")).config.allow_direct  # not its owner: not updated


def test_a_replicated_bucket_is_never_read_directly() -> None:
    """A follower may answer a direct get before it applied the latest write: replicated buckets use the API."""
    config = jsapi.StreamConfig(name="KV_x", allow_direct=True, num_replicas=3)
    assert not _direct_reads(jsapi.StreamInfo(config=config, state=None))  # type: ignore[arg-type]
    assert _direct_reads(jsapi.StreamInfo(config=jsapi.StreamConfig(name="KV_x", allow_direct=True), state=None))  # type: ignore[arg-type]
    assert not _direct_reads(jsapi.StreamInfo(config=jsapi.StreamConfig(name="KV_x", num_replicas=1), state=None))  # type: ignore[arg-type]
