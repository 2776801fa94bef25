"""The HTTP surface: ``POST /hooks/{trigger_id}`` (``/healthz`` and ``/readyz`` come from the service runtime).

Checks run in this order, each answered as ``{"error": code, "detail": sentence}``:
unknown trigger 404 → header credentials 401 → size 413 → body signature 401 → UTF-8 JSON 400 →
source shape 422 → disabled / unhandled event type 200 ``ignored`` → accepted 202 / duplicate 200,
or 503 when NATS is unavailable. Never 410 (Azure DevOps disables a subscription on it).

The trigger's ``auth`` is its verifier (:mod:`temporality_trigger_gateway.auth`): one that reads only
headers runs before the body is read, one that signs the body runs on the raw bytes before they are
parsed. A refusal is journaled only once the sender is authenticated.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from temporality_bus import Bus
from temporality_service import ErrorBody, install_error_handlers, parse_json, read_body
from temporality_trigger_gateway.adapters import WebhookRequest
from temporality_trigger_gateway.auth import NoAuth, literal_secret
from temporality_trigger_gateway.errors import BodyTooLarge, InvalidPayload, MalformedBody, UnknownTrigger
from temporality_trigger_gateway.intake import Accepted, Intake
from temporality_trigger_gateway.settings import Settings
from temporality_trigger_gateway.triggers import TriggerConfig, WebhookTrigger

__all__ = ["create_app"]

log = structlog.get_logger(__name__)


def create_app(settings: Settings, bus: Bus, triggers: Iterable[TriggerConfig]) -> FastAPI:
    """The gateway app over an already-connected ``bus``; serves the ``webhook`` triggers among ``triggers``."""
    webhooks = _served(triggers)
    intake = Intake(bus, retry_after_s=settings.retry_after_s, claim_lease_s=settings.claim_lease_s)
    app = FastAPI(
        title="Temporality trigger-gateway",
        docs_url=None,
        redoc_url=None,
        responses={code: {"model": ErrorBody} for code in (400, 401, 404, 413, 422, 503)},
    )
    install_error_handlers(app)

    @app.post("/hooks/{trigger_id}", status_code=202)
    async def hook(trigger_id: str, request: Request) -> JSONResponse:
        # No per-request log binding here: Intake.handle binds the delivery's fields once it has them.
        trigger = webhooks.get(trigger_id)
        if trigger is None:
            raise UnknownTrigger(f"no webhook trigger with id {trigger_id[:100]!r}")
        verifier = trigger.auth
        if not verifier.reads_body:
            verifier.verify(request.headers, b"")
        raw = b""
        authenticated = not verifier.reads_body
        try:
            raw = await read_body(request, settings.max_body_bytes)
            if verifier.reads_body:
                verifier.verify(request.headers, raw)
                authenticated = True
            delivery = WebhookRequest(request.method, request.headers, raw, parse_json(raw))
            outcome = await intake.handle(trigger, delivery)
        except (BodyTooLarge, MalformedBody, InvalidPayload) as refused:
            if authenticated:
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
        if isinstance(auth, NoAuth):
            log.warning("trigger.unauthenticated", trigger_id=trigger.id)
        elif literal_secret(auth):
            log.warning("trigger.literal_secret", trigger_id=trigger.id, hint="use the auth *_env key")
        log.info(
            "trigger.served", trigger_id=trigger.id, adapter=trigger.adapter, auth=auth.type, enabled=trigger.enabled
        )
    return webhooks
