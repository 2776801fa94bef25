"""``GET /inbox`` from the replica's mirror of ``human-channels`` (the run entries naming who may answer), with two
replicas and across an upgrade from the per-person inbox entries (``open.<user>.<id>``, before 2026-12-06).

Two real replicas (the service's own ``configure``/``setup``, each its own connection and mirror) on one
nats-server. A replica's inbox waits until its mirror has applied the bucket's last revision as of the call, so a
request another replica took in before the call is listed by the first read: the tests read each inbox once
right after ``human.notified`` is on the bus (published after the record and its run entry are stored) -- that
first read is the behaviour under test, not a timing guess. Whatever a test waits for besides is bounded.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from human_support import (
    ALICE,
    ALICE_BOB_AND_API_OWNERS,
    BOB,
    events_of,
    inbox_ids,
    request_run,
    requested,
    service_settings,
)
from nats.js.kv import KeyValue
from replica_support import replica

from temporality_bus import Bus, NatsSettings
from temporality_human_interaction import inbox
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRef, ChannelRefs, ref_key
from temporality_human_interaction.inbox import inbox_key, list_inbox
from temporality_human_interaction.mirror import ChannelEntry, ChannelMirror
from temporality_human_interaction.records import open_store
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import HumanRequestState, new_id

USERS = ALICE_BOB_AND_API_OWNERS
GROUP = "group:api-owners"


class _Answered:
    """Counts who answered the replicas' inbox reads: their mirrors (:meth:`ChannelMirror.inbox`) or a listing of
    the run entries (the fallback when a mirror is down or behind)."""

    def __init__(self) -> None:
        self.mirror = 0
        self.listings = 0


@pytest.fixture
def answered(monkeypatch: pytest.MonkeyPatch) -> _Answered:
    """Spies on where each inbox read came from. The inbox's wait for its mirror is made long enough that only a
    mirror that is never used, or whose watch is down, leaves a read to the listing (no wall-clock guess)."""
    seen = _Answered()
    monkeypatch.setattr(inbox, "_INBOX_CATCH_UP_S", 60.0)
    from_mirror, listing = ChannelMirror.inbox, inbox.live_entries

    def mirrored(self: ChannelMirror, user: str) -> list[ChannelEntry]:
        seen.mirror += 1
        return from_mirror(self, user)

    async def listed(kv: KeyValue, keys: str = ">", **kwargs: Any) -> list[KeyValue.Entry]:
        if keys == "run.>":
            seen.listings += 1
        return await listing(kv, keys, **kwargs)

    monkeypatch.setattr(ChannelMirror, "inbox", mirrored)
    monkeypatch.setattr(inbox, "live_entries", listed)
    return seen


async def _until_gone(bus: Bus, key: str, *, within_s: float = 30) -> None:
    """Until ``key`` of ``human-channels`` holds nothing (bounded)."""
    refs = ChannelRefs(bus)
    try:
        async with asyncio.timeout(within_s):
            while True:
                if await refs.get(key) is None:
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"{key} is still there after {within_s}s") from None


@pytest.mark.timeout(150)
async def test_each_replica_lists_a_request_any_replica_took_in_from_its_first_read(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, answered: _Answered
) -> None:
    settings = service_settings(tmp_path, nats_settings, USERS)
    run_id = new_id("run")
    await request_run(bus, run_id, ["user:alice", "user:bob", GROUP])
    allowed = ("user:alice", "user:bob", GROUP)
    async with AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(replica(settings)) for _ in range(2)]
        clients = [await stack.enter_async_context(httpx.AsyncClient(base_url=u, timeout=10)) for u in urls]
        asked = [
            requested(recipient=who, allowed=allowed, run_id=run_id)
            for who in ("user:alice", "user:bob", GROUP, "user:alice", "user:bob", GROUP)
        ]
        mine: dict[str, list[str]] = {"user:alice": [], "user:bob": []}
        for n, event in enumerate(asked, start=1):
            await bus.publish(event)
            await events_of(bus, "human.notified", wait_for=n)  # stored, with its run entry, by one of the two
            request_id = str(event.data["request_id"])
            for person in mine:
                if event.data["recipient"] in (person, GROUP):
                    mine[person].append(request_id)
            for client in clients:  # the first read of each replica: its mirror caught up before it answered
                assert await inbox_ids(client, ALICE) == sorted(mine["user:alice"])
                assert await inbox_ids(client, BOB) == sorted(mine["user:bob"])

        # answered through one replica: neither lists it from then on (the record says so, whatever the mirror)
        group_id = str(asked[2].data["request_id"])
        reply = await clients[1].post(f"/requests/{group_id}/answer", json={"option_id": "keep-v1"}, headers=BOB)
        assert reply.status_code == 200, reply.text
        for person in mine.values():
            person.remove(group_id)
        for client in clients:
            assert await inbox_ids(client, ALICE) == sorted(mine["user:alice"])
            assert await inbox_ids(client, BOB) == sorted(mine["user:bob"])
        [answer] = await events_of(bus, "human.answered", wait_for=1)
        assert answer.data["request_id"] == group_id
    # every read above was answered by the replica's mirror, none by a listing of the run entries
    assert (answered.mirror, answered.listings) == (2 * 2 * (len(asked) + 1), 0)
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    entry = ChannelRef.model_validate_json((await kv.get(ref_key("run", run_id, group_id))).value or b"")
    assert entry.answerers == ["user:alice", "user:bob"]
    assert entry.ended == HumanRequestState.ANSWERED.value


@pytest.mark.timeout(150)
async def test_an_upgrade_keeps_an_older_version_s_inbox_entries_working_and_drops_them_at_the_end(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, answered: _Answered
) -> None:
    """What a version before 2026-12-06 left in the bucket: its run entries name nobody, and each person who may
    answer has an ``open.<user>.<id>`` entry -- one of them for bob, to whom that version escalated the request
    (its record says so). The new replica lists the request for both, names them on the run entry at its start,
    and drops the older entries once the request is answered."""
    settings = service_settings(tmp_path, nats_settings, USERS)
    run_id = new_id("run")
    await request_run(bus, run_id, ["user:alice"])
    event = requested(recipient="user:alice", allowed=("user:alice",), run_id=run_id)
    request_id = str(event.data["request_id"])
    async with replica(settings):
        await bus.publish(event)
        await events_of(bus, "human.notified", wait_for=1)

    # as the older version left it: escalated to bob (the record), the run entry naming nobody, inbox entries
    store = await open_store(bus)
    got = await store.get(request_id)
    assert got is not None
    await store.update(request_id, got.value.model_copy(update={"escalated_to": "user:bob"}), got.revision)
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    run_key = ref_key("run", run_id, request_id)
    older = ChannelRef.model_validate_json((await kv.get(run_key)).value or b"").model_copy(update={"answerers": None})
    await kv.put(run_key, older.model_dump_json().encode())
    refs = ChannelRefs(bus)
    for person in ("user:alice", "user:bob"):
        await refs.claim(inbox_key(person, request_id), request_id, expires_at=older.expires_at, people=2)

    async with replica(settings) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        assert await inbox_ids(client, ALICE) == [request_id]
        assert await inbox_ids(client, BOB) == [request_id]
        named = await refs.get_ref(run_key)
        assert named is not None
        assert named.answerers == ["user:alice", "user:bob"]  # the start named them
        reply = await client.post(f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=BOB)
        assert reply.status_code == 200, reply.text
        for person in ("user:alice", "user:bob"):
            await _until_gone(bus, inbox_key(person, request_id))  # the end drops what its mirror holds
        assert await inbox_ids(client, ALICE) == []
        assert await inbox_ids(client, BOB) == []
    assert (answered.mirror, answered.listings) == (4, 0)  # from the mirror, older entries and all


class _Behind(ChannelMirror):
    """A mirror whose watch applies each change a second late once ``behind`` is set (a replica under load)."""

    behind = False

    async def _apply(self, entry: KeyValue.Entry) -> None:
        if self.behind:
            await asyncio.sleep(1.0)
        await super()._apply(entry)


async def test_the_inbox_waits_for_its_mirror_to_catch_up_with_the_bucket(
    bus: Bus, handler: RequestHandler, answered: _Answered
) -> None:
    """A request another replica (here: a handler with no mirror) stored while this replica's mirror is behind is
    listed all the same: the inbox waits until the mirror applied the bucket's last revision. (Read from the mirror
    as it stood, the inbox missed it.)"""
    mirror = _Behind(bus, await bus.kv(BUCKET_HUMAN_CHANNELS))
    store = await open_store(bus)
    async with mirror.watching():
        mirror.behind = True
        event = requested()
        await handler.handle(event)
        listed = await list_inbox(bus, store, "user:alice", mirror)
        assert [r.request_id for r in listed] == [event.data["request_id"]]
        assert await list_inbox(bus, store, "user:bob", mirror) == []
    assert (answered.mirror, answered.listings) == (2, 0)  # the mirror answered, once caught up
