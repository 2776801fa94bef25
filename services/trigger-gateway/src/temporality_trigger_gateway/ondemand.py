"""A durable consumer that pulls only while something needs it (TRG-6: with no enabled event trigger the
journal is not tailed at all).

The ``trigger-gateway-events`` consumer serves the event triggers and the release of concurrency keys (a
run's end frees its key). Each replica decides from what its own registry serves, after every store change
it applies::

    an enabled event trigger, or any trigger with ``concurrency``  -> pull (start the pull subscription)
    neither                                                       -> stop pulling (in-flight messages
                                                                     finish, the subscription is dropped)

Every replica watches the same store, so all of them pull, or none does, within the watch's latency. The
durable consumer itself is created when the service starts and never deleted: its acknowledged position
is the cursor. While nobody pulls, the server keeps the events of its filter for it; when pulling starts
again they are handed over first. An event trigger enabled meanwhile never fires on them (its activation,
``active_from_seq``, is the stream's tail when it was enabled: they are at or before it), so it fires on
events from its activation on, and the events are passed over without a KV read. Deleting the durable to
skip them instead would lose events: a replica whose watch lags could delete it after another replica had
started pulling for a trigger enabled a moment ago.

The runtime sees an :class:`OnDemandConsumer` as running (``/readyz``) while its supervisor runs, pulling
or idle; :attr:`OnDemandConsumer.pulling` says which.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import nats.errors
import structlog

from temporality_bus import Bus, Consumer
from temporality_bus.consumer import ConsumerObserver, EnvelopeHandler
from temporality_protocol.catalog import ConsumerSpec

__all__ = ["OnDemandConsumer"]

log = structlog.get_logger(__name__)

#: After a failed start (the bus away for a moment), the next attempt.
_RETRY_S = 1.0


class OnDemandConsumer(Consumer):
    """Runs the durable ``spec`` with ``handler`` while :meth:`want` was last told ``True``."""

    def __init__(
        self,
        bus: Bus,
        spec: ConsumerSpec,
        *,
        handler: EnvelopeHandler,
        observer: ConsumerObserver | None = None,
        fetch_timeout_s: float = 1.0,
    ) -> None:
        super().__init__(bus, spec, handler=handler, observer=observer, fetch_timeout_s=fetch_timeout_s)
        #: The consumer that actually pulls (its ``running`` is :attr:`pulling`).
        self._inner = Consumer(bus, spec, handler=handler, observer=observer, fetch_timeout_s=fetch_timeout_s)
        self._wanted = False
        self._changed = asyncio.Event()
        #: How many times pulling started (tests, logs).
        self.starts = 0

    @property
    def pulling(self) -> bool:
        """Whether the pull subscription is bound and messages are being fetched."""
        return self._inner.running.is_set()

    @property
    def wanted(self) -> bool:
        return self._wanted

    @property
    def lag_matters(self) -> bool:
        """Not while it is neither wanted nor pulling: the events kept for it meanwhile are passed over when pulling
        starts (an event trigger fires on events from its activation on), so their count is no lag -- with no
        event trigger it would grow by every run's events and raise the consumer-lag alert for nothing."""
        return self._wanted or self.pulling

    def want(self, wanted: bool, *, why: str = "") -> None:
        """Pull (``True``) or stop pulling (``False``); takes effect at once, idempotent."""
        if wanted != self._wanted:
            self._wanted = wanted
            log.info("consumer.on_demand", consumer=self.spec.durable, pull=wanted, why=why)
        self._changed.set()

    async def run(self, stop: asyncio.Event) -> None:
        # The durable exists from the start, so its position is defined before any trigger is enabled (a
        # durable created later, deliver-new, would skip the events stored in between).
        await self.bus.ensure_consumer(self.spec, ack_wait_s=self._ack_wait)
        self.running.set()
        stopper = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                if not self._wanted:
                    await self._until_changed(stopper)
                    continue
                inner_stop = asyncio.Event()
                self.starts += 1
                pulling = asyncio.create_task(self._inner.run(inner_stop), name=f"pull:{self.spec.durable}")
                try:
                    while self._wanted and not stop.is_set() and not pulling.done():
                        await self._until_changed(stopper, pulling)
                finally:
                    inner_stop.set()
                    failed = await self._finished(pulling)  # in-flight messages finish, then it unsubscribes
                if failed is not None:
                    # binding the subscription failed (the bus was away for a moment): try again, rather than
                    # stop the service because a trigger was enabled during a blip
                    log.warning("consumer.on_demand_start_failed", consumer=self.spec.durable, error=repr(failed))
                    pause = asyncio.ensure_future(asyncio.sleep(_RETRY_S))
                    try:
                        await self._until_changed(stopper, pause)
                    finally:
                        pause.cancel()
                    continue
                if self._wanted and not stop.is_set():
                    raise RuntimeError(f"consumer {self.spec.durable} stopped pulling on its own")
        finally:
            stopper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stopper
            self.running.clear()

    @staticmethod
    async def _finished(pulling: asyncio.Task[None]) -> BaseException | None:
        """Wait for the pull loop to end; the bus error it failed with (``None``: it stopped cleanly). Any
        other error propagates: it is a bug, and the service stops (the runtime's rule for consumers)."""
        try:
            await pulling
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            return exc
        return None

    async def _until_changed(self, *also: asyncio.Future[Any]) -> None:
        self._changed.clear()
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait({changed, *also}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await changed
