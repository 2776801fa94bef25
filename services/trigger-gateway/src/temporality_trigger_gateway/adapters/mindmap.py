"""The ``mindmap.test_case`` source (TRG-3): a mind-map test-design tool sends a test case to automate.

No public sample exists (``/work/shared/fixtures/webhooks`` has none), so this is Temporality's own
contract, documented in ``docs/triggers.md``: a JSON body ::

    {"id": "evt-…",                       # the sender's event id (the same on every retry)
     "event": "test_case.created",        # or test_case.updated
     "timestamp": "2026-01-02T03:04:05Z",
     "map": {"id": "m-1", "title": "Checkout", "url": "https://…"},
     "test_case": {"id": "TC-17", "title": "…", "path": ["Checkout", "Payment"], "preconditions": "…",
                   "steps": ["…", "…"], "expected": "…", "priority": "high", "tags": ["…"]},
     "author": {"id": "u-1", "name": "Alice"}}

authenticated by the ``mindmap`` verifier (an HMAC-SHA256 signature over the raw body *and* a per-trigger
token, :class:`temporality_trigger_gateway.auth.MindmapAuth`). The trigger's ``prompt`` template
(``${title}``-style placeholders over the agent input) states the task; the agent receives the test case.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temporality_protocol import Actor, NormalizedEvent
from temporality_trigger_gateway.adapters.base import (
    MAX_DESCRIPTION,
    Adapter,
    SourceEvent,
    WebhookRequest,
    aware,
    clip,
    invalid_payload,
    web_link,
)

__all__ = ["MindmapTestCase"]

_Id = Annotated[str, Field(min_length=1, max_length=200)]
_Text = Annotated[str, Field(max_length=MAX_DESCRIPTION)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Map(_Model):
    id: _Id
    title: Annotated[str, Field(max_length=500)] = ""
    url: str | None = None


class _TestCase(_Model):
    id: _Id
    title: Annotated[str, Field(min_length=1, max_length=500)]
    path: list[Annotated[str, Field(max_length=500)]] = Field(default_factory=list, max_length=50)
    preconditions: _Text = ""
    steps: list[_Text] = Field(default_factory=list, max_length=200)
    expected: _Text = ""
    priority: Annotated[str, Field(max_length=50)] | None = None
    tags: list[Annotated[str, Field(max_length=100)]] = Field(default_factory=list, max_length=50)


class _Author(_Model):
    id: _Id
    name: Annotated[str, Field(max_length=200)] | None = None


class _Envelope(_Model):
    id: _Id
    event: _Id


class _Event(_Envelope):
    timestamp: datetime
    map: _Map
    test_case: _TestCase
    author: _Author | None = None


class MindmapTestCase(Adapter):
    name: ClassVar[str] = "mindmap.test_case"
    event_types: ClassVar[frozenset[str] | None] = frozenset({"test_case.created", "test_case.updated"})
    auth_types: ClassVar[frozenset[str]] = frozenset({"mindmap"})
    id_in_body: ClassVar[bool] = True  # signed with the body by a verifier that signs it

    def identify(self, request: WebhookRequest) -> SourceEvent:
        try:
            envelope = _Envelope.model_validate(request.json)
        except ValidationError as exc:
            raise invalid_payload(self.name, exc) from exc
        return SourceEvent(id=envelope.id, type=envelope.event)

    def normalize(self, request: WebhookRequest, *, tenant: str | None) -> NormalizedEvent:
        try:
            event = _Event.model_validate(request.json)
        except ValidationError as exc:
            raise invalid_payload(self.name, exc) from exc
        case = event.test_case
        payload: dict[str, Any] = {
            "map": event.map.model_dump(),
            "test_case": {
                **case.model_dump(),
                "preconditions": clip(case.preconditions, MAX_DESCRIPTION),
                "expected": clip(case.expected, MAX_DESCRIPTION),
            },
        }
        return NormalizedEvent(
            id=event.id,
            type=f"mindmap.{event.event}",
            source=event.map.url or f"mindmap:{event.map.id}",
            timestamp=aware(event.timestamp) or event.timestamp,
            actor=Actor(id=event.author.id, display_name=event.author.name) if event.author else None,
            tenant=tenant,
            payload=payload,
            metadata={"event_type": event.event, "map_id": event.map.id, "test_case_id": case.id},
            source_link=web_link(event.map.url, label=f"Test case {case.id} in {event.map.title or event.map.id}"),
        )

    def run_title(self, event: NormalizedEvent) -> str:
        case = event.payload["test_case"]
        return f"Test case {case['id']}: {case['title']}"[:200]
