"""EventLog: read the journal stream (temporality.events.>) from the start and wait on events, never sleep.

``EventLog(nc, since=moment)`` reads only what the server stored from ``moment`` on (JetStream's
``by_start_time``): a test sharing a stack with others waits on what happened since it began.
``await EventLog.connect(url, since=moment)`` is the same on a connection of its own, which
:meth:`EventLog.close` drains (a test's whole teardown of it: one call in its ``finally``).

A message on the stream that is not a CloudEvent at all (a poison message a test published) is kept in
:attr:`EventLog.undecodable` instead of the events, so that :meth:`EventLog.caught_up` still counts it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime

import nats
from nats.aio.client import Client as NATS
from nats.js.api import ConsumerConfig, DeliverPolicy

from temporality_protocol import Envelope, InvalidEnvelope, decode
from temporality_protocol.catalog import EVENTS_PREFIX, EVENTS_STREAM

__all__ = ["EventLog"]


class EventLog:
    def __init__(self, nc: NATS, subject: str = f"{EVENTS_PREFIX}.>", *, since: datetime | None = None) -> None:
        self._nc = nc
        self._subject = subject
        #: Only the messages stored from this moment on (timezone-aware); None: the whole stream.
        self.since = since
        self.events: list[Envelope] = []
        #: The raw messages on the subject that are not CloudEvents (poison), in the order read.
        self.undecodable: list[bytes] = []
        self._changed = asyncio.Condition()
        self._sub: object | None = None
        self._owns_connection = False

    @classmethod
    async def connect(
        cls, nats_url: str, subject: str = f"{EVENTS_PREFIX}.>", *, since: datetime | None = None
    ) -> EventLog:
        """A started EventLog on a connection of its own to ``nats_url``; :meth:`close` ends both."""
        nc = await nats.connect(nats_url)
        try:
            log = await cls(nc, subject, since=since).start()
        except BaseException:
            await nc.close()
            raise
        log._owns_connection = True
        return log

    async def start(self) -> EventLog:
        js = self._nc.jetstream()

        async def on_msg(msg: object) -> None:
            data: bytes = msg.data  # type: ignore[attr-defined]
            try:
                event = decode(data)
            except InvalidEnvelope:
                async with self._changed:
                    self.undecodable.append(data)
                    self._changed.notify_all()
                return
            async with self._changed:
                self.events.append(event)
                self._changed.notify_all()

        if self.since is None:
            self._sub = await js.subscribe(
                self._subject, cb=on_msg, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
            )
        else:
            self._sub = await js.subscribe(
                self._subject,
                cb=on_msg,
                ordered_consumer=True,
                config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=self.since),
            )
        return self

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()  # type: ignore[attr-defined]

    async def close(self) -> None:
        """:meth:`stop`, and drain the connection when :meth:`connect` opened it."""
        await self.stop()
        if self._owns_connection:
            await self._nc.drain()

    def of_type(self, event_type: str, run_id: str | None = None) -> list[Envelope]:
        return [e for e in self.events if e.type == event_type and (run_id is None or e.runid == run_id)]

    async def wait_for(
        self,
        event_type: str,
        *,
        run_id: str | None = None,
        where: Callable[[Envelope], bool] = lambda _e: True,
        count: int = 1,
        timeout_s: float = 30.0,
    ) -> list[Envelope]:
        """Wait until ``count`` matching events have been seen; return them (TimeoutError says what was seen)."""

        def matches() -> list[Envelope]:
            return [e for e in self.of_type(event_type, run_id) if where(e)]

        try:
            async with asyncio.timeout(timeout_s):
                async with self._changed:
                    await self._changed.wait_for(lambda: len(matches()) >= count)
        except TimeoutError:
            seen = [(e.type, e.runid) for e in self.events]
            raise TimeoutError(f"waited {timeout_s}s for {count}x {event_type} (run {run_id}); saw {seen}") from None
        return matches()

    async def caught_up(self, timeout_s: float = 30.0) -> list[Envelope]:
        """Wait until this log holds every message the stream held on our subject when called; return the log.

        The settle step before asserting "nothing more happened" (still one ``run.completed``...): once a
        consumer has acked a message, whatever it published is on the stream, but not yet necessarily here.
        Poison messages on the subject count too (:attr:`undecodable`). Only for a log of the whole stream
        (without ``since``): it compares with the stream's count.
        """
        if self.since is not None:
            raise ValueError("caught_up compares with the whole stream's count: not for an EventLog with since")
        info = await self._nc.jetstream().stream_info(EVENTS_STREAM.name, subjects_filter=self._subject)
        target = sum((info.state.subjects or {}).values())
        try:
            async with asyncio.timeout(timeout_s):
                async with self._changed:
                    await self._changed.wait_for(lambda: len(self.events) + len(self.undecodable) >= target)
        except TimeoutError:
            have = len(self.events) + len(self.undecodable)
            raise TimeoutError(f"waited {timeout_s}s for {target} events on {self._subject}; have {have}") from None
        return self.events
