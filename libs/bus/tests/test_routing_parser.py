"""The connection's protocol parser once a subscription is routed (:func:`temporality_bus.routing._fast_parser`):
it hands every message and operation on exactly as nats-py's own parser does, however the bytes are cut into
reads, and a routed message to its route instead of ``_process_msg``.

Two unconnected nats-py clients read the same bytes: one with nats-py's parser, one with the routed parser; each
records what its parser hands to the client (``_process_msg``, ``_process_ping``, ...). No server here: the
parser's input is the server's protocol, written out."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from temporality_bus.routing import _route
from temporality_testing.waiting import eventually

ROUTED = 7

HEADERS = (
    b"NATS/1.0\r\nNats-Msg-Id: evt-1\r\nContent-Type: application/cloudevents+json\r\nCe-Type: run.started\r\n\r\n"
)
ACK = "$JS.ACK.EVENTS.journal.1.{0}.{0}.1733480000000000000.{1}"


def _stream() -> bytes:
    """A server's output: messages of a routed and an unrouted subscription (MSG and HMSG, with and without a
    reply, empty, large, with protocol words and CRLF in the payload), statuses, and the other operations."""
    parts: list[bytes] = [b'INFO {"server_id":"x","max_payload":1048576}\r\n', b"+OK\r\n"]
    for i in range(40):
        sid = ROUTED if i % 3 else 9
        body = b'{"id":"evt-%d","data":{"text":"MSG 1 2 3\\r\\nPING"}}' % i
        reply = ACK.format(100 + i, 40 - i).encode()
        parts.append(
            b"HMSG _INBOX.a.%d %d %s %d %d\r\n%s%s\r\n"
            % (i, sid, reply, len(HEADERS), len(HEADERS) + len(body), HEADERS, body)
        )
        parts.append(b"MSG t.plain %d %d\r\n%s\r\n" % (sid, len(body), body))
        if i % 7 == 0:
            parts.append(b"PING\r\n")
        if i % 11 == 0:
            parts.append(b"PONG\r\n")
            status = b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 1\r\n\r\n"
            parts.append(b"HMSG _INBOX.a.%d %d %d %d\r\n%s\r\n" % (i, sid, len(status), len(status), status))
        if i % 13 == 0:
            parts.append(b"MSG t.empty %d reply.x 0\r\n\r\n" % sid)
            parts.append(b"MSG  t.spaced\t%d   12\r\nMSG\r\nMSG 1\r\n\r\n" % sid)  # blanks as nats-py's regex allows
            big = bytes(range(256)) * 400 + b"\r\nMSG x 7 1\r\n"
            parts.append(b"MSG t.big %d %d\r\n%s\r\n" % (sid, len(big), big))
        if i == 20:
            parts.append(b"HMSG t.nohead %d reply.y 0 3\r\nabc\r\n" % sid)
    return b"".join(parts)


def _recorder(nc: NATS, seen: list[tuple[Any, ...]]) -> None:
    async def process_msg(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        seen.append(("msg", sid, bytes(subject), bytes(reply), data, headers))

    async def process_ping() -> None:
        seen.append(("ping",))

    async def process_pong() -> None:
        seen.append(("pong",))

    async def process_info(info: dict[str, Any], initial_connection: bool = False) -> None:
        seen.append(("info", info))

    async def process_err(err: str) -> None:
        seen.append(("err", err))

    nc._process_msg = process_msg  # type: ignore[method-assign]
    nc._process_ping = process_ping  # type: ignore[method-assign]
    nc._process_pong = process_pong  # type: ignore[method-assign]
    nc._process_info = process_info  # type: ignore[method-assign]
    nc._process_err = process_err  # type: ignore[method-assign]


def _recording(seen: list[tuple[Any, ...]]) -> Callable[..., None]:
    """A route that records its messages as ``_recorder``'s ``_process_msg`` does."""

    def on_raw(*msg: Any) -> None:
        seen.append(("msg", *msg))

    return on_raw


async def _read(stream: bytes, cuts: list[int], *, routed: bool, route_raises: bool = False) -> list[tuple[Any, ...]]:
    nc = NATS()
    seen: list[tuple[Any, ...]] = []
    _recorder(nc, seen)
    if routed:

        def on_raw(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
            seen.append(("msg", sid, bytes(subject), bytes(reply), data, headers))
            if route_raises:
                raise RuntimeError("a route that fails")

        assert _route(nc, ROUTED, on_raw)
        assert "parse" in vars(nc._ps)  # the routed parser is the one reading
    at = 0
    for cut in [*cuts, len(stream)]:
        await nc._ps.parse(stream[at:cut])
        at = cut
    assert not nc._ps.buf
    return seen


@pytest.mark.parametrize("seed", range(12))
async def test_the_routed_parser_hands_on_what_nats_py_parser_does_however_the_reads_are_cut(seed: int) -> None:
    stream = _stream()
    rng = random.Random(seed)
    # a few long reads, or many short ones (down to one byte), or a cut at every operation's edge
    step = [1, 7, 64, 700, 4096, 65536][seed % 6]
    cuts = sorted({rng.randrange(1, len(stream)) for _ in range(len(stream) // step + 1)})
    expected = await _read(stream, cuts, routed=False)
    got = await _read(stream, cuts, routed=True)
    assert got == expected
    assert sum(1 for e in expected if e[0] == "msg") == 40 * 2 + 4 + 3 * 4 + 1
    assert [e for e in expected if e[0] != "msg"][:1] == [("info", {"server_id": "x", "max_payload": 1048576})]


async def test_the_routed_parser_reads_a_message_a_read_at_a_time_without_reading_it_again() -> None:
    """A message not all there stays in the buffer, untouched until its bytes are (one byte a read here)."""
    body = b"x" * 5000
    stream = b"MSG t 7 r %d\r\n%s\r\nPING\r\n" % (len(body), body)
    got = await _read(stream, list(range(1, len(stream))), routed=True)
    assert got == [("msg", ROUTED, b"t", b"r", body, None), ("ping",)]


async def test_a_control_line_the_server_would_not_write_is_read_as_nats_py_reads_it() -> None:
    """Anything but a plain ``MSG``/``HMSG`` line goes to nats-py's parser: the same records, or the same error."""
    streams = (
        b"MSG t x 3\r\nabc\r\n",
        b"HMSG t 7 5 3\r\nabc\r\n",
        b"MSG t 7 -1\r\n\r\n",
        b"BOGUS\r\n",
        b"MSG t 7 3_0\r\n",
        # too few or too many fields, a size that is not a number
        b"MSG t 3\r\nabc\r\n",
        b"MSG t 7 r s 3\r\nabc\r\n",
        b"HMSG t 7 3\r\nabc\r\n",
        b"HMSG t 7 r s 0 3\r\nabc\r\n",
        b"HMSG t 7 r x 3\r\nabc\r\n",
        b"HMSG t 7 0 3x\r\nabc\r\n",
        # a lone LF, CR, tab, vertical tab or form feed, or two blanks, in the line: nats-py's regexes decide
        b"MSG s 7 3\n5\r\nabcde\r\n",
        b"MSG s\n7 3\r\nabc\r\n",
        b"MSG s 7 r\r3\r\nabc\r\n",
        b"MSG s\tx 7 3\r\nabc\r\n",
        b"MSG s 7\x0b3\r\nabc\r\n",
        b"MSG s 7 r\x0c3\r\nabc\r\n",
        b"HMSG s 7 r 0\n3\r\nabc\r\n",
        b"HMSG s 7 r\t0 3\r\nabc\r\n",
        b"HMSG s\n7 0 3\r\nabc\r\n",
        b"MSG s  7 3\r\nabc\r\n",
        b"MSG  s 7 3\r\nabc\r\n",
        b"MSG s 7 3 \r\nabc\r\n",
        b"MSG s 7  r 3\r\nabc\r\n",
        b"HMSG s 7  0 3\r\nabc\r\n",
    )
    for stream in streams:
        stream = b"MSG t 7 1\r\na\r\n" + stream + b"PING\r\n"
        for cut in [None, *range(1, len(stream))]:  # in one read, or in two cut anywhere (the bad line in pieces)
            cuts = [] if cut is None else [cut]
            assert await _outcome(stream, cuts, routed=True) == await _outcome(stream, cuts, routed=False), (
                stream,
                cut,
            )


async def _outcome(stream: bytes, cuts: list[int], *, routed: bool) -> tuple[list[tuple[Any, ...]], type | None]:
    """What a parser handed on reading ``stream`` cut at ``cuts``, then the type of what it raised, if anything."""
    nc = NATS()
    seen: list[tuple[Any, ...]] = []
    _recorder(nc, seen)
    if routed:
        assert _route(nc, ROUTED, _recording(seen))
    at = 0
    try:
        for cut in [*cuts, len(stream)]:
            await nc._ps.parse(stream[at:cut])
            at = cut
    except Exception as exc:
        return seen, type(exc)
    return seen, None


async def _read_switching_process_msg(stream: bytes, at: int, *, routed: bool) -> list[tuple[Any, ...]]:
    """``stream`` read in two, another ``_process_msg`` wrapped around the client's between the two reads."""
    nc = NATS()
    seen: list[tuple[Any, ...]] = []
    _recorder(nc, seen)
    if routed:
        assert _route(nc, ROUTED, lambda sid, *_: seen.append(("routed", sid)))
    await nc._ps.parse(stream[:at])
    inner = nc._process_msg

    async def later(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        seen.append(("later", data))
        await inner(sid, subject, reply, data, headers)

    nc._process_msg = later  # type: ignore[method-assign]
    await nc._ps.parse(stream[at:])
    return seen


async def test_an_unrouted_message_goes_to_the_client_s_process_msg_of_the_moment() -> None:
    """A ``_process_msg`` put on the client after the first route (another wrapper) gets the unrouted messages
    read from then on, as it would from nats-py's parser."""
    stream = b"MSG t 9 1\r\na\r\nMSG t 7 1\r\nb\r\nMSG t 9 1\r\nc\r\n"
    assert await _read_switching_process_msg(stream, 14, routed=False) == [
        ("msg", 9, b"t", b"", b"a", None),
        ("later", b"b"),
        ("msg", 7, b"t", b"", b"b", None),
        ("later", b"c"),
        ("msg", 9, b"t", b"", b"c", None),
    ]
    assert await _read_switching_process_msg(stream, 14, routed=True) == [
        ("msg", 9, b"t", b"", b"a", None),
        ("routed", 7),
        ("later", b"c"),
        ("msg", 9, b"t", b"", b"c", None),
    ]


UNROUTED = 9
IDLE_HEARTBEAT = b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 5\r\nNats-Last-Stream: 10\r\n\r\n"
NO_MESSAGES = b"NATS/1.0 404 No Messages\r\n\r\n"
SHORT_HEADERS = b"NATS/1.0\r\nA: b\r\n\r\n"


def _short_stream() -> bytes:
    """Every kind of operation in a few hundred bytes (cut every way below): routed and unrouted messages, an
    idle heartbeat and a 404 status, ``-ERR``, a second ``INFO``, payloads that are CRLFs or a protocol word."""
    return b"".join(
        (
            b'INFO {"a":1}\r\n',
            b"+OK\r\n",
            b"MSG s %d r 3\r\nabc\r\n" % ROUTED,
            b"MSG s %d 0\r\n\r\n" % UNROUTED,
            b"HMSG _I.1 %d %d %d\r\n%s\r\n" % (ROUTED, len(IDLE_HEARTBEAT), len(IDLE_HEARTBEAT), IDLE_HEARTBEAT),
            b"PING\r\n",
            b"HMSG s %d r %d %d\r\n%sxy\r\n" % (UNROUTED, len(SHORT_HEADERS), len(SHORT_HEADERS) + 2, SHORT_HEADERS),
            b"-ERR 'Permissions Violation for Publish to x'\r\n",
            b"HMSG _I.2 %d %d %d\r\n%s\r\n" % (ROUTED, len(NO_MESSAGES), len(NO_MESSAGES), NO_MESSAGES),
            b"MSG s %d r 0\r\n\r\n" % ROUTED,
            b'INFO {"b":2}\r\n',
            b"HMSG s %d r %d %d\r\n%s\r\n" % (ROUTED, len(SHORT_HEADERS), len(SHORT_HEADERS), SHORT_HEADERS),
            b"MSG s %d 5\r\n\r\n\r\nx\r\n" % ROUTED,
            b"PONG\r\n",
            b"MSG s %d r 4\r\nMSG \r\n" % UNROUTED,
        )
    )


async def test_every_two_cuts_of_every_operation_read_as_nats_py_reads_them() -> None:
    stream = _short_stream()
    expected = await _read(stream, [], routed=False)
    assert ("err", "'permissions violation for publish to x'") in expected
    assert [e for e in expected if e[0] == "info"] == [("info", {"a": 1}), ("info", {"b": 2})]
    for first in range(1, len(stream)):
        for second in range(first, len(stream), 11):
            cuts = sorted({first, second})
            assert await _read(stream, cuts, routed=True) == await _read(stream, cuts, routed=False), cuts


@pytest.mark.parametrize("step", [1, 2, 5, 20, 100])
async def test_the_short_stream_over_and_over_in_random_reads(step: int) -> None:
    stream = _short_stream() * 5
    for seed in range(12):
        rng = random.Random(seed)
        cuts = sorted({rng.randrange(1, len(stream)) for _ in range(len(stream) // step)})
        assert await _read(stream, cuts, routed=True) == await _read(stream, cuts, routed=False), seed


async def test_a_raising_route_loses_its_message_only() -> None:
    """The route raised for every message (each logged and dropped): every other record is still nats-py's."""
    stream = _short_stream()
    for cuts in ([], [40, 41, 200], list(range(1, len(stream), 3))):
        got = await _read(stream, cuts, routed=True, route_raises=True)
        assert got == await _read(stream, cuts, routed=False), cuts


async def test_a_route_put_on_while_nats_py_parser_is_inside_a_line_or_a_payload() -> None:
    """The first route comes while nats-py's parser holds part of a control line or is inside a payload: the
    routed parser reads on from there (nats-py's parser finishing that message) as if the route had been there."""
    stream = _short_stream()
    for at in range(1, len(stream)):
        nc = NATS()
        seen: list[tuple[Any, ...]] = []
        _recorder(nc, seen)
        await nc._ps.parse(stream[:at])
        assert _route(nc, ROUTED, _recording(seen))
        await nc._ps.parse(stream[at : at + 7])
        await nc._ps.parse(stream[at + 7 :])
        assert seen == await _read(stream, [at, at + 7], routed=False), at
        assert not nc._ps.buf


async def _reset_while_awaiting(*, routed: bool) -> tuple[list[tuple[Any, ...]], bytes]:
    """The parser reset (as a reconnect does) while the client's ``_process_msg`` of an unrouted message is
    suspended: the rest of that read is dropped; the next read is read."""
    stream = _short_stream()
    nc = NATS()
    seen: list[tuple[Any, ...]] = []
    _recorder(nc, seen)
    recorded = nc._process_msg

    async def process_msg(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        await recorded(sid, subject, reply, data, headers)
        if sid == UNROUTED and data == b"":
            await asyncio.sleep(0)
            nc._ps.reset()

    nc._process_msg = process_msg  # type: ignore[method-assign]
    if routed:
        assert _route(nc, ROUTED, _recording(seen))
    await nc._ps.parse(stream[:20])
    await nc._ps.parse(stream[20:])
    await nc._ps.parse(b"MSG s %d 2\r\nok\r\n" % ROUTED)
    return seen, bytes(nc._ps.buf)


async def test_a_reset_while_an_unrouted_message_is_handed_on_drops_the_rest_of_the_read() -> None:
    expected = await _reset_while_awaiting(routed=False)
    assert expected[0][-1] == ("msg", ROUTED, b"s", b"", b"ok", None)
    assert await _reset_while_awaiting(routed=True) == expected


async def test_a_reset_between_reads_drops_a_message_not_all_there() -> None:
    outcomes = []
    for routed in (False, True):
        nc = NATS()
        seen: list[tuple[Any, ...]] = []
        _recorder(nc, seen)
        if routed:
            assert _route(nc, ROUTED, _recording(seen))
        await nc._ps.parse(b"MSG s %d 10\r\n01234" % ROUTED)
        nc._ps.reset()
        await nc._ps.parse(b"MSG s %d 2\r\nok\r\nMSG s %d 3\r\nabc" % (ROUTED, ROUTED))
        await nc._ps.parse(b"\r\nPING\r\n")
        outcomes.append(seen)
    assert outcomes[0] == [
        ("msg", ROUTED, b"s", b"", b"ok", None),
        ("msg", ROUTED, b"s", b"", b"abc", None),
        ("ping",),
    ]
    assert outcomes[1] == outcomes[0]


async def _cancel_while_awaiting(*, routed: bool) -> tuple[list[tuple[Any, ...]], bytes]:
    """The read cancelled while the client's ``_process_msg`` of an unrouted message is suspended (the read loop
    cancelled on close): what is left of the read stays in the buffer, and the next parse reads it."""
    nc = NATS()
    seen: list[tuple[Any, ...]] = []
    _recorder(nc, seen)
    recorded = nc._process_msg
    gate = asyncio.Event()

    async def process_msg(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        await recorded(sid, subject, reply, data, headers)
        if sid == UNROUTED and data == b"":
            await gate.wait()

    nc._process_msg = process_msg  # type: ignore[method-assign]
    if routed:
        assert _route(nc, ROUTED, _recording(seen))
    reading = asyncio.create_task(nc._ps.parse(_short_stream()))

    async def suspended() -> bool:
        return seen[-1:] == [("msg", UNROUTED, b"s", b"", b"", None)]

    await eventually(suspended, 10, "the unrouted message handed on", interval_s=0.001)
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    gate.set()
    rest = bytes(nc._ps.buf)
    await nc._ps.parse(b"")
    return seen, rest


async def test_a_read_cancelled_while_an_unrouted_message_is_handed_on_keeps_the_rest() -> None:
    expected = await _cancel_while_awaiting(routed=False)
    assert expected[1]
    assert await _cancel_while_awaiting(routed=True) == expected
