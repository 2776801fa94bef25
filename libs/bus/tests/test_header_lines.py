"""The bus's header-line reader (``routing._header_lines``) gives what nats-py's ``_parse_header_lines`` gives."""

from __future__ import annotations

import random

import pytest
from nats.aio.client import Client as NATS

from temporality_bus import routing
from temporality_bus.routing import _header_lines, _LazyHeadersMsg, _read_headers_fast

#: Bytes that make header lines odd: blanks nats-py strips or refuses in a name, the separator, control and non-ASCII.
_ODD = [b" ", b"\t", b"\x0b", b"\x0c", b"\x1c", b"\x1f", b":", b"\r", b"\n", b"\r\n", b"\xc3\xa9", b"\xff", b"\x00"]
_PLAIN = [b"Nats-Subject", b"Nats-Sequence", b"KV-Operation", b"a", b"X", b"-", b"1", b"$KV.runs.k", b"DEL", b"v"]


def _block(rng: random.Random) -> bytes:
    lines = []
    for _ in range(rng.randrange(0, 7)):
        parts = [rng.choice(_ODD if rng.random() < 0.3 else _PLAIN) for _ in range(rng.randrange(0, 6))]
        lines.append(b"".join(parts))
    return b"\r\n".join(lines) + rng.choice([b"", b"\r\n", b"\r\n\r\n"])


def test_the_same_dict_as_nats_py_for_any_lines() -> None:
    rng = random.Random(20261206)
    for _ in range(20_000):
        raw = _block(rng)
        expected = NATS._parse_header_lines(raw)
        assert _header_lines(raw) == expected, raw
        assert _header_lines(raw) == expected, raw  # again, with its names remembered


@pytest.mark.parametrize(
    "block",
    [
        b"NATS/1.0\r\nNats-Stream: KV_runs\r\nNats-Subject: $KV.runs.a.b\r\nNats-Sequence: 1\r\n"
        b"Nats-Time-Stamp: 2026-12-06T23:23:41.847038938Z\r\n\r\n",
        b"NATS/1.0\r\nKV-Operation: DEL\r\nNats-Stream: KV_runs\r\nNats-Subject: $KV.runs.a.b\r\nNats-Sequence: 2\r\n\r\n",
        b"NATS/1.0 404 Message Not Found\r\n\r\n",
        b"NATS/1.0\r\n: empty name\r\nName:NoBlank\r\n Padded :  v  \r\nBad Name: skipped\r\nUtf8: caf\xc3\xa9\r\n\r\n",
    ],
)
async def test_a_direct_gets_answer_reads_as_nats_py_reads_it(block: bytes) -> None:
    expected = await NATS()._process_headers(block)
    msg = _LazyHeadersMsg(None, 1, "_INBOX.x.1", "", b"{}", block)  # type: ignore[arg-type]
    assert msg.headers == expected
    nc = NATS()
    _read_headers_fast(nc)  # nats-py's own path (a KV watch's deliveries), on this connection
    assert nc._parse_header_lines is _header_lines
    assert await nc._process_headers(block) == expected


def test_only_short_names_are_remembered() -> None:
    long = b"N" * (routing._NAME_KEPT_BYTES + 1)
    assert _header_lines(long + b": v\r\n") == {long.decode(): "v"}
    assert long not in routing._NAMES
    assert _header_lines(b"Short-Name: v\r\n") == {"Short-Name": "v"}
    assert b"Short-Name" in routing._NAMES
