"""Event triggers (TRG-2/5/6): runs started by the system's own events, through the one launch path.

The ``trigger-gateway-events`` durable consumer reads the event types an event trigger may listen to
(:data:`~temporality_protocol.catalog.TRIGGERABLE_EVENTS`) from ``TEMPORALITY_EVENTS``, only while
:func:`journal_needed` says so (:mod:`.ondemand`); the replicas share it (each event goes to one of them). Created with deliver policy ``new``, a fresh installation
starts at the stream's tail, and its acknowledged position is the persisted cursor. For each event::

    every trigger change stored before the event applied here first (another replica may have just
    created or disabled a trigger; one stream-info call on the trigger bucket, a wait bounded at 2 s; still
    behind: redelivered (TransientError) until its SYNC_DELIVERIES-th delivery, which uses the triggers known)
    the enabled event triggers listing its type (none: ack, nothing journaled); a trigger.rejected(filtered)
    never fires one (a condition's refusal would only echo refusals)
      stored at or before the trigger's activation (TriggerRecord.active_from_seq) -> skipped, logged
      launch depth d of the event (the run it belongs to, or a trigger.rejected's own depth):
        d > max depth (the event is itself a refusal past the limit)   -> dropped, logged
        caused by this trigger (its own trigger.* event)               -> dropped, logged
        its condition (filter, then when) does not hold                -> skipped, logged (debug): nothing journaled
        caused by this trigger's own runs, allow_self false            -> trigger.rejected(loop_limit)
        d + 1 > max depth (TEMPORALITY_GATEWAY_EVENT_MAX_DEPTH, 1)     -> trigger.rejected(loop_limit)
        an expression of the trigger (when, input, concurrency key)
        fails on it (the trigger is at fault)                          -> trigger.rejected(invalid_payload,
                                                                          "mapping_failed: ..."), recorded
                                                                          mapping_failed, the event kept
        otherwise: the run's lineage (depth d + 1, the triggers that led to it) stored, then launched
        through :class:`~temporality_trigger_gateway.launch.Launcher` (claim, received + accepted + requested)

**Exactly once.** The delivery id is derived from (trigger id, event id) and the run id is
``run_id_for_delivery(trigger id, event id)``: a redelivered message, a second copy of the same event,
a second replica or a restart is the same delivery, which the claim recognises as its own and publishes
again with the same ids (JetStream dedupes them, the run store refuses a second line). No
``trigger.rejected(duplicate)`` is journaled for event triggers: a copy is the same delivery.

**Depth.** A run an event trigger starts carries ``launch.depth`` = d + 1 and gets a lineage record
(``trigger-dedupe`` bucket, key ``lin-`` + hash(run id), 7 days like the bucket): its depth and the ids of
the triggers in its chain. An event of a run without one (started by a webhook, a schedule, the API)
has depth 0. With the default maximum 1, an event of a run an event trigger started never fires an
event trigger (TRG-6 anti-loop); a larger maximum allows chains that long.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import structlog
from pydantic import BaseModel, ConfigDict

from temporality_bus import AlreadyExists, Delivery, PermanentError, Store, TransientError
from temporality_protocol import Actor, Envelope, NormalizedEvent, derive_id, run_id_for_delivery
from temporality_protocol.catalog import BUCKET_DEDUPE
from temporality_trigger_gateway.concurrency import RUN_ENDS
from temporality_trigger_gateway.errors import BodyTooLarge, BusUnavailable
from temporality_trigger_gateway.launch import Launcher, RejectReason, TriggerDelivery
from temporality_trigger_gateway.mapping import MappingFailed
from temporality_trigger_gateway.store import TriggerRegistry, TriggerStore
from temporality_trigger_gateway.triggers import EventTrigger, TriggerConfig

__all__ = [
    "ADAPTER",
    "SYNC_DELIVERIES",
    "EventTriggers",
    "Lineage",
    "delivery_id_for",
    "journal_needed",
    "lineage_key",
    "normalize",
    "run_title",
]

log = structlog.get_logger(__name__)

#: The ``adapter`` an event delivery is journaled under (``trigger.received``).
ADAPTER = "event"
_ACTOR_TYPES = frozenset({"user", "service", "agent", "system"})
#: The delivery of an event from which a replica whose trigger store lags handles it with the triggers it
#: knows (the earlier ones are redelivered: :meth:`EventTriggers._sync`); below the consumer's max_deliver (8).
SYNC_DELIVERIES = 4
#: How long a redelivered event waits for the trigger store (its first delivery waits ``store_wait_s``): the
#: backoff before the redelivery gave the watch its time already, and a replica that stays behind must not
#: hold its one handler slot for the full wait at every delivery.
_REDELIVERED_WAIT_S = 0.1
#: Allowance for the clock difference between this process and the NATS server (event storage times).
_CLOCK_MARGIN = timedelta(seconds=1)


class Lineage(BaseModel):
    """How a run an event trigger started came to be: its launch depth and the triggers that led to it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    run_id: str
    depth: int
    chain: list[str]


# --------------------------------------------------------------------------- decisions (pure)
def lineage_key(run_id: str) -> str:
    return derive_id("lin", run_id)


def delivery_id_for(trigger_id: str, event_id: str) -> str:
    """One delivery per (trigger, event), however often the event is delivered."""
    return derive_id("dlv", trigger_id, ADAPTER, event_id)


def _actor(actor: str | None) -> Actor | None:
    """``agent:reviewer`` -> ``Actor(id="reviewer", type="agent")``; another prefix stays whole, as ``system``."""
    if not actor:
        return None
    kind, sep, rest = actor.partition(":")
    if sep and rest and kind in _ACTOR_TYPES:
        return Actor(id=rest, type=kind)
    return Actor(id=actor, type="system")


def normalize(envelope: Envelope, *, tenant: str | None = None) -> NormalizedEvent:
    """The CloudEvent as the filter and the mapping see it (TRG-4): ``payload`` is its ``data``, ``tenant`` its
    project (or the trigger's ``tenant`` when it has none), ``metadata`` its run, saga and cause."""
    metadata = {
        key: value
        for key, value in (
            ("run_id", envelope.runid),
            ("correlation_id", envelope.correlationid),
            ("causation_id", envelope.causationid),
            ("subject", envelope.subject),
        )
        if value
    }
    return NormalizedEvent(
        id=envelope.id,
        type=envelope.type,
        source=envelope.source,
        timestamp=envelope.time,
        actor=_actor(envelope.actor),
        tenant=envelope.tenant or tenant,
        payload=dict(envelope.data),
        metadata=metadata,
    )


def journal_needed(triggers: Iterable[TriggerConfig]) -> str | None:
    """Why the ``trigger-gateway-events`` consumer must pull (``None``: nothing needs the journal): an
    enabled event trigger, or a trigger with ``concurrency`` (enabled or not: a run of its key may still
    be active, and its end must free the key and start the next queued run)."""
    for trigger in triggers:
        if isinstance(trigger, EventTrigger) and trigger.enabled:
            return f"event trigger {trigger.id} is enabled"
        if trigger.concurrency is not None:
            return f"trigger {trigger.id} has a concurrency key (run ends release it)"
    return None


def run_title(trigger: EventTrigger, event: NormalizedEvent) -> str:
    about = event.metadata.get("run_id") or event.id
    return f"{trigger.name}: {event.type} of {about}"[:200]


def _run_of(envelope: Envelope) -> str | None:
    run_id = envelope.runid or envelope.data.get("run_id")
    return run_id if isinstance(run_id, str) and run_id else None


# --------------------------------------------------------------------------- effects
class EventTriggers:
    """The ``trigger-gateway-events`` handler: matches each event against this replica's event triggers."""

    def __init__(
        self,
        registry: TriggerRegistry,
        launcher: Launcher,
        *,
        store: TriggerStore | None = None,
        max_depth: int = 1,
        store_wait_s: float = 2.0,
    ) -> None:
        self._registry = registry
        self._store_wait_s = store_wait_s
        self._launcher = launcher
        self._store_of_triggers = store
        self._max_depth = max_depth
        self._lineages: Store[Lineage] | None = None
        #: Every trigger change stored before this (server time, less a margin) is applied here.
        self._synced_until: datetime | None = None

    def listening(self, event_type: str) -> list[EventTrigger]:
        """The enabled event triggers that list ``event_type``."""
        return [
            t for t in self._registry.all() if isinstance(t, EventTrigger) and t.enabled and event_type in t.event_types
        ]

    async def handle(self, envelope: Envelope, delivery: Delivery) -> None:
        """One event: a run's end releases its concurrency key (the next queued run starts); then launch (or
        refuse) for each enabled, matching, already active event trigger. Both decide on the triggers stored
        before the event (:meth:`_sync` first): a replica behind the store would drop the queued launch of a
        trigger it does not know yet as if the trigger were gone."""
        await self._sync(delivery)
        if envelope.type in RUN_ENDS:
            ended = _run_of(envelope)
            if ended is not None:
                await self._release(ended, envelope)
        triggers = self.listening(envelope.type)
        if not triggers:
            return
        if envelope.type == "trigger.rejected" and envelope.data.get("reason") == "filtered":
            return  # a condition's refusal never fires a trigger: it would only echo (and feed) refusals
        fresh = [t for t in triggers if self._active_for(t, delivery)]
        for stale in sorted({t.id for t in triggers} - {t.id for t in fresh}):
            log.info("event_trigger.before_activation", trigger_id=stale, ce_id=envelope.id, seq=delivery.stream_seq)
        if not fresh:
            return
        depth, causers = await self._lineage(envelope)
        for trigger in sorted(fresh, key=lambda t: t.id):
            with structlog.contextvars.bound_contextvars(
                trigger_id=trigger.id, ce_id=envelope.id, ce_type=envelope.type
            ):
                try:
                    await self._deliver(trigger, envelope, len(delivery.msg.data), depth, causers)
                except BodyTooLarge as exc:  # the run's events exceed max_payload: no redelivery can help
                    raise PermanentError(exc.detail) from exc

    async def _release(self, ended: str, envelope: Envelope) -> None:
        with structlog.contextvars.bound_contextvars(run_id=ended, ce_id=envelope.id, ce_type=envelope.type):
            try:
                await self._launcher.flow.release(ended, self._registry.get)
            except BodyTooLarge as exc:
                raise PermanentError(exc.detail) from exc

    async def _sync(self, delivery: Delivery) -> None:
        """Serve every trigger change stored before the event first: a trigger created or disabled through
        another replica a moment ago must count (its watch here may lag by milliseconds). One stream-info
        call, only for an event stored after the last one; each wait bounded (``store_wait_s``, 2 s).

        A replica still behind after the wait does not decide on the triggers it knows: a trigger created
        just before the event would miss its launch for good (the event is acknowledged), one just disabled
        or deleted would still fire. It raises :class:`TransientError` instead -- the event is redelivered
        with the consumer's backoff (0.5, 1, 2 s ...) while the watch catches up (a watch being restarted
        after a reconnect re-reads the whole bucket) -- and only its ``SYNC_DELIVERIES``-th delivery is
        handled with the triggers known then (logged ``event_trigger.store_lagging``, as every lag was
        before), so a store this replica cannot catch up with delays events by seconds but never stalls or
        dead-letters them. Only the first delivery waits ``store_wait_s`` for the store; a redelivery checks it
        briefly (the backoff before it was the wait), so a replica that stays behind takes ~2 s per event, not 8."""
        if self._store_of_triggers is None:
            return
        stored = delivery.msg.metadata.timestamp
        if stored is not None and self._synced_until is not None and stored < self._synced_until:
            return
        checked = datetime.now(UTC) - _CLOCK_MARGIN
        try:
            latest = await self._launcher.io(self._store_of_triggers.last_revision())
        except BusUnavailable as exc:  # the store's position cannot be read now: as a lag (a run's end must not
            if delivery.num_delivered < SYNC_DELIVERIES:  # wait for it forever: its key would stay held)
                # a TransientError: redelivered with the consumer's backoff, logged without a traceback per retry
                raise TransientError(f"the trigger store's position cannot be read: {exc.detail}") from exc
            log.warning("event_trigger.store_unreadable", error=str(exc), delivery=delivery.num_delivered)
            return
        wait_s = self._store_wait_s if delivery.num_delivered <= 1 else min(_REDELIVERED_WAIT_S, self._store_wait_s)
        if not await self._registry.wait_for_store(latest, timeout_s=wait_s):
            if delivery.num_delivered < SYNC_DELIVERIES:
                log.info(
                    "event_trigger.store_lagging_retry",
                    applied=self._registry.applied,
                    stored=latest,
                    delivery=delivery.num_delivered,
                )
                raise TransientError(
                    f"the trigger store is at revision {latest}, this replica applied {self._registry.applied}:"
                    " the event is redelivered once the triggers stored before it are served"
                )
            log.warning(
                "event_trigger.store_lagging",
                applied=self._registry.applied,
                stored=latest,
                delivery=delivery.num_delivered,
            )
            return
        self._synced_until = checked

    def _active_for(self, trigger: EventTrigger, delivery: Delivery) -> bool:
        """Whether the event was stored after the trigger's activation (TRG-6: history is never replayed)."""
        activation = self._registry.activations.get(trigger.id)
        if activation is None:
            return True  # a fixed list of triggers (tests, benchmarks): active from the start
        if activation.after_seq is not None:
            return delivery.stream_seq > activation.after_seq
        stored = delivery.msg.metadata.timestamp
        return stored is None or stored > activation.since

    async def _lineage(self, envelope: Envelope) -> tuple[int, frozenset[str]]:
        """The event's launch depth and the triggers that caused it."""
        depth, causers = 0, set[str]()
        data = envelope.data
        if envelope.type.startswith("trigger.") and isinstance(data.get("trigger_id"), str):
            causers.add(data["trigger_id"])
            stated = data.get("depth")
            if isinstance(stated, int) and not isinstance(stated, bool):
                depth = stated
        run_id = _run_of(envelope)
        if run_id is not None:
            found = await self._launcher.io((await self._store()).get(lineage_key(run_id)))
            if found is not None:
                depth = max(depth, found.value.depth)
                causers.update(found.value.chain)
        return depth, frozenset(causers)

    async def _store(self) -> Store[Lineage]:
        """The lineage records (in the ``trigger-dedupe`` bucket, beside the claims; opened once)."""
        if self._lineages is None:
            self._lineages = await self._launcher.io(self._launcher.bus.store(BUCKET_DEDUPE, Lineage))
        return self._lineages

    async def _deliver(
        self, trigger: EventTrigger, envelope: Envelope, size: int, depth: int, causers: frozenset[str]
    ) -> None:
        run_id = run_id_for_delivery(trigger.id, envelope.id)
        delivery = TriggerDelivery(
            trigger=trigger,
            delivery_id=delivery_id_for(trigger.id, envelope.id),
            kind="event",
            adapter=ADAPTER,
            source_event_id=envelope.id,
            source_event_type=envelope.type,
            body_bytes=size,
            depth=depth + 1,
            causation_id=envelope.id,
            correlation_id=envelope.correlationid,
        )
        tenant = envelope.tenant or trigger.tenant
        if depth > self._max_depth:
            log.info("event_trigger.loop_dropped", depth=depth, reason="the event is past the launch depth itself")
            return
        own_event = envelope.type.startswith("trigger.") and envelope.data.get("trigger_id") == trigger.id
        if own_event and not trigger.allow_self:
            log.info("event_trigger.loop_dropped", depth=depth, reason="the trigger's own journal event")
            return
        event = normalize(envelope, tenant=trigger.tenant)
        try:
            filtered = trigger.filtered(event)
        except MappingFailed as exc:
            await self._mapping_failed(trigger, delivery, exc, tenant, event)
            return
        if filtered is not None:
            # A subscription's filter, not a refused delivery: most events of a listed type are not for this
            # trigger, and journaling each would add two events per (event, trigger) to the journal.
            log.debug("event_trigger.filtered", trigger_id=trigger.id, event_type=envelope.type, detail=filtered)
            return
        if trigger.id in causers and not trigger.allow_self:
            detail = f"the event was caused by a run of trigger {trigger.id} itself (allow_self is false)"
            await self._refuse(delivery, "loop_limit", detail, tenant)
            return
        if depth + 1 > self._max_depth:
            detail = (
                f"a run started by this event would be launch depth {depth + 1}, past the maximum "
                f"{self._max_depth} (TEMPORALITY_GATEWAY_EVENT_MAX_DEPTH)"
            )
            await self._refuse(delivery, "loop_limit", detail, tenant)
            return
        try:
            mapped = trigger.agent_input(event)
            key = trigger.concurrency_key(event)
        except MappingFailed as exc:
            await self._mapping_failed(trigger, delivery, exc, tenant, event)
            return
        await self._remember(run_id, depth + 1, causers | {trigger.id})
        outcome = await self._launcher.launch(
            delivery,
            event,
            run_id,
            run_title(trigger, event),
            mapped,
            with_payload=trigger.input is not None,
            concurrency_key=key,
        )
        log.info("event_trigger.launched", run_id=run_id, depth=depth + 1, status=outcome.status)

    async def _refuse(
        self,
        delivery: TriggerDelivery,
        reason: RejectReason,
        detail: str,
        tenant: str | None,
        *,
        event: NormalizedEvent | None = None,
    ) -> None:
        await self._launcher.refuse(delivery, reason, detail, tenant=tenant, event=event)
        log.info("event_trigger.refused", reason=reason, depth=delivery.depth)

    async def _mapping_failed(
        self,
        trigger: EventTrigger,
        delivery: TriggerDelivery,
        exc: MappingFailed,
        tenant: str | None,
        event: NormalizedEvent,
    ) -> None:
        """An expression of the trigger (``when``, ``input``, concurrency key) failed on a valid event: the trigger
        is at fault, as for a webhook's. Journaled ``trigger.rejected(invalid_payload)`` with a detail starting
        ``mapping_failed:``, recorded ``mapping_failed`` with the event kept, so that the delivery can be re-driven
        once the trigger is fixed (``POST /triggers/{id}/deliveries/{delivery_id}/redrive``)."""
        await self._launcher.refuse(
            delivery,
            "invalid_payload",
            exc.detail(),
            tenant=tenant,
            event=event,
            title=run_title(trigger, event),
            recorded_as="mapping_failed",
        )
        log.info("event_trigger.refused", reason="mapping_failed", failing=exc.where, depth=delivery.depth)

    async def _remember(self, run_id: str, depth: int, chain: frozenset[str]) -> None:
        """Store the run's lineage before its ``run.requested`` exists (create-if-absent: redelivery keeps it)."""
        lineage = Lineage(run_id=run_id, depth=depth, chain=sorted(chain))
        try:
            await self._launcher.io((await self._store()).create(lineage_key(run_id), lineage))
        except AlreadyExists:
            pass
