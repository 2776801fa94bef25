"""A start lists the requests bucket only until it knows every stored request has a run entry, and looks a
request that was never stored up once, not at every start -- while the repair of older versions' records
still works. A replica lists ``human-channels`` once as it starts: the retention mirror's snapshot, which the
index repair reads too.

What the service asks of the real buckets is seen on the wire: a plain NATS subscriber on the JetStream API
subjects of the ``human-requests`` stream (``human_support.kv_calls``) records every listing (a consumer
created on the stream) and every read (a get of a key)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
from human_support import ALICE, USERS_FILE, KvSpy, kv_calls, requested
from replica_support import replica

from temporality_bus import Bus, NatsSettings, live_entries
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRef, ChannelRefs, ref_key
from temporality_human_interaction.inbox import (
    NEVER_STORED_AFTER,
    RUN_ENTRIES_KEY,
    inbox_key,
    index_people,
    rebuild_index,
)
from temporality_human_interaction.records import HumanRequestRecord, open_store
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.runs import index_request
from temporality_human_interaction.settings import Settings
from temporality_protocol import HumanRequested
from temporality_protocol.catalog import BUCKET_HUMAN_REQUESTS

REQUESTS = BUCKET_HUMAN_REQUESTS.name
WHOLE_BUCKET = f"$KV.{REQUESTS}.>"


async def _store_as_the_first_version(bus: Bus) -> HumanRequestRecord:
    """A pending request stored as the first version stored it: the record only, no run or inbox entry."""
    event = requested()
    payload = event.payload(HumanRequested)
    record = HumanRequestRecord.from_requested(event, payload, [])
    await (await open_store(bus)).create(payload.request_id, record)
    return record


async def _inbox(client: httpx.AsyncClient) -> list[str]:
    reply = await client.get("/inbox", headers=ALICE)
    assert reply.status_code == 200, reply.text
    return sorted(r["id"] for r in reply.json()["requests"])


async def _listings_and_reads(spy: KvSpy) -> tuple[list[str], list[str]]:
    seen = await spy.calls()
    await spy.reset()
    return seen.listings, seen.reads


async def test_a_start_lists_the_request_keys_until_every_record_has_a_run_entry_then_never(
    bus: Bus, nats_settings: NatsSettings, handler: RequestHandler, client: httpx.AsyncClient
) -> None:
    for event in (requested(), requested()):
        await handler.handle(event)  # a run entry each, written before the record
    old = await _store_as_the_first_version(bus)
    assert old.request_id not in await _inbox(client)

    async with kv_calls(nats_settings.url, REQUESTS) as spy:
        first = await rebuild_index(bus)
        listings, reads = await _listings_and_reads(spy)
        assert first.listed_requests
        assert listings == [WHOLE_BUCKET]  # one listing of the request keys
        assert reads == [old.request_id]  # only the record the index did not know
        assert (first.read, first.pending) == (1, 1)
        # repaired as before: dated run entry, in the inbox; but that listing found one: no marker yet
        run = await ChannelRefs(bus).get(ref_key("run", old.run_id, old.request_id))
        assert run == old.request_id
        assert old.request_id in await _inbox(client)
        assert await ChannelRefs(bus).get(RUN_ENTRIES_KEY) is None
        await spy.reset()  # the inbox read the records

        second = await rebuild_index(bus)  # lists once more, finds every record known: writes the marker
        assert (second.listed_requests, second.read) == (True, 0)
        assert await _listings_and_reads(spy) == ([WHOLE_BUCKET], [])
        assert await ChannelRefs(bus).get(RUN_ENTRIES_KEY) is not None

        for _ in range(3):  # every later start: no listing of the requests bucket, no read
            later = await rebuild_index(bus)
            assert (later.listed_requests, later.read) == (False, 0)
            assert await _listings_and_reads(spy) == ([], [])


async def test_deleting_the_marker_has_the_next_start_find_a_record_without_a_run_entry(
    bus: Bus, nats_settings: NatsSettings, client: httpx.AsyncClient
) -> None:
    await rebuild_index(bus)  # an empty bucket: the marker at once
    assert await ChannelRefs(bus).get(RUN_ENTRIES_KEY) is not None
    # a replica of the first version still running during the upgrade stores a record after the marker
    late = await _store_as_the_first_version(bus)
    assert (await rebuild_index(bus)).listed_requests is False  # the starts no longer look for such a record
    assert late.request_id not in await _inbox(client)

    await ChannelRefs(bus).delete(RUN_ENTRIES_KEY)  # the upgrade rule: once the last old replica is gone
    async with kv_calls(nats_settings.url, REQUESTS) as spy:
        found = await rebuild_index(bus)
        assert (found.listed_requests, found.read, found.pending) == (True, 1, 1)
        assert await _listings_and_reads(spy) == ([WHOLE_BUCKET], [late.request_id])
    assert late.request_id in await _inbox(client)


async def test_a_request_never_stored_is_looked_up_until_its_entries_are_old_then_forgotten(
    bus: Bus, nats_settings: NatsSettings, handler: RequestHandler
) -> None:
    await rebuild_index(bus)  # the marker: the requests bucket is not listed below
    kept = requested(recipient="group:api-owners", allowed=("group:api-owners",))
    await handler.handle(kept)
    kept_id = str(kept.data["request_id"])
    # two intakes that crashed after their index entries, before their records: one after the run entry, one
    # after the first of a group's two inbox entries
    day = 86400.0  # deadlines well after the hour they are given (a start reads no request past its deadline)
    lonely = requested(expires_in_s=day)
    partial = requested(recipient="group:api-owners", allowed=("group:api-owners",), expires_in_s=day)
    for event in (lonely, partial):
        payload = event.payload(HumanRequested)
        await index_request(bus, payload.run_id, payload.request_id, payload.expires_at)
    part = partial.payload(HumanRequested)
    record = HumanRequestRecord.from_requested(partial, part, ["user:alice", "user:bob"])
    await index_people(bus, record, ["user:alice"])  # counted for two; bob's entry never written
    await ChannelRefs(bus).delete(inbox_key("user:bob", kept_id))  # and a stored request's lost entry
    lonely_id = lonely.payload(HumanRequested).request_id
    never = sorted([lonely_id, part.request_id])

    async with kv_calls(nats_settings.url, REQUESTS) as spy:
        young = await rebuild_index(bus)  # maybe an intake in progress: looked up, left alone
        assert (young.read, young.forgotten) == (1, 0)
        listings, reads = await _listings_and_reads(spy)
        assert (listings, sorted(reads)) == ([], sorted([*never, kept_id]))
        assert await ChannelRefs(bus).get(inbox_key("user:bob", kept_id)) == kept_id  # the stored one repaired

        later = datetime.now(UTC) + NEVER_STORED_AFTER + timedelta(minutes=1)
        old = await rebuild_index(bus, now=later)  # still not stored: never will be; its entries go
        assert (old.read, old.forgotten) == (0, 2)
        assert await _listings_and_reads(spy) == ([], never)
        for _ in range(2):
            assert (await rebuild_index(bus, now=later)).forgotten == 0
            assert await _listings_and_reads(spy) == ([], [])  # nobody looks them up again

    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    left = [ChannelRef.model_validate_json(e.value or b"").value for e in await live_entries(kv)]
    assert not set(never) & set(left)
    assert left.count(kept_id) == 3  # the stored request's run entry and both members' inbox entries stay

    # an intake that comes after all (a redelivery) indexes it again before storing it
    await handler.handle(lonely)
    assert await ChannelRefs(bus).get(inbox_key("user:alice", lonely_id)) == lonely_id
    assert await ChannelRefs(bus).get(ref_key("run", lonely.payload(HumanRequested).run_id, lonely_id)) == lonely_id


async def test_a_replica_lists_human_channels_once_as_it_starts_and_still_repairs_the_index(
    bus: Bus, nats_settings: NatsSettings, handler: RequestHandler
) -> None:
    """The index repair reads the snapshot the retention mirror has just taken (``__main__``), not a listing of
    its own: one listing of the whole bucket per start, however many keys it holds."""
    for event in (requested(), requested(recipient="group:api-owners", allowed=("group:api-owners",))):
        await handler.handle(event)
    old = await _store_as_the_first_version(bus)  # only a start's repair puts it in alice's inbox
    whole = f"$KV.{BUCKET_HUMAN_CHANNELS.name}.>"
    settings = Settings(nats=nats_settings, host="127.0.0.1", port=0, users_file=USERS_FILE, bus_timeout_s=5.0)
    async with kv_calls(nats_settings.url, BUCKET_HUMAN_CHANNELS.name) as spy, replica(settings) as url:
        listings = (await spy.calls()).listings  # the service is ready: its start is done
        assert listings.count(whole) == 1, listings
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            assert old.request_id in await _inbox(client)  # repaired from the mirror's snapshot
        assert (await spy.calls()).listings.count(whole) == 1  # the inbox reads alice's keys, not the bucket
