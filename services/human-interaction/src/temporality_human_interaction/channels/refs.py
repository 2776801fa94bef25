"""What a transport needs to bind a reply, kept in KV so it survives a restart (HUM-3).

One bucket, :data:`BUCKET_HUMAN_CHANNELS` (``human-channels``), written create-if-absent so two
replicas (or a redelivered ``human.requested``) agree on one value per key. Keys are dot-separated
and namespaced by transport; a part that is not a safe KV token (a Matrix event id ``$x:server``,
a user id ``@bob:example.org``) is replaced by its SHA-256, so any transport id can be a key part:

=====================================  ==========================================================
key                                    value
=====================================  ==========================================================
``telegram.req.<request id>``          the callback token of that request's buttons
``telegram.token.<token>``             request id an inline button's callback token stands for
``telegram.msg.<chat>.<message id>``   request id a question message carries (free-text replies), or a reply
                                       of the bot's is about (a confirmation, a refusal): a reply to it is one
                                       to that request
``telegram.hint.<chat>.<message id>``  a request id listed in a hint of the bot's that lists several open
                                       questions (a reply to it is never bound: the hint again)
``matrix.event.<event id>``            request id a Matrix question event carries, or a notice of the bot's
                                       is about (a confirmation, a refusal)
``matrix.hint.<event id>``             like ``telegram.hint.*``: a notice listing several open questions
``matrix.room.<matrix user id>``       the DM room with that person, created once and reused
``matrix.latest.<room id>``            request id of the newest question in that room (overwritten)
``matrix.asked.<room id>.<request id>`` the request id: a question asked in that room (a bare message binds
                                       to the room's one open question)
``matrix.since.<bot user id>``         the sync ``next_batch`` the adapter resumes from (overwritten)
``run.<run id>.<request id>``          the request id, its ``expires_at``, who may answer it (``answerers``)
                                       and, once it ended, ``ended_at`` and ``ended`` (how: answered,
                                       expired, cancelled): the run's requests (see :mod:`..runs`), what the
                                       sweep reads instead of the request keys, and the inbox's index
                                       (:mod:`..inbox`: a person's open requests, from the mirror of it)
``runend.<run id>``                    the event type that ended the run
``notify.<notification id>``           the channel that sent that notification, and its ``event``: the
                                       ``human.notification_delivered`` that journals it (see :mod:`..notifications`)
``open.<user id>.<request id>``        written by versions before 2026-12-06 only (the inbox index then: the
                                       request id, its ``expires_at`` and ``people``); still read by the inbox
                                       and dropped once its request ended (:mod:`..inbox`)
``policy.<run id>``                    the run's human policy from its ``run.requested`` (:mod:`..policies`)
``parked.<run id>.<request id>``       a ``human.requested`` waiting for its run's policy (:mod:`..parking`)
``lease.<channel>.<account>``          the replica polling / syncing that chat account now, and when its lease
                                       runs out (:mod:`.lease`; issue 11)
=====================================  ==========================================================

An entry's ``expires_at`` (the request's deadline, which never changes) lets the request gauges
(:mod:`..metrics`) count from the index and the retention sweep skip requests that cannot be due yet,
without reading their records. Entries written before it existed have none: the gauges read the record
instead (and write nothing); the start-up rebuild and the retention sweep fill it in (compare-and-set,
:func:`..inbox.rebuild_index`), with ``people`` and ``ended_at`` likewise.

The retention sweep (:mod:`..inbox`) purges every key here that belongs to a purged request, a
notification or an ended run (past the retention); ``matrix.room.*``, ``matrix.since.*`` and ``lease.*`` stay.

The bucket is ensured by this service on first use (it is not in the shared catalogue yet).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from temporality_bus import AlreadyExists, Bus, Conflict, Contended, Store
from temporality_protocol.catalog import BUCKET_HUMAN_CHANNELS

__all__ = ["BUCKET_HUMAN_CHANNELS", "ChannelRef", "ChannelRefs", "ids_of", "ref_key", "stands_for_another"]

#: :meth:`ChannelRefs.mark_ended` reads the entry and tries its compare-and-set this many times before giving up.
MARK_ATTEMPTS = 5

_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_HASHED = re.compile(r"^[0-9a-f]{40}$")


def stands_for_another(part: str) -> bool:
    """Whether a key part may be the hash :func:`ref_key` put for a part it could not use as it was (then the
    entry's value, not the part, says what it was; an id that happens to look like one reads the same way)."""
    return _HASHED.fullmatch(part) is not None


async def ids_of(refs: ChannelRefs, keys: Iterable[str]) -> list[str]:
    """The ids the last parts of ``keys`` stand for, in order: the part itself, or, for a part that may be a hashed
    id (:func:`stands_for_another`), the id its entry holds (an entry dropped meanwhile holds none: left out)."""
    ids: list[str] = []
    for key in keys:
        part = key.rsplit(".", 1)[-1]
        if not stands_for_another(part):
            ids.append(part)
        elif (held := await refs.get(key)) is not None:
            ids.append(held)
    return ids


def ref_key(*parts: str | int) -> str:
    """A KV key from ``parts``; a part outside ``[A-Za-z0-9_-]{1,64}`` becomes its SHA-256 (hex, 40 chars)."""
    out: list[str] = []
    for part in parts:
        text = str(part)
        out.append(text if _SAFE.fullmatch(text) else hashlib.sha256(text.encode()).hexdigest()[:40])
    return ".".join(out)


class ChannelRef(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    value: str
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    #: The request's deadline, on the index entries (``open.*``, ``run.*``); None on others and on old entries.
    expires_at: datetime | None = None
    #: On an inbox entry (``open.*``): how many people the request was indexed under when this entry was
    #: written (its answerers, :func:`..inbox.answerers`), so the start-up rebuild sees a lost member's entry.
    people: int | None = None
    #: On a run entry (``run.<run>.<id>``): when the request ended (answered, expired, cancelled), so the
    #: start-up rebuild and the sweep know it without reading the record.
    ended_at: datetime | None = None
    #: On a run entry, with ``ended_at``: the state it ended in (``answered``, ``expired``, ``cancelled``; final,
    #: so a stale copy of it is still true), so the run's end skips a request that ended otherwise than
    #: cancelled without reading its record (:mod:`..runs`). None: pending, or marked by an older version.
    ended: str | None = None
    #: On a run entry: every person (``user:<id>``) who may answer its request (:func:`..inbox.answerers`: the
    #: recipient, a group's members, the escalation target and its members), so the inbox lists a person's
    #: open requests from the mirror of the bucket. None: written by an older version (its record is read).
    answerers: list[str] | None = None
    #: On a notification's once-only marker (``notify.*``): the encoded ``human.notification_delivered`` that
    #: journals the send, published (again, same id) by whoever finds the marker (:mod:`..notifications`).
    event: str | None = None


class ChannelRefs:
    """Typed access to ``human-channels``: ``get``, create-if-absent ``claim`` and ``put``."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._store: Store[ChannelRef] | None = None

    async def _open(self) -> Store[ChannelRef]:
        if self._store is None:
            self._store = await self._bus.store(BUCKET_HUMAN_CHANNELS, ChannelRef)
        return self._store

    async def get(self, key: str) -> str | None:
        got = await self.get_ref(key)
        return got.value if got is not None else None

    async def get_ref(self, key: str) -> ChannelRef | None:
        """The whole entry under ``key`` (its value and what is stored with it), or None."""
        got = await (await self._open()).get(key)
        return got.value if got is not None else None

    async def keys(self, match: str) -> list[str]:
        """The keys matching the subject filter ``match`` (``telegram.msg.<chat>.*``)."""
        return await (await self._open()).keys(match)

    async def put(self, key: str, value: str) -> None:
        """Overwrite ``key`` (for values that move on: a sync token, the newest question in a room)."""
        await (await self._open()).put(key, ChannelRef(value=value))

    async def replace(self, key: str, old: str, new: str) -> str:
        """Store ``new`` under ``key`` if it still holds ``old`` (compare-and-set); returns the value that is stored
        -- ``new``, or what another writer put there first (a replaced DM room: one winner, the others use it)."""
        store = await self._open()
        for _ in range(8):
            got = await store.get(key)
            if got is None:  # deleted meanwhile: the first to claim it wins
                return await self.claim(key, new)
            if got.value.value != old:
                return got.value.value
            try:
                await store.update(key, ChannelRef(value=new), got.revision)
            except Conflict:
                continue
            return new
        raise Contended(BUCKET_HUMAN_CHANNELS.name, key, 8)

    async def delete(self, key: str) -> None:
        """Remove ``key`` (a no-op when it is not there)."""
        await (await self._bus.kv(BUCKET_HUMAN_CHANNELS)).purge(key)

    async def create(
        self, key: str, value: str, *, expires_at: datetime | None = None, answerers: list[str] | None = None
    ) -> int | None:
        """Store ``value`` under ``key`` if the key holds nothing: the new revision, or None when it holds a value
        (left as it is: :meth:`claim` fills in what an older version's entry lacks)."""
        try:
            return await (await self._open()).create(
                key, ChannelRef(value=value, expires_at=expires_at, answerers=answerers)
            )
        except AlreadyExists:
            return None

    async def claim(
        self,
        key: str,
        value: str,
        *,
        expires_at: datetime | None = None,
        people: int | None = None,
        event: str | None = None,
        answerers: list[str] | None = None,
    ) -> str:
        """Store ``value`` under ``key`` unless the key exists; returns the value that is stored.

        ``expires_at`` (an index entry's deadline) and ``people`` (an inbox entry's count of answerers) are
        stored with it, and filled in on an existing entry that lacks them (written by an older version):
        compare-and-set, so an entry deleted or changed meanwhile is left as it is. ``event`` (a notification
        marker's journal event) is stored with a new entry only."""
        store = await self._open()
        ref = ChannelRef(value=value, expires_at=expires_at, people=people, event=event, answerers=answerers)
        try:
            await store.create(key, ref)
        except AlreadyExists:
            existing = await store.get(key)
            if existing is not None:
                await self.fill(
                    key, existing.value, existing.revision, expires_at=expires_at, people=people, answerers=answerers
                )
                return existing.value.value
            # deleted in between: ours now
            await store.put(key, ref)
        return value

    async def fill(
        self,
        key: str,
        ref: ChannelRef,
        revision: int,
        *,
        expires_at: datetime | None = None,
        people: int | None = None,
        ended_at: datetime | None = None,
        ended: str | None = None,
        answerers: list[str] | None = None,
    ) -> bool:
        """Fill in what an index entry lacks (its deadline, its count of answerers, when and how its request
        ended, who may answer it: ``answerers`` are added to those it lists) unless it changed since ``revision``;
        a value it already has is kept. True when it was written."""
        try:
            return await self._fill(key, ref, revision, expires_at, people, ended_at, ended, answerers)
        except Conflict:
            return False

    async def _fill(
        self,
        key: str,
        ref: ChannelRef,
        revision: int,
        expires_at: datetime | None,
        people: int | None,
        ended_at: datetime | None,
        ended: str | None,
        answerers: list[str] | None = None,
    ) -> bool:
        """:meth:`fill`, raising :class:`Conflict` when the entry is no longer at ``revision``."""
        changes: dict[str, object] = {}
        if expires_at is not None and ref.expires_at is None:
            changes["expires_at"] = expires_at
        if people is not None and (ref.people is None or people > ref.people):
            changes["people"] = people
        if ended_at is not None and ref.ended_at is None:
            changes["ended_at"] = ended_at
        if ended is not None and ref.ended is None:
            changes["ended"] = ended
        if answerers is not None:
            have = list(ref.answerers or [])
            more = [a for a in answerers if a not in have]
            if more or ref.answerers is None:
                changes["answerers"] = [*have, *more]
        if not changes:
            return False
        store = await self._open()
        await store.update(key, ref.model_copy(update=changes), revision)
        return True

    async def mark_ended(
        self,
        key: str,
        ended_at: datetime,
        ended: str | None = None,
        *,
        known: tuple[ChannelRef, int] | None = None,
        absent: ChannelRef | None = None,
    ) -> bool:
        """Record on the run entry ``key`` that its request ended, and how (nothing when the entry is not there).

        ``known``: the entry and its revision as a mirror of the bucket last saw it (:mod:`..mirror`); the
        write starts from it instead of reading the entry, as a compare-and-set on that revision: a stale one
        (the entry changed or went since) loses it, and the entry is read as without it.

        ``absent``: the entry to create, marked ended, when the key holds nothing (create-if-absent): a request
        that ended before its intake wrote its run entry (an answer by id between the record and the entry, or an
        intake that failed for good there) gets its entry already marked, instead of an unmarked one written after.

        A compare-and-set that loses to another write of the entry (an escalation naming its target,
        :func:`..inbox.index_people`) reads it and tries again, up to :data:`MARK_ATTEMPTS` times in all; then
        :class:`~temporality_bus.Contended`. True when it was written (False: not there, or marked already)."""
        if known is not None:
            try:
                return await self._fill(key, known[0], known[1], None, None, ended_at, ended)
            except Conflict:
                pass
        store = await self._open()
        for _ in range(MARK_ATTEMPTS):
            got = await store.get(key)
            if got is None:
                if absent is None:
                    return False
                try:
                    await store.create(key, absent.model_copy(update={"ended_at": ended_at, "ended": ended}))
                except AlreadyExists:
                    continue  # the intake's entry came meanwhile: read it and mark it
                return True
            try:
                return await self._fill(key, got.value, got.revision, None, None, ended_at, ended)
            except Conflict:
                continue  # written meanwhile: read it again, so the end's mark is not lost
        raise Contended(BUCKET_HUMAN_CHANNELS.name, key, MARK_ATTEMPTS)
