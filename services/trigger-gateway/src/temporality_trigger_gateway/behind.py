"""Writes that need not hold an answer back, batched into one pipelined round (issue 7, intake speed).

A launch answers once JetStream acked what the answer reports: the claim, then ``trigger.received`` +
``trigger.accepted`` + ``run.requested`` with the delivery's record (:mod:`.launch`). One more write follows every
new launch -- the claim's ``published`` mark -- and it is not part of what the answer reports: it only spares a
later copy of the event the wait for the claim's lease. It is queued here and written *behind* the answers, with
the records a launch could not send with its events (a ``failed`` delivery's, whose outcome is known only after
that round; a record the bus did not take, written again): one task per Bus sends whatever is queued as one
:meth:`temporality_bus.Pipeline.send`, and while that round is in flight the next launches' writes gather for
the one after (under load, one round carries the writes of many launches).

Read-your-writes within the process: :meth:`WriteBehind.settled` returns once every write queued before
the call was acknowledged (or failed) and its follow-up ran; the deliveries API and a claim found taken
await it before reading, so this replica never reads a record or a claim older than what it answered.
Another replica may see them a round trip later. A process that dies with writes queued loses them: a
claim left ``claimed`` is taken over after its lease by a copy of the event, which republishes the same
derived ids (deduplicated by JetStream) -- the crash the claim was built for; a lost ``failed`` record leaves
a delivery answered 503 unlisted (its sender retries as a new delivery; the journal has its events).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import structlog

from temporality_bus import BusError, PermanentError, PublishResult, TransientError
from temporality_bus.pipeline import Write

if TYPE_CHECKING:
    from temporality_bus import Bus

__all__ = ["Settle", "WriteBehind"]

log = structlog.get_logger(__name__)

#: What to do with the outcomes of one job's writes (in order), once they are known.
Settle = Callable[[list[PublishResult | BusError]], Awaitable[None]]

_BY_BUS: WeakKeyDictionary[Bus, WriteBehind] = WeakKeyDictionary()


class WriteBehind:
    """The write-behind queue of one :class:`~temporality_bus.Bus` (:meth:`of`: shared by every launcher,
    deliveries store and API of the process on that Bus, so :meth:`settled` covers all of their writes)."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._queued: list[tuple[Sequence[Write], Settle | None]] = []
        #: Done when the queued jobs (not yet sent) are written and settled.
        self._next: asyncio.Future[None] | None = None
        #: Done when the round in flight is written and settled.
        self._current: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, bus: Bus) -> WriteBehind:
        found = _BY_BUS.get(bus)
        if found is None:
            found = _BY_BUS[bus] = cls(bus)
        return found

    @property
    def pending(self) -> int:
        """Jobs queued and not yet sent."""
        return len(self._queued)

    def add(self, writes: Sequence[Write], settle: Settle | None = None) -> None:
        """Queue ``writes`` (``settle`` takes their outcomes). Never raises and never waits."""
        if not writes:
            return
        self._queued.append((writes, settle))
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="trigger-gateway.write-behind")

    async def settled(self) -> None:
        """Return once everything queued before this call was written (or failed) and settled (at once when
        called from a follow-up of this queue, which runs inside a round)."""
        if self._task is not None and asyncio.current_task() is self._task:
            return
        if self._queued and (self._task is None or self._task.done()):  # its task was cancelled mid-way
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="trigger-gateway.write-behind")
        waiting = [f for f in (self._current, self._next) if f is not None and not f.done()]
        for future in waiting:
            await asyncio.shield(future)

    async def _drain(self) -> None:
        while self._queued:
            jobs, self._queued = self._queued, []
            done, self._next = self._next, None
            self._current = done
            try:
                await self._round(jobs)
            finally:
                self._current = None
                if done is not None and not done.done():
                    done.set_result(None)

    async def _round(self, jobs: list[tuple[Sequence[Write], Settle | None]]) -> None:
        writes = [write for batch, _ in jobs for write in batch]
        results: list[PublishResult | BusError] = [TransientError("not sent")] * len(writes)
        # One write too large for the server must not keep the others (other launches' writes) from going out.
        limit = self._bus.nc.max_payload
        sendable = [i for i, write in enumerate(writes) if len(write.payload) <= limit]
        for i in set(range(len(writes))) - set(sendable):
            results[i] = PermanentError(f"{len(writes[i].payload)} bytes exceed the server's max_payload")
        try:
            if not self._bus.nc.is_connected:
                raise TransientError("the event bus is not connected")
            sent = await self._bus.pipeline.send([writes[i] for i in sendable])
        except Exception as exc:  # not connected, max_payload shrank meanwhile: each write failed alike
            error = exc if isinstance(exc, BusError) else TransientError(repr(exc))
            sent = [error] * len(sendable)
        for i, outcome in zip(sendable, sent, strict=True):
            results[i] = outcome
        at = 0
        for batch, settle in jobs:
            outcomes, at = results[at : at + len(batch)], at + len(batch)
            if settle is None:
                continue
            try:
                await settle(outcomes)
            except Exception as exc:  # a follow-up is best effort like the writes themselves
                log.warning("write_behind.settle_failed", error=repr(exc))
