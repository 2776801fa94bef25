"""What every webhook adapter does: identify a delivery, then validate and normalize it (TRG-3, TRG-4).

An adapter is a configuration of the ``webhook`` trigger type, never a type of its own. It is
stateless; the registry in :mod:`temporality_trigger_gateway.adapters` holds one instance per name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temporality_protocol import NormalizedEvent
from temporality_trigger_gateway.errors import InvalidPayload

__all__ = ["Adapter", "SourceEvent", "invalid_payload"]


class SourceEvent(BaseModel):
    """The two facts read before anything else: the sender's own event id and event type."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1)
    type: str = Field(min_length=1)


class Adapter(ABC):
    #: The ``adapter:`` value in a trigger (``azure_devops.pull_request``).
    name: ClassVar[str]
    #: The source event types this adapter can normalize; a trigger's ``events`` must be a subset.
    event_types: ClassVar[frozenset[str]]

    @abstractmethod
    def identify(self, body: Any) -> SourceEvent:
        """The event's id and type, or :class:`InvalidPayload` when the body is not this source's envelope."""

    @abstractmethod
    def normalize(self, body: Any, *, tenant: str | None) -> NormalizedEvent:
        """Validate the full shape and map it to the source-independent event (TRG-4, TRG-8)."""

    @abstractmethod
    def run_title(self, event: NormalizedEvent) -> str:
        """A short human title for the run this event starts (≤ 200 characters)."""


def invalid_payload(adapter: str, exc: ValidationError) -> InvalidPayload:
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    fields = ", ".join(".".join(str(p) for p in e["loc"]) or "<body>" for e in errors[:5])
    return InvalidPayload(
        f"the body is not a valid {adapter} event ({exc.error_count()} problem(s): {fields})",
        [dict(e) for e in errors],
    )
