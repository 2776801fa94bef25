"""The inbox: a person's open requests, from the run entries; and the retention purge of ended ones (HUM-3).

**Index.** The run entry of each request (``run.<run id>.<request id>`` in ``human-channels``, :mod:`.runs`) names
everyone who may answer it (``answerers``: the recipient, a group's members, the escalation target and its
members) besides its deadline, and says when it ended. ``GET /inbox`` lists the caller's open requests from the
replica's mirror of the bucket (:meth:`.mirror.ChannelMirror.inbox`: the run entries not marked ended that name
them), once the mirror has applied the bucket's last revision as of the call (:meth:`~.mirror.ChannelMirror.caught_up`:
a request any replica took in before the call is there); without a mirror, or while its watch is down or behind,
from a listing of ``run.>`` shared by the reads that wait for it (:class:`_RunListing`). Each request listed is read and shown while pending and the caller's to answer.

* Written just *after* the record (:func:`.runs.index_new_request` at intake, since 2026-12-06, later: before it
  until then; at an escalation, :func:`index_people` adds the target before it is recorded), create-if-absent then
  compare-and-set. A crash in between is redelivered and indexes it; an intake given up on in between (the
  consumer's last delivery) has it indexed by its dead-letter hook (:meth:`.requests.RequestHandler.on_dead_letter`,
  retried until it succeeds), deadline armed; a request that ended before its entry was written (an answer by id in
  between) has it created marked ended (:func:`unindex`). An entry an older version wrote before a record that
  never came is skipped by the inbox and forgotten by a start or the sweep.
* Marked ended when the request ends (answered, expired, cancelled: :func:`unindex`, best effort): no inbox
  lists it from then on. A lost mark is harmless: the inbox reads the record, does not show it and marks the
  entry ended; the sweep and the next start mark it too.
* Until 2026-12-06 the index was a key per person, ``open.<user id>.<request id>`` (created at intake, removed
  at the end: two writes per person and loop, each delivered to every replica's mirror). Those an older
  version wrote are still listed for their person (a rolling upgrade: an old replica's escalation) and dropped
  once their request ended (by the end, when the mirror holds them; the inbox, the sweep, the next start).
* Completed at every start (:func:`rebuild_index`, idempotent): from one listing of the bucket (the snapshot of
  the retention sweep's :mod:`.mirror`: a start lists ``human-channels`` once) and of the request keys only
  until a start found every stored request with a run entry (:data:`RUN_ENTRIES_KEY`); only what the run
  entries cannot vouch for is read (see there): never a request whose run entry says it ended, nor twice one
  that was never stored; two replicas doing it at once agree.

**Retention.** An ended request (answered / expired / cancelled) is kept ``retention`` after it ended — and
at least until its deadline passed, so no timer of it is still to fire — then purged: its channel
references (Telegram token and message keys, Matrix event keys, an older version's inbox entries, the run entry) first, the
record last, with a compare-and-set on the revision read (a record that changed meanwhile is left for the
next sweep). The sweep lists no request key and reads only the records that may be due: each request's run
entry (``run.<run>.<id>``) carries its ``expires_at`` (and ``ended_at``), and nothing is purged before
``expires_at`` + retention; a run entry without a deadline is read (and dated). Then every other reference nothing needs any more (:func:`stale_references`): whatever is
left of a request no longer stored (a send claimed but never recorded, an index entry whose record never
came), notification markers, and an ended run's policy and end marker once none of its requests is kept —
never a person's DM room or the sync token. One sweep per ``every_s`` runs on the durable timer ``…schedule.human._sweep.retention``: the
timers consumer gives each firing to one replica, and every replica arms the same slot (the next multiple of
``every_s``) with the same message id, so they never sweep twice nor push each other's sweep later.
"""

from __future__ import annotations

import asyncio
import json
import math
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

import structlog
from nats.js.errors import KeyWrongLastSequenceError
from pydantic import ValidationError

from temporality_bus import Bus, Contended, PublishResult, TransientError, live_entries
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRef, ChannelRefs, ref_key
from temporality_human_interaction.directory import user_id_of
from temporality_human_interaction.mirror import ANYONE, ChannelEntry, ChannelMirror, listed_for, to_channel_entry
from temporality_human_interaction.records import HumanRequestRecord, RequestStore, is_request_id, open_store
from temporality_human_interaction.timers import arm_deadline, human_timers
from temporality_protocol import Envelope, derive_id
from temporality_protocol.catalog import BUCKET_HUMAN_REQUESTS

__all__ = [
    "NEVER_STORED_AFTER",
    "PARKED_GRACE",
    "RUN_ENTRIES_KEY",
    "SWEEP_KEY",
    "ChannelEntry",
    "Rebuilt",
    "ResumeParked",
    "RetentionSweeper",
    "answerers",
    "arm_sweep",
    "channel_entries",
    "inbox_entries",
    "inbox_key",
    "index_people",
    "is_sweep",
    "list_inbox",
    "mark_run_entry_ended",
    "rebuild_index",
    "stale_references",
    "unindex",
]

log = structlog.get_logger(__name__)

#: The retention sweep's timer key (never a request id's: those have no dot, and ``.retention`` is no suffix).
SWEEP_KEY = "_sweep.retention"
_LIST_TIMEOUT_S = 5.0
#: :func:`index_people` tries its compare-and-set this many times (each a read and a write) before giving up.
_NAME_ATTEMPTS = 5
#: How long the inbox waits for the mirror to apply the bucket's last revision (then: one listing instead).
_INBOX_CATCH_UP_S = 2.0
#: Reading the sweep's listing of ``human-channels`` waits this long for each next entry (then: retried).
_SWEEP_LIST_TIMEOUT_S = 60.0


def inbox_key(user: str, request_id: str) -> str:
    return ref_key("open", user, request_id)


def answerers(record: HumanRequestRecord) -> list[str]:
    """Every person (``user:<id>``) who may answer ``record``."""
    out: list[str] = []
    for who in (record.recipient, *record.members, record.escalated_to, *record.escalation_members):
        if who and user_id_of(who) is not None and who not in out:
            out.append(who)
    return out


async def index_people(bus: Bus, record: HumanRequestRecord, people: list[str]) -> None:
    """List ``record`` in the inbox of each of ``people`` (``user:<id>``) too: added to the answerers its run entry
    names (create-if-absent, else a compare-and-set -- tried again when it loses; one write, whoever they are).
    Nothing is written when the entry names them all already or says the request ended."""
    users = [p for p in dict.fromkeys([*answerers(record), *people]) if user_id_of(p) is not None]
    key = ref_key("run", record.run_id, record.request_id)
    refs = ChannelRefs(bus)
    for attempt in range(_NAME_ATTEMPTS + 1):  # a compare-and-set that lost to another write of the entry: again
        named = await refs.get_ref(key)
        if named is not None and named.ended_at is not None:
            return  # its request ended: no inbox lists it any more, nobody to name (no write)
        if named is not None and set(users) <= set(named.answerers or ()):
            return
        if attempt < _NAME_ATTEMPTS:
            await index_request_entry(bus, record, users)
    raise TransientError(f"{key}: could not name {users} on it ({_NAME_ATTEMPTS} attempts)")


async def unindex(bus: Bus, record: HumanRequestRecord, mirror: ChannelMirror | None = None) -> None:
    """The request ended: mark its run entry ended (``ended_at``, and how: ``ended``): no inbox lists it from then
    on. An entry not there yet (the request ended between its record's create and its run entry's, or its intake
    failed for good in between) is created marked ended: the intake's own create then finds it, and the sweep
    purges the record in time. Best effort: a lost mark is found by the inbox (which reads the record), the next
    start (:func:`rebuild_index`) or sweep. ``mirror``: the mark is a compare-and-set on the revision the mirror
    holds (no read; a stale one, or none, reads the entry); an older version's inbox entries (``open.*``) the
    mirror holds are dropped (one it does not hold yet is dropped by the sweep)."""
    try:
        await mark_run_entry_ended(bus, record, mirror)
    except Exception as exc:
        log.warning("inbox.mark_ended_failed", request_id=record.request_id, error=repr(exc))
    if mirror is None:
        return
    for person in answerers(record):
        legacy = mirror.get(inbox_key(person, record.request_id))
        if legacy is None:
            continue
        try:
            await _drop(bus, [legacy])
        except Exception as exc:
            log.warning("inbox.unindex_failed", request_id=record.request_id, person=person, error=repr(exc))


async def mark_run_entry_ended(bus: Bus, record: HumanRequestRecord, mirror: ChannelMirror | None = None) -> None:
    """:func:`unindex`'s mark of the ended ``record``'s run entry (created marked when not there), raising when it
    fails."""
    key = ref_key("run", record.run_id, record.request_id)
    mirrored = mirror.get(key) if mirror is not None else None
    await ChannelRefs(bus).mark_ended(
        key,
        record.ended_at or datetime.now(UTC),
        record.status.value,
        known=(mirrored.ref(), mirrored.revision) if mirrored is not None else None,
        absent=ChannelRef(value=record.request_id, expires_at=record.expires_at, answerers=answerers(record)),
    )


async def inbox_entries(bus: Bus, user: str, mirror: ChannelMirror | None = None) -> list[ChannelEntry]:
    """The entries ``user``'s inbox may list (:meth:`.mirror.ChannelMirror.inbox`): from ``mirror`` once it has
    applied the bucket's last revision as of this call (so a request taken in by any replica before it is
    there), else (no mirror, its watch down or behind) from a listing of the run entries -- one shared by the
    calls waiting for it (:class:`_RunListing`) -- and one of the older version's ``open.<user>.*`` entries."""
    if mirror is not None and await mirror.caught_up(_INBOX_CATCH_UP_S):
        return mirror.inbox(user)
    runs = await _run_listing(bus).entries(bus)
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    older = await live_entries(kv, f"{ref_key('open', user)}.*", timeout_s=_LIST_TIMEOUT_S, usually_empty=True)
    listed = [*runs, *(found for entry in older if (found := to_channel_entry(entry)) is not None)]
    mine = {ref_key(user), ANYONE}
    return [e for e in listed if mine & set(listed_for(e))]


class _RunListing:
    """The inbox's listing of ``run.>`` when the mirror cannot answer, one at a time per connection, its result
    shared by every call that waits for it: while one is under way, the calls that come meanwhile share the
    next one (which begins after them -- the one under way may miss a run entry written just before they came),
    so each call still sees every run entry written before it, and a burst of calls lists the bucket twice at
    most, not once per call."""

    def __init__(self) -> None:
        #: The listing under way, and the one the calls that came meanwhile wait for (it begins after it).
        self._running: asyncio.Task[list[ChannelEntry]] | None = None
        self._next: asyncio.Task[list[ChannelEntry]] | None = None

    async def entries(self, bus: Bus) -> list[ChannelEntry]:
        if self._next is None or self._next.done():  # (done: cancelled before it began)
            self._next = asyncio.create_task(self._list(bus, self._running))
            self._next.add_done_callback(_retrieved)
            self._next.add_done_callback(self._forget)
        # shielded: a call that goes away (its client hung up) does not cancel the others' listing
        return await asyncio.shield(self._next)

    async def _list(self, bus: Bus, before: asyncio.Task[list[ChannelEntry]] | None) -> list[ChannelEntry]:
        if before is not None:
            await asyncio.wait({before})  # (its outcome is its own callers')
            # not kept in this frame: a failed listing's traceback holds its frame, so each failure would hold the
            # one before it (and its bus) for as long as the failures go on
            del before
        # from here on, a call that comes waits for the listing after this one
        self._running, self._next = self._next, None
        kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
        listed = await live_entries(kv, "run.>", timeout_s=_LIST_TIMEOUT_S)
        return [found for entry in listed if (found := to_channel_entry(entry)) is not None]

    def _forget(self, task: asyncio.Task[list[ChannelEntry]]) -> None:
        """A listing that is over is not kept (its result -- every run entry -- or its failure): its callers have
        it, and the next listing has nothing to wait for."""
        if self._running is task:
            self._running = None
        if self._next is task:
            self._next = None


async def _mark_ended_or_later(refs: ChannelRefs, key: str, ended_at: datetime, record: HumanRequestRecord) -> None:
    """The start's and the sweep's end mark: one that keeps losing its compare-and-set (:class:`Contended`) is
    left to the next sweep or start, logged, instead of failing the start or cutting the sweep short."""
    try:
        await refs.mark_ended(key, ended_at, record.status.value)
    except Contended as exc:
        log.warning("inbox.mark_ended_contended", request_id=record.request_id, error=repr(exc))


def _retrieved(task: asyncio.Task[list[ChannelEntry]]) -> None:
    """A shared listing's failure is its callers' (raised to each); marked seen when none is left to see it."""
    if not task.cancelled():
        task.exception()


_RUN_LISTINGS: weakref.WeakKeyDictionary[Bus, _RunListing] = weakref.WeakKeyDictionary()


def _run_listing(bus: Bus) -> _RunListing:
    listing = _RUN_LISTINGS.get(bus)
    if listing is None:
        listing = _RUN_LISTINGS[bus] = _RunListing()  # (no reference to the bus: it would never be dropped)
    return listing


async def list_inbox(
    bus: Bus, store: RequestStore, user: str, mirror: ChannelMirror | None = None
) -> list[HumanRequestRecord]:
    """``user``'s pending requests (their own, their groups', escalated to them), newest first: the records of the
    run entries naming them (:func:`inbox_entries`), each read -- shown while pending and theirs to answer.

    What it finds out of date it repairs as it goes (compare-and-set on the entry as listed): a run entry whose
    request ended (its mark was lost) is marked ended, an older version's entry is given the answerers (a pending
    request) or dropped (an inbox entry of an ended one)."""
    refs = ChannelRefs(bus)
    found: dict[str, HumanRequestRecord] = {}
    records: dict[str, HumanRequestRecord | None] = {}
    for entry in await inbox_entries(bus, user, mirror):
        request_id = entry.value
        if request_id not in records:
            got = await store.get(request_id)
            records[request_id] = got.value if got is not None else None
        record = records[request_id]
        if record is None:  # indexed before its record was stored (or purged): not shown, left alone
            continue
        run_entry = entry.key.startswith("run.")
        if record.pending and record.may_answer(user):
            found[request_id] = record
        try:  # a repair that fails is left for the next read, the sweep or the next start: the read answers
            await _repair(bus, refs, entry, record, run_entry)
        except Exception as exc:
            log.warning("inbox.repair_failed", key=entry.key, request_id=request_id, error=repr(exc))
    return sorted(found.values(), key=lambda r: (r.created_at, r.request_id), reverse=True)


async def _repair(
    bus: Bus, refs: ChannelRefs, entry: ChannelEntry, record: HumanRequestRecord, run_entry: bool
) -> None:
    """What :func:`list_inbox` finds out of date in ``entry`` (``record``'s), written (compare-and-set)."""
    if record.pending:
        if run_entry and entry.answerers is None:  # an older version's: its answerers, so it is read no more
            await refs.fill(entry.key, entry.ref(), entry.revision, answerers=answerers(record))
    elif run_entry:  # its end's mark was lost: done now
        await refs.mark_ended(
            entry.key,
            record.ended_at or datetime.now(UTC),
            record.status.value,
            known=(entry.ref(), entry.revision),
        )
    else:
        await _drop(bus, [entry])  # an older version's inbox entry, its removal lost: done now


@dataclass(frozen=True)
class Rebuilt:
    """What a start-up :func:`rebuild_index` did."""

    #: Request records read (those the index could not vouch for).
    read: int
    #: Pending requests among them, indexed again.
    pending: int
    #: Inbox entries of ended requests dropped (their removal was lost).
    dropped: int
    #: Whether it listed the keys of the requests bucket (only until :data:`RUN_ENTRIES_KEY` is written).
    listed_requests: bool = False
    #: Requests never stored whose index entries (older than :data:`NEVER_STORED_AFTER`) were dropped.
    forgotten: int = 0


#: Written (in ``human-channels``) by the first start whose listing of the request keys found every stored
#: request with a dated run entry: from then on every request has one (written by its intake, which is not done
#: before it is: just after the record since 2026-12-06, before it until then), so the
#: starts after it do not list the requests bucket. Delete it to have the next start list it once more
#: (an upgrade from a version before run entries that ran side by side with this one: docs/human-interaction.md).
RUN_ENTRIES_KEY = "migrated.run_entries"
#: A request indexed this long ago and still not stored never will be (its intake crashed between the index
#: and the record, or was refused for good): its index entries are dropped, so no start reads it again. An
#: intake that comes after all (a redelivery) writes them again first.
NEVER_STORED_AFTER = timedelta(hours=1)


async def rebuild_index(bus: Bus, *, now: datetime | None = None, entries: list[ChannelEntry] | None = None) -> Rebuilt:
    """Complete and repair the indexes from one listing of ``human-channels`` (and, until every stored request
    is known to have a run entry, one of the request keys: :data:`RUN_ENTRIES_KEY`). ``entries``: the bucket as
    the start's :class:`~.mirror.ChannelMirror` has just read it (its watch's snapshot), instead of a second
    listing of it; None lists it.

    A record is read only when the index cannot vouch for it:

    * its run entry (``run.<run>.<id>``) is missing (only the listing of the request keys finds such a
      record) or has no ``expires_at``: stored by an older version;
    * its run entry does not say it ended and names nobody who may answer it (``answerers``: an older
      version's; every inbox would read it until then).

    A run entry that says the request ended (``ended_at``, written when it ended) is never read: an older
    version's inbox entries of it, if any are left, are dropped. A record read is indexed again (idempotent,
    compare-and-set): its run entry dated; while it is pending, its answerers named (and, when it had no run entry
    at all, its deadline armed: an intake given up on before its run entry by a version without the intake's
    dead-letter hook never armed it either -- deduplicated with the intake's own arm); once it ended, its run entry
    marked ended and an older version's inbox entries dropped, so the next start need not read it. An older
    version's inbox entries of a pending request are left for that version's inbox (a rolling upgrade).
    A request read and not stored whose entries are all older than
    :data:`NEVER_STORED_AFTER` has its run and inbox entries dropped (it was never stored: the next start
    need not read it). Every replica does this at start; two doing it at once agree."""
    store = await open_store(bus)
    refs = ChannelRefs(bus)
    now = now or _utcnow()
    if entries is None:
        entries = await channel_entries(bus)
    runs = {e.value: e for e in entries if _is_run_entry(e.key)}
    opens: dict[str, list[ChannelEntry]] = {}
    for e in entries:
        if e.key.startswith("open."):
            opens.setdefault(e.value, []).append(e)
    wanted: set[str] = set()
    dropped = 0
    for request_id, mine in opens.items():  # an older version's inbox entries
        run = runs.get(request_id)
        if run is not None and run.ended_at is not None:  # ended: the removal of these was lost
            dropped += await _drop(bus, mine)
    for request_id, run in runs.items():
        if run.expires_at is None:
            wanted.add(request_id)  # an older version's run entry: dated below
        elif run.ended_at is None and run.answerers is None:
            wanted.add(request_id)  # an older version's: who may answer it, below (every inbox reads it until then)
    listed = not any(e.key == RUN_ENTRIES_KEY for e in entries)
    unlisted = 0  # stored requests the run index does not know
    if listed:
        for request_id in await store.keys():
            if request_id not in runs:
                wanted.add(request_id)
                unlisted += 1
    read = pending = forgotten = 0
    for request_id in sorted(wanted):
        got = await store.get(request_id)
        if got is None:
            forgotten += await _forget_never_stored(bus, runs.get(request_id), opens.get(request_id, []), now)
            continue
        read += 1
        record = got.value
        if record.pending:
            await index_request_entry(bus, record, answerers(record))
            if request_id not in runs:
                # no run entry: maybe its intake gave up before it (a version without the intake's dead-letter hook),
                # so before its deadline too: armed (deduplicated, the intake's msg id) -- it expires, its run resumes
                await arm_deadline(bus, record.request_id, record.expires_at)
            pending += 1
        else:
            await index_request_entry(bus, record)
            await _mark_ended_or_later(
                refs, ref_key("run", record.run_id, record.request_id), record.ended_at or record.expires_at, record
            )
            dropped += await _drop(bus, opens.get(request_id, []))
    if listed and not unlisted:
        # every stored request has a run entry, and every later one gets it from its intake (or its dead-letter
        # hook): never list again
        await refs.claim(RUN_ENTRIES_KEY, now.isoformat())
    log.info(
        "inbox.index_rebuilt",
        read=read,
        pending=pending,
        dropped=dropped,
        listed_requests=listed,
        unlisted=unlisted,
        forgotten=forgotten,
    )
    return Rebuilt(read, pending, dropped, listed, forgotten)


async def _forget_never_stored(bus: Bus, run: ChannelEntry | None, opens: list[ChannelEntry], now: datetime) -> int:
    """Drop the index entries of a request that is not stored, once all of them are older than
    :data:`NEVER_STORED_AFTER` (compare-and-set); 1 when they went."""
    mine = [*opens, *([run] if run is not None else [])]
    if not mine or any(e.created_at + NEVER_STORED_AFTER > now for e in mine):
        return 0  # maybe an intake between its index and its record right now: left alone
    await _drop(bus, mine)
    log.info("inbox.never_stored_forgotten", request_id=mine[0].value, entries=len(mine))
    return 1


async def _drop(bus: Bus, entries: list[ChannelEntry]) -> int:
    """Delete ``entries`` unless they changed since listed (compare-and-set); how many went."""
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    gone = 0
    for e in entries:
        try:
            await kv.delete(e.key, last=e.revision)
        except KeyWrongLastSequenceError:
            continue
        gone += 1
    return gone


async def index_request_entry(bus: Bus, record: HumanRequestRecord, people: list[str] | None = None) -> None:
    """``run.<run id>.<request id>`` with the deadline (as :func:`.runs.index_request` writes it) and ``people``
    added to its answerers (None: left as they are)."""
    await ChannelRefs(bus).claim(
        ref_key("run", record.run_id, record.request_id),
        record.request_id,
        expires_at=record.expires_at,
        answerers=people,
    )


def _is_run_entry(key: str) -> bool:
    return key.startswith("run.") and key.count(".") == 2


def is_sweep(data: bytes) -> bool:
    """Whether a timer payload is the retention sweep's."""
    try:
        body = json.loads(data)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("sweep") == "retention"


async def arm_sweep(bus: Bus, every_s: float, now: datetime) -> PublishResult:
    """Arm the sweep at the next multiple of ``every_s`` after ``now`` (the same slot and id on every replica)."""
    slot = (math.floor(now.timestamp() / every_s) + 1) * every_s
    at = datetime.fromtimestamp(slot, UTC)
    payload = json.dumps({"sweep": "retention"}).encode()
    return await human_timers(bus).arm(SWEEP_KEY, at, payload, msg_id=derive_id("tmr", "sweep", str(int(slot))))


def _utcnow() -> datetime:
    return datetime.now(UTC)


async def channel_entries(bus: Bus, *, timeout_s: float = _SWEEP_LIST_TIMEOUT_S) -> list[ChannelEntry]:
    """Every key of ``human-channels`` with its value: one listing of the bucket (each key's last entry,
    :func:`temporality_bus.live_entries`), not one read per key."""
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    return [found for entry in await live_entries(kv, timeout_s=timeout_s) if (found := to_channel_entry(entry))]


#: ``<prefix>`` -> the key's value is the request id (``open.<user>.<id>``, ``telegram.token.<token>``, ...).
_VALUE_IS_REQUEST = (
    ("open",),
    ("run",),
    ("withdrawn",),
    ("telegram", "token"),
    ("telegram", "msg"),
    ("telegram", "hint"),
    ("matrix", "event"),
    ("matrix", "asked"),
    ("matrix", "hint"),
)
#: ``<prefix>.<request id>...``: the key names the request.
_KEY_NAMES_REQUEST = (("telegram", "req"), ("telegram", "sent"))


def stale_references(
    entries: list[ChannelEntry], kept: dict[str, str], now: datetime, retention: timedelta
) -> list[tuple[str, int]]:
    """The ``(key, revision)`` of every reference the retention may purge, given the requests ``kept``
    (request id -> run id). Only keys older than ``retention`` go, so a key written for a request that is not
    stored yet (the index comes first) or stored after ``kept`` was read is never taken:

    * what belongs to a request no longer stored (purged, or never stored after a crash): its inbox and run
      index entries, its withdrawal marker, Telegram token / message / sent keys, Matrix event keys and its poll link, and a room's
      "newest question" pointer (``matrix.latest.<room>``) to it;
    * ``notify.<id>[.<member>]``: a notification's once-only marker (redeliveries come within minutes);
    * a run's ``policy.<run>`` and ``runend.<run>`` once the run ended and none of its requests is kept.

    Kept whatever their age: a person's DM room (``matrix.room.*``), the sync token (``matrix.since.*``),
    the policy of a run that has not ended, and anything this list does not name."""
    keys = {e.key for e in entries}
    kept_parts = {ref_key(request_id) for request_id in kept}  # as a key part (a long id is hashed there)
    kept_runs = {ref_key(run_id) for run_id in kept.values()}
    indexed_runs = {e.key.split(".")[1] for e in entries if e.key.startswith("run.") and e.key.count(".") == 2}
    ending: set[str] = set()
    out: list[tuple[str, int]] = []
    for entry in entries:
        if entry.created_at + retention > now:
            continue
        parts = tuple(entry.key.split("."))
        if any(parts[: len(p)] == p for p in _VALUE_IS_REQUEST) and len(parts) >= 3:
            stale = entry.value not in kept
        elif any(parts[: len(p)] == p for p in _KEY_NAMES_REQUEST) and len(parts) >= 3:
            stale = parts[2] not in kept_parts
        elif parts[:2] == ("matrix", "latest"):
            stale = entry.value not in kept
        elif parts[:2] == ("matrix", "poll") and len(parts) == 3:
            stale = ref_key("matrix", "event", parts[2]) not in keys  # its question's binding is gone
        elif parts[0] == "notify":
            stale = True
        elif parts[0] == "runend" and len(parts) == 2:
            stale = parts[1] not in kept_runs and parts[1] not in indexed_runs
            if stale:
                ending.add(parts[1])
        else:
            stale = False
        if stale:
            out.append((entry.key, entry.revision))
    # a run's policy goes with its end marker, and before it (a crash in between leaves the marker, which
    # the next sweep finds again): never a policy without a marker that would keep it forever
    policies = [(e.key, e.revision) for e in entries if e.key.count(".") == 1 and e.key.startswith("policy.")]
    first = [(key, rev) for key, rev in policies if key.split(".")[1] in ending]
    return first + out


class ResumeParked(Protocol):
    """``RequestHandler.resume_parked``: take a parked request in (or, ``final``, refuse it)."""

    def __call__(self, run_id: str, request_id: str, *, final: bool) -> Awaitable[None]: ...


#: A parked request whose run's policy has been known this long (or whose deadline passed this long ago) and
#: that is still parked lost its timer's firing: the sweep takes it in (or refuses it) itself.
PARKED_GRACE = timedelta(minutes=5)


class RetentionSweeper:
    """Purges ended requests past the retention; :meth:`fired` is what the timers handler calls.

    With ``resume``, each sweep also takes in the parked requests whose timer firing was lost
    (:meth:`resume_lost_parked`)."""

    def __init__(
        self,
        bus: Bus,
        *,
        retention: timedelta,
        every_s: float,
        clock: Callable[[], datetime] | None = None,
        resume: ResumeParked | None = None,
        mirror: ChannelMirror | None = None,
    ) -> None:
        self._bus = bus
        #: ``human-channels`` kept by a watch (:mod:`.mirror`): a sweep reads it instead of listing the bucket.
        self._mirror = mirror
        self._delivered_mark = 0 if mirror is None else mirror.delivered
        self.retention = retention
        self.every_s = every_s
        self._clock = clock or _utcnow
        self._resume = resume
        #: How many parked requests the last :meth:`sweep` took in or refused (their timer's firing was lost).
        self.last_resumed = 0
        #: How many request records the last :meth:`sweep` read (those that may have been due).
        self.last_read = 0
        #: How many keys of ``human-channels`` the last :meth:`sweep` read from the server: every key of the bucket
        #: per listing, or with a mirror only the changes its watch delivered since the sweep before (the requests
        #: bucket is not listed).
        self.last_listed = 0
        #: Whether the last :meth:`sweep` read the mirror (False: it listed the bucket).
        self.last_mirrored = False

    def due(self, record: HumanRequestRecord) -> datetime | None:
        """When ``record`` may be purged (None: it is still pending)."""
        if record.pending:
            return None
        ended = record.ended_at or record.answered_at or record.expires_at
        return max(ended, record.expires_at) + self.retention

    async def start(self) -> None:
        """Arm the next sweep (each start; every replica arms the same slot)."""
        result = await arm_sweep(self._bus, self.every_s, self._clock())
        log.info("retention.sweep_armed", every_s=self.every_s, duplicate=result.duplicate)

    async def sweep_at_start(self) -> None:
        """One sweep as the service starts, so a parked request whose timer's firing was lost is taken in now,
        not a whole ``every_s`` later (and what is due is purged). A failure is logged: the armed sweeps retry."""
        try:
            purged = await self.sweep()
        except Exception as exc:
            log.warning("retention.start_sweep_failed", error=repr(exc))
            return
        log.info("retention.swept_at_start", purged=purged, resumed=self.last_resumed, listed=self.last_listed)

    async def _entries(self) -> list[ChannelEntry]:
        """Every key of ``human-channels``: from the mirror when it has caught up with the bucket, else one
        listing; what was read from the server is added to :attr:`last_listed`."""
        if self._mirror is not None and await self._mirror.caught_up():
            entries = self._mirror.entries()
            read = self._mirror.delivered - self._delivered_mark
            self._delivered_mark = self._mirror.delivered
            self.last_mirrored = True
        else:
            entries = await channel_entries(self._bus)
            read = len(entries)
            self.last_mirrored = False
        self.last_listed += read
        return entries

    async def fired(self) -> None:
        """One sweep, the next one armed first: a sweep that keeps failing (its firing redelivered until the
        consumer gives up) must not end the chain of sweeps until the next start. Arming is idempotent (the
        same slot and id on every replica and every redelivery)."""
        await arm_sweep(self._bus, self.every_s, self._clock())
        purged = await self.sweep()
        log.info("retention.swept", purged=purged)

    async def sweep(self) -> int:
        """Purge every ended request past its retention, then the references nothing needs any more (see
        :func:`stale_references`); how many requests were purged.

        The requests bucket is not listed: every stored request has a run entry (``run.<run>.<id>``,
        written by its intake just after its record -- or by the intake's dead-letter hook when it was given up on in
        between, or by the answer, expiry or cancel that ended it first --, and by the start-up :func:`rebuild_index`
        for a record an older version stored without one), and it carries ``expires_at`` (and ``ended_at`` once the request ended). A
        request can be purged no earlier than its deadline + the retention (and its end + the retention),
        so one listing of ``human-channels`` tells which records to read: only those that may be due, and
        those whose run entry has no deadline (an older version's: dated here). The purge deletes the run
        entry last, so a crash part-way leaves it for the next sweep.

        Along the way it drops an older version's inbox entries (``open.*``) of a request that ended. A reference whose request has no run entry is dropped only once a read confirms that
        request is not stored."""
        store = await open_store(self._bus)
        refs = ChannelRefs(self._bus)
        now = self._clock()
        self.last_listed = 0
        entries = await self._entries()
        self.last_resumed = await self.resume_lost_parked(entries, now)
        runs = {e.value: e for e in entries if _is_run_entry(e.key)}
        opens: dict[str, list[ChannelEntry]] = {}
        for e in entries:
            if e.key.startswith("open."):
                opens.setdefault(e.value, []).append(e)
        purged = read = 0
        kept: dict[str, str] = {}  # request id -> run id (or its key part) of every record still there
        gone: set[str] = set()  # read and not stored
        for request_id, run in runs.items():
            run_part = run.key.split(".")[1]
            if run.expires_at is not None:
                earliest = max(run.expires_at, run.ended_at or run.expires_at) + self.retention
                # past its deadline and not marked ended: normally none (expired: marked); its end's mark was lost
                # (the gauges read it at every refresh until then), or it is overdue -- read, marked if it ended
                unmarked = run.ended_at is None and run.expires_at <= now
                if now < earliest and not unmarked:
                    kept[request_id] = run_part  # not due yet: not read
                    continue
            got = await store.get(request_id)
            read += 1
            if got is None:
                gone.add(request_id)  # purged, its run entry left by a crash: dropped with the references
                continue
            record = got.value
            due = self.due(record)
            if due is not None and now >= due and await self._purge(record, got.revision, opens.get(request_id, [])):
                purged += 1
                continue
            kept[request_id] = record.run_id
            if run.expires_at is None or (run.ended_at is None and not record.pending):
                await index_request_entry(self._bus, record)
                if not record.pending:
                    await _mark_ended_or_later(refs, run.key, record.ended_at or record.expires_at, record)
        dropped = 0
        for request_id, mine in opens.items():  # an older version's inbox entries (read by its inbox until upgraded)
            its_run = runs.get(request_id)
            if its_run is not None and its_run.ended_at is not None:
                dropped += await _drop(self._bus, mine)  # the request ended, the removal was lost
        if purged or read or dropped or self.last_resumed:  # keys were purged or written since: list again
            entries = await self._entries()
        checked = await self._confirm_gone(store, entries, kept, gone, now)
        await self._sweep_references(kept, now, entries)
        self.last_read = read + checked
        log.info("retention.sweep_read", read=read, checked=checked, kept=len(kept), listed=self.last_listed)
        return purged

    async def resume_lost_parked(self, entries: list[ChannelEntry], now: datetime) -> int:
        """The parked requests (``parked.<run>.<id>``, :mod:`.parking`) whose timer's firing was lost: the run's
        policy has been projected for :data:`PARKED_GRACE` (its wake-up would have taken the request in), or its
        deadline passed that long ago (its deadline timer would have refused it). Each goes to ``resume`` as
        its timer would have sent it (idempotent: a firing that comes after all finds it gone). A firing is
        lost when a replica of a version before parking is handed it and dead-letters it (a rolling upgrade,
        docs/human-interaction.md). One whose intake fails now (no channel can take it yet) is left parked for
        the next sweep; the others go on. How many were resumed."""
        if self._resume is None:
            return 0
        policies = {e.key: e for e in entries if e.key.startswith("policy.") and e.key.count(".") == 1}
        resumed = 0
        for entry in entries:
            if not entry.key.startswith("parked.") or entry.key.count(".") != 2:
                continue
            try:
                event = Envelope.model_validate_json(entry.value)
                run_id, request_id = str(event.data["run_id"]), str(event.data["request_id"])
                expires_at = datetime.fromisoformat(str(event.data["expires_at"]))
            except (ValidationError, KeyError, ValueError):
                log.warning("retention.parked_unreadable", key=entry.key)
                continue
            policy = policies.get(ref_key("policy", run_id))
            if policy is not None and policy.created_at + PARKED_GRACE <= now:
                final = False
            elif expires_at + PARKED_GRACE <= now:
                final = True
            else:
                continue  # its timers are still to fire
            log.warning("retention.parked_timer_lost", request_id=request_id, run_id=run_id, final=final)
            try:
                await self._resume(run_id, request_id, final=final)
            except Exception as exc:  # one request's intake failing (no channel yet) must not stop the sweep
                log.warning("retention.parked_resume_failed", request_id=request_id, error=repr(exc))
                continue
            resumed += 1
        return resumed

    async def _confirm_gone(
        self, store: RequestStore, entries: list[ChannelEntry], kept: dict[str, str], gone: set[str], now: datetime
    ) -> int:
        """Read each request the references would be purged for that has no run entry: one still stored
        (an older version's, before any start dated it) is kept. How many were read."""
        suspects: set[str] = set()
        by_key = {e.key: e for e in entries}
        for key, _ in stale_references(entries, kept, now, self.retention):
            found = by_key.get(key)
            if found is None:
                continue
            parts = tuple(key.split("."))
            if any(parts[: len(p)] == p for p in _VALUE_IS_REQUEST) or parts[:2] == ("matrix", "latest"):
                suspects.add(found.value)
            elif any(parts[: len(p)] == p for p in _KEY_NAMES_REQUEST) and len(parts) >= 3:
                suspects.add(parts[2])
        checked = 0
        for request_id in sorted(suspects - gone - set(kept)):
            if not is_request_id(request_id):
                continue
            got = await store.get(request_id)
            checked += 1
            if got is not None:
                kept[request_id] = got.value.run_id
        return checked

    async def _sweep_references(self, kept: dict[str, str], now: datetime, entries: list[ChannelEntry]) -> None:
        kv = await self._bus.kv(BUCKET_HUMAN_CHANNELS)
        stale = stale_references(entries, kept, now, self.retention)
        for key, revision in stale:
            try:  # a compare-and-set: a key written again meanwhile (the newest question in a room) stays
                await kv.delete(key, last=revision)
            except KeyWrongLastSequenceError:
                log.info("retention.reference_changed_meanwhile", key=key)
        if stale:
            log.info("retention.references_purged", count=len(stale))

    async def _purge(self, record: HumanRequestRecord, revision: int, legacy: list[ChannelEntry]) -> bool:
        """``legacy``: the older version's inbox entries of the request, as listed (none written since)."""
        refs = ChannelRefs(self._bus)
        keys = [e.key for e in legacy]
        token = await refs.get(ref_key("telegram", "req", record.request_id))
        if token is not None:
            keys += [ref_key("telegram", "token", token), ref_key("telegram", "req", record.request_id)]
        for copy in record.deliveries:
            if copy.channel == "telegram" and copy.address is not None:
                keys.append(ref_key("telegram", "msg", copy.address, copy.reference))
                keys.append(ref_key("telegram", "sent", record.request_id, copy.tag or "q", copy.address))
            elif copy.channel == "matrix":
                keys.append(ref_key("matrix", "event", copy.reference))
                poll_id = await refs.get(ref_key("matrix", "poll", copy.reference))
                if poll_id is not None:  # the question's poll: its binding and the question -> poll link
                    keys += [ref_key("matrix", "event", poll_id), ref_key("matrix", "poll", copy.reference)]
        for key in keys:  # the references first: a crash here leaves the record, purged by the next sweep
            await refs.delete(key)
        kv = await self._bus.kv(BUCKET_HUMAN_REQUESTS)
        try:
            await kv.delete(record.request_id, last=revision)
        except KeyWrongLastSequenceError:
            log.info("retention.changed_meanwhile", request_id=record.request_id)
            return False
        await refs.delete(ref_key("run", record.run_id, record.request_id))  # last: it is how sweeps find it
        log.info("retention.purged", request_id=record.request_id, status=record.status.value)
        return True
