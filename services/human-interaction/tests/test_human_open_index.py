"""The index of open requests (the run entries, :mod:`.inbox`) carries each request's deadline, so the waiting/overdue gauges are a count over
the index and the retention sweep reads only the requests that may be due -- on a real nats-server with the
real handlers, consumers and the inbox API. Every count is compared with a full scan of the requests bucket
(the truth), after answers, expiries, cancellations, a lost index, entries written by an older version and
a restart (what every replica does at start: :func:`rebuild_index`)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from human_support import ALICE, request_run, requested, service_settings, stored, wait_for_record
from replica_support import replica, samples_of, value_of

from temporality_bus import Bus, NatsSettings, live_entries
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRef, ChannelRefs, ref_key
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.inbox import Rebuilt, RetentionSweeper, answerers, rebuild_index
from temporality_human_interaction.metrics import OpenCounts, count_open
from temporality_human_interaction.records import HumanRequestRecord, open_store
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.runs import RunEndHandler, index_request
from temporality_protocol import (
    HumanRequested,
    HumanRequestState,
    RunCancelled,
    make_event,
    new_id,
)
from temporality_protocol.catalog import BUCKET_HUMAN_REQUESTS
from temporality_service import metrics

GROUP = "group:api-owners"  # config/users.yaml: alice and bob


async def _truth(bus: Bus, now: datetime) -> tuple[int, int]:
    """(pending, pending past the deadline) from every record of the bucket: what the gauges must say."""
    store = await open_store(bus)
    pending: list[HumanRequestRecord] = []
    for key in await store.keys():
        got = await store.get(key)
        if got is not None and got.value.pending:
            pending.append(got.value)
    return len(pending), sum(1 for r in pending if r.expires_at < now)


async def _matches(bus: Bus, *, reads: int | None = None) -> OpenCounts:
    now = datetime.now(UTC)
    counts = await count_open(bus, now)
    assert (counts.waiting, counts.overdue) == await _truth(bus, now)
    if reads is not None:
        assert counts.read == reads
    return counts


async def _age_entries(bus: Bus, request_id: str) -> None:
    """Rewrite ``request_id``'s index entries as an older version wrote them: no deadline, nobody named."""
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    for entry in await live_entries(kv, "open.>") + await live_entries(kv, "run.>"):
        ref = ChannelRef.model_validate_json(entry.value or b"")
        if ref.value == request_id:
            await kv.put(
                str(entry.key), ChannelRef(value=ref.value, created_at=ref.created_at).model_dump_json().encode()
            )


async def _unname(bus: Bus, run_id: str, request_id: str) -> None:
    """Rewrite ``request_id``'s run entry as a version before 2026-12-06 wrote it: dated, naming nobody."""
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    key = ref_key("run", run_id, request_id)
    ref = ChannelRef.model_validate_json((await kv.get(key)).value or b"")
    await kv.put(key, ref.model_copy(update={"answerers": None}).model_dump_json().encode())


async def _named(bus: Bus, run_id: str, request_id: str) -> list[str] | None:
    ref = await ChannelRefs(bus).get_ref(ref_key("run", run_id, request_id))
    return ref.answerers if ref is not None else None


async def _ended(bus: Bus, key: str) -> str | None:
    ref = await ChannelRefs(bus).get_ref(key)
    assert ref is not None
    return ref.ended


async def _dated(bus: Bus, request_id: str, keys: str = ">") -> bool:
    """Whether every index entry (under ``keys``) of ``request_id`` carries its deadline."""
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    refs = [ChannelRef.model_validate_json(e.value or b"") for e in await live_entries(kv, keys)]
    mine = [r for r in refs if r.value == request_id]
    return bool(mine) and all(r.expires_at is not None for r in mine)


@pytest.mark.usefixtures("consumers")
async def test_the_gauges_count_the_index_and_match_a_full_scan_through_every_change(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    to_alice = [requested() for _ in range(3)]
    to_bob = requested(recipient="user:bob")
    to_group = requested(recipient=GROUP, allowed=(GROUP,))
    expiring = requested(expires_in_s=2)
    for event in [*to_alice, to_bob, to_group, expiring]:
        await handler.handle(event)
    counts = await _matches(bus, reads=0)  # every deadline ahead: not one record read
    assert counts.waiting == 6  # the group's request once, though indexed under alice and bob

    ids = [str(e.data["request_id"]) for e in to_alice]
    answered = await client.post(f"/requests/{ids[0]}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
    assert answered.status_code == 200, answered.text
    group_answer = await client.post(
        f"/requests/{to_group.data['request_id']}/answer", json={"option_id": "drop-v1"}, headers=ALICE
    )
    assert group_answer.status_code == 200, group_answer.text
    run_id = to_alice[1].runid
    assert run_id is not None
    await RunEndHandler(bus).handle(make_event(RunCancelled(run_id=run_id, reason="ops"), source="/t", run_id=run_id))
    await wait_for_record(
        bus, str(expiring.data["request_id"]), lambda r: r.status is HumanRequestState.EXPIRED and r.expiry_published
    )
    counts = await _matches(bus, reads=0)  # answered, cancelled and expired requests left the index
    assert counts.waiting == 2

    # a deadline timer that was lost: the request stays pending past its deadline; only it is read
    lost = requested(expires_in_s=-120)
    record = HumanRequestRecord.from_requested(lost, lost.payload(HumanRequested))
    await index_request(bus, record.run_id, record.request_id, record.expires_at, answerers(record))
    await (await open_store(bus)).create(record.request_id, record)
    counts = await _matches(bus, reads=1)
    assert (counts.waiting, counts.overdue) == (3, 1)
    assert counts.worst_s >= 120

    # an end mark that was lost (the request ended, its run entry says nothing): counted until its deadline,
    # then read and not counted
    ended_early = requested(expires_in_s=1)
    await handler.handle(ended_early)
    ended_id = str(ended_early.data["request_id"])
    await wait_for_record(bus, ended_id, lambda r: r.status is HumanRequestState.EXPIRED and r.expiry_published)
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    run_key = ref_key("run", str(ended_early.runid), ended_id)
    marked = ChannelRef.model_validate_json((await kv.get(run_key)).value or b"")
    assert marked.ended == HumanRequestState.EXPIRED.value
    await kv.put(run_key, marked.model_copy(update={"ended_at": None, "ended": None}).model_dump_json().encode())
    counts = await _matches(bus, reads=2)  # the overdue one and the unmarked one: both read, neither changed
    assert await _ended(bus, run_key) is None  # a gauge writes nothing
    await _matches(bus, reads=2)
    # the sweep repairs the index: it reads a request past its deadline whose run entry is not marked, marks it
    sweeper = RetentionSweeper(bus, retention=timedelta(days=1), every_s=60)
    await sweeper.sweep()
    assert await _ended(bus, run_key) == HumanRequestState.EXPIRED.value
    await _matches(bus, reads=1)


async def test_entries_of_an_older_version_are_dated_and_a_lost_index_is_found_at_start(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    waiting = [requested() for _ in range(3)]
    for event in waiting:
        await handler.handle(event)
    ids = [str(e.data["request_id"]) for e in waiting]
    old, wiped, fresh = ids

    # an older version wrote one request's entries without a deadline: the count reads it, and leaves it
    # as it is (a metrics read writes nothing; every replica does it)
    await _age_entries(bus, old)
    assert not await _dated(bus, old)
    await _matches(bus, reads=1)
    assert not await _dated(bus, old, "run.>")
    await _matches(bus, reads=1)

    # a restart after an upgrade: one request's run entry undated, another's naming nobody (before 2026-12-06)
    await _age_entries(bus, old)
    await _unname(bus, str(waiting[1].runid), wiped)
    assert (await rebuild_index(bus)).read == 2  # what every replica does at start: only these two are read
    assert await _dated(bus, old)
    assert await _named(bus, str(waiting[0].runid), old) == ["user:alice"]
    assert await _named(bus, str(waiting[1].runid), wiped) == ["user:alice"]
    assert (await rebuild_index(bus)).read == 0  # nothing missing any more
    counts = await _matches(bus, reads=0)
    assert counts.waiting == 3
    listed = await client.get("/inbox", headers=ALICE)
    assert sorted(r["id"] for r in listed.json()["requests"]) == sorted([old, wiped, fresh])


@pytest.mark.usefixtures("consumers")
async def test_the_sweep_reads_only_requests_that_may_be_due_and_never_misses_one(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler, directory: Directory
) -> None:
    soon, later, pending = requested(expires_in_s=2), requested(expires_in_s=600), requested(expires_in_s=3600)
    for event in (soon, later, pending):
        await handler.handle(event)
    soon_id, later_id, pending_id = (str(e.data["request_id"]) for e in (soon, later, pending))
    answered = await client.post(f"/requests/{later_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
    assert answered.status_code == 200, answered.text
    await wait_for_record(bus, soon_id, lambda r: r.status is HumanRequestState.EXPIRED and r.expiry_published)

    # ended requests an older version stored, without a run entry: the sweep must read them
    store = await open_store(bus)
    legacy: list[str] = []
    for expires_in_s, ended in ((-30, HumanRequestState.EXPIRED), (600, HumanRequestState.CANCELLED)):
        event = requested(expires_in_s=expires_in_s)
        record = HumanRequestRecord.from_requested(event, event.payload(HumanRequested))
        await store.create(
            record.request_id, record.moved_to(ended, ended_at=min(record.expires_at, datetime.now(UTC)))
        )
        legacy.append(record.request_id)
    legacy_due, legacy_kept = legacy
    # the sweep does not list the requests bucket: a record an older version stored without a run entry is
    # found by the next start (every replica rebuilds the index before it sweeps), which dates it
    assert (await rebuild_index(bus)).read == 2

    now = datetime.now(UTC)
    retention = timedelta(seconds=30)

    def at(offset_s: float) -> RetentionSweeper:
        return RetentionSweeper(bus, retention=retention, every_s=60, clock=lambda: now + timedelta(seconds=offset_s))

    first = at(0)
    assert await first.sweep() == 1  # the legacy request past its retention
    assert first.last_read == 1  # only the one that may be due (ended 30 s before its deadline passed)
    assert await stored(bus, legacy_due) is None
    kept = await stored(bus, legacy_kept)
    assert kept is not None
    assert await ChannelRefs(bus).get(ref_key("run", kept.run_id, legacy_kept)) == legacy_kept  # dated now

    quiet = at(10)
    assert await quiet.sweep() == 0
    assert quiet.last_read == 0  # every deadline + retention ahead: not one record read

    soon_due = at(40)  # past the expired request's deadline + retention
    assert await soon_due.sweep() == 1
    assert soon_due.last_read == 1
    assert await stored(bus, soon_id) is None
    assert await stored(bus, later_id) is not None  # answered, but its deadline is 10 min away

    # a crash between purging the record and its run entry (deleted last): the next sweep reads it, drops it
    later_run_key = ref_key("run", str(later.runid), later_id)
    await (await bus.kv(BUCKET_HUMAN_REQUESTS)).delete(later_id)
    late = at(700)
    assert await late.sweep() == 1  # the kept legacy one (deadline + 600 s, + retention)
    assert late.last_read == 2  # it, and the run entry whose record is gone
    assert await ChannelRefs(bus).get(later_run_key) is None
    assert await stored(bus, legacy_kept) is None
    assert await stored(bus, pending_id) is not None  # pending requests are never purged
    assert (await _matches(bus, reads=0)).waiting == 1
    # the first start found records without a run entry, so this one lists the request keys once more: it finds
    # none without one and marks that (inbox.RUN_ENTRIES_KEY); the starts after it list nothing
    idle = Rebuilt(read=0, pending=0, dropped=0, listed_requests=True)
    assert (await at(700).sweep(), await rebuild_index(bus)) == (0, idle)
    assert await rebuild_index(bus) == Rebuilt(read=0, pending=0, dropped=0, listed_requests=False)


USERS = """users:
  alice:
    display_name: Alice Example
    inbox_token: alice-demo-inbox-token-change-me
    preferred: web
    channels: {web: {}}
"""


async def _gauges(client: httpx.AsyncClient, waiting: int, overdue: int, *, within_s: float = 30) -> None:
    """Until the replica's /metrics says ``waiting`` and ``overdue`` (bounded)."""
    seen: tuple[float, float] = (-1, -1)
    try:
        async with asyncio.timeout(within_s):
            while True:
                samples = samples_of((await client.get("/metrics")).text)
                seen = (
                    value_of(samples, "temporality_human_requests_waiting"),
                    value_of(samples, "temporality_human_requests_overdue"),
                )
                if seen == (waiting, overdue):
                    return
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"gauges (waiting, overdue) stayed {seen}, not {(waiting, overdue)}") from None


@pytest.mark.timeout(150)
async def test_a_restarted_replica_completes_the_index_and_its_gauges_match_the_store(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real service: its gauges count the index; after a restart on an index an older version left
    (undated entries) and that lost an entry, the start completes it and the gauges still match a full scan."""
    monkeypatch.setattr(metrics, "STATE_REFRESH_S", 0.2)
    settings = service_settings(tmp_path, nats_settings, USERS)
    run_id = new_id("run")
    await request_run(bus, run_id, ["user:alice"])
    asked = [requested(allowed=("user:alice",), run_id=run_id) for _ in range(4)]
    ids = [str(e.data["request_id"]) for e in asked]
    async with replica(settings) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        for event in asked:
            await bus.publish(event)
        await _gauges(client, 4, 0)
        answered = await client.post(f"/requests/{ids[0]}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
        assert answered.status_code == 200, answered.text
        await _gauges(client, 3, 0)
    assert (await count_open(bus, datetime.now(UTC))).read == 0

    # while it is down: an older version's entries (no deadline, nobody named) and one naming nobody
    await _age_entries(bus, ids[1])
    await _unname(bus, run_id, ids[2])
    async with replica(settings) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        await _gauges(client, 3, 0)
        assert await _dated(bus, ids[1])  # the start dated it
        assert await _named(bus, run_id, ids[1]) == ["user:alice"]  # and named who may answer them
        assert await _named(bus, run_id, ids[2]) == ["user:alice"]
        counts = await _matches(bus, reads=0)
        assert counts.waiting == 3
        listed = await client.get("/inbox", headers=ALICE)
        assert sorted(r["id"] for r in listed.json()["requests"]) == sorted(ids[1:])
