"""Several JetStream writes in one round trip, each with its own outcome: events and KV writes mixed.

:meth:`temporality_bus.Bus.publish_many` pipelines events and fails as a whole. A caller that writes a
compare-and-set KV value next to other things (the gateway's dedupe claim with its delivery record)
needs to know *which* write failed and why: a lost compare-and-set is an answer, not an outage. So
:meth:`Pipeline.send` writes every message before awaiting the first acknowledgement and returns, in
order, a :class:`~temporality_bus.PublishResult` or the error of each::

    results = await pipeline.send([kv_write(BUCKET, key, claim, revision=0), kv_write(...), event_write(e)])
    Conflict      the KV key was not at ``revision`` (0: the key exists) -- nothing was written
    TransientError no acknowledgement within the timeout, no stream, the connection failed: it may or
                  may not have been stored (write it again with the same id / revision, or read it)
    PermanentError larger than the server's max_payload (nothing of the batch is sent)

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

import nats.errors
from nats.aio.msg import Msg
from pydantic_core import from_json

from temporality_bus.connection import JS_TIMEOUT_S, Bus, PublishResult
from temporality_bus.errors import BusError, Conflict, PermanentError, TransientError
from temporality_protocol import CONTENT_TYPE, Envelope, encode

__all__ = ["Pipeline", "Write", "event_write", "kv_write"]

#: JetStream's error code for a compare-and-set whose expected last sequence did not match.
_WRONG_LAST_SEQUENCE = 10071
_EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"


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
    """``event`` as :meth:`Bus.publish` sends it (encoded once here; ``Nats-Msg-Id`` = its id)."""
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
    """Pipelined writes over one :class:`Bus` (one reply subscription, opened on first use)."""

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
        its place."""
        if not writes:
            return []
        nc = self._bus.nc
        for write in writes:
            if len(write.payload) > nc.max_payload:
                raise PermanentError(f"{len(write.payload)} bytes exceed the server's max_payload")
        prefix = await self._inbox()
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
                except (nats.errors.Error, OSError) as exc:
                    unsent[i] = TransientError(f"write to {write.subject} failed: {exc!r}")
                    future.cancel()
            waiting = [f for f in futures if not f.done()]
            if waiting:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout_s):
                        await asyncio.wait(waiting)
            return [
                unsent[i] if i in unsent else _outcome(write, future, timeout_s)
                for i, (write, future) in enumerate(zip(writes, futures, strict=True))
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


def _outcome(write: Write, future: asyncio.Future[Msg], timeout_s: float) -> PublishResult | BusError:
    """The acknowledgement of ``write`` read: its result, or the error it stands for."""
    if not future.done() or future.cancelled():
        return TransientError(f"write to {write.subject} failed: no ack within {timeout_s:g} s")
    msg = future.result()
    if msg.headers and msg.headers.get("Status") == "503":
        return TransientError(f"write to {write.subject} failed: no stream took it")
    try:
        response = from_json(msg.data)
        error = response.get("error")
        if error is not None:
            if error.get("err_code") == _WRONG_LAST_SEQUENCE and write.bucket is not None and write.key is not None:
                return Conflict(write.bucket, write.key, write.revision)
            return TransientError(f"write to {write.subject} refused: {error.get('description', error)!r}")
        return PublishResult(stream=response["stream"], seq=response["seq"], duplicate=bool(response.get("duplicate")))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return TransientError(f"unreadable ack of {write.subject}: {exc!r}")
