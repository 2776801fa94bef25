"""Follow a KV bucket live: an initial snapshot, then every change, read again from scratch after a failure.

Services that serve what a bucket holds (the gateway its triggers, human-interaction its user directory)
keep an in-memory view equal to the bucket on every replica. :class:`KvWatch` is the one loop behind it::

    async with KvWatch(bus, kv, "trigger store", apply=..., forget=..., loaded=..., changed=...).watching():
        ...  # the snapshot is applied: the replica serves the store's content

- ``watching()`` returns once everything stored has been applied (``apply`` per entry, then ``forget`` with
  the keys the snapshot saw, so the view drops what was deleted meanwhile, then ``loaded``). A replica is
  ready only then.
- Afterwards each change is applied as it comes (``apply``, then ``changed``).
- A watch that fails (the bus went away), ends, or outlives a reconnect (nats-py's ordered consumer behind
  a KV watch notices a restarted server only after ~20 s on its own) is started again after ``rewatch_s``
  from a full snapshot; meanwhile :meth:`check` fails (``/readyz`` 503) and the last known view is served.

``apply`` gets the raw :class:`~nats.js.kv.KeyValue.Entry` (a delete or purge has no value) and decides
what it means; an exception it raises fails the watch like a bus failure would, so it should handle its
own unreadable records.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import nats.errors
import structlog
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from temporality_bus.connection import Bus
from temporality_bus.tasks import cancel_and_wait

__all__ = ["KvWatch", "entry_value"]

log = structlog.get_logger(__name__)

#: How long the snapshot may take before the watch counts as failed.
SNAPSHOT_TIMEOUT_S = 30.0
#: After nats-py's initial marker, how long to wait for the bucket's last revision before taking it as gone.
_AFTER_MARKER_S = 2.0


def entry_value(entry: KeyValue.Entry) -> bytes | None:
    """The entry's value, or ``None`` when it deletes or purges its key (or carries no value)."""
    if entry.operation in (KV_DEL, KV_PURGE) or not entry.value:
        return None
    return entry.value


async def _nothing() -> None:
    return None


class KvWatch:
    def __init__(
        self,
        bus: Bus,
        kv: KeyValue,
        name: str,
        *,
        apply: Callable[[KeyValue.Entry], Awaitable[None]],
        forget: Callable[[set[str]], Awaitable[None]],
        loaded: Callable[[], Awaitable[None]] = _nothing,
        changed: Callable[[], Awaitable[None]] = _nothing,
        rewatch_s: float = 1.0,
        reconnect_check_s: float = 2.0,
    ) -> None:
        self.bus = bus
        self.kv = kv
        self.name = name
        self._apply = apply
        self._forget = forget
        self._loaded = loaded
        self._changed = changed
        self.rewatch_s = rewatch_s
        self.reconnect_check_s = reconnect_check_s
        self._watching = False
        self._failure: str | None = None

    async def check(self) -> None:
        """The readiness check: the watch runs."""
        if not self._watching:
            raise RuntimeError(self._failure or f"the {self.name} is not watched yet")

    def _reconnects(self) -> int:
        return int(self.bus.nc.stats.get("reconnects", 0))

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Apply the snapshot, then follow the bucket until the context exits."""
        reconnects = self._reconnects()
        watcher = await self._snapshot()
        task = asyncio.create_task(self._follow(watcher, reconnects), name=f"{self.name} watch")
        try:
            yield
        finally:
            await cancel_and_wait(task)  # a cancellation nats-py's wait_for dropped would leave it following

    async def _snapshot(self) -> KeyValue.KeyWatcher:
        """Apply everything stored. nats-py's "initial values done" marker (``None``) alone is not proof: when
        the server has already sent the entries but the client has not read them when it asks the consumer
        how many are pending (0), the marker comes *first* and the entries after it (seen in CI: a watch that
        returned with an empty view of a bucket holding two keys). So the snapshot also waits until it has
        seen the bucket's last revision as of before the watch started: that message is the newest of its
        key, so the last-per-key delivery sends it -- unless it expired or was purged meanwhile, which a
        short silence after the marker stands for."""
        last = (await self.kv.status()).stream_info.state.last_seq or 0
        watcher = await self.kv.watchall()
        seen: set[str] = set()
        newest, marked = 0, False
        while not (marked and newest >= last):
            try:
                entry = await watcher.updates(timeout=_AFTER_MARKER_S if marked else SNAPSHOT_TIMEOUT_S)  # type: ignore[no-untyped-call]
            except nats.errors.TimeoutError:
                if not marked:
                    raise
                log.warning("kv.snapshot_short", store=self.name, newest=newest, expected=last)
                break
            if entry is None:  # the initial marker
                marked = True
                continue
            seen.add(entry.key)
            newest = max(newest, entry.revision or 0)
            await self._apply(entry)
        await self._forget(seen)
        self._watching = True
        self._failure = None
        await self._loaded()
        return watcher

    async def _follow(self, watcher: KeyValue.KeyWatcher, reconnects: int) -> None:
        while True:
            try:
                while True:
                    try:
                        entry = await watcher.updates(timeout=self.reconnect_check_s)  # type: ignore[no-untyped-call]
                    except nats.errors.TimeoutError:
                        if self._reconnects() != reconnects:  # the server restarted or we moved: read it all again
                            raise RuntimeError("the connection was re-established") from None
                        continue
                    if isinstance(entry, type(KeyValue.KeyWatcher.STOP_ITER)):
                        raise RuntimeError(f"the {self.name} watch ended")
                    if entry is None:
                        continue
                    await self._apply(entry)
                    await self._changed()
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await watcher.stop()  # type: ignore[no-untyped-call]
                raise
            except Exception as exc:
                self._watching = False
                self._failure = f"the {self.name} watch failed: {exc!r}"
                log.warning("kv.watch_failed", watch=self.name, error=repr(exc))
                with contextlib.suppress(Exception):
                    await watcher.stop()  # type: ignore[no-untyped-call]
                await asyncio.sleep(self.rewatch_s)
                try:
                    reconnects = self._reconnects()
                    watcher = await self._snapshot()
                except Exception as again:
                    self._failure = f"the {self.name} cannot be read: {again!r}"
                    log.warning("kv.watch_failed", watch=self.name, error=repr(again))
