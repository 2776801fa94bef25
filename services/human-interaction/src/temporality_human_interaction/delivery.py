"""Delivering one send of a question to one person along their profile (HUM-2), for every caller.

The request handler (the question), and the timeout policy's chain (a reminder, an escalation, HUM-8)
send through :func:`deliver_along`: the profile's channels in order (preferred first, then the
fallback order) until one carries it; a channel whose adapter does not run here, is down, has no
identity for the person or refuses is skipped for the next and reported as a :class:`DeliveryAttempt`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import structlog

from temporality_bus import TransientError
from temporality_human_interaction.channels import ChannelAdapter, ChannelError, DeliveryReceipt
from temporality_human_interaction.directory import UserProfile
from temporality_human_interaction.records import HumanRequestRecord
from temporality_protocol.events import MAX_TEXT, DeliveryAttempt

__all__ = ["deliver_along", "deliver_with_record"]

log = structlog.get_logger(__name__)


async def deliver_along(
    adapters: Mapping[str, ChannelAdapter],
    record: HumanRequestRecord,
    profile: UserProfile,
    *,
    banner: str | None = None,
    tag: str = "",
) -> tuple[DeliveryReceipt, list[DeliveryAttempt]]:
    """The receipt of the first channel that carried the send, and every channel that could not before it.

    All failing is a :class:`TransientError` (the request consumer retries it; the chain reports it)."""
    failures: list[DeliveryAttempt] = []
    for name, adapter in _with_adapters(adapters, profile, failures):
        try:
            receipt = await adapter.deliver(record, profile, banner=banner, tag=tag)
        except ChannelError as exc:
            failures.append(DeliveryAttempt(channel=name, error=str(exc)[:MAX_TEXT]))
            log.warning("delivery.failed", channel=name, error=str(exc), send=tag or "question")
            continue
        log.info(
            "delivery.done",
            channel=receipt.channel,
            reference=receipt.reference,
            failed=len(failures),
            send=tag or "question",
        )
        return receipt, failures
    detail = "; ".join(f"{f.channel}: {f.error}" for f in failures) or "no channel"
    raise TransientError(f"request {record.request_id} could not be delivered: {detail}")


def _with_adapters(
    adapters: Mapping[str, ChannelAdapter], profile: UserProfile, failures: list[DeliveryAttempt]
) -> Iterator[tuple[str, ChannelAdapter]]:
    """The profile's channels in its order that have an adapter here; each one without is added to ``failures``."""
    for name in profile.channel_order():
        adapter = adapters.get(name)
        if adapter is None:
            failures.append(DeliveryAttempt(channel=name, error=f"no {name} adapter runs in this deployment"))
            continue
        yield name, adapter


async def deliver_with_record(
    adapters: Mapping[str, ChannelAdapter], record: HumanRequestRecord, profile: UserProfile
) -> tuple[DeliveryReceipt, list[DeliveryAttempt]] | None:
    """The question's delivery as :func:`deliver_along` would make it, when it can be made before the record is
    stored: the first channel of the profile's order that has an adapter here delivers by the stored record itself
    (the web inbox, :attr:`~.channels.ChannelAdapter.delivered_by_store`: nothing is sent) -- the channels before it
    have no adapter in this deployment (reported as :func:`deliver_along` reports them). None otherwise (a channel
    that sends comes first, or the web inbox cannot take it): the question is delivered once the record is stored.
    """
    failures: list[DeliveryAttempt] = []
    for _, adapter in _with_adapters(adapters, profile, failures):
        if not adapter.delivers_with_record(profile):
            return None
        try:  # not counted here: the intake counts it once the record that carries it is created
            receipt = await adapter.deliver(record, profile, counted=False)
        except ChannelError:  # the usual path tries it again once the record is stored, counts and reports it
            return None
        log.info("delivery.with_record", channel=receipt.channel, failed=len(failures))
        return receipt, failures
    return None
