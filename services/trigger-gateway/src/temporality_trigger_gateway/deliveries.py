"""Per-delivery processing state (IDEM-1, issue 7): what became of each delivery, queryable per trigger.

Every delivery that takes the launch path (a webhook, an event trigger's event, a flow-controlled schedule
tick) is recorded in the ``trigger-deliveries`` bucket under ``<trigger id>.<delivery id>``, once its
outcome is known (the record holds the normalized event, when it is at most MAX_EVENT_BYTES as JSON, so the
delivery can be re-driven)::

    received   (records of earlier versions only: a launch in progress; a launch now writes its outcome)
    accepted   run.requested was published (``run_id``)
    rejected   trigger.rejected was published (``reason``, ``detail``: duplicate, disabled, concurrency_skip ...)
    queued / debounced   waiting for its concurrency key (a later accepted or rejected follows)
    failed     the bus did not acknowledge (``detail``); the webhook sender was told 503 and retries, a bus
               message is redelivered with backoff: nothing is lost meanwhile

The launch path writes a record with the events that decide its outcome, before its answer: one
create-if-absent, with a webhook delivery's index entry, in the same pipelined round trip as the events
(:meth:`Deliveries.writes`, :meth:`Deliveries.written`), so a process killed after an answer loses no record. A
``failed`` record (the events were not stored: known only after that round) is written behind the answer
(:mod:`.behind`, :meth:`Deliveries.finish`); this replica's reads (the deliveries API, :meth:`Deliveries.record`)
wait for its queued writes first.

Recording is best effort: the journal (``trigger.*`` events) is the truth, and a delivery is never refused
because its record could not be written (logged ``delivery.not_recorded``). A record the bus did not take
(NATS away: typically a ``failed`` delivery's) is written again in the background (``RECORD_RETRIES_S``,
about two minutes), never awaited by an answer; a crash loses the records still queued or waiting for a retry
(docs/triggers.md). A re-drive
(:func:`.admin.admin_router`) re-runs a rejected or failed delivery through the launch path as a new
delivery (``redrive_of``) with the *original event id*, so the dedupe claim makes it a duplicate of an
event that was accepted meanwhile, never a second run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, ValidationError, model_serializer
from pydantic_core import to_json

from temporality_bus import BusError, Conflict, PublishResult, Store, TransientError, evolve, live_keys
from temporality_bus.pipeline import Write, kv_write
from temporality_protocol import NormalizedEvent
from temporality_protocol.catalog import BUCKET_DELIVERIES
from temporality_protocol.trigger_admin import DeliveryState, DeliveryView
from temporality_trigger_gateway.behind import Settle, WriteBehind

if TYPE_CHECKING:
    from temporality_bus import Bus
    from temporality_trigger_gateway.launch import TriggerDelivery

__all__ = [
    "MAX_EVENT_BYTES",
    "Deliveries",
    "DeliveryRecord",
    "DeliveryState",
    "DeliveryView",
    "Draft",
    "delivery_key",
    "index_key",
]

log = structlog.get_logger(__name__)

#: A normalized event larger than this (as JSON) is not kept with its delivery, which then cannot be re-driven.
MAX_EVENT_BYTES = 64 * 1024
#: A record the bus did not take (not connected, no answer) is written again after these delays (seconds), in
#: the background: about two minutes in all.
RECORD_RETRIES_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
#: At most this many records wait for such a retry at once (each holds its event, up to MAX_EVENT_BYTES); past
#: it a record the bus did not take is given up at once, as before.
MAX_RECORD_RETRIES = 1000


class DeliveryRecord(BaseModel):
    """One delivery's processing state (the value under ``<trigger id>.<delivery id>``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trigger_id: str
    delivery_id: str
    kind: Literal["webhook", "event", "schedule"]
    adapter: str
    source_event_id: str | None = None
    source_event_type: str | None = None
    body_bytes: int = 0
    depth: int = 0
    causation_id: str | None = None
    correlation_id: str | None = None
    state: DeliveryState
    reason: str | None = None
    detail: str | None = None
    run_id: str | None = None
    title: str | None = None
    received_at: datetime
    updated_at: datetime
    #: The normalized event (``None``: never normalized, or larger than MAX_EVENT_BYTES: ``event_omitted``).
    event: NormalizedEvent | None = None
    event_omitted: bool = False
    #: A re-drive: the delivery it re-runs; on the original, the re-drives made of it.
    redrive_of: str | None = None
    redriven_as: list[str] = Field(default_factory=list)
    #: A rerun (``{"rerun": n}``: the accepted delivery ``redrive_of`` run again as a new run): its number, and the
    #: run it runs again. Stored only on a rerun's record (:meth:`_stored`).
    rerun: int | None = None
    rerun_of: str | None = None

    @model_serializer(mode="wrap")
    def _stored(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The record's JSON without ``rerun``/``rerun_of`` unless it is a rerun's: a gateway of an earlier version
        (a rolling upgrade) reads every other record as before (its model forbids unknown fields)."""
        data: dict[str, Any] = handler(self)
        if self.rerun is None and self.rerun_of is None:
            data.pop("rerun", None)
            data.pop("rerun_of", None)
        return data

    def view(self) -> dict[str, object]:
        """As the deliveries API shows it (:class:`DeliveryView`): every field but the event itself
        (``has_event`` says if kept)."""
        shown = self.model_dump(mode="json", exclude={"event"})
        shown.setdefault("rerun", None)
        shown.setdefault("rerun_of", None)
        shown["has_event"] = self.event is not None
        return shown


def delivery_key(trigger_id: str, delivery_id: str) -> str:
    return f"{trigger_id}.{delivery_id}"


#: The receipt time as an index key token: fixed width, so the keys sort as the times do.
_STAMP = "%Y%m%dT%H%M%S%fZ"


def index_key(trigger_id: str, received_at: datetime, delivery_id: str) -> str:
    """The delivery's entry in its trigger's index: ``<trigger id>.at.<receipt time>.<delivery id>``
    (written once, when the record is created; the listing orders and pages the keys alone)."""
    at = received_at if received_at.tzinfo is UTC else received_at.astimezone(UTC)
    if at.year < 1000:  # strftime's %Y does not pad a year below 1000 (glibc): its text, as before
        return f"{trigger_id}.at.{at.strftime(_STAMP)}.{delivery_id}"
    # _STAMP written out: the same text as strftime's, without its per-call format parsing (a new key per webhook)
    return (
        f"{trigger_id}.at.{at.year:04d}{at.month:02d}{at.day:02d}T{at.hour:02d}{at.minute:02d}{at.second:02d}"
        f"{at.microsecond:06d}Z.{delivery_id}"
    )


def _indexed(key: str, trigger_id: str) -> tuple[datetime, str] | None:
    """(receipt time, delivery id) of an index key of ``trigger_id`` (``None``: not one)."""
    parts = key.removeprefix(f"{trigger_id}.").split(".")
    if len(parts) != 3 or parts[0] != "at":
        return None
    try:
        return datetime.strptime(parts[1], _STAMP).replace(tzinfo=UTC), parts[2]
    except ValueError:
        return None


def _kept(event: NormalizedEvent | None) -> tuple[NormalizedEvent | None, bool]:
    if event is None:
        return None, False
    if len(event.model_dump_json()) > MAX_EVENT_BYTES:
        return None, True
    return event, False


@dataclass
class Draft:
    """One delivery's record on the launch path, built once and written once, in its outcome's state
    (:meth:`Deliveries.draft`, :meth:`Deliveries.finish`), behind the answer (:mod:`.behind`).

    Once its outcome is known the record is written by :meth:`record_json`: its JSON straight from its typed
    values (the same bytes as the model's, :meth:`head` + :meth:`encoded`, which a test compares), with the event
    encoded once (``event_json``) spliced in, so neither is validated again nor re-encoded."""

    delivery: TriggerDelivery
    event: NormalizedEvent
    key: str
    event_json: bytes | None
    #: The delivery id is new (a webhook's): the record cannot exist yet, its index entry goes out with it.
    fresh: bool
    received_at: datetime
    title: str | None = None
    redrive_of: str | None = None
    #: Whether the record went out with the launch's events (:meth:`Deliveries.writes`): ``None`` not (it is
    #: written behind the answer, :meth:`Deliveries.finish`), ``True`` stored, ``False`` sent but not known stored.
    recorded: bool | None = None

    def head(
        self,
        state: DeliveryState,
        *,
        run_id: str | None = None,
        reason: str | None = None,
        detail: str | None = None,
        updated_at: datetime | None = None,
    ) -> DeliveryRecord:
        """The record in ``state``, without its event (one validating construction)."""
        return _received(
            self.delivery,
            self.received_at,
            redrive_of=self.redrive_of,
            title=self.title,
            event_omitted=self.event_json is None,
            state=state,
            run_id=run_id,
            reason=reason,
            detail=None if detail is None else detail[:1000],
            updated_at=updated_at or datetime.now(UTC),
        )

    def record_json(
        self,
        state: DeliveryState,
        *,
        run_id: str | None = None,
        reason: str | None = None,
        detail: str | None = None,
        updated_at: datetime | None = None,
    ) -> bytes:
        """The record in ``state`` with the draft's event, as stored: byte for byte what :meth:`encoded` writes of
        :meth:`head` (a test compares them), without building the model -- every value is typed and comes from
        the delivery, the draft or the launch path, so the validating construction (the record's biggest cost on
        the webhook path) would check nothing a reader's validation does not. Its fields in the model's order."""
        delivery = self.delivery
        updated_at = updated_at or datetime.now(UTC)
        doc = to_json(
            {
                "trigger_id": delivery.trigger.id,
                "delivery_id": delivery.delivery_id,
                "kind": delivery.kind,
                "adapter": delivery.adapter,
                "source_event_id": delivery.source_event_id,
                "source_event_type": delivery.source_event_type,
                "body_bytes": delivery.body_bytes,
                "depth": delivery.depth,
                "causation_id": delivery.causation_id,
                "correlation_id": delivery.correlation_id,
                "state": state,
                "reason": reason,
                "detail": None if detail is None else detail[:1000],
                "run_id": run_id,
                "title": self.title,
                "received_at": self.received_at,
                "updated_at": updated_at,
                "event": None,
                "event_omitted": self.event_json is None,
                "redrive_of": self.redrive_of,
                "redriven_as": [],
                **(
                    {}
                    if delivery.rerun is None and delivery.rerun_of is None
                    else {"rerun": delivery.rerun, "rerun_of": delivery.rerun_of}
                ),
            }
        )
        if self.event_json is None:
            return doc
        spliced = doc.replace(_NO_EVENT, b'"event":' + self.event_json, 1)  # (see encoded: the one unescaped place)
        if spliced != doc:
            return spliced
        never_expected = self.head(state, run_id=run_id, reason=reason, detail=detail, updated_at=updated_at)
        return self.encoded(never_expected)

    def encoded(self, head: DeliveryRecord) -> bytes:
        """``head`` with the draft's event, as stored (the model's JSON: a reader validates it as usual).

        The head has no event: its JSON's ``"event":null`` becomes the event's JSON (the one place that text
        can stand with its quotes unescaped is the record's own ``event`` key), one serialization with no
        field excluded."""
        if head.event is None:
            doc = head.__pydantic_serializer__.to_json(head)
            if self.event_json is None:
                return doc
            spliced = doc.replace(_NO_EVENT, b'"event":' + self.event_json, 1)
            if spliced != doc:  # else the JSON no longer reads as expected: the event appended below
                return spliced
        doc = head.model_dump_json(exclude={"event"}).encode()
        if self.event_json is None:
            return doc
        return doc[:-1] + b',"event":' + self.event_json + b"}"


#: A record without its event, as its JSON says it (:meth:`Draft.encoded`).
_NO_EVENT = b'"event":null'


class Deliveries:
    """The ``trigger-deliveries`` bucket: record, update, list (newest first), read."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._store: Store[DeliveryRecord] | None = None
        self._behind = WriteBehind.of(bus)
        #: Records waiting to be written again (the bus was away when they were first written).
        self._retrying = 0

    async def store(self) -> Store[DeliveryRecord]:
        if self._store is None:
            self._store = await self._bus.store(BUCKET_DELIVERIES, DeliveryRecord)
        return self._store

    async def record(
        self,
        delivery: TriggerDelivery,
        state: DeliveryState,
        *,
        event: NormalizedEvent | None = None,
        title: str | None = None,
        run_id: str | None = None,
        reason: str | None = None,
        detail: str | None = None,
        redrive_of: str | None = None,
        index: bool = True,
        keep_run: bool = True,
    ) -> None:
        """Write the delivery's record as it is now (best effort). A later state keeps the event, title,
        receipt time and re-drive links the record already has (and its run id, unless ``keep_run`` is false: a
        record written with its launch's events, corrected to ``failed`` when they were not stored). ``index``: a
        record this call creates gets its index entry (``False``: it has one already)."""
        await self._behind.settled()  # this replica's writes behind first (read-your-writes)
        now = datetime.now(UTC)
        kept, omitted = _kept(event)

        def step(current: DeliveryRecord) -> DeliveryRecord:
            return evolve(
                current,
                state=state,
                run_id=run_id or (current.run_id if keep_run else None),
                reason=reason,
                detail=None if detail is None else detail[:1000],
                updated_at=now,
                event=kept or current.event,
                event_omitted=omitted or current.event_omitted,
                title=title or current.title,
            )

        def create() -> DeliveryRecord:
            return _received(delivery, now, redrive_of=redrive_of)

        key = delivery_key(delivery.trigger.id, delivery.delivery_id)
        stored = await self._best_effort(key, (await self._safe_store()), step, create)
        if index and stored is not None and stored.received_at == now:  # created by this call: index it
            try:
                kv = await self._bus.kv(BUCKET_DELIVERIES)
                await kv.put(index_key(delivery.trigger.id, now, delivery.delivery_id), delivery.delivery_id.encode())
            except Exception as exc:
                log.warning("delivery.not_indexed", key=key, error=repr(exc))

    # ------------------------------------------------------------------ the launch path's pipelined writes
    async def draft(
        self,
        delivery: TriggerDelivery,
        *,
        event: NormalizedEvent,
        title: str | None,
        redrive_of: str | None = None,
    ) -> Draft:
        """The record of ``delivery``, not written yet (:meth:`finish` writes it in its outcome's state)."""
        if self._store is None:
            await self._safe_store()  # the bucket opened (ensured) once, so the pipelined writes find its stream
        now = datetime.now(UTC)
        encoded = event.__pydantic_serializer__.to_json(event)  # once: spliced into every write of the record
        event_json = None if len(encoded) > MAX_EVENT_BYTES else encoded
        fresh = delivery.kind == "webhook" and redrive_of is None  # its id is new_id(): never written before
        key = delivery_key(delivery.trigger.id, delivery.delivery_id)
        return Draft(delivery, event, key, event_json, fresh, now, title=title, redrive_of=redrive_of)

    def finish(
        self,
        draft: Draft,
        state: DeliveryState,
        *,
        run_id: str | None = None,
        reason: str | None = None,
        detail: str | None = None,
    ) -> None:
        """Record the draft's delivery in ``state``, behind the answer (:class:`.behind.WriteBehind`): one
        create-if-absent of the record (with the event) and, for a fresh delivery id, its index entry. A
        record that exists already (a redelivered bus message, whose delivery id is derived) is updated the
        read-modify-write way, keeping what it has. Best effort: a failure is logged."""
        writes = self.writes(draft, state, run_id=run_id, reason=reason, detail=detail)
        self._behind.add(writes, self._settler(draft, state, writes, 0, run_id=run_id, reason=reason, detail=detail))

    def writes(
        self,
        draft: Draft,
        state: DeliveryState,
        *,
        run_id: str | None = None,
        reason: str | None = None,
        detail: str | None = None,
    ) -> list[Write]:
        """The writes that record the draft's delivery in ``state``: the record's create-if-absent (with the event)
        and, for a fresh delivery id, its index entry. :meth:`finish` queues them behind the answer; the launch path
        sends them with the events that decide the outcome (:meth:`written` takes their outcomes)."""
        bucket = BUCKET_DELIVERIES.name
        encoded = draft.record_json(state, run_id=run_id, reason=reason, detail=detail)
        writes = [kv_write(bucket, draft.key, encoded, revision=0)]
        if draft.fresh:
            delivery_id = draft.delivery.delivery_id
            writes.append(
                kv_write(
                    bucket, index_key(draft.delivery.trigger.id, draft.received_at, delivery_id), delivery_id.encode()
                )
            )
        return writes

    async def written(
        self,
        draft: Draft,
        state: DeliveryState,
        writes: list[Write],
        results: list[PublishResult | BusError],
        *,
        run_id: str | None = None,
        reason: str | None = None,
        detail: str | None = None,
    ) -> None:
        """Take the outcomes of :meth:`writes` sent with a launch's events: nothing more to do when both were stored
        (the hot path); else as behind the answer -- a record found (a redelivered bus message) updated, a write the
        bus did not take written again in the background, anything else logged."""
        if all(isinstance(result, PublishResult) for result in results):
            return
        await self._settler(draft, state, writes, 0, run_id=run_id, reason=reason, detail=detail)(results)

    def _settler(
        self,
        draft: Draft,
        state: DeliveryState,
        writes: list[Write],
        attempt: int,
        *,
        run_id: str | None,
        reason: str | None,
        detail: str | None,
    ) -> Settle:
        """What follows the outcomes of a record's ``writes`` (try ``attempt``)."""

        async def settle(results: list[PublishResult | BusError]) -> None:
            again: list[Write] = []
            for write, result in zip(writes, results, strict=True):
                if isinstance(result, PublishResult):
                    continue
                record = write.key == draft.key  # (else its index entry)
                if record and isinstance(result, Conflict):
                    # recorded before (a redelivery; or this write's own earlier try, its ack lost): keep its
                    # record, move its state
                    await self.record(
                        draft.delivery,
                        state,
                        event=draft.event,
                        title=draft.title,
                        run_id=run_id,
                        reason=reason,
                        detail=detail,
                        redrive_of=draft.redrive_of,
                    )
                elif isinstance(result, TransientError) and not isinstance(result, Conflict):
                    again.append(write)  # the bus was away: tried again below
                else:
                    what = "delivery.not_recorded" if record else "delivery.not_indexed"
                    log.warning(what, key=draft.key, state=state, error=repr(result))
            if again:

                def queue(retried: list[Write]) -> None:
                    follow = self._settler(
                        draft, state, retried, attempt + 1, run_id=run_id, reason=reason, detail=detail
                    )
                    self._behind.add(retried, follow)

                self._retry_later(again, attempt, queue, draft.key, state)

        return settle

    def _retry_later(
        self, writes: list[Write], attempt: int, queue: Callable[[list[Write]], None], key: str, state: str
    ) -> None:
        """Queue ``writes`` (a record, its index entry) again after :data:`RECORD_RETRIES_S` ``[attempt]``, in the
        background: never awaited by a launch, so it costs the webhook path nothing. Past the last delay, or
        while :data:`MAX_RECORD_RETRIES` records already wait for one, the record is given up (logged)."""
        if attempt >= len(RECORD_RETRIES_S) or self._retrying >= MAX_RECORD_RETRIES:
            log.warning(
                "delivery.not_recorded", key=key, state=state, error="the bus stayed away", attempts=attempt + 1
            )
            return
        self._retrying += 1

        def again() -> None:
            self._retrying -= 1
            queue(writes)

        asyncio.get_running_loop().call_later(RECORD_RETRIES_S[attempt], again)
        log.info("delivery.record_retry", key=key, state=state, in_s=RECORD_RETRIES_S[attempt])

    async def redriven(self, trigger_id: str, delivery_id: str, as_delivery: str) -> None:
        """Note on the original delivery that it was re-driven as ``as_delivery`` (best effort)."""

        def step(current: DeliveryRecord) -> DeliveryRecord:
            if as_delivery in current.redriven_as:
                return current
            return evolve(current, redriven_as=[*current.redriven_as, as_delivery][-20:], updated_at=datetime.now(UTC))

        try:
            await (await self.store()).modify(delivery_key(trigger_id, delivery_id), step)
        except Exception as exc:  # NotFound (expired), or the bus: best effort
            log.warning("delivery.not_recorded", delivery_id=delivery_id, error=repr(exc))

    async def settle_waiting(
        self, trigger_id: str, delivery_id: str, state: DeliveryState, *, reason: str | None, detail: str
    ) -> tuple[DeliveryRecord | None, bool]:
        """A queued or debounced delivery that will never start: its existing record moved to ``state`` (best
        effort; a record that is missing is not created). The record as it was, and whether it was already
        ``accepted`` (then left as it is: its run started)."""
        await self._behind.settled()
        store = await self._safe_store()
        if store is None or not self._bus.nc.is_connected:
            return None, False
        before: list[DeliveryRecord] = []

        def step(current: DeliveryRecord) -> DeliveryRecord:
            before[:] = [current]
            if current.state == "accepted":
                return current
            return evolve(current, state=state, reason=reason, detail=detail[:1000], updated_at=datetime.now(UTC))

        try:
            await store.modify(delivery_key(trigger_id, delivery_id), step)
        except Exception as exc:  # NotFound (expired, or never written: best effort), or the bus
            log.warning("delivery.not_recorded", delivery_id=delivery_id, error=repr(exc))
        found = before[0] if before else None
        return found, found is not None and found.state == "accepted"

    async def get(self, trigger_id: str, delivery_id: str) -> DeliveryRecord | None:
        await self._behind.settled()
        found = await (await self.store()).get(delivery_key(trigger_id, delivery_id))
        return None if found is None else found.value

    async def newest(
        self, trigger_id: str, *, before: tuple[datetime, str] | None, limit: int
    ) -> tuple[list[DeliveryRecord], tuple[datetime, str] | None]:
        """Up to ``limit`` records of ``trigger_id``, newest first, received before the ``before`` cursor
        (time, delivery id); and the cursor of the next page (``None``: no more).

        Reads the trigger's *keys* (one filtered, headers-only KV watch: no values) and orders them by the
        index keys' receipt times, then fetches only the page's records. A record without an index entry
        (written before the index existed) is read to learn its receipt time."""
        await self._behind.settled()  # what this replica answered is listed
        keys = await self._keys(f"{trigger_id}.>")
        indexed: dict[str, datetime] = {}
        plain: set[str] = set()
        for key in keys:
            found = _indexed(key, trigger_id)
            if found is not None:
                indexed[found[1]] = found[0]
            elif key.count(".") == 1:
                plain.add(key.removeprefix(f"{trigger_id}."))
        store = await self.store()
        legacy: dict[str, DeliveryRecord] = {}
        for delivery_id in sorted(plain - set(indexed)):
            record = await self._read(store, trigger_id, delivery_id)
            if record is not None:
                legacy[delivery_id] = record
                indexed[delivery_id] = record.received_at
        order = sorted(((at, d) for d, at in indexed.items() if d in plain), reverse=True)
        if before is not None:
            order = [entry for entry in order if entry < before]
        page: list[DeliveryRecord] = []
        taken = 0
        for _at, delivery_id in order:
            if len(page) == limit:
                break
            taken += 1
            record = legacy.get(delivery_id) or await self._read(store, trigger_id, delivery_id)
            if record is not None:
                page.append(record)
        following = (page[-1].received_at, page[-1].delivery_id) if page and taken < len(order) else None
        return page, following

    async def _keys(self, subject: str) -> list[str]:
        """The live keys matching ``subject`` (a headers-only listing of the last entry per key)."""
        return await live_keys(await self._bus.kv(BUCKET_DELIVERIES), subject)

    async def _read(self, store: Store[DeliveryRecord], trigger_id: str, delivery_id: str) -> DeliveryRecord | None:
        try:
            found = await store.get(delivery_key(trigger_id, delivery_id))
        except ValidationError:
            log.warning("delivery.unreadable", delivery_id=delivery_id)
            return None
        return None if found is None else found.value

    async def _safe_store(self) -> Store[DeliveryRecord] | None:
        try:
            return await self.store()
        except Exception as exc:
            log.warning("delivery.not_recorded", error=repr(exc))
            return None

    async def _best_effort(
        self,
        key: str,
        store: Store[DeliveryRecord] | None,
        step: Callable[[DeliveryRecord], DeliveryRecord],
        create: Callable[[], DeliveryRecord],
    ) -> DeliveryRecord | None:
        """Never fails the delivery: a bus or store problem is logged (the journal has the outcome). The
        record as stored (``None``: not written)."""
        if store is None or not self._bus.nc.is_connected:
            return None
        try:
            return (await store.modify(key, step, create=create)).value
        except Exception as exc:
            log.warning("delivery.not_recorded", key=key, error=repr(exc))
            return None


def _received(
    delivery: TriggerDelivery,
    now: datetime,
    *,
    redrive_of: str | None,
    title: str | None = None,
    event_omitted: bool = False,
    state: DeliveryState = "received",
    run_id: str | None = None,
    reason: str | None = None,
    detail: str | None = None,
    updated_at: datetime | None = None,
) -> DeliveryRecord:
    """The record of ``delivery`` received at ``now``, in ``state`` (``received``: as first written)."""
    return DeliveryRecord(
        trigger_id=delivery.trigger.id,
        delivery_id=delivery.delivery_id,
        kind=delivery.kind,
        adapter=delivery.adapter,
        source_event_id=delivery.source_event_id,
        source_event_type=delivery.source_event_type,
        body_bytes=delivery.body_bytes,
        depth=delivery.depth,
        causation_id=delivery.causation_id,
        correlation_id=delivery.correlation_id,
        state=state,
        run_id=run_id,
        reason=reason,
        detail=detail,
        title=title,
        received_at=now,
        updated_at=updated_at or now,
        event_omitted=event_omitted,
        redrive_of=redrive_of,
        rerun=delivery.rerun,
        rerun_of=delivery.rerun_of,
    )
