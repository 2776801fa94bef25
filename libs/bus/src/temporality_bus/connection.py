"""The connection to NATS JetStream: connect with reconnect, ensure the layout, publish CloudEvents."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, TypeVar

import nats
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js import api as jsapi
from nats.js.errors import (
    BadRequestError,
    BucketNotFoundError,
    NoStreamResponseError,
    NotFoundError,
    ServiceUnavailableError,
)
from nats.js.kv import KeyValue
from pydantic import BaseModel
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_delay, wait_exponential_jitter

from temporality_bus.errors import PayloadTooLarge, TransientError
from temporality_bus.pipeline import JS_TIMEOUT_S, Pipeline, PublishResult, Write, event_write
from temporality_bus.routing import _read_headers_fast
from temporality_bus.settings import NatsSettings
from temporality_bus.store import Store
from temporality_bus.tracing import calling, traced
from temporality_protocol import CONTENT_TYPE, EncodedEvent, Envelope, encode
from temporality_protocol.catalog import DLQ_STREAM, EVENTS_STREAM, BucketSpec, ConsumerSpec, StreamSpec
from temporality_protocol.jetstream import kv_write_subject

__all__ = ["Bus", "PublishResult"]

log = structlog.get_logger(__name__)
M = TypeVar("M", bound=BaseModel)
#: How long ``ensure`` keeps retrying a layout step the cluster cannot answer yet (timeouts, 503).
LAYOUT_RETRY_S = 60.0
_LAYOUT_TRANSIENT = (nats.errors.TimeoutError, TimeoutError, ServiceUnavailableError)
#: How long a JetStream publish that no stream answered (503, no responders) is sent again before it fails.
#: Nothing was stored, so sending it again is safe. On a cluster this is normal for a moment: a stream (or KV
#: bucket) just created has its leader, but the leader's interest in the subjects has not reached every
#: node yet; a failover is electing a new leader.
NO_STREAM_RETRY_S = 3.0


class _JetStream(JetStreamContext):
    """nats-py's JetStream context, whose :meth:`publish` (and so every KV write) sends a publish that no
    stream answered again, with backoff, for up to ``no_stream_retry_s``. In a JetStream domain (``domain=``)
    a KV write (``$KV...``, which nats-py's KV client sends whatever the domain) goes to the domain's
    ``$JS.<domain>.API.$KV...`` (:func:`temporality_protocol.jetstream.kv_write_subject`)."""

    no_stream_retry_s = NO_STREAM_RETRY_S

    def __init__(self, nc: NATS, *, timeout: float, domain: str | None = None) -> None:
        super().__init__(nc, domain=domain, timeout=timeout)
        self.domain = domain

    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float | None = None,  # noqa: ASYNC109 -- nats-py's signature
        stream: str | None = None,
        headers: dict[str, Any] | None = None,
        msg_ttl: float | None = None,
    ) -> jsapi.PubAck:
        if subject.startswith("$KV."):
            subject = kv_write_subject(subject, self.domain)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.no_stream_retry_s
        delay = 0.02
        while True:
            try:
                return await super().publish(
                    subject, payload, timeout=timeout, stream=stream, headers=headers, msg_ttl=msg_ttl
                )
            except NoStreamResponseError:
                if loop.time() + delay > deadline:
                    raise
                log.debug("publish.no_stream_yet", subject=subject, retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)


def _direct_reads(info: jsapi.StreamInfo) -> bool:
    """Whether a bucket's reads may be direct gets (``$JS.API.DIRECT.GET``): its stream allows them and has one
    replica. A direct get skips the JetStream API's request path (about a quarter of ``STREAM.MSG.GET``'s server
    CPU, no API audit advisory, no JSON or base64 in the answer), but on a replicated stream any replica answers it,
    a follower possibly before it has applied the latest write: a read after one's own write could miss it. So
    replicated buckets are read through ``STREAM.MSG.GET`` (the leader) as before."""
    return bool(info.config.allow_direct) and (info.config.num_replicas or 1) == 1


def _default_inbox(user: str | None) -> str:
    """``_INBOX.<user>`` for a user name that is one subject token (a service's, ``sub-<name>``), else ``_INBOX``."""
    if user and re.fullmatch(r"[A-Za-z0-9_-]+", user):
        return f"_INBOX.{user}"
    return "_INBOX"


class Bus:
    """One NATS connection with its JetStream context. Use :meth:`connect` as an async context manager."""

    def __init__(self, nc: NATS, settings: NatsSettings, name: str) -> None:
        self.nc = nc
        _read_headers_fast(nc)  # (the same headers, read ~4x cheaper: a KV watch's deliveries, request replies)
        self.js: _JetStream = _JetStream(nc, timeout=JS_TIMEOUT_S, domain=settings.jetstream_domain)
        self.settings = settings
        self.name = name
        self._kv: dict[str, KeyValue] = {}
        #: bucket name -> whether :class:`Store` reads it with direct gets (:func:`_direct_reads`), as opened.
        self._direct: dict[str, bool] = {}
        #: Every :class:`Pipeline` over this connection: told of each disconnection (:meth:`Bus.connect`'s callbacks).
        self._pipelines: weakref.WeakSet[Pipeline] = weakref.WeakSet()
        #: The connection's pipelined writes (one reply subscription, opened on first use): shared by
        #: :meth:`publish_many` and every caller that sends its own batches.
        self.pipeline = Pipeline(self)
        #: Called (synchronously, on the connection's reader) with each asynchronous error the server reports on
        #: this connection after it is up -- a permissions violation among them --, after it is logged.
        self.error_listeners: list[Callable[[Exception], None]] = []

    @classmethod
    @asynccontextmanager
    async def connect(cls, settings: NatsSettings, *, name: str, inbox_prefix: str | None = None) -> AsyncIterator[Bus]:
        """Connect as ``name`` (the client name the server shows). Replies arrive below ``inbox_prefix``
        (the service runtime passes ``_INBOX.<service>``, the only inbox its NATS user may subscribe to);
        by default ``_INBOX.<user>`` when the settings name a user that is one subject token, else ``_INBOX``."""
        closing = False  # set once we drain: the disconnect that follows is ours, not an outage
        bus: Bus | None = None

        async def _disconnected() -> None:
            if closing:
                log.debug("nats.disconnected", reason="closing")
            else:
                log.warning("nats.disconnected")
            if bus is not None:  # the acks of the writes sent on the lost connection can never come
                for pipeline in list(bus._pipelines):
                    pipeline._connection_lost(closed=bus.nc.is_closed)

        async def _reconnected() -> None:
            log.info("nats.reconnected")
            if bus is not None:
                for pipeline in list(bus._pipelines):
                    pipeline._connection_back()

        async def _error(exc: Exception) -> None:
            log.warning("nats.error", error=str(exc))
            if bus is not None:  # e.g. the service runtime's audit of the server's permissions violations
                for listener in list(bus.error_listeners):
                    try:
                        listener(exc)
                    except Exception as failed:  # a listener's bug must not break the connection's reader
                        log.warning("nats.error_listener_failed", error=repr(failed))

        nc = await nats.connect(
            servers=settings.servers,
            name=name,
            connect_timeout=settings.connect_timeout_s,
            max_reconnect_attempts=settings.max_reconnect_attempts,
            reconnect_time_wait=settings.reconnect_wait_s,
            drain_timeout=settings.drain_timeout_s,
            ping_interval=settings.ping_interval_s,
            max_outstanding_pings=settings.max_outstanding_pings,
            allow_reconnect=True,
            disconnected_cb=_disconnected,
            reconnected_cb=_reconnected,
            error_cb=_error,
            tls=settings.ssl_context(),
            inbox_prefix=inbox_prefix or _default_inbox(settings.user),
            **settings.auth_options(),  # a user and password, a credentials file or an nkey seed file
        )
        log.info("nats.connected", servers=settings.servers, client=name, user=settings.user, auth=settings.auth)
        bus = cls(nc, settings, name)
        try:
            yield bus
        finally:
            # Consumers unsubscribe their pull subscriptions before this (drain gotcha, TEST-PEERS.md).
            closing = True
            if not nc.is_closed:
                try:
                    await nc.drain()
                except Exception as exc:  # drain is best effort at shutdown (the server may be gone)
                    log.warning("nats.drain_failed", error=repr(exc))
                    with contextlib.suppress(Exception):
                        await nc.close()

    # ------------------------------------------------------------------ layout
    async def ensure(self, streams: Iterable[StreamSpec] = (), buckets: Iterable[BucketSpec] = ()) -> None:
        """Create or update streams and KV buckets; safe to call from every process at every start.

        On a JetStream cluster the API can time out or answer 503 for a while (a stream being created
        by another service still electing its leader, the meta leader changing): each step is retried
        with backoff for up to :data:`LAYOUT_RETRY_S` before the start fails.

        The steps run concurrently (each stream and bucket is independent; one after another it was ~17 JetStream
        round trips, ~0.1 s on a quiet machine and ~1 s on a loaded one, at every service start and every test's
        layout); every step is seen through, then the first failure in argument order is raised as it was."""
        steps = [
            self._layout_step(f"stream {spec.name}", functools.partial(self.ensure_stream, spec)) for spec in streams
        ]
        steps += [
            self._layout_step(f"bucket {bucket.name}", functools.partial(self.ensure_bucket, bucket))
            for bucket in buckets
        ]
        outcomes = await asyncio.gather(*steps, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _layout_step(self, what: str, step: Callable[[], Awaitable[object]]) -> None:
        def _log(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            log.warning("layout.retrying", step=what, attempt=state.attempt_number, error=repr(error))

        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(_LAYOUT_TRANSIENT),
            stop=stop_after_delay(LAYOUT_RETRY_S),
            wait=wait_exponential_jitter(multiplier=0.25, max=5, jitter=0.25),
            before_sleep=_log,
            reraise=True,
        ):
            with attempt:
                await step()

    async def find_layout(
        self, streams: Iterable[StreamSpec] = (), buckets: Iterable[BucketSpec] = (), *, create_missing: bool = False
    ) -> list[str]:
        """Look up streams and buckets another service owns without changing them (only their info is read):
        the names of those that do not exist yet, ``[]`` once all do. A bucket found is opened for :meth:`kv`
        and :meth:`store`. A look-up the server does not answer in time counts as missing.

        ``create_missing`` creates a missing one with the catalogue's configuration (an existing one is never
        updated: its owner's settings stay): for a connection without NATS permissions, where nothing but
        start order would make it wait for the owner."""
        missing: list[str] = []
        for spec in streams:
            try:
                await self.js.stream_info(spec.name)
            except NotFoundError:
                if not create_missing:
                    missing.append(spec.name)
                    continue
                try:
                    await self.js.add_stream(self._stream_config(spec))
                    log.info("stream.created", stream=spec.name, by="a user of it, before its owner")
                except BadRequestError:  # its owner (or another service) created it meanwhile
                    pass
            except _LAYOUT_TRANSIENT:
                missing.append(spec.name)
        for bucket in buckets:
            if bucket.name in self._kv:
                continue
            try:
                if create_missing:
                    await self.ensure_bucket(bucket, update=False)
                else:
                    self._kv[bucket.name] = await self.js.key_value(bucket.name)
                    self._direct[bucket.name] = _direct_reads(await self.js.stream_info(f"KV_{bucket.name}"))
            except (BucketNotFoundError, NotFoundError, *_LAYOUT_TRANSIENT):
                missing.append(f"KV_{bucket.name}")
        return missing

    def _stream_config(self, spec: StreamSpec) -> jsapi.StreamConfig:
        max_age_s = spec.max_age_s
        if spec.name == EVENTS_STREAM.name and self.settings.events_max_age_days > 0:
            max_age_s = self.settings.events_max_age_days * 24 * 3600
        elif spec.name == DLQ_STREAM.name:
            max_age_s = self.settings.dlq_max_age_days * 24 * 3600  # 0: forever
        return jsapi.StreamConfig(
            name=spec.name,
            description=spec.description,
            subjects=list(spec.subjects),
            retention=jsapi.RetentionPolicy.LIMITS,
            storage=jsapi.StorageType.FILE,
            max_age=max_age_s or None,
            duplicate_window=spec.duplicate_window_s,
            allow_msg_schedules=spec.allow_msg_schedules or None,
            allow_rollup_hdrs=spec.allow_rollup_and_ttl,
            allow_msg_ttl=spec.allow_rollup_and_ttl,
            num_replicas=self.settings.stream_replicas,
        )

    async def ensure_stream(self, spec: StreamSpec) -> None:
        """Create the stream, or update it to this configuration (its owner's settings)."""
        config = self._stream_config(spec)
        try:
            await self.js.stream_info(spec.name)
        except NotFoundError:
            try:
                await self.js.add_stream(config)
                log.info("stream.created", stream=spec.name)
                return
            except BadRequestError:  # another process created it between our two calls
                pass
        await self.js.update_stream(config)

    async def ensure_bucket(self, spec: BucketSpec, *, update: bool = True) -> KeyValue:
        """Create the bucket, or open it and bring it to this configuration: ``stream_replicas`` copies (a
        deployment moving to a 3-node cluster scales its buckets up at the next start, as its streams), and direct
        reads allowed exactly when it has one copy (:func:`_direct_reads`; on more, turned off with the scaling,
        so that no client reads a follower). Nothing else of an existing bucket changes (its history, TTL).
        ``update=False``: an existing bucket is opened as it is (a user of another service's bucket: its owner's
        settings stay)."""
        stream = f"KV_{spec.name}"
        replicas = self.settings.stream_replicas
        try:
            kv = await self.js.key_value(spec.name)
        except (BucketNotFoundError, NotFoundError):
            try:
                kv = await self.js.create_key_value(
                    jsapi.KeyValueConfig(
                        bucket=spec.name,
                        description=spec.description,
                        history=spec.history,
                        ttl=spec.ttl_s or None,
                        storage=jsapi.StorageType.FILE,
                        replicas=replicas,
                        direct=replicas == 1,
                    )
                )
                log.info("bucket.created", bucket=spec.name)
            except BadRequestError:  # another process created it between our two calls
                kv = await self.js.key_value(spec.name)
        info = await self.js.stream_info(stream)
        config = info.config
        if update and ((config.num_replicas or 1) != replicas or bool(config.allow_direct) != (replicas == 1)):
            try:
                info = await self.js.update_stream(replace(config, num_replicas=replicas, allow_direct=replicas == 1))
            except nats.errors.Error as exc:  # (JetStream's API errors among them)
                # not allowed (a NATS authorization from before this version: no STREAM.UPDATE of KV streams), or the
                # cluster cannot do it now: the bucket serves as it is, read as it is (its owner tries at every start)
                log.warning(
                    "bucket.update_failed",
                    bucket=spec.name,
                    replicas=replicas,
                    was=config.num_replicas or 1,
                    error=f"{type(exc).__name__}: {exc}",
                    hint="grant $JS.API.STREAM.UPDATE.KV_<bucket> to its owner (temporality nats-authorization)",
                )
            else:
                kv = await self.js.key_value(spec.name)  # the KV client reads directly or not as the stream says now
                log.info(
                    "bucket.updated",
                    bucket=spec.name,
                    replicas=replicas,
                    was=config.num_replicas or 1,
                    direct_reads=replicas == 1,
                )
        self._kv[spec.name] = kv
        self._direct[spec.name] = _direct_reads(info)
        return kv

    async def ensure_consumer(self, spec: ConsumerSpec, *, ack_wait_s: float | None = None) -> None:
        """Create the durable (or update it in place: same name, same deliver policy, so it keeps its
        position). ``spec.deliver_policy`` ``new`` starts a durable created now at the stream's tail."""
        policy = jsapi.DeliverPolicy.NEW if spec.deliver_policy == "new" else jsapi.DeliverPolicy.ALL
        config = jsapi.ConsumerConfig(
            durable_name=spec.durable,
            description=spec.description,
            deliver_policy=policy,
            ack_policy=jsapi.AckPolicy.EXPLICIT,
            ack_wait=ack_wait_s or self.settings.ack_wait_s,
            # no server-side limit: the runner enforces spec.max_deliver, so it can still dead-letter (or
            # retry dead-lettering) on the last delivery instead of the server dropping the message
            max_deliver=-1,
            filter_subjects=list(spec.filter_subjects),
            max_ack_pending=spec.max_ack_pending,
        )
        await self.js.add_consumer(spec.stream, config)

    async def kv(self, bucket: BucketSpec) -> KeyValue:
        if bucket.name not in self._kv:
            return await self.ensure_bucket(bucket)
        return self._kv[bucket.name]

    async def store(self, bucket: BucketSpec, model: type[M]) -> Store[M]:
        return Store(
            await self.kv(bucket),
            bucket.name,
            model,
            pipeline=self.pipeline,
            nc=self.nc,
            api_prefix=self.settings.js_api_prefix,
            direct=self._direct.get(bucket.name, False),
        )

    # ------------------------------------------------------------------ publish
    async def publish(self, event: Envelope) -> PublishResult:
        """Publish durably with ``Nats-Msg-Id`` = the event id; returns once JetStream has stored it.

        Inside a span the event carries its trace context (:func:`temporality_bus.tracing.traced`)."""
        event = traced(event)
        return await self.publish_raw(
            event.nats_subject,
            encode(event),
            {"Nats-Msg-Id": event.id, "Content-Type": CONTENT_TYPE, "Ce-Type": event.type},
        )

    async def publish_raw(self, subject: str, payload: bytes, headers: dict[str, str]) -> PublishResult:
        try:
            ack = await self.js.publish(subject, payload, headers=headers)
        except nats.errors.MaxPayloadError as exc:
            raise PayloadTooLarge(len(payload)) from exc
        except (nats.errors.Error, OSError) as exc:  # timeouts, no responders/stream, closed/reset connections
            raise TransientError(f"publish to {subject} failed: {exc!r}") from exc
        result = PublishResult(stream=ack.stream, seq=ack.seq, duplicate=bool(ack.duplicate))
        log.debug("published", subject=subject, msg_id=headers.get("Nats-Msg-Id"), duplicate=result.duplicate)
        return result

    async def publish_write(self, write: Write) -> PublishResult:
        """:meth:`publish_raw` of one prepared :class:`~temporality_bus.pipeline.Write` (a timer's arm or cancel,
        built for a :meth:`Pipeline.send` batch), sent alone."""
        return await self.publish_raw(write.subject, write.payload, write.headers)

    async def publish_many(self, events: Sequence[Envelope | EncodedEvent]) -> list[PublishResult]:
        """Publish several events durably, pipelined; returns once JetStream has stored *every* one.

        Each event is encoded once (an :class:`~temporality_protocol.EncodedEvent` already is) and goes out
        like :meth:`publish` (``Nats-Msg-Id`` = its id), but
        all are written before the first acknowledgement is awaited (:meth:`Pipeline.send` on
        :attr:`pipeline`): one round trip instead of one per event. The results are in the order of
        ``events``. When any one is not stored (no acknowledgement within the JetStream timeout, refused,
        no stream took it, the same retries as :meth:`publish`) this raises the first failure like
        :meth:`publish`, and the others may or may not have been stored: publish them again with the same
        ids (JetStream dedupes them) or not at all.
        """
        return await self._publish_all([event_write(event) for event in events], JS_TIMEOUT_S)

    async def publish_raw_many(
        self, messages: Sequence[tuple[str, bytes, dict[str, str]]], *, timeout_s: float = JS_TIMEOUT_S
    ) -> list[PublishResult]:
        """:meth:`publish_raw` for several ``(subject, payload, headers)`` messages, pipelined (see
        :meth:`publish_many`): :class:`PermanentError` when one exceeds max_payload (checked before
        anything is sent), :class:`TransientError` when one is not acknowledged within ``timeout_s``, is
        refused by JetStream (its reason in the text), or no stream took it (after ``js.no_stream_retry_s``
        of sending it again)."""
        return await self._publish_all(
            [Write(subject, payload, headers) for subject, payload, headers in messages], timeout_s
        )

    async def _publish_all(self, writes: list[Write], timeout_s: float) -> list[PublishResult]:
        """:meth:`Pipeline.send`, then the first failure raised: the results, in order, when all are stored."""
        results: list[PublishResult] = []
        for write, outcome in zip(writes, await self.pipeline.send(writes, timeout_s=timeout_s), strict=True):
            if not isinstance(outcome, PublishResult):
                raise outcome
            results.append(outcome)
            log.debug(
                "published", subject=write.subject, msg_id=write.headers.get("Nats-Msg-Id"), duplicate=outcome.duplicate
            )
        return results

    async def request(self, subject: str, payload: bytes, timeout_s: float = 5.0) -> bytes:
        """Send a NATS request and return the reply; with tracing on, in a CLIENT span whose context travels in
        the request's headers (the :class:`~temporality_bus.Responder` continues it)."""
        with calling(subject) as headers:
            msg = await self.nc.request(subject, payload, timeout=timeout_s, headers=headers or None)
        data: bytes = msg.data
        return data
