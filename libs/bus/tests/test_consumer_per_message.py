"""The per-message path's cheaper steps (2026-12-06) against a real nats-server: the ack frame written directly,
the log context bound and reset by token, the one-pass decode and the writes' tuple type."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import structlog
from nats.errors import MsgAlreadyAckdError
from nats.js.errors import NotFoundError

from temporality_bus import Bus, Consumer, Delivery
from temporality_bus.consumer import _CONSUMER, _STREAM_SEQ, _ack
from temporality_bus.pipeline import Write, kv_write
from temporality_protocol import Envelope, ProtocolError, RunFailed, make_event
from temporality_protocol.catalog import EVENTS_STREAM, ConsumerSpec, subject_for
from temporality_protocol.envelope import encode


def _spec(durable: str) -> ConsumerSpec:
    return ConsumerSpec(durable, EVENTS_STREAM.name, (subject_for("run.failed"),), "test", backoff_s=(0.1,))


def _failed(run_id: str) -> Envelope:
    return make_event(
        RunFailed(run_id=run_id, reason="r", error="e"), source="/test", id=f"evt-{run_id}", run_id=run_id
    )


async def _settled(bus: Bus, durable: str, seq: int, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            info = await bus.js.consumer_info(EVENTS_STREAM.name, durable)
        except NotFoundError:
            info = None
        if info is not None and info.ack_floor.stream_seq >= seq and info.num_ack_pending == 0:
            return
        assert time.monotonic() < deadline, f"not settled: {info}"
        await asyncio.sleep(0.05)


def test_the_log_keys_are_structlogs_own_and_put_back_as_bound_contextvars_does() -> None:
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(consumer="outer")
    tokens = (_CONSUMER.set("inner"), _STREAM_SEQ.set(7))
    assert structlog.contextvars.get_contextvars() == {"consumer": "inner", "stream_seq": 7}
    structlog.contextvars.bind_contextvars(stream_seq=8)  # the handler binds a key of ours again
    assert structlog.contextvars.get_contextvars() == {"consumer": "inner", "stream_seq": 8}
    _STREAM_SEQ.reset(tokens[1])
    _CONSUMER.reset(tokens[0])
    assert structlog.contextvars.get_contextvars() == {"consumer": "outer"}  # the value before, or unbound
    structlog.contextvars.clear_contextvars()


def test_a_write_is_immutable_and_a_changed_copy_leaves_it_as_it_was() -> None:
    write = kv_write("runs", "k", b"v", revision=0)
    with pytest.raises(AttributeError):
        write.subject = "elsewhere"  # type: ignore[misc]
    moved = write._replace(subject="$JS.hub.API.$KV.runs.k")
    assert (write.subject, moved.subject) == ("$KV.runs.k", "$JS.hub.API.$KV.runs.k")
    assert (moved.bucket, moved.key, moved.revision, moved.headers) == ("runs", "k", 0, write.headers)
    assert Write("s", b"", {}) == Write("s", b"", {}, None, None, None)


async def test_the_direct_ack_reaches_the_server_and_a_second_settle_is_refused(bus: Bus) -> None:
    event = _failed("direct-ack")
    seq = (await bus.publish(event)).seq
    sub = await bus.js.pull_subscribe(subject_for("run.failed"), durable="t-direct-ack", stream=EVENTS_STREAM.name)
    try:
        msgs = await sub.fetch(100, timeout=5)
        [msg] = [m for m in msgs if m.metadata.sequence.stream == seq]
        for other in msgs:
            if other is not msg:
                await other.ack()
        await _ack(msg)
        assert msg._ackd
        with pytest.raises(MsgAlreadyAckdError):
            await _ack(msg)  # as msg.ack() refuses it
        await _settled(bus, "t-direct-ack", seq)
    finally:
        await sub.unsubscribe()


async def test_the_per_message_handler_runs_in_its_message_log_context(bus: Bus) -> None:
    event = _failed("log-context")
    seq = (await bus.publish(event)).seq
    seen: dict[str, dict[str, Any]] = {}

    async def handler(got: Envelope, delivery: Delivery) -> None:
        seen[got.id] = structlog.contextvars.get_contextvars()

    stop = asyncio.Event()
    task = asyncio.create_task(Consumer(bus, _spec("t-log-context"), handler=handler).run(stop))
    try:
        await _settled(bus, "t-log-context", seq)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    context = seen[event.id]
    assert context["consumer"] == "t-log-context"
    assert context["stream_seq"] == seq
    assert context["delivery"] == 1
    assert (context["ce_id"], context["ce_type"], context["run_id"]) == (event.id, "run.failed", "log-context")


@pytest.mark.parametrize(
    ("name", "spoil"),
    [
        ("nan", lambda raw: raw.replace(b'"error":"e"', b'"error":"e","x":NaN')),
        ("base64", lambda raw: raw.replace(b'"data":', b'"data_base64":"e30=","data":')),
        ("noversion", lambda raw: raw.replace(b',"protocolversion":"1.0"', b"")),
    ],
)
async def test_the_per_message_path_dead_letters_what_decode_refuses(bus: Bus, name: str, spoil: Any) -> None:
    """The one-pass decode sends these to ``decode``, whose error dead-letters them (the handler never sees
    them); a good event next to them is handled."""
    bad, good = _failed(f"spoilt-{name}"), _failed(f"fine-{name}")
    raw = spoil(encode(bad))
    assert raw != encode(bad)
    await bus.publish_raw(bad.nats_subject, raw, {"Nats-Msg-Id": bad.id})
    seq = (await bus.publish(good)).seq
    handled: list[str] = []
    refused: list[BaseException] = []

    async def handler(event: Envelope, delivery: Delivery) -> None:
        handled.append(event.id)

    async def hook(message: Envelope | bytes, delivery: Delivery, error: BaseException) -> None:
        refused.append(error)

    durable = f"t-spoilt-{name}"
    stop = asyncio.Event()
    consumer = Consumer(bus, _spec(durable), handler=handler, on_dead_letter=hook)
    task = asyncio.create_task(consumer.run(stop))
    try:
        await _settled(bus, durable, seq)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert handled == [good.id]
    [error] = refused
    assert isinstance(error, ProtocolError), repr(error)  # decode's own error: a poison message
