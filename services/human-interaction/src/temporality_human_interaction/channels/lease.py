"""Which replica runs a chat channel's inbound side: a lease in ``human-channels`` (issue 11).

Telegram lets one client at a time long-poll ``getUpdates`` for a bot (a second gets ``409 Conflict``), and a
Matrix account synced by every replica would process each answer once per replica. So with N replicas
exactly one at a time runs a channel's inbound side (Telegram polling, Matrix sync); every replica still
sends (questions, edits, notifications), which needs no inbound side.

The lease is one key of ``human-channels``, ``lease.<channel>.<account>`` (the Telegram bot id, the Matrix
user id hashed), holding a :class:`~.refs.ChannelRef` whose ``value`` is the holder (``<host>/<pid>/<random>``)
and ``expires_at`` when the holder's last renewal runs out (for people reading the bucket; nobody's clock is
compared with another's):

* the holder renews it every ``renew_s`` by compare-and-set on the revision it wrote last; a lost
  compare-and-set (someone took it over) or no successful renewal for ``ttl_s - renew_s`` (the bus is
  unreachable: another replica may take it after ``ttl_s``) stops its inbound side;
* every other replica reads the key every ``renew_s``: absent, it creates it (create-if-absent, one
  winner); present at the same revision for ``ttl_s`` of its *own* monotonic clock (the holder stopped
  renewing: it died), it takes it over by compare-and-set on that revision (one winner);
* a holder that shuts down deletes the key at its revision, so another replica takes over at its next
  read (within ``renew_s``), not after ``ttl_s``.

Starting and stopping the inbound side is the adapter's (:attr:`InboundLease.on_change`, awaited after
each change of :attr:`InboundLease.held`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import structlog

from temporality_bus import AlreadyExists, Bus, Conflict, Store
from temporality_bus.tasks import cancel_and_wait
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRef, ref_key

__all__ = ["DEFAULT_RENEW_S", "DEFAULT_TTL_S", "InboundLease", "holder_id", "lease_key"]

log = structlog.get_logger(__name__)

#: How long a lease lasts past its holder's last renewal (as the other replicas see it).
DEFAULT_TTL_S = 15.0
#: How often the holder renews, and how often the others look.
DEFAULT_RENEW_S = 3.0


def lease_key(channel: str, account: str) -> str:
    """``lease.<channel>.<account>`` (an account that is no safe key part is hashed, :func:`~.refs.ref_key`)."""
    return ref_key("lease", channel, account)


def holder_id() -> str:
    """This process, as a lease holder: ``<host>/<pid>/<random>`` (two adapters in one process differ)."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"


class InboundLease:
    """One channel's inbound lease as one replica sees it; :meth:`start` it, :meth:`stop` releases it."""

    def __init__(
        self,
        bus: Bus,
        key: str,
        *,
        holder: str | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        renew_s: float = DEFAULT_RENEW_S,
    ) -> None:
        if not 0 < renew_s < ttl_s:
            raise ValueError(f"the lease's renewal interval ({renew_s} s) must be shorter than its ttl ({ttl_s} s)")
        self._bus = bus
        self.key = key
        self.holder = holder or holder_id()
        self.ttl_s = ttl_s
        self.renew_s = renew_s
        #: Awaited after :attr:`held` changed (the adapter starts or stops its inbound side).
        self.on_change: Callable[[], Awaitable[None]] | None = None
        self._store: Store[ChannelRef] | None = None
        self._held = False
        self._revision: int | None = None  # ours, while held
        self._renewed_at = 0.0  # monotonic time of our last successful write
        self._seen: tuple[int, float] | None = None  # someone else's revision, and since when we see it
        self._task: asyncio.Task[None] | None = None

    @property
    def held(self) -> bool:
        return self._held

    async def start(self) -> None:
        """Take the lease now if it is free, then keep it (or keep trying) in the background."""
        if self._task is not None:
            return
        with contextlib.suppress(Exception):  # the bus is down: the loop goes on trying
            await self._step()
        self._task = asyncio.create_task(self._run(), name=f"lease {self.key}")

    async def stop(self) -> None:
        """Stop renewing and, when held, release the lease (delete at our revision) so another takes it at once."""
        task, self._task = self._task, None
        if task is not None:  # cancelled until it ends: nats-py's wait_for can drop one cancellation (3.11)
            with contextlib.suppress(Exception):
                await cancel_and_wait(task)
        revision, self._revision = self._revision, None
        if self._held:
            await self._set(held=False)
        if revision is not None:
            try:
                kv = await self._bus.kv(BUCKET_HUMAN_CHANNELS)
                await kv.delete(self.key, last=revision)
                log.info("lease.released", key=self.key, holder=self.holder)
            except Exception as exc:  # taken over meanwhile, or the bus is down: it runs out after ttl_s
                log.warning("lease.release_failed", key=self.key, error=repr(exc))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.renew_s)  # the renewal period, not a test wait
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("lease.step_failed", key=self.key, error=repr(exc))
            if self._held and asyncio.get_running_loop().time() - self._renewed_at > self.ttl_s - self.renew_s:
                log.warning("lease.expired", key=self.key, holder=self.holder)  # could not renew in time
                self._revision = None
                await self._set(held=False)

    async def _open(self) -> Store[ChannelRef]:
        if self._store is None:
            self._store = await self._bus.store(BUCKET_HUMAN_CHANNELS, ChannelRef)
        return self._store

    def _value(self) -> ChannelRef:
        now = datetime.now(UTC)
        return ChannelRef(value=self.holder, created_at=now, expires_at=now + timedelta(seconds=self.ttl_s))

    async def _step(self) -> None:
        """Renew the lease we hold, or take it when it is free or ran out."""
        store = await self._open()
        now = asyncio.get_running_loop().time()
        if self._held and self._revision is not None:
            try:
                self._revision = await store.update(self.key, self._value(), self._revision)
            except Conflict:
                got = await store.get(self.key)
                if got is not None and got.value.value == self.holder:  # our renewal landed, its answer was lost
                    self._revision = got.revision
                    return
                log.warning("lease.lost", key=self.key, holder=self.holder)
                self._revision = None
                await self._set(held=False)
                return
            self._renewed_at = now
            return
        got = await store.get(self.key)
        try:
            if got is None:
                self._revision = await store.create(self.key, self._value())
            elif got.value.value == self.holder:  # ours (a renewal whose answer was lost): carry on
                self._revision = await store.update(self.key, self._value(), got.revision)
            else:
                if self._seen is None or self._seen[0] != got.revision:
                    self._seen = (got.revision, now)
                    return
                if now - self._seen[1] < self.ttl_s:
                    return
                log.info("lease.taking_over", key=self.key, previous=got.value.value)
                self._revision = await store.update(self.key, self._value(), got.revision)
        except (AlreadyExists, Conflict):
            return  # another replica was quicker
        self._seen = None
        self._renewed_at = now
        log.info("lease.acquired", key=self.key, holder=self.holder)
        await self._set(held=True)

    async def _set(self, *, held: bool) -> None:
        if self._held == held:
            return
        self._held = held
        if self.on_change is not None:
            try:
                await self.on_change()
            except Exception as exc:
                log.warning("lease.on_change_failed", key=self.key, held=held, error=repr(exc))
