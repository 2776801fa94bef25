"""The retention sweep reads ``human-channels`` from a KV watch (``mirror.ChannelMirror``), not a listing of the
whole bucket at every interval: what a sweep reads from the server is what changed since the sweep before, not
every key of every open request; and it purges exactly what a listing sweep purges.

Measured by the sweeper's own count of the keys it read (``last_listed``), by counting the listings it makes,
and on the wire (``human_support.kv_calls``: every listing of the bucket is a consumer created on its stream)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from human_support import ALICE, kv_calls, requested, stored

from temporality_bus import Bus, NatsSettings
from temporality_human_interaction import inbox
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS
from temporality_human_interaction.inbox import RetentionSweeper, channel_entries
from temporality_human_interaction.mirror import ChannelMirror
from temporality_human_interaction.requests import RequestHandler

CHANNELS = BUCKET_HUMAN_CHANNELS.name
OPEN = 12  # pending requests parked on people: every one of them is several keys of human-channels


async def test_a_mirrored_sweep_reads_only_what_changed_and_purges_what_a_listing_sweep_does(
    bus: Bus,
    nats_settings: NatsSettings,
    handler: RequestHandler,
    client: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listings: list[str] = []  # every listing of a bucket the sweep makes (inbox.live_entries)
    real_live_entries = inbox.live_entries

    async def counting(kv: Any, keys: str = ">", **kwargs: Any) -> Any:
        listings.append(keys)
        return await real_live_entries(kv, keys, **kwargs)

    monkeypatch.setattr(inbox, "live_entries", counting)
    events = [requested(expires_in_s=3600) for _ in range(OPEN)]
    for event in events:
        await handler.handle(event)
    ids = [str(e.data["request_id"]) for e in events]
    keys_in_bucket = len(await channel_entries(bus))
    assert keys_in_bucket >= OPEN  # a run entry each, at least

    now = datetime.now(UTC)
    retention = timedelta(seconds=60)
    # the baseline: without the mirror every sweep lists the whole bucket
    listing = RetentionSweeper(bus, retention=retention, every_s=60, clock=lambda: now)
    listings.clear()
    await listing.sweep()
    assert (listing.last_listed, listing.last_mirrored) == (keys_in_bucket, False)
    assert listings == [">"]  # the whole bucket

    mirror = await ChannelMirror.open(bus)
    async with mirror.watching(), kv_calls(nats_settings.url, CHANNELS) as spy:
        assert mirror.delivered == keys_in_bucket  # read once, as the service starts
        listings.clear()
        sweeper = RetentionSweeper(bus, retention=retention, every_s=60, clock=lambda: now, mirror=mirror)
        assert await sweeper.sweep() == 0
        assert (sweeper.last_listed, sweeper.last_mirrored) == (0, True)  # nothing changed: nothing read
        assert await sweeper.sweep() == 0
        assert sweeper.last_listed == 0

        # one more request: the next sweep reads its keys, not the bucket
        extra = requested(expires_in_s=3600)
        await handler.handle(extra)
        after_one = len(await channel_entries(bus)) - keys_in_bucket
        await spy.reset()
        listings.clear()  # the test's own listing just now
        assert await sweeper.sweep() == 0
        assert (sweeper.last_listed, sweeper.last_mirrored) == (after_one, True)
        assert 0 < after_one < keys_in_bucket
        assert (await spy.calls()).listings == []  # the bucket was not listed once (seen on the wire)
        assert listings == []  # ... nor by the sweep's own listing function

        # three answered, then past their deadline + the retention: purged from a mirror that saw the answers
        for request_id in ids[:3]:
            reply = await client.post(f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
            assert reply.status_code == 200, reply.text
        due = RetentionSweeper(
            bus, retention=retention, every_s=60, clock=lambda: now + timedelta(seconds=3700), mirror=mirror
        )
        assert await due.sweep() == 3
        assert due.last_mirrored  # also when it looks again after purging (the mirror caught up with them)
        assert (await spy.calls()).listings == []
        assert listings == []
        for request_id in ids[:3]:
            assert await stored(bus, request_id) is None
        for request_id in [*ids[3:], str(extra.data["request_id"])]:
            assert await stored(bus, request_id) is not None  # pending: never purged
        # the mirror followed the purge: the next sweep sees the bucket as a listing would
        assert await sweeper.sweep() == 0
        assert {e.key for e in mirror.entries()} == {e.key for e in await channel_entries(bus)}


async def test_a_sweep_lists_the_bucket_while_the_mirror_is_not_watching(bus: Bus, handler: RequestHandler) -> None:
    await handler.handle(requested(expires_in_s=3600))
    mirror = await ChannelMirror.open(bus)  # never started: its watch does not run
    sweeper = RetentionSweeper(bus, retention=timedelta(seconds=60), every_s=60, mirror=mirror)
    await sweeper.sweep()
    assert sweeper.last_mirrored is False
    assert sweeper.last_listed == len(await channel_entries(bus)) > 0
