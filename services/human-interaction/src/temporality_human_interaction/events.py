"""The events this service publishes, built as envelopes with deterministic ids.

Pure functions: the handlers decide, call one of these, and hand the envelope to ``bus.publish``.
Every id is derived from the request id and the fact, so a redelivered message or a retried HTTP
call republishes the same id and JetStream (and the journal) keep one copy.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Literal

from temporality_human_interaction.records import HumanRequestRecord
from temporality_protocol import (
    DeliveryAttempt,
    Envelope,
    EventData,
    HumanAnswer,
    HumanAnswered,
    HumanAnswerRefused,
    HumanEscalated,
    HumanExpired,
    HumanNotificationDelivered,
    HumanNotificationFailed,
    HumanNotified,
    HumanNotifyRequested,
    HumanReasked,
    HumanRejected,
    HumanRejectReason,
    HumanRequested,
    HumanWithdrawn,
    HumanWithdrawReason,
    OptionAnswer,
    RunCancelRequested,
    derive_id,
    make_event,
)
from temporality_protocol.events import MAX_TEXT

__all__ = [
    "ACTOR",
    "SERVICE",
    "SOURCE",
    "RefusedReason",
    "RejectReason",
    "answer_refused_event",
    "answered_event",
    "cancel_requested_event",
    "escalated_event",
    "expired_event",
    "notification_delivered_event",
    "notification_failed_event",
    "notified_event",
    "reasked_event",
    "rejected_event",
    "rejected_event_of",
    "responder_display_name",
    "withdraw_reason",
    "withdrawn_event",
]

SERVICE = "human-interaction"
SOURCE = f"/temporality/{SERVICE}"
ACTOR = f"service:{SERVICE}"


#: Why a request was refused (``human.rejected.reason``): the protocol's vocabulary.
RejectReason = HumanRejectReason


def rejected_event(incoming: Envelope, payload: HumanRequested, reason: RejectReason, detail: str) -> Envelope:
    return rejected_event_of(
        incoming,
        HumanRejected(
            request_id=payload.request_id,
            run_id=payload.run_id,
            recipient=payload.recipient,
            reason=reason,
            detail=detail,
        ),
    )


def rejected_event_of(incoming: Envelope, rejected: HumanRejected) -> Envelope:
    """``human.rejected`` caused by ``incoming`` (its ``human.requested``): one id per request."""
    return make_event(
        rejected,
        source=SOURCE,
        id=derive_id("evt", rejected.request_id, "rejected"),
        run_id=rejected.run_id,
        correlation_id=incoming.correlationid,
        tenant=incoming.tenant,
        causation_id=incoming.id,
        actor=ACTOR,
    )


def notified_event(
    record: HumanRequestRecord, *, channel: str, fallback_from: str | None, truncated: list[str] | None = None
) -> Envelope:
    """``human.notified``; ``redacted`` comes from the record (intake), ``truncated`` from the channel's egress."""
    return make_event(
        HumanNotified(
            request_id=record.request_id,
            run_id=record.run_id,
            recipient=record.recipient,
            channel=channel,
            fallback_from=fallback_from,
            failed_attempts=list(record.failed_deliveries),
            redacted=dict(record.redactions),
            truncated=list(truncated or []),
        ),
        source=SOURCE,
        id=derive_id("evt", record.request_id, "notified"),
        run_id=record.run_id,
        correlation_id=record.correlation_id,
        tenant=record.tenant,
        causation_id=record.requested_event_id,
        traceparent=record.traceparent,
        tracestate=record.tracestate,
        actor=ACTOR,
    )


def answered_event(record: HumanRequestRecord, *, channel: str) -> Envelope:
    """``human.answered`` for a record already bound to its answer."""
    if record.answer is None or record.responder is None or record.answered_at is None:
        raise ValueError(f"request {record.request_id} has no bound answer")
    return make_event(
        HumanAnswered(
            request_id=record.request_id,
            run_id=record.run_id,
            recipient=record.recipient,
            responder=record.responder,
            responder_display_name=responder_display_name(record),
            answer=record.answer,
            channel=channel,
            waited_s=record.waited_s(record.answered_at),
            redacted=record.answer_redactions,
        ),
        source=SOURCE,
        id=derive_id("evt", record.request_id, "answered"),
        run_id=record.run_id,
        correlation_id=record.correlation_id,
        tenant=record.tenant,
        causation_id=record.requested_event_id,
        traceparent=record.traceparent,
        tracestate=record.tracestate,
        actor=record.responder,
    )


def responder_display_name(record: HumanRequestRecord) -> str | None:
    """The responder's directory display name as the binding recorded it; ``None`` for someone the directory does
    not know (the binding then records the responder's id, or nothing on a record from before it)."""
    name = (record.responder_name or "").strip()
    return name[:200] if name and name != record.responder else None


#: Why an answer was refused and journaled (``human.answer_refused.reason``).
RefusedReason = Literal["already_answered", "expired", "cancelled", "not_recipient"]


def answer_refused_event(
    record: HumanRequestRecord,
    *,
    responder: str,
    channel: str,
    reason: RefusedReason,
    detail: str,
    received_at: datetime,
    answer: HumanAnswer | None,
    submission_key: str,
) -> Envelope:
    """``human.answer_refused`` (HUM-7, HUM-9): one id per (request, responder, what they sent), so a redelivered
    or retried refusal is one event; the same person sending something else is another."""
    digest = hashlib.sha256(submission_key.encode()).hexdigest()[:16]
    return make_event(
        HumanAnswerRefused(
            request_id=record.request_id,
            run_id=record.run_id,
            recipient=record.recipient,
            responder=responder,
            channel=channel,
            reason=reason,
            detail=detail[:500],
            received_at=received_at,
            answer=answer,
        ),
        source=SOURCE,
        id=derive_id("evt", record.request_id, "answer_refused", responder, digest),
        run_id=record.run_id,
        correlation_id=record.correlation_id,
        tenant=record.tenant,
        causation_id=record.requested_event_id,
        traceparent=record.traceparent,
        tracestate=record.tracestate,
        actor=ACTOR,
    )


def expired_event(record: HumanRequestRecord, *, now: datetime) -> Envelope:
    """``human.expired`` carrying the request's timeout policy (HUM-8), with the default answer if any."""
    on_timeout = record.policy.on_timeout
    default_answer: OptionAnswer | None = None
    if on_timeout.action == "default" and on_timeout.default_option is not None:
        option = record.option(on_timeout.default_option)
        default_answer = OptionAnswer(
            option_id=on_timeout.default_option, label=option.label if option is not None else None
        )
    return make_event(
        HumanExpired(
            request_id=record.request_id,
            run_id=record.run_id,
            recipient=record.recipient,
            action=on_timeout.action,
            default_answer=default_answer,
            waited_s=record.waited_s(now),
        ),
        source=SOURCE,
        id=derive_id("evt", record.request_id, "expired"),
        run_id=record.run_id,
        correlation_id=record.correlation_id,
        tenant=record.tenant,
        causation_id=record.requested_event_id,
        traceparent=record.traceparent,
        tracestate=record.tracestate,
        actor=ACTOR,
    )


#: What ended the question (``cancel_pending``'s ``because``: the run's end event type, or ``not_needed``) as
#: ``human.withdrawn``'s ``reason``.
_WITHDRAW_REASONS: dict[str, HumanWithdrawReason] = {
    "run.completed": "run_completed",
    "run.failed": "run_failed",
    "run.cancelled": "run_cancelled",
    "not_needed": "not_needed",
}


def withdraw_reason(because: str | None) -> HumanWithdrawReason | None:
    """``human.withdrawn``'s reason for a cancellation ``because`` (None: not a withdrawal this event names)."""
    return _WITHDRAW_REASONS.get(because or "")


def withdrawn_event(record: HumanRequestRecord, *, reason: HumanWithdrawReason, run_reason: str | None) -> Envelope:
    """``human.withdrawn`` for a request cancelled with its run (or no longer needed by it): once per request
    (the id is derived from the request id alone); its data comes from the stored record, so a republish after a
    crash carries the same facts."""
    withdrawn_at = record.ended_at or datetime.now(UTC)
    return make_event(
        HumanWithdrawn(
            request_id=record.request_id,
            run_id=record.run_id,
            recipient=record.recipient,
            channel=record.channel,
            reason=reason,
            run_reason=run_reason[:500] if run_reason else None,
            asked_at=record.created_at,
            withdrawn_at=withdrawn_at,
            waited_s=record.waited_s(withdrawn_at),
        ),
        source=SOURCE,
        id=derive_id("evt", record.request_id, "withdrawn"),
        run_id=record.run_id,
        correlation_id=record.correlation_id,
        tenant=record.tenant,
        causation_id=record.requested_event_id,
        traceparent=record.traceparent,
        tracestate=record.tracestate,
        actor=ACTOR,
    )


def reasked_event(
    record: HumanRequestRecord, *, attempt: int, of: int, channels: list[str], failed: list[DeliveryAttempt]
) -> Envelope:
    """``human.reasked``: reminder ``attempt`` of ``of`` (HUM-8); one id per (request, attempt)."""
    return make_event(
        HumanReasked(
            request_id=record.request_id,
            run_id=record.run_id,
            recipient=record.recipient,
            attempt=attempt,
            of=of,
            channels=channels,
            failed_attempts=failed,
        ),
        source=SOURCE,
        id=derive_id("evt", record.request_id, "reasked", str(attempt)),
        run_id=record.run_id,
        correlation_id=record.correlation_id,
        tenant=record.tenant,
        causation_id=record.requested_event_id,
        traceparent=record.traceparent,
        tracestate=record.tracestate,
        actor=ACTOR,
    )


def escalated_event(record: HumanRequestRecord, *, channels: list[str], failed: list[DeliveryAttempt]) -> Envelope:
    """``human.escalated``: the question forwarded to the policy's escalation target (HUM-8); once per request."""
    if record.escalated_to is None:
        raise ValueError(f"request {record.request_id} has not escalated")
    return make_event(
        HumanEscalated(
            request_id=record.request_id,
            run_id=record.run_id,
            recipient=record.recipient,
            to=record.escalated_to,
            members=list(record.escalation_members),
            channels=channels,
            failed_attempts=failed,
        ),
        source=SOURCE,
        id=derive_id("evt", record.request_id, "escalated"),
        run_id=record.run_id,
        correlation_id=record.correlation_id,
        tenant=record.tenant,
        causation_id=record.requested_event_id,
        traceparent=record.traceparent,
        tracestate=record.tracestate,
        actor=ACTOR,
    )


def cancel_requested_event(record: HumanRequestRecord) -> Envelope:
    """``run.cancel_requested`` for the run of a request that timed out with the policy ``cancel`` (HUM-8)."""
    return make_event(
        RunCancelRequested(
            run_id=record.run_id,
            reason=f"human_timeout: nobody answered {record.request_id} by {record.expires_at.isoformat()}",
            requested_by=ACTOR,
        ),
        source=SOURCE,
        id=derive_id("evt", record.request_id, "cancel_requested"),
        run_id=record.run_id,
        correlation_id=record.correlation_id,
        tenant=record.tenant,
        causation_id=record.requested_event_id,
        traceparent=record.traceparent,
        tracestate=record.tracestate,
        actor=ACTOR,
    )


# --------------------------------------------------------------------------- an agent's notify (HUM-9)
def _about_notification(incoming: Envelope, payload: HumanNotifyRequested, data: EventData, *parts: str) -> Envelope:
    """An event about the notification ``incoming`` asked for: in its run, caused by it, one id per ``parts``."""
    return make_event(
        data,
        source=SOURCE,
        id=derive_id("evt", payload.notification_id, *parts),
        run_id=payload.run_id,
        correlation_id=incoming.correlationid,
        tenant=incoming.tenant,
        causation_id=incoming.id,
        traceparent=incoming.traceparent,
        tracestate=incoming.tracestate,
        actor=ACTOR,
    )


def notification_delivered_event(
    incoming: Envelope,
    payload: HumanNotifyRequested,
    *,
    person: str,
    channel: str,
    preferred: str | None,
    failed: list[DeliveryAttempt],
    delivery: int,
    redacted: dict[str, int],
    truncated: bool,
) -> Envelope:
    """``human.notification_delivered``: one id per (notification, person told)."""
    data = HumanNotificationDelivered(
        notification_id=payload.notification_id,
        run_id=payload.run_id,
        recipient=payload.recipient,
        person=person,
        channel=channel,
        fallback_from=preferred if preferred != channel else None,
        failed_attempts=failed,
        delivery=delivery,
        redacted=redacted,
        truncated=truncated,
    )
    return _about_notification(incoming, payload, data, "notification_delivered", person)


def notification_failed_event(
    incoming: Envelope,
    payload: HumanNotifyRequested,
    *,
    reason: Literal["recipient_not_allowed", "unknown_recipient", "no_channel", "failed"],
    detail: str,
    unreached: list[str],
    failed: list[DeliveryAttempt],
    deliveries: int,
) -> Envelope:
    """``human.notification_failed``: once per notification, whichever delivery gave it up."""
    data = HumanNotificationFailed(
        notification_id=payload.notification_id,
        run_id=payload.run_id,
        recipient=payload.recipient,
        reason=reason,
        detail=detail[:MAX_TEXT],
        unreached=unreached,
        failed_attempts=failed,
        deliveries=max(1, deliveries),
    )
    return _about_notification(incoming, payload, data, "notification_failed")
