"""The per-recipient index of open requests, and the retention purge of ended ones (HUM-3).

**Index.** ``open.<user id>.<request id>`` in ``human-channels`` (value: the request id and its deadline,
``expires_at``) for every person who may answer a pending request: the recipient, a group's members, the
escalation target and its members. ``GET /inbox`` reads only the caller's keys (a server-side filtered
watch), never every request; the request gauges count the index (:func:`.metrics.count_open`) and read a
record only for a request past its deadline.

* Written *before* the record (:func:`index_open` at intake, before the create; at escalation, before the
  target is recorded), create-if-absent: a crash in between leaves an entry without a record, which the
  inbox skips, never a pending record that is missing from its inbox.
* Removed when the request ends (answered, expired, cancelled: :func:`unindex`, best effort). An entry left
  behind (a crash, a failed delete) is harmless: the inbox shows a request only when the record says it is
  pending and the caller may answer it, and drops the stale entry as it goes.
* Completed at every start (:func:`rebuild_index`, idempotent): from one listing of the index and one of the
  request keys, the records an older version stored (no dated run entry, inbox entries without a deadline)
  and those whose inbox entries are all gone before their deadline are read, and indexed again while
  pending; two replicas doing it at once agree.

**Retention.** An ended request (answered / expired / cancelled) is kept ``retention`` after it ended — and
at least until its deadline passed, so no timer of it is still to fire — then purged: its channel
references (Telegram token and message keys, Matrix event keys, the run and inbox index entries) first, the
record last, with a compare-and-set on the revision read (a record that changed meanwhile is left for the
next sweep). The sweep reads only the records that may be due: each request's run entry
(``run.<run>.<id>``) carries its ``expires_at``, and nothing is purged before ``expires_at`` + retention;
a stored request without a dated run entry is read (and its entry dated). Then every other reference nothing needs any more (:func:`stale_references`): whatever is
left of a request no longer stored (a send claimed but never recorded, an index entry whose record never
came), notification markers, and an ended run's policy and end marker once none of its requests is kept —
never a person's DM room or the sync token. One sweep per ``every_s`` runs on the durable timer ``…schedule.human._sweep.retention``: the
timers consumer gives each firing to one replica, and every replica arms the same slot (the next multiple of
``every_s``) with the same message id, so they never sweep twice nor push each other's sweep later.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import structlog
from nats.js.errors import KeyWrongLastSequenceError
from pydantic import ValidationError

from temporality_bus import Bus, PublishResult, live_entries, live_keys
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRef, ChannelRefs, ref_key
from temporality_human_interaction.directory import user_id_of
from temporality_human_interaction.records import HumanRequestRecord, RequestStore, open_store
from temporality_human_interaction.timers import human_timers
from temporality_protocol import derive_id
from temporality_protocol.catalog import BUCKET_HUMAN_REQUESTS

__all__ = [
    "SWEEP_KEY",
    "ChannelEntry",
    "RetentionSweeper",
    "answerers",
    "arm_sweep",
    "channel_entries",
    "inbox_key",
    "index_open",
    "index_people",
    "is_sweep",
    "list_inbox",
    "open_requests_of",
    "rebuild_index",
    "stale_references",
    "unindex",
]

log = structlog.get_logger(__name__)

#: The retention sweep's timer key (never a request id's: those have no dot, and ``.retention`` is no suffix).
SWEEP_KEY = "_sweep.retention"
_LIST_TIMEOUT_S = 5.0
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
    """Index ``record`` under each of ``people`` (``user:<id>``), with its deadline (create-if-absent)."""
    refs = ChannelRefs(bus)
    for person in people:
        if user_id_of(person) is not None:
            await refs.claim(inbox_key(person, record.request_id), record.request_id, expires_at=record.expires_at)


async def index_open(bus: Bus, record: HumanRequestRecord) -> None:
    """Index ``record`` under everyone who may answer it (create-if-absent: a repeat is a no-op)."""
    await index_people(bus, record, answerers(record))


async def unindex(bus: Bus, record: HumanRequestRecord) -> None:
    """Drop ``record``'s inbox entries (best effort: a stale entry is skipped by the inbox and dropped there)."""
    refs = ChannelRefs(bus)
    for person in answerers(record):
        try:
            await refs.delete(inbox_key(person, record.request_id))
        except Exception as exc:
            log.warning("inbox.unindex_failed", request_id=record.request_id, person=person, error=repr(exc))


async def open_requests_of(bus: Bus, user: str) -> list[str]:
    """The request ids indexed under ``user``: a server-side filtered listing of ``open.<user>.*``."""
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    return sorted(
        key.rsplit(".", 1)[1] for key in await live_keys(kv, f"{ref_key('open', user)}.*", timeout_s=_LIST_TIMEOUT_S)
    )


async def list_inbox(bus: Bus, store: RequestStore, user: str) -> list[HumanRequestRecord]:
    """``user``'s pending requests (their own, their groups', escalated to them), newest first, from the index."""
    refs = ChannelRefs(bus)
    found: list[HumanRequestRecord] = []
    for request_id in await open_requests_of(bus, user):
        got = await store.get(request_id)
        if got is None:  # indexed before its record was stored (or purged): not shown, left alone
            continue
        record = got.value
        if record.pending and record.may_answer(user):
            found.append(record)
        elif not record.pending:
            await refs.delete(inbox_key(user, request_id))  # a removal that was lost: done now
    found.sort(key=lambda r: (r.created_at, r.request_id), reverse=True)
    return found


async def rebuild_index(bus: Bus, *, now: datetime | None = None) -> int:
    """Fill in what the indexes miss; how many pending requests that found (and indexed again).

    One listing of ``human-channels`` and one of the request keys; a record is read only when

    * its run entry (``run.<run>.<id>``, written before every record since it carries the deadline) is
      missing or has no ``expires_at``, or one of its inbox entries has none: stored by an older version;
    * or its deadline is ahead and it has no inbox entry at all: it ended (its entries were removed), or
      its entries were lost (a wipe of the index).

    Each is indexed again (idempotent; an entry without a deadline gets it, compare-and-set): its run
    entry, and while it is pending its inbox entries. Every replica does this at start; two doing it at
    once agree. From then on the gauges and the sweep work from the index."""
    store = await open_store(bus)
    refs = ChannelRefs(bus)
    now = now or _utcnow()
    entries = await channel_entries(bus)
    dated = {e.value: e.expires_at for e in entries if _is_run_entry(e.key) and e.expires_at is not None}
    listed = {e.value for e in entries if e.key.startswith("open.")}
    undated_open: dict[str, list[ChannelEntry]] = {}
    for e in entries:
        if e.key.startswith("open.") and e.expires_at is None:
            undated_open.setdefault(e.value, []).append(e)
    wanted: set[str] = set(undated_open)
    for request_id in await store.keys():
        expires_at = dated.get(request_id)
        if expires_at is None or (expires_at > now and request_id not in listed):
            wanted.add(request_id)
    read = pending = 0
    for request_id in sorted(wanted):
        got = await store.get(request_id)
        if got is None:
            continue
        read += 1
        record = got.value
        await index_request_entry(bus, record)
        for e in undated_open.get(request_id, []):  # whoever it is under (the pending ones' answerers: below)
            await refs.fill_expiry(
                e.key, ChannelRef(value=e.value, created_at=e.created_at), e.revision, record.expires_at
            )
        if record.pending:
            await index_open(bus, record)
            pending += 1
    log.info("inbox.index_rebuilt", read=read, pending=pending)
    return pending


async def index_request_entry(bus: Bus, record: HumanRequestRecord) -> None:
    """``run.<run id>.<request id>`` with the deadline (as :func:`.runs.index_request` writes it)."""
    await ChannelRefs(bus).claim(
        ref_key("run", record.run_id, record.request_id), record.request_id, expires_at=record.expires_at
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


@dataclass(frozen=True)
class ChannelEntry:
    """One key of ``human-channels`` as the sweep reads it."""

    key: str
    value: str
    created_at: datetime
    revision: int
    #: The request's deadline on an index entry (``open.*``, ``run.*``); None elsewhere and on old entries.
    expires_at: datetime | None = None


async def channel_entries(bus: Bus, *, timeout_s: float = _SWEEP_LIST_TIMEOUT_S) -> list[ChannelEntry]:
    """Every key of ``human-channels`` with its value: one listing of the bucket (each key's last entry,
    :func:`temporality_bus.live_entries`), not one read per key."""
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    out: list[ChannelEntry] = []
    for entry in await live_entries(kv, timeout_s=timeout_s):
        try:
            ref = ChannelRef.model_validate_json(entry.value or b"")
        except ValidationError:
            continue  # not ours to judge
        out.append(ChannelEntry(str(entry.key), ref.value, ref.created_at, int(entry.revision or 0), ref.expires_at))
    return out


#: ``<prefix>`` -> the key's value is the request id (``open.<user>.<id>``, ``telegram.token.<token>``, ...).
_VALUE_IS_REQUEST = (
    ("open",),
    ("run",),
    ("withdrawn",),
    ("telegram", "token"),
    ("telegram", "msg"),
    ("matrix", "event"),
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


class RetentionSweeper:
    """Purges ended requests past the retention; :meth:`fired` is what the timers handler calls."""

    def __init__(
        self,
        bus: Bus,
        *,
        retention: timedelta,
        every_s: float,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._bus = bus
        self.retention = retention
        self.every_s = every_s
        self._clock = clock or _utcnow
        #: How many request records the last :meth:`sweep` read (those that may have been due).
        self.last_read = 0

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

    async def fired(self) -> None:
        purged = await self.sweep()
        await arm_sweep(self._bus, self.every_s, self._clock())
        log.info("retention.swept", purged=purged)

    async def sweep(self) -> int:
        """Purge every ended request past its retention, then the references nothing needs any more (see
        :func:`stale_references`); how many requests were purged.

        Only requests that may be due are read: a request can be purged no earlier than its ``expires_at``
        + retention, and its run entry (``run.<run>.<id>``) carries ``expires_at``, so one listing of
        ``human-channels`` and one of the request keys tell which ones to read. A stored request without
        a dated run entry (an older version's) is read, and its entry dated so the next sweep need not."""
        store = await open_store(self._bus)
        now = self._clock()
        entries = await channel_entries(self._bus)
        dated: dict[str, tuple[str, datetime]] = {}  # request id -> (run id as a key part, expires_at)
        for entry in entries:
            if _is_run_entry(entry.key) and entry.expires_at is not None:
                dated[entry.value] = (entry.key.split(".")[1], entry.expires_at)
        purged = read = 0
        kept: dict[str, str] = {}  # request id -> run id (or its key part) of every record still there
        for key in await store.keys():
            known = dated.get(key)
            if known is not None and now < known[1] + self.retention:
                kept[key] = known[0]  # not due before its deadline + the retention: not read
                continue
            got = await store.get(key)
            read += 1
            if got is None:
                continue
            due = self.due(got.value)
            if due is not None and now >= due and await self._purge(got.value, got.revision):
                purged += 1
                continue
            kept[got.value.request_id] = got.value.run_id
            if known is None:
                await index_request_entry(self._bus, got.value)
        if purged or read:  # keys were purged or written since the listing: list again for the references
            entries = await channel_entries(self._bus)
        await self._sweep_references(kept, now, entries)
        self.last_read = read
        log.info("retention.sweep_read", read=read, kept=len(kept))
        return purged

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

    async def _purge(self, record: HumanRequestRecord, revision: int) -> bool:
        refs = ChannelRefs(self._bus)
        keys = [inbox_key(p, record.request_id) for p in answerers(record)]
        keys.append(ref_key("run", record.run_id, record.request_id))
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
        log.info("retention.purged", request_id=record.request_id, status=record.status.value)
        return True
