"""The console's way to the web inbox: an allow-listed proxy ``/human/...`` -> human-interaction's inbox API
(UI-1/HUM, issue 9; the console's CSP allows ``connect-src 'self'`` only).

==========================================  ==========  ==========================================
``/human/inbox``                            ``GET``     the caller's pending questions
``/human/requests/{id}``                    ``GET``     one request (only its recipient may read it)
``/human/requests/{id}/answer``             ``POST``    ``{"option_id": ...}`` or ``{"text": ...}``
==========================================  ==========  ==========================================

A person authenticates to human-interaction with their own **inbox token** (their directory profile's
``inbox_token``), which the journal cannot check: it requires an ``Authorization: Bearer <something>``
(401 ``unauthorized`` otherwise, so an anonymous request never leaves the journal) and lets
human-interaction decide. Or the person is signed in to the console (:mod:`temporality_journal.signin`,
any role or none): without an ``Authorization`` the journal then sends ``X-Temporality-Vouched-User``, a
short-lived assertion of their user id signed with ``TEMPORALITY_INBOX_VOUCH_SECRET_FILE``
(:mod:`temporality_service.vouch`), which human-interaction checks (that header from a caller is never passed
on); the answer (POST) also needs the console header ``X-Temporality-Console: 1`` (403
``console_header_missing``); without the secret on the journal, 503 ``inbox_vouching_not_configured``. Its 401 (``invalid token``), 403 ``not_recipient``, 404 ``unknown_request``,
409 (``already_answered``, ``expired``, ``cancelled``) and 422 ``invalid_answer`` come back as they are.
Request ids follow human-interaction's own pattern (1-128 of ``A-Z a-z 0-9 _ -``); another id, another
path or a percent-escape is a 404 ``human_route_not_found``, another method on an allow-listed path a
405; neither is forwarded.

One addition to the answers: each request in a 200 answer of ``/human/inbox`` and ``/human/requests/{id}``
gets ``on_timeout`` -- what happens when nobody answers, from the request's ``human.requested`` event in
the journal (``null`` while the journal has not recorded it): ``{action, default_option, default_label,
renotify, escalate, summary}``, ``summary`` one sentence ("the run continues with "Keep v1"").

Request headers passed on: ``Authorization``, ``Content-Type``, ``Accept``; response headers returned:
``Content-Type``, ``Retry-After``, ``WWW-Authenticate``. Limits, 502/503 and logging: :mod:`.proxy`
(``human_unreachable``, ``human_not_configured``, ``human_answer_too_large``; ``human.proxied``).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Header, Path, Request
from sqlalchemy import select as sa_select
from starlette.responses import Response

from temporality_journal.database import Database
from temporality_journal.models import EVENTS_TABLE
from temporality_journal.proxy import ALL_METHODS, ShapeList, Upstream, upstream_client
from temporality_journal.settings import Settings
from temporality_journal.signin import SignIn
from temporality_service import VOUCH_HEADER, ErrorBody, Unauthorized, Unavailable

__all__ = ["human_client", "human_router", "timeout_summary"]

#: human-interaction's request ids (``records.is_request_id``).
REQUEST_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
PASSED = frozenset(("authorization", "content-type", "accept"))
PASSED_RESPONSE_HEADERS = ("content-type", "retry-after", "www-authenticate")
_ID_PART = r"[A-Za-z0-9_-]{1,128}"
SHAPES: ShapeList = (
    (re.compile(r"inbox"), ("GET",)),
    (re.compile(rf"requests/{_ID_PART}"), ("GET",)),
    (re.compile(rf"requests/{_ID_PART}/answer"), ("POST",)),
)
TAG = "inbox proxy"
PROXIED = (
    "Proxied to human-interaction's web inbox API (TEMPORALITY_JOURNAL_HUMAN_URL) with the caller's "
    "Authorization: Bearer <inbox token>, which human-interaction checks; its status and body come back "
    "unchanged (401, 403 not_recipient, 404 unknown_request, 409, 422), 200 answers with on_timeout added. "
    "401 without a Bearer, 502 human_unreachable, 503 human_not_configured. See docs/journal.md."
)
_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}}
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 413, 422, 502, 503)
}

#: Module-level (``from __future__ import annotations``: FastAPI resolves them in the module's namespace).
RequestId = Annotated[str, Path(description="A request id (1-128 of A-Z a-z 0-9 _ -; else 404)")]
Auth = Annotated[str | None, Header(description="Bearer <inbox token> (the person's own), passed to human-interaction")]


def human_client(settings: Settings) -> httpx.AsyncClient | None:
    """The one client every inbox request shares (enter it as a resource), or None when no URL is set."""
    return upstream_client(settings.human_url)


def _minutes(seconds: int) -> str:
    if seconds % 3600 == 0:
        hours = seconds // 3600
        return f"{hours} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def timeout_summary(on_timeout: dict[str, Any], options: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``on_timeout`` added to an inbox item, from the request's ``policy.on_timeout``."""
    action = str(on_timeout.get("action") or "fail")
    default = on_timeout.get("default_option")
    label = next((str(o.get("label")) for o in options if o.get("id") == default), None) if default else None
    renotify = on_timeout.get("renotify") if isinstance(on_timeout.get("renotify"), dict) else None
    escalate = on_timeout.get("escalate") if isinstance(on_timeout.get("escalate"), dict) else None
    final = {
        "default": f'the run continues with "{label or default}"',
        "cancel": "the run is cancelled",
    }.get(action, "the run fails")
    before: list[str] = []
    if renotify is not None:
        before.append(
            f"you are reminded every {_minutes(int(renotify.get('every_s', 0)))} (at most {renotify.get('max')} times)"
        )
    if escalate is not None:
        before.append(f"it is also sent to {escalate.get('to')} after {_minutes(int(escalate.get('after_s', 0)))}")
    summary = f"Without an answer by the deadline {final}."
    if before:
        summary = f"Before the deadline {' and '.join(before)}. {summary}"
    return {
        "action": action,
        "default_option": default,
        "default_label": label,
        "renotify": renotify,
        "escalate": escalate,
        "summary": summary,
    }


async def _policies(database: Database, items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """request id -> ``policy.on_timeout`` of its ``human.requested``, for the requests of ``items``."""
    run_ids = sorted({str(i["run_id"]) for i in items if isinstance(i.get("run_id"), str)})
    wanted = {str(i["id"]) for i in items if isinstance(i.get("id"), str)}
    if not run_ids or not wanted:
        return {}
    t = EVENTS_TABLE.c
    query = sa_select(t.data).where(t.run_id.in_(run_ids), t.type == "human.requested")
    async with database.sessions() as session:
        rows = (await (await session.connection()).execute(query)).all()
    found: dict[str, dict[str, Any]] = {}
    for (data,) in rows:
        if not isinstance(data, dict) or data.get("request_id") not in wanted:
            continue
        policy = data.get("policy")
        on_timeout = policy.get("on_timeout") if isinstance(policy, dict) else None
        found[str(data["request_id"])] = on_timeout if isinstance(on_timeout, dict) else {}
    return found


def human_router(
    settings: Settings, client: httpx.AsyncClient | None, database: Database, signin: SignIn | None = None
) -> APIRouter:
    """The ``/human/...`` routes forwarding through ``client`` (None: every one is a 503); with ``signin``, a
    person signed in by session is vouched for instead of sending an inbox token."""
    router = APIRouter(tags=[TAG], responses=_ERRORS)
    peer = Upstream(
        name="human",
        label="human-interaction service",
        setting="TEMPORALITY_JOURNAL_HUMAN_URL",
        client=client,
        max_body_bytes=settings.max_body_bytes,
        request_headers=PASSED,
        response_headers=PASSED_RESPONSE_HEADERS,
    )

    def _caller(request: Request, authorization: str | None) -> dict[str, str]:
        """The headers that say who calls: none beyond the caller's own ``Authorization: Bearer <inbox
        token>``; for a person signed in by session, a fresh assertion vouching for them."""
        if authorization is None and signin is not None:
            person = signin.person(request)
            if person is not None:
                if signin.voucher is None:
                    raise Unavailable(
                        "the inbox of a signed-in person needs TEMPORALITY_INBOX_VOUCH_SECRET_FILE on the journal "
                        "and human-interaction; until then, open it with your inbox token",
                        code="inbox_vouching_not_configured",
                    )
                SignIn.check_csrf(request)
                return {VOUCH_HEADER: signin.voucher.vouch(person.user_id)}
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("sign in with your inbox token: send Authorization: Bearer <inbox token>")
        return {}

    def _request(request_id: str) -> str:
        if not REQUEST_ID.match(request_id):
            raise peer.no_route()
        return request_id

    async def with_timeouts(status: int, body: bytes) -> bytes:
        """Add ``on_timeout`` to each request of a 200 answer (an inbox or one request)."""
        try:
            parsed = json.loads(body)
        except ValueError:
            return body
        if isinstance(parsed, dict) and isinstance(parsed.get("requests"), list):
            items = [i for i in parsed["requests"] if isinstance(i, dict)]
        elif isinstance(parsed, dict) and "id" in parsed:
            items = [parsed]
        else:
            return body
        policies = await _policies(database, items)
        for item in items:
            policy = policies.get(str(item.get("id")))
            options = [o for o in item.get("options") or [] if isinstance(o, dict)]
            item["on_timeout"] = None if policy is None else timeout_summary(policy, options)
        return json.dumps(parsed, ensure_ascii=False, separators=(",", ":")).encode()

    @router.get("/human/inbox", description=f"The caller's pending questions, newest first. {PROXIED}")
    async def inbox(request: Request, authorization: Auth = None) -> Response:
        vouched = _caller(request, authorization)
        return await peer.forward(request, "GET", "/inbox", "/inbox", rewrite=with_timeouts, extra_headers=vouched)

    @router.get("/human/requests/{request_id}", description=f"One request (its recipient only). {PROXIED}")
    async def read_request(request: Request, request_id: RequestId, authorization: Auth = None) -> Response:
        vouched = _caller(request, authorization)
        upstream = f"/requests/{_request(request_id)}"
        return await peer.forward(
            request, "GET", "/requests/{id}", upstream, rewrite=with_timeouts, extra_headers=vouched
        )

    @router.post(
        "/human/requests/{request_id}/answer",
        description=f"Answer a request: {{option_id}} or {{text}}. {PROXIED}",
        openapi_extra=_BODY,
    )
    async def answer(request: Request, request_id: RequestId, authorization: Auth = None) -> Response:
        vouched = _caller(request, authorization)
        upstream = f"/requests/{_request(request_id)}/answer"
        return await peer.forward(request, "POST", "/requests/{id}/answer", upstream, body=True, extra_headers=vouched)

    @router.api_route("/human/{rest:path}", methods=ALL_METHODS, include_in_schema=False)
    async def elsewhere(request: Request, rest: str) -> Response:
        raise peer.refuse_elsewhere(request.method, rest, SHAPES)

    return router
