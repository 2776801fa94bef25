"""A reply with a status header is never read as an acknowledgement, whatever its body.

nats-server's own statuses (``503`` no responders) carry no body, so a body that reads as an ack next to a status
comes only from something else answering on the subject (a core subscriber); the status wins all the same.
"""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg

from temporality_bus import Bus, PublishResult, TransientError
from temporality_bus.pipeline import Write, _outcome
from temporality_bus.routing import _LazyHeadersMsg

ACK = b'{"stream":"TEMPORALITY_EVENTS","seq":7}'
WRITE = Write("temporality.events.run.failed", b"{}", {})


def _reply(headers: bytes | None, data: bytes = ACK) -> _LazyHeadersMsg:
    return _LazyHeadersMsg(None, 1, "_INBOX.t.1", "", data, headers)  # type: ignore[arg-type]


def test_a_plain_ack_is_read_as_one() -> None:
    assert _outcome(WRITE, _reply(None), 1.0) == PublishResult(stream="TEMPORALITY_EVENTS", seq=7)


def test_an_ack_with_headers_but_no_status_is_still_an_ack() -> None:
    outcome = _outcome(WRITE, _reply(b"NATS/1.0\r\nNats-Trace: x\r\n\r\n"), 1.0)
    assert outcome == PublishResult(stream="TEMPORALITY_EVENTS", seq=7)


@pytest.mark.parametrize(
    ("block", "said"),
    [
        (b"NATS/1.0 503\r\n\r\n", "no stream took it (no responders)"),
        (b"NATS/1.0 408 Request Timeout\r\n\r\n", "status 408 Request Timeout"),
        (b"NATS/1.0\r\nStatus: 500\r\n\r\n", "status 500"),
    ],
)
def test_a_status_wins_over_a_body_that_reads_as_an_ack(block: bytes, said: str) -> None:
    outcome = _outcome(WRITE, _reply(block), 1.0)
    assert isinstance(outcome, TransientError)
    assert said in str(outcome)


def test_a_status_on_a_reply_off_nats_py_s_path_wins_too() -> None:
    msg = Msg(None, subject="_INBOX.t.1", reply="", data=ACK, headers={"Status": "503"})  # type: ignore[arg-type]
    outcome = _outcome(WRITE, msg, 1.0)
    assert isinstance(outcome, TransientError)
    assert "no responders" in str(outcome)


async def test_a_responder_answering_with_a_status_and_an_ack_body_is_not_acknowledged(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bus.js, "no_stream_retry_s", 0.3)
    asked: dict[str, int] = {}

    async def answer(msg: Msg) -> None:
        status = msg.subject.rsplit(".", 1)[1]
        asked[status] = asked.get(status, 0) + 1
        await bus.nc.publish(msg.reply, ACK, headers={"Status": status})

    sub = await bus.nc.subscribe("t.status.*", cb=answer)
    try:
        unavailable, failed = await bus.pipeline.send(
            [Write("t.status.503", b"x", {}), Write("t.status.500", b"x", {})]
        )
    finally:
        await sub.unsubscribe()
    assert isinstance(unavailable, TransientError)
    assert "no responders" in str(unavailable)
    assert asked["503"] >= 2  # read as "no stream took it": sent again until the retry window was over
    assert isinstance(failed, TransientError)
    assert "status 500" in str(failed)
    assert asked["500"] == 1
