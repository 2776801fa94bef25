"""Deadlines firing: a pending request expires and its timeout policy is announced (HUM-8).

Run by :class:`temporality_bus.Consumer` on ``CONSUMERS["human-interaction-deadlines"]`` as a raw
handler: the message is the timer payload ``{"request_id": ...}`` that the JetStream message
schedule published at the deadline. A request that is no longer pending (answered, cancelled) is
left alone. The CAS to ``expired`` comes first; ``human.expired`` is published after it and
``expiry_published`` records that, so a crash in between is repaired by the redelivery.
"""

from __future__ import annotations

from typing import Annotated

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temporality_bus import Bus, Conflict, Delivery, PermanentError, TransientError
from temporality_human_interaction.events import expired_event
from temporality_human_interaction.records import HumanRequestRecord, RequestStore, open_store
from temporality_protocol import HumanRequestState

__all__ = ["DeadlineHandler", "DeadlinePayload"]

log = structlog.get_logger(__name__)

_CAS_ATTEMPTS = 8


class DeadlinePayload(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    request_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")]


class DeadlineHandler:
    """The deadline handler; :meth:`handle` is the consumer's raw handler."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus

    async def handle(self, data: bytes, delivery: Delivery | None = None) -> None:
        try:
            payload = DeadlinePayload.model_validate_json(data)
        except ValidationError as exc:
            raise PermanentError(f"unreadable deadline payload: {exc}") from exc
        with structlog.contextvars.bound_contextvars(request_id=payload.request_id):
            store = await open_store(self._bus)
            record = await self._expire(store, payload.request_id)
            if record.status is not HumanRequestState.EXPIRED:
                log.info("deadline.ignored", status=record.status.value)
                return
            if record.expiry_published:
                log.info("deadline.already_announced")
                return
            await self._bus.publish(expired_event(record, now=record.expires_at))
            await self._mark_published(store, payload.request_id)
            log.info("request.expired", action=record.policy.on_timeout.action, run_id=record.run_id)

    async def _expire(self, store: RequestStore, key: str) -> HumanRequestRecord:
        """Move a pending request to ``expired``; return the record as it now stands."""
        for _ in range(_CAS_ATTEMPTS):
            got = await store.get(key)
            if got is None:
                raise PermanentError(f"a deadline fired for {key}, which is not a known request")
            if not got.value.pending:
                return got.value
            expired = got.value.moved_to(HumanRequestState.EXPIRED)
            try:
                await store.update(key, expired, got.revision)
            except Conflict:  # an answer or another replica moved it: look again
                continue
            return expired
        raise TransientError(f"request {key}: too many concurrent updates while expiring")

    async def _mark_published(self, store: RequestStore, key: str) -> None:
        for _ in range(_CAS_ATTEMPTS):
            got = await store.get(key)
            if got is None or got.value.expiry_published:
                return
            try:
                await store.update(key, got.value.model_copy(update={"expiry_published": True}), got.revision)
            except Conflict:
                continue
            return
        raise TransientError(f"request {key}: too many concurrent updates while marking the expiry published")
