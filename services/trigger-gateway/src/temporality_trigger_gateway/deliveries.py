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

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

import structlog
from nats.js.kv import KV_DEL, KV_PURGE
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temporality_bus import Store, evolve
from temporality_protocol import NormalizedEvent
from temporality_protocol.catalog import BUCKET_DELIVERIES

if TYPE_CHECKING:
    from temporality_bus import Bus
    from temporality_trigger_gateway.launch import TriggerDelivery

__all__ = ["MAX_EVENT_BYTES", "Deliveries", "DeliveryRecord", "DeliveryState", "delivery_key", "index_key"]

log = structlog.get_logger(__name__)

#: A normalized event larger than this (as JSON) is not kept with its delivery, which then cannot be re-driven.
MAX_EVENT_BYTES = 64 * 1024
DeliveryState = Literal["received", "accepted", "rejected", "failed", "queued", "debounced"]


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
        """As the deliveries API shows it: every field but the event itself (``has_event`` says if kept)."""
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
    ) -> None:
        """Write the delivery's record as it is now (best effort). A later state keeps the event, title,
        receipt time and re-drive links the record already has."""
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
                received_at=now,
                updated_at=now,
                redrive_of=redrive_of,
            )

        key = delivery_key(delivery.trigger.id, delivery.delivery_id)
        stored = await self._best_effort(key, (await self._safe_store()), step, create)
        if stored is not None and stored.received_at == now:  # created by this call: index it
            try:
                kv = await self._bus.kv(BUCKET_DELIVERIES)
                await kv.put(index_key(delivery.trigger.id, now, delivery.delivery_id), delivery.delivery_id.encode())
            except Exception as exc:
                log.warning("delivery.not_indexed", key=key, error=repr(exc))

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
        """The live keys matching ``subject`` (a headers-only watch of the last entry per key)."""
        kv = await self._bus.kv(BUCKET_DELIVERIES)
        watcher = await kv.watch(subject, ignore_deletes=True, meta_only=True)
        keys: list[str] = []
        try:
            while True:
                entry = await watcher.updates(timeout=10)  # type: ignore[no-untyped-call]
                if entry is None:
                    break
                if entry.operation not in (KV_DEL, KV_PURGE):
                    keys.append(entry.key)
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]
        return keys

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
