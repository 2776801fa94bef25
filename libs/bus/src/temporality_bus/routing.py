"""Messages of a subscription straight off nats-py's parser (:func:`_route`), without its per-message path.

The consumer runner's pull requests (:class:`temporality_bus.consumer._Puller`) and the pipeline's
acknowledgements and API replies (:class:`temporality_bus.pipeline.Pipeline`) read their inbox this way: no
header block parsed unless read (:class:`_LazyHeadersMsg`), no ``Msg`` queued, no subscription task woken
and no callback coroutine per message. Once a connection has a route, its protocol parser is a cheaper one for
messages (:func:`_fast_parser`: no regular expression, no buffer copy and no coroutine per message), for every
subscription of that connection.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.protocol import parser as nats_parser

__all__: list[str] = []

log = structlog.get_logger(__name__)

#: Whether this nats-py hands every message it reads to ``Client._process_msg(sid, subject, reply, data,
#: headers)`` with the header block unparsed (pinned ``nats-py>=2.16,<2.17``): :func:`_route` relies on it.
_ROUTABLE = all(hasattr(NATS, name) for name in ("_process_msg", "_parse_header_lines"))
#: Whether this nats-py's protocol parser is the one :func:`_fast_parser` was written for (a ``bytearray`` ``buf``,
#: its two states, ``parse(data)`` the read loop's only entry): then the connection's parse is replaced.
_PARSER_FITS = all(
    hasattr(nats_parser, name) for name in ("Parser", "AWAITING_CONTROL_LINE", "AWAITING_MSG_PAYLOAD")
) and all(hasattr(nats_parser.Parser, name) for name in ("parse", "reset"))
#: ``NATS/1.0`` (the start of a header block), then a blank before an inline status (``NATS/1.0 404 …``).
_HEADER_LINE = b"NATS/1.0"
#: The whitespace other than a blank that nats-py's control-line regexes read (``\\s``): a ``MSG``/``HMSG`` line
#: holding any (or two blanks in a row) is left to nats-py's parser (:func:`_fast_parser`).
_OTHER_BLANKS = b"\t\n\r\x0b\x0c"
RawRoute = Callable[[int, bytes, bytes, bytes, bytes | None], None]


def _route(nc: NATS, sid: int, on_raw: RawRoute) -> bool:
    """Have the messages of subscription ``sid`` go to ``on_raw(sid, subject, reply, data, header block)`` as
    the client's parser reads them, instead of through nats-py's per-message path (every header parsed, a
    ``Msg`` built and queued, the subscription's task woken, its callback awaited: more than the rest of the
    bus side per message). ``False`` (nothing changed) when this nats-py is not the one it was written for.

    The client's ``_process_msg`` is wrapped once per connection; other subscriptions go through it as
    before. ``on_raw`` must not block (it runs inside the read loop); should it raise, the message is logged
    (``bus.routed_message_failed``) and dropped, and the read loop goes on."""
    if not _ROUTABLE:
        return False
    routes: dict[int, RawRoute] | None = getattr(nc, "_temporality_routes", None)
    if routes is None:
        routes = {}
        original = nc._process_msg
        stats = nc.stats

        async def process_msg(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
            route = routes.get(sid)
            if route is None:
                await original(sid, subject, reply, data, headers)  # type: ignore[arg-type]
                return
            stats["in_msgs"] += 1
            stats["in_bytes"] += len(data)
            try:
                route(sid, subject, reply, data, headers)
            except Exception:  # raised into the parser, it would end nats-py's read loop: the connection's end
                log.exception("bus.routed_message_failed", sid=sid, subject=subject[:256])

        nc._process_msg = process_msg  # type: ignore[method-assign]
        nc._temporality_routes = routes  # type: ignore[attr-defined]
        ps = getattr(nc, "_ps", None)
        if _PARSER_FITS and type(ps) is nats_parser.Parser:
            ps.parse = _fast_parser(nc, ps, routes)  # type: ignore[method-assign,assignment]
    routes[sid] = on_raw
    return True


def _fast_parser(
    nc: NATS, ps: nats_parser.Parser, routes: dict[int, RawRoute]
) -> Callable[[bytes], Coroutine[Any, Any, None]]:
    """The connection's ``parse(data)`` (what its read loop hands each chunk read to), for messages cheaper than
    nats-py's: a ``MSG``/``HMSG`` control line is split at its single blanks (not matched by two regular expressions
    in turn), the messages of a chunk are sliced off one immutable copy of it (not each copied out of the buffer and
    deleted from it, two copies), and a routed one is handed to its route directly (no coroutine per message:
    nats-py awaits ``_process_msg`` for each). Any other operation (``PING``, ``PONG``, ``+OK``, ``-ERR``,
    ``INFO``), a control line that does not read as the server writes one, and a chunk that finds nats-py's parser
    in the middle of a payload, go to nats-py's own ``parse`` with the rest of the chunk, as before. A message not
    all there yet stays in the buffer (``ps.buf``), and is not looked at again until its bytes are.

    The messages of other subscriptions go to the client's ``_process_msg`` as nats-py's parser hands them
    (whichever it is when the message is read, the same arguments, awaited in turn); a route runs as in
    :func:`_route`'s wrapper (counted, its failure logged)."""
    slow = nats_parser.Parser.parse
    awaiting_line = nats_parser.AWAITING_CONTROL_LINE
    stats = nc.stats
    want = 0  # how many bytes the buffer (``want_of``) must hold before the message at its start is all there
    want_of: bytearray | None = None

    async def parse(data: bytes = b"") -> None:
        nonlocal want, want_of
        buf = ps.buf
        if ps.state != awaiting_line:  # nats-py's parser stopped inside a payload (before it was replaced)
            await slow(ps, data)
            return
        if buf:
            buf.extend(data)
            if want_of is buf and len(buf) < want:
                return
            data = bytes(buf)
            buf.clear()
        want_of = None
        size = len(data)
        pos = routed = routed_bytes = 0
        try:
            while pos < size:
                if data.startswith(b"HMSG ", pos):
                    first = pos + 5
                elif data.startswith(b"MSG ", pos):
                    first = pos + 4
                else:
                    break  # another operation: nats-py's parser (below)
                eol = data.find(b"\r\n", first)
                if eol < 0:  # the control line is not all there yet
                    want_of, want = buf, 0
                    return
                line = data[first:eol]
                args = line.split(b" ")
                if b"" in args or len(line.translate(None, _OTHER_BLANKS)) != len(line):
                    break  # not single blanks between its fields (a lone LF, a tab, two blanks): nats-py's parser
                count = len(args)
                if first - pos == 5:  # HMSG <subject> <sid> [reply] <header size> <total size>
                    if count == 5:
                        subject, sid, reply, head, total = args
                    elif count == 4:
                        subject, sid, head, total = args
                        reply = b""
                    else:
                        break
                    if not (sid.isdigit() and head.isdigit() and total.isdigit()):
                        break
                    needed = int(total)
                    head_size = int(head)
                    if head_size > needed:
                        break
                else:  # MSG <subject> <sid> [reply] <size>
                    if count == 4:
                        subject, sid, reply, total = args
                    elif count == 3:
                        subject, sid, total = args
                        reply = b""
                    else:
                        break
                    if not (sid.isdigit() and total.isdigit()):
                        break
                    needed = int(total)
                    head_size = 0
                start = eol + 2
                end = start + needed
                if end + 2 > size:  # the payload is not all there yet
                    want_of, want = buf, end + 2 - pos
                    return
                if head_size:
                    headers: bytes | None = data[start : start + head_size]
                    payload = data[start + head_size : end]
                else:
                    headers = None
                    payload = data[start:end]
                pos = end + 2
                number = int(sid)
                route = routes.get(number)
                if route is None:
                    await nc._process_msg(number, subject, reply, payload, headers)  # type: ignore[arg-type]
                    if ps.buf is not buf:  # the parser was reset meanwhile (a reconnect): the rest is dropped
                        pos = size
                        return
                    continue
                routed += 1
                routed_bytes += len(payload)
                try:
                    route(number, subject, reply, payload, headers)
                except Exception:  # as in _route's wrapper: never raised into the read loop
                    log.exception("bus.routed_message_failed", sid=number, subject=subject[:256])
        finally:
            if routed:  # counted as nats-py counts every message it reads, once per read
                stats["in_msgs"] += routed
                stats["in_bytes"] += routed_bytes
            if pos < size and ps.buf is buf:
                buf.extend(data[pos:] if pos else data)
        if buf:  # what nats-py's parser reads (from the first operation this one does not)
            await slow(ps)

    return parse


def _unroute(nc: NATS, sid: int) -> None:
    """Undo :func:`_route` for ``sid`` (its messages, if any more come, take nats-py's path again)."""
    routes: dict[int, RawRoute] | None = getattr(nc, "_temporality_routes", None)
    if routes is not None:
        routes.pop(sid, None)


def _status_of(headers: bytes | None) -> str | None:
    """The inline status of a header block (``NATS/1.0 404 No Messages``), as nats-py reads it (its
    ``Status`` header: the three characters after the blank, when they are a number)."""
    if not headers or headers[len(_HEADER_LINE) : len(_HEADER_LINE) + 1] != b" ":
        return None
    status = headers[len(_HEADER_LINE) + 1 : len(_HEADER_LINE) + 4].strip().decode("ascii", "replace")
    return status if status.isdigit() else None


def _parse_headers(raw: bytes) -> dict[str, str] | None:
    """A header block as nats-py's ``Client._process_headers`` reads it (without ``fast_mail_parser``):
    the inline status and its description, if any, then ``Name: value`` lines."""
    hdr: dict[str, str] = {}
    rest = raw[len(_HEADER_LINE) :]
    if rest[:1] == b" ":
        status = _status_of(raw)
        if status is not None:
            hdr["Status"] = status
        line = raw[len(_HEADER_LINE) + 1 :]
        desc = line[4 : len(line) - 4]
        if desc:
            i = desc.find(b"\r\n")
            if i > 0:
                hdr["Description"] = desc[:i].decode()
                hdr.update(NATS._parse_header_lines(desc[i + 2 :]))
            else:
                hdr["Description"] = desc.decode()
        i = rest.find(b"\r\n")
        rest = rest[i + 2 :]
    if len(rest) > 2:
        hdr.update(NATS._parse_header_lines(raw[len(_HEADER_LINE) + 2 :]))
    return hdr or None


class _LazyHeadersMsg(Msg):
    """A routed message (:func:`_route`): a ``Msg`` whose header block is parsed when ``headers`` is first
    read (the batch path never reads them; a dead letter copies them)."""

    def __init__(
        self, client: NATS, sid: int, subject: str, reply: str, data: bytes, raw_headers: bytes | None
    ) -> None:
        self._client = client
        self._sid = sid
        self.subject = subject
        self.reply = reply
        self.data = data
        self._metadata = None
        self._ackd = False
        self._raw_headers = raw_headers
        self._headers: dict[str, str] | None = None

    @property
    def headers(self) -> dict[str, str] | None:
        if self._raw_headers is not None:
            self._headers, self._raw_headers = _parse_headers(self._raw_headers), None
        return self._headers

    @headers.setter
    def headers(self, value: dict[str, str] | None) -> None:
        self._headers, self._raw_headers = value, None
