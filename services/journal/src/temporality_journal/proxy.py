"""Allow-listed forwarding to another service's HTTP API, for the console (its CSP allows ``connect-src
'self'`` only): one :class:`Upstream` per peer, two allow-lists built on it.

=====================================  ====================================  =================================
allow-list                             routes                                peer (setting)
=====================================  ====================================  =================================
:mod:`temporality_journal.gateway`     ``/gateway/triggers...``              trigger-gateway's admin API
                                                                             (``TEMPORALITY_JOURNAL_GATEWAY_URL``)
:mod:`temporality_journal.human`       ``/human/inbox``, ``/human/requests``  human-interaction's web inbox
                                                                             (``TEMPORALITY_JOURNAL_HUMAN_URL``)
=====================================  ====================================  =================================

What every forwarded request shares (the allow-lists decide only which paths and methods exist, and how
the caller must authenticate):

- The upstream URL is built by the allow-list from validated ids, never from the request's path; a path
  with any percent-escape is refused before anything else (no valid id needs one: no ``..`` or ``%2F``).
- Only the named request headers go out (as the raw bytes received: the peer judges them) and only the
  named response headers come back; the peer's status and body come back as they are.
- A request body over ``TEMPORALITY_JOURNAL_MAX_BODY_BYTES`` is a 413; the peer's URL unset is a 503
  ``<peer>_not_configured``; the peer unreachable, refusing or silent for :data:`TIMEOUT_S` is a 502
  ``<peer>_unreachable``, an answer over :data:`MAX_ANSWER_BYTES` a 502 ``<peer>_answer_too_large``.
- Each forwarded request is logged (``<peer>.proxied``) with its method, route template, status and
  duration -- never a header or a body.
- **Trace context** (W3C ``traceparent``/``tracestate``, issue 11): with tracing on, each forwarded request is
  a CLIENT span ``<METHOD> <peer route>`` (``http.request.method``, ``server.address``/``server.port``,
  ``url.template``, ``http.response.status_code``; an error status for a 5xx or no answer), the child of the
  journal's SERVER span of the incoming request -- or, where there is none, of the caller's own
  ``traceparent`` -- and the peer gets that span's context in its headers: the peer's SERVER span continues
  the caller's trace through the journal. With tracing off the caller's ``traceparent``/``tracestate`` go to
  the peer unchanged, as any intermediary that takes no part passes them on.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass

import httpx
import structlog
from fastapi import Request
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode
from starlette.responses import Response

from temporality_bus import tracing
from temporality_service import ApiError, NotFound, Unavailable, read_body

__all__ = [
    "ALL_METHODS",
    "MAX_ANSWER_BYTES",
    "TIMEOUT_S",
    "AnswerRewrite",
    "MethodNotAllowed",
    "ShapeList",
    "Upstream",
    "upstream_client",
]

log = structlog.get_logger(__name__)

#: httpx's timeout of each phase of a forwarded request (connect, write, every read, pool), in seconds.
TIMEOUT_S = 10.0
#: A peer's answer larger than this is not passed on (502): a page of triggers or an inbox is far smaller.
MAX_ANSWER_BYTES = 4 * 1024 * 1024
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

#: Rewrites a successful answer's body before it is returned (status, body) -> body; e.g. the inbox
#: items get what the journal knows of their timeout policy.
AnswerRewrite = Callable[[int, bytes], Awaitable[bytes]]


#: The W3C Trace Context headers (lower case, as in the ASGI scope).
TRACE_HEADERS = frozenset(("traceparent", "tracestate"))


@contextlib.contextmanager
def client_span(request: Request, method: str, route: str, client: httpx.AsyncClient) -> Iterator[Span | None]:
    """With tracing on, a CLIENT span ``<method> <route>`` around a forwarded request, the child of the current
    span, or of the request's own ``traceparent`` when no span is current (the journal's SERVER span exists only
    with a global tracer provider); set as current, so :func:`trace_headers` carries it. Off: nothing."""
    if not tracing.enabled():
        yield None
        return
    parent = None
    if not trace.get_current_span().get_span_context().is_valid:
        parent = tracing.context_of(request.headers.get("traceparent"), request.headers.get("tracestate"))
    url = client.base_url
    attributes: dict[str, str | int] = {
        "http.request.method": method,
        "server.address": url.host,
        "url.template": route,
    }
    if url.port is not None:
        attributes["server.port"] = url.port
    with tracing.tracer().start_as_current_span(
        f"{method} {route}", context=parent, kind=SpanKind.CLIENT, attributes=attributes
    ) as span:
        yield span


def trace_headers(request: Request) -> list[tuple[bytes, bytes]]:
    """The trace context the forwarded request carries: the current (CLIENT) span's with tracing on, else the
    caller's ``traceparent``/``tracestate`` as they came."""
    if tracing.enabled():
        current = tracing.current_trace()
        if current is None:
            return []
        traceparent, tracestate = current
        return [(b"traceparent", traceparent.encode())] + ([(b"tracestate", tracestate.encode())] if tracestate else [])
    return [(key, value) for key, value in request.scope["headers"] if key.decode("latin-1") in TRACE_HEADERS]


#: An allow-list's path shapes (under its prefix) with their methods: another method on one is a 405.
ShapeList = tuple[tuple[re.Pattern[str], tuple[str, ...]], ...]


class MethodNotAllowed(ApiError):
    status = 405
    code = "method_not_allowed"


def upstream_client(url: object | None) -> httpx.AsyncClient | None:
    """The one client every request to a peer shares (enter it as a resource), or None when no URL is set."""
    if url is None:
        return None
    return httpx.AsyncClient(base_url=str(url), timeout=TIMEOUT_S, follow_redirects=False)


@dataclass(frozen=True)
class Upstream:
    """How the journal forwards to one peer: ``name`` (``gateway``, ``human``) prefixes the error codes
    and log events; ``label`` names the peer in sentences; ``setting`` is the variable of its URL."""

    name: str
    label: str
    setting: str
    client: httpx.AsyncClient | None
    max_body_bytes: int
    request_headers: frozenset[str]
    response_headers: tuple[str, ...]
    #: (prefix, replacement) for a ``Location`` the peer answers with (e.g. ``/triggers`` -> ``/gateway/triggers``).
    location: tuple[str, str] | None = None

    def no_route(self) -> NotFound:
        return NotFound(f"no such route under /{self.name}/ (see docs/journal.md)", code=f"{self.name}_route_not_found")

    def _unreachable(self, detail: str) -> ApiError:
        return ApiError(detail, status=502, code=f"{self.name}_unreachable")

    async def forward(
        self,
        request: Request,
        method: str,
        route: str,
        upstream: str,
        *,
        body: bool = False,
        params: Mapping[str, str] | None = None,
        rewrite: AnswerRewrite | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> Response:
        """Send ``method upstream`` to the peer and return its answer (``route``: the template, for the log);
        ``extra_headers`` go out beside the allow-listed ones the request brought (never logged either)."""
        raw_path = request.scope.get("raw_path") or request.url.path.encode()
        if b"%" in raw_path.split(b"?", 1)[0]:  # no id needs escaping: %2F and %2E%2E tricks end here
            raise self.no_route()
        if self.client is None:
            raise Unavailable(
                f"the {self.label} is not reachable from the journal: set {self.setting} to its URL",
                code=f"{self.name}_not_configured",
            )
        content = await read_body(request, self.max_body_bytes) if body else None
        # The raw bytes as received (a value need not be ASCII: the peer judges it, httpx must not choke).
        headers = [
            (key, value) for key, value in request.scope["headers"] if key.decode("latin-1") in self.request_headers
        ]
        headers += [
            (key.lower().encode("latin-1"), value.encode("latin-1")) for key, value in (extra_headers or {}).items()
        ]
        with client_span(request, method, route, self.client) as span:
            headers += trace_headers(request)
            return await self._exchange(method, route, upstream, params, headers, content, rewrite, span)

    async def _exchange(
        self,
        method: str,
        route: str,
        upstream: str,
        params: Mapping[str, str] | None,
        headers: list[tuple[bytes, bytes]],
        content: bytes | None,
        rewrite: AnswerRewrite | None,
        span: Span | None,
    ) -> Response:
        assert self.client is not None
        started = time.monotonic()
        outgoing = self.client.build_request(method, upstream, params=params or None, headers=headers, content=content)
        try:
            answer = await self.client.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            log.warning(f"{self.name}.unreachable", method=method, route=route, error=type(exc).__name__)
            if span is not None:
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(StatusCode.ERROR)
            raise self._unreachable(f"the {self.label} did not answer ({type(exc).__name__}); retry later") from None
        if span is not None:
            span.set_attribute("http.response.status_code", answer.status_code)
            if answer.status_code >= 500:
                span.set_attribute("error.type", str(answer.status_code))
                span.set_status(StatusCode.ERROR)
        try:
            received = bytearray()
            async for chunk in answer.aiter_bytes():
                received += chunk
                if len(received) > MAX_ANSWER_BYTES:
                    log.warning(f"{self.name}.answer_too_large", method=method, route=route, status=answer.status_code)
                    raise ApiError(
                        f"the {self.label}'s answer exceeds {MAX_ANSWER_BYTES} bytes",
                        status=502,
                        code=f"{self.name}_answer_too_large",
                    )
        except httpx.HTTPError as exc:
            log.warning(f"{self.name}.unreachable", method=method, route=route, error=type(exc).__name__)
            raise self._unreachable(
                f"the {self.label} broke off its answer ({type(exc).__name__}); retry later"
            ) from None
        finally:
            await answer.aclose()
        returned = {key: answer.headers[key] for key in self.response_headers if key in answer.headers}
        location = answer.headers.get("location")
        if self.location is not None and location is not None and location.startswith(self.location[0]):
            returned["location"] = self.location[1] + location[len(self.location[0]) :]
        content_out = bytes(received)
        if rewrite is not None and answer.status_code == 200:
            content_out = await rewrite(answer.status_code, content_out)
        log.info(
            f"{self.name}.proxied",
            method=method,
            route=route,
            status=answer.status_code,
            duration_ms=round((time.monotonic() - started) * 1000, 1),
        )
        return Response(content=content_out, status_code=answer.status_code, headers=returned)

    def refuse_elsewhere(self, method: str, rest: str, shapes: ShapeList) -> ApiError:
        """The error for a path under the prefix the allow-list does not route: a 405 (``Allow``) when the
        path is allow-listed for other methods, else the 404."""
        for shape, methods in shapes:
            if shape.fullmatch(rest) and method not in methods:
                return MethodNotAllowed(
                    f"{method} is not allowed here; {', '.join(methods)} are",
                    headers={"Allow": ", ".join(methods)},
                )
        return self.no_route()
