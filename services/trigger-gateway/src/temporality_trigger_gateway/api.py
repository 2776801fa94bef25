"""The HTTP surface: ``POST /hooks/{trigger_id}``, the ``/triggers`` admin API (:mod:`.admin`), and
``/healthz`` and ``/readyz`` from the service runtime.

The webhook looks its trigger up in this replica's :class:`~temporality_trigger_gateway.store.TriggerRegistry`
at every delivery, so a trigger created, changed, disabled or deleted in the store (by any replica) is
served as it now is, without a restart.

Checks run in this order, each answered as ``{"error": code, "detail": sentence}``:
unknown trigger 404 (a stored webhook trigger this replica cannot serve, its secret not set: 503
``trigger_not_served``) → an address past the limit of failed authentications of the trigger 429
``too_many_failures`` (below) → header credentials 401 → size 413 → body signature 401 → a ``Content-Type`` that is not
JSON 415 (none at all is taken as JSON) → a ``Content-Encoding`` (gzip, ...) 415 → an empty body 400 → UTF-8 JSON
400 → source shape 422 → the sender's test notification 200 ``ignored`` → disabled / unhandled event type 200
``ignored`` → the trigger's expressions (422 ``mapping_failed`` when one fails on the event) → accepted 202 /
duplicate 200 (with a concurrency key: queued or debounced 202 / skipped 200), or 503 when NATS is unavailable.
Never 410 (Azure DevOps disables a subscription on it).

The trigger's ``auth`` is its verifier (:mod:`temporality_trigger_gateway.auth`): one that reads only
headers runs before the body is read, one that signs the body runs on the raw bytes before they are
parsed. A refusal is journaled only once the sender is authenticated; a refused authentication (401) is in the
audit trail instead, as ``api.access_refused`` (reason ``bad_credentials`` for the header check,
``bad_signature`` for the body's), rate-limited per address so a scanner cannot flood the journal, never with the
credential or signature (:mod:`temporality_service.audit`).

Failed authentications are limited per client address (:mod:`temporality_trigger_gateway.failures`): past
``TEMPORALITY_GATEWAY_WEBHOOK_MAX_FAILURES`` within the window, the address's deliveries to that trigger are 429
``too_many_failures`` with ``Retry-After``, the right credentials too; past as many deliveries to unknown ids, the
address's deliveries that do not authenticate are 429 instead of their 404, 503 or 401 -- or of the 413, 400 or
408 of a body not yet authenticated (a body-signed trigger's body is read before its signature is checked).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import structlog
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from temporality_bus import Bus
from temporality_service import (
    HTTP_TELEMETRY,
    ApiAuth,
    ApiError,
    ErrorBody,
    install_error_handlers,
    parse_json,
    read_body,
)
from temporality_service.limits import client_address
from temporality_service.openapi import add_schemas, json_body, operation
from temporality_trigger_gateway.adapters import ADAPTERS, WebhookRequest
from temporality_trigger_gateway.adapters.base import UNPARSED
from temporality_trigger_gateway.admin import OPENAPI_SCHEMAS, adapters_router, admin_router
from temporality_trigger_gateway.errors import (
    BodyTooLarge,
    BusUnavailable,
    InvalidPayload,
    MalformedBody,
    TriggerNotServed,
    Unauthorized,
    UnknownTrigger,
    UnsupportedMediaType,
)
from temporality_trigger_gateway.failures import WebhookFailures
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
    failures: WebhookFailures | None = None,
) -> FastAPI:
    """The gateway app over an already-connected ``bus``; serves the ``webhook`` triggers of ``triggers``.

    ``triggers`` is the replica's live registry (``store`` given: the ``/triggers`` admin API is served,
    checking ``auth``'s role tokens), or a fixed list (tests, benchmarks: no admin API). ``failures``: the limit of
    failed webhook authentications (default: the settings'; tests give one with their own clock)."""
    if failures is None:
        failures = WebhookFailures(settings.webhook_max_failures, settings.webhook_failure_window_s)
    registry = triggers if isinstance(triggers, TriggerRegistry) else TriggerRegistry.static(triggers)
    intake = Intake(
        bus,
        retry_after_s=settings.retry_after_s,
        claim_lease_s=settings.claim_lease_s,
        answer_within_s=settings.intake_timeout_s,
    )
    app = _GatewayApp(
        title="Temporality trigger-gateway",
        docs_url=None,
        redoc_url=None,
        responses={code: {"model": ErrorBody} for code in (400, 401, 404, 413, 415, 422, 429, 503)},
        telemetry=HTTP_TELEMETRY,
    )
    app.state.intake = intake  # its drain() runs at shutdown (__main__)
    app.state.webhook_failures = failures
    install_error_handlers(app)
    (auth or ApiAuth()).install(app)
    app.include_router(adapters_router(), responses={code: {"model": ErrorBody} for code in (401, 403)})
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
    # matches it in full). Other methods match both only in part: 405 with Allow: POST, as before. With no
    # telemetry to record, the app hands a POST to it straight to this route (_GatewayApp.__call__).
    async def serve_hook(request: Request) -> Response:
        return await hook(request.path_params["trigger_id"], request)

    webhook_route = Route("/hooks/{trigger_id}", serve_hook, methods=["POST"], include_in_schema=False)
    app.router.routes.insert(0, webhook_route)
    # ``/hooks/<id>/`` (a URL pasted with a slash) is the same hook, not a 307 redirect: GitHub does not follow
    # redirects, and Starlette's absolute Location says http:// behind a TLS ingress.
    app.router.routes.insert(1, Route("/hooks/{trigger_id}/", serve_hook, methods=["POST"], include_in_schema=False))
    app.webhook_route = webhook_route

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
        address = client_address(request)
        if trigger is None:
            raise failures.unserved(request, address, _not_served(registry, trigger_id, settings.retry_after_s))
        failures.admit(request, address, trigger.id)  # past the limit: 429 before any credential is looked at
        verifier = trigger.auth
        if not verifier.reads_body:
            try:
                verifier.verify(request.headers, b"")
            except Unauthorized as refused:
                raise failures.failed(request, address, trigger.id, refused, "bad_credentials") from None
        raw = b""
        authenticated = not verifier.reads_body
        try:
            try:
                raw = await _read_body(request, settings.max_body_bytes)
            except ApiError as unread:  # 413, 400 (Content-Length), 408 (too slow)
                if not authenticated:  # past the unknown-id limit: 429, as a delivery to an unknown id gets
                    raise failures.unread(request, address, unread) from None
                raise
            if verifier.reads_body:
                # Again after the body's await: guesses sent at once each passed the check before any was counted.
                failures.admit(request, address, trigger.id)
                try:
                    verifier.verify(request.headers, raw)
                except Unauthorized as refused:
                    raise failures.failed(request, address, trigger.id, refused, "bad_signature") from None
                authenticated = True
            declared = request.headers.get("content-type")
            if declared is not None and not _is_json(declared):
                raise _not_json(declared, trigger.adapter)
            encoded = _content_coding(request.headers.get("content-encoding"))
            if encoded is not None:
                raise UnsupportedMediaType(
                    f"the body is sent with Content-Encoding: {encoded!r}; webhooks take it uncompressed "
                    "(no Content-Encoding, or identity)"
                )
            if not raw.strip():  # (before a source reads it: every source words it alike)
                raise MalformedBody("the body is empty: webhooks take a JSON object")
            # parsed here (a 400 before the source's checks), or by a source that reads the raw body itself
            parsed = UNPARSED if ADAPTERS[trigger.adapter].reads_raw_body else parse_json(raw)
            delivery = WebhookRequest(request.method, request.headers, raw, parsed)
            outcome = await intake.handle_within(trigger, delivery)
        except (BodyTooLarge, UnsupportedMediaType, MalformedBody, InvalidPayload) as refused:
            worded = _not_utf8(refused, request.headers.get("content-type"))
            if authenticated:
                await intake.refused(trigger, worded, body_bytes=len(raw))  # visible in the journal
            if worded is not refused:
                raise worded from None
            raise
        except BusUnavailable as unavailable:
            if trigger.retry.retry_after_s is not None:  # the trigger's own retry policy
                raise BusUnavailable(unavailable.detail, trigger.retry.retry_after_s) from unavailable
            raise
        started = isinstance(outcome, Accepted | Queued | Debounced)
        return _JsonAnswer(outcome, 202 if started else 200)

    return app


#: ``webhook.trigger_not_served`` is logged at most this often per trigger (the requests in between are counted).
NOT_SERVED_LOG_EVERY_S = 60.0
_NOT_SERVED_LOGGED: dict[str, tuple[float, int]] = {}


def _not_served(registry: TriggerRegistry, trigger_id: str, retry_after_s: int) -> ApiError:
    """The answer to a webhook for ``trigger_id``, which this replica does not serve: 503 for a stored webhook
    trigger it cannot serve (its secret is not set here: an operator can fix that, and the sender's retry then
    goes through), saying why in words that name no variable; else 404."""
    shown = repr(trigger_id[:100])
    why = registry.unserved_webhook(trigger_id)
    if why is None:
        return UnknownTrigger(f"no webhook trigger with id {shown}")
    now, key = time.monotonic(), trigger_id[:100]
    last, held = _NOT_SERVED_LOGGED.get(key, (float("-inf"), 0))
    if now - last >= NOT_SERVED_LOG_EVERY_S:  # anyone may post: a warning per minute and trigger, not per request
        log.warning("webhook.trigger_not_served", trigger_id=key, why=why, refused_since_last_warning=held)
        _NOT_SERVED_LOGGED[key] = (now, 0)
    elif len(_NOT_SERVED_LOGGED) < 10_000 or key in _NOT_SERVED_LOGGED:
        _NOT_SERVED_LOGGED[key] = (last, held + 1)
    return TriggerNotServed(
        f"webhook trigger {shown} exists but is not served: {why}; see the trigger admin API "
        f"(GET /triggers/{trigger_id[:100]}: served, problem)",
        retry_after_s,
    )


class _GatewayApp(FastAPI):
    """The gateway's FastAPI app, with a lean path for its hot request, ``POST /hooks/{trigger_id}``.

    While FastAPI's own telemetry has nothing to record (no tracer, meter or logger provider installed, as
    the service runs without ``OTEL_*`` settings), such a request goes through the middleware the app was
    given (``add_middleware``: the service runtime's request metrics) straight to the webhook's route, not
    through the framework's layers (server errors, telemetry, body limit, exception handlers, exit stack,
    router), each only a pass-through for it then. It is answered the same: the route's scope keys are set
    as the router sets them, an exception is answered by the handler the app has for it
    (:func:`install_error_handlers`: the same ``{"error", "detail"}`` bodies and log lines), and one only the
    catch-all ``Exception`` handler takes is re-raised after its 500 is sent, as Starlette's server-error
    middleware does. Every other request, and every request while telemetry is on (its SERVER span), takes
    the whole stack."""

    webhook_route: Route | None = None
    _lean_stack: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.webhook_route is None
            or scope["type"] != "http"
            or scope["method"] != "POST"
            or scope.get("root_path")
            or self.root_path
            or (trigger_id := _hook_trigger(scope["path"])) is None
            or _telemetry_on(self)
        ):
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        scope["path_params"] = {"trigger_id": trigger_id}
        lean = self._lean_stack
        if lean is None:
            lean = self._serve_webhook
            for cls, args, kwargs in reversed(self.user_middleware):
                lean = cls(lean, *args, **kwargs)
            self._lean_stack = lean
        await lean(scope, receive, send)

    async def _serve_webhook(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.webhook_route
        assert route is not None
        scope["route"] = route
        scope["endpoint"] = route.endpoint
        request = Request(scope, receive, send)
        try:
            response = await route.endpoint(request)
        except Exception as exc:
            handler, catch_all = _handler_for(self.exception_handlers, exc)
            response = await handler(request, exc)
            await response(scope, receive, send)
            if catch_all:
                raise  # as ServerErrorMiddleware: the server logs it too
            return
        await response(scope, receive, send)


class _JsonAnswer(Response):
    """A webhook's answer: ``outcome`` serialized once, by pydantic-core, straight to bytes (a JSONResponse
    would dump it to Python, then json.dumps that), with the two headers a ``Response(body,
    media_type="application/json")`` gets, put together here instead of by Starlette's general
    ``init_headers`` (per answer: ~3x the rest of building it)."""

    media_type = "application/json"

    def __init__(self, outcome: BaseModel, status_code: int) -> None:
        self.status_code = status_code
        self.background = None
        self.body = outcome.__pydantic_serializer__.to_json(outcome, exclude_none=True)
        self.raw_headers = [(b"content-length", b"%d" % len(self.body)), (b"content-type", b"application/json")]


async def _read_body(request: Request, limit: int) -> bytes:
    """:func:`read_body`'s body and answers, without its stream and copies when the body came in one ASGI message
    (what uvicorn hands over for a webhook that arrived with its headers): that message's bytes as they are, once
    its declared length is a number within ``limit`` (or there is none) and the bytes are within it too. Anything
    else -- a body in several messages, a disconnect, a missing or odd ``Content-Length`` -- is read by
    :func:`read_body`, the first message handed to it again."""
    first = await request.receive()
    if first["type"] == "http.request" and not first.get("more_body", False):
        body = first.get("body", b"")
        declared = request.headers.get("content-length")
        if (
            type(body) is bytes
            and len(body) <= limit
            and (declared is None or (declared.isascii() and declared.strip().isdigit() and int(declared) <= limit))
        ):
            return body
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await request.receive()
        replayed = True
        return first

    return await read_body(Request(request.scope, replay), limit)


#: The media types a webhook body may be declared as (a missing ``Content-Type`` is taken as JSON too).
ACCEPTED_MEDIA_TYPES = (
    "application/json, application/<subtype>+json or text/json (any parameters; the body is read as UTF-8"
    " whatever charset is declared)"
)
_NOT_UTF8 = "the body is not UTF-8"


def _not_utf8(refused: ApiError, content_type: str | None) -> ApiError:
    """``refused``, or for a body that is not UTF-8 the same refusal saying that UTF-8 is what is read, whatever
    charset the ``Content-Type`` declares. Other charsets are not decoded: every source sends UTF-8 JSON (RFC
    8259 §8.1), and a signature is over the bytes as sent."""
    if not isinstance(refused, MalformedBody) or refused.detail != _NOT_UTF8:
        return refused
    charset = next(
        (
            value.strip().strip('"')[:40]
            for name, _, value in (p.partition("=") for p in (content_type or "").split(";")[1:])
            if name.strip().lower() == "charset"
        ),
        None,
    )
    declared = f" (the Content-Type declares charset={charset}; it is not decoded)" if charset else ""
    return MalformedBody(f"{_NOT_UTF8}: webhooks take UTF-8 JSON whatever charset is declared{declared}")


def _is_json(content_type: str) -> bool:
    """Whether a ``Content-Type`` declares JSON: ``application/json``, ``application/*+json`` or ``text/json``,
    with any parameters (the body is read as UTF-8 whatever the charset: one that is not is 400, :func:`_not_utf8`)."""
    media = content_type.partition(";")[0].strip().lower()
    return (
        media == "application/json"
        or media == "text/json"
        or (media.startswith("application/") and media.endswith("+json"))
    )


def _content_coding(header: str | None) -> str | None:
    """The content coding a ``Content-Encoding`` applies (``gzip``, ``br``, ...), None for none or ``identity``:
    the body is read as it came (RFC 9110 §8.4: a coding the server does not take is 415)."""
    if header is None:
        return None
    codings = [c.strip().lower() for c in header.split(",") if c.strip()]
    applied = [c for c in codings if c != "identity"]
    return ", ".join(applied)[:100] if applied else None


def _not_json(content_type: str, adapter: str) -> UnsupportedMediaType:
    media = content_type.partition(";")[0].strip()[:100]
    declared = f"declared as {media!r}" if media else "declared with an empty Content-Type"
    detail = f"the body is {declared}; webhooks take JSON: {ACCEPTED_MEDIA_TYPES}"
    if adapter == "github":
        detail += (
            ". GitHub sends application/x-www-form-urlencoded when the hook's content type says so: in the "
            "repository's or organization's webhook settings choose Content type: application/json"
        )
    return UnsupportedMediaType(detail)


_HOOKS = "/hooks/"


def _hook_trigger(path: str) -> str | None:
    """The ``{trigger_id}`` of a ``/hooks/{trigger_id}`` path, or of ``/hooks/{trigger_id}/`` (what the two
    routes' patterns, ``[^/]+``, match)."""
    if not path.startswith(_HOOKS):
        return None
    trigger_id = path[len(_HOOKS) :].removesuffix("/")
    return trigger_id if trigger_id and "/" not in trigger_id else None


def _telemetry_on(app: FastAPI) -> bool:
    """Whether FastAPI's telemetry would record this request (unknown: assume it would)."""
    telemetry = getattr(app, "_native_telemetry", None)
    enabled = getattr(telemetry, "enabled", None)
    return enabled is None or bool(enabled())


def _handler_for(
    handlers: Mapping[Any, Callable[[Request, Exception], Any]], exc: Exception
) -> tuple[Callable[[Request, Exception], Awaitable[Response]], bool]:
    """The app's handler of ``exc`` (the closest class in its MRO, as Starlette looks it up), and whether it
    is the catch-all ``Exception`` one."""
    for cls in type(exc).__mro__:
        handler = handlers.get(cls)
        if handler is not None:
            return handler, cls is Exception
    raise exc  # no handler at all (install_error_handlers registers one for Exception)
