"""The durable pull-consumer runner: ack after commit, nak with backoff, dead-letter poison.

=====================================  =================================================
handler outcome                        what the runner does
=====================================  =================================================
returns                                ``ack`` (the handler committed its side effects)
PermanentError / ProtocolError /       ``term`` + copy to ``temporality.dlq.<consumer>``
pydantic ValidationError               + journal ``bus.dead_lettered``
not called: the event is forged        the same, without ``on_dead_letter`` (see below)
any other exception                    ``nak(delay=backoff[n])``; on the last allowed
                                       delivery (``max_deliver``) it is dead-lettered too
=====================================  =================================================

*Forged events* (SEC-1, AP-11): before the handler, each envelope's claimed sender (its ``source``, a
``service:`` actor) is checked against the catalogue's senders of its type, as the Bus's settings say
(``source_check``, :mod:`temporality_bus.provenance`). A forged one is dead-lettered and journaled like a
poison message, but neither the handler nor ``on_dead_letter`` ever sees it: a forger must not be able to
make a service act (the run-executor's hook would fail the run a forged answer names).

With tracing on, each envelope is handled in a CONSUMER span, the child of the trace context it carries
(:mod:`temporality_bus.tracing`); raw messages and batches are not.

Acks are sent once the handler has returned (fire-and-forget ``ack``: a lost ack only means one
more, idempotent, delivery). While handlers run, one heartbeat loop per consumer sends
``in_progress`` for every message in hand every ``ack_wait / 3``, so a long turn does not trigger
redelivery; a process killed mid-handler leaves the message un-acked and JetStream redelivers it
after ``ack_wait``: handlers are idempotent.

:attr:`Consumer.running` is set once the durable consumer exists and the pull subscription is
bound (a service reports ready after it), and cleared when :meth:`Consumer.run` returns.

The server-side consumer has no delivery limit; the runner alone enforces ``max_deliver``. A
delivery past the limit (its predecessor never settled: it crashed its process, or its
dead-lettering failed) is dead-lettered without running the handler again, and a dead-lettering
that fails is nak'ed and tried again: a message is never dropped.

``on_dead_letter`` (optional) is the service's last word on a message it gives up on, whichever way
it is given up (a permanent error, deliveries used up, a delivery past the limit that never ran the
handler): it is awaited *before* the message is copied to the DLQ, with the decoded envelope (or the
raw bytes: a raw consumer, an envelope that does not decode), the delivery and the error. It must be
idempotent: when it raises, the dead-lettering counts as failed and is retried like any failed
dead-lettering (nak, the next delivery is past the limit, the hook runs again), so the message is
never dropped and the hook's effect is never skipped. Only a :class:`PermanentError` from the hook
(it can never succeed for this message) is logged and the message dead-lettered without it.

**Batch mode** (``batch_handler`` with ``batch_size``, next to the per-message ``handler``): the
runner fetches up to ``batch_size`` messages, decodes and version-checks each (a message that does
not decode, or one past the delivery limit, goes through the per-message path and is dead-lettered
alone), hands the others to ``batch_handler`` in stream order, and acks them all once it returned
(its side effects are committed). When ``batch_handler`` raises -- whatever the error -- the runner
falls back to the per-message path for each message of the batch, one after another: ``handler``
then settles each of them as above (ack, nak with backoff, dead-letter), so one poison message never
blocks or dead-letters its neighbours. ``batch_handler`` must therefore be all-or-nothing and
idempotent, like ``handler``.

*Prefetch*: while ``batch_handler`` runs (commits) one batch, the runner already fetches and decodes
the next one, so the fetch, the client's parsing and the decoding overlap the database's commit. At
most one batch is in hand besides the one being handled (and together never more than the durable's
``max_ack_pending``); the heartbeat keeps every message in hand alive, the prefetched ones included. A batch is
at most half the durable's ``max_ack_pending`` (``batch_size`` is bounded to it at start, logged as
``consumer.batch_bounded``), so the prefetch always has room for a whole batch and no pull asks for more than the
server may hand out (such a pull was never filled and waited out its fetch timeout every time).
Batches are handed over one at a time, in the order they were fetched (stream order). A stop lets the
runner finish the batch being handled and the one prefetched (it fetches no more); a cancellation
abandons the batch being handled un-acked (JetStream redelivers it after ``ack_wait``) and releases the
prefetched one (never handed to the handler: nak'ed with the pull buffer, below). So after a cancellation
(or a crash, or a batch handed back by a nak) stream order holds no more across the durable: another replica,
or the next start, may handle the prefetched batch and later messages at once, before the abandoned batch
comes back (after ``ack_wait``). The prefetched batch is nak'ed all the same rather than left to ``ack_wait``
with the abandoned one: waiting would not restore the order (the durable hands later messages to other
replicas meanwhile), only delay those messages too. A batch handler must not rely on the batches of a
durable arriving in stream order across a restart; each delivery's ``stream_seq`` says where it stands.

*Stopping* (both paths, stop or cancellation): what was fetched but never handed out -- a message that came
after its fetch gave up (:class:`_Puller`), still in the pull buffer; on a cancellation, the prefetched batch
and what a lingering fetch (``batch_linger_s``) held, both put back at the front of that buffer -- is nak'ed
without delay once the pull subscription is gone (nak'ed before, it could be handed straight back to a pull
request still open on that subscription), so the server hands it at once to another replica sharing the
durable (or to the next start) instead of after ``ack_wait`` (30 s by default). A nak counts as a delivery toward ``max_deliver``,
as an ``ack_wait`` expiry does. A message still on its way when the subscription ends is never seen, and
comes back after ``ack_wait``.

*Reading*: both paths' pull requests have an inbox subscription of their own (:class:`_Puller`), whose
messages nats-py's parser hands straight to it (:func:`_route`, when this nats-py is the one it was written
for): no header parsed, no ``Msg`` queued, no subscription task woken per message; a message's header
block is parsed only if something reads ``headers`` (a dead letter copies them), the same as nats-py's.
One request per fetch: an idle consumer asks once per ``fetch_timeout_s``. (The per-message path used nats-py's
``PullSubscription.fetch`` until 2026-12-05: for more than one message it sent a ``no_wait`` probe and then a
lingering request, two requests and two end statuses per idle second, and a late ``408`` of one fetch could
make the next one wait for a full batch.)

*Acks*: each message of a committed batch gets its own ``ack``, all of them written to the connection in
one write after the handler returned (the frames ``Msg.ack`` would buffer one publish at a time, joined),
none awaited for a reply (no round trip per message). Not one
cumulative ack (``AckPolicy.ALL``): that acks *everything* up to a sequence on the durable, so it would
also ack a message of an earlier batch nak'ed for a retry by the fallback, and messages another
replica sharing the durable holds and has not committed; and NATS refuses to change the ack policy of
an existing durable, so deployed durables would need to be re-created. Explicit acks can never settle
a message whose handling failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from opentelemetry.trace import StatusCode
from pydantic import ValidationError

from temporality_bus import tracing
from temporality_bus.connection import Bus
from temporality_bus.errors import PermanentError, TransientError
from temporality_bus.pipeline import _BUFFERED
from temporality_bus.provenance import ForgedEvent, forgery
from temporality_bus.routing import _ROUTABLE as _ROUTABLE  # (the batch tests read it here)
from temporality_bus.routing import _LazyHeadersMsg, _route, _status_of, _unroute
from temporality_protocol import BusDeadLettered, Envelope, ProtocolError, decode, derive_id, make_event
from temporality_protocol.catalog import DLQ_PREFIX, ConsumerSpec
from temporality_protocol.errors import InvalidEnvelope
from temporality_protocol.version import SUPPORTED_VERSIONS, negotiate

__all__ = [
    "BatchHandler",
    "Consumer",
    "ConsumerObserver",
    "DeadLetterHook",
    "Delivery",
    "EnvelopeHandler",
    "Outcome",
    "RawHandler",
    "claimed_id_and_type",
]

log = structlog.get_logger(__name__)

#: Tokens of a JetStream ack subject: ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>``,
#: or with ``<domain>.<account hash>`` after ``ACK`` and a random token at the end (which may be missing).
_V1_ACK_TOKENS = 9
_V2_ACK_TOKENS = 12


class Delivery:
    """What a handler sees besides the event: delivery count and the raw message.

    Both numbers are read straight off the JetStream ack subject (``$JS.ACK.<stream>.<consumer>.<delivered>.
    <stream seq>.…``, or the longer form with a domain and an account hash); any other reply goes through
    nats-py's full metadata parser (which raises for a message that is not a JetStream one).
    """

    __slots__ = ("msg", "num_delivered", "stream_seq")

    def __init__(self, msg: Msg) -> None:
        self.msg = msg
        tokens = msg.reply.split(".") if msg.reply else []
        if (
            len(tokens) in (_V1_ACK_TOKENS, _V2_ACK_TOKENS - 1, _V2_ACK_TOKENS)
            and tokens[0] == "$JS"
            and tokens[1] == "ACK"
        ):
            at = 4 if len(tokens) == _V1_ACK_TOKENS else 6
            delivered, seq = tokens[at], tokens[at + 1]
            if delivered.isdigit() and seq.isdigit():
                self.num_delivered: int = int(delivered) or 1
                self.stream_seq: int = int(seq)
                return
        md = msg.metadata
        self.num_delivered = md.num_delivered or 1
        self.stream_seq = md.sequence.stream if md.sequence else 0

    @property
    def subject(self) -> str:
        return str(self.msg.subject)


EnvelopeHandler = Callable[[Envelope, Delivery], Awaitable[None]]
RawHandler = Callable[[bytes, Delivery], Awaitable[None]]
#: Gets a batch of decoded envelopes in stream order; all-or-nothing (see the module docstring).
BatchHandler = Callable[[list[tuple[Envelope, Delivery]]], Awaitable[None]]
#: Called with what is being dead-lettered (the envelope, or the bytes when there is none), the delivery
#: and the reason, before the message goes to the DLQ; see the module docstring.
DeadLetterHook = Callable[[Envelope | bytes, Delivery, BaseException], Awaitable[None]]

#: How a message left the runner's hands: ``acked`` (handled), ``retried`` (nak with backoff),
#: ``dead_lettered`` (copied to the DLQ and terminated).
Outcome = Literal["acked", "retried", "dead_lettered"]


class ConsumerObserver(Protocol):
    """Told of every settled message (the service runtime counts them for ``/metrics``); must not raise."""

    def settled(self, durable: str, outcome: Outcome, seconds: float, count: int = 1) -> None: ...


@dataclass(frozen=True)
class _Fetched:
    """One fetched batch, decoded: every message (in hand), those for the per-message path, the batch."""

    msgs: list[Msg]
    alone: list[Msg]
    batch: list[tuple[Envelope, Delivery]]


#: How many distinct ``(type, source, actor)`` the runner remembers as checked (then it starts over).
_SENDERS_KEPT = 4096
#: The longest ``(type, source, actor)`` remembered, in characters all told: a longer one (a ``source`` may be as
#: long as a message) is checked every time, so the remembered keys never hold more than 4,096 x 256 characters.
_SENDER_KEPT_CHARS = 256
#: The protocol versions an envelope may carry, spelt as we write them: any other spelling (``"1.00"``), or
#: version, is negotiated each time it comes -- nothing is remembered of what a publisher chose to write.
_READABLE = frozenset(SUPPORTED_VERSIONS)
#: A JSON ``\u`` escape other than of a control character (``\u0000``-``\u001f``, the only ones our encoder
#: writes): it could spell a key (``"data\u005fbase64"``) that the one-pass decode does not see.
_ESCAPE = re.compile(rb"\\u(?!00[01])")
#: What the server says when a pull request ends short of its batch: nothing (more) available, or it expired.
_PULL_ENDED = frozenset({"404", "408"})
#: The server's own expiry of a lingering pull request comes this long before the runner gives up waiting.
_PULL_MARGIN_S = 0.05
#: The pause after a pull request the server ended at once with nothing (:meth:`Consumer._pull`).
_EMPTY_END_PAUSE_S = 0.1


class _Puller:
    """The batch path's pull requests, on one inbox subscription of its own (core NATS, a callback).

    nats-py's ``PullSubscription.fetch`` takes each message off its queue with an ``asyncio.wait_for`` in a
    new task (plus a uuid4), which cost more than the rest of the bus side per message. Here each fetch is one
    request ``{"batch": n, "expires": t, "no_wait": true}`` to ``$JS.API.CONSUMER.MSG.NEXT.<stream>.<durable>``
    (``$JS.<domain>.API...`` in a JetStream domain) with its own reply token: the server sends what is available at once (up to ``n``), or, when nothing
    is, waits for the first message(s), then ends the request with a ``404``/``408`` status on that token.
    The callback appends each message to a list and wakes the fetch once (batch full, or its request
    ended): one wait per fetch, not per message. A message that comes after its fetch gave up (the
    connection stalled) is kept for the next fetch (nak'ed by :meth:`stop` if none comes); a status of an
    older request is ignored.
    """

    def __init__(self, bus: Bus, spec: ConsumerSpec) -> None:
        self._nc = bus.nc
        self._subject = f"{bus.settings.js_api_prefix}.CONSUMER.MSG.NEXT.{spec.stream}.{spec.durable}"
        self._prefix = ""
        self._sub: Subscription | None = None
        self._routed = False
        self._buffer: list[Msg] = []
        self._tokens = itertools.count(1)
        self._token = ""  # the reply subject of the request being waited on
        self._wanted = 0
        self._woken: asyncio.Future[str | None] | None = None

    async def start(self) -> None:
        inbox = self._nc.new_inbox()
        self._prefix = f"{inbox}."
        self._sub = await self._nc.subscribe(f"{inbox}.*", cb=self._on_msg)
        self._routed = _route(self._nc, self._sub._id, self._on_raw)

    async def stop(self) -> int:
        """Unsubscribe, then nak (no delay) every message fetched but never handed out (one that came after its
        fetch gave up, :meth:`fetch`): the server redelivers it at once, to another replica sharing the durable
        or to the next start, instead of after ``ack_wait``. How many were nak'ed (best effort: a nak the
        connection cannot send leaves that message to ``ack_wait``)."""
        if self._sub is not None:
            if self._routed:
                _unroute(self._nc, self._sub._id)
                self._routed = False
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        left, self._buffer = self._buffer, []
        return await _nak_all(left)

    def give_back(self, msgs: list[Msg]) -> None:
        """Put ``msgs`` (fetched, never handed to a handler) back at the front of the buffer, in their order: the
        next fetch takes them first, or :meth:`stop` naks them once the subscription is gone (a nak sent before
        then could be answered to a pull request still open on it, and the message taken back)."""
        self._buffer[:0] = msgs

    async def _on_msg(self, msg: Msg) -> None:
        if not msg.reply:  # a status (no ack subject): it ends the request it answers
            self._ended(msg.subject, msg.headers.get("Status") if msg.headers else None)
            return
        self._take(msg)

    def _on_raw(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """:meth:`_on_msg` straight from the client's parser (:func:`_route`): the same, minus nats-py's
        header parsing, message queue and callback task; a message's headers are parsed if ever read."""
        if not reply:
            self._ended(subject.decode(), _status_of(headers))
            return
        # (_take, without a call per message)
        buffer = self._buffer
        buffer.append(_LazyHeadersMsg(self._nc, sid, subject.decode(), reply.decode(), data, headers))
        woken = self._woken
        if woken is not None and len(buffer) >= self._wanted and not woken.done():
            woken.set_result(None)

    def _ended(self, subject: str, status: str | None) -> None:
        if subject == self._token and self._woken is not None and not self._woken.done():
            self._woken.set_result(status)

    def _take(self, msg: Msg) -> None:
        self._buffer.append(msg)
        if len(self._buffer) >= self._wanted and self._woken is not None and not self._woken.done():
            self._woken.set_result(None)

    async def fetch(self, batch: int, timeout_s: float, *, wait: bool = True) -> tuple[list[Msg], str | None]:
        """Up to ``batch`` messages (none when nothing came within ``timeout_s``), and the status that ended
        the request when it is not a plain end (``404``/``408``): e.g. ``409`` or ``503`` (no such consumer).
        ``wait=False``: only what the server has now (the request ends at once when it has nothing)."""
        status: str | None = None
        if len(self._buffer) < batch:
            token = f"{self._prefix}{next(self._tokens)}"
            request: dict[str, object] = {"batch": batch - len(self._buffer), "no_wait": True}
            if wait and not self._buffer:  # nothing in hand: wait on the server for the first message(s)
                request["expires"] = max(int((timeout_s - _PULL_MARGIN_S) * 1e9), 1_000_000)
            woken: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
            self._token, self._wanted, self._woken = token, batch, woken
            try:
                await self._nc.publish(self._subject, json.dumps(request).encode(), reply=token)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout_s + _PULL_MARGIN_S):
                        status = await woken
            finally:
                self._token, self._wanted, self._woken = "", 0, None
        msgs, self._buffer = self._buffer[:batch], self._buffer[batch:]
        return msgs, (None if status is None or status in _PULL_ENDED else status)


def claimed_id_and_type(data: bytes) -> tuple[str | None, str | None]:
    """The ``id`` and ``type`` a message that is not a valid CloudEvent says it has (JSON object, string values,
    cut to 200 characters), so its dead letter names what the sender meant to send; ``None`` for what it lacks."""
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(body, dict):
        return None, None
    claimed_id, claimed_type = body.get("id"), body.get("type")
    return (
        claimed_id[:200] if isinstance(claimed_id, str) else None,
        claimed_type[:200] if isinstance(claimed_type, str) else None,
    )


async def _ack_all(nc: NATS, msgs: list[Msg]) -> None:
    """Ack each of ``msgs`` (fire-and-forget, as ``Msg.ack``) in one write to the connection.

    The frames are those ``Msg.ack`` puts in nats-py's buffer one publish at a time (``PUB <ack subject> 0``:
    an empty message to the message's reply subject), joined and handed over at once, as
    :class:`temporality_bus.Pipeline` writes its publishes (~0.3 µs per ack instead of ~5 µs through
    ``nc.publish``). Through ``Msg.ack`` one by one when nats-py lacks the buffered write or the connection
    is not up (its publish then buffers for the reconnect or refuses, as for any publish).
    """
    if not _BUFFERED or not nc.is_connected:
        for msg in msgs:
            await msg.ack()
        return
    await nc._send_command(b"".join([b"PUB %s 0\r\n\r\n" % msg.reply.encode() for msg in msgs]))
    if nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()
    for msg in msgs:
        msg._ackd = True  # as Msg.ack leaves it: a second settle of the same delivery is refused
    nc.stats["out_msgs"] += len(msgs)


async def _ack(msg: Msg) -> None:
    """``msg.ack()`` (refused the same way for a message without a reply subject or settled already), its frame
    handed to the client's buffer directly as :func:`_ack_all` does, not through ``nc.publish`` and its checks
    (~1 µs instead of ~5). Through ``msg.ack()`` when nats-py lacks the buffered write or the connection is not
    up (or is draining: its publish then buffers for the reconnect, or refuses, as for any publish)."""
    nc = msg._client
    if not _BUFFERED or not nc.is_connected or nc.is_draining_pubs:
        await msg.ack()
        return
    msg._check_reply()
    await nc._send_command(b"PUB %s 0\r\n\r\n" % msg.reply.encode())
    if nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()
    msg._ackd = True
    nc.stats["out_msgs"] += 1


def _log_vars(*names: str) -> tuple[contextvars.ContextVar[Any], ...]:
    """structlog's context variables for the log keys ``names`` (as ``bind_contextvars`` makes and keeps them;
    left unbound): setting one binds its key for every log line of the context, its token's reset puts back
    what was there before (the value, or unbound), as ``bound_contextvars`` does on its way out -- which, with
    its scan of every context variable, its key prefixing and lookups, cost ~8 µs a message for three keys, not
    ~1. A token must be reset in the context it was set in (the same task)."""
    tokens = structlog.contextvars.bind_contextvars(**dict.fromkeys(names, ...))  # (Ellipsis: unbound)
    structlog.contextvars.reset_contextvars(**tokens)
    return tuple(token.var for token in tokens.values())


_CONSUMER, _STREAM_SEQ, _DELIVERY = _log_vars("consumer", "stream_seq", "delivery")
_CE_ID, _CE_TYPE, _RUN_ID = _log_vars("ce_id", "ce_type", "run_id")


async def _nak_all(msgs: list[Msg]) -> int:
    """Nak each of ``msgs`` without delay (they were never handled: the server hands them out again at once);
    how many naks were sent. Best effort: one the connection refuses leaves its message to ``ack_wait``."""
    sent = 0
    for msg in msgs:
        try:
            await msg.nak()
        except Exception as exc:  # closed or reconnecting with a full buffer: redelivered after ack_wait
            log.debug("consumer.nak_failed", error=repr(exc))
            continue
        sent += 1
    return sent


def _decode(raw: bytes) -> Envelope:
    """:func:`temporality_protocol.decode`, in one pass when the bytes are an ordinary envelope.

    ``Envelope.model_validate_json`` (its validator itself, :data:`_validate_envelope`) reads and validates in
    one go (about 3x cheaper than ``from_json`` then ``model_validate``); what it cannot tell apart is sent to ``decode`` itself, which gives the same
    envelope or the exact error: bytes that mention ``data_base64``, ``NaN`` or ``Infinity`` anywhere, bytes
    with a ``\\u`` escape that could spell a key (:data:`_ESCAPE`: ``"data\\u005fbase64"`` is ``data_base64``,
    which the model would ignore), an envelope without an explicit ``specversion`` ``1.0`` or
    ``protocolversion``, anything that fails.
    """
    # (one byte looked for first, memchr-fast: most events hold no capital N / I at all, and the substring
    # searches cost ~0.3 µs each on a ~500-byte event)
    if (
        b"data_base64" not in raw
        and (b"N" not in raw or b"NaN" not in raw)
        and (b"I" not in raw or b"Infinity" not in raw)
        and (b"\\" not in raw or b"\\u" not in raw or _ESCAPE.search(raw) is None)  # (a backslash first, as above)
    ):
        try:
            event: Envelope = _validate_envelope(raw)
        except ValueError:
            return decode(raw)
        fields = event.__pydantic_fields_set__
        if "specversion" in fields and "protocolversion" in fields and event.specversion == "1.0":
            return event
    return decode(raw)


#: ``Envelope.model_validate_json`` without its Python wrapper (the same validator, the same envelope or error).
_validate_envelope = Envelope.__pydantic_validator__.validate_json


def _negotiate(version: str) -> None:
    """Refuse an envelope's ``protocolversion`` we cannot read (PRO-3), as a :class:`ProtocolError` either way:
    no common version, or not a version at all (``"x"``: :func:`negotiate` raises a plain ``ValueError``), so the
    message is dead-lettered as poison. Called for a version not spelt as in :data:`_READABLE` (``"1.00"`` is
    read as ``1.0``)."""
    try:
        negotiate(SUPPORTED_VERSIONS, [version])
    except ValueError as exc:  # (a ProtocolError is not a ValueError: it goes through as it is)
        raise InvalidEnvelope(f"protocolversion {version[:64]!r} is not a MAJOR.MINOR version") from exc


def _batch_within(batch_size: int, max_ack_pending: int) -> int:
    """The batch size the batch loop uses: ``batch_size``, at most half of the durable's ``max_ack_pending`` (and
    at least 1). The server hands one consumer no more than ``max_ack_pending`` messages un-acked: a larger batch
    would leave no room for the prefetch (the next batch fetched only after the current one is acked), and a pull
    larger than the room is never filled and waits out its whole fetch timeout (measured: batches of 1,024 against
    1,000 ingested under 900 events/s; pulls of 2,000 "stalled" the same way)."""
    return max(1, min(batch_size, max_ack_pending // 2))


def _remember(senders: set[tuple[str, str, str | None]], sender: tuple[str, str, str | None]) -> None:
    """Keep ``sender`` among those found not forged, unless it is long (:data:`_SENDER_KEPT_CHARS`)."""
    if len(sender[0]) + len(sender[1]) + len(sender[2] or "") > _SENDER_KEPT_CHARS:
        return  # checked again next time: remembering it could pin up to a message's size per entry
    if len(senders) >= _SENDERS_KEPT:
        senders.clear()
    senders.add(sender)


class Consumer:
    """Runs one durable pull consumer (``spec``) until ``stop`` is set.

    ``handler`` gets decoded envelopes (version-checked, PRO-3); ``raw_handler`` gets bytes (timers).
    ``max_inflight`` messages are handled concurrently. ``on_dead_letter`` runs before each message
    is dead-lettered (idempotent; its failure retries the dead-lettering). ``batch_handler`` (with
    ``handler`` as its per-message fallback) takes up to ``batch_size`` messages at a time, fetching
    the next batch while it handles one (``max_inflight`` does not apply); ``batch_linger_s``: a fetch short of
    ``batch_size`` waits that long once for more (see :meth:`_pull`).
    """

    def __init__(
        self,
        bus: Bus,
        spec: ConsumerSpec,
        *,
        handler: EnvelopeHandler | None = None,
        raw_handler: RawHandler | None = None,
        max_inflight: int = 1,
        fetch_timeout_s: float = 1.0,
        ack_wait_s: float | None = None,
        on_dead_letter: DeadLetterHook | None = None,
        batch_handler: BatchHandler | None = None,
        batch_size: int = 100,
        batch_linger_s: float = 0.0,
        observer: ConsumerObserver | None = None,
    ) -> None:
        if (handler is None) == (raw_handler is None):
            raise ValueError("give exactly one of handler / raw_handler")
        if batch_handler is not None and handler is None:
            raise ValueError("batch_handler needs handler: the per-message path it falls back to")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, not {batch_size}")
        if batch_linger_s < 0:
            raise ValueError(f"batch_linger_s must not be negative, not {batch_linger_s}")
        self._linger_s = batch_linger_s
        self._batch_handler = batch_handler
        self._batch_size = batch_size
        self.bus = bus
        self.spec = spec
        self._handler = handler
        self._raw_handler = raw_handler
        self._on_dead_letter = on_dead_letter
        self._observer = observer
        self._max_inflight = max_inflight
        self._fetch_timeout = fetch_timeout_s
        self._ack_wait = ack_wait_s or bus.settings.ack_wait_s
        self._log = log.bind(consumer=spec.durable)
        #: Set while the durable consumer exists and its pull subscription is bound.
        self.running = asyncio.Event()
        #: Messages being handled (or dead-lettered), by reply subject (unique per delivery; ``Msg`` is
        #: unhashable): the heartbeat keeps each of them alive.
        self._in_hand: dict[str, Msg] = {}
        #: Short ``(type, source, actor)`` both paths found not forged (:func:`forgery` is a pure function of them).
        self._senders: set[tuple[str, str, str | None]] = set()
        self._source_check = bus.settings.source_check
        #: The pull requests' reader of the current (or last) :meth:`run`.
        self._puller: _Puller | None = None

    @property
    def lag_matters(self) -> bool:
        """Whether the durable's pending count is a lag (the ``/metrics`` gauge, the lag alert): always, but for a
        consumer that pulls only on demand and is not wanted now, whose pending events nobody needs."""
        return True

    @property
    def heartbeat_interval_s(self) -> float:
        return max(self._ack_wait / 3, 0.2)

    async def run(self, stop: asyncio.Event) -> None:
        await self.bus.ensure_consumer(self.spec, ack_wait_s=self._ack_wait)
        puller = self._puller = _Puller(self.bus, self.spec)
        await puller.start()
        inflight: set[asyncio.Task[None]] = set()
        heartbeat = asyncio.create_task(self._heartbeat(), name=f"heartbeat:{self.spec.durable}")
        self.running.set()
        self._log.info("consumer.started", filter=list(self.spec.filter_subjects))
        try:
            while not stop.is_set():
                if self._batch_handler is not None:
                    await self._run_batches(puller, stop)
                    break
                free = self._max_inflight - len(inflight)
                if free <= 0:
                    await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                    continue
                for msg in await self._pull(puller, free):
                    task = asyncio.create_task(self._process(msg))
                    inflight.add(task)
                    task.add_done_callback(inflight.discard)
        finally:
            self.running.clear()
            try:
                if inflight:
                    await asyncio.gather(*inflight, return_exceptions=True)
            finally:
                heartbeat.cancel()
                await asyncio.wait([heartbeat])
                released = await puller.stop()
                self._log.info("consumer.stopped", released=released)

    async def _pull(self, puller: _Puller, batch: int) -> list[Msg]:
        """Up to ``batch`` messages from the puller (none when nothing came within the fetch timeout); a failed
        request is logged and followed by half a second's pause.

        With a linger (``batch_linger_s``), a fetch that got fewer than ``batch`` waits that long once and takes
        what came meanwhile: at a steady trickle the batch handler's per-batch cost (a transaction, a commit)
        is then shared by the events of the linger instead of paid by each one."""
        loop = asyncio.get_running_loop()
        asked_at = loop.time()
        try:
            msgs, status = await puller.fetch(batch, self._fetch_timeout)
        except nats.errors.Error as exc:  # disconnected: nats-py reconnects, we try again
            self._log.warning("consumer.fetch_failed", error=repr(exc))
            await asyncio.sleep(0.5)
            return []
        if not msgs and status is None and loop.time() - asked_at < self._fetch_timeout / 2:
            # The server ended the request at once with nothing for us: "408 Requests Pending", when another
            # replica's request waits on the few messages the durable may still hand out (its max_ack_pending
            # nearly full). Asking again at once would spin (thousands of requests a second, per replica).
            await asyncio.sleep(min(_EMPTY_END_PAUSE_S, self._fetch_timeout))
            return []
        if msgs and len(msgs) < batch and self._linger_s > 0 and status is None and self._batch_handler is not None:
            for msg in msgs:  # in hand while lingering: the heartbeat keeps them from being redelivered
                self._in_hand[msg.reply] = msg
            try:
                await asyncio.sleep(self._linger_s)  # the linger itself, not a wait for a condition
                more, status = await puller.fetch(batch - len(msgs), self._fetch_timeout, wait=False)
                msgs += more
            except nats.errors.Error as exc:  # what came first is handled; the rest comes with the next fetch
                self._log.warning("consumer.fetch_failed", error=repr(exc))
            except asyncio.CancelledError:  # stopping: back to the pull buffer (ahead of any that came since),
                for msg in msgs:  # where Puller.stop naks them; not in hand any more
                    self._in_hand.pop(msg.reply, None)
                puller.give_back(msgs)
                raise
        if status is not None:  # e.g. 503: no such consumer (deleted); 409: the server refused the request
            self._log.warning("consumer.fetch_failed", status=status)
            if not msgs:
                await asyncio.sleep(0.5)
        return msgs

    async def _run_batches(self, puller: _Puller, stop: asyncio.Event) -> None:
        """The batch loop: handle one batch while the next is fetched and decoded, until ``stop``.

        The prefetch asks for at most ``max_ack_pending`` minus what is in hand, so the server can
        always fill it; with no room left the next fetch simply waits for the current batch. A batch is at most
        half the durable's ``max_ack_pending`` (:func:`_batch_within`), so one batch always fits besides the one
        being handled.
        """
        limit = await self._max_ack_pending()
        size = _batch_within(self._batch_size, limit)
        if size < self._batch_size:
            self._log.info(
                "consumer.batch_bounded", batch_size=self._batch_size, bounded_to=size, max_ack_pending=limit
            )
        prefetch: asyncio.Task[_Fetched] | None = None
        try:
            current = _Fetched([], [], [])
            while True:
                if not current.msgs:
                    if stop.is_set():
                        return
                    current = await self._fetch_batch(puller, size)
                    continue
                room = min(size, limit - len(self._in_hand))
                if not stop.is_set() and room > 0:
                    prefetch = asyncio.create_task(
                        self._fetch_batch(puller, room), name=f"prefetch:{self.spec.durable}"
                    )
                await self._process_batch(current)
                current = _Fetched([], [], [])
                if prefetch is not None:
                    current, prefetch = await prefetch, None
        finally:
            if prefetch is not None:  # cancelled mid-batch: the prefetched batch is never handled
                prefetch.cancel()
                await asyncio.wait([prefetch])
                if not prefetch.cancelled() and prefetch.exception() is None:
                    msgs = prefetch.result().msgs
                    for msg in msgs:
                        self._in_hand.pop(msg.reply, None)
                    # back to the pull buffer (a prefetch cut short left its there already): Puller.stop naks
                    # them once it unsubscribed, so no pull request still open takes them back
                    puller.give_back(msgs)

    async def _max_ack_pending(self) -> int:
        """The durable's ``max_ack_pending`` (how many messages the server lets one hold un-acked)."""
        try:
            info = await self.bus.js.consumer_info(self.spec.stream, self.spec.durable)
        except Exception as exc:  # the bound is an optimisation: without it, one batch besides the current
            self._log.warning("consumer.info_failed", error=repr(exc))
            return 2 * self._batch_size
        pending = info.config.max_ack_pending
        return pending if pending is not None and pending > 0 else 2 * self._batch_size

    async def _fetch_batch(self, puller: _Puller, size: int) -> _Fetched:
        """Fetch up to ``size`` messages, put them in hand (the heartbeat covers them) and decode them.

        A message past the delivery limit, or one that does not decode, is set aside for the
        per-message path (which dead-letters it alone); the others make the batch, in stream order.
        """
        msgs = await self._pull(puller, size)
        in_hand = self._in_hand
        for msg in msgs:
            in_hand[msg.reply] = msg
        alone: list[Msg] = []
        batch: list[tuple[Envelope, Delivery]] = []
        max_deliver = self.spec.max_deliver
        senders = self._senders
        for msg in msgs:
            delivery = Delivery(msg)
            if 0 < max_deliver < delivery.num_delivered:
                alone.append(msg)  # past the limit: the per-message path dead-letters it
                continue
            try:
                event = _decode(msg.data)
                if event.protocolversion not in _READABLE:  # another spelling, or version: negotiated each time
                    _negotiate(event.protocolversion)
            except (ProtocolError, ValidationError):
                alone.append(msg)  # fails the same way there, and is dead-lettered alone
                continue
            # (_forged's own first test, without a call per message: a sender found not forged before)
            if (event.type, event.source, event.actor) not in senders and self._forged(event) is not None:
                alone.append(msg)  # refused the same way there, and dead-lettered alone
                continue
            batch.append((event, delivery))
        return _Fetched(msgs, alone, batch)

    async def _process_batch(self, fetched: _Fetched) -> None:
        """Dead-letter the set-aside, hand the batch to the batch handler, ack it; per message when it raises."""
        assert self._batch_handler is not None
        for msg in fetched.alone:
            await self._process(msg)
        batch = fetched.batch
        if not batch:
            return
        held = [delivery.msg for _, delivery in batch]
        started = time.monotonic()
        try:
            with structlog.contextvars.bound_contextvars(
                consumer=self.spec.durable,
                batch=len(batch),
                first_seq=batch[0][1].stream_seq,
                last_seq=batch[-1][1].stream_seq,
            ):
                await self._batch_handler(batch)
        except asyncio.CancelledError:
            for msg in held:
                self._in_hand.pop(msg.reply, None)
            raise
        except Exception as exc:
            self._log.warning("batch.fallback", error=repr(exc), batch=len(batch), exc_info=True)
            for msg in held:  # one by one: each is acked, nak'ed or dead-lettered on its own
                await self._process(msg)
            return
        # only now: the batch handler returned, its side effects are committed. One ack per message,
        # all written at once, no reply awaited.
        for msg in held:
            self._in_hand.pop(msg.reply, None)
        try:
            await _ack_all(self.bus.nc, held)
        except Exception as exc:  # the messages come back after ack_wait; handlers are idempotent
            self._log.warning("consumer.settle_failed", error=repr(exc), messages=len(held))
        self._observe("acked", time.monotonic() - started, len(held))

    def _observe(self, outcome: Outcome, seconds: float, count: int = 1) -> None:
        if self._observer is not None:
            try:
                self._observer.settled(self.spec.durable, outcome, seconds, count)
            except Exception as exc:  # counting must never fail a message
                self._log.warning("consumer.observer_failed", error=repr(exc))

    async def _process(self, msg: Msg) -> None:
        delivery = Delivery(msg)
        started = time.monotonic()
        self._in_hand[msg.reply] = msg
        try:
            # bound_contextvars(consumer=..., stream_seq=..., delivery=...), for a fraction of its cost
            bound = (
                _CONSUMER.set(self.spec.durable),
                _STREAM_SEQ.set(delivery.stream_seq),
                _DELIVERY.set(delivery.num_delivered),
            )
            try:
                if 0 < self.spec.max_deliver < delivery.num_delivered:
                    # past the limit: the last attempt never settled (it crashed or killed its process,
                    # or its dead-lettering failed) -- dead-letter without running the handler again
                    exhausted = RuntimeError("deliveries exhausted without a settled outcome")
                    await self._give_up(msg, delivery, exhausted, started)
                    return
                try:
                    await self._dispatch(msg, delivery)
                except (PermanentError, ProtocolError, ValidationError) as exc:
                    await self._give_up(msg, delivery, exc, started)
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if 0 < self.spec.max_deliver <= delivery.num_delivered:
                        await self._give_up(msg, delivery, exc, started)
                        return
                    delay = self._backoff(delivery.num_delivered)
                    # a TransientError says what it is (a lost race, a peer away, a policy not stored yet): its
                    # traceback tells nothing more and costs a rendering per retry; anything else gets one
                    expected = isinstance(exc, TransientError)
                    self._log.warning("handler.retry", error=repr(exc), delay_s=delay, exc_info=not expected)
                    self._in_hand.pop(msg.reply, None)
                    await msg.nak(delay=delay)
                    self._observe("retried", time.monotonic() - started)
                    return
                self._in_hand.pop(msg.reply, None)
                await _ack(msg)  # only now: the handler returned, its side effects are committed
                self._observe("acked", time.monotonic() - started)
            finally:
                _DELIVERY.reset(bound[2])
                _STREAM_SEQ.reset(bound[1])
                _CONSUMER.reset(bound[0])
        except Exception as exc:  # ack/nak/term failed: the message comes back after ack_wait
            self._log.warning("consumer.settle_failed", error=repr(exc))
        finally:
            self._in_hand.pop(msg.reply, None)

    async def _dispatch(self, msg: Msg, delivery: Delivery) -> None:
        if self._raw_handler is not None:
            if not tracing.enabled() or not msg.headers:
                await self._raw_handler(msg.data, delivery)
                return
            with tracing.consuming_raw(msg.headers, delivery.subject, self.spec.durable):
                await self._raw_handler(msg.data, delivery)
            return
        assert self._handler is not None
        event = _decode(msg.data)  # (decode's envelope, or its very error)
        if event.protocolversion not in _READABLE:  # another spelling, or version: negotiated each time
            _negotiate(event.protocolversion)  # refuses explicitly (PRO-3), as a ProtocolError
        forged = self._forged(event)
        if forged is not None:  # SEC-1, AP-11: never handled; dead-lettered and journaled
            raise ForgedEvent(forged)
        bound = (_CE_ID.set(event.id), _CE_TYPE.set(event.type), _RUN_ID.set(event.runid))  # (as in _process)
        try:
            if not tracing.enabled():  # the hot path with tracing off: not even a context manager
                await self._handler(event, delivery)
                return
            with tracing.consuming(event, delivery.subject, self.spec.durable):
                await self._handler(event, delivery)
        finally:
            _RUN_ID.reset(bound[2])
            _CE_TYPE.reset(bound[1])
            _CE_ID.reset(bound[0])

    def _forged(self, event: Envelope) -> str | None:
        """:func:`forgery` of ``event`` (why it is refused; None: it may be handled), checked once per short
        ``(type, source, actor)`` seen (the answer is a pure function of them), for both paths."""
        sender = (event.type, event.source, event.actor)
        if sender in self._senders:
            return None
        forged = forgery(event, self._source_check)
        if forged is None:
            _remember(self._senders, sender)
        return forged

    def _backoff(self, num_delivered: int) -> float:
        backoff = self.spec.backoff_s
        return backoff[min(num_delivered - 1, len(backoff) - 1)]

    async def _give_up(self, msg: Msg, delivery: Delivery, exc: BaseException, started: float) -> None:
        """Dead-letter; if even that fails (the bus is down), nak so the server delivers it again.

        The server-side consumer has no delivery limit: the runner alone decides when to give up, so
        a message is never dropped because its dead-lettering failed on the last delivery.
        """
        try:
            await self._dead_letter(msg, delivery, exc)
        except Exception as dl_exc:
            delay = self.spec.backoff_s[-1]
            self._log.error("dead_letter.failed", error=repr(dl_exc), original_error=repr(exc), retry_in_s=delay)
            self._in_hand.pop(msg.reply, None)
            await msg.nak(delay=delay)
            self._observe("retried", time.monotonic() - started)
            return
        self._observe("dead_lettered", time.monotonic() - started)

    async def _heartbeat(self) -> None:
        """One loop for the whole consumer: ``in_progress`` for every message in hand, every ``ack_wait / 3``."""
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            for reply, msg in list(self._in_hand.items()):
                if reply not in self._in_hand:  # settled while we were sending the others
                    continue
                try:
                    await msg.in_progress()
                except Exception as exc:  # disconnected: nats-py reconnects; redelivery covers the worst case
                    self._log.debug("consumer.in_progress_failed", error=repr(exc))

    async def _dead_letter(self, msg: Msg, delivery: Delivery, exc: BaseException) -> None:
        """Tell the service (``on_dead_letter``), copy the message to the DLQ stream, journal it, then
        terminate it. Never loses it: any step failing raises, and :meth:`_give_up` naks."""
        error = f"{type(exc).__name__}: {exc}"[:4096]
        dlq_subject = f"{DLQ_PREFIX}.{self.spec.durable}"
        env: Envelope | None = None
        with contextlib.suppress(ProtocolError):
            env = decode(msg.data)
        # With tracing on, in an error span continuing the message's trace: the hook's effects (a run failed)
        # and bus.dead_lettered are in the trace of what gave up.
        with tracing.continued(
            f"dead-letter {delivery.subject}",
            env.traceparent if env is not None else None,
            env.tracestate if env is not None else None,
            attributes={
                "messaging.consumer.group.name": self.spec.durable,
                "messaging.destination.name": delivery.subject,
            },
        ) as span:
            if span is not None:
                span.set_status(StatusCode.ERROR, error[:256])
            await self._settle_dead(msg, delivery, env, exc, error, dlq_subject)

    async def _settle_dead(
        self, msg: Msg, delivery: Delivery, env: Envelope | None, exc: BaseException, error: str, dlq_subject: str
    ) -> None:
        original_id, original_type, run_id = (
            (env.id, env.type, env.runid) if env is not None else (*claimed_id_and_type(msg.data), None)
        )
        if isinstance(exc, ForgedEvent):  # the service is never told of a forgery: it must not act on it
            self._log.warning("event.forged", error=error, original_id=original_id, original_type=original_type)
        elif self._on_dead_letter is not None:
            subject: Envelope | bytes = env if env is not None and self._handler is not None else msg.data
            try:
                await self._on_dead_letter(subject, delivery, exc)
            except PermanentError as hook_exc:  # it can never succeed for this message: dead-letter anyway
                self._log.error("dead_letter.hook_refused", error=repr(hook_exc), original_id=original_id)
        headers = {k: v for k, v in (msg.headers or {}).items() if not k.startswith("Nats-")}
        headers.update(
            {
                "Nats-Msg-Id": derive_id("dlq", self.spec.durable, str(delivery.stream_seq)),
                "Temporality-Error": error.replace("\r", " ").replace("\n", " ")[:1024],
                "Temporality-Original-Subject": delivery.subject,
                "Temporality-Stream-Seq": str(delivery.stream_seq),
                "Temporality-Consumer": self.spec.durable,
            }
        )
        await self.bus.publish_raw(dlq_subject, msg.data, headers)
        event = make_event(
            BusDeadLettered(
                consumer=self.spec.durable,
                stream=self.spec.stream,
                subject=delivery.subject,
                stream_seq=delivery.stream_seq,
                deliveries=delivery.num_delivered,
                error=error,
                dlq_subject=dlq_subject,
                original_id=original_id,
                original_type=original_type,
            ),
            source=f"/temporality/{self.bus.name}",
            id=derive_id("evt-dlq", self.spec.durable, str(delivery.stream_seq)),
            run_id=run_id,
            actor=f"service:{self.bus.name}",
        )
        await self.bus.publish(event)
        self._in_hand.pop(msg.reply, None)
        await msg.term()
        self._log.error("message.dead_lettered", error=error, dlq_subject=dlq_subject, original_id=original_id)
