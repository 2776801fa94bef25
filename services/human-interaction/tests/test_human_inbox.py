"""The index of open requests behind ``GET /inbox`` (the run entries naming who may answer) and the retention purge
(HUM-3)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import httpx
import pytest
import structlog
from human_support import ALICE, BOB, requested, running, stored, wait_for_record
from nats.js.kv import KeyValue

from temporality_bus import Bus, Consumer, Contended, TransientError
from temporality_human_interaction import inbox
from temporality_human_interaction.channels import WebInboxAdapter
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRef, ChannelRefs, ref_key
from temporality_human_interaction.deadlines import DeadlineHandler
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.inbox import (
    RetentionSweeper,
    arm_sweep,
    inbox_entries,
    inbox_key,
    index_people,
    list_inbox,
    rebuild_index,
)
from temporality_human_interaction.records import list_pending, open_store
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.runs import RunEndHandler, requests_of_run
from temporality_protocol import HumanRequestState, RunCancelled, make_event, new_id
from temporality_protocol.catalog import CONSUMERS


async def open_requests_of(bus: Bus, user: str) -> list[str]:
    """The request ids the index lists for ``user`` (a listing of the bucket: what an inbox reads the records of)."""
    return sorted({e.value for e in await inbox_entries(bus, user)})


async def _ids(client: httpx.AsyncClient, headers: dict[str, str]) -> list[str]:
    response = await client.get("/inbox", headers=headers)
    assert response.status_code == 200
    return [r["id"] for r in response.json()["requests"]]


async def test_the_index_follows_every_state_change_and_matches_a_full_scan(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    to_alice = [requested() for _ in range(3)]
    to_bob = requested(recipient="user:bob")
    for event in [*to_alice, to_bob]:
        await handler.handle(event)
    ids = [str(e.data["request_id"]) for e in to_alice]
    assert sorted(await open_requests_of(bus, "user:alice")) == sorted(ids)
    assert await open_requests_of(bus, "user:bob") == [to_bob.data["request_id"]]

    # answered -> out of the index; cancelled (its run ended) -> out of the index
    answered = await client.post(f"/requests/{ids[0]}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
    assert answered.status_code == 200
    run_id = to_alice[1].runid
    assert run_id is not None
    await RunEndHandler(bus).handle(
        make_event(RunCancelled(run_id=run_id, reason="operator"), source="/test", run_id=run_id)
    )
    assert await open_requests_of(bus, "user:alice") == [ids[2]]
    assert await _ids(client, ALICE) == [ids[2]]
    assert await _ids(client, BOB) == [to_bob.data["request_id"]]

    store = await open_store(bus)
    for user in ("user:alice", "user:bob"):  # the index gives what a scan of every request gives
        assert [r.request_id for r in await list_inbox(bus, store, user)] == [
            r.request_id for r in await list_pending(store, user)
        ]
    record = await stored(bus, ids[0])
    assert record is not None
    assert record.ended_at is not None


async def test_a_run_end_cancels_each_request_of_the_run_and_passes_over_a_dropped_entry(
    bus: Bus, handler: RequestHandler
) -> None:
    """The run's end finds its request ids from the subjects the bucket's stream holds under ``run.<run id>.*``
    (one ``STREAM.INFO``): every pending request of the run is cancelled, another run's is not, and an entry
    dropped meanwhile (its last message a purge: the retention sweep's, or one of a request never stored) is
    listed too and changes nothing."""
    first = requested()
    run_id = str(first.runid)
    second, other = requested(run_id=run_id), requested()
    for event in (first, second, other):
        await handler.handle(event)
    refs = ChannelRefs(bus)
    await refs.claim(ref_key("run", run_id, "hreq-never-stored"), "hreq-never-stored")
    await refs.delete(ref_key("run", run_id, "hreq-never-stored"))
    ids = [str(first.data["request_id"]), str(second.data["request_id"]), "hreq-never-stored"]
    assert await requests_of_run(bus, run_id) == sorted(ids)  # the dropped entry is listed too

    await RunEndHandler(bus).handle(
        make_event(RunCancelled(run_id=run_id, reason="operator"), source="/t", run_id=run_id)
    )

    for event in (first, second):
        record = await stored(bus, str(event.data["request_id"]))
        assert record is not None
        assert record.status is HumanRequestState.CANCELLED
    untouched = await stored(bus, str(other.data["request_id"]))
    assert untouched is not None
    assert untouched.status is HumanRequestState.PENDING
    assert await stored(bus, "hreq-never-stored") is None  # passed over: nothing made for it


async def test_a_run_end_listed_from_the_bucket_cancels_a_request_whose_id_is_too_long_for_a_key(
    bus: Bus, handler: RequestHandler
) -> None:
    """A request id longer than a key part may be is keyed by its hash under ``run.<run id>.``: the listing from
    the bucket gives the id the entry holds (not the hash), and the run's end (no mirror: the bucket's listing)
    cancels that request."""
    run_id = new_id("run")
    long_id = "hreq-" + "a" * 80
    event = requested(run_id=run_id, request_id=long_id)
    short = requested(run_id=run_id)
    for each in (event, short):
        await handler.handle(each)
    assert ref_key("run", run_id, long_id) != f"run.{run_id}.{long_id}"  # the id is hashed in its key
    assert sorted(await requests_of_run(bus, run_id)) == sorted([long_id, str(short.data["request_id"])])

    await RunEndHandler(bus).handle(
        make_event(RunCancelled(run_id=run_id, reason="operator"), source="/t", run_id=run_id)
    )

    for request_id in (long_id, str(short.data["request_id"])):
        record = await stored(bus, request_id)
        assert record is not None
        assert record.status is HumanRequestState.CANCELLED


async def test_a_request_whose_id_is_too_long_for_a_key_is_in_the_inbox(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    """Its run entry is keyed by the id's hash: the inbox lists the id the entry holds."""
    long_id = "hreq-" + "b" * 80
    await handler.handle(requested(request_id=long_id))
    assert long_id in await open_requests_of(bus, "user:alice")
    assert long_id in await _ids(client, ALICE)


async def test_a_stale_entry_is_skipped_and_dropped_and_a_lost_index_is_rebuilt(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    done, waiting = requested(), requested()
    for event in (done, waiting):
        await handler.handle(event)
    done_id, waiting_id = str(done.data["request_id"]), str(waiting.data["request_id"])
    assert (await client.post(f"/requests/{done_id}/answer", json={"option_id": "drop-v1"}, headers=ALICE)).is_success

    refs = ChannelRefs(bus)
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    done_key = ref_key("run", str(done.runid), done_id)
    lost_mark = ChannelRef(value=done_id, expires_at=datetime.now(UTC) + timedelta(hours=1), answerers=["user:alice"])
    await kv.put(done_key, lost_mark.model_dump_json().encode())  # its end's mark was lost
    # an older version's inbox entries (open.*): its removal lost, one whose record never came, one for bob
    await refs.claim(inbox_key("user:alice", done_id), done_id)
    await refs.claim(inbox_key("user:alice", "hreq-never-stored"), "hreq-never-stored")
    await refs.claim(inbox_key("user:bob", waiting_id), waiting_id)  # someone who may not answer it
    assert await _ids(client, ALICE) == [waiting_id]
    assert await _ids(client, BOB) == []
    assert done_id not in await open_requests_of(bus, "user:alice")  # marked ended, and dropped, while listing
    marked = await refs.get_ref(done_key)
    assert marked is not None
    assert marked.ended == HumanRequestState.ANSWERED.value
    assert await refs.get(inbox_key("user:alice", done_id)) is None

    # an older version's run entry: nobody named, so every inbox reads its record (and the inbox names them)
    waiting_key = ref_key("run", str(waiting.runid), waiting_id)
    old = ChannelRef(value=waiting_id, expires_at=datetime.now(UTC) + timedelta(hours=1))
    await kv.put(waiting_key, old.model_dump_json().encode())
    assert waiting_id in await open_requests_of(bus, "user:carol")  # anyone's, until its record is read
    assert await _ids(client, BOB) == []
    assert await _ids(client, ALICE) == [waiting_id]
    named = await refs.get_ref(waiting_key)
    assert named is not None
    assert named.answerers == ["user:alice"]
    assert waiting_id not in await open_requests_of(bus, "user:carol")
    await kv.put(waiting_key, old.model_dump_json().encode())  # again: a start names them too
    assert (await rebuild_index(bus)).pending == 1
    assert await _ids(client, ALICE) == [waiting_id]
    assert (await rebuild_index(bus)).pending == 0  # idempotent: nothing is missing any more
    assert await open_requests_of(bus, "user:alice") == sorted([waiting_id, "hreq-never-stored"])


async def test_a_group_request_is_indexed_under_each_member(bus: Bus, directory: Directory) -> None:
    group_id = "api-owners"  # config/users.yaml: alice and bob
    group = directory.group(group_id)
    assert group is not None
    assert len(group.members) >= 2
    async with WebInboxAdapter() as web:
        handler = RequestHandler(bus, directory, {web.name: web})
        event = requested(recipient=f"group:{group_id}", allowed=(f"group:{group_id}",))
        await handler.handle(event)
    for member in group.members:
        assert await open_requests_of(bus, f"user:{member}") == [event.data["request_id"]]


@pytest.mark.usefixtures("consumers")
async def test_ended_requests_are_purged_after_the_retention_and_never_before(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    expired, answered, pending = requested(expires_in_s=-5), requested(expires_in_s=3600), requested()
    for event in (expired, answered, pending):
        await handler.handle(event)
    expired_id, answered_id, pending_id = (str(e.data["request_id"]) for e in (expired, answered, pending))
    await wait_for_record(bus, expired_id, lambda r: r.status is HumanRequestState.EXPIRED and r.expiry_published)
    assert (
        await client.post(f"/requests/{answered_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
    ).is_success

    now = datetime.now(UTC)
    retention = timedelta(seconds=30)
    early = RetentionSweeper(bus, retention=retention, every_s=60, clock=lambda: now + timedelta(seconds=10))
    assert await early.sweep() == 0  # within the retention: kept
    assert await stored(bus, expired_id) is not None

    later = RetentionSweeper(bus, retention=retention, every_s=60, clock=lambda: now + timedelta(seconds=40))
    assert await later.sweep() == 1  # the expired one; the answered one waits for its deadline too
    assert await stored(bus, expired_id) is None
    assert await ChannelRefs(bus).get(ref_key("run", str(expired.runid), expired_id)) is None
    assert await stored(bus, answered_id) is not None
    gone = await client.get(f"/requests/{expired_id}", headers=ALICE)
    assert gone.status_code == 404

    much_later = RetentionSweeper(bus, retention=retention, every_s=60, clock=lambda: now + timedelta(seconds=3700))
    assert await much_later.sweep() == 1
    assert await stored(bus, answered_id) is None
    assert await stored(bus, pending_id) is not None  # pending requests are never purged
    assert await _ids(client, ALICE) == [pending_id]


@pytest.fixture
async def sweeping(bus: Bus) -> AsyncIterator[RetentionSweeper]:
    sweeper = RetentionSweeper(bus, retention=timedelta(milliseconds=10), every_s=1)
    handler = DeadlineHandler(bus, sweeper=sweeper)
    consumer = Consumer(bus, CONSUMERS["human-interaction-deadlines"], raw_handler=handler.handle, fetch_timeout_s=0.2)
    async with running(consumer):
        yield sweeper


async def test_the_sweep_runs_on_its_timer_and_replicas_arm_one_slot(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler, sweeping: RetentionSweeper
) -> None:
    event = requested(expires_in_s=-5)
    request_id = str(event.data["request_id"])
    await handler.handle(event)
    await wait_for_record(bus, request_id, lambda r: r.status is HumanRequestState.EXPIRED and r.expiry_published)

    now = datetime.now(UTC)
    first = await arm_sweep(bus, 1, now)
    second = await arm_sweep(bus, 1, now)  # another replica starting in the same slot
    assert not first.duplicate
    assert second.duplicate

    # the timer fires, the sweep purges it, and arms the next slot
    await _until_gone(bus, request_id)


async def _until_gone(bus: Bus, request_id: str, *, within_s: float = 30) -> None:
    store = await open_store(bus)
    async with asyncio.timeout(within_s):
        while True:
            if await store.get(request_id) is None:
                return
            await asyncio.sleep(0.1)


class _FailingSweeper(RetentionSweeper):
    async def sweep(self) -> int:
        raise RuntimeError("the sweep failed")


async def test_a_failing_sweep_still_leaves_the_next_one_armed(bus: Bus) -> None:
    now = datetime(2026, 12, 2, 21, 30, 5, tzinfo=UTC)
    sweeper = _FailingSweeper(bus, retention=timedelta(days=1), every_s=3600, clock=lambda: now)
    with pytest.raises(RuntimeError, match="the sweep failed"):
        await sweeper.fired()
    # the slot after ``now`` is already armed: another replica (or the next start) arming it is a duplicate
    assert (await arm_sweep(bus, 3600, now)).duplicate


async def test_a_failing_repair_is_logged_and_the_inbox_still_answers(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writes an inbox read repairs as it goes (a lost end mark, an older version's run entry naming nobody,
    an older version's inbox entry of an ended request) are best effort: one that fails is logged and the read
    answers all the same (the sweep and the next start repair it)."""
    done, waiting = requested(), requested()
    for event in (done, waiting):
        await handler.handle(event)
    done_id, waiting_id = str(done.data["request_id"]), str(waiting.data["request_id"])
    assert (await client.post(f"/requests/{done_id}/answer", json={"option_id": "drop-v1"}, headers=ALICE)).is_success
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    later = datetime.now(UTC) + timedelta(hours=1)
    lost_mark = ChannelRef(value=done_id, expires_at=later, answerers=["user:alice"])
    await kv.put(ref_key("run", str(done.runid), done_id), lost_mark.model_dump_json().encode())
    older = ChannelRef(value=waiting_id, expires_at=later)  # names nobody
    await kv.put(ref_key("run", str(waiting.runid), waiting_id), older.model_dump_json().encode())
    await ChannelRefs(bus).claim(inbox_key("user:alice", done_id), done_id)

    async def unavailable(*_: object, **__: object) -> NoReturn:
        raise TransientError("human-channels: no responders")

    monkeypatch.setattr(ChannelRefs, "fill", unavailable)
    monkeypatch.setattr(ChannelRefs, "mark_ended", unavailable)
    monkeypatch.setattr(inbox, "_drop", unavailable)
    with structlog.testing.capture_logs() as logs:
        assert await _ids(client, ALICE) == [waiting_id]
    failed = sorted(e["key"] for e in logs if e["event"] == "inbox.repair_failed" and e["log_level"] == "warning")
    assert failed == sorted(
        [
            ref_key("run", str(done.runid), done_id),
            ref_key("run", str(waiting.runid), waiting_id),
            inbox_key("user:alice", done_id),
        ]
    )
    assert all("no responders" in e["error"] for e in logs if e["event"] == "inbox.repair_failed")


async def test_naming_people_on_an_ended_request_writes_nothing(bus: Bus, handler: RequestHandler) -> None:
    event = requested()
    await handler.handle(event)
    request_id = str(event.data["request_id"])
    record = await stored(bus, request_id)
    assert record is not None
    key = ref_key("run", record.run_id, request_id)
    await ChannelRefs(bus).mark_ended(key, datetime.now(UTC), HumanRequestState.ANSWERED.value)
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    before = await kv.get(key)
    await index_people(bus, record, ["user:bob"])  # an escalation that comes after the end
    after = await kv.get(key)
    assert after.revision == before.revision  # no write
    assert ChannelRef.model_validate_json(after.value or b"").answerers == ["user:alice"]


async def test_concurrent_inbox_reads_without_a_mirror_share_one_listing_that_begins_after_them(
    bus: Bus, handler: RequestHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a mirror, the inbox lists the run entries: the reads that come while a listing is under way share
    the next one, which begins after them -- so each still sees a request stored just before it."""
    first = requested()
    await handler.handle(first)
    started, release = asyncio.Event(), asyncio.Event()
    listings: list[str] = []
    listing = inbox.live_entries

    async def held(kv: KeyValue, keys: str = ">", **kwargs: Any) -> list[KeyValue.Entry]:
        found = await listing(kv, keys, **kwargs)
        if keys == "run.>":
            listings.append(keys)
            if len(listings) == 1:  # the first one: held once it has listed (a slow listing)
                started.set()
                await release.wait()
        return found

    monkeypatch.setattr(inbox, "live_entries", held)
    early = asyncio.create_task(inbox_entries(bus, "user:alice"))
    await asyncio.wait_for(started.wait(), 30)
    second = requested()
    await handler.handle(second)  # stored after the first listing read the bucket, before the calls below
    later = [asyncio.create_task(inbox_entries(bus, who)) for who in ("user:alice", "user:bob", "user:alice")]
    await asyncio.sleep(0)
    release.set()
    ids = {str(e.data["request_id"]) for e in (first, second)}
    assert {e.value for e in await asyncio.wait_for(early, 30)} == {str(first.data["request_id"])}
    alice, bob, alice_again = await asyncio.wait_for(asyncio.gather(*later), 30)
    assert {e.value for e in alice} == {e.value for e in alice_again} == ids  # the second request too
    assert bob == []
    assert len(listings) == 2  # four reads, two listings: the three later ones shared the second


async def test_a_failed_shared_listing_is_not_kept(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the mirror is down every fallback listing may fail: none is kept once it is over (each failure's
    traceback would hold the one before it, and the connection, for as long as the failures go on)."""

    async def failing(kv: KeyValue, keys: str = ">", **kwargs: Any) -> NoReturn:
        raise TransientError("the bucket cannot be listed now")

    monkeypatch.setattr(inbox, "live_entries", failing)
    shared = inbox._run_listing(bus)
    for _ in range(3):
        with pytest.raises(TransientError):
            await inbox_entries(bus, "user:alice")
        await asyncio.sleep(0)  # (the done callbacks)
        assert shared._running is None
        assert shared._next is None


async def test_a_start_whose_end_mark_keeps_losing_still_starts(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start's end mark of an ended request whose run entry lost it: one that keeps losing its compare-and-set
    (Contended) is left to the next sweep or start, not a failed start."""
    done = requested()
    await handler.handle(done)
    done_id = str(done.data["request_id"])
    assert (await client.post(f"/requests/{done_id}/answer", json={"option_id": "drop-v1"}, headers=ALICE)).is_success
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    # an older version's entry (nobody named: the start reads its record), its end's mark lost
    lost_mark = ChannelRef(value=done_id, expires_at=datetime.now(UTC) + timedelta(hours=1))
    await kv.put(ref_key("run", str(done.runid), done_id), lost_mark.model_dump_json().encode())
    tried: list[str] = []

    async def contended(self: ChannelRefs, key: str, *args: Any, **kwargs: Any) -> NoReturn:
        tried.append(key)
        raise Contended(BUCKET_HUMAN_CHANNELS, key, 5)

    monkeypatch.setattr(ChannelRefs, "mark_ended", contended)
    await rebuild_index(bus)  # does not raise
    assert tried == [ref_key("run", str(done.runid), done_id)]
