"""The HTTP surface: ``POST /hooks/{trigger_id}`` and ``GET /healthz``.

Checks run in this order, each answered as ``{"error": code, "detail": sentence}``:
unknown trigger 404 → credentials 401 → size 413 → UTF-8 JSON 400 → adapter shape 422 →
disabled / unhandled event type 200 ``ignored`` → accepted 202 / duplicate 200, or 503 when
NATS is unavailable. Never 410 (Azure DevOps disables a subscription on it).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from temporality_bus import Bus
from temporality_trigger_gateway.errors import (
    BodyTooLarge,
    InvalidPayload,
    MalformedBody,
    Unauthorized,
    UnknownTrigger,
    WebhookError,
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
    app = FastAPI(title="Temporality trigger-gateway", docs_url=None, redoc_url=None)

    @app.exception_handler(WebhookError)
    async def _webhook_error(request: Request, exc: WebhookError) -> JSONResponse:
        log.info("webhook.refused", path=request.url.path[:200], status=exc.status, error=exc.code, detail=exc.detail)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse({"error": code, "detail": str(exc.detail)}, status_code=exc.status_code)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "nats": "connected" if bus.nc.is_connected else "disconnected"}

    @app.post("/hooks/{trigger_id}", status_code=202)
    async def hook(trigger_id: str, request: Request) -> JSONResponse:
        with structlog.contextvars.bound_contextvars(trigger_id=trigger_id[:100]):
            trigger = webhooks.get(trigger_id)
            if trigger is None:
                raise UnknownTrigger(f"no webhook trigger with id {trigger_id[:100]!r}")
            _authenticate(trigger, request.headers.get("authorization"))
            raw = b""
            try:
                raw = await _read_body(request, settings.max_body_bytes)
                outcome = await intake.handle(trigger, _parse_json(raw), body_bytes=len(raw))
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


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"the body ({declared} bytes) exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_json(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8-sig")  # real Azure DevOps payloads may start with a BOM
    except UnicodeDecodeError:
        raise MalformedBody("the body is not UTF-8") from None
    try:
        body = json.loads(text)
    except ValueError as exc:  # JSONDecodeError's message has the position, never the content
        raise MalformedBody(f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise MalformedBody("the body is JSON nested too deeply") from None
    try:  # JSON may escape lone surrogates ("\ud800"), which no UTF-8 consumer downstream accepts
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise MalformedBody("the body contains an unpaired UTF-16 surrogate escape") from None
    except RecursionError:
        raise MalformedBody("the body is JSON nested too deeply") from None
    return body
