"""One webhook delivery: what to decide (pure functions) and the bus effects that carry it out.

Exactly-once run creation (IDEM-1)::

    trigger.received                      always, fresh id per delivery
    dedupe key (trigger id, event id)?    in the trigger-dedupe KV bucket
      present  -> trigger.rejected(duplicate)                       -> 200 duplicate
      absent   -> trigger.accepted + run.requested (derived ids)    -> create the key -> 202 accepted

The key is written only *after* JetStream acked ``run.requested``: a crash in between makes the
retry republish the same ids, which JetStream dedupes (``Nats-Msg-Id``) and the run store rejects
as a second line. Every answer is sent only after JetStream acked what it reports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

import nats.errors
import structlog
from pydantic import BaseModel, ConfigDict

from temporality_bus import AlreadyExists, Bus, Conflict, PermanentError, Store, TransientError, Versioned, evolve
from temporality_protocol import (
    Envelope,
    LaunchSource,
    NormalizedEvent,
    RunRequested,
    TriggerAccepted,
    TriggerReceived,
    TriggerRejected,
    derive_id,
    make_event,
    new_id,
    run_id_for_delivery,
)
from temporality_protocol.catalog import BUCKET_DEDUPE
from temporality_trigger_gateway.adapters import ADAPTERS, SourceEvent
from temporality_trigger_gateway.errors import BodyTooLarge, BusUnavailable, WebhookError
from temporality_trigger_gateway.triggers import WebhookTrigger

__all__ = [
    "ACTOR",
    "SOURCE",
    "Accepted",
    "DedupeRecord",
    "Duplicate",
    "Ignored",
    "Intake",
    "Outcome",
    "WebhookDelivery",
    "dedupe_key",
    "ignore_reason",
    "launch_events",
    "received_event",
    "rejected_event",
]

log = structlog.get_logger(__name__)

SOURCE = "/temporality/trigger-gateway"
ACTOR = "service:trigger-gateway"
T = TypeVar("T")
U = TypeVar("U")


# --------------------------------------------------------------------------- outcomes
class _Outcome(BaseModel):
    model_config = ConfigDict(frozen=True)
    delivery_id: str


class Accepted(_Outcome):
    status: Literal["accepted"] = "accepted"
    run_id: str


class Duplicate(_Outcome):
    status: Literal["duplicate"] = "duplicate"
    run_id: str


class Ignored(_Outcome):
    status: Literal["ignored"] = "ignored"
    reason: Literal["disabled", "unsupported_event"]
    detail: str


Outcome = Accepted | Duplicate | Ignored


class DedupeRecord(BaseModel):
    """The value under a dedupe key: which run a source event already started."""

    model_config = ConfigDict(frozen=True)

    trigger_id: str
    source_event_id: str
    run_id: str
    delivery_id: str
    accepted_at: datetime
    expires_at: datetime


@dataclass(frozen=True)
class WebhookDelivery:
    """One HTTP delivery of one source event to one trigger."""

    trigger: WebhookTrigger
    delivery_id: str
    body_bytes: int
    source: SourceEvent


# --------------------------------------------------------------------------- decisions (pure)
def dedupe_key(trigger_id: str, source_event_id: str) -> str:
    return derive_id("dd", trigger_id, source_event_id)


def ignore_reason(delivery: WebhookDelivery) -> tuple[Literal["disabled", "unsupported_event"], str] | None:
    trigger = delivery.trigger
    if not trigger.enabled:
        return "disabled", f"trigger {trigger.id} is disabled"
    if delivery.source.type not in trigger.events:
        return "unsupported_event", f"trigger {trigger.id} does not handle {delivery.source.type!r} events"
    return None


def received_event(delivery: WebhookDelivery, *, run_id: str | None, tenant: str | None) -> Envelope:
    trigger = delivery.trigger
    return make_event(
        TriggerReceived(
            trigger_id=trigger.id,
            delivery_id=delivery.delivery_id,
            adapter=trigger.adapter,
            source_event_id=delivery.source.id,
            source_event_type=delivery.source.type,
            body_bytes=delivery.body_bytes,
        ),
        **_envelope(delivery, run_id=run_id, tenant=tenant, id=derive_id("evt", delivery.delivery_id, "received")),
    )


def rejected_event(
    delivery: WebhookDelivery,
    reason: Literal["duplicate", "unsupported_event", "disabled"],
    detail: str,
    *,
    run_id: str | None,
    tenant: str | None,
    causation_id: str,
) -> Envelope:
    return make_event(
        TriggerRejected(
            trigger_id=delivery.trigger.id,
            delivery_id=delivery.delivery_id,
            reason=reason,
            detail=detail,
            source_event_id=delivery.source.id,
            run_id=run_id,
        ),
        causation_id=causation_id,
        **_envelope(delivery, run_id=run_id, tenant=tenant, id=derive_id("evt", delivery.delivery_id, "rejected")),
    )


def launch_events(
    delivery: WebhookDelivery, event: NormalizedEvent, *, run_id: str, title: str, causation_id: str
) -> tuple[Envelope, Envelope]:
    """``trigger.accepted`` and ``run.requested``, with ids derived from the run: redelivery reuses them."""
    trigger = delivery.trigger
    accepted = make_event(
        TriggerAccepted(
            trigger_id=trigger.id,
            delivery_id=delivery.delivery_id,
            source_event_id=event.id,
            run_id=run_id,
            agent=trigger.agent,
        ),
        causation_id=causation_id,
        **_envelope(delivery, run_id=run_id, tenant=event.tenant, id=derive_id("evt", run_id, "trigger.accepted")),
    )
    requested = make_event(
        RunRequested(
            run_id=run_id,
            agent=trigger.agent,
            title=title[:200],
            launch=LaunchSource(kind="webhook", trigger_id=trigger.id, delivery_id=delivery.delivery_id),
            event=evolve(event, payload={}),  # carried once, as the input
            input=event.payload,
            human=trigger.human.policy(),  # SEC-1: from the trigger's config, never from the webhook
        ),
        causation_id=accepted.id,
        **_envelope(delivery, run_id=run_id, tenant=event.tenant, id=derive_id("evt", run_id, "run.requested")),
    )
    return accepted, requested


def _envelope(delivery: WebhookDelivery, *, run_id: str | None, tenant: str | None, id: str) -> dict[str, Any]:
    return {
        "source": SOURCE,
        "id": id,
        "run_id": run_id,
        "correlation_id": run_id or delivery.delivery_id,
        "actor": ACTOR,
        "tenant": tenant,
    }


# --------------------------------------------------------------------------- effects
class Intake:
    """Carries out deliveries on the bus. Adapter errors (:class:`InvalidPayload`) propagate unchanged."""

    def __init__(self, bus: Bus, *, retry_after_s: int) -> None:
        self._bus = bus
        self._retry_after_s = retry_after_s

    async def handle(self, trigger: WebhookTrigger, body: Any, *, body_bytes: int) -> Outcome:
        adapter = ADAPTERS[trigger.adapter]
        source = adapter.identify(body)
        delivery = WebhookDelivery(trigger, new_id("dlv"), body_bytes, source)
        with structlog.contextvars.bound_contextvars(delivery_id=delivery.delivery_id, source_event_id=source.id):
            ignored = ignore_reason(delivery)
            if ignored is not None:
                reason, detail = ignored
                await self._ignore(delivery, reason, detail)
                log.info("webhook.handled", status="ignored", reason=reason, source_event_type=source.type)
                return Ignored(delivery_id=delivery.delivery_id, reason=reason, detail=detail)
            event = adapter.normalize(body, tenant=trigger.tenant)
            run_id = run_id_for_delivery(trigger.id, event.id)
            with structlog.contextvars.bound_contextvars(run_id=run_id):
                outcome = await self._launch(delivery, event, run_id, adapter.run_title(event))
                log.info("webhook.handled", status=outcome.status)
                return outcome

    async def refused(self, trigger: WebhookTrigger, error: WebhookError, *, body_bytes: int) -> None:
        """Journal an authenticated delivery refused with 400/413/422, so an integrator can see why no
        run started. Best effort: the sender gets its 4xx whether or not the bus takes the record."""
        delivery_id = new_id("dlv")
        common: dict[str, Any] = {
            "source": SOURCE,
            "correlation_id": delivery_id,
            "actor": ACTOR,
            "tenant": trigger.tenant,
        }
        received = make_event(
            TriggerReceived(
                trigger_id=trigger.id, delivery_id=delivery_id, adapter=trigger.adapter, body_bytes=body_bytes
            ),
            id=derive_id("evt", delivery_id, "received"),
            **common,
        )
        rejected = make_event(
            TriggerRejected(
                trigger_id=trigger.id,
                delivery_id=delivery_id,
                reason="invalid_payload",
                detail=f"{error.status} {error.code}: {error.detail}"[:1000],
            ),
            id=derive_id("evt", delivery_id, "rejected"),
            causation_id=received.id,
            **common,
        )
        try:
            await self._io(self._bus.publish(received))
            await self._io(self._bus.publish(rejected))
        except Exception as exc:
            log.warning("webhook.refusal_not_journaled", error=repr(exc))

    async def _ignore(
        self, delivery: WebhookDelivery, reason: Literal["disabled", "unsupported_event"], detail: str
    ) -> None:
        tenant = delivery.trigger.tenant
        received = received_event(delivery, run_id=None, tenant=tenant)
        await self._io(self._bus.publish(received))
        await self._io(
            self._bus.publish(
                rejected_event(delivery, reason, detail, run_id=None, tenant=tenant, causation_id=received.id)
            )
        )

    async def _launch(self, delivery: WebhookDelivery, event: NormalizedEvent, run_id: str, title: str) -> Outcome:
        trigger = delivery.trigger
        key = dedupe_key(trigger.id, event.id)
        store = await self._io(self._bus.store(BUCKET_DEDUPE, DedupeRecord))
        received = received_event(delivery, run_id=run_id, tenant=event.tenant)
        # The read does not depend on the publish: one round trip for both.
        _, existing = await self._both(self._bus.publish(received), store.get(key))
        now = datetime.now(UTC)
        if existing is not None and existing.value.expires_at > now:
            detail = (
                f"source event {event.id} was already accepted as run {existing.value.run_id} "
                f"(delivery {existing.value.delivery_id})"
            )
            rejected = rejected_event(
                delivery, "duplicate", detail, run_id=run_id, tenant=event.tenant, causation_id=received.id
            )
            await self._io(self._bus.publish(rejected))
            return Duplicate(delivery_id=delivery.delivery_id, run_id=run_id)

        accepted, requested = launch_events(delivery, event, run_id=run_id, title=title, causation_id=received.id)
        await self._io(self._bus.publish(accepted))
        await self._io(self._bus.publish(requested))
        record = DedupeRecord(
            trigger_id=trigger.id,
            source_event_id=event.id,
            run_id=run_id,
            delivery_id=delivery.delivery_id,
            accepted_at=now,
            expires_at=now + timedelta(days=trigger.deduplication.ttl_days),
        )
        await self._io(self._remember(store, key, record, existing))
        return Accepted(delivery_id=delivery.delivery_id, run_id=run_id)

    async def _remember(
        self, store: Store[DedupeRecord], key: str, record: DedupeRecord, existing: Versioned[DedupeRecord] | None
    ) -> None:
        try:
            if existing is None:
                await store.create(key, record)
            else:  # an expired record (shorter ttl_days than the bucket's): replace it
                await store.update(key, record, existing.revision)
        except (AlreadyExists, Conflict):
            log.info("webhook.concurrent_delivery")  # another delivery of the same event got there first

    async def _both(self, first: Awaitable[T], second: Awaitable[U]) -> tuple[T, U]:
        one, two = await asyncio.gather(self._io(first), self._io(second), return_exceptions=True)
        if isinstance(one, BaseException):
            raise one
        if isinstance(two, BaseException):
            raise two
        return one, two

    async def _io(self, call: Awaitable[T]) -> T:
        """Run one bus call; anything NATS-side becomes :class:`BusUnavailable` (503, the sender retries)."""
        if not self._bus.nc.is_connected:
            if asyncio.iscoroutine(call):
                call.close()
            raise BusUnavailable("the event bus is not connected; retry later", self._retry_after_s)
        try:
            return await call
        except PermanentError as exc:  # e.g. larger than the server's max_payload: retrying cannot help
            log.warning("webhook.unpublishable", error=repr(exc))
            raise BodyTooLarge(f"the normalized event cannot be published: {exc}") from exc
        except (TransientError, nats.errors.Error, TimeoutError) as exc:
            log.warning("webhook.bus_unavailable", error=repr(exc))
            raise BusUnavailable("the event bus did not acknowledge in time; retry later", self._retry_after_s) from exc
