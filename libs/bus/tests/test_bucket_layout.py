"""A bucket's owner brings it to the configured layout at every start (real nats-servers): its copies follow
``stream_replicas`` (a deployment moving from one server to a 3-node cluster scales its KV up, as its streams), and
direct reads are allowed exactly on one copy; a user of another service's bucket opens it as it is."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nats.js import api as jsapi
from pydantic import BaseModel, ConfigDict

from temporality_bus import Bus, NatsSettings, Versioned
from temporality_embedded import LocalCluster
from temporality_protocol.catalog import BucketSpec

BUCKET = BucketSpec("t-layout", "test bucket: its layout", history=2)


class Item(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str


async def _layout(bus: Bus, bucket: str) -> tuple[int, bool, int]:
    config = (await bus.js.stream_info(f"KV_{bucket}")).config
    return config.num_replicas or 1, bool(config.allow_direct), config.max_msgs_per_subject or 0


async def test_an_old_one_copy_bucket_gets_direct_reads_and_a_user_leaves_it_alone(bus: Bus) -> None:
    """A bucket made before direct reads (no ``allow_direct``): its owner's start turns them on (and reads
    directly); another service opening it (``find_layout(create_missing=True)``) changes nothing."""
    await bus.js.create_key_value(jsapi.KeyValueConfig(bucket="t-old", history=3, storage=jsapi.StorageType.FILE))
    old = BucketSpec("t-old", "test bucket made before direct reads", history=3)
    async with Bus.connect(bus.settings, name="a-user") as user:
        assert await user.find_layout(buckets=[old], create_missing=True) == []
        assert await _layout(user, old.name) == (1, False, 3)  # opened as it is
        assert not (await user.store(old, Item))._direct

    await bus.ensure(buckets=[old])
    assert await _layout(bus, old.name) == (1, True, 3)  # direct reads on, its history kept
    store = await bus.store(old, Item)
    assert store._direct
    rev = await store.create("k", Item(name="k"))
    assert await store.get("k") == Versioned(Item(name="k"), rev)


async def test_a_bucket_follows_its_copies_to_a_cluster_and_stops_direct_reads(tmp_path: Path) -> None:
    """One copy on a 3-node cluster (the setting at 1), then the setting at 3: the owner's next start scales the bucket
    to three copies and turns direct reads off in the same update (a follower may answer one before it applied the
    latest write); what it held is still there, read through the leader."""
    cluster = LocalCluster(tmp_path / "nats")
    await asyncio.to_thread(cluster.start)
    try:
        one = NatsSettings(url=cluster.url, ack_wait_s=2.0, drain_timeout_s=2.0)
        async with Bus.connect(one, name="owner-r1") as bus:
            await bus.ensure(buckets=[BUCKET])
            assert await _layout(bus, BUCKET.name) == (1, True, 2)
            rev = await (await bus.store(BUCKET, Item)).create("k", Item(name="kept"))

        three = one.model_copy(update={"stream_replicas": 3})
        async with Bus.connect(three, name="owner-r3") as bus:
            await bus.ensure(buckets=[BUCKET])
            assert await _layout(bus, BUCKET.name) == (3, False, 2)
            store = await bus.store(BUCKET, Item)
            assert not store._direct
            assert await store.get("k") == Versioned(Item(name="kept"), rev)
            await bus.ensure(buckets=[BUCKET])  # a start with nothing to change changes nothing
            assert await _layout(bus, BUCKET.name) == (3, False, 2)
    finally:
        await asyncio.to_thread(cluster.stop)
