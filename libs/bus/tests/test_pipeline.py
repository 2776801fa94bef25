"""temporality_bus.Pipeline against a real nats-server: mixed event and KV writes, one outcome each."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.aio.msg import Msg
from pydantic import BaseModel, ConfigDict

from temporality_bus import Bus, Conflict, PermanentError, Pipeline, PublishResult, TransientError
from temporality_bus.pipeline import Write, event_write, kv_write
from temporality_bus.routing import _LazyHeadersMsg
from temporality_protocol import TriggerReceived, decode, make_event
from temporality_protocol.catalog import EVENTS_STREAM, BucketSpec

BUCKET = BucketSpec("t-pipeline", "test bucket")


class Item(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    n: int = 0


def _item(name: str, n: int = 0) -> bytes:
    return Item(name=name, n=n).model_dump_json().encode()


async def test_each_write_of_a_batch_has_its_own_outcome(bus: Bus) -> None:
    store = await bus.store(BUCKET, Item)
    existing = await store.create("taken", Item(name="taken"))
    pipeline = Pipeline(bus)
    event = make_event(
        TriggerReceived(trigger_id="t", delivery_id="d-1", adapter="generic", body_bytes=0),
        source="/test",
        id="evt-d-1",
    )
    results = await pipeline.send(
        [
            kv_write(BUCKET.name, "fresh", _item("fresh"), revision=0),  # create-if-absent: written
            kv_write(BUCKET.name, "taken", _item("taken", 1), revision=0),  # exists: Conflict
            kv_write(BUCKET.name, "taken", _item("taken", 2), revision=existing + 99),  # wrong revision: Conflict
            event_write(event),
            kv_write(BUCKET.name, "plain", _item("plain")),  # no compare-and-set
            event_write(event),  # the same id again: deduplicated, not an error
        ]
    )
    created, exists, stale, published, plain, again = results
    assert isinstance(created, PublishResult)
    assert isinstance(exists, Conflict)
    assert (exists.key, exists.revision) == ("taken", 0)
    assert isinstance(stale, Conflict)
    assert isinstance(published, PublishResult)
    assert published.stream == EVENTS_STREAM.name
    assert isinstance(plain, PublishResult)
    assert isinstance(again, PublishResult)
    assert again.duplicate
    assert pipeline.pending == 0

    fresh = await store.get("fresh")
    assert fresh is not None
    assert (fresh.value, fresh.revision) == (Item(name="fresh"), created.seq)  # the ack's seq is the revision
    taken = await store.get("taken")
    assert taken is not None
    assert (taken.value.n, taken.revision) == (0, existing)  # neither refused write changed it
    # a compare-and-set on the revision the first write returned goes through
    (updated,) = await pipeline.send([kv_write(BUCKET.name, "fresh", _item("fresh", 5), revision=created.seq)])
    assert isinstance(updated, PublishResult)
    stored = await store.get("fresh")
    assert stored is not None
    assert stored.value.n == 5
    msg = await bus.js.get_last_msg(EVENTS_STREAM.name, event.nats_subject)
    assert decode(msg.data or b"").id == "evt-d-1"


async def test_a_write_no_stream_takes_fails_alone_once_the_retry_window_is_over(bus: Bus) -> None:
    await bus.store(BUCKET, Item)  # the bucket exists
    bus.js.no_stream_retry_s = 0.2
    pipeline = Pipeline(bus)
    started = time.monotonic()
    results = await pipeline.send(
        [
            kv_write(BUCKET.name, "before", _item("before")),
            kv_write("t-no-such-bucket", "k", _item("k")),  # no stream: the server answers "no responders"
            kv_write(BUCKET.name, "after", _item("after")),
        ],
        timeout_s=5,
    )
    assert time.monotonic() - started >= 0.1  # it was sent again, not failed at the first 503
    before, nowhere, after = results
    assert isinstance(before, PublishResult)
    assert isinstance(nowhere, TransientError)
    assert "no stream" in str(nowhere)
    assert isinstance(after, PublishResult)
    assert pipeline.pending == 0


async def test_a_write_no_stream_took_is_sent_again_alone_until_one_does(bus: Bus) -> None:
    """A 503 stored nothing, so that write is sent again (as ``bus.js.publish`` does): here a bucket
    created while the batch waits. The writes that were stored are not sent again."""
    store = await bus.store(BUCKET, Item)
    late = BucketSpec("t-pipeline-late", "created while a batch waits")

    async def create_later() -> None:
        await asyncio.sleep(0.3)
        await bus.ensure_bucket(late)

    creating = asyncio.create_task(create_later())
    plain, came_late = await asyncio.wait_for(
        bus.pipeline.send(
            [kv_write(BUCKET.name, "plain", _item("plain")), kv_write(late.name, "k", _item("k"), revision=0)]
        ),
        10,
    )
    await creating
    assert isinstance(plain, PublishResult)
    assert isinstance(came_late, PublishResult)
    entry = await (await bus.store(late, Item)).get("k")
    assert entry is not None
    assert (entry.value, entry.revision) == (Item(name="k"), came_late.seq)
    kept = await store.get("plain")
    assert kept is not None
    assert kept.revision == plain.seq
    assert (await bus.js.stream_info(f"KV_{BUCKET.name}")).state.messages == 1  # "plain" written once
    assert bus.pipeline.pending == 0


async def test_a_write_over_max_payload_sends_nothing(bus: Bus) -> None:
    store = await bus.store(BUCKET, Item)
    pipeline = Pipeline(bus)
    too_big = b"x" * (bus.nc.max_payload + 1)
    with pytest.raises(PermanentError):
        await pipeline.send([kv_write(BUCKET.name, "small", _item("small")), kv_write(BUCKET.name, "big", too_big)])
    assert await store.get("small") is None
    assert await pipeline.send([]) == []


async def test_a_write_nobody_acknowledges_in_time_fails_alone_and_leaves_nothing_pending(bus: Bus) -> None:
    """A responder that never answers (a plain subscriber, no stream): that write is a TransientError after
    the batch's deadline; the writes acknowledged meanwhile keep their results."""
    await bus.store(BUCKET, Item)
    silent = await bus.nc.subscribe("t.pipeline.silent")  # takes the message, never replies
    try:
        pipeline = Pipeline(bus)
        started = time.monotonic()
        before, unanswered, after = await pipeline.send(
            [
                kv_write(BUCKET.name, "before", _item("before")),
                Write("t.pipeline.silent", b"{}", {}),
                kv_write(BUCKET.name, "after", _item("after")),
            ],
            timeout_s=0.5,
        )
        assert time.monotonic() - started >= 0.45
        assert isinstance(before, PublishResult)
        assert isinstance(after, PublishResult)
        assert isinstance(unanswered, TransientError)
        assert "no ack within 0.5 s" in str(unanswered)
        assert pipeline.pending == 0
    finally:
        await silent.unsubscribe()


async def test_a_request_gets_its_reply_off_the_parser_or_says_why_not(bus: Bus) -> None:
    """:meth:`Pipeline.request` (a KV read's ``STREAM.MSG.GET``): the reply, read straight off the client's
    parser (``_route``) on the pipeline's inbox; no responders and no reply in time are TransientErrors."""

    async def echo(msg: Msg) -> None:
        await msg.respond(b"echo:" + msg.data)

    answering = await bus.nc.subscribe("t.pipeline.echo", cb=echo)
    silent = await bus.nc.subscribe("t.pipeline.silent")
    try:
        pipeline = Pipeline(bus)
        reply = await pipeline.request("t.pipeline.echo", b"hi", timeout_s=5)
        assert reply.data == b"echo:hi"
        assert isinstance(reply, _LazyHeadersMsg)  # routed: not nats-py's Msg path
        with pytest.raises(TransientError, match="no responders"):
            await pipeline.request("t.pipeline.nobody", b"", timeout_s=5)
        started = time.monotonic()
        with pytest.raises(TransientError, match=r"no reply within 0\.3 s"):
            await pipeline.request("t.pipeline.silent", b"", timeout_s=0.3)
        assert time.monotonic() - started >= 0.25
        assert pipeline.pending == 0
    finally:
        await answering.unsubscribe()
        await silent.unsubscribe()


async def test_a_store_reads_through_the_pipeline_not_nc_request(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Store.get`` asks JetStream through the Bus's pipeline (its value base64-decoded by pydantic-core): a
    value with its revision; a key never written, deleted or purged reads as nothing."""
    store = await bus.store(BUCKET, Item)
    revision = await store.create("kept", Item(name="kept", n=7))
    await store.create("deleted", Item(name="deleted"))
    await store.create("purged", Item(name="purged"))
    kv = await bus.kv(BUCKET)
    await kv.delete("deleted")
    await store.purge("purged")

    async def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("Store.get went through nc.request")

    monkeypatch.setattr(bus.nc, "request", refused)
    kept = await store.get("kept")
    assert kept is not None
    assert (kept.value, kept.revision) == (Item(name="kept", n=7), revision)
    assert await store.get("never") is None
    assert await store.get("deleted") is None
    assert await store.get("purged") is None


async def test_each_round_waits_out_its_own_deadline_under_the_pipelines_one_timer(bus: Bus) -> None:
    """The rounds' deadlines share one timer (armed at the earliest): a round with a short timeout sent while a
    longer one waits times out at its own deadline, not the other's; the longer one, and one sent after, wait out
    theirs; rounds answered meanwhile are not held up. A plain subscriber takes the writes and never replies."""
    await bus.store(BUCKET, Item)
    silent = await bus.nc.subscribe("t.pipeline.silent")
    try:
        pipeline = Pipeline(bus)
        await pipeline.open()
        started = time.monotonic()
        long = asyncio.create_task(pipeline.send([Write("t.pipeline.silent", b"1", {})], timeout_s=3.0))
        await asyncio.sleep(0.05)
        (short,) = await pipeline.send([Write("t.pipeline.silent", b"2", {})], timeout_s=0.3)
        waited_short = time.monotonic() - started
        assert isinstance(short, TransientError)
        assert "no ack within 0.3 s" in str(short)
        assert waited_short < 2.5  # its own deadline, not the long round's
        (stored,) = await pipeline.send([kv_write(BUCKET.name, "meanwhile", _item("meanwhile"))], timeout_s=5)
        assert isinstance(stored, PublishResult)
        later = asyncio.create_task(pipeline.send([Write("t.pipeline.silent", b"3", {})], timeout_s=0.4))
        (unanswered,) = await long
        assert time.monotonic() - started >= 2.95
        assert isinstance(unanswered, TransientError)
        assert "no ack within 3 s" in str(unanswered)
        (last,) = await later
        assert isinstance(last, TransientError)
        assert "no ack within 0.4 s" in str(last)
        assert pipeline.pending == 0
    finally:
        await silent.unsubscribe()
