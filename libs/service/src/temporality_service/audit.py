"""Refusals into the audit trail (issue 11, SEC-1/AP-11): every service publishes what it refused, rate-limited,
never with the credential; the journal lists them in ``GET /audit``.

One :class:`AccessAudit` per service process (the service runtime makes it once the bus is connected:
``Runtime.access_audit``) records

* every 401/403 of the role-token check (:meth:`temporality_service.auth.ApiAuth.admit`, which the
  ``AsViewer`` / ``AsOperator`` / ``AsAdmin`` dependencies call; the runtime puts its audit on each app it
  serves, ``app.state.access_audit``) as ``api.access_refused``;
* a webhook delivery the trigger-gateway refused for its credentials or signature (401) as
  ``api.access_refused`` too (:meth:`AccessAudit.refused` with ``channel="webhook"``: counted apart from the
  API's refusals of the same address);
* a person's inbox token (or the journal's vouch for a signed-in person) human-interaction refused (401) on
  ``/inbox`` and ``/requests/…``, with ``channel="inbox"``, counted apart the same way;
* every permissions violation the NATS server reports on the service's own connection (a publish or
  subscription its NATS user may not make: :meth:`AccessAudit.nats_error`, one of the bus's
  ``error_listeners``) as ``bus.permission_refused``.

The refusal itself is unchanged: the same 401/403 goes back at once, the event is published in the background
(best effort: a failed publish is logged, ``access.audit_unpublished``).

Rate limit, per caller and what was refused -- for a request the (caller, path, reason): the token's name for a
403, the client address for a 401; the (operation, subject) for NATS -- and fixed windows of :data:`WINDOW_S`
seconds: the first refusal of each in a window is published at once (``count`` 1); the others in the window are
only counted, and one event with their ``count`` follows when the window ends. Keyed by path and reason too, so
behind an ingress (every sender one address) a misconfigured hook's 401s are not folded into another's. At most
:data:`MAX_PATHS` (path, reason) pairs of one caller per window get events of their own (the caller's further ones
are counted under one event with ``path`` ``*`` and reason ``many_paths``), and at most :data:`MAX_CALLERS` events
of each kind per window in all; refusals past that are counted under one event with ``address`` (``subject``)
``*`` (a scanner rotating addresses or paths still makes at most ``MAX_CALLERS + 1`` first events and as many
totals per window). Event ids derive from (this process, kind, caller, path, reason, window, first/total), so a
republish is deduplicated by JetStream and two replicas never take each other's event for a copy. Never logged or
published: the token, a header, a signature, a body.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

import structlog
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from temporality_bus import Bus
from temporality_protocol import ApiAccessRefused, BusPermissionRefused, Envelope, EventData, derive_id, make_event
from temporality_protocol.catalog import REFUSALS, service_source, subject_for

__all__ = [
    "MAX_CALLERS",
    "MAX_PATHS",
    "OVERFLOW",
    "WINDOW_S",
    "AccessAudit",
    "RefusedRequest",
    "RequestContext",
    "Windowed",
    "audit_refusal",
    "permission_violation",
]

log = structlog.get_logger(__name__)

WINDOW_S = 60
#: Events of their own per kind of refusal and window (then one for the rest: :data:`OVERFLOW`).
MAX_CALLERS = 100
#: (path, reason) pairs of one caller with events of their own per window (then one for the rest: ``many_paths``).
MAX_PATHS = 10
#: The caller of the event that counts every caller past :data:`MAX_CALLERS` in a window.
OVERFLOW = "*"

#: The subjects of the audit events themselves: a refusal to publish one is only logged (no audit of the audit).
_OWN_SUBJECTS = frozenset(subject_for(t) for t in REFUSALS)
#: What nats-server says (nats-py hands it over as ``nats: <message>``): ``Permissions Violation for Publish to
#: "x"``, ``... for Subscription to "x" using queue "q"``, ``... for Publish with Reply of "x"``.
_VIOLATION = re.compile(
    r'permissions violation for (publish|subscription) (?:to|with reply of) "([^"]*)"(?: using queue "([^"]*)")?',
    re.IGNORECASE,
)


@dataclass(frozen=True)
class RefusedRequest:
    """What the audit keeps of a refused request: method, path and client address (never a header or body)."""

    method: str
    path: str
    address: str | None

    @classmethod
    def of(cls, request: HTTPConnection) -> RefusedRequest:
        return cls.of_scope(request.scope)

    @classmethod
    def of_scope(cls, scope: Scope) -> RefusedRequest:
        client = scope.get("client")
        return cls(
            method=str(scope.get("method", ""))[:16],
            path=str(scope.get("path", ""))[:200],
            address=str(client[0]) if client else None,
        )


_REQUEST: ContextVar[RefusedRequest | None] = ContextVar("refused_request", default=None)


class RequestContext:
    """ASGI middleware: the current request's method, path and client address, for :meth:`AccessAudit.refused_here`
    (a refusal decided away from the request object: the journal's password sign-in)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = _REQUEST.set(RefusedRequest.of_scope(scope))
        try:
            await self.app(scope, receive, send)
        finally:
            _REQUEST.reset(token)


def permission_violation(error: Exception | str) -> tuple[Literal["publish", "subscribe"], str, str | None] | None:
    """``(operation, subject, queue)`` of a NATS permissions violation error, ``None`` for any other error."""
    found = _VIOLATION.search(str(error))
    if found is None:
        return None
    operation: Literal["publish", "subscribe"] = "publish" if found.group(1).lower() == "publish" else "subscribe"
    return operation, found.group(2), found.group(3)


class Windowed:
    """Counting in windows of ``window_s`` seconds of ``clock``, with what a window's end publishes sent in the
    background: the mechanism of :class:`AccessAudit` and of agent-collab's refusal limits. A subclass (a
    dataclass) holds the attributes declared here and says what closing a window publishes."""

    window_s: int
    clock: Callable[[], float]
    _window: int  # -1: no window open
    _tasks: set[asyncio.Task[None]]
    #: How often the background loop of :meth:`running` looks for a window that ended: ``window_s`` divided by
    #: this, at least :attr:`MIN_TICK_S`.
    TICKS_PER_WINDOW: ClassVar[int] = 4
    MIN_TICK_S: ClassVar[float] = 1.0

    def _close_window(self) -> None:
        raise NotImplementedError

    def _roll(self) -> None:
        """Close the window that ended, if one did, and open the current one."""
        window = int(self.clock() // self.window_s)
        if window != self._window:
            self._close_window()
            self._window = window

    def flush(self) -> None:
        """Close the window if it has ended (the background loop calls this; so does a new count)."""
        if self._window != -1 and int(self.clock() // self.window_s) != self._window:
            self._close_window()
            self._window = -1

    def _in_background(self, send: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(send)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for the events being published (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks))

    def _loop_name(self) -> str:
        return type(self).__name__

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Close each window when it ends, in the background, for the duration of the block; on the way out
        publish the totals still counted and wait for them."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(max(self.MIN_TICK_S, self.window_s / self.TICKS_PER_WINDOW))
                self.flush()

        task = asyncio.create_task(loop(), name=self._loop_name())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._close_window()
            await self.drain()


@dataclass
class _Tally:
    model: type[EventData]
    fields: dict[str, Any]
    actor: str | None
    first_at: datetime
    count: int = 1
    reported: int = 1  # refusals already in a published event


@dataclass
class AccessAudit(Windowed):
    """Counts one service's refusals per caller and window and publishes them (module docstring)."""

    bus: Bus
    service: str
    window_s: int = WINDOW_S
    max_callers: int = MAX_CALLERS
    max_paths: int = MAX_PATHS
    clock: Callable[[], float] = time.time
    _window: int = -1
    #: kind of refusal (``api``, ``webhook``, ``nats``) -> key (caller, path, reason) -> its tally in the window
    _tallies: dict[str, dict[str, _Tally]] = field(default_factory=dict)
    #: kind of refusal -> caller -> how many keys of its own it has in the window (at most ``max_paths`` + 1)
    _keys_of: dict[str, dict[str, int]] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    #: This process's part of the event ids (replicas count apart; a republish keeps its id).
    _instance: str = field(default_factory=lambda: secrets.token_hex(6))

    # ------------------------------------------------------------------ what is refused
    def refused(
        self,
        *,
        status: int,
        reason: str,
        request: RefusedRequest | None,
        principal: str | None = None,
        role_needed: str | None = None,
        channel: Literal["api", "webhook", "inbox"] = "api",
    ) -> None:
        """Count one refused request (sync: called from the check); publishes in the background when due."""
        address = request.address if request is not None else None
        if principal is None:
            actor = f"address:{address}"
        elif principal.startswith(("user:", "unknown-user:")):  # a person (or a sign-in's unknown id), not a token
            actor = principal
        else:
            actor = f"token:{principal}"
        fields: dict[str, Any] = {
            "service": self.service,
            "status": 403 if status == 403 else 401,
            "reason": reason[:64],
            "method": request.method if request is not None else "",
            "path": request.path if request is not None else "",
            "address": address,
            "principal": principal,
            "role_needed": role_needed,
        }
        overflow = {"address": OVERFLOW, "principal": None, "reason": "many_callers"}
        key = f"{actor}\n{fields['path']}\n{fields['reason']}"
        many_paths = (f"{actor}\n{OVERFLOW}", {"method": OVERFLOW, "path": OVERFLOW, "reason": "many_paths"})
        self._count(channel, key, actor, ApiAccessRefused, fields, overflow, caller=actor, many_paths=many_paths)

    def refused_here(self, *, status: int, reason: str, principal: str | None = None) -> None:
        """:meth:`refused` for the request being served (its method, path and address: :class:`RequestContext`)."""
        self.refused(status=status, reason=reason, request=_REQUEST.get(), principal=principal)

    def nats_error(self, error: Exception) -> None:
        """A bus error listener (``bus.error_listeners``): counts each permissions violation the server reports on
        the service's connection; other errors are not refusals (the bus logged them)."""
        violation = permission_violation(error)
        if violation is None:
            return
        operation, subject, queue = violation
        if subject in _OWN_SUBJECTS:  # the audit event itself was refused: a misconfigured server, logged only
            log.warning("access.audit_refused_by_nats", subject=subject)
            return
        fields: dict[str, Any] = {"service": self.service, "operation": operation, "subject": subject[:200]}
        if queue is not None:
            fields["queue"] = queue[:200]
        overflow = {"subject": OVERFLOW, "queue": None}
        actor = f"service:{self.service}"  # its NATS user is the service's own
        self._count("nats", f"{operation}:{subject[:200]}", actor, BusPermissionRefused, fields, overflow)

    def watch(self, bus: Bus) -> None:
        """Count the permissions violations reported on ``bus``'s connection."""
        bus.error_listeners.append(self.nats_error)

    # ------------------------------------------------------------------ windows and events
    def _count(
        self,
        kind: str,
        key: str,
        actor: str | None,
        model: type[EventData],
        fields: dict[str, Any],
        overflow: dict[str, Any],
        *,
        caller: str | None = None,
        many_paths: tuple[str, dict[str, Any]] | None = None,
    ) -> None:
        """Count one refusal under ``key``; a ``caller`` with ``max_paths`` keys already counts a new one under
        ``many_paths`` (its key and fields); past ``max_callers`` keys in all, under :data:`OVERFLOW`."""
        self._roll()
        tallies = self._tallies.setdefault(kind, {})
        if key not in tallies and caller is not None and many_paths is not None:
            keys_of = self._keys_of.setdefault(kind, {})
            if keys_of.get(caller, 0) >= self.max_paths:
                key, fields = many_paths[0], {**fields, **many_paths[1]}
            if key not in tallies and len(tallies) < self.max_callers:
                keys_of[caller] = keys_of.get(caller, 0) + 1
        if key not in tallies and len(tallies) >= self.max_callers:
            key, fields = OVERFLOW, {**fields, **overflow}
            actor = None if kind != "nats" else actor  # many callers: nobody in particular
        tally = tallies.get(key)
        if tally is not None:
            tally.count += 1
            return
        tally = _Tally(model, fields, actor, datetime.fromtimestamp(self.clock(), UTC))
        tallies[key] = tally
        self._publish(kind, key, tally, "first")

    def _close_window(self) -> None:
        """Publish the totals of the window that ended (callers with refusals not yet in an event)."""
        for kind, tallies in self._tallies.items():
            for key, tally in tallies.items():
                if tally.count > tally.reported:
                    self._publish(kind, key, tally, "total")
        self._tallies = {}
        self._keys_of = {}

    def _loop_name(self) -> str:
        return f"{self.service}-access-audit"

    def _publish(self, kind: str, key: str, tally: _Tally, which: str) -> None:
        tally.reported = tally.count
        data = tally.model(**tally.fields, count=tally.count, first_at=tally.first_at, window_s=self.window_s)
        event = make_event(
            data,
            source=service_source(self.service),
            id=derive_id(
                "evt", tally.model.EVENT_TYPE, self.service, self._instance, kind, key, str(self._window), which
            ),
            actor=tally.actor,
        )
        self._in_background(self._send(event))

    async def _send(self, event: Envelope) -> None:
        try:
            await self.bus.publish(event)
        except Exception as exc:  # the refusal was answered; the audit event is best effort, and says so
            log.warning("access.audit_unpublished", ce_id=event.id, type=event.type, error=repr(exc))


def audit_refusal(
    request: HTTPConnection,
    *,
    status: int,
    reason: str,
    channel: Literal["api", "webhook", "inbox"] = "api",
    principal: str | None = None,
    role_needed: str | None = None,
) -> None:
    """Tell the app's :class:`AccessAudit` (``app.state.access_audit``: the service runtime's, when it serves the
    app; none in an app built alone) of a refused ``request``: its method, path and address only."""
    audit = getattr(request.app.state, "access_audit", None)
    if isinstance(audit, AccessAudit):
        audit.refused(
            status=status,
            reason=reason,
            request=RefusedRequest.of(request),
            principal=principal,
            role_needed=role_needed,
            channel=channel,
        )
