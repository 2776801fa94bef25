"""``get_collaborators`` over NATS request/reply (COL-1) on ``catalog.RPC_GET_COLLABORATORS``.

A :class:`temporality_bus.Responder` in the queue group ``agent-collab`` (N replicas share the
load) decodes the :class:`~temporality_protocol.CollaboratorsQuery`, negotiates the version and
calls :func:`lookup`. Every request that carries a reply subject gets exactly one
:class:`~temporality_protocol.CollaboratorsReply`:

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

import structlog

from temporality_agent_collab.hints import claimed
from temporality_agent_collab.participants import (
    InvalidKey,
    RunIndex,
    SagaParticipants,
    collaborators,
    run_key,
    saga_key,
)
from temporality_bus import Bus, Failure, Request, Responder, Store
from temporality_protocol import CollaboratorsQuery, CollaboratorsReply
from temporality_protocol.catalog import BUCKET_COLLAB, RPC_GET_COLLABORATORS

__all__ = ["QUEUE_GROUP", "CollaboratorsResponder", "error_reply", "lookup", "open_responder"]

log = structlog.get_logger(__name__)

#: Replicas share the subject through this queue group.
QUEUE_GROUP = "agent-collab"


def error_reply(failure: Failure) -> CollaboratorsReply:
    """The reply to a request the responder could not hand to :func:`lookup`, or that :func:`lookup` failed."""
    query = failure.request if isinstance(failure.request, CollaboratorsQuery) else None
    run_id = query.run_id if query is not None else claimed(failure.raw, "run_id", limit=256)
    if failure.kind == "malformed":
        return CollaboratorsReply(run_id=run_id, error=f"malformed request: {failure.detail}")
    if failure.kind == "unsupported_version":
        return CollaboratorsReply(run_id=run_id, error=failure.detail)
    return CollaboratorsReply(run_id=run_id, error=f"internal error: {failure.detail}")


async def lookup(
    sagas: Store[SagaParticipants], index: Store[RunIndex], query: CollaboratorsQuery, version: str | None
) -> CollaboratorsReply:
    """The reply for a valid query whose version was negotiated. KV errors propagate."""
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


class CollaboratorsResponder(Responder[CollaboratorsQuery, CollaboratorsReply]):
    """The ``get_collaborators`` responder. Build with :meth:`open`; :meth:`start`, then :meth:`stop`
    before the connection drains; :attr:`running` says it listens."""

    def __init__(
        self,
        bus: Bus,
        sagas: Store[SagaParticipants],
        index: Store[RunIndex],
        *,
        subject: str = RPC_GET_COLLABORATORS,
        queue: str = QUEUE_GROUP,
        max_inflight: int = 8,
    ) -> None:
        async def handle(request: Request[CollaboratorsQuery]) -> CollaboratorsReply:
            reply = await lookup(sagas, index, request.body, request.version)
            if reply.error:
                log.info("collab.request_refused", run_id=reply.run_id, error=reply.error)
            return reply

        super().__init__(
            bus,
            subject,
            request_model=CollaboratorsQuery,
            handler=handle,
            on_error=error_reply,
            queue=queue,
            max_inflight=max_inflight,
        )

    @classmethod
    async def open(
        cls, bus: Bus, *, subject: str = RPC_GET_COLLABORATORS, queue: str = QUEUE_GROUP, max_inflight: int = 8
    ) -> CollaboratorsResponder:
        sagas = await bus.store(BUCKET_COLLAB, SagaParticipants)
        index = await bus.store(BUCKET_COLLAB, RunIndex)
        return cls(bus, sagas, index, subject=subject, queue=queue, max_inflight=max_inflight)

    async def start(self) -> None:
        await super().start()
        log.info("collab.responder_started", subject=self.subject, queue=self.queue)

    async def stop(self, timeout_s: float = 5.0) -> None:
        was_running = self.running.is_set()
        await super().stop(timeout_s)
        if was_running:
            log.info("collab.responder_stopped", subject=self.subject)


async def open_responder(bus: Bus, *, max_inflight: int = 8) -> CollaboratorsResponder:
    """The ``get_collaborators`` responder on the catalogue's subject and queue group (not started yet)."""
    return await CollaboratorsResponder.open(bus, max_inflight=max_inflight)
