"""Several JetStream writes in one round trip, each with its own outcome: events and KV writes mixed.

This is the bus's one pipelined-publish mechanism: :meth:`temporality_bus.Bus.publish_many` (and
``publish_raw_many``) is :meth:`Pipeline.send` on the Bus's own pipeline, then the first failure raised.
A caller that writes a compare-and-set KV value next to other things (the gateway's dedupe claim with its
delivery record) needs to know *which* write failed and why: a lost compare-and-set is an answer, not an
outage. So :meth:`Pipeline.send` writes every message before awaiting the first acknowledgement and
returns, in order, a :class:`PublishResult` or the error of each::

    results = await bus.pipeline.send([kv_write(BUCKET, key, claim, revision=0), kv_write(...), event_write(e)])
    Conflict      the KV key was not at ``revision`` (0: the key exists) -- nothing was written
    TransientError no acknowledgement within the timeout, no stream (after the retries below), JetStream
                  refused it (its reason in the text), a reply with a status header (never read as an ack,
                  whatever its body), the connection failed or was lost after the write went out (at once,
                  see below): it may or may not have been stored (write it again with the same id /
                  revision, or read it)
    PermanentError larger than the server's max_payload (nothing of the batch is sent)

A write no stream took (503, "no responders") stored nothing, so it is sent again, with backoff, for up to
the Bus's ``js.no_stream_retry_s`` (:data:`temporality_bus.connection.NO_STREAM_RETRY_S`), as ``bus.js.publish``
does: on a cluster a stream or bucket just created can lack subject interest on this node for a moment.

*A lost connection*: the acknowledgement of a write that went out on a connection that is then lost can never
come (the server's replies went to that connection; core NATS keeps nothing for a subscriber that is away, and
the reply subscription nats-py renews on the reconnect only gets the replies of writes sent since). So when
nats-py reports the loss (:meth:`Bus.connect`'s disconnected callback), each such write, and each read
(:meth:`Pipeline.request`), fails at once with a :class:`TransientError` instead of after its timeout (10 s by
default). A write that has not reached the socket yet, still in the client's outbound buffer when the connection
is lost (nats-py writes that buffer on the next connection), or handed over while the client reconnects, was never sent:
it waits there, goes out on the new connection (after nats-py renewed the reply subscription) and is acknowledged
there, so it is not failed. The pipeline does not send a write again itself: an event could be (its
``Nats-Msg-Id`` makes a second copy a duplicate within the stream's window), but a compare-and-set whose first
copy was stored would come back as :class:`Conflict`, a race the caller never lost (the gateway's dedupe claim
would take its own claim for another's), and a plain KV put sent again could overwrite a value written
meanwhile. The caller, which knows what its write means, sends it again or reads (a retried compare-and-set
that gets :class:`Conflict` must read the key to tell its own write from another's).

A KV write goes out as the KV client sends one (``$KV.<bucket>.<key>``, ``Nats-Expected-Last-Subject-
Sequence`` for compare-and-set), so a reader sees an ordinary entry and its revision is the ack's
``seq``. ``revision=0`` is create-if-absent *for a key never written or expired*: unlike
``KeyValue.create`` it does not also accept a deleted key (fall back to :class:`~temporality_bus.Store`
on :class:`Conflict` if a key can have been deleted). The values are written as given: validating them
is the caller's business (the store's typed writes revalidate every value; this is for a hot path that
built its values through the validating constructors once).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

from temporality_bus.errors import BusError, Conflict, PayloadTooLarge, TransientError
from temporality_bus.routing import _LazyHeadersMsg, _parse_headers, _route
from temporality_bus.tracing import producer_context, traced
from temporality_protocol import CONTENT_TYPE, EncodedEvent, Envelope, encode
from temporality_protocol.jetstream import kv_write_subject

if TYPE_CHECKING:
    from temporality_bus.connection import Bus

__all__ = ["JS_TIMEOUT_S", "Pipeline", "PublishResult", "Write", "event_write", "kv_write"]

log = structlog.get_logger(__name__)
#: How long a JetStream publish (or API call) waits for the server's acknowledgement.
JS_TIMEOUT_S = 10.0
#: JetStream's error code for a compare-and-set whose expected last sequence did not match.
_WRONG_LAST_SEQUENCE = 10071
_EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
_NO_RESPONDERS = "503"  # the status header of a publish no stream took


class PublishResult(BaseModel):
    """JetStream's acknowledgement of a stored write: the stream, the sequence (a KV write's revision), and
    whether it was a duplicate of a ``Nats-Msg-Id`` inside the stream's duplicate window (the ack leaves
    ``duplicate`` out when it is not one)."""

    stream: str
    seq: int
    duplicate: bool = False


class Write(NamedTuple):
    """One JetStream write: the subject, the bytes, the headers; ``bucket``/``key``/``revision`` for a
    KV write (so a lost compare-and-set is reported as :class:`Conflict` naming them).

    Immutable (a ``NamedTuple``: ``write._replace(subject=...)`` for a changed copy). It was a frozen dataclass
    until 2026-12-06, whose constructor sets each field through ``object.__setattr__``: ~0.7 µs a write against
    ~0.3, on the hot path of every pipelined publish."""

    subject: str
    payload: bytes
    headers: dict[str, str]
    bucket: str | None = None
    key: str | None = None
    revision: int | None = None


def event_write(event: Envelope | EncodedEvent) -> Write:
    """``event`` as :meth:`Bus.publish` sends it (encoded once here, or already, an
    :class:`~temporality_protocol.EncodedEvent`; ``Nats-Msg-Id`` = its id; inside a span with its trace
    context, :func:`temporality_bus.tracing.traced`)."""
    if isinstance(event, EncodedEvent):
        context = producer_context(event)
        payload = event.encoded() if context is None else event.encoded(*context)
    else:
        event = traced(event)
        payload = encode(event)
    return Write(
        event.nats_subject,
        payload,
        {"Nats-Msg-Id": event.id, "Content-Type": CONTENT_TYPE, "Ce-Type": event.type},
    )


def kv_write(bucket: str, key: str, value: bytes, *, revision: int | None = None) -> Write:
    """A KV put of ``value`` under ``key``; with ``revision``, only if the key is at that revision (0: absent)."""
    headers = {} if revision is None else {_EXPECTED_LAST: str(revision)}
    return Write(f"$KV.{bucket}.{key}", value, headers, bucket=bucket, key=key, revision=revision)


#: A reply as :meth:`Pipeline._on_raw` takes it off the parser (sid, subject, reply subject, data, header block): a
#: ``Msg`` only when one is asked for (:func:`_as_msg`); a ``Msg`` from nats-py's own path (:meth:`Pipeline._on_reply`).
Raw = tuple[int, bytes, bytes, bytes, bytes | None]
Reply = Msg | Raw


class Pipeline:
    """Pipelined writes over one :class:`Bus` (one reply subscription, opened on first use). The Bus has
    one, :attr:`Bus.pipeline`, that every caller can share (its :meth:`~Bus.publish_many` uses it)."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._prefix: str | None = None
        self._lock = asyncio.Lock()
        #: token (the number after the inbox prefix in a write's reply subject) -> (the round waiting for it, the
        #: write's place in that round)
        self._pending: dict[int, tuple[_Round, int]] = {}
        #: The next write's token (a round takes as many consecutive ones as it has writes).
        self._next = 0
        #: The rounds waiting for their replies -> their deadline (``loop.time()``), and the one timer that wakes
        #: them (:meth:`_expire`), armed at (or before) the earliest deadline: not a ``call_later`` and its
        #: ``cancel`` per round. A round that ends leaves the timer as it is; when it fires it wakes the rounds
        #: whose deadline passed and is armed again at the earliest one left, if any.
        self._timed: dict[_Round, float] = {}
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at = 0.0
        self._expiry_loop: asyncio.AbstractEventLoop | None = None
        #: How many times the connection was lost (:meth:`_connection_lost`): the number of the connection that is
        #: up, or the one the client is getting back to; and whether it is down (lost, not back yet). Only for a
        #: round sent through ``nc.publish`` (a nats-py without the buffer :func:`_send` hands its frames to).
        self._lost = 0
        self._down = False
        watchers = getattr(bus, "_pipelines", None)
        if watchers is not None:  # the Bus tells its pipelines of each disconnection and reconnection
            watchers.add(self)

    @property
    def pending(self) -> int:
        """How many writes are waiting for their acknowledgement right now."""
        return len(self._pending)

    async def send(self, writes: Sequence[Write], *, timeout_s: float = JS_TIMEOUT_S) -> list[PublishResult | BusError]:
        """Write all of ``writes``, then await every acknowledgement (one deadline for the batch); the
        outcome of each, in order. Raises only :class:`PermanentError` (one exceeds max_payload: nothing
        is sent); a write that cannot be sent, or is not acknowledged, is a :class:`TransientError` in
        its place (a :class:`PermanentError` if the server's max_payload shrank since the check). The writes
        no stream took are sent again together (each time with a new ``timeout_s``)
        until one does or the Bus's ``js.no_stream_retry_s`` is over."""
        if not writes:
            return []
        domain = self._bus.settings.jetstream_domain
        if domain is not None:  # a KV write in a JetStream domain: $JS.<domain>.API.$KV... (.jetstream)
            writes = [
                w if w.bucket is None else w._replace(subject=kv_write_subject(w.subject, domain)) for w in writes
            ]
        max_payload = self._bus.nc.max_payload
        for write in writes:
            if len(write.payload) > max_payload:
                raise PayloadTooLarge(len(write.payload))
        prefix = self._prefix or await self._inbox()
        loop = asyncio.get_running_loop()
        first_sent = loop.time()  # (as Bus.js.publish: the retries' time counts from the first send)
        replies = await self._round(writes, prefix, timeout_s)
        outcomes: list[PublishResult | BusError] = [
            _outcome(w, r, timeout_s) for w, r in zip(writes, replies, strict=True)
        ]
        for outcome in outcomes:
            if outcome.__class__ is not PublishResult:
                break
        else:
            return outcomes  # the hot path: one round trip, every write stored
        again = _no_stream_took(outcomes, replies, range(len(writes)))
        if not again:
            return outcomes
        retry_until = first_sent + self._bus.js.no_stream_retry_s
        delay = 0.02
        while again and loop.time() + delay <= retry_until:
            log.debug("publish.no_stream_yet", subjects=sorted({writes[i].subject for i in again}), retry_in_s=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
            replies = await self._round([writes[i] for i in again], prefix, timeout_s)
            for i, reply in zip(again, replies, strict=True):
                outcomes[i] = _outcome(writes[i], reply, timeout_s)
            again = _no_stream_took([outcomes[i] for i in again], replies, again)
        return outcomes

    async def request(self, subject: str, payload: bytes, *, timeout_s: float = JS_TIMEOUT_S) -> Msg:
        """One request (a JetStream API call: :meth:`temporality_bus.Store.get`'s read) through this pipeline's
        reply inbox: its reply. :class:`TransientError` for no reply within ``timeout_s``, no responders (no
        stream), or a connection that cannot send it.

        ``nc.request`` without its costs per request on a hot path: a random token and a NUID, ``nc.publish``'s
        checks, an ``asyncio.wait_for``, and the reply through nats-py's per-message path (:meth:`_on_raw`)."""
        prefix = self._prefix or await self._inbox()
        (reply,) = await self._round([Write(subject, payload, {})], prefix, timeout_s)
        if isinstance(reply, BusError):
            raise reply
        if reply is None:
            raise TransientError(f"request to {subject} failed: no reply within {timeout_s:g} s")
        msg = _as_msg(self._bus.nc, reply)
        if _no_stream(msg.headers):
            raise TransientError(f"request to {subject} failed: no responders")
        return msg

    async def _round(self, writes: Sequence[Write], prefix: str, timeout_s: float) -> list[Reply | BusError | None]:
        """Send ``writes``, await their replies (``timeout_s`` for all): the reply of each, ``None`` for
        none in time, or the error that kept it from being sent.

        The writes go out as one buffer of protocol frames (:func:`_send`) handed to the client once,
        not one ``nc.publish`` each; the replies are put in place as they arrive and the round is woken
        once, by the last one (one future per round, not per write); the deadline wakes it with every reply
        still missing left ``None`` (the pipeline's one timer, :meth:`_expire`, not one per round)."""
        nc = self._bus.nc
        loop = asyncio.get_running_loop()
        pending = self._pending
        # for nc.publish's path only (_send records the frames it hands to the buffer, the better witness): the
        # connection the frames go out on, the one up; while the client reconnects, the next one (the frames
        # wait in its buffer), which is the one counted already once the loss was told (_connection_lost)
        connection = 0 if _BUFFERED else self._lost if nc.is_connected or self._down else self._lost + 1
        size = len(writes)
        batch = _Round(size, loop.create_future(), connection)
        first = self._next
        self._next = first + size
        for i in range(size):
            pending[first + i] = (batch, i)
        deadline = loop.time() + timeout_s
        self._timed[batch] = deadline
        if self._expiry is None or deadline < self._expiry_at or self._expiry_loop is not loop:
            self._arm(loop, deadline)
        try:
            unsent = await _send(nc, writes, prefix, first, batch)
            for i, error in unsent.items():
                if pending.pop(first + i, None) is not None:
                    batch.put(i, error)
            if batch.left > 0:
                await batch.done
            return batch.replies
        finally:
            del self._timed[batch]
            if batch.left > 0:  # (every write whose token is gone was put in place: none is left then)
                for i in range(size):
                    pending.pop(first + i, None)

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        """(Re)arm the pipeline's one timer to fire at ``at`` (:meth:`_expire`)."""
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_at = at
        self._expiry_loop = loop
        self._expiry = loop.call_at(at, self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """The timer: wake every round whose deadline passed (its missing replies stay ``None``), then arm it
        again at the earliest deadline left, if a round still waits. (A timer may fire up to a tick of the
        loop's clock early, as ``call_later``'s did: a deadline within 1 ms counts as passed.)"""
        self._expiry = None
        now = loop.time() + 0.001
        earliest: float | None = None
        for batch, deadline in self._timed.items():  # (wake only sets a future: nothing leaves _timed meanwhile)
            if deadline <= now:
                batch.wake()
            elif earliest is None or deadline < earliest:
                earliest = deadline
        if earliest is not None:
            self._arm(loop, earliest)

    def _connection_lost(self, *, closed: bool = False) -> None:
        """The connection was lost (or closed): every write sent on it fails now with a :class:`TransientError`.

        Its acknowledgement can never come: the replies the server sent, or would have, went to the lost connection
        (core NATS keeps nothing for a subscriber that is away), and after the reconnect the reply subscription only
        gets the replies of writes sent since. Without this, such a write waited out its whole timeout (10 s by
        default) for nothing. The writes are not sent again here (see the module docstring).

        A write whose frames are still in the client's outbound buffer (``nc._pending``: handed over but not yet
        written to the socket, when the connection was lost or while the client reconnects) was never sent: nats-py
        writes that buffer on the next connection once it has renewed the subscriptions, so the write is stored
        and its ack comes to the renewed reply subscription. It keeps waiting (failing it would have the caller
        write it again, and a compare-and-set stored once already comes back as :class:`Conflict`). nats-py empties
        the buffer in the same step as it writes it to the socket, so a round's frames (:attr:`_Round.frames`,
        by identity) are either there, unsent, or went out on the connection now lost. ``closed``: there is no next
        connection, every write waiting fails. A round sent through ``nc.publish`` (no frames recorded) is judged by
        the connection it was counted on."""
        gone = self._lost
        self._lost += 1
        self._down = True
        nc = self._bus.nc
        # (``getattr``: this runs in nats-py's reconnect task, which an AttributeError from a future client would end)
        unsent = {id(frames) for frames in getattr(nc, "_pending", ())} if not closed and _BUFFERED else set()
        lost = [
            token
            for token, (batch, _) in self._pending.items()
            if closed or (id(batch.frames) not in unsent if batch.frames is not None else batch.connection <= gone)
        ]
        for token in lost:
            waiting = self._pending.pop(token, None)
            if waiting is not None:
                waiting[0].put(
                    waiting[1],
                    TransientError(
                        "no ack: the connection to NATS was lost after the write was sent "
                        "(it may or may not have been stored)"
                    ),
                )

    def _connection_back(self) -> None:
        """The client is connected again (its buffered frames are out): writes now go out on this connection."""
        self._down = False

    async def open(self) -> None:
        """Open the reply subscription now rather than at the first :meth:`send`: a caller whose batches must
        be on the socket within a few turns of the loop after it sends them (without awaiting them) calls
        this first."""
        await self._inbox()

    async def _inbox(self) -> str:
        if self._prefix is None:
            async with self._lock:
                if self._prefix is None:
                    nc = self._bus.nc
                    prefix = nc.new_inbox()
                    sub = await nc.subscribe(prefix + ".*", cb=self._on_reply)
                    self._prefix = prefix + "."
                    # the replies straight off the parser (one future resolved each), not nats-py's Msg queue,
                    # subscription task and callback per reply (the callback stays for a nats-py it does not fit)
                    _route(nc, sub._id, self._on_raw)
        return self._prefix

    async def _on_reply(self, msg: Msg) -> None:
        assert self._prefix is not None
        token = _token(msg.subject[len(self._prefix) :])
        waiting = None if token is None else self._pending.pop(token, None)
        if waiting is not None:
            waiting[0].put(waiting[1], msg)

    def _on_raw(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """:meth:`_on_reply` straight from the client's parser (:func:`~temporality_bus.routing._route`); the
        reply's header block (a status: ``503`` no responders) is parsed only if read."""
        prefix = self._prefix
        if prefix is None:
            return
        token = _token(subject[len(prefix) :])  # (the prefix is ASCII: as many bytes as characters)
        waiting = None if token is None else self._pending.pop(token, None)
        if waiting is not None:  # as read (a tuple): a write's ack is read from its bytes, a Msg made for a request
            waiting[0].put(waiting[1], (sid, subject, reply, data, headers))


class _Round:
    """The replies of one round's writes, in order (``None`` until one arrives), and the future that wakes
    the round: set by the last reply, or by the deadline (:meth:`wake`) with the missing ones left ``None``."""

    __slots__ = ("connection", "done", "frames", "left", "replies")

    def __init__(self, size: int, done: asyncio.Future[None], connection: int = 0) -> None:
        self.replies: list[Reply | BusError | None] = [None] * size
        self.left = size
        self.done = done
        #: The connection its frames went out on (:attr:`Pipeline._lost` then), for a round sent through
        #: ``nc.publish``: losing it fails the round's writes.
        self.connection = connection
        #: The bytes :func:`_send` handed to the client's outbound buffer (``None``: not handed over, or through
        #: ``nc.publish``): while this very object is in ``nc._pending`` the round is unsent.
        self.frames: bytes | None = None

    def put(self, i: int, reply: Reply | BusError) -> None:
        self.replies[i] = reply
        self.left -= 1
        if self.left == 0:
            self.wake()

    def wake(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


#: Whether this nats-py has the outbound buffer the frames are handed to (``_send_command``, pinned
#: ``nats-py>=2.16,<2.17``); without it every write goes out through ``nc.publish``, as before.
_BUFFERED = all(hasattr(NATS, name) for name in ("_send_command", "_flush_pending"))
_CONNECTED = NATS.CONNECTED
_HEADER_KEY = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # nats-py's header-name check
_KEYS_SEEN: set[str] = set()  # header names found valid as written (a handful: Nats-Msg-Id, Content-Type, ...)


def _header_block(headers: dict[str, str]) -> str:
    """The ``NATS/1.0`` header block of ``headers``, as nats-py's publish writes it (names checked,
    surrounding blanks stripped, CR/LF in a value turned into blanks, empty names skipped), as text."""
    # the usual case first: every name seen valid as written, no CR/LF in any value (each line then has one
    # CR and one LF: counted over the block at once, not looked for value by value)
    lines: list[str] = []
    for name, value in headers.items():
        if name not in _KEYS_SEEN:
            break
        lines.append(f"{name}: {value.strip()}\r\n")
    else:
        block = "".join(lines)
        if block.count("\n") == len(lines) and block.count("\r") == len(lines):
            return f"NATS/1.0\r\n{block}\r\n"
    lines = ["NATS/1.0\r\n"]
    for name, value in headers.items():
        if name in _KEYS_SEEN:  # a name seen valid as it is (no blanks around it): nothing to check
            key = name
        else:
            key = name.strip()
            if not key:
                continue
            if not _HEADER_KEY.fullmatch(key):
                raise nats.errors.BadHeaderError(key)
            if key == name and len(_KEYS_SEEN) < 1024:
                _KEYS_SEEN.add(key)
        text = value.strip()
        if "\r" in text or "\n" in text:
            text = text.replace("\r", " ").replace("\n", " ")
        lines.append(f"{key}: {text}\r\n")
    lines.append("\r\n")
    return "".join(lines)


def _frame(write: Write, prefix: str, token: int) -> bytes:
    """The protocol frame of ``write`` (``HPUB``, or ``PUB`` without headers) with ``prefix`` + ``token`` as its
    reply subject: the bytes ``nc.publish`` would put in its buffer (the control line and the header block encoded
    in one go)."""
    subject = write.subject
    if not subject or " " in subject or "\t" in subject or "\r" in subject or "\n" in subject:
        raise nats.errors.BadSubjectError  # (nats-py's check: whitespace or CR/LF would inject protocol)
    payload = write.payload
    if write.headers:
        head = _header_block(write.headers)
        if head.isascii():  # (as it nearly always is: its length in bytes is its length)
            size = len(head)
            return b"".join(
                (f"HPUB {subject} {prefix}{token} {size} {size + len(payload)}\r\n{head}".encode(), payload, b"\r\n")
            )
        block = head.encode()
        size = len(block)
        line = f"HPUB {subject} {prefix}{token} {size} {size + len(payload)}\r\n".encode()
        return b"".join((line, block, payload, b"\r\n"))
    return b"".join((f"PUB {subject} {prefix}{token} {len(payload)}\r\n".encode(), payload, b"\r\n"))


def _token(text: str | bytes) -> int | None:
    """The token of a reply subject's last part (its digits: :meth:`Pipeline._round` numbers its writes), or
    ``None`` for anything else."""
    if not (text.isdigit() and text.isascii()):
        return None
    return int(text)


async def _send(
    nc: NATS, writes: Sequence[Write], prefix: str, first: int, batch: _Round | None = None
) -> dict[int, BusError]:
    """Put every write into the client's outbound buffer at once (one flush); the writes that could not be
    sent, each with the error that kept it (the others are on their way). The bytes handed over are recorded
    as ``batch.frames`` (see :meth:`Pipeline._connection_lost`)."""
    unsent: dict[int, BusError] = {}
    if not _BUFFERED:
        for i, write in enumerate(writes):
            try:
                await nc.publish(write.subject, write.payload, reply=f"{prefix}{first + i}", headers=write.headers)
            except (nats.errors.Error, OSError) as exc:
                unsent[i] = _unsent(write, exc)
        return unsent
    connected = nc._status == _CONNECTED  # (as nc.is_connected, without its properties, in the usual case)
    if not connected:
        refused: nats.errors.Error | None = None
        if nc.is_closed:
            refused = nats.errors.ConnectionClosedError()
        elif nc.is_draining_pubs:
            refused = nats.errors.ConnectionDrainingError()
        if refused is not None:
            return {i: _unsent(write, refused) for i, write in enumerate(writes)}
        connected = nc.is_connected
    frames: list[bytes] = []
    sent_bytes = 0
    max_payload = nc.max_payload
    for i, write in enumerate(writes):
        if len(write.payload) > max_payload:  # a server with a smaller limit since the check
            unsent[i] = _unsent(write, nats.errors.MaxPayloadError())
            continue
        try:
            frames.append(_frame(write, prefix, first + i))
        except nats.errors.Error as exc:  # a subject or a header name nats-py would refuse
            unsent[i] = _unsent(write, exc)
            continue
        sent_bytes += len(write.payload)
    if not frames:
        return unsent
    data = frames[0] if len(frames) == 1 else b"".join(frames)
    if not connected and (nc._max_pending_size <= 0 or len(data) + nc._pending_data_size > nc._max_pending_size):
        # reconnecting, and the client's reconnect buffer is off or full (as nc.publish refuses then)
        full = nats.errors.OutboundBufferLimitError()
        return {i: unsent.get(i) or _unsent(write, full) for i, write in enumerate(writes)}
    if batch is not None:
        batch.frames = data
    try:
        # nc._send_command(data), without its coroutine: into the outbound buffer, flushed at once when full
        nc._pending.append(data)
        nc._pending_data_size += len(data)
        if nc._max_pending_size > 0 and nc._pending_data_size > nc._max_pending_size:
            await nc._flush_pending(force_flush=True)
        if nc._flush_queue is not None and nc._flush_queue.empty():
            await nc._flush_pending()
    except (nats.errors.Error, OSError) as exc:  # closed/reset connection meanwhile
        return {i: unsent.get(i) or _unsent(write, exc) for i, write in enumerate(writes)}
    nc.stats["out_msgs"] += len(frames)
    nc.stats["out_bytes"] += sent_bytes
    return unsent


def _unsent(write: Write, exc: BaseException) -> BusError:
    """The error of a write that was not sent because of ``exc``."""
    if isinstance(exc, nats.errors.MaxPayloadError):
        return _caused(PayloadTooLarge(len(write.payload)), exc)
    return _caused(TransientError(f"publish to {write.subject} failed: {exc!r}"), exc)


def _caused(error: BusError, cause: BaseException) -> BusError:
    """``error`` with ``cause`` as its ``__cause__`` (as ``raise error from cause`` would set it)."""
    error.__cause__ = cause
    return error


def _as_msg(nc: NATS, reply: Reply) -> Msg:
    """``reply`` as a ``Msg`` (a routed one's header block parsed only if read: :class:`_LazyHeadersMsg`)."""
    if isinstance(reply, Msg):
        return reply
    sid, subject, to, data, headers = reply
    return _LazyHeadersMsg(nc, sid, subject.decode(errors="replace"), to.decode(errors="replace"), data, headers)


def _headers_of(reply: Reply) -> dict[str, str] | None:
    """The headers of ``reply`` (a routed one's header block parsed here)."""
    if isinstance(reply, Msg):
        return reply.headers
    raw = reply[4]
    return None if raw is None else _parse_headers(raw)


def _no_stream(headers: dict[str, str] | None) -> bool:
    """Whether a reply's ``headers`` are the server's "no responders": no stream took the write, nothing was stored."""
    return headers is not None and headers.get("Status") == _NO_RESPONDERS


def _no_stream_took(
    outcomes: Sequence[PublishResult | BusError], replies: Sequence[Reply | BusError | None], at: Sequence[int]
) -> list[int]:
    """The places (``at``, one per outcome) of the writes whose reply says no stream took them (each read
    as a :class:`TransientError` by :func:`_outcome`: a ``503`` status wins over any body)."""
    return [
        i
        for i, outcome, reply in zip(at, outcomes, replies, strict=True)
        if isinstance(outcome, TransientError)
        and reply is not None
        and not isinstance(reply, BusError)
        and _no_stream(_headers_of(reply))
    ]


#: ``PublishResult.model_validate_json`` without its Python wrapper (the same validator, the same result): ~7,200
#: instructions an ack instead of ~10,300.
_read_ack = PublishResult.__pydantic_validator__.validate_json


def _outcome(write: Write, reply: Reply | BusError | None, timeout_s: float) -> PublishResult | BusError:
    """The acknowledgement of ``write`` read: its result, or the error it stands for."""
    if isinstance(reply, BusError):
        return reply
    if reply is None:
        return TransientError(f"publish to {write.subject} failed: no ack within {timeout_s:g} s")
    block: bytes | None = None
    if isinstance(reply, Msg):
        data = reply.data
        headers = reply.headers
    else:  # routed (a tuple): the header block is parsed only if there is one (an ack has none)
        data = reply[3]
        block = reply[4]
        headers = None
    # the hot path: a plain ack (a JSON body, no headers), read straight into its result by pydantic-core
    if headers is None and block is None and data and b'"error"' not in data:
        try:
            result: PublishResult = _read_ack(data)
            return result
        except ValidationError:
            pass  # not an ack at all: said so below
    if block is not None:
        headers = _parse_headers(block)
    status = headers.get("Status") if headers else None
    if status is not None:  # a status is never an ack, whatever its body (nats-server sends none with one)
        if status == _NO_RESPONDERS:
            return TransientError(f"publish to {write.subject} failed: no stream took it (no responders)")
        description = headers.get("Description", "") if headers else ""
        return TransientError(f"publish to {write.subject} failed: status {status} {description}".rstrip())
    try:
        response = from_json(data)
        error = response.get("error")
        if error is not None:
            if error.get("err_code") == _WRONG_LAST_SEQUENCE and write.bucket is not None and write.key is not None:
                return Conflict(write.bucket, write.key, write.revision)
            return TransientError(f"publish to {write.subject} failed: refused: {error.get('description', error)!r}")
        return PublishResult(stream=response["stream"], seq=response["seq"], duplicate=bool(response.get("duplicate")))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return TransientError(f"publish to {write.subject} failed: unreadable ack: {exc!r}")
