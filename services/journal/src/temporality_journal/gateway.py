"""The console's way to the trigger admin API: an allow-listed proxy ``/gateway/triggers...`` -> the
trigger-gateway's ``/triggers...`` (and ``/gateway/adapters`` -> ``/adapters``: the webhook sources the wizard offers)
(UI-2, issue 9; the console's CSP allows ``connect-src 'self'`` only).

==================================================  ==========================  =====================
``/gateway/triggers``                               ``GET``, ``POST``           list, create
``/gateway/triggers/preview``                       ``POST``                    a draft + a sample delivery
``/gateway/triggers/{id}``                          ``GET``, ``PUT``, ``DELETE``  read (ETag), replace, delete
``/gateway/triggers/{id}/enable`` / ``/disable``    ``POST``                    switch
``/gateway/triggers/{id}/deliveries``               ``GET``                     ``cursor``, ``limit`` only
``/gateway/triggers/{id}/deliveries/{d}/redrive``   ``POST``                    re-run a delivery; body {"rerun": n}: an accepted one as a new run
``/gateway/adapters``                               ``GET``                     the webhook sources (adapters): the wizard's choices
==================================================  ==========================  =====================

Anything else under ``/gateway/`` -- another path, an id the gateway's own patterns refuse
(``^[a-z0-9][a-z0-9-]{0,62}$`` for trigger ids, ``^dlv-[0-9a-f]{24}$`` for delivery ids), a path with any
percent-escape (no valid one needs it: no ``..`` or ``%2F`` reaches the gateway) -- is a 404
``gateway_route_not_found`` from the journal; another method on an allow-listed path is a 405 (``Allow``).
Neither is forwarded. The upstream URL is built from the validated ids, never from the request's path.

The journal admits any valid API token (401 without one: anonymous requests never reach the gateway) and
checks no role: the caller's ``Authorization`` goes to the gateway (the same role tokens:
``TEMPORALITY_API_TOKENS_FILE``), whose status and body come back as they are (its 401, 403, 409, 412, 422
and 428 included). Request headers passed on: ``Authorization``, ``If-Match``, ``Content-Type``,
``Accept``; response headers returned: ``Content-Type``, ``ETag``, ``Location`` (``/triggers/x`` becomes
``/gateway/triggers/x``), ``Retry-After``, ``WWW-Authenticate``. Nothing else either way.

Limits and errors (``{"error", "detail"}``): a body over ``TEMPORALITY_JOURNAL_MAX_BODY_BYTES`` is a 413;
``TEMPORALITY_JOURNAL_GATEWAY_URL`` unset is a 503 ``gateway_not_configured``; the gateway unreachable or
silent for :data:`TIMEOUT_S` is a 502 ``gateway_unreachable``, an answer over :data:`MAX_ANSWER_BYTES` a
502 ``gateway_answer_too_large``.

The OpenAPI document declares the gateway's answers (:mod:`temporality_protocol.trigger_admin`, the models
the gateway documents its own with) under ``Gateway``-prefixed names (:data:`OPENAPI_SCHEMAS`: the journal
has a ``TriggerView`` of its own); the bytes are forwarded as they are, not validated here. Each forwarded request is logged with its method, route template,
status and duration -- never a header or a body. The forwarding itself is :class:`temporality_journal.proxy.Upstream`'s
(shared with the inbox proxy, :mod:`temporality_journal.human`); this module is the allow-list.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Depends, Header, Path, Query, Request
from starlette.responses import Response

from temporality_journal.proxy import ALL_METHODS, MAX_ANSWER_BYTES, TIMEOUT_S, ShapeList, Upstream, upstream_client
from temporality_journal.settings import Settings
from temporality_journal.signin import SignIn
from temporality_protocol.trigger_admin import (
    AdapterList,
    DeliveryPage,
    PreviewAnswer,
    RedriveAnswer,
    TriggerList,
    TriggerView,
)
from temporality_service import PRINCIPAL_HEADER, AsViewer, ErrorBody, Forbidden, PrincipalVoucher
from temporality_service.openapi import component_schemas, if_match, json_answer, json_body, operation

__all__ = ["MAX_ANSWER_BYTES", "OPENAPI_SCHEMAS", "TIMEOUT_S", "gateway_client", "gateway_router"]

#: The gateway's own id patterns (``temporality_trigger_gateway.admin``).
TRIGGER_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
DELIVERY_ID = re.compile(r"^dlv-[0-9a-f]{24}$")
PASSED = frozenset(("authorization", "if-match", "content-type", "accept"))
PASSED_RESPONSE_HEADERS = ("content-type", "etag", "retry-after", "www-authenticate")
_ID_PART = r"[a-z0-9][a-z0-9-]{0,62}"
#: The allow-list's path shapes (under ``/gateway/``) and their methods: another method on one is a 405.
SHAPES: ShapeList = (
    (re.compile(r"triggers"), ("GET", "POST")),
    (re.compile(r"triggers/preview"), ("GET", "POST", "PUT", "DELETE")),  # also a trigger id
    (re.compile(rf"triggers/{_ID_PART}"), ("GET", "PUT", "DELETE")),
    (re.compile(rf"triggers/{_ID_PART}/(enable|disable)"), ("POST",)),
    (re.compile(rf"triggers/{_ID_PART}/deliveries"), ("GET",)),
    (re.compile(rf"triggers/{_ID_PART}/deliveries/[^/]+/redrive"), ("POST",)),
    (re.compile(r"adapters"), ("GET",)),
)
TAG = "gateway proxy"
#: What every proxied route says in OpenAPI.
PROXIED = (
    "Proxied to the trigger-gateway's admin API (TEMPORALITY_JOURNAL_GATEWAY_URL): the journal admits any "
    "valid API token (401 otherwise), the gateway checks its role and answers; its status, body and ETag come back unchanged. 502 gateway_unreachable, 503 "
    "gateway_not_configured. See docs/journal.md."
)
#: The gateway reads the body (a trigger: see its own OpenAPI; an empty or non-JSON body is its 400).
_BODY = json_body({"type": "object"}, description="A trigger (the gateway's TriggerSpec), or a preview request")
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 412, 413, 422, 428, 502, 503)
}
#: ``If-Match`` is passed on: the gateway's 428 without it on PUT, 412 for a stale or malformed one.
_IF_MATCH = if_match(required=False, what="the trigger")
_IF_MATCH_REQUIRED = if_match(required=True, what="the trigger")
#: The gateway's answers, as its own document declares them, named ``Gateway<model>`` here (the journal's
#: ``/triggers`` view has its own ``TriggerView``); :func:`temporality_journal.api.create_app` adds them.
PREFIX = "Gateway"
OPENAPI_SCHEMAS = component_schemas(
    prefix=PREFIX,
    mode="serialization",
    TriggerView=TriggerView,
    TriggerList=TriggerList,
    DeliveryPage=DeliveryPage,
    AdapterList=AdapterList,
    RedriveAnswer=RedriveAnswer,
    PreviewAnswer=PreviewAnswer,
)


def _answer(status: int, model: type[object], description: str) -> dict[int | str, dict[str, Any]]:
    return {status: json_answer(PREFIX + model.__name__, description=description)}


_TRIGGER = "The trigger, as the gateway shows it (its ETag in ETag)"


#: Module-level (``from __future__ import annotations``: FastAPI resolves them in the module's namespace).
TriggerId = Annotated[str, Path(description="A trigger id (^[a-z0-9][a-z0-9-]{0,62}$; else 404)")]
DeliveryId = Annotated[str, Path(description="A delivery id (^dlv-[0-9a-f]{24}$; else 404)")]
Auth = Annotated[str | None, Header(description="Bearer <API token>, passed to the gateway")]


def gateway_client(settings: Settings) -> httpx.AsyncClient | None:
    """The one client every proxied request shares (enter it as a resource), or None when no URL is set."""
    return upstream_client(settings.gateway_url)


def gateway_router(
    settings: Settings,
    client: httpx.AsyncClient | None,
    signin: SignIn | None = None,
    principals: PrincipalVoucher | None = None,
) -> APIRouter:
    """The ``/gateway/triggers...`` routes forwarding through ``client`` (None: every one is a 503).

    A person signed in by session (``signin``) has no API token to pass on: with ``principals``
    (``TEMPORALITY_API_VOUCH_SECRET_FILE``, shared with the gateway) the journal vouches for them instead --
    ``X-Temporality-Vouched-Principal``, their principal and role, signed -- and the gateway checks the role as
    for a token. Without it such a request is a 403 ``api_token_needed`` here (not forwarded)."""

    async def _token_to_pass_on(request: Request, authorization: Auth = None) -> None:
        if authorization is None and principals is None and signin is not None and signin.person(request) is not None:
            raise Forbidden(
                "the trigger admin API takes API tokens here: sign in to the console with an API token to manage "
                "triggers (or set TEMPORALITY_API_VOUCH_SECRET_FILE on the journal and the trigger-gateway)",
                code="api_token_needed",
            )

    def _vouched(request: Request) -> dict[str, str]:
        """For a person signed in by session (no ``Authorization``), their principal vouched for; else nothing."""
        if principals is None or signin is None or "authorization" in request.headers:
            return {}
        person = signin.person(request)
        principal = None if person is None else person.principal()
        if principal is None:  # nobody signed in, or no role: the route's own check has refused already
            return {}
        return {PRINCIPAL_HEADER: principals.vouch_principal(principal.name, principal.role.name)}

    router = APIRouter(tags=[TAG], responses=_ERRORS, dependencies=[Depends(_token_to_pass_on)])
    peer = Upstream(
        name="gateway",
        label="trigger-gateway",
        setting="TEMPORALITY_JOURNAL_GATEWAY_URL",
        client=client,
        max_body_bytes=settings.max_body_bytes,
        request_headers=PASSED,
        response_headers=PASSED_RESPONSE_HEADERS,
        location=("/triggers", "/gateway/triggers"),
    )

    async def forward(request: Request, *args: Any, **kwargs: Any) -> Response:
        return await peer.forward(request, *args, extra_headers=_vouched(request), **kwargs)

    def _trigger(trigger_id: str) -> str:
        if not TRIGGER_ID.match(trigger_id):
            raise peer.no_route()
        return trigger_id

    @router.get(
        "/gateway/triggers",
        description=f"The stored triggers. {PROXIED}",
        responses=_answer(200, TriggerList, "Every stored trigger"),
    )
    async def list_triggers(request: Request, who: AsViewer, authorization: Auth = None) -> Response:
        return await forward(request, "GET", "/triggers", "/triggers")

    @router.post(
        "/gateway/triggers",
        status_code=201,
        description=f"Create a trigger (admin). {PROXIED}",
        openapi_extra=operation(body=_BODY),
        responses=_answer(201, TriggerView, _TRIGGER),
    )
    async def create_trigger(request: Request, who: AsViewer, authorization: Auth = None) -> Response:
        return await forward(request, "POST", "/triggers", "/triggers", body=True)

    @router.post(
        "/gateway/triggers/preview",
        description=f"What a draft trigger makes of a sample delivery; nothing is started. {PROXIED}",
        openapi_extra=operation(body=_BODY),
        responses=_answer(200, PreviewAnswer, "What the gateway would make of the sample"),
    )
    async def preview(request: Request, who: AsViewer, authorization: Auth = None) -> Response:
        return await forward(request, "POST", "/triggers/preview", "/triggers/preview", body=True)

    @router.get(
        "/gateway/triggers/{trigger_id}",
        description=f"One trigger, with its ETag. {PROXIED}",
        responses=_answer(200, TriggerView, _TRIGGER),
    )
    async def read_trigger(
        request: Request, trigger_id: TriggerId, who: AsViewer, authorization: Auth = None
    ) -> Response:
        return await forward(request, "GET", "/triggers/{id}", f"/triggers/{_trigger(trigger_id)}")

    @router.put(
        "/gateway/triggers/{trigger_id}",
        description=f"Replace a trigger (admin; If-Match required). {PROXIED}",
        openapi_extra=operation(body=_BODY, headers=[_IF_MATCH_REQUIRED]),
        responses=_answer(200, TriggerView, _TRIGGER),
    )
    async def replace_trigger(
        request: Request, trigger_id: TriggerId, who: AsViewer, authorization: Auth = None
    ) -> Response:
        return await forward(request, "PUT", "/triggers/{id}", f"/triggers/{_trigger(trigger_id)}", body=True)

    @router.delete(
        "/gateway/triggers/{trigger_id}",
        status_code=204,
        description=f"Delete a trigger (admin). {PROXIED}",
        openapi_extra=operation(headers=[_IF_MATCH]),
    )
    async def delete_trigger(
        request: Request, trigger_id: TriggerId, who: AsViewer, authorization: Auth = None
    ) -> Response:
        return await forward(request, "DELETE", "/triggers/{id}", f"/triggers/{_trigger(trigger_id)}")

    @router.post(
        "/gateway/triggers/{trigger_id}/enable",
        description=f"Enable a trigger (operator). {PROXIED}",
        openapi_extra=operation(headers=[_IF_MATCH]),
        responses=_answer(200, TriggerView, _TRIGGER),
    )
    async def enable_trigger(
        request: Request, trigger_id: TriggerId, who: AsViewer, authorization: Auth = None
    ) -> Response:
        return await forward(request, "POST", "/triggers/{id}/enable", f"/triggers/{_trigger(trigger_id)}/enable")

    @router.post(
        "/gateway/triggers/{trigger_id}/disable",
        description=f"Disable a trigger (operator). {PROXIED}",
        openapi_extra=operation(headers=[_IF_MATCH]),
        responses=_answer(200, TriggerView, _TRIGGER),
    )
    async def disable_trigger(
        request: Request, trigger_id: TriggerId, who: AsViewer, authorization: Auth = None
    ) -> Response:
        return await forward(request, "POST", "/triggers/{id}/disable", f"/triggers/{_trigger(trigger_id)}/disable")

    @router.get(
        "/gateway/triggers/{trigger_id}/deliveries",
        description=f"A trigger's deliveries and their processing state, newest first. {PROXIED}",
        responses=_answer(200, DeliveryPage, "A page of the trigger's deliveries"),
    )
    async def list_deliveries(
        request: Request,
        trigger_id: TriggerId,
        who: AsViewer,
        authorization: Auth = None,
        cursor: Annotated[str | None, Query(max_length=200, description="next_cursor of the previous page")] = None,
        limit: Annotated[int | None, Query(ge=1, le=100, description="At most this many (gateway: 50)")] = None,
    ) -> Response:
        params = {k: str(v) for k, v in (("cursor", cursor), ("limit", limit)) if v is not None}
        upstream = f"/triggers/{_trigger(trigger_id)}/deliveries"
        return await forward(request, "GET", "/triggers/{id}/deliveries", upstream, params=params)

    @router.post(
        "/gateway/triggers/{trigger_id}/deliveries/{delivery_id}/redrive",
        description='Re-run a rejected or failed delivery; with the body `{"rerun": n}`, run an accepted one again as '
        f"a new run (operator). {PROXIED}",
        responses=_answer(200, RedriveAnswer, "Re-driven: the outcome (duplicate, skipped, ignored)")
        | _answer(202, RedriveAnswer, "Accepted again: a run was started, queued or debounced"),
    )
    async def redrive(
        request: Request,
        trigger_id: TriggerId,
        delivery_id: DeliveryId,
        who: AsViewer,
        authorization: Auth = None,
    ) -> Response:
        if not DELIVERY_ID.match(delivery_id):
            raise peer.no_route()
        upstream = f"/triggers/{_trigger(trigger_id)}/deliveries/{delivery_id}/redrive"
        return await forward(request, "POST", "/triggers/{id}/deliveries/{d}/redrive", upstream, body=True)

    @router.get(
        "/gateway/adapters",
        description="The webhook sources a trigger's adapter may name: each one's name, a one-line description, "
        "the auth types that authenticate it (besides none; the recommended first) and its event types (null: any "
        f"the sender names). What the console's trigger wizard offers. {PROXIED}",
        responses=_answer(200, AdapterList, "The webhook sources this gateway serves"),
    )
    async def list_adapters(request: Request, who: AsViewer, authorization: Auth = None) -> Response:
        return await forward(request, "GET", "/adapters", "/adapters")

    @router.api_route("/gateway/{rest:path}", methods=ALL_METHODS, include_in_schema=False)
    async def elsewhere(request: Request, rest: str) -> Response:
        raise peer.refuse_elsewhere(request.method, rest, SHAPES)

    return router
