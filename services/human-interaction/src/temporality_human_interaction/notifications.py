"""``human.notify_requested``: an agent tells a person something and does not wait (HUM-9).

Run by :class:`temporality_bus.Consumer` on ``CONSUMERS["human-interaction-notifications"]``. The same
checks and routing as a question:

1. SEC-1: the recipient must be ``user:<id>``, listed in the run's ``allowed_recipients`` (this service's
   projection of ``run.requested``, :mod:`.policies`, not the event's copy; retried until it is there) and
   known to the directory; otherwise :class:`~temporality_bus.PermanentError` (the runtime dead-letters
   it and journals ``bus.dead_lettered``: a refused notification is visible, never silently dropped).
2. The profile's channels in order (preferred, then fallback) through each adapter's
   :meth:`~.channels.ChannelAdapter.notify`; a channel that is not running, has no identity for the
   person or refuses (the web inbox carries no notifications) is skipped for the next. All failing is
   transient: redelivered with backoff, finally dead-lettered.
3. The moment a channel has sent it, ``notify.<notification id>`` is claimed in the ``human-channels`` bucket
   with the channel and the encoded ``human.notification_delivered`` (the channel, the channels that failed
   before it on this delivery, which delivery it was; one id per notification and person); then that event is
   published. A redelivery that finds the marker sends nothing and publishes the marker's event again (same
   id: journaled once), so a crash between the claim and the publish loses no event. The bound: a crash in
   the one KV write between the send and the claim sends it again -- on Telegram as a second message (the Bot
   API has no idempotency key); on Matrix the transaction id derived from the marker's key lets the homeserver
   answer the resend with the first event (same access token). The event is journaled once either way.
4. When the notification is given up (refused, every delivery spent, whichever way it is dead-lettered),
   :meth:`NotificationHandler.on_dead_letter` publishes ``human.notification_failed``: why, who was not
   told and the last delivery's failed attempts.

A ``group:<id>`` recipient (itself in ``allowed_recipients``) tells every member of the group, each on
their own channels; each member sent to is claimed as ``notify.<notification id>.<user id>``, so a
redelivery (after one member's channels all failed: transient) sends only to the members not told yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import structlog

from temporality_bus import Bus, Delivery, PermanentError, TransientError
from temporality_human_interaction.channels import ChannelAdapter, ChannelError
from temporality_human_interaction.channels.refs import ChannelRefs, ref_key
from temporality_human_interaction.directory import Directory, UserProfile, group_id_of, user_id_of
from temporality_human_interaction.events import notification_delivered_event, notification_failed_event
from temporality_human_interaction.policies import PolicyPending, PolicyUnknown, RunPolicies, asks_nobody
from temporality_protocol import DeliveryAttempt, Envelope, ProtocolError, decode, encode
from temporality_protocol.catalog import CONSUMERS
from temporality_protocol.events import MAX_TEXT, HumanNotifyRequested

__all__ = ["NotificationHandler", "NotificationRefused", "NotificationUndelivered", "notification_text"]

log = structlog.get_logger(__name__)

#: The notification consumer's last delivery: a policy still being projected then is a refusal (dead letter).
_LAST_DELIVERY = CONSUMERS["human-interaction-notifications"].max_deliver


def notification_text(payload: HumanNotifyRequested) -> str:
    return f"📣 {payload.title}\n\n{payload.message}"[:MAX_TEXT]


class NotificationRefused(PermanentError):
    """The notification may never be sent (SEC-1, or nobody in the directory by that name): dead-lettered."""

    def __init__(self, reason: Literal["recipient_not_allowed", "unknown_recipient"], detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class NotificationUndelivered(TransientError):
    """Every channel failed for someone (``unreached``) on this delivery: retried, finally dead-lettered."""

    def __init__(self, detail: str, unreached: list[str], attempts: list[DeliveryAttempt]) -> None:
        super().__init__(detail)
        self.unreached = unreached
        self.attempts = attempts


class NotificationHandler:
    def __init__(
        self,
        bus: Bus,
        directory: Directory,
        adapters: Mapping[str, ChannelAdapter],
        *,
        policies: RunPolicies | None = None,
    ) -> None:
        #: SEC-1: the projected run policies (:mod:`.policies`); ``None`` trusts the event's copy (unit tests).
        self._policies = policies
        self._bus = bus
        self._directory = directory
        self._adapters = adapters
        self._refs = ChannelRefs(bus)

    async def handle(self, event: Envelope, delivery: Delivery | None = None) -> None:
        payload = event.payload(HumanNotifyRequested)  # invalid data -> ProtocolError -> dead-lettered
        with structlog.contextvars.bound_contextvars(notification_id=payload.notification_id, run_id=payload.run_id):
            user_id, group_id = user_id_of(payload.recipient), group_id_of(payload.recipient)
            policy = payload.policy
            if self._policies is not None and asks_nobody(policy):  # no policy is stored for such a run
                raise NotificationRefused(
                    "recipient_not_allowed",
                    f"run {payload.run_id}'s policy allows no recipient: nobody may be notified",
                )
            if self._policies is not None:
                try:
                    policy = await self._policies.get(payload.run_id, delivery)
                except PolicyUnknown as unknown:
                    raise NotificationRefused("recipient_not_allowed", str(unknown)) from None
                except PolicyPending as pending:  # a notification is not parked: retried up to the last delivery
                    if delivery is not None and delivery.num_delivered < _LAST_DELIVERY:
                        raise TransientError(str(pending)) from None
                    raise NotificationRefused(
                        "recipient_not_allowed",
                        f"{pending}; nobody may be notified yet, and this was the last delivery",
                    ) from None
            allowed = payload.recipient in policy.allowed_recipients
            if (user_id is None and group_id is None) or not allowed:
                raise NotificationRefused(
                    "recipient_not_allowed", f"{payload.recipient} may not be notified by run {payload.run_id} (SEC-1)"
                )
            number = delivery.num_delivered if delivery is not None else 1
            if user_id is not None:
                profile = self._directory.get(user_id)
                if profile is None:
                    raise NotificationRefused("unknown_recipient", f"{payload.recipient} is not in the user directory")
                sent_key = ref_key("notify", payload.notification_id)
                failed = await self._send(event, payload, sent_key, profile, payload.recipient, number)
                if failed is not None:
                    detail = _detail(failed)
                    raise NotificationUndelivered(
                        f"notification {payload.notification_id} could not be sent: {detail}",
                        [payload.recipient],
                        failed,
                    )
                return
            assert group_id is not None
            group = self._directory.group(group_id)
            if group is None:
                raise NotificationRefused(
                    "unknown_recipient", f"{payload.recipient} is not a group of the user directory"
                )
            unreached: list[str] = []
            attempts: list[DeliveryAttempt] = []
            for member in group.members:
                member_profile = self._directory.get(member)
                if member_profile is None:
                    log.warning("notification.member_unknown", member=member)
                    continue
                key = ref_key("notify", payload.notification_id, member)
                person = f"user:{member}"
                if (failed := await self._send(event, payload, key, member_profile, person, number)) is not None:
                    unreached.append(person)
                    attempts += failed
            if unreached:
                raise NotificationUndelivered(
                    f"notification {payload.notification_id} did not reach {_detail(attempts)}", unreached, attempts
                )

    async def _send(
        self,
        event: Envelope,
        payload: HumanNotifyRequested,
        sent_key: str,
        profile: UserProfile,
        person: str,
        number: int,
    ) -> list[DeliveryAttempt] | None:
        """Tell one person (once: ``sent_key`` is claimed right after the send, with its event); None when told
        (now or before), else every channel that failed, in order (``error`` starting ``user:<id>:`` for a
        group's member)."""
        if (done := await self._refs.get_ref(sent_key)) is not None:
            if done.event is not None:  # a crash after the claim may have kept it from the journal: again, same id
                await self._bus.publish(decode(done.event.encode()))
            log.info("notification.already_sent", channel=done.value, key=sent_key)
            return None
        member = payload.recipient != person
        text = notification_text(payload)
        failures: list[DeliveryAttempt] = []
        order = profile.channel_order()
        for name in order:
            adapter = self._adapters.get(name)
            if adapter is None:
                failures.append(
                    _attempt(name, f"no {name} adapter runs in this deployment", person if member else None)
                )
                continue
            try:
                await adapter.notify(profile, text, key=sent_key)
            except ChannelError as exc:
                failures.append(_attempt(name, str(exc), person if member else None))
                continue
            _, redacted, truncated = adapter.egress.message_shown(name, text)
            told = notification_delivered_event(
                event,
                payload,
                person=person,
                channel=name,
                preferred=order[0],
                failed=failures,
                delivery=number,
                redacted=redacted,
                truncated=truncated,
            )
            # claimed first: a crash before the publish loses no event (the redelivery publishes the marker's)
            await self._refs.claim(sent_key, name, event=encode(told).decode())
            await self._bus.publish(told)
            log.info("notification.sent", channel=name, person=person, failed=len(failures), delivery=number)
            return None
        return failures  # every channel of the profile (it names one at least) failed

    async def on_dead_letter(self, message: Envelope | bytes, delivery: Delivery, error: BaseException) -> None:
        """The consumer gives a notification up (refused, every delivery spent, or a delivery past the limit that
        never ran the handler): ``human.notification_failed`` says why and who was not told. A message whose
        data names no notification has nobody to tell: only dead-lettered. A failing publish raises: the
        runner gives the message up again later, so the event is published at least once (one id)."""
        if not isinstance(message, Envelope) or message.type != HumanNotifyRequested.EVENT_TYPE:
            return
        try:
            payload = message.payload(HumanNotifyRequested)
        except ProtocolError:
            return
        if isinstance(error, NotificationRefused):
            reason: _FailReason = error.reason
            unreached, attempts = [payload.recipient], []
        elif isinstance(error, NotificationUndelivered):
            reason, unreached, attempts = "no_channel", error.unreached, error.attempts
        else:
            reason, unreached, attempts = "failed", [], []
        detail = str(error) if isinstance(error, (NotificationRefused, NotificationUndelivered)) else repr(error)
        failed = notification_failed_event(
            message,
            payload,
            reason=reason,
            detail=detail,
            unreached=unreached,
            failed=attempts,
            deliveries=delivery.num_delivered,
        )
        await self._bus.publish(failed)
        log.warning("notification.failed", notification_id=payload.notification_id, reason=reason, detail=detail)


_FailReason = Literal["recipient_not_allowed", "unknown_recipient", "no_channel", "failed"]


def _attempt(channel: str, error: str, person: str | None) -> DeliveryAttempt:
    return DeliveryAttempt(channel=channel, error=(f"{person}: {error}" if person else error)[:MAX_TEXT])


def _detail(attempts: list[DeliveryAttempt]) -> str:
    return "; ".join(f"{a.channel}: {a.error}" for a in attempts) or "no channel"
