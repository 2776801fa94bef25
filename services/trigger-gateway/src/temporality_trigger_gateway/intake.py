"""One webhook delivery: what to decide (pure functions) and the bus effects that carry it out.

Exactly-once run creation (IDEM-1), claim first::

    claim the dedupe key (trigger id, event id): KV create-if-absent, state ``claimed``
      won      -> trigger.received (fresh id per delivery) + trigger.accepted + run.requested (ids derived
                  from the run), pipelined, every ack awaited -> state ``published`` -> 202
      lost     -> the key says ``published``            -> trigger.received + trigger.rejected(duplicate)
                                                           -> 200 duplicate
                  the key says ``claimed``, lease fresh -> wait for it to be published (or released)
                  ``claimed`` past its lease, ``released`` or expired -> take the claim over (compare-and-set)
                  and publish the same derived ids: JetStream dedupes ``Nats-Msg-Id``, the run store
                  refuses a second line, so a process that died between claim and publish loses nothing

Exactly one delivery of concurrent ones answers ``accepted``; every other gets its own
``trigger.rejected(duplicate)``. A claimant whose publish fails releases its claim (best effort) so
the sender's retry takes over at once. Every answer is sent only after JetStream acked what it reports.

The events of one answer go out together (:meth:`temporality_bus.Bus.publish_many`: one round trip,
every ack awaited). Their order on the stream is their order in the batch (one connection), and no
consumer depends on it: the journal projects by type and the run-executor reads only ``run.requested``.
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

from temporality_bus import AlreadyExists, Bus, Conflict, PermanentError, Store, TransientError, evolve
from temporality_protocol import (
    Envelope,
    HumanPolicy,
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
from temporality_service import ApiError
from temporality_trigger_gateway.adapters import ADAPTERS, SourceEvent, WebhookRequest
from temporality_trigger_gateway.errors import BodyTooLarge, BusUnavailable, InvalidPayload
from temporality_trigger_gateway.mapping import MappingFailed
from temporality_trigger_gateway.triggers import WebhookTrigger

__all__ = [
    "ACTOR",
    "SOURCE",
    "Accepted",
    "ClaimState",
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
#: How often a delivery that lost the claim re-reads it while the claimant publishes.
_POLL_S = 0.02
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


ClaimState = Literal["claimed", "published", "released"]


class DedupeRecord(BaseModel):
    """The value under a dedupe key: which run a source event started, and how far its launch got.

    ``claimed``: a delivery owns the launch and is publishing; ``published``: JetStream acked
    ``run.requested``; ``released``: the claimant failed to publish and gave the claim back. A record
    written before claims existed has no ``state`` and reads as ``published``."""

    model_config = ConfigDict(frozen=True)

    trigger_id: str
    source_event_id: str
    run_id: str
    delivery_id: str
    accepted_at: datetime
    expires_at: datetime
    state: ClaimState = "published"
    claimed_at: datetime | None = None


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
    delivery: WebhookDelivery,
    event: NormalizedEvent,
    *,
    run_id: str,
    title: str,
    causation_id: str,
    human: HumanPolicy,
    input: dict[str, Any] | None = None,
) -> tuple[Envelope, Envelope]:
    """``trigger.accepted`` and ``run.requested``, with ids derived from the run: redelivery reuses them.

    ``human`` is ``delivery.trigger.human.policy()`` when the caller already has it (it never changes).
    ``input`` is the agent input the trigger's mapping produced (:func:`.mapping.agent_input`); ``None``:
    the event's payload."""
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
            event=_without_payload(event),  # carried once, as the input
            input=event.payload if input is None else input,
            human=human,  # SEC-1: from the trigger's config (cached per trigger), never from the webhook
        ),
        causation_id=accepted.id,
        **_envelope(delivery, run_id=run_id, tenant=event.tenant, id=derive_id("evt", run_id, "run.requested")),
    )
    return accepted, requested


def _without_payload(event: NormalizedEvent) -> NormalizedEvent:
    """``event`` with an empty payload. Not re-validated: every field comes from ``event``, which its
    adapter built through the validating constructor, and ``{}`` is a valid payload."""
    fields = dict(event.__dict__)
    fields["payload"] = {}
    return NormalizedEvent.model_construct(event.model_fields_set | {"payload"}, **fields)


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

    def __init__(self, bus: Bus, *, retry_after_s: int, claim_lease_s: float = 10.0) -> None:
        self._bus = bus
        self._retry_after_s = retry_after_s
        self._claim_lease_s = claim_lease_s
        self._store: Store[DedupeRecord] | None = None
        self._policies: dict[str, tuple[WebhookTrigger, HumanPolicy]] = {}

    async def handle(self, trigger: WebhookTrigger, request: WebhookRequest) -> Outcome:
        """One authenticated delivery, from its source's adapter to its journaled outcome."""
        adapter = ADAPTERS[trigger.adapter]
        source = adapter.identify(request)
        delivery = WebhookDelivery(trigger, new_id("dlv"), len(request.body), source)
        ignored = ignore_reason(delivery)
        if ignored is not None:
            reason, detail = ignored
            with structlog.contextvars.bound_contextvars(
                trigger_id=trigger.id, delivery_id=delivery.delivery_id, source_event_id=source.id
            ):
                await self._ignore(delivery, reason, detail)
                log.info("webhook.handled", status="ignored", reason=reason, source_event_type=source.type)
            return Ignored(delivery_id=delivery.delivery_id, reason=reason, detail=detail)
        event = adapter.normalize(request, tenant=trigger.tenant)
        try:
            mapped = trigger.agent_input(event)
        except MappingFailed as exc:
            raise InvalidPayload(
                f"the trigger's input mapping cannot be applied to this event ({exc})",
                [{"loc": ["input", exc.field], "msg": str(exc), "type": "mapping"}],
            ) from None
        run_id = run_id_for_delivery(trigger.id, event.id)
        # One binding for the whole launch: what any warning below (bus, claim) needs to be traced.
        with structlog.contextvars.bound_contextvars(
            trigger_id=trigger.id, delivery_id=delivery.delivery_id, source_event_id=source.id, run_id=run_id
        ):
            outcome = await self._launch(delivery, event, run_id, adapter.run_title(event), mapped)
            log.info("webhook.handled", status=outcome.status)
        return outcome

    async def refused(self, trigger: WebhookTrigger, error: ApiError, *, body_bytes: int) -> None:
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
            await self._io(self._bus.publish_many((received, rejected)))
        except Exception as exc:
            log.warning(
                "webhook.refusal_not_journaled", trigger_id=trigger.id, delivery_id=delivery_id, error=repr(exc)
            )

    async def _ignore(
        self, delivery: WebhookDelivery, reason: Literal["disabled", "unsupported_event"], detail: str
    ) -> None:
        tenant = delivery.trigger.tenant
        received = received_event(delivery, run_id=None, tenant=tenant)
        rejected = rejected_event(delivery, reason, detail, run_id=None, tenant=tenant, causation_id=received.id)
        await self._io(self._bus.publish_many((received, rejected)))

    async def _launch(
        self, delivery: WebhookDelivery, event: NormalizedEvent, run_id: str, title: str, mapped: dict[str, Any]
    ) -> Outcome:
        key = dedupe_key(delivery.trigger.id, event.id)
        store = await self._dedupe()
        received = received_event(delivery, run_id=run_id, tenant=event.tenant)
        won = await self._claim(store, key, delivery, event, run_id)
        if isinstance(won, DedupeRecord):
            detail = f"source event {event.id} was already accepted as run {won.run_id} (delivery {won.delivery_id})"
            rejected = rejected_event(
                delivery, "duplicate", detail, run_id=run_id, tenant=event.tenant, causation_id=received.id
            )
            await self._io(self._bus.publish_many((received, rejected)))
            return Duplicate(delivery_id=delivery.delivery_id, run_id=run_id)

        claim, revision = won
        accepted, requested = launch_events(
            delivery,
            event,
            run_id=run_id,
            title=title,
            causation_id=received.id,
            human=self._policy(delivery.trigger),
            input=mapped,
        )
        try:
            await self._io(self._bus.publish_many((received, accepted, requested)))
        except Exception:
            await self._release(store, key, claim, revision)
            raise
        try:
            await self._io(store.update(key, evolve(claim, state="published"), revision))
        except Conflict:
            log.info("webhook.claim_taken_over")  # a redelivery took a stale claim over; it published the same ids
        except BusUnavailable:
            # run.requested is durable: answer accepted. A redelivery after the lease republishes the same
            # ids (deduped) instead of answering duplicate: harmless.
            log.warning("webhook.claim_not_marked_published")
        return Accepted(delivery_id=delivery.delivery_id, run_id=run_id)

    def _policy(self, trigger: WebhookTrigger) -> HumanPolicy:
        """The trigger's human policy as it goes on the wire, built once per trigger (both are frozen)."""
        cached = self._policies.get(trigger.id)
        if cached is None or cached[0] is not trigger:
            cached = self._policies[trigger.id] = (trigger, trigger.human.policy())
        return cached[1]

    async def _dedupe(self) -> Store[DedupeRecord]:
        if self._store is None:
            self._store = await self._io(self._bus.store(BUCKET_DEDUPE, DedupeRecord))
        return self._store

    async def _claim(
        self, store: Store[DedupeRecord], key: str, delivery: WebhookDelivery, event: NormalizedEvent, run_id: str
    ) -> tuple[DedupeRecord, int] | DedupeRecord:
        """Own the launch of ``event`` (the claim and its revision), or the record of the delivery that did."""
        trigger = delivery.trigger
        lease = timedelta(seconds=self._claim_lease_s)
        deadline = asyncio.get_running_loop().time() + self._claim_lease_s + 5 * _POLL_S
        while True:
            now = datetime.now(UTC)
            claim = DedupeRecord(
                trigger_id=trigger.id,
                source_event_id=event.id,
                run_id=run_id,
                delivery_id=delivery.delivery_id,
                accepted_at=now,
                expires_at=now + timedelta(days=trigger.deduplication.ttl_days),
                state="claimed",
                claimed_at=now,
            )
            try:
                return claim, await self._io(store.create(key, claim))
            except AlreadyExists:
                pass
            existing = await self._io(store.get(key))
            if existing is None:
                continue  # gone between the two calls (bucket TTL): claim again
            record = existing.value
            stale = (
                record.expires_at <= now
                or record.state == "released"
                or (record.state == "claimed" and (record.claimed_at or record.accepted_at) + lease <= now)
            )
            if stale:
                if record.state == "claimed" and record.expires_at > now:
                    log.warning("webhook.stale_claim_taken_over", claimed_by=record.delivery_id)
                try:
                    return claim, await self._io(store.update(key, claim, existing.revision))
                except Conflict:
                    continue  # another delivery took it over first
            if record.state == "published":
                return record
            # Another delivery holds a fresh claim and is publishing: wait for its outcome.
            if asyncio.get_running_loop().time() > deadline:
                raise BusUnavailable(
                    "another delivery of this event is still being published; retry later", self._retry_after_s
                )
            await asyncio.sleep(_POLL_S)

    async def _release(self, store: Store[DedupeRecord], key: str, claim: DedupeRecord, revision: int) -> None:
        """Give a claim back after a failed publish, so the sender's retry need not wait for the lease."""
        try:
            await self._io(store.update(key, evolve(claim, state="released"), revision))
        except Exception as exc:
            log.warning("webhook.claim_not_released", error=repr(exc))

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
