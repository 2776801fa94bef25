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

The hot path reads it too, where a stale answer is safe (:meth:`ChannelMirror.get`): a run's policy (written once,
never changed), the run entry a request's end marks (a compare-and-set on the mirrored revision, read from the
bucket when it lost), and whether a run's request already ended otherwise than cancelled (final once written);
and, once it has applied a write of the caller's own (:meth:`ChannelMirror.reached`: the watch applies the
bucket's writes in their order), what was written before that write -- a run's end and withdrawal markers at
intake, a run's requests at its end, the requests parked under a run when its policy comes (:mod:`.runs`,
:mod:`.policies` say why a write after it is seen by the other side). What the mirror lacks is read from the
bucket, as before. A message that answers no question by itself (Telegram, Matrix) finds its chat's questions in
it too (:func:`chat_questions`): the chat's keys from an index by chat, and only the records of the requests whose
run entry is not marked ended -- a chat's ended questions cost no read (a stale candidate costs its record's read,
which has the last word).

What the mirror costs instead: the keys of ``human-channels`` in memory on each replica (about 360 bytes of
Python heap each, a little more with the index by run: 10k open requests delivered on Telegram, six keys each,
hold 20.5-23.7 MiB, 35.4-36.4 MiB resident --
``bench/human_mirror_memory.py``; the index by chat adds a set slot per chat key, about 50 bytes, and a set per chat,
about 250, and the ended run entries' request ids another slot each, about 50 -- the bench, which puts each copy in
a chat of its own, held 22.1 MiB before it and 25.1 MiB after, 32.7 MiB resident both), and every write delivered to
every replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import structlog
from nats.js.kv import KeyValue
from pydantic import ValidationError

from temporality_bus import Bus, KvWatch, entry_value
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRef, ChannelRefs, ref_key

__all__ = [
    "ANYONE",
    "ChannelEntry",
    "ChannelMirror",
    "ChatQuestions",
    "chat_questions",
    "listed_for",
    "to_channel_entry",
]

log = structlog.get_logger(__name__)

#: How long :meth:`ChannelMirror.caught_up` waits for the watch to apply the bucket's last revision.
CATCH_UP_TIMEOUT_S = 10.0
#: How long a bare message's look-up (:func:`chat_questions`) waits for the mirror to catch up (then: a listing).
CHAT_CATCH_UP_TIMEOUT_S = 2.0
#: How long :meth:`ChannelMirror.reached` waits for the watch to apply a write of the caller's (then: a read).
REACH_TIMEOUT_S = 2.0


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
    #: On a run entry: the state its request ended in (None: pending, or marked by an older version).
    ended: str | None = None
    #: On a run entry: who may answer its request (None: an older version's entry, or not a run entry).
    answerers: tuple[str, ...] | None = None

    def ref(self) -> ChannelRef:
        """The entry as stored (what the mirror keeps of it): the base of a compare-and-set on :attr:`revision`."""
        return ChannelRef(
            value=self.value,
            created_at=self.created_at,
            expires_at=self.expires_at,
            people=self.people,
            ended_at=self.ended_at,
            ended=self.ended,
            answerers=list(self.answerers) if self.answerers is not None else None,
        )


#: The kinds of key :meth:`ChannelMirror.children` indexes by their ``<kind>.<run>`` parent.
_INDEXED = ("run.", "parked.")
#: ... and by their chat: ``telegram.msg.<chat>`` (the questions sent to a chat, by message), ``matrix.asked.<room>``
#: (the questions asked in a room), so a bare message finds its chat's questions without going through every key.
_CHATS = ("telegram.msg.", "matrix.asked.")


def _parent(key: str) -> str | None:
    """``run.<run>`` for ``run.<run>.<request id>`` (and ``parked.*`` likewise), ``telegram.msg.<chat>`` for
    ``telegram.msg.<chat>.<message id>`` (and ``matrix.asked.*`` likewise); None for other keys."""
    dots = key.count(".")
    if (dots == 2 and key.startswith(_INDEXED)) or (dots == 3 and key.startswith(_CHATS)):
        return key.rsplit(".", 1)[0]
    return None


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
        ref.ended,
        tuple(ref.answerers) if ref.answerers is not None else None,
    )


#: In :func:`listed_for`: the pending run entries that name no answerers (an older version's), which
#: may be anyone's (never a key part: those are ``[A-Za-z0-9_-]``).
ANYONE = "*"


def listed_for(entry: ChannelEntry) -> tuple[str, ...]:
    """Whose inbox may list ``entry`` (each person as a key part, :func:`~.channels.refs.ref_key`): a pending run
    entry's answerers (:data:`ANYONE` when it names none), the person of an older version's ``open.<user>.<id>``;
    nobody's for an ended run entry or any other key."""
    if entry.key.count(".") != 2:
        return ()
    if entry.key.startswith("run."):
        if entry.ended_at is not None:
            return ()
        if entry.answerers is None:
            return (ANYONE,)
        return tuple(ref_key(a) for a in entry.answerers)
    if entry.key.startswith("open."):
        return (entry.key.split(".")[1],)
    return ()


class ChannelMirror:
    """Every live key of ``human-channels`` with its reference, applied from a KV watch (see the module)."""

    def __init__(self, bus: Bus, kv: KeyValue) -> None:
        self._bus = bus
        self._kv = kv
        self._entries: dict[str, ChannelEntry] = {}
        #: The keys under each ``run.<run>`` and ``parked.<run>`` (a run's requests, its parked requests), and under
        #: each ``telegram.msg.<chat>`` and ``matrix.asked.<room>`` (the questions sent there), so :meth:`children`
        #: finds them without going through every key.
        self._children: dict[str, set[str]] = {}
        #: The keys each person's inbox may list (:func:`listed_for`: pending run entries naming them, an older
        #: version's inbox entries), by the person as a key part, so :meth:`inbox` does not go through every key.
        self._inboxes: dict[str, set[str]] = {}
        #: The run entries (``run.<run>.<id>``) not marked ended, so the gauges count them without going through
        #: (and sorting) every key.
        self._pending_runs: set[str] = set()
        #: The request ids (each its run entry's value, the same string) whose run entry is marked ended, so
        #: :meth:`ended` answers without the run id the key needs.
        self._ended: set[str] = set()
        #: The highest revision applied (a delete counts too: it is a message of the bucket's stream).
        self.revision = 0
        #: How many keys the watch has delivered since it started, its snapshots included: what the mirror read.
        self.delivered = 0
        #: Who waits in :meth:`reached` for which revision (a heap: the lowest first), each woken once, when the
        #: watch has applied it -- not every waiter at every entry applied.
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._tickets = itertools.count()
        #: Who waits in :meth:`appears` for which key, woken when the watch delivers a value under it.
        self._key_waiters: dict[str, list[asyncio.Future[None]]] = {}
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
            self._drop(str(entry.key))
        else:
            before = self._entries.get(found.key)
            if before is not None:
                self._unlist(before)
            self._entries[found.key] = found
            if (parent := _parent(found.key)) is not None:
                self._children.setdefault(parent, set()).add(found.key)
            for person in listed_for(found):
                self._inboxes.setdefault(person, set()).add(found.key)
            if found.key.startswith("run.") and found.key.count(".") == 2:
                if found.ended_at is None:
                    self._pending_runs.add(found.key)
                else:
                    self._pending_runs.discard(found.key)
                    self._ended.add(found.value)  # (the set keeps this entry's string: _unlist dropped the one before)
            for waiting in self._key_waiters.pop(found.key, ()):
                if not waiting.done():
                    waiting.set_result(None)
        while self._waiters and self._waiters[0][0] <= self.revision:
            waiter = heapq.heappop(self._waiters)[2]
            if not waiter.done():  # (one that timed out is cancelled)
                waiter.set_result(None)

    async def _forget(self, seen: set[str]) -> None:
        """After a (re-)snapshot: drop what the bucket no longer holds."""
        for key in set(self._entries) - seen:
            self._drop(key)

    def _drop(self, key: str) -> None:
        gone = self._entries.pop(key, None)
        if gone is None:
            return
        self._pending_runs.discard(key)
        self._unlist(gone)
        if (parent := _parent(key)) is not None:
            siblings = self._children.get(parent)
            if siblings is not None:
                siblings.discard(key)
                if not siblings:
                    del self._children[parent]

    def _unlist(self, entry: ChannelEntry) -> None:
        """Take ``entry`` out of the inboxes it is listed in (and, a run entry, out of :attr:`_ended`)."""
        if entry.ended_at is not None and entry.key.startswith("run.") and entry.key.count(".") == 2:
            self._ended.discard(entry.value)
        for person in listed_for(entry):
            listed = self._inboxes.get(person)
            if listed is not None:
                listed.discard(entry.key)
                if not listed:
                    del self._inboxes[person]

    async def caught_up(self, timeout_s: float = CATCH_UP_TIMEOUT_S) -> bool:
        """Whether the mirror holds the bucket as of now: the watch runs and has applied the bucket's last
        revision (waited for up to ``timeout_s``). False: list the bucket instead."""
        try:
            await self.check()
            last = int((await self._kv.status()).stream_info.state.last_seq or 0)
        except Exception as exc:
            log.info("mirror.unavailable", error=repr(exc))
            return False
        if not await self._applied(last, timeout_s):
            # the last message may be gone from the stream (a key's history limit): a listing decides then
            log.info("mirror.behind", revision=self.revision, last=last)
            return False
        return True

    async def reached(self, revision: int, timeout_s: float = REACH_TIMEOUT_S) -> bool:
        """Whether the mirror has applied the bucket up to ``revision`` (waited for up to ``timeout_s``) while its
        watch runs: the watch delivers the bucket's writes in their order, so then every key written before
        that revision shows its value as of then or later -- a key it lacks was not there. Used with a write of
        the caller's own (its revision): what was written before it is seen without a read. False: read the
        bucket."""
        try:
            await self.check()
        except Exception:
            return False
        return await self._applied(revision, timeout_s)

    async def _applied(self, revision: int, timeout_s: float) -> bool:
        if self.revision >= revision:
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        item = (revision, next(self._tickets), waiter)
        heapq.heappush(self._waiters, item)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except TimeoutError:
            self._forget_waiter(item)
            return False
        except BaseException:  # cancelled: not kept in the heap either
            self._forget_waiter(item)
            raise
        return True

    def _forget_waiter(self, item: tuple[int, int, asyncio.Future[None]]) -> None:
        """Take a waiter that gave up out of the heap (else it stays until the watch reaches its revision)."""
        try:
            self._waiters.remove(item)
        except ValueError:  # woken (popped) meanwhile
            return
        heapq.heapify(self._waiters)

    async def appears(self, key: str, timeout_s: float) -> ChannelEntry | None:
        """The entry under ``key`` as soon as the watch delivers one (now if it holds one), waited for up to
        ``timeout_s`` while the watch runs; None: none delivered by then (absent, or the watch is behind or down --
        read the bucket). No polling: the waiter is woken by the watch's delivery of that key. Like :meth:`get`,
        for a key whose value never changes once written (``policy.*``)."""
        if (entry := self._entries.get(key)) is not None:
            return entry
        try:
            await self.check()
        except Exception:
            return None
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._key_waiters.setdefault(key, []).append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except TimeoutError:
            pass
        finally:
            waiting = self._key_waiters.get(key)
            if waiting is not None and waiter in waiting:
                waiting.remove(waiter)
                if not waiting:
                    del self._key_waiters[key]
        return self._entries.get(key)

    def get(self, key: str) -> ChannelEntry | None:
        """The entry under ``key`` as the watch last delivered it, or None (absent, or not delivered yet).

        It may be stale: use it only where a stale value is safe -- as the base of a compare-and-set (which a
        stale revision loses), for a value its key never changes once written (``policy.*``), or for what
        never reverts (a run entry's ``ended``); where it has nothing, read the bucket."""
        return self._entries.get(key)

    def children(self, parent: str) -> list[ChannelEntry]:
        """The entries under ``parent`` (``run.<run>`` or ``parked.<run>``: the keys ``<parent>.<request id>``;
        ``telegram.msg.<chat>``, ``matrix.asked.<room>``: the questions sent there) as the watch last delivered them -- with :meth:`reached`, what a listing of ``<parent>.*`` would show."""
        return [self._entries[key] for key in sorted(self._children.get(parent, ()))]

    def inbox(self, user: str) -> list[ChannelEntry]:
        """The entries ``user`` (``user:<id>``)'s inbox may list, as the watch last delivered them: the pending run
        entries that name them among their answerers or name none (an older version's), and an older version's
        ``open.<user>.*`` entries. With :meth:`caught_up`, what a listing of the bucket would show; each still
        needs its record (pending? may they answer?) -- :func:`.inbox.list_inbox`."""
        keys = self._inboxes.get(ref_key(user), set()) | self._inboxes.get(ANYONE, set())
        return [self._entries[key] for key in sorted(keys)]

    def ended(self, request_id: str) -> bool:
        """Whether the run entry of ``request_id`` (``run.<run>.<request id>``) is marked ended, as the watch last
        delivered it. Final once true (a mark never reverts); False while it is pending, and when the mirror holds
        no run entry of it (an older version's request, or not delivered yet): then only its record says."""
        return request_id in self._ended

    def pending_runs(self) -> list[ChannelEntry]:
        """The run entries (``run.<run>.<id>``) not marked ended, as the watch last delivered them, in no order."""
        return [self._entries[key] for key in self._pending_runs]

    def entries(self) -> list[ChannelEntry]:
        """The mirrored entries in revision order (the order a listing gives)."""
        return sorted(self._entries.values(), key=lambda e: e.revision)


@dataclass(frozen=True)
class ChatQuestions:
    """The questions sent to a chat, as :func:`chat_questions` found them."""

    #: The request ids that may still be open, sorted: their records decide (read each, check ``pending``).
    candidates: list[str]
    #: How many others the mirror says ended (their run entries are marked): not read. Their records are still
    #: stored (the retention deletes a run entry after its record). 0 from a listing, which reads them all.
    ended: int = 0


async def chat_questions(
    refs: ChannelRefs,
    mirror: ChannelMirror | None,
    parent: str,
    *,
    also: Sequence[str] = (),
    timeout_s: float = CHAT_CATCH_UP_TIMEOUT_S,
) -> ChatQuestions:
    """The request ids the keys ``<parent>.*`` (``telegram.msg.<chat>``, ``matrix.asked.<room>``: every question,
    reminder and escalation sent there until the retention purges its request) and the keys ``also`` (the room's
    newest question) hold: what a message that answers no question by itself may be bound to.

    From ``mirror`` once it has caught up (:meth:`ChannelMirror.caught_up`: one ``stream_info``; a question sent
    before the message is there): the chat's keys from its index, and only the requests whose run entry is not
    marked ended (:meth:`ChannelMirror.ended`; one without a run entry, an older version's, stays a candidate) --
    a busy chat's ended questions cost nothing. A stale candidate (ended since) costs its record's read, which
    says so: never a wrong binding. Without a mirror, or while it is down or behind: a listing of ``<parent>.*``
    and a read of each key, every request a candidate."""
    if mirror is not None and await mirror.caught_up(timeout_s):
        held = [e.value for e in mirror.children(parent)]
        held += [e.value for key in also if (e := mirror.get(key)) is not None]
        ids = set(held)
        candidates = sorted(i for i in ids if not mirror.ended(i))
        return ChatQuestions(candidates, len(ids) - len(candidates))
    keys = await refs.keys(f"{parent}.*")
    values = await asyncio.gather(*(refs.get(k) for k in [*keys, *also]))
    return ChatQuestions(sorted({v for v in values if v}))
