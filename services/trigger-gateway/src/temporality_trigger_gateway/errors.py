"""The gateway's exception tree; an HTTP error knows its status and its wire ``error`` code.

    GatewayError
    ├── TriggerConfigError       -- the triggers file is unreadable or invalid (the process refuses to start)
    └── WebhookError             -- one delivery is refused; answered as ``{"error": code, "detail": sentence}``
        ├── UnknownTrigger       -- 404 no served webhook trigger has this id
        ├── Unauthorized         -- 401 missing or wrong credentials (with ``WWW-Authenticate``)
        ├── BodyTooLarge         -- 413 Content-Length or the streamed body exceeds ``max_body_bytes``
        ├── MalformedBody        -- 400 not UTF-8 JSON (a UTF-8 BOM is fine)
        ├── InvalidPayload       -- 422 JSON, but not the shape the trigger's adapter expects
        └── BusUnavailable       -- 503 NATS did not ack in time; the sender retries (``Retry-After``)

Nothing here answers 410: Azure DevOps disables a subscription that gets one.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "BodyTooLarge",
    "BusUnavailable",
    "GatewayError",
    "InvalidPayload",
    "MalformedBody",
    "TriggerConfigError",
    "Unauthorized",
    "UnknownTrigger",
    "WebhookError",
]


class GatewayError(Exception):
    pass


class TriggerConfigError(GatewayError):
    """The triggers file cannot be used; the message names the file and every problem in it."""


class WebhookError(GatewayError):
    status: ClassVar[int] = 400
    code: ClassVar[str] = "bad_request"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "detail": self.detail}

    def headers(self) -> dict[str, str]:
        return {}


class UnknownTrigger(WebhookError):
    status = 404
    code = "unknown_trigger"


class Unauthorized(WebhookError):
    status = 401
    code = "unauthorized"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Basic realm="temporality"'}


class BodyTooLarge(WebhookError):
    status = 413
    code = "body_too_large"


class MalformedBody(WebhookError):
    status = 400
    code = "malformed_json"


class InvalidPayload(WebhookError):
    """``errors`` is pydantic's error list without the offending input (never echo a payload back)."""

    status = 422
    code = "invalid_payload"

    def __init__(self, detail: str, errors: list[dict[str, Any]]) -> None:
        super().__init__(detail)
        self.errors = errors

    def body(self) -> dict[str, Any]:
        return {**super().body(), "errors": self.errors}


class BusUnavailable(WebhookError):
    status = 503
    code = "bus_unavailable"

    def __init__(self, detail: str, retry_after_s: int) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}
