"""Per-delivery processing state (IDEM-1, issue 7): what became of each delivery, queryable per trigger.

Every delivery that takes the launch path (a webhook, an event trigger's event, a flow-controlled schedule
tick) is recorded in the ``trigger-deliveries`` bucket under ``<trigger id>.<delivery id>``::

    received   the launch started (the record holds the normalized event, when it is at most
               MAX_EVENT_BYTES as JSON, so the delivery can be re-driven)
    accepted   run.requested was published (``run_id``)
    rejected   trigger.rejected was published (``reason``, ``detail``: duplicate, disabled, concurrency_skip ...)
    queued / debounced   waiting for its concurrency key (a later accepted or rejected follows)
    failed     the bus did not acknowledge (``detail``); the webhook sender was told 503 and retries, a bus
               message is redelivered with backoff: nothing is lost meanwhile

Recording is best effort: the journal (``trigger.*`` events) is the truth, and a delivery is never refused
because its record could not be written (logged ``delivery.not_recorded``). A re-drive
(:func:`.admin.admin_router`) re-runs a rejected or failed delivery through the launch path as a new
delivery (``redrive_of``) with the *original event id*, so the dedupe claim makes it a duplicate of an
event that was accepted meanwhile, never a second run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temporality_bus import BusError, Conflict, PublishResult, Store, evolve, live_keys
from temporality_bus.pipeline import Write, kv_write
from temporality_protocol import NormalizedEvent
from temporality_protocol.catalog import BUCKET_DELIVERIES
from temporality_protocol.trigger_admin import DeliveryState, DeliveryView

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

    def view(self) -> dict[str, object]:
        """As the deliveries API shows it (:class:`DeliveryView`): every field but the event itself
        (``has_event`` says if kept)."""
        shown = self.model_dump(mode="json", exclude={"event"})
        shown["has_event"] = self.event is not None
        return shown


def delivery_key(trigger_id: str, delivery_id: str) -> str:
    return f"{trigger_id}.{delivery_id}"


#: The receipt time as an index key token: fixed width, so the keys sort as the times do.
_STAMP = "%Y%m%dT%H%M%S%fZ"


def index_key(trigger_id: str, received_at: datetime, delivery_id: str) -> str:
    """The delivery's entry in its trigger's index: ``<trigger id>.at.<receipt time>.<delivery id>``
    (written once, when the record is created; the listing orders and pages the keys alone)."""
    return f"{trigger_id}.at.{received_at.astimezone(UTC).strftime(_STAMP)}.{delivery_id}"


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
    """One delivery's record on the launch path, built once and written next to the launch's own bus
    writes (:meth:`Deliveries.draft`, :meth:`Deliveries.writes`, :meth:`Deliveries.settle`).

    ``head`` is the record without its event; the event is encoded once (``event_json``) and spliced into
    every write of the record, so it is neither re-validated nor re-encoded per state. ``revision`` is
    the record's as last written here (``None``: not written by the draft; a later state then goes
    through :meth:`Deliveries.record`'s read-modify-write)."""

    delivery: TriggerDelivery
    event: NormalizedEvent
    key: str
    head: DeliveryRecord
    event_json: bytes | None
    #: The delivery id is new (a webhook's): the index entry can go out with the record's creation.
    fresh: bool
    revision: int | None = None
    #: The state last written (``None``: nothing yet).
    written: DeliveryState | None = None
    indexed: bool = False

    def encoded(self, head: DeliveryRecord) -> bytes:
        """``head`` with the draft's event, as stored (the model's JSON: a reader validates it as usual)."""
        doc = head.model_dump_json(exclude={"event"}).encode()
        if self.event_json is None:
            return doc
        return doc[:-1] + b',"event":' + self.event_json + b"}"


class Deliveries:
    """The ``trigger-deliveries`` bucket: record, update, list (newest first), read."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._store: Store[DeliveryRecord] | None = None

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
    ) -> None:
        """Write the delivery's record as it is now (best effort). A later state keeps the event, title,
        receipt time and re-drive links the record already has. ``index``: a record this call creates
        gets its index entry (``False``: it has one already)."""
        now = datetime.now(UTC)
        kept, omitted = _kept(event)

        def step(current: DeliveryRecord) -> DeliveryRecord:
            return evolve(
                current,
                state=state,
                run_id=run_id or current.run_id,
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
        """The ``received`` record of ``delivery``, not written yet (:meth:`writes` gives its writes)."""
        await self._safe_store()  # the bucket opened (ensured) once, so the pipelined writes find its stream
        now = datetime.now(UTC)
        encoded = event.model_dump_json().encode()  # once: spliced into every write of the record
        omitted = len(encoded) > MAX_EVENT_BYTES
        event_json = None if omitted else encoded
        head = _received(delivery, now, redrive_of=redrive_of, title=title, event_omitted=omitted)
        fresh = delivery.kind == "webhook" and redrive_of is None  # its id is new_id(): never written before
        return Draft(delivery, event, delivery_key(delivery.trigger.id, delivery.delivery_id), head, event_json, fresh)

    def writes(self, draft: Draft) -> list[Write]:
        """The draft's creation (create-if-absent), and for a fresh delivery id its index entry too."""
        bucket = BUCKET_DELIVERIES.name
        created = [kv_write(bucket, draft.key, draft.encoded(draft.head), revision=0)]
        if draft.fresh:
            head = draft.head
            index = index_key(head.trigger_id, head.received_at, head.delivery_id)
            created.append(kv_write(bucket, index, head.delivery_id.encode()))
        return created

    def state_write(
        self,
        draft: Draft,
        state: DeliveryState,
        *,
        run_id: str | None = None,
        reason: str | None = None,
        detail: str | None = None,
    ) -> tuple[Write, DeliveryRecord] | None:
        """The write moving the draft's record to ``state`` (compare-and-set on its revision) and the head
        it writes; ``None`` when the draft was not written (use :meth:`record`)."""
        if draft.revision is None:
            return None
        # Every value is typed and comes from this module or the launch path: no re-validation of the record.
        head = draft.head.model_copy(
            update={
                "state": state,
                "run_id": run_id or draft.head.run_id,
                "reason": reason,
                "detail": None if detail is None else detail[:1000],
                "updated_at": datetime.now(UTC),
            }
        )
        write = kv_write(BUCKET_DELIVERIES.name, draft.key, draft.encoded(head), revision=draft.revision)
        return write, head

    async def settle(
        self,
        draft: Draft,
        results: list[PublishResult | BusError],
        *,
        head: DeliveryRecord | None = None,
    ) -> None:
        """Take the outcome of the draft's writes: :meth:`writes`' (``head`` ``None``) or one
        :meth:`state_write`'s (its ``head``). A creation that found the record (a redelivered message)
        updates it the read-modify-write way; anything else that failed is logged (best effort)."""
        first = results[0]
        if isinstance(first, PublishResult):
            draft.revision, draft.written = first.seq, (head or draft.head).state
            if head is not None:
                draft.head = head
        else:
            draft.revision = None
            if head is None and isinstance(first, Conflict):  # this delivery was recorded before: keep its record
                await self._update(draft, "received")
            else:
                log.warning("delivery.not_recorded", key=draft.key, error=repr(first))
        for result in results[1:]:
            if isinstance(result, PublishResult):
                draft.indexed = True
            else:
                log.warning("delivery.not_indexed", key=draft.key, error=repr(result))

    async def update(
        self,
        draft: Draft,
        state: DeliveryState,
        *,
        run_id: str | None = None,
        reason: str | None = None,
        detail: str | None = None,
        send: Callable[[list[Write]], Awaitable[list[PublishResult | BusError]]],
    ) -> None:
        """Move the draft's record to ``state`` now: one compare-and-set write, or (not written by the
        draft, or changed meanwhile) :meth:`record`'s read-modify-write. Best effort."""
        planned = self.state_write(draft, state, run_id=run_id, reason=reason, detail=detail)
        if planned is not None:
            write, head = planned
            try:
                results = await send([write])
            except Exception as exc:  # not connected: the read-modify-write below says so (best effort)
                log.debug("delivery.write_failed", key=draft.key, error=repr(exc))
            else:
                if isinstance(results[0], PublishResult):
                    await self.settle(draft, results, head=head)
                    return
            draft.revision = None  # lost its compare-and-set (changed meanwhile) or failed: read it again
        await self._update(draft, state, run_id=run_id, reason=reason, detail=detail)

    async def _update(
        self,
        draft: Draft,
        state: DeliveryState,
        *,
        run_id: str | None = None,
        reason: str | None = None,
        detail: str | None = None,
    ) -> None:
        """:meth:`record` for a draft (the read-modify-write path, which keeps what the record has)."""
        await self.record(
            draft.delivery,
            state,
            event=draft.event,
            title=draft.head.title,
            run_id=run_id,
            reason=reason,
            detail=detail,
            redrive_of=draft.head.redrive_of,
            index=not draft.indexed,
        )
        draft.written = state

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

    async def get(self, trigger_id: str, delivery_id: str) -> DeliveryRecord | None:
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
) -> DeliveryRecord:
    """The ``received`` record of ``delivery``, as first written."""
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
        state="received",
        title=title,
        received_at=now,
        updated_at=now,
        event_omitted=event_omitted,
        redrive_of=redrive_of,
    )
