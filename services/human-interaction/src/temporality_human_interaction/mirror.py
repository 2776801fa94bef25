"""``human-channels`` as this replica last saw it, kept current by a KV watch (HUM-3, the retention sweep).

The retention sweep needs every key of ``human-channels`` (the run entries say which requests may be due, the
inbox entries what to repair, the parked requests what to resume, the rest which references nothing needs any
more). Listing the bucket at every sweep reads every key of every open request again, once per sweep interval,
on every replica, however few of them changed. :class:`ChannelMirror` reads the bucket once, when the service
starts (the watch's snapshot), and from then on only what changes: each write and delete is delivered once by
the watch. A sweep then reads the mirror, not the bucket: what it costs the server is what changed since the
last sweep (:attr:`ChannelMirror.delivered`), not how many requests are open.

Before a sweep uses it, :meth:`ChannelMirror.caught_up` waits until the mirror has applied the bucket's last
revision as of that moment (one ``stream_info`` call), so a sweep sees at least everything written before it
began -- what a listing taken then would have shown. When the watch is down (the bus went away; it restarts
from a new snapshot on its own) or does not catch up in time, the sweep lists the bucket as before.

What the mirror costs instead: the keys of ``human-channels`` in memory on each replica (about 360 bytes of
Python heap each: 10k open requests delivered on Telegram, six keys each, hold 20.5 MiB, 35.4 MiB resident --
``bench/human_mirror_memory.py``), and every write delivered to every replica.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from datetime import datetime

import structlog
from nats.js.kv import KeyValue
from pydantic import ValidationError

from temporality_bus import Bus, KvWatch, entry_value
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRef

__all__ = ["ChannelEntry", "ChannelMirror", "to_channel_entry"]

log = structlog.get_logger(__name__)

#: How long :meth:`ChannelMirror.caught_up` waits for the watch to apply the bucket's last revision.
CATCH_UP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ChannelEntry:
    """One key of ``human-channels`` as the sweep reads it."""

    key: str
    value: str
    created_at: datetime
    revision: int
    #: The request's deadline on an index entry (``open.*``, ``run.*``); None elsewhere and on old entries.
    expires_at: datetime | None = None
    #: On an inbox entry: how many people its request is indexed under (None: an older version's entry).
    people: int | None = None
    #: On a run entry: when its request ended (None: pending, or the mark was lost).
    ended_at: datetime | None = None


def to_channel_entry(entry: KeyValue.Entry) -> ChannelEntry | None:
    """The entry as the sweep reads it, or None when it deletes its key or its value is not a channel
    reference (not ours to judge)."""
    value = entry_value(entry)
    if value is None:
        return None
    try:
        ref = ChannelRef.model_validate_json(value)
    except ValidationError:
        return None
    return ChannelEntry(
        str(entry.key),
        ref.value,
        ref.created_at,
        int(entry.revision or 0),
        ref.expires_at,
        ref.people,
        ref.ended_at,
    )


class ChannelMirror:
    """Every live key of ``human-channels`` with its reference, applied from a KV watch (see the module)."""

    def __init__(self, bus: Bus, kv: KeyValue) -> None:
        self._bus = bus
        self._kv = kv
        self._entries: dict[str, ChannelEntry] = {}
        #: The highest revision applied (a delete counts too: it is a message of the bucket's stream).
        self.revision = 0
        #: How many keys the watch has delivered since it started, its snapshots included: what the mirror read.
        self.delivered = 0
        self._advanced = asyncio.Event()
        self._watch = KvWatch(bus, kv, "human-channels mirror", apply=self._apply, forget=self._forget)

    @classmethod
    async def open(cls, bus: Bus) -> ChannelMirror:
        return cls(bus, await bus.kv(BUCKET_HUMAN_CHANNELS))

    def watching(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Read the bucket once, then apply each change until the context exits."""
        return self._watch.watching()

    async def check(self) -> None:
        """Raises while the watch is down."""
        await self._watch.check()

    async def _apply(self, entry: KeyValue.Entry) -> None:
        self.delivered += 1
        self.revision = max(self.revision, int(entry.revision or 0))
        found = to_channel_entry(entry)
        if found is None:  # deleted, purged, or not a reference
            self._entries.pop(str(entry.key), None)
        else:
            self._entries[found.key] = found
        self._advanced.set()

    async def _forget(self, seen: set[str]) -> None:
        """After a (re-)snapshot: drop what the bucket no longer holds."""
        for key in set(self._entries) - seen:
            del self._entries[key]

    async def caught_up(self, timeout_s: float = CATCH_UP_TIMEOUT_S) -> bool:
        """Whether the mirror holds the bucket as of now: the watch runs and has applied the bucket's last
        revision (waited for up to ``timeout_s``). False: list the bucket instead."""
        try:
            await self.check()
            last = int((await self._kv.status()).stream_info.state.last_seq or 0)
        except Exception as exc:
            log.info("mirror.unavailable", error=repr(exc))
            return False
        try:
            async with asyncio.timeout(timeout_s):
                while self.revision < last:
                    self._advanced.clear()
                    await self._advanced.wait()
        except TimeoutError:
            # the last message may be gone from the stream (a key's history limit): a listing decides then
            log.info("mirror.behind", revision=self.revision, last=last)
            return False
        return True

    def entries(self) -> list[ChannelEntry]:
        """The mirrored entries in revision order (the order a listing gives)."""
        return sorted(self._entries.values(), key=lambda e: e.revision)
