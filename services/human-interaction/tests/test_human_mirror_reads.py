"""The reads human-interaction takes from its mirror of ``human-channels`` (or from the records it wrote last)
instead of the bucket, and why each is safe when the copy is stale: a policy is written once, a run entry's mark and an answer's
binding are compare-and-sets on the revision the copy had (a stale one loses and reads), and a request's final
state never reverts. Every binding stays exactly once. The markers of a run's end and of a withdrawal are read
from the mirror once it has applied the run entry the intake wrote after the record (a marker written after that
entry is the end's to act on: it finds the entry and the record); an intake that did not create the entry reads
them from the bucket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from human_support import (
    ALICE,
    USERS_FILE,
    count_requests,
    delivered_then_withdrawn,
    events_of,
    exactly,
    requested,
    stored,
    timer_messages,
)
from nats.aio.msg import Msg

from temporality_bus import Bus, Delivery, PermanentError, TransientError, Versioned
from temporality_human_interaction import requests as requests_module
from temporality_human_interaction.answers import AnswerSubmission, NotPending, bind_answer_outcome
from temporality_human_interaction.api import create_app
from temporality_human_interaction.channels import ChannelAdapter
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRef, ChannelRefs, ref_key
from temporality_human_interaction.directory import Directory, UserProfile
from temporality_human_interaction.inbound import AnswerRouter
from temporality_human_interaction.inbox import list_inbox
from temporality_human_interaction.mirror import ChannelMirror
from temporality_human_interaction.parking import park
from temporality_human_interaction.policies import RunPolicies, RunPolicyHandler
from temporality_human_interaction.records import HumanRequestRecord, RecentRecords, open_store
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.runs import RunEndHandler
from temporality_human_interaction.settings import Settings
from temporality_protocol import (
    Envelope,
    HumanCancelRequested,
    HumanPolicy,
    HumanRequestState,
    LaunchSource,
    OptionAnswer,
    RunCompleted,
    RunRequested,
    make_event,
    new_id,
)
from temporality_protocol.catalog import EVENTS_STREAM, TIMER_SCHEDULE_HUMAN
from temporality_testing.kv_reads import kv_read_key


@pytest.fixture
async def mirror(bus: Bus) -> AsyncIterator[ChannelMirror]:
    mirror = await ChannelMirror.open(bus)
    async with mirror.watching():
        yield mirror


@pytest.fixture
def recent() -> RecentRecords:
    return RecentRecords()


@pytest.fixture
def mirrored(
    bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter], mirror: ChannelMirror, recent: RecentRecords
) -> RequestHandler:
    """The intake as the service wires it: with the mirror and the records it wrote last."""
    return RequestHandler(bus, directory, adapters, mirror=mirror, recent=recent)


def _ended(run_id: str) -> Envelope:
    return make_event(
        RunCompleted(run_id=run_id, result="done", turns=2), source="/temporality/run-executor", run_id=run_id
    )


def _withdrawal(run_id: str, request_id: str) -> Envelope:
    data = HumanCancelRequested(run_id=run_id, request_ids=[request_id], answered="hreq-answered")
    return make_event(data, source="/temporality/run-executor", run_id=run_id)


@pytest.mark.parametrize("ending", ["run_end", "withdrawal"])
async def test_a_request_whose_run_ended_before_is_cancelled_at_intake(
    bus: Bus, client: httpx.AsyncClient, mirrored: RequestHandler, mirror: ChannelMirror, ending: str
) -> None:
    """The run ended before the intake: its web inbox delivery is stored with the record (the inbox lists it from
    the create), so it is announced, and alice sees it withdrawn (human_support.delivered_then_withdrawn)."""
    asked = requested()
    request_id, run_id = str(asked.data["request_id"]), str(asked.data["run_id"])
    ends = RunEndHandler(bus, mirror=mirror)
    await ends.handle(_ended(run_id) if ending == "run_end" else _withdrawal(run_id, request_id))
    await mirrored.handle(asked)
    await delivered_then_withdrawn(bus, client, request_id)


#: Where in the intake the run's end (or the withdrawal) is handled, by another replica: before the record's create,
#: between the create and the run entry's, after the run entry (before the intake looks for the markers).
_POINTS = ["before_the_record", "between_the_record_and_its_run_entry", "after_the_run_entry"]


def _marker_reads(sent: list[tuple[str, bytes]]) -> list[str]:
    keys = [kv_read_key(s, p, BUCKET_HUMAN_CHANNELS.name) for s, p in sent]
    return [k for k in keys if k is not None and k.startswith(("runend.", "withdrawn."))]


@pytest.mark.parametrize("point", _POINTS)
@pytest.mark.parametrize("ending", ["run_end", "withdrawal"])
async def test_a_run_that_ends_while_its_request_is_being_stored_is_cancelled_with_the_mirror_behind(
    bus: Bus,
    client: httpx.AsyncClient,
    mirrored: RequestHandler,
    mirror: ChannelMirror,
    ending: str,
    point: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The end comes while the intake stores the request, handled once (no retry) by another replica (no mirror of
    its own here), and this replica's mirror applies the marker late (its watch holds it back 0.2 s): wherever the
    end falls, the request is cancelled, and its web inbox delivery (stored with the record) kept and announced --
    the person sees it withdrawn. The intake reads no marker from the bucket: the record comes before its run entry,
    so a marker written before that entry is in the mirror once it has applied the entry (waited for), and the end
    of a marker written after it finds the entry and the record -- but for a withdrawal between the record and the
    entry, which cancels the record it finds and creates its run entry marked ended: the intake, which then did not
    create the entry, reads both markers from the bucket (that race only). (Until 2026-12-06 the run entry came first: an end
    between the two found no record, and a mirror that had applied only the run entry lacked the marker -- the
    question stayed pending for a run that had ended; the intake read both markers from the bucket instead.)"""
    asked = requested()
    request_id, run_id = str(asked.data["request_id"]), str(asked.data["run_id"])
    end = _ended(run_id) if ending == "run_end" else _withdrawal(run_id, request_id)
    watch = mirror._watch
    applied = watch._apply

    async def late(entry: object) -> None:  # the watch a moment behind on the markers (and all after them)
        key = str(getattr(entry, "key", ""))
        if key.startswith(("runend.", "withdrawn.")):
            await asyncio.sleep(0.2)
        await applied(entry)  # type: ignore[arg-type]

    monkeypatch.setattr(watch, "_apply", late)
    ended_by_another = False

    async def end_meanwhile() -> None:
        nonlocal ended_by_another
        assert not ended_by_another
        ended_by_another = True
        await RunEndHandler(bus).handle(end)  # another replica's: raises nothing

    if point == "before_the_record":
        delivered_with_record = mirrored._delivered_with_record

        async def before_the_record(record: HumanRequestRecord, profile: UserProfile) -> HumanRequestRecord:
            delivered = await delivered_with_record(record, profile)
            await end_meanwhile()
            return delivered

        monkeypatch.setattr(mirrored, "_delivered_with_record", before_the_record)
    elif point == "between_the_record_and_its_run_entry":
        index_new_request = requests_module.index_new_request

        async def between(*args: Any, **kwargs: Any) -> int | None:
            await end_meanwhile()  # the record is stored: the end finds no run entry yet
            return await index_new_request(*args, **kwargs)

        monkeypatch.setattr(requests_module, "index_new_request", between)
    else:
        ended = mirrored._ended

        async def after_the_run_entry(record: HumanRequestRecord, indexed_at: int | None = None) -> str | None:
            assert indexed_at is not None  # created by this intake: the mirror answers
            await end_meanwhile()  # the end finds the run entry, and the record, and cancels it
            return await ended(record, indexed_at)

        monkeypatch.setattr(mirrored, "_ended", after_the_run_entry)
    sent = count_requests(bus, monkeypatch)
    await mirrored.handle(asked)
    assert ended_by_another
    if (ending, point) == ("withdrawal", "between_the_record_and_its_run_entry"):
        # the withdrawal found the record, cancelled it and created its run entry marked ended (an end before the
        # entry leaves it marked, inbox.unindex): the intake did not create the entry, so it read both markers
        assert sorted(_marker_reads(sent)) == sorted(
            [ref_key("runend", run_id), ref_key("withdrawn", run_id, request_id)]
        )
    else:
        assert _marker_reads(sent) == []  # the mirror told the intake (it waited for the run entry's revision)
    await delivered_then_withdrawn(bus, client, request_id)
    await RunEndHandler(bus, mirror=mirror).handle(end)  # a redelivery of the end: nothing left to do


@pytest.mark.parametrize("ending", ["run_end", "withdrawal"])
async def test_without_the_mirror_in_time_the_intake_reads_the_markers_from_the_bucket(
    bus: Bus,
    client: httpx.AsyncClient,
    mirrored: RequestHandler,
    mirror: ChannelMirror,
    ending: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mirror does not reach the run entry's revision in time (its watch down, or far behind): the intake reads
    both markers from the bucket, and a run that ended before is still seen."""
    asked = requested()
    request_id, run_id = str(asked.data["request_id"]), str(asked.data["run_id"])
    await RunEndHandler(bus).handle(_ended(run_id) if ending == "run_end" else _withdrawal(run_id, request_id))

    async def never(revision: int, timeout_s: float = 0.0) -> bool:
        return False

    monkeypatch.setattr(mirror, "reached", never)
    sent = count_requests(bus, monkeypatch)
    await mirrored.handle(asked)
    assert sorted(_marker_reads(sent)) == sorted([ref_key("runend", run_id), ref_key("withdrawn", run_id, request_id)])
    await delivered_then_withdrawn(bus, client, request_id)


async def test_a_question_of_a_running_run_reads_no_marker_and_a_redelivery_reads_both(
    bus: Bus, mirrored: RequestHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The markers are read from the bucket only by an intake that did not create the run entry (a redelivery):
    the first delivery takes them from the mirror."""
    asked = requested()
    request_id, run_id = str(asked.data["request_id"]), str(asked.data["run_id"])
    sent = count_requests(bus, monkeypatch)
    await mirrored.handle(asked)
    assert _marker_reads(sent) == []
    sent.clear()
    await mirrored.handle(asked)  # a redelivery: the record and the run entry are there
    assert sorted(_marker_reads(sent)) == sorted([ref_key("runend", run_id), ref_key("withdrawn", run_id, request_id)])
    record = await stored(bus, request_id)
    assert record is not None
    assert record.pending
    [notified] = await exactly(bus, "human.notified", settle_s=0.5)
    assert notified.data["request_id"] == request_id


async def test_a_run_end_leaves_an_answered_request_alone_without_reading_it(
    bus: Bus,
    mirrored: RequestHandler,
    mirror: ChannelMirror,
    recent: RecentRecords,
    directory: Directory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = requested()
    request_id, run_id = str(asked.data["request_id"]), str(asked.data["run_id"])
    await mirrored.handle(asked)
    router = AnswerRouter(bus, directory, mirror=mirror, recent=recent)
    app = create_app(Settings(users_file=USERS_FILE, bus_timeout_s=5.0), bus, directory, router)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://human.test") as client:
        reply = await client.post(f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
    assert reply.status_code == 200, reply.text
    entry = await ChannelRefs(bus).get_ref(ref_key("run", run_id, request_id))
    assert entry is not None
    assert entry.ended == "answered"
    assert await mirror.reached(await _last_revision(bus))
    sent = count_requests(bus, monkeypatch)
    await RunEndHandler(bus, mirror=mirror).handle(_ended(run_id))
    assert not [s for s, p in sent if kv_read_key(s, p, "human-requests") is not None]  # the record was not read
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status is HumanRequestState.ANSWERED


async def _last_revision(bus: Bus) -> int:
    return int((await (await bus.kv(BUCKET_HUMAN_CHANNELS)).status()).stream_info.state.last_seq or 0)


async def test_an_answer_from_a_stale_record_is_bound_once_and_a_second_refused(
    bus: Bus, mirrored: RequestHandler, mirror: ChannelMirror, recent: RecentRecords
) -> None:
    """The records this replica wrote last are only the base of a compare-and-set: a second answer whose base is
    the pending record of before the first answer loses it, reads, and is refused (409 already_answered)."""
    asked = requested()
    request_id = str(asked.data["request_id"])
    await mirrored.handle(asked)
    as_delivered = recent.pop(request_id)
    assert as_delivered is not None
    assert as_delivered.value.pending
    recent.put(request_id, as_delivered)

    async def answer(option_id: str) -> tuple[HumanRequestRecord, bool]:
        return await bind_answer_outcome(
            bus,
            request_id=request_id,
            responder="user:alice",
            submission=AnswerSubmission(option_id=option_id),
            channel="web",
            mirror=mirror,
            recent=recent,
        )

    first, already = await answer("keep-v1")
    assert first.status is HumanRequestState.ANSWERED
    assert not already
    recent.put(request_id, as_delivered)  # stale: still pending, an older revision
    with pytest.raises(NotPending) as refused:
        await answer("drop-v1")
    assert refused.value.code == "already_answered"
    # the identical answer from the stale base: already recorded, nothing bound again
    recent.put(request_id, as_delivered)
    again, already = await answer("keep-v1")
    assert already
    assert again.answered_at == first.answered_at
    await exactly(bus, "human.answered", 1)
    record = await stored(bus, request_id)
    assert record is not None
    assert isinstance(record.answer, OptionAnswer)
    assert record.answer.option_id == "keep-v1"


async def test_a_run_entry_marked_from_a_stale_copy_is_marked_after_a_read(bus: Bus) -> None:
    refs = ChannelRefs(bus)
    key = ref_key("run", "run-stale", "hreq-stale")
    expires = datetime.now(UTC) + timedelta(hours=1)
    created = await refs.create(key, "hreq-stale", expires_at=expires)
    assert created is not None
    stale = ChannelRef(value="hreq-stale", expires_at=expires)
    changed = await (await bus.store(BUCKET_HUMAN_CHANNELS, ChannelRef)).update(
        key, ChannelRef(value="hreq-stale", expires_at=expires, people=1), created
    )
    ended_at = datetime.now(UTC)
    assert await refs.mark_ended(key, ended_at, "expired", known=(stale, created))  # lost the CAS, read, marked
    entry = await refs.get_ref(key)
    assert entry is not None
    assert (entry.ended_at, entry.ended, entry.people) == (ended_at, "expired", 1)
    got = await (await bus.store(BUCKET_HUMAN_CHANNELS, ChannelRef)).get(key)
    assert got is not None
    assert got.revision > changed


async def test_a_policy_in_the_mirror_is_not_read(
    bus: Bus, mirror: ChannelMirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    policies = RunPolicies(bus, mirror=mirror)
    policy = HumanPolicy(allowed_recipients=["user:alice"])
    await policies.record("run-mirrored", policy)
    assert await mirror.reached(await _last_revision(bus))
    sent = count_requests(bus, monkeypatch)
    assert await policies.lookup("run-mirrored") == policy
    assert await policies.lookup("run-unknown") is None  # not in the mirror: read from the bucket
    reads = [key for s, p in sent if (key := kv_read_key(s, p, "human-channels")) is not None]
    assert reads == ["policy.run-unknown"]


async def test_a_request_id_of_another_run_leaves_no_entry_under_the_new_run(
    bus: Bus, mirrored: RequestHandler
) -> None:
    theirs = requested(recipient="user:alice", request_id="hreq-shared-mirror")
    await mirrored.handle(theirs)
    mine = requested(recipient="user:bob", request_id="hreq-shared-mirror")
    with pytest.raises(PermanentError, match="already used"):
        await mirrored.handle(mine)
    refs = ChannelRefs(bus)
    assert await refs.get(ref_key("run", str(mine.runid), "hreq-shared-mirror")) is None
    store = await open_store(bus)
    assert await list_inbox(bus, store, "user:bob") == []
    assert [r.request_id for r in await list_inbox(bus, store, "user:alice")] == ["hreq-shared-mirror"]  # theirs
    # the new run's end does not touch the other run's request
    await RunEndHandler(bus).handle(_ended(str(mine.runid)))
    record = await stored(bus, "hreq-shared-mirror")
    assert record is not None
    assert record.status is HumanRequestState.PENDING
    assert await events_of(bus, "human.rejected") == []


async def test_a_request_parked_before_its_policy_is_woken_from_the_mirror(
    bus: Bus, mirror: ChannelMirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy's handler finds the requests parked under its run in the mirror once the mirror holds the policy
    it stored (a request parked after that finds the policy itself): no STREAM.INFO, no listing."""
    asked = requested()
    request_id, run_id = str(asked.data["request_id"]), str(asked.data["run_id"])
    await park(bus, asked, run_id, request_id, datetime.now(UTC) + timedelta(hours=1))
    sent = count_requests(bus, monkeypatch)
    policies = RunPolicies(bus, mirror=mirror)
    run = RunRequested(
        run_id=run_id,
        agent="reviewer",
        title="PR 42",
        launch=LaunchSource(kind="webhook", trigger_id="t"),
        human=HumanPolicy(allowed_recipients=["user:alice"]),
    )
    await RunPolicyHandler(policies).handle(make_event(run, source="/temporality/trigger-gateway", run_id=run_id))
    handled = list(sent)
    assert not [s for s, _ in handled if ".STREAM.INFO." in s or ".CONSUMER.CREATE." in s]
    assert await timer_messages(bus, f"{TIMER_SCHEDULE_HUMAN}.{request_id}.policywake") == 1


async def test_a_run_end_finds_its_requests_in_the_mirror(
    bus: Bus, mirrored: RequestHandler, mirror: ChannelMirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = new_id("run")
    asked = [requested(run_id=run_id) for _ in range(2)]
    for event in asked:
        await mirrored.handle(event)
    sent = count_requests(bus, monkeypatch)
    await RunEndHandler(bus, mirror=mirror).handle(_ended(run_id))
    for event in asked:
        record = await stored(bus, str(event.data["request_id"]))
        assert record is not None
        assert record.status is HumanRequestState.CANCELLED
    assert not [s for s, _ in sent if ".STREAM.INFO." in s]
    # a redelivery (its marker there already) lists the bucket, and finds nothing left to do
    await RunEndHandler(bus, mirror=mirror).handle(_ended(run_id))


async def test_a_run_entry_s_end_mark_is_tried_again_while_other_writes_land_between(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end's compare-and-set loses to writes that land between its read and its write (an escalation naming
    its target, three times here): it reads the entry again and marks it, keeping what the others wrote."""
    refs, other = ChannelRefs(bus), ChannelRefs(bus)
    key = ref_key("run", "run-raced", "hreq-raced")
    assert await refs.create(key, "hreq-raced", expires_at=datetime.now(UTC) + timedelta(hours=1)) is not None
    store = await bus.store(BUCKET_HUMAN_CHANNELS, ChannelRef)
    monkeypatch.setattr(refs, "_store", store)
    read = store.get
    named: list[str] = []

    async def raced(key: str) -> Versioned[ChannelRef] | None:
        got = await read(key)
        if got is not None and len(named) < 3:  # another write lands right after this read
            named.append(f"user:p{len(named)}")
            assert await other.fill(key, got.value, got.revision, answerers=[named[-1]])
        return got

    monkeypatch.setattr(store, "get", raced)
    ended_at = datetime.now(UTC)
    assert await refs.mark_ended(key, ended_at, "expired")
    entry = await other.get_ref(key)
    assert entry is not None
    assert (entry.ended_at, entry.ended, entry.answerers) == (ended_at, "expired", named)


async def test_a_waiter_that_gave_up_is_not_kept(mirror: ChannelMirror) -> None:
    assert await mirror.caught_up()
    assert not await mirror.reached(mirror.revision + 1000, timeout_s=0.05)
    waiting = asyncio.create_task(mirror.reached(mirror.revision + 1000, timeout_s=30))
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert mirror._waiters == []  # neither the one that timed out nor the one cancelled


async def test_the_mirror_keeps_the_pending_run_entries(bus: Bus, mirror: ChannelMirror) -> None:
    """What the gauges count from: the run entries not marked ended, kept as the watch applies each change."""
    refs = ChannelRefs(bus)
    later = datetime.now(UTC) + timedelta(hours=1)
    keys = [ref_key("run", "run-kept", f"hreq-kept{n}") for n in range(3)]
    for n, key in enumerate(keys):
        await refs.create(key, f"hreq-kept{n}", expires_at=later, answerers=["user:alice"])
    await refs.create(ref_key("open", "alice", "hreq-kept0"), "hreq-kept0")  # not a run entry
    assert await mirror.caught_up()
    assert sorted(e.key for e in mirror.pending_runs()) == keys
    await refs.mark_ended(keys[0], datetime.now(UTC), "answered")
    await refs.delete(keys[1])
    assert await mirror.caught_up()
    assert [e.key for e in mirror.pending_runs()] == [keys[2]]
    pending = [e.key for e in mirror.entries() if e.key.startswith("run.") and e.ended_at is None]
    assert pending == [keys[2]]  # the same as going through every key


def _first_delivery() -> Delivery:
    """A request's first delivery as the requests consumer hands it over."""
    reply = f"$JS.ACK.{EVENTS_STREAM.name}.human-interaction-requests.1.7.7.1764892800000000000.0"
    return Delivery(Msg(_client=None, subject="temporality.events.human.requested", reply=reply))  # type: ignore[arg-type]


async def test_a_request_before_its_policy_waits_for_the_mirror_to_deliver_it_without_reading_the_bucket(
    bus: Bus, mirror: ChannelMirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At its first delivery a request whose run's policy is not stored yet waits for this replica's watch to
    deliver it (woken by the watch: no read of the bucket meanwhile), as the policies consumer stores it."""
    policies = RunPolicies(bus, mirror=mirror, first_wait_s=10.0)
    run_id = new_id("run")
    policy = HumanPolicy(allowed_recipients=["user:alice"])
    assert await mirror.caught_up()
    sent = count_requests(bus, monkeypatch)
    waiting = asyncio.create_task(policies.get(run_id, _first_delivery()))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await RunPolicies(bus).record(run_id, policy)  # the policies consumer (any replica), a moment later
    assert await asyncio.wait_for(waiting, 5) == policy
    reads = [key for s, p in sent if (key := kv_read_key(s, p, "human-channels")) is not None]
    assert reads == []
    assert mirror._key_waiters == {}  # woken and gone


async def test_a_policy_the_mirror_does_not_deliver_in_time_is_read_from_the_bucket_once_before_the_retry(
    bus: Bus, mirror: ChannelMirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mirror may be behind: past the wait, one read of the bucket decides (found: taken; else the retry)."""
    policies = RunPolicies(bus, mirror=mirror, first_wait_s=0.05)
    assert await mirror.caught_up()
    sent = count_requests(bus, monkeypatch)
    with pytest.raises(TransientError):
        await policies.get("run-never-requested", _first_delivery())
    reads = [key for s, p in sent if (key := kv_read_key(s, p, "human-channels")) is not None]
    assert reads == ["policy.run-never-requested"]
    assert mirror._key_waiters == {}  # the waiter that gave up is not kept

    stored_elsewhere = new_id("run")
    policy = HumanPolicy(allowed_recipients=["user:bob"])
    await RunPolicies(bus).record(stored_elsewhere, policy)
    monkeypatch.setattr(mirror, "appears", _never_delivered)  # a watch far behind
    assert await policies.get(stored_elsewhere, _first_delivery()) == policy  # the bucket has it: no retry


async def _never_delivered(key: str, timeout_s: float) -> None:
    return None
