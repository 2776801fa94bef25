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
3. Once sent, ``notify.<notification id>`` is claimed in the ``human-channels`` bucket, so a
   redelivered event is not sent again (a crash between the send and the claim can send it twice).

A ``group:<id>`` recipient (itself in ``allowed_recipients``) tells every member of the group, each on
their own channels; each member sent to is claimed as ``notify.<notification id>.<user id>``, so a
redelivery (after one member's channels all failed: transient) sends only to the members not told yet.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from temporality_bus import Bus, Delivery, PermanentError, TransientError
from temporality_human_interaction.channels import ChannelAdapter, ChannelError
from temporality_human_interaction.channels.refs import ChannelRefs, ref_key
from temporality_human_interaction.directory import Directory, UserProfile, group_id_of, user_id_of
from temporality_human_interaction.policies import PolicyPending, PolicyUnknown, RunPolicies
from temporality_protocol import Envelope
from temporality_protocol.catalog import CONSUMERS
from temporality_protocol.events import MAX_TEXT, HumanNotifyRequested

__all__ = ["NotificationHandler", "notification_text"]

log = structlog.get_logger(__name__)

#: The notification consumer's last delivery: a policy still being projected then is a refusal (dead letter).
_LAST_DELIVERY = CONSUMERS["human-interaction-notifications"].max_deliver


def notification_text(payload: HumanNotifyRequested) -> str:
    return f"📣 {payload.title}\n\n{payload.message}"[:MAX_TEXT]


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
            if self._policies is not None:
                try:
                    policy = await self._policies.get(payload.run_id, delivery)
                except PolicyUnknown as unknown:
                    raise PermanentError(str(unknown)) from None
                except PolicyPending as pending:  # a notification is not parked: retried up to the last delivery
                    if delivery is not None and delivery.num_delivered < _LAST_DELIVERY:
                        raise TransientError(str(pending)) from None
                    raise PermanentError(
                        f"{pending}; nobody may be notified yet, and this was the last delivery"
                    ) from None
            allowed = payload.recipient in policy.allowed_recipients
            if (user_id is None and group_id is None) or not allowed:
                raise PermanentError(f"{payload.recipient} may not be notified by run {payload.run_id} (SEC-1)")
            if user_id is not None:
                profile = self._directory.get(user_id)
                if profile is None:
                    raise PermanentError(f"{payload.recipient} is not in the user directory")
                error = await self._send(payload, ref_key("notify", payload.notification_id), profile)
                if error is not None:
                    raise TransientError(f"notification {payload.notification_id} could not be sent: {error}")
                return
            assert group_id is not None
            group = self._directory.group(group_id)
            if group is None:
                raise PermanentError(f"{payload.recipient} is not a group of the user directory")
            errors: list[str] = []
            for member in group.members:
                member_profile = self._directory.get(member)
                if member_profile is None:
                    log.warning("notification.member_unknown", member=member)
                    continue
                key = ref_key("notify", payload.notification_id, member)
                if (error := await self._send(payload, key, member_profile)) is not None:
                    errors.append(f"{member}: {error}")
            if errors:
                raise TransientError(f"notification {payload.notification_id} did not reach {'; '.join(errors)}")

    async def _send(self, payload: HumanNotifyRequested, sent_key: str, profile: UserProfile) -> str | None:
        """Tell one person (once: ``sent_key`` is claimed after the send); why every channel failed, or None."""
        if (done := await self._refs.get(sent_key)) is not None:
            log.info("notification.already_sent", channel=done, key=sent_key)
            return None
        failures: list[str] = []
        for name in profile.channel_order():
            adapter = self._adapters.get(name)
            if adapter is None:
                failures.append(f"{name}: no adapter runs here")
                continue
            try:
                await adapter.notify(profile, notification_text(payload))
            except ChannelError as exc:
                failures.append(f"{name}: {exc}")
                continue
            await self._refs.claim(sent_key, name)
            log.info("notification.sent", channel=name, recipient=payload.recipient, failed=failures)
            return None
        return "; ".join(failures) or "no channel"
