"""A run ended (``run.completed`` / ``run.failed`` / ``run.cancelled``): its pending requests are cancelled.

Run by :class:`temporality_bus.Consumer` on ``CONSUMERS["human-interaction-runs"]``. Nobody is left to
take the answer, so each of the run's requests still ``pending`` moves to ``cancelled`` (compare-and-set,
via the state machine) and every sent copy of its question is edited to say so
(``AnswerRouter.show_outcome``). A later answer is refused with 409 ``cancelled``. Idempotent under
redelivery: a request already cancelled is only shown again (the adapters tolerate a repeated edit);
answered or expired requests are left alone.

The run's requests are found through the index ``run.<run id>.<request id>`` in the ``human-channels``
bucket, written just after the request is stored (see :func:`index_request`; an intake given up on in between has
it written by its dead-letter hook, :meth:`.requests.RequestHandler.on_dead_letter`), never by scanning every request.
A request that arrives after its run ended (``runend.<run id>``, written before the index is read) is
cancelled at intake, before anyone is notified. A request of the index whose run entry, as this replica's
mirror of the bucket holds it, says it ended answered or expired (``ended``, written when it ended; final) is
not read: nothing would be done to it.

The run's requests come from the same mirror once it has applied the end marker this handler wrote (a request
indexed before the marker is in it; one indexed after it sees the marker at intake), else from one
``STREAM.INFO`` of the bucket (a redelivery, or the mirror behind).

The intake of a new request stores its record, then creates its run entry, then looks for the markers
(``runend.<run>``, ``withdrawn.<run>.<id>``); this handler writes its marker, then lists the run entries (a
withdrawal: looks the record up), then reads the records. The markers and the run entries are one bucket, one
stream: the marker's revision is below the run entry's or above it. Below: the intake's replica's mirror, once
it has applied the run entry's revision, holds the marker (the watch applies the bucket's writes in their
order), so the intake reads it there -- no read of the bucket. Above: this handler's listing, made after its
marker, holds the run entry, and the record was stored before the run entry, so this handler finds it and
cancels it. Either way a request is never left pending after its run's end, nor sent after it. An intake that
did not create the run entry (a redelivery), or whose mirror does not reach its revision in time, reads both
markers from the bucket. (Until 2026-12-06 the run entry came before the record: a marker written between the
two went unseen by the end, which found no record, and by a mirror that had applied only the run entry -- so
the intake read both markers from the bucket, two reads per question.) An older version's intake (run entry,
record, both markers read from the bucket) and this handler, of either version, also see each other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING

import structlog

from temporality_bus import Bus, Delivery, NotFound, evolve
from temporality_bus.listing import stored_keys
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRefs, ids_of, ref_key
from temporality_human_interaction.events import withdraw_reason, withdrawn_event
from temporality_human_interaction.inbox import unindex
from temporality_human_interaction.mirror import ChannelMirror
from temporality_human_interaction.records import HumanRequestRecord, RequestStore, open_store
from temporality_protocol import Envelope, HumanCancelRequested, HumanRequestState

if TYPE_CHECKING:
    from temporality_human_interaction.metrics import RequestObserver

__all__ = [
    "RUN_ENDINGS",
    "RunEndHandler",
    "cancel_pending",
    "index_new_request",
    "index_request",
    "requests_of_run",
    "run_ended",
    "withdrawn",
]

log = structlog.get_logger(__name__)

#: Listing a run's requests never waits longer than this on the bus (then: transient, redelivered).
_LIST_TIMEOUT_S = 10.0

RUN_ENDINGS = frozenset({"run.completed", "run.failed", "run.cancelled"})
#: A run's end leaves a request that ended in one of these alone (:func:`cancel_pending` would do nothing to it).
_ENDED_OTHERWISE = frozenset({HumanRequestState.ANSWERED.value, HumanRequestState.EXPIRED.value})


async def index_request(
    bus: Bus,
    run_id: str,
    request_id: str,
    expires_at: datetime | None = None,
    answerers: list[str] | None = None,
) -> None:
    """Record that ``request_id`` belongs to ``run_id``, with its deadline and who may answer it (create-if-absent;
    a repeat is a no-op, apart from filling in what an older version did not store). The retention sweep reads
    it: a request whose ``expires_at`` + retention is still ahead is not read; the inbox lists a person's
    pending requests from the run entries naming them (:mod:`.inbox`)."""
    await ChannelRefs(bus).claim(
        ref_key("run", run_id, request_id), request_id, expires_at=expires_at, answerers=answerers
    )


async def index_new_request(
    bus: Bus, run_id: str, request_id: str, expires_at: datetime, answerers: list[str] | None = None
) -> int | None:
    """:func:`index_request` for a request whose record the intake has just created: the run entry's revision when
    this call created it (what the replica's mirror must have applied before it answers for the run's markers:
    the module's docstring). None: the entry was there (an older version's intake writes it before the record; an
    answer or withdrawal that ended the request before its entry creates it marked ended, :func:`~.inbox.unindex`);
    filled in as :func:`index_request` does."""
    refs = ChannelRefs(bus)
    key = ref_key("run", run_id, request_id)
    revision = await refs.create(key, request_id, expires_at=expires_at, answerers=answerers)
    if revision is None:
        await refs.claim(key, request_id, expires_at=expires_at, answerers=answerers)
    return revision


async def requests_of_run(bus: Bus, run_id: str) -> list[str]:
    """The request ids indexed under ``run_id``: the subjects under ``run.<run id>.*`` the bucket's stream holds a
    message on, in one ``STREAM.INFO`` with that filter -- read on every run's end, where a listing of the live
    keys (:func:`~temporality_bus.listing.live_keys`) makes, reads and deletes a consumer (nats-py's
    ``keys(filters=...)`` would even read every key of the bucket). A key whose last message is a delete (an
    entry the retention sweep dropped long after its request ended, or one of a request never stored) is listed
    too: cancelling it finds nothing to do (:func:`cancel_pending`). A request id too long (or otherwise unfit)
    for a key part is keyed by its hash: that entry is read for the id it holds (one that was dropped holds
    none, and is passed over)."""
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    prefix = f"{ref_key('run', run_id)}."
    keys = await asyncio.wait_for(stored_keys(kv, f"{prefix}*"), _LIST_TIMEOUT_S)
    return await ids_of(ChannelRefs(bus), keys)


async def withdrawn(bus: Bus, run_id: str, request_id: str) -> bool:
    """Whether ``run_id`` withdrew its request ``request_id`` (``human.cancel_requested``, HUM-7)."""
    return await ChannelRefs(bus).get(ref_key("withdrawn", run_id, request_id)) is not None


async def run_ended(bus: Bus, run_id: str) -> str | None:
    """The event type that ended ``run_id`` if this service has seen it end, else None."""
    return await ChannelRefs(bus).get(ref_key("runend", run_id))


async def cancel_pending(
    bus: Bus,
    request_id: str,
    because: str,
    on_outcome: Callable[[HumanRequestRecord], Awaitable[None]] | None,
    observer: RequestObserver | None = None,
    mirror: ChannelMirror | None = None,
    *,
    run_id: str | None = None,
    run_reason: str | None = None,
) -> HumanRequestRecord | None:
    """Cancel ``request_id`` if it is pending; show the outcome when it is (now or already) cancelled.

    ``because``: the run's end event type (``run.completed`` ...) or ``not_needed`` (HUM-7), stored on the record
    with ``run_reason`` (the run's own, ``run.failed.reason`` ...) by the compare-and-set that cancels it.
    ``observer`` is told the cancelled request once, by the call whose compare-and-set cancelled it.
    ``mirror``: passed to :func:`~.inbox.unindex` (the run entry's mark). ``run_id``: only a request of that
    run is cancelled (another run's is left alone: an index entry under a run that does not own the id).
    A delivery the record holds stays in it (the person was reached: the web inbox listed it from its create).

    ``human.withdrawn`` (OBS-1) is published, with the id derived from the request id, by every call that finds
    the request cancelled while the record does not say it was published yet, then the record says so
    (``withdrawal_published``): a crash in between republishes the same event (deduplicated by its id), and a
    caller that acks its message after this call never acks a withdrawal nobody was told of."""
    store = await open_store(bus)

    def cancel(r: HumanRequestRecord) -> HumanRequestRecord | None:
        if not r.pending or run_id not in (None, r.run_id):
            return None
        return r.moved_to(
            HumanRequestState.CANCELLED,
            withdrawn_because=because,
            withdrawn_run_reason=run_reason[:500] if run_reason else None,
        )

    try:
        result = await store.modify(request_id, cancel)
    except NotFound:
        return None
    record = result.value
    if run_id is not None and record.run_id != run_id:
        log.warning("request.cancel_refused", request_id=request_id, run_id=run_id, owner=record.run_id)
        return record
    if record.status is not HumanRequestState.CANCELLED:
        return record
    log.info("request.cancelled", request_id=request_id, because=because, changed=result.changed)
    if result.changed and observer is not None:
        observer.ended(record)
    await unindex(bus, record, mirror)
    record = await _announce_withdrawal(bus, store, record, because)
    if on_outcome is not None:
        await on_outcome(record)
    return record


async def _announce_withdrawal(
    bus: Bus, store: RequestStore, record: HumanRequestRecord, because: str
) -> HumanRequestRecord:
    """Publish ``human.withdrawn`` for the cancelled ``record`` unless it says that was done, then record it.
    A request the intake gave up on (``intake_failed``: its ``human.rejected`` says so) is not one."""
    if record.withdrawal_published or record.intake_failed is not None:
        return record
    # the reason the cancelling compare-and-set stored; a record cancelled by an older version has none: this call's
    reason = withdraw_reason(record.withdrawn_because or because)
    if reason is None:  # pragma: no cover - every caller passes a run end or not_needed
        log.warning("request.withdrawal_unnamed", request_id=record.request_id, because=because)
        return record
    await bus.publish(withdrawn_event(record, reason=reason, run_reason=record.withdrawn_run_reason))
    log.info("request.withdrawal_published", request_id=record.request_id, reason=reason)
    try:
        marked = await store.modify(
            record.request_id, lambda r: None if r.withdrawal_published else evolve(r, withdrawal_published=True)
        )
    except NotFound:  # pragma: no cover - requests are deleted only long after they ended (retention)
        return record
    return marked.value


class RunEndHandler:
    """The run-endings handler; :meth:`handle` is what the consumer calls."""

    def __init__(
        self,
        bus: Bus,
        on_outcome: Callable[[HumanRequestRecord], Awaitable[None]] | None = None,
        *,
        observer: RequestObserver | None = None,
        mirror: ChannelMirror | None = None,
    ) -> None:
        self._bus = bus
        self._on_outcome = on_outcome
        #: Told each request this replica cancelled (the wait-time histogram).
        self._observer = observer
        #: ``human-channels`` as this replica's watch sees it: a request whose run entry says it was answered or
        #: expired is not read (those states are final: cancelling it would find nothing to do).
        self._mirror = mirror

    async def handle(self, event: Envelope, delivery: Delivery | None = None) -> None:
        if event.type == HumanCancelRequested.EVENT_TYPE:
            await self._withdraw(event.payload(HumanCancelRequested))
            return
        if event.type not in RUN_ENDINGS:
            return
        run_id = str(event.data.get("run_id") or event.runid or "")
        if not run_id:
            log.warning("run_end.without_run_id", event_id=event.id, type=event.type)
            return
        with structlog.contextvars.bound_contextvars(run_id=run_id):
            # The marker first, then the index: a request stored concurrently either is in the index
            # already or sees the marker at intake (RequestHandler), so none is left pending.
            refs = ChannelRefs(self._bus)
            marked = await refs.create(ref_key("runend", run_id), event.type)
            if marked is None:  # a redelivery (or another replica's): as it is
                await refs.claim(ref_key("runend", run_id), event.type)
            reason = event.data.get("reason")  # run.failed's / run.cancelled's: human.withdrawn's run_reason
            run_reason = reason if isinstance(reason, str) and reason else None
            for request_id in await self._requests_of(run_id, marked):
                if self._ended_otherwise(run_id, request_id):
                    continue
                # not stored yet (None): its intake reads this marker once it has stored it, and cancels it
                await cancel_pending(
                    self._bus,
                    request_id,
                    event.type,
                    self._on_outcome,
                    self._observer,
                    self._mirror,
                    run_id=run_id,
                    run_reason=run_reason,
                )

    async def _requests_of(self, run_id: str, marked: int | None) -> list[str]:
        """The run's requests: from the mirror once it has applied the end marker this call wrote (``marked``, its
        revision), else listed from the bucket (:func:`requests_of_run`). A request indexed before the marker is
        then in the mirror; one indexed after it sees the marker at its intake."""
        if marked is None or self._mirror is None or not await self._mirror.reached(marked):
            return await requests_of_run(self._bus, run_id)
        parent = ref_key("run", run_id)
        return [entry.value for entry in self._mirror.children(parent)]  # the id (a long one's key is hashed)

    def _ended_otherwise(self, run_id: str, request_id: str) -> bool:
        """Whether the mirror says ``request_id`` ended answered or expired: final states, so true however stale
        the mirror is; a cancelled one is still read (a redelivery shows its outcome again), and one the mirror
        does not know ended is read too."""
        entry = self._mirror.get(ref_key("run", run_id, request_id)) if self._mirror is not None else None
        if entry is None or entry.ended not in _ENDED_OTHERWISE:
            return False
        log.info("run_end.request_already_ended", request_id=request_id, ended=entry.ended)
        return True

    async def _withdraw(self, withdrawal: HumanCancelRequested) -> None:
        """HUM-7: the run no longer needs these requests: each is cancelled like at the run's end. The marker
        first (scoped to the run: another run's request is never touched), so a request stored after this
        is cancelled at intake (RequestHandler) instead of being sent."""
        refs = ChannelRefs(self._bus)
        store = await open_store(self._bus)
        with structlog.contextvars.bound_contextvars(run_id=withdrawal.run_id):
            for request_id in withdrawal.request_ids:
                await refs.claim(ref_key("withdrawn", withdrawal.run_id, request_id), request_id)
                found = await store.get(request_id)
                if found is None:  # its intake reads the marker once it has stored it, and cancels it
                    log.info("request.withdrawn_before_stored", request_id=request_id)
                    continue
                if found.value.run_id != withdrawal.run_id:
                    log.warning("request.withdraw_refused", request_id=request_id, owner=found.value.run_id)
                    continue
                await cancel_pending(
                    self._bus, request_id, withdrawal.reason, self._on_outcome, self._observer, self._mirror
                )
