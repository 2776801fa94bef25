"""The connection to NATS JetStream: connect with reconnect, ensure the layout, publish CloudEvents."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import TypeVar

import nats
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js import api as jsapi
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from pydantic import BaseModel

from temporality_bus.errors import PermanentError, TransientError
from temporality_bus.settings import NatsSettings
from temporality_bus.store import Store
from temporality_protocol import CONTENT_TYPE, Envelope, encode
from temporality_protocol.catalog import BucketSpec, ConsumerSpec, StreamSpec

__all__ = ["Bus", "PublishResult"]

log = structlog.get_logger(__name__)
M = TypeVar("M", bound=BaseModel)


class PublishResult(BaseModel):
    stream: str
    seq: int
    duplicate: bool


class Bus:
    """One NATS connection with its JetStream context. Use :meth:`connect` as an async context manager."""

    def __init__(self, nc: NATS, settings: NatsSettings, name: str) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=10)
        self.settings = settings
        self.name = name
        self._kv: dict[str, KeyValue] = {}

    @classmethod
    @asynccontextmanager
    async def connect(cls, settings: NatsSettings, *, name: str) -> AsyncIterator[Bus]:
        closing = False  # set once we drain: the disconnect that follows is ours, not an outage

        async def _disconnected() -> None:
            if closing:
                log.debug("nats.disconnected", reason="closing")
            else:
                log.warning("nats.disconnected")

        async def _reconnected() -> None:
            log.info("nats.reconnected")

        async def _error(exc: Exception) -> None:
            log.warning("nats.error", error=str(exc))

        nc = await nats.connect(
            servers=settings.servers,
            name=name,
            connect_timeout=settings.connect_timeout_s,
            max_reconnect_attempts=settings.max_reconnect_attempts,
            reconnect_time_wait=settings.reconnect_wait_s,
            drain_timeout=settings.drain_timeout_s,
            allow_reconnect=True,
            disconnected_cb=_disconnected,
            reconnected_cb=_reconnected,
            error_cb=_error,
        )
        log.info("nats.connected", servers=settings.servers, client=name)
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
        """Create or update streams and KV buckets; safe to call from every process at every start."""
        for spec in streams:
            await self.ensure_stream(spec)
        for bucket in buckets:
            await self.ensure_bucket(bucket)

    async def ensure_stream(self, spec: StreamSpec) -> None:
        config = jsapi.StreamConfig(
            name=spec.name,
            description=spec.description,
            subjects=list(spec.subjects),
            retention=jsapi.RetentionPolicy.LIMITS,
            storage=jsapi.StorageType.FILE,
            max_age=spec.max_age_s or None,
            duplicate_window=spec.duplicate_window_s,
            allow_msg_schedules=spec.allow_msg_schedules or None,
        )
        try:
            await self.js.stream_info(spec.name)
        except NotFoundError:
            await self.js.add_stream(config)
            log.info("stream.created", stream=spec.name)
        else:
            await self.js.update_stream(config)

    async def ensure_bucket(self, spec: BucketSpec) -> KeyValue:
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
                    )
                )
                log.info("bucket.created", bucket=spec.name)
            except BadRequestError:  # another process created it between our two calls
                kv = await self.js.key_value(spec.name)
        self._kv[spec.name] = kv
        return kv

    async def ensure_consumer(self, spec: ConsumerSpec, *, ack_wait_s: float | None = None) -> None:
        config = jsapi.ConsumerConfig(
            durable_name=spec.durable,
            description=spec.description,
            deliver_policy=jsapi.DeliverPolicy.ALL,
            ack_policy=jsapi.AckPolicy.EXPLICIT,
            ack_wait=ack_wait_s or self.settings.ack_wait_s,
            # no server-side limit: the runner enforces spec.max_deliver, so it can still dead-letter (or
            # retry dead-lettering) on the last delivery instead of the server dropping the message
            max_deliver=-1,
            filter_subjects=list(spec.filter_subjects),
            max_ack_pending=1000,
        )
        await self.js.add_consumer(spec.stream, config)

    async def kv(self, bucket: BucketSpec) -> KeyValue:
        if bucket.name not in self._kv:
            return await self.ensure_bucket(bucket)
        return self._kv[bucket.name]

    async def store(self, bucket: BucketSpec, model: type[M]) -> Store[M]:
        return Store(await self.kv(bucket), bucket.name, model)

    # ------------------------------------------------------------------ publish
    async def publish(self, event: Envelope) -> PublishResult:
        """Publish durably with ``Nats-Msg-Id`` = the event id; returns once JetStream has stored it."""
        return await self.publish_raw(
            event.nats_subject,
            encode(event),
            {"Nats-Msg-Id": event.id, "Content-Type": CONTENT_TYPE, "Ce-Type": event.type},
        )

    async def publish_raw(self, subject: str, payload: bytes, headers: dict[str, str]) -> PublishResult:
        try:
            ack = await self.js.publish(subject, payload, headers=headers)
        except nats.errors.MaxPayloadError as exc:
            raise PermanentError(f"{len(payload)} bytes exceed the server's max_payload") from exc
        except (nats.errors.Error, OSError) as exc:  # timeouts, no responders/stream, closed/reset connections
            raise TransientError(f"publish to {subject} failed: {exc!r}") from exc
        result = PublishResult(stream=ack.stream, seq=ack.seq, duplicate=bool(ack.duplicate))
        log.debug("published", subject=subject, msg_id=headers.get("Nats-Msg-Id"), duplicate=result.duplicate)
        return result

    async def request(self, subject: str, payload: bytes, timeout_s: float = 5.0) -> bytes:
        msg = await self.nc.request(subject, payload, timeout=timeout_s)
        data: bytes = msg.data
        return data
