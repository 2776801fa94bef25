"""temporality_bus.Pipeline writes a batch as one buffer of protocol frames (not one ``nc.publish`` each):
what reaches the server must be what nats-py's own publish sends, and what nats-py refuses is refused the
same way, write by write. Real nats-server."""

from __future__ import annotations

import asyncio

import pytest

from temporality_bus import Bus, PublishResult, TransientError
from temporality_bus.pipeline import Write
from temporality_protocol.catalog import StreamSpec

STREAM = StreamSpec(name="T_FRAMES", subjects=("t-frames.>",), description="frames test")


async def _stored(bus: Bus, subject: str) -> tuple[bytes, dict[str, str]]:
    msg = await bus.js.get_last_msg(STREAM.name, subject)
    return msg.data or b"", dict(msg.headers or {})


async def test_a_frame_stores_what_nats_py_publish_stores(bus: Bus) -> None:
    await bus.ensure_stream(STREAM)
    headers = {
        "Nats-Msg-Id": "frame-1",
        "Content-Type": "application/cloudevents+json; charset=utf-8",
        " X-Padded ": "  spaced value  ",  # nats-py strips the name and the value
        "X-Newline": "one\r\ntwo\nthree",  # CR/LF inside a value would end the header: blanked
        "X-Empty": "",
    }
    payload = '{"ü": "ß", "n": 1}'.encode()
    (framed,) = await bus.pipeline.send([Write("t-frames.pipeline", payload, dict(headers))])
    assert isinstance(framed, PublishResult)
    assert framed.stream == STREAM.name
    # the same message through nats-py's own JetStream publish, for comparison
    await bus.js.publish("t-frames.client", payload, headers={**headers, "Nats-Msg-Id": "frame-2"})
    data_p, head_p = await _stored(bus, "t-frames.pipeline")
    data_c, head_c = await _stored(bus, "t-frames.client")
    assert data_p == data_c == payload
    assert head_p.pop("Nats-Msg-Id") == "frame-1"
    assert head_c.pop("Nats-Msg-Id") == "frame-2"
    assert head_p == head_c
    assert head_p["X-Padded"] == "spaced value"
    assert head_p["X-Newline"] == "one  two three"


async def test_without_headers_a_write_is_a_plain_pub_and_is_stored(bus: Bus) -> None:
    await bus.ensure_stream(STREAM)
    (plain,) = await bus.pipeline.send([Write("t-frames.plain", b"", {})])
    assert isinstance(plain, PublishResult)
    data, headers = await _stored(bus, "t-frames.plain")
    assert data == b""
    assert not headers


async def test_a_write_nats_py_would_refuse_fails_alone_and_the_others_are_stored(bus: Bus) -> None:
    await bus.ensure_stream(STREAM)
    before, blank_subject, injected, bad_name, after = await bus.pipeline.send(
        [
            Write("t-frames.before", b"1", {"Nats-Msg-Id": "refuse-1"}),
            Write("t-frames.a b", b"2", {}),  # a blank in the subject
            Write("t-frames.x\r\nPUB t-frames.evil 1", b"3", {}),  # a protocol line smuggled in the subject
            Write("t-frames.bad", b"4", {"Bad Name": "x"}),  # a header name with a blank
            Write("t-frames.after", b"5", {"Nats-Msg-Id": "refuse-5"}),
        ],
        timeout_s=5,
    )
    assert isinstance(before, PublishResult)
    assert isinstance(after, PublishResult)
    for refused in (blank_subject, injected, bad_name):
        assert isinstance(refused, TransientError), refused
    assert "BadSubjectError" in repr(blank_subject.__cause__)
    assert "BadHeaderError" in repr(bad_name.__cause__)
    assert (await bus.js.stream_info(STREAM.name)).state.messages == 2  # nothing else reached the stream
    assert bus.pipeline.pending == 0


async def test_a_closed_connection_fails_every_write_without_waiting(bus: Bus) -> None:
    await bus.ensure_stream(STREAM)
    await bus.pipeline.send([Write("t-frames.open", b"1", {})])  # the reply subscription exists
    await bus.nc.close()
    results = await asyncio.wait_for(
        bus.pipeline.send([Write("t-frames.closed", b"1", {}), Write("t-frames.closed", b"2", {})], timeout_s=5), 2
    )
    assert len(results) == 2
    for result in results:
        assert isinstance(result, TransientError)
        assert "ConnectionClosedError" in str(result)
    assert bus.pipeline.pending == 0


@pytest.mark.parametrize("count", [1, 200])
async def test_a_batch_of_any_size_gets_each_ack_in_order(bus: Bus, count: int) -> None:
    await bus.ensure_stream(STREAM)
    writes = [Write(f"t-frames.many.{i}", str(i).encode(), {"Nats-Msg-Id": f"many-{count}-{i}"}) for i in range(count)]
    results = await bus.pipeline.send(writes)
    seqs = []
    for result in results:
        assert isinstance(result, PublishResult)
        assert not result.duplicate
        seqs.append(result.seq)
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == count
    again = await bus.pipeline.send(writes[:1])  # the same msg id: JetStream says duplicate
    assert isinstance(again[0], PublishResult)
    assert again[0].duplicate
