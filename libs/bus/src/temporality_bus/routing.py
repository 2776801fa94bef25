"""Messages of a subscription straight off nats-py's parser (:func:`_route`), without its per-message path.

The consumer runner's pull requests (:class:`temporality_bus.consumer._Puller`) and the pipeline's
acknowledgements and API replies (:class:`temporality_bus.pipeline.Pipeline`) read their inbox this way: no
header block parsed unless read (:class:`_LazyHeadersMsg`), no ``Msg`` queued, no subscription task woken
and no callback coroutine per message.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

__all__: list[str] = []

log = structlog.get_logger(__name__)

#: Whether this nats-py hands every message it reads to ``Client._process_msg(sid, subject, reply, data,
#: headers)`` with the header block unparsed (pinned ``nats-py>=2.16,<2.17``): :func:`_route` relies on it.
_ROUTABLE = all(hasattr(NATS, name) for name in ("_process_msg", "_parse_header_lines"))
#: ``NATS/1.0`` (the start of a header block), then a blank before an inline status (``NATS/1.0 404 …``).
_HEADER_LINE = b"NATS/1.0"
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
    routes[sid] = on_raw
    return True


def _read_headers_fast(nc: NATS) -> None:
    """Have nats-py's own per-message path (the subscriptions not routed: a KV watch's deliveries, ``nc.request``'s
    replies) read header lines with :func:`_header_lines` (the same dict as its ``_parse_header_lines``, ~4x
    cheaper), for this connection only. Nothing changes on a nats-py without that method."""
    if hasattr(NATS, "_parse_header_lines"):
        nc._parse_header_lines = _header_lines  # type: ignore[method-assign]


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


#: Header names seen (the raw bytes before ``:``) -> the key nats-py's line parser makes of them (``None``: it skips
#: the line). A handful in practice (``Nats-Stream``, ``Nats-Subject``, ``Nats-Sequence``, ...); bounded, as nothing
#: a publisher writes may be remembered without bound: at most :data:`_NAMES_KEPT` names of at most
#: :data:`_NAME_KEPT_BYTES` each; any other is worked out every time, as nats-py does for all of them.
_NAMES: dict[bytes, str | None] = {}
_NAMES_KEPT = 1024
_NAME_KEPT_BYTES = 64


def _name_of(name: bytes) -> str | None:
    """The key nats-py's ``Client._parse_header_lines`` makes of a line's ``name`` (``None``: it skips the line)."""
    try:
        key = name.strip().decode("ascii")
    except UnicodeDecodeError:
        return None
    return None if any(c.isspace() for c in key) else key


def _header_lines(raw: bytes) -> dict[str, str]:
    """nats-py's ``Client._parse_header_lines`` (``Name: value`` lines; a line without ``:``, a name that is not
    ASCII or holds a blank skipped; the value stripped, decoded as UTF-8 with replacement), the same dict for any
    input, at a quarter of its cost: a name's checks (strip, decode, a generator over its characters: ~1.5 µs a
    header) are made once per name seen (:data:`_NAMES`), not once per line. A direct get's answer has four or
    five headers: ~10 µs to read them there, ~2.5 here."""
    out: dict[str, str] = {}
    names = _NAMES
    for line in raw.split(b"\r\n"):
        name, sep, value = line.partition(b":")
        if not sep:  # (an empty line too)
            continue
        try:
            key = names[name]
        except KeyError:
            key = _name_of(name)
            if len(names) < _NAMES_KEPT and len(name) <= _NAME_KEPT_BYTES:
                names[name] = key
        if key is not None:
            out[key] = value.strip().decode("utf-8", "replace")
    return out


def _parse_headers(raw: bytes) -> dict[str, str] | None:
    """A header block as nats-py's ``Client._process_headers`` reads it (without ``fast_mail_parser``):
    the inline status and its description, if any, then ``Name: value`` lines (:func:`_header_lines`)."""
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
                hdr.update(_header_lines(desc[i + 2 :]))
            else:
                hdr["Description"] = desc.decode()
        i = rest.find(b"\r\n")
        rest = rest[i + 2 :]
    if len(rest) > 2:
        hdr.update(_header_lines(raw[len(_HEADER_LINE) + 2 :]))
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
