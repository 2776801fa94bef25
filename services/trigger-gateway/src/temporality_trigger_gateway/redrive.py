"""Re-driving a rejected or failed delivery (IDEM-1, issue 7): the same launch path, the original event id.

``POST /triggers/{id}/deliveries/{delivery_id}/redrive`` (operator) takes the delivery's stored record
(:mod:`.deliveries`) and runs its normalized event through the launch path *as the trigger is now*, as a
new delivery (id derived from the original and the re-drive's number, ``redrive_of`` naming the original)::

    the original was accepted                     -> 409 delivery_accepted (it could never start a second run)
    received / queued / debounced (not decided)   -> 409 delivery_pending
    loop_limit, or its event was not kept         -> 409 not_redrivable (the loop rule is not bypassed; a test
                                                     notification's sample event is never kept)
    the trigger is disabled / no longer lists the event type / its condition (when, filter) does not hold
                                                  -> journaled trigger.rejected, answered ignored
    otherwise                                     -> mapping, concurrency key, then Launcher.launch with
                                                     the run id of (trigger id, original event id)

Because the run id and the dedupe claim come from the original event id, a re-drive of an event that was
accepted meanwhile (by a retry of the sender) is a duplicate, never a second run.

A **rerun** (``{"rerun": n}`` as the body, :func:`rerun`) is the one way to run an *accepted* delivery's event
again, as a new run -- e.g. its run failed on the agent's configuration (a missing API key) and the card is
fixed now. Asked for explicitly and numbered, it is idempotent: rerun ``n`` of delivery ``d`` has the delivery
id ``derive_id("dlv", d, "rerun", n)`` and the run id ``derive_id("run", trigger id, d, "rerun", n)``, and its
own dedupe claim (keyed by that delivery id), so the same request retried is the same run (answered
``duplicate`` with its run id once it started)::

    the original is not accepted                  -> 409 not_rerunnable (re-drive it without rerun)
    n is past the next rerun (reruns made + 1)    -> 409 rerun_out_of_order (naming the next number)
    rerun n exists and was accepted               -> 200 duplicate, its run id (nothing published)
    otherwise                                     -> the launch path as for a re-drive, with the new run id;
                                                     run.requested's launch has rerun_of (the original run)
                                                     and requested_by (the operator)

The rerun's delivery record has ``redrive_of`` (the original delivery), ``rerun`` (n) and ``rerun_of`` (the
original run); the original lists it in ``redriven_as``.
"""

from __future__ import annotations

from typing import Any

import structlog

from temporality_bus import AlreadyExists
from temporality_protocol import derive_id, run_id_for_delivery
from temporality_protocol.catalog import BUCKET_DEDUPE
from temporality_service.http import Conflict
from temporality_trigger_gateway.deliveries import DeliveryRecord
from temporality_trigger_gateway.events import Lineage, lineage_key
from temporality_trigger_gateway.launch import Launcher, RejectReason, TriggerDelivery
from temporality_trigger_gateway.mapping import MappingFailed
from temporality_trigger_gateway.triggers import EventTrigger, TriggerConfig, WebhookTrigger

__all__ = [
    "MAX_RERUN",
    "DeliveryAccepted",
    "DeliveryPending",
    "NotRedrivable",
    "NotRerunnable",
    "RerunOutOfOrder",
    "next_rerun",
    "redrive",
    "rerun",
    "rerun_delivery_id",
]

#: The highest rerun number taken (a delivery is rerun a few times, never thousands).
MAX_RERUN = 100

log = structlog.get_logger(__name__)


class NotRedrivable(Conflict):
    code = "not_redrivable"


class DeliveryAccepted(Conflict):
    code = "delivery_accepted"


class DeliveryPending(Conflict):
    code = "delivery_pending"


class NotRerunnable(Conflict):
    code = "not_rerunnable"


class RerunOutOfOrder(Conflict):
    code = "rerun_out_of_order"


def rerun_delivery_id(delivery_id: str, number: int) -> str:
    """The delivery id of rerun ``number`` of ``delivery_id`` (one per pair: a retried rerun is the same one)."""
    return derive_id("dlv", delivery_id, "rerun", str(number))


async def next_rerun(launcher: Launcher, record: DeliveryRecord) -> int:
    """The number the next rerun of ``record``'s delivery takes: one more than the reruns recorded (read one by
    one, by their derived ids: a few reads)."""
    number = 1
    while number <= MAX_RERUN:
        found = await launcher.io(
            launcher.deliveries.get(record.trigger_id, rerun_delivery_id(record.delivery_id, number))
        )
        if found is None:
            return number
        number += 1
    return number


def _check(record: DeliveryRecord, next_number: int | None = None) -> None:
    """Refuse what a re-drive cannot (or must not) do, with the reason."""
    if record.state == "accepted":
        raise DeliveryAccepted(
            f"delivery {record.delivery_id} was accepted as run {record.run_id}: re-driving it could never start "
            "a second run. To run its event again as a new run (e.g. the run failed on the agent's "
            f'configuration, fixed since), rerun it: POST this with the body {{"rerun": {next_number or 1}}}'
        )
    if record.state in ("received", "queued", "debounced"):
        raise DeliveryPending(f"delivery {record.delivery_id} is still {record.state}: it has not been decided yet")
    if record.reason == "loop_limit":
        raise NotRedrivable(
            f"delivery {record.delivery_id} was refused by the loop rule, which a re-drive does not bypass"
        )
    if record.event is None:
        raise NotRedrivable(f"delivery {record.delivery_id} cannot be re-driven: {_not_kept(record)}")


def _not_kept(record: DeliveryRecord) -> str:
    """Why ``record`` has no event to run again (it has none)."""
    if record.reason == "test_notification":
        return "it is the sender's test notification (sample data), whose event is not kept: there is no event to run"
    if record.event_omitted:
        return "its event was not kept (it is larger than 64 KiB)"
    return "its event was not kept (the delivery was refused before it was normalized: its body or shape was wrong)"


async def redrive(launcher: Launcher, trigger: TriggerConfig, record: DeliveryRecord) -> dict[str, Any]:
    """Re-run ``record``'s delivery through the launch path; the outcome as the webhook answers it."""
    _check(record, await next_rerun(launcher, record) if record.state == "accepted" else None)
    number = len(record.redriven_as) + 1
    delivery = _again(trigger, record, derive_id("dlv", record.delivery_id, "redrive", str(number)))
    answer: dict[str, Any] = {"redrive_of": record.delivery_id, "delivery_id": delivery.delivery_id}
    return await _relaunch(launcher, trigger, record, delivery, answer)


async def rerun(
    launcher: Launcher, trigger: TriggerConfig, record: DeliveryRecord, number: int, requested_by: str
) -> dict[str, Any]:
    """Run ``record``'s accepted delivery again as rerun ``number``: a new run (module docstring)."""
    if record.state != "accepted" or record.run_id is None:
        if record.state in ("received", "queued", "debounced"):
            raise DeliveryPending(f"delivery {record.delivery_id} is still {record.state}: it has not been decided yet")
        raise NotRerunnable(
            f"delivery {record.delivery_id} was not accepted ({record.state}"
            f"{f', {record.reason}' if record.reason else ''}): a rerun runs an accepted delivery's event again as "
            "a new run; re-drive this one without rerun (an empty body)"
        )
    if record.event is None:
        raise NotRerunnable(f"delivery {record.delivery_id} cannot be rerun: {_not_kept(record)}")
    delivery_id = rerun_delivery_id(record.delivery_id, number)
    answer: dict[str, Any] = {
        "redrive_of": record.delivery_id,
        "delivery_id": delivery_id,
        "rerun": number,
        "rerun_of": record.run_id,
    }
    earlier = await launcher.io(launcher.deliveries.get(trigger.id, delivery_id))
    if earlier is None:
        following = await next_rerun(launcher, record)
        if number > following:
            raise RerunOutOfOrder(
                f"delivery {record.delivery_id} has {following - 1} rerun(s): the next one is "
                f'{{"rerun": {following}}}, not {number}'
            )
    elif earlier.state == "accepted":  # this rerun again (a retry, or a second operator): the same run
        following = await next_rerun(launcher, record)
        detail = (
            f"rerun {number} of delivery {record.delivery_id} started run {earlier.run_id} already; to run the event "
            f'once more, send {{"rerun": {following}}}'
        )
        return {**answer, "status": "duplicate", "run_id": earlier.run_id, "detail": detail}
    delivery = _again(trigger, record, delivery_id, rerun=number, rerun_of=record.run_id, requested_by=requested_by)
    return await _relaunch(launcher, trigger, record, delivery, answer)


def _again(
    trigger: TriggerConfig,
    record: DeliveryRecord,
    delivery_id: str,
    *,
    rerun: int | None = None,
    rerun_of: str | None = None,
    requested_by: str | None = None,
) -> TriggerDelivery:
    """``record``'s delivery once more, as ``delivery_id`` (a re-drive's, or with ``rerun``'s fields a rerun's): its
    source, event ids, size, depth and causation as they were."""
    return TriggerDelivery(
        trigger=trigger,
        delivery_id=delivery_id,
        kind=record.kind,
        adapter=record.adapter,
        source_event_id=record.source_event_id,
        source_event_type=record.source_event_type,
        body_bytes=record.body_bytes,
        depth=record.depth,
        causation_id=record.causation_id,
        correlation_id=record.correlation_id,
        rerun=rerun,
        rerun_of=rerun_of,
        requested_by=requested_by,
    )


async def _relaunch(
    launcher: Launcher,
    trigger: TriggerConfig,
    record: DeliveryRecord,
    delivery: TriggerDelivery,
    answer: dict[str, Any],
) -> dict[str, Any]:
    """``record``'s event through the launch path as ``delivery`` (a re-drive's, or a rerun's)."""
    event = record.event
    assert event is not None
    with structlog.contextvars.bound_contextvars(
        trigger_id=trigger.id, delivery_id=delivery.delivery_id, redrive_of=record.delivery_id, rerun=delivery.rerun
    ):
        refused: tuple[RejectReason, str] | None = _refusal(trigger, record.source_event_type or event.type)
        recorded_as: str | None = None
        if refused is None:
            try:
                filtered = trigger.filtered(event)
                if filtered is not None:
                    refused = ("filtered", filtered)
                else:
                    mapped = trigger.agent_input(event)
                    key = trigger.concurrency_key(event)
            except MappingFailed as exc:  # the trigger is still at fault: recorded (and answered) as such
                refused = ("invalid_payload", exc.detail("the tick" if record.kind == "schedule" else "this event"))
                recorded_as = "mapping_failed"
        if refused is not None:
            reason, detail = refused
            await launcher.refuse(
                delivery,
                reason,
                detail,
                tenant=event.tenant,
                event=event,
                title=record.title,
                redrive_of=record.delivery_id,
                recorded_as=recorded_as,
            )
            await launcher.deliveries.redriven(trigger.id, record.delivery_id, delivery.delivery_id)
            log.info("delivery.redriven", status="ignored", reason=recorded_as or reason)
            return {**answer, "status": "ignored", "reason": recorded_as or reason, "detail": detail}
        if delivery.rerun is None:
            run_id = run_id_for_delivery(trigger.id, event.id)
        else:  # a new run, one per (delivery, rerun number)
            run_id = derive_id("run", trigger.id, record.delivery_id, "rerun", str(delivery.rerun))
        if record.kind == "event":  # the run's lineage, as the event consumer writes it (TRG-6 depth)
            lineages = await launcher.io(launcher.bus.store(BUCKET_DEDUPE, Lineage))
            try:
                lineage = Lineage(run_id=run_id, depth=record.depth, chain=[trigger.id])
                await launcher.io(lineages.create(lineage_key(run_id), lineage))
            except AlreadyExists:
                pass
        outcome = await launcher.launch(
            delivery,
            event,
            run_id,
            record.title or f"{trigger.name}: {event.type}",
            mapped,
            with_payload=record.kind == "schedule" or trigger.input is not None,
            concurrency_key=key,
            redrive_of=record.delivery_id,
        )
        await launcher.deliveries.redriven(trigger.id, record.delivery_id, delivery.delivery_id)
        log.info("delivery.redriven", status=outcome.status, run_id=run_id)
    return {**answer, **outcome.model_dump(mode="json", exclude_none=True)}


def _refusal(trigger: TriggerConfig, event_type: str) -> tuple[RejectReason, str] | None:
    """Why the trigger as it is now ignores the event (disabled, or no longer an event type it lists);
    ``event_type`` is the source's (a webhook's ``events`` name those, e.g. ``git.pullrequest.created``)."""
    if not trigger.enabled:
        return "disabled", f"trigger {trigger.id} is disabled"
    if isinstance(trigger, WebhookTrigger) and event_type not in trigger.events:
        return "unsupported_event", f"trigger {trigger.id} does not handle {event_type!r} events"
    if isinstance(trigger, EventTrigger) and event_type not in trigger.event_types:
        return "unsupported_event", f"trigger {trigger.id} does not listen to {event_type!r} events"
    return None
