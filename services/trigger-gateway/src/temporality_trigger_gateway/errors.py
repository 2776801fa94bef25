"""The gateway's exception tree; a refused delivery is a :class:`temporality_service.ApiError`.

    GatewayError
    └── TriggerConfigError       -- the triggers file is unreadable or invalid (the process refuses to start)

    temporality_service.ApiError -- one delivery is refused; answered as ``{"error": code, "detail": sentence}``
    ├── UnknownTrigger           -- 404 no webhook trigger has this id
    ├── TriggerNotServed         -- 503 a stored webhook trigger this replica cannot serve (its secret is not set)
    ├── Unauthorized             -- 401 missing or wrong credentials or signature (with ``WWW-Authenticate``)
    ├── BodyTooLarge             -- 413 Content-Length or the streamed body exceeds ``max_body_bytes``
    ├── UnsupportedMediaType     -- 415 a Content-Type that is not JSON (GitHub's form-encoded deliveries)
    ├── TooManyFailures          -- 429 the client address is past the limit of failed authentications (the
    │                               service library's class: :mod:`temporality_trigger_gateway.failures`)
    ├── MalformedBody            -- 400 not UTF-8 JSON (a UTF-8 BOM is fine), too deep, lone surrogates
    ├── InvalidPayload           -- 422 JSON, but not the shape the trigger's adapter expects
    ├── TriggerMappingFailed     -- 422 a valid event the trigger's own expression (input, when, concurrency
    │                               key) fails on: the delivery is kept, re-drivable once the trigger is fixed
    └── BusUnavailable           -- 503 NATS did not ack in time; the sender retries (``Retry-After``)

Nothing here answers 410: Azure DevOps disables a subscription that gets one.
"""

from __future__ import annotations

from typing import Any

from temporality_service import ApiError, BodyTooLarge, NotFound, Unavailable, Unprocessable
from temporality_service import MalformedJson as MalformedBody
from temporality_service import Unauthorized as _Unauthorized

__all__ = [
    "BodyTooLarge",
    "BusUnavailable",
    "GatewayError",
    "InvalidPayload",
    "MalformedBody",
    "TriggerConfigError",
    "TriggerMappingFailed",
    "TriggerNotServed",
    "Unauthorized",
    "UnknownTrigger",
    "UnsupportedMediaType",
]


class GatewayError(Exception):
    pass


class TriggerConfigError(GatewayError):
    """The triggers file cannot be used; the message names the file and every problem in it."""


class UnknownTrigger(NotFound):
    code = "unknown_trigger"


class Unauthorized(_Unauthorized):
    """The challenge names the trigger's scheme (``Basic``, ``Bearer``, ``Signature``)."""

    def __init__(self, detail: str, *, challenge: str = 'Basic realm="temporality"') -> None:
        super().__init__(detail, challenge=challenge)


class UnsupportedMediaType(ApiError):
    """The body is declared as something else than JSON; the detail says which types are accepted."""

    status = 415
    code = "unsupported_media_type"


class InvalidPayload(Unprocessable):
    """``errors`` is pydantic's error list without the offending input (never echo a payload back)."""

    code = "invalid_payload"

    def __init__(self, detail: str, errors: list[dict[str, Any]]) -> None:
        super().__init__(detail, extra={"errors": errors})
        self.errors = errors


class TriggerMappingFailed(Unprocessable):
    """The event is valid but an expression of the trigger itself cannot be applied to it: the trigger is at fault,
    not the payload. ``errors`` names the failing expression's place; ``delivery_id`` is the kept delivery."""

    code = "mapping_failed"

    def __init__(self, detail: str, errors: list[dict[str, Any]], *, delivery_id: str) -> None:
        super().__init__(detail, extra={"errors": errors, "delivery_id": delivery_id})
        self.errors = errors


class TriggerNotServed(Unavailable):
    """A stored webhook trigger this replica does not serve (a secret it reads from the environment is not set):
    the detail says so without the variable's name or the record's problem (the sender is not authenticated)."""

    code = "trigger_not_served"

    def __init__(self, detail: str, retry_after_s: int) -> None:
        super().__init__(detail, retry_after_s=retry_after_s)


class BusUnavailable(Unavailable):
    code = "bus_unavailable"

    def __init__(self, detail: str, retry_after_s: int) -> None:
        super().__init__(detail, retry_after_s=retry_after_s)
