"""The projector: run lifecycle and ``human.answered`` events into the saga-participants projection.

Handler for ``CONSUMERS["agent-collab-runs"]``. Per event:

1. find the run's saga: the ``run.<run_id>`` index if it exists (first writer wins), else the
   envelope's ``correlationid`` (falling back to its run), written to the index create-if-absent;
2. compare-and-set ``saga.<saga_id>`` with :func:`~temporality_agent_collab.participants.apply`
   through :meth:`temporality_bus.Store.modify` (re-read and re-applied on every lost race).

The index is written before the saga, and both steps run on every delivery, so a crash between
them is repaired by the redelivery. Returning acks; an id that cannot be a KV key is permanent.

``agent.handed_off`` (AP-6) is about the handing run (its saga is the parent's); its child run is indexed
into that saga too, so the child is in the saga before its own ``run.started`` is projected.
"""

from __future__ import annotations

import structlog

from temporality_agent_collab.participants import (
    HANDLED_TYPES,
    InvalidKey,
    RunIndex,
    SagaParticipants,
    apply,
    new_saga,
    run_key,
    run_of,
    saga_id_of,
    saga_key,
)
from temporality_bus import AlreadyExists, Bus, Delivery, PermanentError, Store, TransientError
from temporality_protocol import AgentHandedOff, Envelope
from temporality_protocol.catalog import BUCKET_COLLAB

__all__ = ["Projector"]

log = structlog.get_logger(__name__)

#: Compare-and-set attempts on one saga before the event is handed back to the consumer (nak with
#: backoff): a saga is a hot key (every run and answer of the saga writes it), so more than the default.
SAGA_WRITE_ATTEMPTS = 16


class Projector:
    """Keeps ``collab-sagas`` up to date. Build with :meth:`open`; pass :meth:`handle` to a Consumer."""

    def __init__(self, sagas: Store[SagaParticipants], index: Store[RunIndex]) -> None:
        self._sagas = sagas
        self._index = index

    @classmethod
    async def open(cls, bus: Bus) -> Projector:
        return cls(await bus.store(BUCKET_COLLAB, SagaParticipants), await bus.store(BUCKET_COLLAB, RunIndex))

    async def handle(self, event: Envelope, delivery: Delivery) -> None:
        await self.project(event)

    async def project(self, event: Envelope) -> bool:
        """Apply one event; ``True`` if the projection changed, ``False`` if it was already there."""
        if event.type not in HANDLED_TYPES:
            log.info("collab.event_ignored")
            return False
        try:
            run_id = run_of(event)
            saga_id = await self._saga_for(run_id, saga_id_of(event))
            if event.type == AgentHandedOff.EVENT_TYPE:  # AP-6: the child joins the handing run's saga
                await self._saga_for(event.payload(AgentHandedOff).child_run_id, saga_id)
            changed = await self._apply(saga_id, event)
        except InvalidKey as exc:
            raise PermanentError(str(exc)) from exc
        log.info("collab.projected", saga_id=saga_id, changed=changed)
        return changed

    async def _saga_for(self, run_id: str, proposed: str) -> str:
        key = run_key(run_id)
        saga_key(proposed)  # validate before writing anything
        found = await self._index.get(key)
        if found is not None:
            return found.value.saga_id
        try:
            await self._index.create(key, RunIndex(saga_id=proposed))
        except AlreadyExists:
            found = await self._index.get(key)
            if found is None:  # pragma: no cover - keys are never deleted
                raise TransientError(f"run index {key} vanished") from None
            return found.value.saga_id
        return proposed

    async def _apply(self, saga_id: str, event: Envelope) -> bool:
        result = await self._sagas.modify(
            saga_key(saga_id),
            lambda saga: apply(saga, event),
            create=lambda: new_saga(saga_id),
            attempts=SAGA_WRITE_ATTEMPTS,
        )
        return result.changed
