"""The HTTP surface: ``POST /hooks/{trigger_id}`` (``/healthz`` and ``/readyz`` come from the service runtime).

Checks run in this order, each answered as ``{"error": code, "detail": sentence}``:
unknown trigger 404 → credentials 401 → size 413 → UTF-8 JSON 400 → adapter shape 422 →
disabled / unhandled event type 200 ``ignored`` → accepted 202 / duplicate 200, or 503 when
NATS is unavailable. Never 410 (Azure DevOps disables a subscription on it).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from temporality_bus import Bus
from temporality_service import ErrorBody, install_error_handlers, parse_json, read_body
from temporality_trigger_gateway.errors import (
    BodyTooLarge,
    InvalidPayload,
    MalformedBody,
    Unauthorized,
    UnknownTrigger,
)
from temporality_trigger_gateway.intake import Accepted, Intake
from temporality_trigger_gateway.settings import Settings
from temporality_trigger_gateway.triggers import BasicAuth, TriggerConfig, WebhookTrigger

__all__ = ["create_app"]

log = structlog.get_logger(__name__)


def create_app(settings: Settings, bus: Bus, triggers: Iterable[TriggerConfig]) -> FastAPI:
    """The gateway app over an already-connected ``bus``; serves the ``webhook`` triggers among ``triggers``."""
    webhooks = _served(triggers)
    intake = Intake(bus, retry_after_s=settings.retry_after_s)
    app = FastAPI(
        title="Temporality trigger-gateway",
        docs_url=None,
        redoc_url=None,
        responses={code: {"model": ErrorBody} for code in (400, 401, 404, 413, 422, 503)},
    )
    install_error_handlers(app)

    @app.post("/hooks/{trigger_id}", status_code=202)
    async def hook(trigger_id: str, request: Request) -> JSONResponse:
        with structlog.contextvars.bound_contextvars(trigger_id=trigger_id[:100]):
            trigger = webhooks.get(trigger_id)
            if trigger is None:
                raise UnknownTrigger(f"no webhook trigger with id {trigger_id[:100]!r}")
            _authenticate(trigger, request.headers.get("authorization"))
            raw = b""
            try:
                raw = await read_body(request, settings.max_body_bytes)
                outcome = await intake.handle(trigger, parse_json(raw), body_bytes=len(raw))
            except (BodyTooLarge, MalformedBody, InvalidPayload) as refused:
                await intake.refused(trigger, refused, body_bytes=len(raw))  # visible in the journal
                raise
            return JSONResponse(outcome.model_dump(), status_code=202 if isinstance(outcome, Accepted) else 200)

    return app


def _served(triggers: Iterable[TriggerConfig]) -> dict[str, WebhookTrigger]:
    webhooks: dict[str, WebhookTrigger] = {}
    for trigger in triggers:
        if not isinstance(trigger, WebhookTrigger):
            log.warning("trigger.not_served", trigger_id=trigger.id, type=trigger.type, reason="not served yet")
            continue
        webhooks[trigger.id] = trigger
        auth = trigger.auth
        if not isinstance(auth, BasicAuth):
            log.warning("trigger.unauthenticated", trigger_id=trigger.id)
        elif auth.password is not None:
            log.warning("trigger.literal_password", trigger_id=trigger.id, hint="use auth.password_env")
        log.info("trigger.served", trigger_id=trigger.id, adapter=trigger.adapter, enabled=trigger.enabled)
    return webhooks


def _authenticate(trigger: WebhookTrigger, header: str | None) -> None:
    """HTTP Basic, compared in constant time. Nothing that was sent is logged or echoed."""
    auth = trigger.auth
    if not isinstance(auth, BasicAuth):
        return  # explicitly configured `auth: {type: none}`
    if not header:
        raise Unauthorized("this trigger requires HTTP Basic credentials")
    scheme, _, value = header.partition(" ")
    try:
        if scheme.lower() != "basic":
            raise ValueError("not basic")
        username, sep, password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
    except (ValueError, binascii.Error):  # UnicodeDecodeError is a ValueError
        raise Unauthorized("the Authorization header is not valid HTTP Basic") from None
    if not sep or not auth.matches(username, password):
        raise Unauthorized("wrong user name or password")
