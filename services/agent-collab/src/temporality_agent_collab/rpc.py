"""``get_collaborators`` over NATS request/reply (COL-1) on ``catalog.RPC_GET_COLLABORATORS``.

The responder subscribes in the queue group ``agent-collab`` so N replicas share the load. Every
request that carries a reply subject gets exactly one :class:`~temporality_protocol.CollaboratorsReply`:

==============================  ===========================================================
request                         reply
==============================  ===========================================================
not a CollaboratorsQuery        ``error="malformed request: ..."``
no common protocol version      ``error="no common protocol version: we speak ..., they speak ..."`` (PRO-3)
run not in the projection       ``error="unknown run ..."``
KV unavailable / a bug          ``error="internal error: ..."`` (logged)
otherwise                       ``saga_id``, negotiated ``protocol_version``, ``collaborators``
==============================  ===========================================================
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import ValidationError

from temporality_agent_collab.participants import (
    InvalidKey,
    RunIndex,
    SagaParticipants,
    collaborators,
    run_key,
    saga_key,
)
from temporality_bus import Bus, Store
from temporality_protocol import (
    SUPPORTED_VERSIONS,
    CollaboratorsQuery,
    CollaboratorsReply,
    IncompatibleProtocolVersion,
    negotiate,
)
from temporality_protocol.catalog import BUCKET_COLLAB, RPC_GET_COLLABORATORS
from temporality_protocol.version import parse_version

__all__ = ["QUEUE_GROUP", "CollaboratorsResponder", "answer"]

log = structlog.get_logger(__name__)

#: Replicas share the subject through this queue group.
QUEUE_GROUP = "agent-collab"


def _run_id_hint(raw: bytes) -> str:
    """The ``run_id`` of a request that failed validation, if one can be read, for the error reply."""
    try:
        body: Any = json.loads(raw)
    except ValueError:
        return ""
    run_id = body.get("run_id") if isinstance(body, dict) else None
    return run_id if isinstance(run_id, str) else ""


def _parseable(versions: list[str]) -> list[str]:
    """The versions we can compare; a malformed one is ignored (unknown is not fatal, PRO-3)."""
    ok = []
    for v in versions:
        try:
            parse_version(v)
        except ValueError:
            continue
        ok.append(v)
    return ok


async def answer(sagas: Store[SagaParticipants], index: Store[RunIndex], raw: bytes) -> CollaboratorsReply:
    """The reply to one request body. Never raises for bad input; KV errors propagate."""
    try:
        query = CollaboratorsQuery.model_validate_json(raw)
    except ValidationError as exc:
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
        return CollaboratorsReply(run_id=_run_id_hint(raw), error=f"malformed request: {detail}")
    try:
        version = negotiate(SUPPORTED_VERSIONS, _parseable(query.protocol_versions))
    except IncompatibleProtocolVersion as exc:
        return CollaboratorsReply(run_id=query.run_id, error=str(exc))
    unknown = CollaboratorsReply(run_id=query.run_id, protocol_version=version, error=f"unknown run {query.run_id!r}")
    try:
        found = await index.get(run_key(query.run_id))
    except InvalidKey:
        return unknown
    if found is None:
        return unknown
    saga = await sagas.get(saga_key(found.value.saga_id))
    if saga is None or query.run_id not in saga.value.runs:
        return unknown  # indexed, but the saga write has not landed yet
    return CollaboratorsReply(
        run_id=query.run_id,
        saga_id=saga.value.saga_id,
        protocol_version=version,
        collaborators=collaborators(saga.value),
    )


class CollaboratorsResponder:
    """The subscription answering ``get_collaborators``. :meth:`start`, then :meth:`stop` before draining."""

    def __init__(
        self,
        bus: Bus,
        sagas: Store[SagaParticipants],
        index: Store[RunIndex],
        *,
        subject: str = RPC_GET_COLLABORATORS,
        queue: str = QUEUE_GROUP,
    ) -> None:
        self._bus = bus
        self._sagas = sagas
        self._index = index
        self.subject = subject
        self.queue = queue
        self._sub: Subscription | None = None

    @classmethod
    async def open(
        cls, bus: Bus, *, subject: str = RPC_GET_COLLABORATORS, queue: str = QUEUE_GROUP
    ) -> CollaboratorsResponder:
        sagas = await bus.store(BUCKET_COLLAB, SagaParticipants)
        index = await bus.store(BUCKET_COLLAB, RunIndex)
        return cls(bus, sagas, index, subject=subject, queue=queue)

    async def start(self) -> None:
        if self._sub is not None:
            raise RuntimeError("responder already started")
        self._sub = await self._bus.nc.subscribe(self.subject, queue=self.queue, cb=self._on_request)
        await self._bus.nc.flush()  # the server knows the interest before we report ready
        log.info("collab.responder_started", subject=self.subject, queue=self.queue)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Remove interest first (new requests go to other replicas), then finish those already received."""
        sub, self._sub = self._sub, None
        if sub is None:
            return
        try:
            await asyncio.wait_for(sub.drain(), timeout_s)  # type: ignore[no-untyped-call]
        except Exception as exc:  # best effort at shutdown: the connection drain follows
            log.warning("collab.responder_drain_failed", error=repr(exc))
            try:
                await sub.unsubscribe()
            except Exception as unsub_exc:
                log.warning("collab.responder_unsubscribe_failed", error=repr(unsub_exc))
        log.info("collab.responder_stopped", subject=self.subject)

    async def _on_request(self, msg: Msg) -> None:
        if not msg.reply:
            log.warning("collab.request_without_reply_subject", subject=msg.subject)
            return
        try:
            reply = await answer(self._sagas, self._index, msg.data)
        except Exception as exc:
            log.error("collab.request_failed", error=repr(exc), exc_info=True)
            reply = CollaboratorsReply(run_id=_run_id_hint(msg.data), error=f"internal error: {type(exc).__name__}")
        if reply.error:
            log.info("collab.request_refused", run_id=reply.run_id, error=reply.error)
        try:
            await msg.respond(reply.model_dump_json().encode())
        except Exception as exc:  # the requester went away or the connection dropped
            log.warning("collab.reply_failed", error=repr(exc))
