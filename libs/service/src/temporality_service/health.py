"""``/healthz`` (liveness) and ``/readyz`` (readiness) of every service.

=============  =========================================================================================
``/healthz``   200 while the process's event loop answers: ``{"status": "ok", "service", "nats"}``.
               Liveness only: a NATS outage must not make Kubernetes restart every pod at once.
``/readyz``    200 ``{"status": "ready", ...}`` once the runtime has started every consumer, responder
               and the HTTP server, while NATS is connected and every readiness check (e.g. the
               journal's database) passes; otherwise 503 ``{"error": "not_ready", "detail": <why>}``
               with the same fields, plus any a service adds (:meth:`Readiness.add_field`: the journal's
               ``backlog``). Not ready again from the moment SIGTERM arrives.
=============  =========================================================================================

A failing readiness check's reason in ``detail`` says what the check raised, e.g. ``mcp servers failing: not
listed yet (...): agent reviewer: mcp server notes: could not list its tools: ...``: its first
:data:`MAX_CHECK_DETAIL` characters, with secrets redacted (the built-in patterns and the deployment's own,
:func:`temporality_protocol.redaction.process_redactor`); ``{name} does not answer within 2s`` for one that hangs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from temporality_bus import Bus, Consumer
from temporality_protocol.redaction import PatternError, Redactor, process_redactor

if TYPE_CHECKING:
    from temporality_service.runtime import Responder

__all__ = ["Readiness", "add_health_routes"]

log = structlog.get_logger(__name__)

#: A readiness check that takes longer than this counts as failed.
CHECK_TIMEOUT_S = 2.0
#: The most characters of a failing check's error in ``/readyz``'s ``detail``.
MAX_CHECK_DETAIL = 500


def _check_detail(exc: BaseException) -> str:
    """What a failing check raised, as ``/readyz`` may show it: redacted, bounded."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    try:
        redactor = process_redactor()
    except PatternError:  # the deployment's patterns are broken (the publishers refuse to start): the built-in ones
        redactor = Redactor()
    text = redactor.redact(text).text
    return text if len(text) <= MAX_CHECK_DETAIL else text[: MAX_CHECK_DETAIL - 1] + "…"


class Readiness:
    """What ``/readyz`` reports; the runtime sets :attr:`ready` once everything runs, clears it at stop."""

    def __init__(self, service: str, bus: Bus) -> None:
        self.service = service
        self.bus = bus
        self.ready = False
        self._consumers: list[Consumer] = []
        self._responders: list[Responder] = []
        self._checks: dict[str, Callable[[], Awaitable[None]]] = {}
        self._fields: dict[str, Callable[[], Any]] = {}

    def watch_consumer(self, consumer: Consumer) -> None:
        self._consumers.append(consumer)

    def watch_responder(self, responder: Responder) -> None:
        self._responders.append(responder)

    def add_check(self, name: str, check: Callable[[], Awaitable[None]]) -> None:
        self._checks[name] = check

    def add_field(self, name: str, value: Callable[[], Any]) -> None:
        """One more field of ``/readyz``'s answer (ready or not), ``value()`` at each ask: cheap, never waiting (the
        journal's ``backlog``, a cached count)."""
        self._fields[name] = value

    @property
    def nats(self) -> str:
        return "connected" if self.bus.nc.is_connected else "disconnected"

    async def report(self) -> tuple[bool, dict[str, Any], list[str]]:
        """(ready, the fields of the answer, the reasons it is not ready)."""
        reasons: list[str] = []
        if not self.ready:
            reasons.append("the service is starting or stopping")
        if not self.bus.nc.is_connected:
            reasons.append("NATS is not connected")
        consumers = {c.spec.durable: "running" if c.running.is_set() else "not running" for c in self._consumers}
        reasons += [f"consumer {name} is not running" for name, state in consumers.items() if state != "running"]
        responders = {r.subject: "running" if r.running.is_set() else "not running" for r in self._responders}
        reasons += [f"responder {name} is not running" for name, state in responders.items() if state != "running"]
        checks: dict[str, str] = {}
        for name, check in self._checks.items():
            try:
                async with asyncio.timeout(CHECK_TIMEOUT_S):
                    await check()
            except TimeoutError:
                log.warning("readiness.check_failed", check=name, error=f"no answer within {CHECK_TIMEOUT_S:g}s")
                checks[name] = "failing"
                reasons.append(f"{name} does not answer within {CHECK_TIMEOUT_S:g}s")
            except Exception as exc:  # any failure means "not ready"; the answer says which check and why
                detail = _check_detail(exc)
                log.warning("readiness.check_failed", check=name, error=f"{type(exc).__name__}: {detail}")
                checks[name] = "failing"
                reasons.append(f"{name} failing: {detail}")
            else:
                checks[name] = "ok"
        fields: dict[str, Any] = {
            "service": self.service,
            "nats": self.nats,
            "consumers": consumers,
            "responders": responders,
            "checks": checks,
        }
        for name, value in self._fields.items():
            fields[name] = value()
        return not reasons, fields, reasons


def add_health_routes(app: FastAPI, readiness: Readiness) -> None:
    @app.get("/healthz", tags=["health"], summary="Liveness: the process answers")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "service": readiness.service, "nats": readiness.nats}

    @app.get("/readyz", tags=["health"], summary="Readiness: consumers run, NATS connected, checks pass")
    async def readyz() -> JSONResponse:
        ready, fields, reasons = await readiness.report()
        if ready:
            return JSONResponse({"status": "ready", **fields})
        return JSONResponse({"error": "not_ready", "detail": "; ".join(reasons), **fields}, status_code=503)
