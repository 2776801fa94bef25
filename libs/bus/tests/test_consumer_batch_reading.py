"""What the batch path reads off a message without nats-py's metadata parser and protocol's two-step decode:
the same delivery count and stream sequence as nats-py, and the same envelope (or the same error) as
``temporality_protocol.decode``, for ordinary envelopes and for every case the one-pass decode hands back."""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError
from pydantic_core import to_json

from temporality_bus.consumer import Delivery, _decode, _LazyHeadersMsg, _status_of
from temporality_protocol import ProtocolError, RunFailed, decode, encode, make_event


def _msg(reply: str) -> Msg:
    return Msg(_client=None, subject="temporality.events.run.failed", reply=reply, data=b"{}")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "reply",
    [
        "$JS.ACK.TEMPORALITY_EVENTS.journal.3.1207.88.1796244755433384032.4",  # v1: 9 tokens
        "$JS.ACK.hub.ACCHASH.TEMPORALITY_EVENTS.journal.3.1207.88.1796244755433384032.4.rnd",  # v2: 12 tokens
        "$JS.ACK.hub.ACCHASH.TEMPORALITY_EVENTS.journal.3.1207.88.1796244755433384032.4",  # v2 without the token
        "$JS.ACK.TEMPORALITY_EVENTS.journal.0.1207.88.1796244755433384032.4",  # a count of 0 reads as 1
    ],
)
def test_the_ack_subject_gives_what_the_metadata_gives(reply: str) -> None:
    delivery = Delivery(_msg(reply))
    md = _msg(reply).metadata
    assert delivery.num_delivered == (md.num_delivered or 1)
    assert delivery.stream_seq == md.sequence.stream
    assert delivery.stream_seq == 1207


def test_a_reply_that_is_no_ack_subject_is_refused_as_nats_py_refuses_it() -> None:
    with pytest.raises(NotJSMessageError):
        Delivery(_msg("_INBOX.abc.1"))


def _doc(**changes: Any) -> dict[str, Any]:
    event = make_event(RunFailed(run_id="run-1", reason="r", error="e"), source="/test", id="evt-1", run_id="run-1")
    doc: dict[str, Any] = dict(decode(encode(event)).model_dump(exclude_none=True, mode="json"))
    for key, value in changes.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    return doc


CASES = [
    pytest.param(to_json(_doc()), id="ordinary"),
    pytest.param(to_json(_doc(data={"run_id": "run-1", "reason": "r", "error": "e", "n": [1, 2.5, None]})), id="data"),
    pytest.param(to_json(_doc(specversion=None)), id="no-specversion"),
    pytest.param(to_json(_doc(specversion="0.3")), id="specversion-0.3"),
    pytest.param(to_json(_doc(protocolversion=None)), id="no-protocolversion"),
    pytest.param(to_json(_doc(data_base64="eyJ9")), id="data_base64"),
    pytest.param(to_json(_doc(data=[1, 2])), id="data-a-list"),
    pytest.param(to_json(_doc(time="2026-12-02T10:00:00")), id="naive-time"),
    pytest.param(to_json(_doc(id="")), id="empty-id"),
    pytest.param(to_json(_doc(extra_attribute="kept out")), id="unknown-attribute"),
    pytest.param(to_json(_doc(data={"x": "NaN is only text here"})), id="NaN-in-a-string"),
    pytest.param(to_json(_doc()).replace(b'"reason":"r"', b'"reason":"r","f":NaN'), id="NaN-number"),
    pytest.param(to_json(_doc()).replace(b'"reason":"r"', b'"reason":"r","f":Infinity'), id="Infinity-number"),
    pytest.param(to_json(_doc()).replace(b'"reason":"r"', b'"reason":"r","f":-Infinity'), id="minus-Infinity"),
    pytest.param(to_json(_doc(data={"x": "Nightly Integration, Iteration N"})), id="capitals-no-NaN"),
    pytest.param(to_json(_doc(data={"x": "Infinity is only text here"})), id="Infinity-in-a-string"),
    pytest.param(b"[1, 2]", id="not-an-object"),
    pytest.param(b"{not json", id="not-json"),
]


@pytest.mark.parametrize("raw", CASES)
def test_the_one_pass_decode_gives_what_decode_gives(raw: bytes) -> None:
    expected: object
    try:
        expected = decode(raw)
    except ProtocolError as exc:
        expected = (type(exc), str(exc))
    try:
        got: object = _decode(raw)
    except ProtocolError as exc:
        got = (type(exc), str(exc))
    assert got == expected


@pytest.mark.parametrize(
    "block",
    [
        b"NATS/1.0\r\nNats-Msg-Id: evt-1\r\nContent-Type: application/cloudevents+json\r\nCe-Type: run.failed\r\n\r\n",
        b"NATS/1.0\r\ntraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n\r\n",
        b"NATS/1.0 404 No Messages\r\n\r\n",
        b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 1\r\nNats-Pending-Bytes: 20\r\n\r\n",
        b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 1016\r\nNats-Last-Stream: 1024\r\n\r\n",
        b"NATS/1.0 503\r\n\r\n",
        b"NATS/1.0\r\n\r\n",
        b"NATS/1.0\r\nName:NoBlank\r\nBad Name: skipped\r\nUtf8: caf\xc3\xa9\r\n\r\n",
    ],
)
async def test_a_routed_message_reads_the_headers_and_status_nats_py_reads(block: bytes) -> None:
    """The batch path's messages skip nats-py's header parsing (``_route``); read, their headers are the same."""
    expected = await NATS()._process_headers(block)
    msg = _LazyHeadersMsg(None, 1, "_INBOX.x.1", "$JS.ACK.S.d.1.1.1.1.0", b"{}", block)  # type: ignore[arg-type]
    assert msg.headers == expected
    assert _status_of(block) == (expected or {}).get("Status")
