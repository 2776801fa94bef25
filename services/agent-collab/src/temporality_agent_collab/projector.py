"""The projector: run lifecycle and ``human.answered`` events into the saga-participants projection.

Handler for ``CONSUMERS["agent-collab-runs"]``. Per event:

1. find the run's saga: the ``run.<run_id>`` index if it exists (first writer wins), else the
   envelope's ``correlationid`` (falling back to its run), written to the index create-if-absent;
2. compare-and-set ``saga.<saga_id>`` with :func:`~temporality_agent_collab.participants.apply`
   through :meth:`temporality_bus.Store.modify` (re-read and re-applied on every lost race).

The index is written before the saga, and both steps run on every delivery, so a crash between
them is repaired by the redelivery. Returning acks; an id that cannot be a KV key is permanent.

Reads saved (most runs never collaborate, yet each of their lifecycle events is projected): a run's index
entry never changes once written (nothing deletes or purges ``run.*``; were one purged, the replicas would
have to be restarted), so the projector remembers the saga ids it resolved, and a run's ``run.started`` (or a
handoff's child) creates the entry straight away -- a read only when it exists already; a small saga whose
runs have not all ended is changed from the value and revision this projector last read or wrote of it
(``Store.modify(known=...)``): another replica's or writer's write since makes that compare-and-set lose, and
the saga is read then. A run's ``run.started`` whose saga is the run's own (no ``correlationid`` of another
run: a run that is not part of a collaboration yet) creates that saga straight away too, read only when it
exists already (an event of the saga projected before it). On one replica, a run's three events
(``run.started``, ``human.answered``, ``run.completed``) thus take no read instead of six; an event for a run
another replica started reads the index, as before.

Writes: the creations (index entry, new saga) are create-if-absent compare-and-sets (revision 0) on the
connection's pipelined writes, one frame and one acknowledgement each, not the KV client's ``create`` (a
request with its own inbox and a JSON decode per write: most of the projection's CPU per run). A key that
exists makes that write lose (nothing written) and the projector reads it, as above; were a key ever deleted
(nothing deletes ``collab-sagas`` keys), the read finds nothing and the KV client's ``create`` (which
accepts a deleted key) writes it.
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
from temporality_bus import (
    AlreadyExists,
    Bus,
    Conflict,
    Delivery,
    Modified,
    PermanentError,
    Recent,
    Store,
    TransientError,
    Versioned,
)
from temporality_protocol import RUN, AgentHandedOff, Envelope, RunStarted
from temporality_protocol.catalog import BUCKET_COLLAB

__all__ = ["Projector"]

log = structlog.get_logger(__name__)

#: Compare-and-set attempts on one saga before the event is handed back to the consumer (nak with
#: backoff): a saga is a hot key (every run and answer of the saga writes it), so more than the default.
SAGA_WRITE_ATTEMPTS = 16
#: How many runs' saga ids the projector remembers (a few dozen bytes each).
REMEMBERED = 4096
#: How many sagas' last known values it remembers, and only sagas of at most this many runs (a saga holds up to
#: 512 applied event ids: a big collaboration's value is hundreds of KB in memory).
REMEMBERED_SAGAS = 1024
SMALL_SAGA_RUNS = 4


class Projector:
    """Keeps ``collab-sagas`` up to date. Build with :meth:`open`; pass :meth:`handle` to a Consumer."""

    def __init__(
        self,
        sagas: Store[SagaParticipants],
        index: Store[RunIndex],
        *,
        remembered: int = REMEMBERED,
        remembered_sagas: int = REMEMBERED_SAGAS,
    ) -> None:
        self._sagas = sagas
        self._index = index
        #: run id -> its saga id, as the index holds it (write-once: never stale).
        self._saga_ids: Recent[str] = Recent(remembered)
        #: saga id -> what this projector last read or wrote of it (only the base of a compare-and-set).
        self._known: Recent[Versioned[SagaParticipants]] = Recent(remembered_sagas)

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
            started = event.type == RunStarted.EVENT_TYPE
            saga_id = await self._saga_for(run_id, saga_id_of(event), new=started)
            if event.type == AgentHandedOff.EVENT_TYPE:  # AP-6: the child joins the handing run's saga
                await self._saga_for(event.payload(AgentHandedOff).child_run_id, saga_id, new=True)
            changed = await self._apply(saga_id, event, new=started and saga_id == run_id)
        except InvalidKey as exc:
            raise PermanentError(str(exc)) from exc
        log.info("collab.projected", saga_id=saga_id, changed=changed)
        return changed

    async def _saga_for(self, run_id: str, proposed: str, *, new: bool) -> str:
        """The run's saga: the index entry (first writer wins), created with ``proposed`` if absent. ``new``: the
        entry is most likely absent (a run's first event): created first, read only when that fails."""
        key = run_key(run_id)
        saga_key(proposed)  # validate before writing anything
        remembered = self._saga_ids.get(run_id)
        if remembered is not None:
            return remembered
        found = None if new else await self._index.get(key)
        if found is None:
            entry = RunIndex(saga_id=proposed)
            try:
                await self._index.update(key, entry, 0, validated=True)  # create-if-absent, pipelined
            except Conflict:
                found = await self._index.get(key)
                if found is None:  # pragma: no cover - keys are never deleted (a deleted one: the KV client's create)
                    found = await self._create_index(key, entry)
        saga_id = proposed if found is None else found.value.saga_id
        self._saga_ids.put(run_id, saga_id)
        return saga_id

    async def _create_index(self, key: str, entry: RunIndex) -> Versioned[RunIndex] | None:  # pragma: no cover
        """:meth:`_saga_for`'s creation of an entry that was deleted: ``None`` if created, else what is there."""
        try:
            await self._index.create(key, entry)
        except AlreadyExists:
            found = await self._index.get(key)
            if found is None:
                raise TransientError(f"run index {key} vanished") from None
            return found
        return None

    async def _apply(self, saga_id: str, event: Envelope, *, new: bool = False) -> bool:
        """``new``: the saga is most likely absent (the ``run.started`` of a run that is its own saga): created
        first, read only when that fails."""
        known = self._known.get(saga_id)
        if new and known is None:
            created = await self._create(saga_id, event)
            if created is not None:
                self._remember(saga_id, created, None)
                return True
        result = await self._sagas.modify(
            saga_key(saga_id),
            lambda saga: apply(saga, event),
            create=lambda: new_saga(saga_id),
            attempts=SAGA_WRITE_ATTEMPTS,
            known=known,
        )
        self._remember(saga_id, result, known)
        return result.changed

    async def _create(self, saga_id: str, event: Envelope) -> Modified[SagaParticipants] | None:
        """The new saga with ``event`` applied, written create-if-absent; ``None`` when it exists (or ``event``
        changes nothing on a new saga): :meth:`_apply` then reads and changes it as always."""
        value = apply(new_saga(saga_id), event)
        if value is None:
            return None
        try:
            revision = await self._sagas.update(saga_key(saga_id), value, 0)
        except Conflict:
            return None
        return Modified(value, revision)

    def _remember(
        self, saga_id: str, result: Versioned[SagaParticipants], known: Versioned[SagaParticipants] | None
    ) -> None:
        """Keep ``result`` as the base of the saga's next compare-and-set while that is likely to save a read: a
        small saga with a run still going. A concurrent write's result that finished first is kept if newer."""
        saga = result.value
        if result.revision <= 0:  # nothing stored yet (the event changed nothing on a new saga)
            return
        if len(saga.runs) > SMALL_SAGA_RUNS or all(run.status in RUN.terminal for run in saga.runs.values()):
            self._known.pop(saga_id)
            return
        latest = self._known.get(saga_id)
        if latest is None or latest is known or latest.revision <= result.revision:
            self._known.put(saga_id, result)
