"""What every webhook source does: identify a delivery, then validate and normalize it (TRG-3, TRG-4).

A source (adapter) is a configuration of the ``webhook`` trigger type, never a type of its own, and one
module of this package. It receives the :class:`WebhookRequest` (method, headers, raw body, parsed JSON)
after the trigger's verifier (:mod:`temporality_trigger_gateway.auth`) accepted it, and produces the one
:class:`~temporality_protocol.NormalizedEvent`. It is stateless; the registry in
:mod:`temporality_trigger_gateway.adapters` holds one instance per name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temporality_protocol import NormalizedEvent, SourceLink
from temporality_service import parse_json
from temporality_service.wording import listed, message
from temporality_trigger_gateway.errors import InvalidPayload

__all__ = [
    "MAX_DESCRIPTION",
    "UNPARSED",
    "Adapter",
    "SourceEvent",
    "WebhookRequest",
    "aware",
    "clip",
    "invalid_payload",
    "missing_header",
    "web_link",
]


#: ``WebhookRequest.parsed`` of a body not parsed yet.
UNPARSED: Any = object()


@dataclass(frozen=True)
class WebhookRequest:
    """One authenticated delivery as a source sees it. ``headers`` is case-insensitive.

    ``json`` is the body parsed by :func:`temporality_service.parse_json` (:class:`MalformedJson`, a 400,
    for a body that is not UTF-8 JSON), parsed on first use unless given (``parsed``): a source that
    validates the raw body itself in one pass (:mod:`.azure_devops`) never builds it. ``memo`` keeps what
    a source worked out from this delivery (:meth:`Adapter.identify`'s validated model for its
    :meth:`Adapter.normalize`)."""

    method: str
    headers: Mapping[str, str]
    body: bytes
    parsed: Any = UNPARSED
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def json(self) -> Any:
        parsed = self.parsed
        if parsed is UNPARSED:
            parsed = parse_json(self.body)
            object.__setattr__(self, "parsed", parsed)
        return parsed


class SourceEvent(BaseModel):
    """The two facts read before anything else: the sender's own event id and event type."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1)
    type: str = Field(min_length=1)


class Adapter(ABC):
    #: The ``adapter:`` value in a trigger (``azure_devops.pull_request``).
    name: ClassVar[str]
    #: The source event types this adapter can normalize; a trigger's ``events`` must be a subset.
    #: ``None``: any type the sender names (the generic JSON source).
    event_types: ClassVar[frozenset[str] | None]
    #: The ``auth.type`` values that can authenticate this source (``none`` is always allowed, explicitly).
    auth_types: ClassVar[frozenset[str]]
    #: ``True``: the source reads the raw body itself before anything else (the API hands it on unparsed,
    #: :attr:`WebhookRequest.json` parses it on first use); ``False``: the API parses it first, so a body
    #: that is not JSON is a 400 before any check of the source's (a missing header's 422).
    reads_raw_body: ClassVar[bool] = False
    #: ``True``: the event id is read from the body alone (never a header), so a verifier that signs the body
    #: signs the id too. ``False`` (the default): a header can give or override it -- with a verifier that signs
    #: the body only (:attr:`.auth.Verifier.signs_body_only`) a captured delivery re-sent under another id would
    #: verify as a new event, so such a trigger also dedupes on the body's SHA-256 (:func:`temporality_trigger_gateway.intake.replay_guarded`).
    id_in_body: ClassVar[bool] = False
    #: The headers that carry the sender's delivery (event) id, any one of them (the first: what a sender of
    #: this source always sends); empty when the id is in the body. The preview fills in the first when a
    #: sample has none of them.
    delivery_id_headers: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def identify(self, request: WebhookRequest) -> SourceEvent:
        """The event's id and type, or :class:`InvalidPayload` when the body is not this source's envelope."""

    @abstractmethod
    def normalize(self, request: WebhookRequest, *, tenant: str | None) -> NormalizedEvent:
        """Validate the full shape and map it to the source-independent event (TRG-4, TRG-8)."""

    @abstractmethod
    def run_title(self, event: NormalizedEvent) -> str:
        """A short human title for the run this event starts (≤ 200 characters)."""

    def test_notification(self, request: WebhookRequest) -> str | None:
        """What the delivery is when it is the sender's own test notification (sample data, e.g. Azure DevOps'
        *Test* button): answered 200 ``ignored`` (``test_notification``) and never a run; ``None`` for a real
        event (every source but Azure DevOps'). Called after :meth:`identify` accepted the delivery."""
        return None


def invalid_payload(adapter: str, exc: ValidationError) -> InvalidPayload:
    """422 naming every problem's place (``a, b, c, d, e and 3 more``), each in JSON's words
    (:func:`.wording.message`: "must be a JSON object, not an array", never a class of ours); ``errors``
    without the input (never echo a payload back)."""
    found = exc.errors(include_url=False, include_context=False)
    errors: list[dict[str, Any]] = [{"type": e["type"], "loc": e["loc"], "msg": message(e)} for e in found]
    if len(found) == 1 and not found[0]["loc"]:  # the body as a whole: say what it must be
        return InvalidPayload(f"the body is not a valid {adapter} event: the body {errors[0]['msg']}", errors)
    places = [".".join(str(p) for p in e["loc"]) or "<body>" for e in found]
    count = f"{len(found)} problem" + ("s" if len(found) != 1 else "")
    return InvalidPayload(f"the body is not a valid {adapter} event ({count}: {listed(places)})", errors)


def missing_header(adapter: str, header: str) -> InvalidPayload:
    return InvalidPayload(
        f"the delivery is not a valid {adapter} event: the {header} header is missing",
        [{"loc": ["header", header], "msg": "Field required", "type": "missing"}],
    )


#: A description longer than this is cut (with a marker): an agent needs the gist, and every run
#: carries its input in its KV record and checkpoint, which NATS bounds by max_payload.
MAX_DESCRIPTION = 32 * 1024


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... cut by Temporality: {len(text) - limit} more characters]"


def aware(value: datetime | None) -> datetime | None:
    """A timestamp without a zone is UTC (sources send both)."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def web_link(*hrefs: str | None, label: str | None = None) -> SourceLink | None:
    """The first of ``hrefs`` that is an absolute http(s) URL as the event's source link (HUM-5), else
    ``None``: a source whose link is missing or not a web URL still starts its run, without a link."""
    for href in hrefs:
        if href:
            try:  # SourceLink's validator is the check (is_web_url): made once, not before and again in it
                return SourceLink(href=href, label=label[:200] if label else None)
            except ValidationError:
                continue
    return None
