"""Refused API access into the audit trail: every 401/403 of the journal's role-token check becomes an
``api.access_refused`` event -- rate-limited, never with the token.

:class:`AuditedAuth` wraps the journal's :class:`~temporality_service.ApiAuth` (the ``AsViewer`` /
``AsOperator`` dependencies call it) and tells :class:`AccessAudit` of each refusal, with the request it
came with (:class:`RequestContext`, an ASGI middleware, keeps method, path and client address in a context
variable). The refusal itself is unchanged: the same 401/403 goes back at once; the event is published in
the background.

Rate limit, per caller -- the token's name for a 403, the client address for a 401 -- and fixed windows of
:data:`WINDOW_S` seconds: the first refusal of a caller in a window is published at once (``count`` 1); the
others in the window are only counted, and one event with their ``count`` follows when the window ends. At
most :data:`MAX_CALLERS` callers per window get events of their own; refusals of any further caller in that
window are counted under one event with ``address`` ``*`` (a scanner rotating addresses still makes at most
``MAX_CALLERS + 1`` first events and as many totals per window). Event ids derive from (caller, window,
first/total), so a republish is deduplicated by JetStream. Never logged or published: the token, a header,
a body.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime

import structlog
from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from temporality_bus import Bus
from temporality_journal.signin import SignIn
from temporality_protocol import ApiAccessRefused, Envelope, derive_id, make_event
from temporality_service import ApiAuth, Principal, Role
from temporality_service.http import Forbidden, Unauthorized

__all__ = ["MAX_CALLERS", "WINDOW_S", "AccessAudit", "AuditedAuth", "RequestContext"]

log = structlog.get_logger(__name__)

WINDOW_S = 60
MAX_CALLERS = 100
_OVERFLOW = "*"


@dataclass(frozen=True)
class _Request:
    method: str
    path: str
    address: str | None


_REQUEST: ContextVar[_Request | None] = ContextVar("journal_request", default=None)


class RequestContext:
    """ASGI middleware: the current request's method, path and client address, for :class:`AuditedAuth`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        token = _REQUEST.set(
            _Request(
                method=str(scope.get("method", ""))[:16],
                path=str(scope.get("path", ""))[:200],
                address=str(client[0]) if client else None,
            )
        )
        try:
            await self.app(scope, receive, send)
        finally:
            _REQUEST.reset(token)


@dataclass
class _Tally:
    status: int
    reason: str
    method: str
    path: str
    address: str | None
    principal: str | None
    role_needed: str | None
    first_at: datetime
    count: int = 1
    reported: int = 1  # refusals already in a published event


@dataclass
class AccessAudit:
    """Counts refusals per caller and window and publishes ``api.access_refused`` (module docstring)."""

    bus: Bus
    service: str = "journal"
    window_s: int = WINDOW_S
    max_callers: int = MAX_CALLERS
    clock: Callable[[], float] = time.time
    _window: int = -1
    _tallies: dict[str, _Tally] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def refused(
        self,
        *,
        status: int,
        reason: str,
        request: _Request | None,
        principal: str | None = None,
        role_needed: str | None = None,
    ) -> None:
        """Count one refusal (sync: called from the auth check); publishes in the background when due."""
        window = int(self.clock() // self.window_s)
        if window != self._window:
            self._close_window()
            self._window = window
        address = request.address if request is not None else None
        key = f"token:{principal}" if principal is not None else f"address:{address}"
        if key not in self._tallies and len(self._tallies) >= self.max_callers:
            key, address, principal = _OVERFLOW, _OVERFLOW, None
        tally = self._tallies.get(key)
        if tally is not None:
            tally.count += 1
            return
        tally = _Tally(
            status=status,
            reason=reason if key != _OVERFLOW else "many_callers",
            method=request.method if request is not None else "",
            path=request.path if request is not None else "",
            address=address,
            principal=principal,
            role_needed=role_needed,
            first_at=datetime.fromtimestamp(self.clock(), UTC),
        )
        self._tallies[key] = tally
        self._publish(key, tally, tally.count, "first")

    def refused_here(self, *, status: int, reason: str, principal: str | None = None) -> None:
        """:meth:`refused` for the request being served (its method, path and client address)."""
        self.refused(status=status, reason=reason, request=_REQUEST.get(), principal=principal)

    def _close_window(self) -> None:
        """Publish the totals of the window that ended (callers with refusals not yet in an event)."""
        for key, tally in self._tallies.items():
            if tally.count > tally.reported:
                self._publish(key, tally, tally.count, "total")
        self._tallies = {}

    def flush(self) -> None:
        """Close the window if it has ended (the background loop calls this; so does a new refusal)."""
        if self._window != -1 and int(self.clock() // self.window_s) != self._window:
            self._close_window()
            self._window = -1

    def _publish(self, key: str, tally: _Tally, count: int, which: str) -> None:
        tally.reported = count
        data = ApiAccessRefused(
            service=self.service,
            status=403 if tally.status == 403 else 401,
            reason=tally.reason,
            method=tally.method,
            path=tally.path,
            address=tally.address,
            principal=tally.principal,
            role_needed=tally.role_needed,
            count=count,
            first_at=tally.first_at,
            window_s=self.window_s,
        )
        event = make_event(
            data,
            source=f"/temporality/{self.service}",
            id=derive_id("evt", ApiAccessRefused.EVENT_TYPE, self.service, key, str(self._window), which),
            actor=key if key != _OVERFLOW else None,
        )
        task = asyncio.get_running_loop().create_task(self._send(event))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, event: Envelope) -> None:
        try:
            await self.bus.publish(event)
        except Exception as exc:  # the refusal was answered; the audit event is best effort, and says so
            log.warning("access.audit_unpublished", ce_id=event.id, error=repr(exc))

    async def drain(self) -> None:
        """Wait for the events being published (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Close each window when it ends, in the background, for the duration of the block."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(max(1.0, self.window_s / 4))
                self.flush()

        task = asyncio.create_task(loop(), name="journal-access-audit")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._close_window()
            await self.drain()


class AuditedAuth(ApiAuth):
    """The journal's token check, telling :class:`AccessAudit` of each refusal (then refusing as before);
    with ``signin``, a request without ``Authorization`` may be admitted by its sign-in session instead
    (:mod:`temporality_journal.signin`: the person's role, the console header on a call that changes something)."""

    def __init__(self, inner: ApiAuth, audit: AccessAudit, signin: SignIn | None = None) -> None:
        self._inner = inner  # no super().__init__: it delegates
        self._audit = audit
        self._signin = signin

    def authorize_request(self, request: Request, authorization: str | None, role: Role) -> Principal:
        person = self._signin.person(request) if self._signin is not None and authorization is None else None
        if person is None:
            return self.authorize(authorization, role)
        principal = person.principal()
        try:
            SignIn.check_csrf(request)
            if principal is None or not principal.may(role):
                has = "no role (only your inbox)" if principal is None else f"the {principal.role} role"
                raise Forbidden(f"this needs the {role} role; you ({person.user_id}) have {has}")
        except Forbidden as exc:
            self._audit.refused(
                status=403,
                reason=exc.code,
                request=_REQUEST.get(),
                principal=person.principal_name,
                role_needed=str(role),
            )
            raise
        return principal

    @property
    def audit(self) -> AccessAudit:
        """Where refusals go (the password sign-in's too)."""
        return self._audit

    @property
    def configured(self) -> bool:
        return self._inner.configured

    def authenticate(self, authorization: str | None) -> Principal:
        return self._inner.authenticate(authorization)

    def authorize(self, authorization: str | None, role: Role) -> Principal:
        try:
            return self._inner.authorize(authorization, role)
        except Unauthorized as exc:
            self._audit.refused(status=401, reason=exc.code, request=_REQUEST.get(), role_needed=str(role))
            raise
        except Forbidden as exc:
            principal = self._inner.authenticate(authorization).name
            self._audit.refused(
                status=403, reason=exc.code, request=_REQUEST.get(), principal=principal, role_needed=str(role)
            )
            raise
