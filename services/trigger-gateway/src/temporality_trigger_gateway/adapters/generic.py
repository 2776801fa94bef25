"""The ``generic`` source: any sender that posts a JSON object with its own event ``type``.

For senders that have no adapter of their own, signed with Standard Webhooks (``auth.type:
standard_webhooks``, e.g. Svix-based senders) or a bearer token, an HMAC header or a shared-secret
header. The event id is ``webhook-id`` (Standard Webhooks: the same on every retry; Svix's ``svix-id``), else the
``Idempotency-Key`` header, else the body's string ``id``; the event type is the body's ``type``,
which the trigger's ``events`` must list. The agent receives the body's ``data`` object when there is
one, else the whole body (TRG-8: what is passed on is the sender's own event, minus the envelope).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temporality_protocol import Actor, NormalizedEvent
from temporality_trigger_gateway.adapters.base import Adapter, SourceEvent, WebhookRequest, aware, invalid_payload
from temporality_trigger_gateway.auth import standard_webhooks_header
from temporality_trigger_gateway.errors import InvalidPayload

__all__ = ["Generic"]

_Text = Annotated[str, Field(min_length=1, max_length=200)]


class GenericEvent(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    type: _Text
    id: _Text | None = None
    source: str | None = None
    timestamp: datetime | None = None
    actor: _Text | None = None
    tenant: _Text | None = None
    data: dict[str, Any] | None = None


class Generic(Adapter):
    name: ClassVar[str] = "generic"
    event_types: ClassVar[frozenset[str] | None] = None  # the sender names its own types
    auth_types: ClassVar[frozenset[str]] = frozenset({"standard_webhooks", "bearer", "hmac_sha256", "header"})

    def _event(self, request: WebhookRequest) -> tuple[str, GenericEvent]:
        try:
            event = GenericEvent.model_validate(request.json)
        except ValidationError as exc:
            raise invalid_payload(self.name, exc) from exc
        event_id = standard_webhooks_header(request.headers, "id") or request.headers.get("idempotency-key") or event.id
        if not event_id:
            raise InvalidPayload(
                f"the body is not a valid {self.name} event (no event id: webhook-id, svix-id, Idempotency-Key or id)",
                [{"loc": ["id"], "msg": "Field required", "type": "missing"}],
            )
        return event_id[:200], event

    def identify(self, request: WebhookRequest) -> SourceEvent:
        event_id, event = self._event(request)
        return SourceEvent(id=event_id, type=event.type)

    def normalize(self, request: WebhookRequest, *, tenant: str | None) -> NormalizedEvent:
        event_id, event = self._event(request)
        body: dict[str, Any] = request.json
        payload = event.data if event.data is not None else {k: v for k, v in body.items() if k not in ("id", "type")}
        return NormalizedEvent(
            id=event_id,
            type=f"generic.{event.type}",
            source=event.source or "generic",
            timestamp=aware(event.timestamp) or datetime.now(UTC),
            actor=Actor(id=event.actor) if event.actor else None,
            tenant=tenant or event.tenant,
            payload=payload,
            metadata={"event_type": event.type, "event_id": event_id},
        )

    def run_title(self, event: NormalizedEvent) -> str:
        return f"{event.metadata['event_type']} {event.id}"[:200]
