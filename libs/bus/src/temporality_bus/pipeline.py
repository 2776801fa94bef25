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
                  refused it (its reason in the text), the connection failed: it may or may not have been
                  stored (write it again with the same id / revision, or read it)
    PermanentError larger than the server's max_payload (nothing of the batch is sent)

A write no stream took (503, "no responders") stored nothing, so it is sent again, with backoff, for up to
the Bus's ``js.no_stream_retry_s`` (:data:`temporality_bus.connection.NO_STREAM_RETRY_S`), as ``bus.js.publish``
does: on a cluster a stream or bucket just created can lack subject interest on this node for a moment.

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
import contextlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import nats.errors
import structlog
from nats.aio.msg import Msg
from pydantic import BaseModel
from pydantic_core import from_json

from temporality_bus.errors import BusError, Conflict, PermanentError, TransientError
from temporality_bus.tracing import traced
from temporality_protocol import CONTENT_TYPE, Envelope, encode

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
    stream: str
    seq: int
    duplicate: bool


@dataclass(frozen=True)
class Write:
    """One JetStream write: the subject, the bytes, the headers; ``bucket``/``key``/``revision`` for a
    KV write (so a lost compare-and-set is reported as :class:`Conflict` naming them)."""

    subject: str
    payload: bytes
    headers: dict[str, str]
    bucket: str | None = None
    key: str | None = None
    revision: int | None = None


def event_write(event: Envelope) -> Write:
    """``event`` as :meth:`Bus.publish` sends it (encoded once here; ``Nats-Msg-Id`` = its id; inside a
    span with its trace context, :func:`temporality_bus.tracing.traced`)."""
    event = traced(event)
    return Write(
        event.nats_subject,
        encode(event),
        {"Nats-Msg-Id": event.id, "Content-Type": CONTENT_TYPE, "Ce-Type": event.type},
    )


def kv_write(bucket: str, key: str, value: bytes, *, revision: int | None = None) -> Write:
    """A KV put of ``value`` under ``key``; with ``revision``, only if the key is at that revision (0: absent)."""
    headers = {} if revision is None else {_EXPECTED_LAST: str(revision)}
    return Write(f"$KV.{bucket}.{key}", value, headers, bucket=bucket, key=key, revision=revision)


class Pipeline:
    """Pipelined writes over one :class:`Bus` (one reply subscription, opened on first use). The Bus has
    one, :attr:`Bus.pipeline`, that every caller can share (its :meth:`~Bus.publish_many` uses it)."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._prefix: str | None = None
        self._lock = asyncio.Lock()
        self._pending: dict[str, asyncio.Future[Msg]] = {}
        self._tokens = itertools.count()

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
        max_payload = self._bus.nc.max_payload
        for write in writes:
            if len(write.payload) > max_payload:
                raise PermanentError(f"{len(write.payload)} bytes exceed the server's max_payload")
        prefix = await self._inbox()
        loop = asyncio.get_running_loop()
        retry_until = loop.time() + self._bus.js.no_stream_retry_s  # (as Bus.js.publish: from the first send)
        replies = await self._round(writes, prefix, timeout_s)
        outcomes: list[PublishResult | BusError] = [
            _outcome(w, r, timeout_s) for w, r in zip(writes, replies, strict=True)
        ]
        again = [i for i, reply in enumerate(replies) if isinstance(reply, Msg) and _no_stream(reply)]
        if not again:
            return outcomes  # the hot path: one round trip
        delay = 0.02
        while again and loop.time() + delay <= retry_until:
            log.debug("publish.no_stream_yet", subjects=sorted({writes[i].subject for i in again}), retry_in_s=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
            replies = await self._round([writes[i] for i in again], prefix, timeout_s)
            for i, reply in zip(again, replies, strict=True):
                outcomes[i] = _outcome(writes[i], reply, timeout_s)
            again = [i for i, reply in zip(again, replies, strict=True) if isinstance(reply, Msg) and _no_stream(reply)]
        return outcomes

    async def _round(self, writes: Sequence[Write], prefix: str, timeout_s: float) -> list[Msg | BusError | None]:
        """Send ``writes``, await their replies (``timeout_s`` for all): the reply of each, ``None`` for
        none in time, or the error that kept it from being sent."""
        nc = self._bus.nc
        loop = asyncio.get_running_loop()
        tokens: list[str] = []
        futures: list[asyncio.Future[Msg]] = []
        unsent: dict[int, BusError] = {}
        try:
            for i, write in enumerate(writes):
                token = str(next(self._tokens))
                future: asyncio.Future[Msg] = loop.create_future()
                self._pending[token] = future
                tokens.append(token)
                futures.append(future)
                try:
                    await nc.publish(write.subject, write.payload, reply=prefix + token, headers=write.headers)
                except nats.errors.MaxPayloadError as exc:  # a server with a smaller limit since the check
                    unsent[i] = _caused(
                        PermanentError(f"{len(write.payload)} bytes exceed the server's max_payload"), exc
                    )
                    future.cancel()
                except (nats.errors.Error, OSError) as exc:  # closed/reset connection, draining
                    unsent[i] = _caused(TransientError(f"publish to {write.subject} failed: {exc!r}"), exc)
                    future.cancel()
            waiting = [f for f in futures if not f.done()]
            if waiting:
                # one after the other under one deadline: the same as asyncio.wait(waiting) here (only the
                # finally below cancels these futures), without its per-call set, waiter and callbacks
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout_s):
                        for future in waiting:
                            await future
            return [
                unsent[i] if i in unsent else (f.result() if f.done() and not f.cancelled() else None)
                for i, f in enumerate(futures)
            ]
        finally:
            for token, future in zip(tokens, futures, strict=True):
                self._pending.pop(token, None)
                if not future.done():
                    future.cancel()

    async def _inbox(self) -> str:
        if self._prefix is None:
            async with self._lock:
                if self._prefix is None:
                    prefix = self._bus.nc.new_inbox()
                    await self._bus.nc.subscribe(prefix + ".*", cb=self._on_reply)
                    self._prefix = prefix + "."
        return self._prefix

    async def _on_reply(self, msg: Msg) -> None:
        assert self._prefix is not None
        future = self._pending.pop(msg.subject[len(self._prefix) :], None)
        if future is not None and not future.done():
            future.set_result(msg)


def _caused(error: BusError, cause: BaseException) -> BusError:
    """``error`` with ``cause`` as its ``__cause__`` (as ``raise error from cause`` would set it)."""
    error.__cause__ = cause
    return error


def _no_stream(reply: Msg) -> bool:
    """Whether ``reply`` is the server's "no responders": no stream took the write, nothing was stored."""
    return reply.headers is not None and reply.headers.get("Status") == _NO_RESPONDERS


def _outcome(write: Write, reply: Msg | BusError | None, timeout_s: float) -> PublishResult | BusError:
    """The acknowledgement of ``write`` read: its result, or the error it stands for."""
    if isinstance(reply, BusError):
        return reply
    if reply is None:
        return TransientError(f"publish to {write.subject} failed: no ack within {timeout_s:g} s")
    if _no_stream(reply):
        return TransientError(f"publish to {write.subject} failed: no stream took it (no responders)")
    try:
        response = from_json(reply.data)
        error = response.get("error")
        if error is not None:
            if error.get("err_code") == _WRONG_LAST_SEQUENCE and write.bucket is not None and write.key is not None:
                return Conflict(write.bucket, write.key, write.revision)
            return TransientError(f"publish to {write.subject} failed: refused: {error.get('description', error)!r}")
        return PublishResult(stream=response["stream"], seq=response["seq"], duplicate=bool(response.get("duplicate")))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return TransientError(f"publish to {write.subject} failed: unreadable ack: {exc!r}")
