"""The HTTP surface: ``POST /hooks/{trigger_id}``, the ``/triggers`` admin API (:mod:`.admin`), and
``/healthz`` and ``/readyz`` from the service runtime.

The webhook looks its trigger up in this replica's :class:`~temporality_trigger_gateway.store.TriggerRegistry`
at every delivery, so a trigger created, changed, disabled or deleted in the store (by any replica) is
served as it now is, without a restart.

Checks run in this order, each answered as ``{"error": code, "detail": sentence}``:
unknown trigger 404 → header credentials 401 → size 413 → body signature 401 → UTF-8 JSON 400 →
source shape 422 → disabled / unhandled event type 200 ``ignored`` → accepted 202 / duplicate 200 (with a
concurrency key: queued or debounced 202 / skipped 200), or 503 when NATS is unavailable. Never 410 (Azure DevOps disables a subscription on it).

The trigger's ``auth`` is its verifier (:mod:`temporality_trigger_gateway.auth`): one that reads only
headers runs before the body is read, one that signs the body runs on the raw bytes before they are
parsed. A refusal is journaled only once the sender is authenticated.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog
from fastapi import FastAPI, Request, Response
from starlette.routing import Route

from temporality_bus import Bus
from temporality_service import HTTP_TELEMETRY, ApiAuth, ErrorBody, install_error_handlers, parse_json, read_body
from temporality_service.openapi import add_schemas, json_body, operation
from temporality_trigger_gateway.adapters import WebhookRequest
from temporality_trigger_gateway.admin import OPENAPI_SCHEMAS, admin_router
from temporality_trigger_gateway.errors import (
    BodyTooLarge,
    BusUnavailable,
    InvalidPayload,
    MalformedBody,
    UnknownTrigger,
)
from temporality_trigger_gateway.intake import Accepted, Debounced, Intake, Queued
from temporality_trigger_gateway.settings import Settings
from temporality_trigger_gateway.store import TriggerRegistry, TriggerStore
from temporality_trigger_gateway.triggers import TriggerConfig

__all__ = ["create_app"]

log = structlog.get_logger(__name__)


def create_app(
    settings: Settings,
    bus: Bus,
    triggers: Iterable[TriggerConfig] | TriggerRegistry,
    *,
    store: TriggerStore | None = None,
    auth: ApiAuth | None = None,
) -> FastAPI:
    """The gateway app over an already-connected ``bus``; serves the ``webhook`` triggers of ``triggers``.

    ``triggers`` is the replica's live registry (``store`` given: the ``/triggers`` admin API is served,
    checking ``auth``'s role tokens), or a fixed list (tests, benchmarks: no admin API)."""
    registry = triggers if isinstance(triggers, TriggerRegistry) else TriggerRegistry.static(triggers)
    intake = Intake(bus, retry_after_s=settings.retry_after_s, claim_lease_s=settings.claim_lease_s)
    app = FastAPI(
        title="Temporality trigger-gateway",
        docs_url=None,
        redoc_url=None,
        responses={code: {"model": ErrorBody} for code in (400, 401, 404, 413, 422, 503)},
        telemetry=HTTP_TELEMETRY,
    )
    install_error_handlers(app)
    (auth or ApiAuth()).install(app)
    if store is not None:
        app.include_router(
            admin_router(
                registry,
                store,
                bus,
                max_body_bytes=settings.max_body_bytes,
                retry_after_s=settings.retry_after_s,
                launcher=intake.launcher,
            ),
            responses={code: {"model": ErrorBody} for code in (401, 403, 404, 409, 412, 422, 428, 503)},
        )
        add_schemas(app, OPENAPI_SCHEMAS)

    # The webhook is the hot path: it is served by a plain Starlette route put first (no FastAPI dependency
    # solving per request), and documented by the FastAPI route below, which no POST reaches (the first route
    # matches it in full). Other methods match both only in part: 405 with Allow: POST, as before.
    async def serve_hook(request: Request) -> Response:
        return await hook(request.path_params["trigger_id"], request)

    app.router.routes.insert(0, Route("/hooks/{trigger_id}", serve_hook, methods=["POST"], include_in_schema=False))

    @app.post(
        "/hooks/{trigger_id}",
        status_code=202,
        summary="Deliver a webhook (202: a run is started, queued or debounced)",
        responses={200: {"description": "Nothing started: a duplicate, an ignored event, or skipped by concurrency"}},
        openapi_extra=operation(body=json_body({}, description="The source's JSON payload, as it sends it")),
    )
    async def hook(trigger_id: str, request: Request) -> Response:
        # No per-request log binding here: Intake.handle binds the delivery's fields once it has them.
        trigger = registry.webhook(trigger_id)
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
        except BusUnavailable as unavailable:
            if trigger.retry.retry_after_s is not None:  # the trigger's own retry policy
                raise BusUnavailable(unavailable.detail, trigger.retry.retry_after_s) from unavailable
            raise
        started = isinstance(outcome, Accepted | Queued | Debounced)
        # Serialized once, by pydantic-core (a JSONResponse would dump to Python, then json.dumps that).
        return Response(
            outcome.model_dump_json(exclude_none=True),
            status_code=202 if started else 200,
            media_type="application/json",
        )

    return app
