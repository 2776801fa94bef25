"""The one HTTP contract of every service: errors as ``{"error": code, "detail": sentence}``, bounded bodies.

    ApiError                 -- any refusal; carries ``status``, ``code``, ``detail``, headers, extra fields
    ├── BadRequest           -- 400 bad_request
    ├── MalformedJson        -- 400 malformed_json: not UTF-8, not JSON, nested too deeply, lone surrogates
    ├── Unauthorized         -- 401 unauthorized (with a ``WWW-Authenticate`` challenge)
    ├── Forbidden            -- 403 forbidden
    ├── NotFound             -- 404 not_found
    ├── Conflict             -- 409 conflict
    ├── BodyTooLarge         -- 413 body_too_large
    ├── ClientGone           -- 400 client_disconnected: the client hung up mid-body (nobody reads the answer)
    ├── BodyTimeout          -- 408 body_timeout: the body did not arrive in time (the connection is closed)
    ├── Unprocessable        -- 422 invalid_request
    └── Unavailable          -- 503 unavailable (with ``Retry-After`` when known)

:func:`install_error_handlers` maps everything else onto the same body: FastAPI's request validation
(422 ``invalid_request`` with one sentence naming the fields), Starlette's HTTP errors (404, 405 -- its ``Allow`` naming every method routed on the path --, ...)
and, as the last resort, any unexpected exception (500 ``internal_error``, logged, never a traceback on
the wire). The server's own 400 for a request that is not even HTTP (e.g. a raw non-ASCII byte in the
path) speaks it too (:mod:`temporality_service.server`).

:func:`read_body` reads a request body within a byte limit (by ``Content-Length`` and by what is
actually streamed) and a time limit (``TEMPORALITY_HTTP_BODY_TIMEOUT_S``, 30 s: a client trickling its body
byte by byte is answered 408 and disconnected, not kept forever) and :func:`parse_json` parses it without ever raising anything but
:class:`MalformedJson`. Integer query parameters use :data:`Int64` / :data:`NonNegativeInt64` so a value
no database column can hold is a 422, not an ``OverflowError``.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

__all__ = [
    "DEFAULT_BODY_TIMEOUT_S",
    "MAX_INT64",
    "ApiError",
    "BadRequest",
    "BodyTimeout",
    "BodyTooLarge",
    "ClientGone",
    "Conflict",
    "ErrorBody",
    "Forbidden",
    "Int64",
    "MalformedJson",
    "NonNegativeInt64",
    "NotFound",
    "PreconditionFailed",
    "PreconditionRequired",
    "Unauthorized",
    "Unavailable",
    "Unprocessable",
    "body_timeout_of",
    "error_response",
    "install_error_handlers",
    "parse_json",
    "read_body",
    "revision_of",
    "summarize_errors",
]

log = structlog.get_logger(__name__)

MAX_INT64 = 2**63 - 1

#: An integer a 64-bit database column can hold (query parameters: sequences, offsets, limits).
Int64 = Annotated[int, Field(ge=-MAX_INT64 - 1, le=MAX_INT64)]
NonNegativeInt64 = Annotated[int, Field(ge=0, le=MAX_INT64)]

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "body_timeout",
    409: "conflict",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    500: "internal_error",
    503: "unavailable",
}


class ErrorBody(BaseModel):
    """Every error response (documented in each service's OpenAPI)."""

    error: str
    detail: str


class ApiError(Exception):
    """A refusal with its HTTP status and stable wire ``code``. Subclass with class-level defaults, or
    pass ``status``/``code`` for a one-off; ``extra`` adds fields to the body (never echo a payload)."""

    status: ClassVar[int] = 400
    code: ClassVar[str] = "bad_request"

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        if status is not None:
            self.status = status  # type: ignore[misc]  # an instance may narrow its class default
        if code is not None:
            self.code = code  # type: ignore[misc]
        self._headers = dict(headers or {})
        self._extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "detail": self.detail, **self._extra}

    def headers(self) -> dict[str, str]:
        return dict(self._headers)


class BadRequest(ApiError):
    status = 400
    code = "bad_request"


class MalformedJson(ApiError):
    status = 400
    code = "malformed_json"


class Unauthorized(ApiError):
    status = 401
    code = "unauthorized"

    def __init__(self, detail: str, *, challenge: str = "Bearer", code: str | None = None) -> None:
        super().__init__(detail, code=code, headers={"WWW-Authenticate": challenge})


class Forbidden(ApiError):
    status = 403
    code = "forbidden"


class NotFound(ApiError):
    status = 404
    code = "not_found"


class Conflict(ApiError):
    status = 409
    code = "conflict"


class PreconditionFailed(ApiError):
    status = 412
    code = "precondition_failed"


class PreconditionRequired(ApiError):
    status = 428
    code = "precondition_required"


def revision_of(if_match: str | None, what: str) -> int | None:
    """``If-Match: "7"`` (or ``7``, or ``W/"7"``) -> 7; ``*`` or no header -> None (any revision); anything else
    is a 412 naming ``what`` ("the trigger"). The APIs' ETags are KV revisions (``temporality_service.openapi``'s
    ``if_match`` documents the same pattern)."""
    if if_match is None:
        return None
    value = if_match.strip()
    if value == "*":
        return None
    value = value.removeprefix("W/").strip('"')
    if not (value.isascii() and value.isdigit()) or len(value) > 18:  # "²".isdigit(), but int("²") raises
        raise PreconditionFailed(f"If-Match must be the ETag of {what} (a quoted revision), not {if_match[:40]!r}")
    return int(value)


class BodyTooLarge(ApiError):
    status = 413
    code = "body_too_large"


class ClientGone(ApiError):
    """The client closed the connection before its body arrived: logged as a refusal, not as a server error."""

    status = 400
    code = "client_disconnected"


class BodyTimeout(ApiError):
    """The body did not arrive within the deadline: answered, then the connection is closed (``Connection:
    close``), so a slow client cannot keep it open by trickling bytes."""

    status = 408
    code = "body_timeout"

    def __init__(self, detail: str) -> None:
        super().__init__(detail, headers={"Connection": "close"})


class Unprocessable(ApiError):
    status = 422
    code = "invalid_request"


class Unavailable(ApiError):
    status = 503
    code = "unavailable"

    def __init__(self, detail: str, *, code: str | None = None, retry_after_s: int | None = None) -> None:
        headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
        super().__init__(detail, code=code, headers=headers)
        self.retry_after_s = retry_after_s


# --------------------------------------------------------------------------- responses and handlers
def error_response(
    status: int, code: str, detail: str, headers: Mapping[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail, **extra}, status_code=status, headers=headers)


#: At most this many validation errors are named, each location part cut to this many characters: a
#: location can be the client's own key (an unexpected field), so an error never echoes the input at length.
_MAX_ERRORS = 5
_MAX_LOC_PART = 64


def summarize_errors(errors: Sequence[Any]) -> str:
    """pydantic/FastAPI errors as one sentence, e.g. ``query.limit: Input should be less than or equal to 1000``.

    Never includes the offending input (it may be a secret or a megabyte): the messages, and the
    locations cut short, of the first few errors, and how many more there were."""
    parts: list[str] = []
    for err in errors[:_MAX_ERRORS]:
        loc = ".".join(_clip(str(p), _MAX_LOC_PART) for p in err.get("loc", ()) if p != "body")
        msg = _clip(str(err.get("msg", "invalid")), 200)
        parts.append(f"{loc}: {msg}" if loc else msg)
    if len(errors) > _MAX_ERRORS:
        parts.append(f"and {len(errors) - _MAX_ERRORS} more errors")
    return "; ".join(parts) or "invalid request"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: The methods a 405's ``Allow`` may name (each probed against the app's routes).
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(request: Request, fallback: str) -> str:
    """Every method the app routes for this path. Starlette's 405 names only the first route whose path
    matched (``GET /triggers``), not the others on the same path (``POST /triggers``): RFC 9110 wants all.
    Each method is probed through the routes' own matching (included routers match as one route)."""
    routes = request.app.router.routes
    allowed = [
        method
        for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes)
    ]
    return ", ".join(allowed) if allowed else fallback


def install_error_handlers(app: FastAPI) -> None:
    """Make every error ``app`` can produce speak ``{"error", "detail"}`` with the right status."""

    async def _api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        if exc.status >= 500:
            log.warning("http.unavailable", path=request.url.path[:200], error=exc.code, detail=exc.detail)
        else:
            log.info("http.refused", path=request.url.path[:200], status=exc.status, error=exc.code)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers() or None)

    async def _validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(422, "invalid_request", summarize_errors(exc.errors()))

    async def _http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed_methods(request, headers.get("Allow", ""))
        return error_response(exc.status_code, code, str(exc.detail), headers or None)

    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug, never the caller's fault: logged with its traceback, answered without one.
        log.error("http.internal_error", path=request.url.path[:200], error=repr(exc)[:500], exc_info=exc)
        return error_response(500, "internal_error", "the server failed to handle this request; it was logged")

    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)


# --------------------------------------------------------------------------- bodies
#: How long reading one body may take when the app does not say (``app.state.body_timeout_s``, which the service
#: runtime sets from ``TEMPORALITY_HTTP_BODY_TIMEOUT_S``).
DEFAULT_BODY_TIMEOUT_S = 30.0


def body_timeout_of(request: Request) -> float:
    """How long reading ``request``'s body may take: its app's ``state.body_timeout_s`` (the service runtime sets it
    from ``TEMPORALITY_HTTP_BODY_TIMEOUT_S``), else :data:`DEFAULT_BODY_TIMEOUT_S`. For a route that reads a first
    message itself before :func:`read_body` (it must bound that wait too)."""
    state = getattr(request.scope.get("app"), "state", None)
    return float(getattr(state, "body_timeout_s", DEFAULT_BODY_TIMEOUT_S))


async def read_body(request: Request, limit: int, *, timeout_s: float | None = None) -> bytes:
    """The whole body, or :class:`BodyTooLarge` as soon as it exceeds ``limit`` bytes (declared or streamed), or
    :class:`BodyTimeout` when it is not complete ``timeout_s`` after this call (default: the app's
    ``state.body_timeout_s``, else :data:`DEFAULT_BODY_TIMEOUT_S`) -- an overall deadline, not one per chunk,
    so one byte every few seconds does not keep extending it."""
    if timeout_s is None:
        timeout_s = body_timeout_of(request)
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.strip().isdigit()):  # "²".isdigit(), but int("²") raises
            raise BadRequest("Content-Length is not a number")
        if int(declared) > limit:
            raise BodyTooLarge(f"the body ({int(declared)} bytes) exceeds the limit of {limit} bytes")
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise BodyTooLarge(f"the body exceeds the limit of {limit} bytes")
    except ClientDisconnect:
        raise ClientGone("the client closed the connection before the body was complete") from None
    except TimeoutError:
        log.info("http.body_timeout", path=request.url.path[:200], received=len(body), timeout_s=timeout_s)
        raise BodyTimeout(
            f"the request body was not complete after {timeout_s:g} s ({len(body)} bytes received); send it "
            "at once (the limit is TEMPORALITY_HTTP_BODY_TIMEOUT_S)"
        ) from None
    return bytes(body)


#: A form body (``a=1&b=2``, ``payload=%7B...``): names of ``[A-Za-z0-9_.-]`` and ``=`` at the start.
_FORM_START = re.compile(r"[A-Za-z0-9_.\-\[\]]{1,64}=")


def _looks_like(text: str) -> str:
    """A hint naming what a body that is not JSON looks like (XML, a form), so that a sender set to the wrong
    content type learns what to change; empty when it looks like nothing in particular. Never quotes the body."""
    start = text.lstrip()[:128]
    if start.startswith("<"):
        return " (it looks like XML: send the event as JSON, Content-Type: application/json)"
    if _FORM_START.match(start):
        return " (it looks like a form, application/x-www-form-urlencoded: send the event as JSON instead)"
    return ""


def parse_json(raw: bytes) -> Any:
    """UTF-8 JSON (a leading BOM is fine) into Python values; :class:`MalformedJson` for anything else.

    Refused: bytes that are not UTF-8, text that is not JSON, arrays/objects nested more than
    :data:`MAX_JSON_DEPTH` levels (a 10,000-deep array is a 400, never a ``RecursionError``), ``NaN``/``Infinity`` and
    numbers no float holds (``1e999999``), which Python's parser accepts but JSON has not, and escaped lone UTF-16
    surrogates (``"\\ud800"``), which no UTF-8 consumer downstream accepts. Everything runs in the C JSON
    codec: no per-character Python on the request path.
    """
    try:
        text = raw.decode("utf-8-sig")  # real Azure DevOps payloads may start with a BOM
    except UnicodeDecodeError:
        raise MalformedJson("the body is not UTF-8") from None
    too_deep = MalformedJson(f"the body is JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)")
    try:
        body = _DECODER.decode(text)
    except _NotJson as exc:
        raise MalformedJson(f"the body is not JSON: {exc}") from None
    except ValueError as exc:  # JSONDecodeError's message has the position, never the content
        raise MalformedJson(f"the body is not JSON: {exc}{_looks_like(text)}") from None
    except RecursionError:
        raise too_deep from None
    # Fewer brackets in the whole text than the limit (brackets in strings counted too): no need to look.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _deeper_than(body, MAX_JSON_DEPTH):
        raise too_deep
    if _SURROGATE_ESCAPE.search(text) is None:
        return body  # no \uD800-\uDFFF escape in the text: no lone surrogate can be in the values
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise MalformedJson("the body contains an unpaired UTF-16 surrogate escape") from None
    except RecursionError:
        raise too_deep from None
    return body


#: The deepest nesting of arrays and objects a JSON body may have (the top level is 1). Python's parser takes
#: up to ~1,000, but pydantic serializes at most ~255 levels: a deeper webhook payload parsed, then failed as a
#: 500 when its event was encoded (a sender retries a 500 for hours). No real payload comes near 128.
MAX_JSON_DEPTH = 128


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays/objects in ``value`` nest more than ``limit`` levels (iterative: no recursion limit)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


#: A UTF-16 surrogate escape (``\ud800``-``\udfff``, any case). Valid UTF-8 holds no raw surrogate, so only such
#: an escape can put one in the parsed values; without one the re-encoding check is skipped (one C scan). A
#: match is not proof (``\\ud800`` is an escaped backslash, a pair is fine): the re-encoding then decides.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


class _NotJson(ValueError):
    pass


def _not_json(constant: str) -> Any:
    raise _NotJson(f"{constant} is not a JSON value")


def _finite(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise _NotJson(f"the number {literal[:20]} does not fit a float")
    return value


#: Built once (``json.loads`` with hooks builds a decoder and its C scanner per call).
_DECODER = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)
