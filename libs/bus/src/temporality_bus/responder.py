"""The typed request/reply runner: the counterpart of :class:`~temporality_bus.Consumer` for RPC subjects.

A :class:`Responder` subscribes one subject in a queue group (N replicas share the load), decodes
each request with a pydantic model, negotiates the protocol version (PRO-3), calls a typed async
handler and replies with a pydantic model. Every request that carries a reply subject gets exactly
one reply:

==================================  ==========================================================
request                             reply (built by ``on_error`` from a :class:`Failure`)
==================================  ==========================================================
not valid for the model             ``Failure("malformed", detail)``; ``request`` is None
no common protocol version          ``Failure("unsupported_version", str(refusal))`` (PRO-3)
the handler raised                  ``Failure("internal", "<ExceptionType>")``, logged with its trace
cut off by :meth:`~Responder.stop`  ``Failure("stopped", ...)``: it outlived the drain timeout
otherwise                           what the handler returned
==================================  ==========================================================

Unparseable versions a requester declares are ignored (an unknown version is not fatal); a
requester that declares none speaks :data:`~temporality_protocol.version.PROTOCOL_VERSION`.

Lifecycle: :meth:`Responder.start` subscribes and flushes, so the server knows the interest before
:attr:`Responder.running` is set and the service reports ready; :meth:`Responder.stop` drains:
interest goes first (new requests reach other replicas), then the requests already received are
answered.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import BaseModel, ValidationError

from temporality_bus import tracing
from temporality_bus.connection import Bus
from temporality_protocol import IncompatibleProtocolVersion
from temporality_protocol.version import PROTOCOL_VERSION, SUPPORTED_VERSIONS, negotiate, parse_version

__all__ = ["Failure", "FailureKind", "Request", "Responder", "validation_detail", "written_out"]

log = structlog.get_logger(__name__)

Q = TypeVar("Q", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)

FailureKind = Literal["malformed", "unsupported_version", "internal", "stopped"]


@dataclass(frozen=True)
class Request(Generic[Q]):
    """What the handler gets: the decoded request, the negotiated version and the raw message."""

    body: Q
    #: The highest version both sides speak (``None`` when the responder does not negotiate).
    version: str | None
    msg: Msg

    @property
    def subject(self) -> str:
        return str(self.msg.subject)


@dataclass(frozen=True)
class Failure:
    """Why a request got no handler reply; ``on_error`` turns it into the reply model."""

    kind: FailureKind
    #: A sentence for the requester (never a stack trace).
    detail: str
    #: The request body as received.
    raw: bytes
    #: The decoded request, when decoding got that far.
    request: BaseModel | None = None
    #: The negotiated version, when negotiation got that far.
    version: str | None = None


def validation_detail(exc: ValidationError) -> str:
    """A pydantic error as one line: ``"run_id: Field required; protocol_versions: Input should be ..."``."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())


def _parseable(versions: Iterable[str]) -> list[str]:
    ok = []
    for version in versions:
        try:
            parse_version(version)
        except (ValueError, TypeError):
            continue
        ok.append(version)
    return ok


async def written_out(nc: NATS) -> None:
    """Return once the server has read every command ``nc`` buffered before this call (a ``SUB`` above all).

    ``nc.flush()`` alone does not say so: nats-py writes its ``PING`` straight to the socket, ahead of the
    commands still in its buffer, which its flusher task writes after (seen: ``PING`` then ``SUB``); under load the
    ``PONG`` came back before the server had the subscription, and a request sent at once found no responders.
    By the time that first ``PONG`` is read the flusher has run (it was woken before the ``PING`` went out), so the
    second ``PING`` follows the buffered commands on the socket and its ``PONG`` comes after the server read them.
    """
    await nc.flush()
    await nc.flush()


class Responder(Generic[Q, R]):
    """Answers ``subject`` (in ``queue``) with ``handler`` until :meth:`stop`.

    ``versions_of`` reads the versions a request declares (default: its ``protocol_versions``
    field); ``negotiate_versions=False`` skips negotiation for subjects outside the protocol. At most
    ``max_inflight`` requests are handled at once (each in its own task).
    """

    def __init__(
        self,
        bus: Bus,
        subject: str,
        *,
        request_model: type[Q],
        handler: Callable[[Request[Q]], Awaitable[R]],
        on_error: Callable[[Failure], R],
        queue: str | None = None,
        versions_of: Callable[[Q], Iterable[str]] | None = None,
        supported_versions: Iterable[str] = SUPPORTED_VERSIONS,
        negotiate_versions: bool = True,
        max_inflight: int = 8,
    ) -> None:
        if max_inflight < 1:
            raise ValueError("max_inflight must be at least 1")
        if negotiate_versions and versions_of is None:
            if "protocol_versions" not in request_model.model_fields:
                raise TypeError(f"{request_model.__name__} has no protocol_versions field: give versions_of")
            versions_of = _declared_versions
        self.bus = bus
        self.subject = subject
        self.queue = queue
        self._model = request_model
        self._handler = handler
        self._on_error = on_error
        self._versions_of = versions_of if negotiate_versions else None
        self._supported = tuple(supported_versions)
        self._slots = asyncio.Semaphore(max_inflight)
        self._tasks: set[asyncio.Task[None]] = set()
        self._sub: Subscription | None = None
        self._log = log.bind(subject=subject, queue=queue)
        #: Set once the subscription is known to the server; cleared by :meth:`stop`.
        self.running = asyncio.Event()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._sub is not None:
            raise RuntimeError(f"responder on {self.subject} already started")
        self._sub = await self.bus.nc.subscribe(self.subject, queue=self.queue or "", cb=self._on_msg)
        await written_out(self.bus.nc)  # the server knows the interest before anyone reports ready
        self.running.set()
        self._log.info("responder.started")

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Remove interest first (new requests go to other replicas), then answer those already received.

        Waits at most ``timeout_s``; idempotent.
        """
        sub, self._sub = self._sub, None
        self.running.clear()
        if sub is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            await asyncio.wait_for(sub.drain(), timeout_s)  # type: ignore[no-untyped-call]
        except Exception as exc:  # best effort at shutdown: the connection drain follows
            self._log.warning("responder.drain_failed", error=repr(exc))
            try:
                await sub.unsubscribe()
            except Exception as unsub_exc:
                self._log.warning("responder.unsubscribe_failed", error=repr(unsub_exc))
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=max(deadline - loop.time(), 0.01))
            if late:
                self._log.warning("responder.cut_off_at_stop", requests=len(late))
                for task in late:
                    task.cancel()  # each still sends its "stopped" reply
                await asyncio.wait(late, timeout=1.0)
        self._log.info("responder.stopped")

    # ------------------------------------------------------------------ requests
    async def _on_msg(self, msg: Msg) -> None:
        # Runs in the subscription's own task, one message at a time: waiting for a slot here is the
        # back-pressure, and drain() (which waits for this callback) sees every request handed on.
        await self._slots.acquire()
        task = asyncio.create_task(self._serve(msg))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _serve(self, msg: Msg) -> None:
        if not msg.reply:
            self._log.warning("responder.request_without_reply_subject")
            return
        try:
            with tracing.serving(msg.headers, self.subject):
                reply = await self.answer(msg)
        except asyncio.CancelledError:  # stop() gave up on this one: say so rather than leave it unanswered
            stopped = Failure("stopped", "the responder stopped before it could answer", msg.data)
            try:
                reply = self._on_error(stopped).model_dump_json().encode()
            except Exception as exc:
                reply = self._fallback(exc)
            await self._respond(msg, reply)
            raise
        await self._respond(msg, reply)

    async def _respond(self, msg: Msg, reply: bytes) -> None:
        try:
            await msg.respond(reply)
        except Exception as exc:  # the requester went away or the connection dropped
            self._log.warning("responder.reply_failed", error=repr(exc))

    async def answer(self, msg: Msg) -> bytes:
        """The encoded reply to one request message. Never raises (but for cancellation)."""
        try:
            reply = await self._reply_model(msg, msg.data)
            return reply.model_dump_json().encode()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # on_error itself failed
            return self._fallback(exc)

    def _fallback(self, exc: Exception) -> bytes:
        """The reply when not even ``on_error`` could build one: still never leave a requester without one."""
        self._log.error("responder.error_reply_failed", error=repr(exc), exc_info=True)
        return json.dumps({"error": f"internal error: {type(exc).__name__}"}).encode()

    async def _reply_model(self, msg: Msg, raw: bytes) -> R:
        try:
            body = self._model.model_validate_json(raw)
        except ValidationError as exc:
            failure = Failure("malformed", validation_detail(exc), raw)
            self._log.info("responder.request_refused", kind=failure.kind, detail=failure.detail)
            return self._on_error(failure)
        version: str | None = None
        if self._versions_of is not None:
            try:
                version = negotiate(self._supported, _parseable(self._versions_of(body)))
            except IncompatibleProtocolVersion as exc:
                failure = Failure("unsupported_version", str(exc), raw, body)
                self._log.info("responder.request_refused", kind=failure.kind, detail=failure.detail)
                return self._on_error(failure)
        try:
            return await self._handler(Request(body, version, msg))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._log.error("responder.handler_failed", error=repr(exc), exc_info=True)
            return self._on_error(Failure("internal", type(exc).__name__, raw, body, version))


def _declared_versions(body: BaseModel) -> Iterable[str]:
    declared = getattr(body, "protocol_versions", None)
    if declared is None:
        return [PROTOCOL_VERSION]
    if isinstance(declared, str):
        return [declared]
    return [v for v in declared if isinstance(v, str)]
