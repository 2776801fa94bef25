"""The indexes say enough that a start, a sweep and a gauge read need not read (or list) the requests bucket:

* a request that ended before its deadline is marked ended on its run entry, so the start-up rebuild does
  not read it again (it used to, at every start until its deadline);
* each run entry names who may answer its request (the inbox's index), and a start names them on an entry an
  older version wrote (a real restart of the service);
* the retention sweep lists no key of the requests bucket (it used to list every one);
* the gauges write nothing (the index repair is the start's, the sweep's and the inbox's).

On a real nats-server with the real handlers; the restart runs the service's own setup."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from human_support import (
    ALICE,
    ALICE_BOB_AND_API_OWNERS,
    BOB,
    inbox_ids,
    request_run,
    requested,
    service_settings,
    stored,
    wait_for_record,
)
from replica_support import replica

from temporality_bus import Bus, NatsSettings, Store, live_entries
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRef, ref_key
from temporality_human_interaction.inbox import RetentionSweeper, rebuild_index
from temporality_human_interaction.metrics import count_open
from temporality_human_interaction.records import open_store
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.runs import RunEndHandler
from temporality_protocol import (
    HumanRequestState,
    RunCancelled,
    make_event,
    new_id,
)
from temporality_protocol.catalog import BUCKET_HUMAN_REQUESTS

GROUP = "group:api-owners"  # config/users.yaml: alice and bob


async def _run_entry(bus: Bus, run_id: str, request_id: str) -> ChannelRef:
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    entry = await kv.get(ref_key("run", run_id, request_id))
    return ChannelRef.model_validate_json(entry.value or b"")


async def _channels_seq(bus: Bus) -> int:
    """The last sequence of the ``human-channels`` bucket's stream: it moves with every write."""
    info = await bus.js.stream_info(f"KV_{BUCKET_HUMAN_CHANNELS.name}")
    return int(info.state.last_seq)


@pytest.mark.usefixtures("consumers")
async def test_a_request_that_ended_early_is_not_read_again_at_start(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    answered, cancelled, waiting = requested(), requested(), requested()
    for event in (answered, cancelled, waiting):
        await handler.handle(event)
    answered_id, cancelled_id = str(answered.data["request_id"]), str(cancelled.data["request_id"])
    reply = await client.post(f"/requests/{answered_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
    assert reply.status_code == 200, reply.text
    run_id = str(cancelled.runid)
    await RunEndHandler(bus).handle(make_event(RunCancelled(run_id=run_id, reason="ops"), source="/t", run_id=run_id))
    await wait_for_record(bus, cancelled_id, lambda r: r.status is HumanRequestState.CANCELLED)

    # both ended an hour before their deadlines: their run entries say so, and a start reads neither
    for event in (answered, cancelled):
        entry = await _run_entry(bus, str(event.runid), str(event.data["request_id"]))
        assert entry.ended_at is not None
        assert entry.expires_at is not None
        assert entry.expires_at > datetime.now(UTC) + timedelta(minutes=50)
    assert (await rebuild_index(bus)).read == 0  # the old rebuild read both, at every start for an hour

    # the mark was lost (a crash between the end and the mark): a start does not read it (nothing tells it from
    # a pending one without reading every pending record); the first inbox that lists it reads it and marks it
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    lost = await _run_entry(bus, str(answered.runid), answered_id)
    await kv.put(
        ref_key("run", str(answered.runid), answered_id),
        lost.model_copy(update={"ended_at": None, "ended": None}).model_dump_json().encode(),
    )
    assert (await rebuild_index(bus)).read == 0
    listed = await client.get("/inbox", headers=ALICE)
    assert [r["id"] for r in listed.json()["requests"]] == [str(waiting.data["request_id"])]
    marked = await _run_entry(bus, str(answered.runid), answered_id)
    assert marked.ended_at is not None
    assert marked.ended == HumanRequestState.ANSWERED.value
    assert (await rebuild_index(bus)).read == 0


async def test_a_gauge_read_writes_nothing_and_the_sweep_repairs_the_index(
    bus: Bus, handler: RequestHandler, client: httpx.AsyncClient
) -> None:
    done, old = requested(), requested()
    for event in (done, old):
        await handler.handle(event)
    done_id, old_id = str(done.data["request_id"]), str(old.data["request_id"])
    reply = await client.post(f"/requests/{done_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
    assert reply.status_code == 200, reply.text
    past = datetime.now(UTC) - timedelta(seconds=5)
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    done_key, old_key = ref_key("run", str(done.runid), done_id), ref_key("run", str(old.runid), old_id)
    lost = ChannelRef(value=done_id, expires_at=past, answerers=["user:alice"])  # its end's mark lost, deadline past
    await kv.put(done_key, lost.model_dump_json().encode())
    await kv.put(old_key, ChannelRef(value=old_id).model_dump_json().encode())  # an older version's: undated

    before = await _channels_seq(bus)
    for _ in range(3):
        counts = await count_open(bus, datetime.now(UTC))
        assert (counts.waiting, counts.read) == (1, 2)  # both read, the ended one not counted
    assert await _channels_seq(bus) == before  # every replica refreshes the gauges: none of them writes

    await RetentionSweeper(bus, retention=timedelta(days=1), every_s=60).sweep()
    marked = ChannelRef.model_validate_json((await kv.get(done_key)).value or b"")
    assert marked.ended == HumanRequestState.ANSWERED.value  # past its deadline, not marked: read, marked
    repaired = ChannelRef.model_validate_json((await kv.get(old_key)).value or b"")
    assert repaired.expires_at is not None  # dated
    assert (await count_open(bus, datetime.now(UTC))).read == 0


async def test_the_sweep_lists_no_key_of_the_requests_bucket(
    bus: Bus, handler: RequestHandler, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = [requested(expires_in_s=3600) for _ in range(3)] + [requested(expires_in_s=7200) for _ in range(3)]
    for event in events:
        await handler.handle(event)
    ids = [str(e.data["request_id"]) for e in events]
    for request_id in ids[:3]:
        reply = await client.post(f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
        assert reply.status_code == 200, reply.text
    store = await open_store(bus)
    listed_before = len(await store.keys())  # what the sweep listed until now, at every sweep: every key

    listed: list[str] = []
    real_keys = Store.keys

    async def counting(self: Store[Any], match: str = ">") -> list[str]:
        keys = await real_keys(self, match)
        if self.bucket == BUCKET_HUMAN_REQUESTS.name:
            listed.extend(keys)
        return keys

    monkeypatch.setattr(Store, "keys", counting)
    retention = timedelta(seconds=60)
    now = datetime.now(UTC)
    quiet = RetentionSweeper(bus, retention=retention, every_s=60, clock=lambda: now)
    assert await quiet.sweep() == 0
    assert (quiet.last_read, len(listed)) == (0, 0)
    due = RetentionSweeper(bus, retention=retention, every_s=60, clock=lambda: now + timedelta(seconds=3700))
    assert await due.sweep() == 3  # the answered three, past their deadline + the retention
    assert (due.last_read, len(listed)) == (3, 0)
    assert listed_before == 6
    for request_id in ids[:3]:
        assert await stored(bus, request_id) is None
    for request_id in ids[3:]:
        assert await stored(bus, request_id) is not None  # pending: never purged


USERS = ALICE_BOB_AND_API_OWNERS


async def _until_inbox(client: httpx.AsyncClient, headers: dict[str, str], want: list[str]) -> None:
    seen: list[str] = []
    try:
        async with asyncio.timeout(30):
            while True:
                seen = await inbox_ids(client, headers)
                if seen == sorted(want):
                    return
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"the inbox stayed {seen}, not {sorted(want)}") from None


@pytest.mark.timeout(150)
async def test_a_restart_names_the_group_members_on_an_older_version_s_run_entry(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus
) -> None:
    settings = service_settings(tmp_path, nats_settings, USERS)
    run_id = new_id("run")
    await request_run(bus, run_id, [GROUP, "user:alice"])
    group = requested(recipient=GROUP, allowed=(GROUP, "user:alice"), run_id=run_id)
    ended = requested(allowed=(GROUP, "user:alice"), run_id=run_id)
    group_id, ended_id = str(group.data["request_id"]), str(ended.data["request_id"])
    async with replica(settings) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        await bus.publish(group)
        await bus.publish(ended)
        await _until_inbox(client, BOB, [group_id])
        await _until_inbox(client, ALICE, [ended_id, group_id])
        reply = await client.post(f"/requests/{ended_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
        assert reply.status_code == 200, reply.text

    assert (await _run_entry(bus, run_id, group_id)).answerers == ["user:alice", "user:bob"]
    # while it is down, the group request's run entry is rewritten as a version before 2026-12-06 wrote it
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    older = (await _run_entry(bus, run_id, group_id)).model_copy(update={"answerers": None})
    await kv.put(ref_key("run", run_id, group_id), older.model_dump_json().encode())
    async with replica(settings) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        await _until_inbox(client, BOB, [group_id])
        await _until_inbox(client, ALICE, [group_id])
        assert (await _run_entry(bus, run_id, group_id)).answerers == ["user:alice", "user:bob"]  # the start named them
    # what the start did leaves nothing for the next one: not the group request, not the answered one
    assert (await rebuild_index(bus)).read == 0
    assert (await _run_entry(bus, run_id, ended_id)).ended_at is not None
    assert await live_entries(kv, "open.>") == []  # no per-person entry: the run entry is the index
    requests = await (await bus.kv(BUCKET_HUMAN_REQUESTS)).keys()
    assert sorted(requests) == sorted([group_id, ended_id])
