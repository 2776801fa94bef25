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
from human_support import ALICE, USERS_FILE, KvSpy, kv_calls, requested, timer_messages
from replica_support import replica

from temporality_bus import Bus, NatsSettings, live_entries
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRef, ChannelRefs, ref_key
from temporality_human_interaction.inbox import (
    NEVER_STORED_AFTER,
    RUN_ENTRIES_KEY,
    rebuild_index,
)
from temporality_human_interaction.records import HumanRequestRecord, open_store
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.runs import index_request
from temporality_human_interaction.settings import Settings
from temporality_protocol import HumanRequested
from temporality_protocol.catalog import BUCKET_HUMAN_REQUESTS, TIMER_SCHEDULE_HUMAN

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
        await handler.handle(event)  # a run entry each, written just after the record
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

    deadline = f"{TIMER_SCHEDULE_HUMAN}.{late.request_id}"
    assert await timer_messages(bus, deadline) == 0  # (as an intake given up on before its run entry leaves it)
    await ChannelRefs(bus).delete(RUN_ENTRIES_KEY)  # the upgrade rule: once the last old replica is gone
    async with kv_calls(nats_settings.url, REQUESTS) as spy:
        found = await rebuild_index(bus)
        assert (found.listed_requests, found.read, found.pending) == (True, 1, 1)
        assert await _listings_and_reads(spy) == ([WHOLE_BUCKET], [late.request_id])
    assert late.request_id in await _inbox(client)
    assert await timer_messages(bus, deadline) == 1  # and its deadline armed: it expires, its run resumes


async def test_a_request_never_stored_is_looked_up_until_its_entries_are_old_then_forgotten(
    bus: Bus, nats_settings: NatsSettings, handler: RequestHandler
) -> None:
    await rebuild_index(bus)  # the marker: the requests bucket is not listed below
    kept = requested(recipient="group:api-owners", allowed=("group:api-owners",))
    await handler.handle(kept)
    kept_id = str(kept.data["request_id"])
    # two intakes that crashed after their run entry, before their records: an older version's (its run entry names
    # nobody: a start looks it up) and this version's (named: nothing tells a start to look it up; the sweep drops
    # it once its deadline + the retention passed and its record is still not there)
    day = 86400.0  # deadlines well after the hour they are given (a start reads no request past its deadline)
    lonely = requested(expires_in_s=day)
    named = requested(recipient="group:api-owners", allowed=("group:api-owners",), expires_in_s=day)
    lonely_id = lonely.payload(HumanRequested).request_id
    await index_request(
        bus, lonely.payload(HumanRequested).run_id, lonely_id, lonely.payload(HumanRequested).expires_at
    )
    part = named.payload(HumanRequested)
    await index_request(bus, part.run_id, part.request_id, part.expires_at, ["user:alice", "user:bob"])
    # and a stored request whose run entry an older version wrote (naming nobody)
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    kept_key = ref_key("run", str(kept.runid), kept_id)
    older = ChannelRef.model_validate_json((await kv.get(kept_key)).value or b"").model_copy(update={"answerers": None})
    await kv.put(kept_key, older.model_dump_json().encode())

    async with kv_calls(nats_settings.url, REQUESTS) as spy:
        young = await rebuild_index(bus)  # maybe an intake in progress: looked up, left alone
        assert (young.read, young.forgotten) == (1, 0)
        listings, reads = await _listings_and_reads(spy)
        assert (listings, sorted(reads)) == ([], sorted([lonely_id, kept_id]))
        repaired = await ChannelRefs(bus).get_ref(kept_key)
        assert repaired is not None
        assert repaired.answerers == ["user:alice", "user:bob"]  # the stored one's members named

        later = datetime.now(UTC) + NEVER_STORED_AFTER + timedelta(minutes=1)
        old = await rebuild_index(bus, now=later)  # still not stored: never will be; its entry goes
        assert (old.read, old.forgotten) == (0, 1)
        assert await _listings_and_reads(spy) == ([], [lonely_id])
        for _ in range(2):
            assert (await rebuild_index(bus, now=later)).forgotten == 0
            assert await _listings_and_reads(spy) == ([], [])  # nobody looks them up again

    left = [ChannelRef.model_validate_json(e.value or b"").value for e in await live_entries(kv)]
    assert lonely_id not in left
    assert left.count(kept_id) == 1  # the stored request's run entry stays (no per-person entry)

    # an intake that comes after all (a redelivery) indexes it again before storing it, naming who may answer
    await handler.handle(lonely)
    again = await ChannelRefs(bus).get_ref(ref_key("run", lonely.payload(HumanRequested).run_id, lonely_id))
    assert again is not None
    assert (again.value, again.answerers) == (lonely_id, ["user:alice"])


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
