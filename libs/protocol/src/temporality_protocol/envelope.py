"""The CloudEvents 1.0 envelope with Temporality's extension attributes (DC-2).

Wire form: structured-mode JSON (``application/cloudevents+json``), written and read through the
official ``cloudevents`` SDK. Extension attributes (lower-case alphanumerics, as CloudEvents
requires):

==================  =====================================================================
``runid``           the run the event belongs to, when it belongs to one
``correlationid``   the saga: the root run (or delivery) everything here descends from
``causationid``     the id of the event that caused this one
``actor``           who caused it (``user:alice``, ``service:trigger-gateway``, ``agent:reviewer``)
``tenant``          tenant / project scope
``protocolversion`` the Temporality protocol version the writer spoke (mandatory, AP-10)
==================  =====================================================================
"""

from __future__ import annotations

import builtins
from datetime import UTC, datetime
from typing import Any, TypeVar, overload

from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temporality_protocol.catalog import subject_for
from temporality_protocol.errors import InvalidEnvelope, UnknownEventType
from temporality_protocol.events import EVENT_MODELS, EventData
from temporality_protocol.ids import new_id
from temporality_protocol.version import PROTOCOL_VERSION

__all__ = ["CONTENT_TYPE", "Envelope", "decode", "encode", "make_event"]

CONTENT_TYPE = JSONFormat.CONTENT_TYPE
_FORMAT = JSONFormat()
D = TypeVar("D", bound=EventData)


class Envelope(BaseModel):
    """A CloudEvent of ours. ``data`` stays a dict here; :meth:`payload` validates it into its model."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str = Field(min_length=1)
    source: str = Field(min_length=1)
    type: str = Field(min_length=1)
    specversion: str = "1.0"
    time: datetime
    subject: str | None = None
    datacontenttype: str = "application/json"
    data: dict[str, Any]
    runid: str | None = None
    correlationid: str | None = None
    causationid: str | None = None
    actor: str | None = None
    tenant: str | None = None
    protocolversion: str = PROTOCOL_VERSION

    @property
    def nats_subject(self) -> str:
        return subject_for(self.type)

    @overload
    def payload(self) -> EventData: ...
    @overload
    def payload(self, model: builtins.type[D]) -> D: ...
    def payload(self, model: builtins.type[EventData] | None = None) -> EventData:
        """The validated ``data``; with no model, the one the catalogue registers for ``type``."""
        target = model or EVENT_MODELS.get(self.type)
        if target is None:
            raise UnknownEventType(self.type)
        if target.EVENT_TYPE != self.type:
            raise InvalidEnvelope(f"event {self.id} is {self.type}, not {target.EVENT_TYPE}")
        try:
            return target.model_validate(self.data)
        except ValidationError as exc:
            raise InvalidEnvelope(f"event {self.id} ({self.type}) has invalid data: {exc}") from exc


def make_event(
    data: EventData,
    *,
    source: str,
    id: str | None = None,
    run_id: str | None = None,
    correlation_id: str | None = None,
    causation_id: str | None = None,
    actor: str | None = None,
    tenant: str | None = None,
    subject: str | None = None,
    time: datetime | None = None,
) -> Envelope:
    """Wrap ``data`` in an envelope. Pass a deterministic ``id`` whenever the fact is deterministic."""
    return Envelope(
        id=id or new_id("evt"),
        source=source,
        type=data.EVENT_TYPE,
        time=time or datetime.now(UTC),
        subject=subject,
        data=data.model_dump(mode="json"),
        runid=run_id,
        correlationid=correlation_id or run_id,
        causationid=causation_id,
        actor=actor,
        tenant=tenant,
    )


_CORE = ("id", "source", "type", "specversion", "time", "subject", "datacontenttype")
_EXT = ("runid", "correlationid", "causationid", "actor", "tenant", "protocolversion")


def encode(event: Envelope) -> bytes:
    """Structured-mode JSON through the cloudevents SDK."""
    attributes: dict[str, Any] = {k: getattr(event, k) for k in _CORE + _EXT}
    attributes = {k: v for k, v in attributes.items() if v is not None}
    try:
        return _FORMAT.write(CloudEvent(attributes, event.data))
    except BaseCloudEventException as exc:  # pragma: no cover - our model already validated
        raise InvalidEnvelope(str(exc)) from exc


def decode(raw: bytes) -> Envelope:
    """Bytes -> Envelope, or :class:`InvalidEnvelope` saying what is wrong."""
    try:
        ce = _FORMAT.read(None, raw)
    except (ValueError, BaseCloudEventException, KeyError, TypeError) as exc:
        raise InvalidEnvelope(f"not a CloudEvent: {exc}") from exc
    attributes = dict(ce.get_attributes())
    if attributes.get("specversion") != "1.0":
        raise InvalidEnvelope(f"specversion must be 1.0, got {attributes.get('specversion')!r}")
    data = ce.get_data()
    if not isinstance(data, dict):
        raise InvalidEnvelope("data must be a JSON object")
    if "protocolversion" not in attributes:
        raise InvalidEnvelope("protocolversion extension attribute is mandatory")
    try:
        return Envelope.model_validate({**attributes, "data": data})
    except ValidationError as exc:
        raise InvalidEnvelope(str(exc)) from exc
