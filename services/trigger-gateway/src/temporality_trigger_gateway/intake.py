"""One webhook delivery: what to decide (pure functions) and the bus effects that carry it out.

The dedupe-and-launch path itself (claim first, IDEM-1) is :mod:`.launch`, shared with the event
triggers; this module turns an HTTP delivery into a :class:`~.launch.TriggerDelivery` and answers it::

    the sender's test notification (sample data)  -> trigger.received + trigger.rejected(unsupported_event)
                                                      -> 200 ignored (test_notification), never a run
    disabled trigger / event type it does not list -> trigger.received + trigger.rejected -> 200 ignored
    its ``when`` is not truthy for the event        -> trigger.received + trigger.rejected(filtered) -> 200 ignored
    an expression of the trigger fails on the event -> trigger.received + trigger.rejected(invalid_payload), the
                                                      event kept (re-drivable) -> 422 mapping_failed
    otherwise                                      -> normalize, map the input, launch -> 202 accepted
                                                      (or 200 duplicate: another delivery already did)

The delivery's record says ``test_notification`` or ``mapping_failed`` where the journal's ``trigger.rejected``
has the protocol's nearest reason (``unsupported_event``: not an event the trigger takes, as GitHub's ``ping``;
``invalid_payload``), its detail saying which.

Exactly one delivery of concurrent ones answers ``accepted``; every other gets its own
``trigger.rejected(duplicate)``. Every answer is sent only after JetStream acked what it reports.

A trigger whose verifier signs the raw body only (``github``, ``hmac_sha256``) and whose source takes the event id
from a header (:func:`replay_guarded`) claims the body's SHA-256 as well, in the same round trip as the event id's
claim: a captured signed body re-sent under another delivery id is a ``duplicate`` of the run the body started
(:mod:`.launch`, "Replays").

The events of one answer go out together (:meth:`temporality_bus.Bus.publish_many`: one round trip,
every ack awaited). Their order on the stream is their order in the batch (one connection), and no
consumer depends on it: the journal projects by type and the run-executor reads only ``run.requested``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from dataclasses import dataclass
from functools import partial
from typing import Literal

import structlog
from pydantic import BaseModel, ConfigDict

from temporality_bus import Bus
from temporality_protocol import NormalizedEvent, new_id, run_id_for_delivery
from temporality_service import ApiError
from temporality_trigger_gateway.adapters import ADAPTERS, Adapter, SourceEvent, WebhookRequest
from temporality_trigger_gateway.errors import BusUnavailable, InvalidPayload, TriggerMappingFailed
from temporality_trigger_gateway.launch import (
    ACTOR,
    SOURCE,
    Accepted,
    ClaimState,
    Debounced,
    DedupeRecord,
    Duplicate,
    Launcher,
    Queued,
    Skipped,
    TriggerDelivery,
    dedupe_key,
)
from temporality_trigger_gateway.mapping import MappingFailed
from temporality_trigger_gateway.triggers import WebhookTrigger

__all__ = [
    "ACTOR",
    "SOURCE",
    "Accepted",
    "ClaimState",
    "Debounced",
    "DedupeRecord",
    "Duplicate",
    "Ignored",
    "Intake",
    "Outcome",
    "Queued",
    "Skipped",
    "WebhookDelivery",
    "dedupe_key",
    "ignore_reason",
    "replay_guarded",
]

log = structlog.get_logger(__name__)


class Ignored(BaseModel):
    model_config = ConfigDict(frozen=True)
    delivery_id: str
    status: Literal["ignored"] = "ignored"
    reason: Literal["disabled", "unsupported_event", "filtered", "test_notification"]
    detail: str


Outcome = Accepted | Duplicate | Ignored | Queued | Skipped | Debounced


@dataclass(frozen=True)
class WebhookDelivery:
    """One HTTP delivery of one source event to one trigger."""

    trigger: WebhookTrigger
    delivery_id: str
    body_bytes: int
    source: SourceEvent
    #: The raw body's SHA-256 (hex) when the trigger is :func:`replay_guarded`, else ``None``.
    body_sha256: str | None = None

    def delivery(self) -> TriggerDelivery:
        """The delivery as the shared launch path sees it."""
        return TriggerDelivery(
            trigger=self.trigger,
            delivery_id=self.delivery_id,
            kind="webhook",
            adapter=self.trigger.adapter,
            source_event_id=self.source.id,
            source_event_type=self.source.type,
            body_bytes=self.body_bytes,
            body_sha256=self.body_sha256,
        )


# --------------------------------------------------------------------------- decisions (pure)
def replay_guarded(trigger: WebhookTrigger, adapter: Adapter) -> bool:
    """Whether a captured delivery of ``trigger`` could be re-sent as a new event: its verifier signs the raw body
    only (no delivery id, no time: ``github``, ``hmac_sha256``, ``mindmap``) and its source can take the event id
    from a header (``github``'s ``X-GitHub-Delivery``; ``generic``'s ``webhook-id`` / ``Idempotency-Key``). Such a
    trigger dedupes on the body's SHA-256 too. Not ``mindmap.test_case`` (its id is in the signed body: a copy is
    the same id) nor a token or password (``gitlab``, ``basic``, ``bearer``, ``header``: whoever replays it holds
    the credential itself) nor Standard Webhooks (its signature covers ``webhook-id`` and a time)."""
    return trigger.auth.signs_body_only and not adapter.id_in_body


def ignore_reason(delivery: WebhookDelivery) -> tuple[Literal["disabled", "unsupported_event"], str] | None:
    trigger = delivery.trigger
    if not trigger.enabled:
        return "disabled", f"trigger {trigger.id} is disabled"
    if delivery.source.type not in trigger.events:
        return "unsupported_event", f"trigger {trigger.id} does not handle {delivery.source.type!r} events"
    return None


def _normalized(adapter: Adapter, request: WebhookRequest, trigger: WebhookTrigger) -> NormalizedEvent | None:
    """The delivery's normalized event, or ``None`` when it is not one the adapter can normalize (an ignored
    delivery is answered 200 whatever its shape; only a normalizable one can be re-driven)."""
    try:
        return adapter.normalize(request, tenant=trigger.tenant)
    except InvalidPayload:
        return None


def _settle(settled: asyncio.Future[None], _: object) -> None:
    """Wake :meth:`Intake.handle_within`: its delivery's task is done, or its bound has passed (whichever first)."""
    if not settled.done():
        settled.set_result(None)


# --------------------------------------------------------------------------- effects
class Intake:
    """Carries out deliveries on the bus. Adapter errors (:class:`InvalidPayload`) propagate unchanged."""

    def __init__(
        self, bus: Bus, *, retry_after_s: int, claim_lease_s: float = 10.0, answer_within_s: float | None = None
    ) -> None:
        self._launcher = Launcher(bus, retry_after_s=retry_after_s, claim_lease_s=claim_lease_s)
        self._retry_after_s = retry_after_s
        self._answer_within_s = answer_within_s
        #: Deliveries answered 503 for a stalled bus while their handling goes on (:meth:`handle_within`).
        self._late: set[asyncio.Task[Outcome]] = set()

    async def handle_within(self, trigger: WebhookTrigger, request: WebhookRequest) -> Outcome:
        """:meth:`handle`, answered within ``answer_within_s``: a bus that stalls (a stopped nats-server acks
        nothing, each JetStream round waits out its 10 s) gets the sender a 503 with ``Retry-After`` well within
        its own delivery timeout (GitHub's and GitLab's are 10 s) instead of a timed-out delivery it never sees
        answered. The handling is not cancelled: it goes on in the background to the outcome it would have had
        (a delivery cut anywhere would be a crash between claim and publish), so nothing is lost or started
        twice -- a retry finds the event's claim held (503 again, until it is published or its lease ends) or
        published (``duplicate`` of the one run), or released by a failed launch (it launches)."""
        if self._answer_within_s is None:
            return await self.handle(trigger, request)
        # One task, one future and one timer: ``wait_for(shield(task))`` cost ~100 k instructions per accepted
        # webhook more (5.6 % of it, counted with bench/gateway_instructions.py), for the same outcome.
        loop = asyncio.get_running_loop()
        task = loop.create_task(self.handle(trigger, request))
        settled = loop.create_future()
        wake = partial(_settle, settled)
        task.add_done_callback(wake)
        bound = loop.call_later(self._answer_within_s, wake, None)
        try:
            await settled
        except asyncio.CancelledError:  # the request was cancelled (a server shutting down): the launch goes on
            bound.cancel()
            if not task.done():
                self._go_on(task, trigger.id)
            elif not task.cancelled():
                task.exception()  # retrieved: its outcome has nobody to go to
            raise
        if task.done():
            bound.cancel()
            return task.result()  # its outcome, or its own error (an adapter's 4xx, its own 503)
        self._go_on(task, trigger.id)  # the bound came first
        raise BusUnavailable(
            f"the event bus did not answer within {self._answer_within_s:g} s; retry later (the delivery is"
            " still being handled: a retry is answered its outcome, or a duplicate of its run)",
            self._retry_after_s,
        )

    def _go_on(self, task: asyncio.Task[Outcome], trigger_id: str) -> None:
        self._late.add(task)

        def settled(done: asyncio.Task[Outcome]) -> None:
            self._late.discard(done)
            if done.cancelled():
                log.warning("webhook.late_outcome", trigger_id=trigger_id, status="cancelled")
            elif (error := done.exception()) is not None:
                log.warning("webhook.late_outcome", trigger_id=trigger_id, status="failed", error=repr(error))
            else:
                log.info("webhook.late_outcome", trigger_id=trigger_id, status=done.result().status)

        task.add_done_callback(settled)

    async def drain(self, timeout_s: float = 30.0) -> None:
        """Wait (at most ``timeout_s``) for the deliveries still handled after their 503 (tests, shutdown: before
        the write-behind settles and the bus drains). One still running then is as a crash mid-launch: a retry of
        it takes its claim over after the lease."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self._late:
                    await asyncio.gather(*list(self._late), return_exceptions=True)

    @property
    def launcher(self) -> Launcher:
        """The launch path (the admin API's re-drive takes it too)."""
        return self._launcher

    async def handle(self, trigger: WebhookTrigger, request: WebhookRequest) -> Outcome:
        """One authenticated delivery, from its source's adapter to its journaled outcome."""
        adapter = ADAPTERS[trigger.adapter]
        source = adapter.identify(request)
        digest = hashlib.sha256(request.body).hexdigest() if replay_guarded(trigger, adapter) else None
        webhook = WebhookDelivery(trigger, new_id("dlv"), len(request.body), source, digest)
        delivery = webhook.delivery()
        ignored = ignore_reason(webhook)
        test = adapter.test_notification(request)
        if test is not None:
            return await self._test_notification(adapter, request, webhook, test, ignored)
        if ignored is not None:
            reason, detail = ignored
            with structlog.contextvars.bound_contextvars(
                trigger_id=trigger.id, delivery_id=delivery.delivery_id, source_event_id=source.id
            ):
                kept = _normalized(adapter, request, trigger)  # kept with the delivery: it can be re-driven
                await self._launcher.refuse(
                    delivery,
                    reason,
                    detail,
                    tenant=trigger.tenant,
                    event=kept,
                    title=None if kept is None else adapter.run_title(kept),
                )
                log.info("webhook.handled", status="ignored", reason=reason, source_event_type=source.type)
            return Ignored(delivery_id=delivery.delivery_id, reason=reason, detail=detail)
        event = adapter.normalize(request, tenant=trigger.tenant)
        try:
            filtered = trigger.filtered(event)
            if filtered is None:
                mapped = trigger.agent_input(event)
                key = trigger.concurrency_key(event)
        except MappingFailed as exc:
            raise await self._mapping_failed(adapter, webhook, event, exc) from None
        if filtered is not None:
            with structlog.contextvars.bound_contextvars(
                trigger_id=trigger.id, delivery_id=delivery.delivery_id, source_event_id=source.id
            ):
                await self._launcher.refuse(
                    delivery, "filtered", filtered, tenant=event.tenant, event=event, title=adapter.run_title(event)
                )
                log.info("webhook.handled", status="ignored", reason="filtered", source_event_type=source.type)
            return Ignored(delivery_id=delivery.delivery_id, reason="filtered", detail=filtered)
        run_id = run_id_for_delivery(trigger.id, event.id)
        # No context binding on this, the hot path: a failed launch logs its ids itself (launch.failed).
        # A mapped input is not the event's payload: the run's event keeps it (RUN-1's original event), within
        # the bus's bound (Launcher.payload_limit); without a mapping the input is the payload, carried once.
        outcome = await self._launcher.launch(
            delivery,
            event,
            run_id,
            adapter.run_title(event),
            mapped,
            with_payload=trigger.input is not None,
            concurrency_key=key,
        )
        log.info(
            "webhook.handled",
            status=outcome.status,
            trigger_id=trigger.id,
            delivery_id=delivery.delivery_id,
            source_event_id=source.id,
            run_id=run_id,
        )
        return outcome

    async def _test_notification(
        self,
        adapter: Adapter,
        request: WebhookRequest,
        webhook: WebhookDelivery,
        description: str,
        ignored: tuple[str, str] | None,
    ) -> Ignored:
        """The sender's test notification (:meth:`.adapters.Adapter.test_notification`): checked as a real event of
        its type would be (its shape: 422 as for one), then journaled as an event the trigger does not take and
        recorded ``test_notification``, without its event (sample data: nothing to re-drive). The detail says
        what a real event of the type would get when the trigger would ignore it."""
        trigger = webhook.trigger
        delivery = webhook.delivery()
        if ignored is None:
            adapter.normalize(request, tenant=trigger.tenant)  # the shape a real event of its type must have
            detail = f"{description}; a real event of this type is handled by trigger {trigger.id}"
        else:
            detail = f"{description}; a real event of this type would be ignored too ({ignored[1]})"
        with structlog.contextvars.bound_contextvars(
            trigger_id=trigger.id, delivery_id=delivery.delivery_id, source_event_id=delivery.source_event_id
        ):
            await self._launcher.refuse(
                delivery, "unsupported_event", detail, tenant=trigger.tenant, recorded_as="test_notification"
            )
            log.info(
                "webhook.handled",
                status="ignored",
                reason="test_notification",
                source_event_type=delivery.source_event_type,
            )
        return Ignored(delivery_id=delivery.delivery_id, reason="test_notification", detail=detail)

    async def _mapping_failed(
        self, adapter: Adapter, webhook: WebhookDelivery, event: NormalizedEvent, exc: MappingFailed
    ) -> TriggerMappingFailed:
        """An expression of the trigger (its ``input``, ``when`` or concurrency key) failed on a valid event: the
        delivery is journaled (``trigger.rejected(invalid_payload)``, its detail naming the expression) and recorded
        ``mapping_failed`` with its normalized event, so that it can be re-driven once the trigger is fixed; the
        error to answer (422 ``mapping_failed``: the trigger is at fault, not the payload)."""
        trigger = webhook.trigger
        delivery = webhook.delivery()
        failing = exc.failing()
        detail = exc.detail()
        with structlog.contextvars.bound_contextvars(
            trigger_id=trigger.id, delivery_id=delivery.delivery_id, source_event_id=delivery.source_event_id
        ):
            await self._launcher.refuse(
                delivery,
                "invalid_payload",
                detail,
                tenant=event.tenant,
                event=event,
                title=adapter.run_title(event),
                recorded_as="mapping_failed",
            )
            log.info("webhook.handled", status="refused", reason="mapping_failed", failing=exc.where)
        return TriggerMappingFailed(
            f"{failing}. The event itself is valid and was kept with delivery {delivery.delivery_id}: fix trigger "
            f"{trigger.id!r}'s {exc.section} (its admin API, PUT /triggers/{trigger.id}), then re-drive the delivery "
            f"(POST /triggers/{trigger.id}/deliveries/{delivery.delivery_id}/redrive) or send the event again",
            [{"loc": [p for p in (exc.section, exc.field) if p], "msg": str(exc), "type": "mapping"}],
            delivery_id=delivery.delivery_id,
        )

    async def refused(self, trigger: WebhookTrigger, error: ApiError, *, body_bytes: int) -> None:
        """Journal an authenticated delivery refused with 400/413/422, so an integrator can see why no
        run started. Best effort: the sender gets its 4xx whether or not the bus takes the record."""
        delivery = TriggerDelivery(
            trigger=trigger,
            delivery_id=new_id("dlv"),
            kind="webhook",
            adapter=trigger.adapter,
            source_event_id=None,
            source_event_type=None,
            body_bytes=body_bytes,
        )
        detail = f"{error.status} {error.code}: {error.detail}"
        try:
            await self._launcher.refuse(delivery, "invalid_payload", detail, tenant=trigger.tenant)
        except Exception as exc:
            log.warning(
                "webhook.refusal_not_journaled",
                trigger_id=trigger.id,
                delivery_id=delivery.delivery_id,
                error=repr(exc),
            )
