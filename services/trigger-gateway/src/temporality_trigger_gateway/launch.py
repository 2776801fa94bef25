"""The one launch path of every trigger type (TRG-7, IDEM-1): what a delivery journals, and the claim.

A *delivery* is one source event handed to one trigger: an HTTP webhook delivery (:mod:`.intake`), a
schedule tick (:mod:`.schedule`) or one of the system's own events (:mod:`.events`). Whatever its kind,
it journals the same events, built here::

    trigger.received                          every delivery (id derived from the delivery id)
      + trigger.accepted + run.requested      it starts a run (ids derived from the run id)
      + trigger.rejected(<reason>)            it does not (duplicate, disabled, loop_limit, ...)

and a delivery that may arrive more than once takes the launch through :class:`Launcher`, claim first::

    claim the dedupe key (trigger id, event id): KV create-if-absent, state ``claimed``
      won      -> trigger.received + trigger.accepted + run.requested, pipelined, every ack awaited
                  -> state ``published`` -> Accepted
      lost     -> the key says ``published``            -> trigger.received + trigger.rejected(duplicate)
                                                           -> Duplicate
                  the key says ``claimed``, lease fresh -> wait for it to be published (or released)
                  ``claimed`` past its lease, ``released`` or expired -> take the claim over (compare-and-set)
                  and publish the same derived ids: JetStream dedupes ``Nats-Msg-Id``, the run store
                  refuses a second line, so a process that died between claim and publish loses nothing
      ours     -> the key names this very delivery id (a redelivered bus message: its delivery id is
                  derived from the message) -> publish the same ids again and mark it ``published``

Replays (a webhook whose signature covers the raw body only and whose event id is an unsigned header, GitHub's
``X-GitHub-Delivery``: :func:`.intake.replay_guarded`): the claim's create goes out with a second create-if-absent,
under :func:`body_key` (trigger id, SHA-256 of the raw body), holding the same claim -- one round trip still::

    event id's claim won, body's created          -> a new body: launch as above
    event id's claim won, the body's key exists   -> read it (this path only): it names this delivery's run (the
        same event id again: a retry after a 503, a redelivered skip) or is expired -> launch as above; it names
        another run (the same signed body under another delivery id) -> a replay: the event id's claim is marked
        ``published`` naming *that* run (a re-drive of this delivery, or a copy of its id, is its duplicate too)
        -> Duplicate of that run (``trigger.rejected(duplicate)`` saying so)
    event id's claim lost                         -> as above (the body's key is not read: a duplicate either way)

Of copies of one body under different ids, the first to create the body's key names the run; the body's key is
never released (a 503 or a ``skip`` leaves it naming a run that did not start: the same delivery id retried still
starts it, a copy under another id stays a duplicate). An older replica never reads body keys and claims the
event id's key exactly as this one does, so a rolling upgrade cannot launch one event twice (replays through an
old replica still start runs until every replica is upgraded).

Exactly one delivery of concurrent ones is ``Accepted``; every other gets its own
``trigger.rejected(duplicate)``. A trigger with a concurrency key (:mod:`.concurrency`) decides after the
claim is won whether the run starts (``Accepted``, with the superseded run's ``run.cancel_requested`` in
the same batch), waits in its key's queue (``Queued``: ``trigger.received`` only; the claim is marked
``queued``, which a copy of the event treats as published) or is refused (``Skipped``:
``trigger.rejected(concurrency_skip)``; the claim is released, so a redelivery decides again). A claimant whose publish fails releases its claim (best effort) so a
retry takes over at once. Every outcome is returned only after JetStream acked what it reports.

Round trips of a new event (the hot path, :class:`temporality_bus.Pipeline`): (1) the claim's create, (2) the
three events with the delivery's record (:mod:`.deliveries`, created in the outcome's state, and its index entry);
then the answer. Every outcome decided before its events are published (accepted, duplicate, skipped, queued,
debounced) sends its record with them (:meth:`Launcher._publish_recorded`), so a process killed right after an
answer loses no record; a record stored with events that were not all stored is corrected to ``failed`` before
the 503. The claim's ``published`` mark follows behind the answer (:mod:`.behind`), batched with other launches'
writes. The mark never rides with the events: were ``run.requested`` refused while the mark was stored, a
retry would be answered ``duplicate`` of a run that does not exist. A mark lost to a crash leaves the claim
``claimed``: a copy of the event after the lease takes it over and republishes the same ids (deduplicated),
as after a crash between the events and an awaited mark. Values are encoded once and written without
re-validation: each was built by its model's validating constructor, but for the delivery's record, written as
its model's JSON straight from its typed values (:meth:`.deliveries.Draft.record_json`; the delivery's event is
encoded once and spliced into it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

import nats.errors
import structlog
from pydantic import BaseModel, ConfigDict

from temporality_bus import (
    AlreadyExists,
    Bus,
    BusError,
    Conflict,
    Contended,
    PermanentError,
    PublishResult,
    Store,
    TransientError,
    evolve,
)
from temporality_bus.pipeline import Write, event_write, kv_write
from temporality_protocol import (
    EncodedEvent,
    Envelope,
    HumanPolicy,
    LaunchSource,
    NormalizedEvent,
    RunRequested,
    TriggerAccepted,
    TriggerReceived,
    TriggerRejected,
    derive_id,
    encode_event,
)
from temporality_protocol.catalog import BUCKET_DEDUPE
from temporality_trigger_gateway.behind import Settle, WriteBehind
from temporality_trigger_gateway.concurrency import Debounce, FlowControl, QueuedLaunch, QueuedRef, Skip, Start, Wait
from temporality_trigger_gateway.deliveries import Deliveries, DeliveryRecord, DeliveryState, Draft
from temporality_trigger_gateway.errors import BodyTooLarge, BusUnavailable
from temporality_trigger_gateway.triggers import TriggerConfig

__all__ = [
    "ACTOR",
    "SOURCE",
    "Accepted",
    "ClaimState",
    "Debounced",
    "DedupeRecord",
    "Duplicate",
    "Launcher",
    "Queued",
    "RejectReason",
    "Skipped",
    "TriggerDelivery",
    "body_key",
    "claim_id",
    "dedupe_key",
    "launch_events",
    "lost_rejected",
    "received_event",
    "refusal_events",
    "rejected_event",
    "waiting_rejected",
]

log = structlog.get_logger(__name__)

SOURCE = "/temporality/trigger-gateway"
ACTOR = "service:trigger-gateway"
#: How often a delivery that lost the claim re-reads it while the claimant publishes.
_POLL_S = 0.02
T = TypeVar("T")

RejectReason = Literal[
    "duplicate",
    "unsupported_event",
    "disabled",
    "invalid_payload",
    "missed_tick",
    "loop_limit",
    "concurrency_skip",
    "debounced",
    "filtered",
    "launch_lost",
]
ClaimState = Literal["claimed", "published", "released", "queued"]


# --------------------------------------------------------------------------- outcomes
class _Outcome(BaseModel):
    model_config = ConfigDict(frozen=True)
    delivery_id: str


class Accepted(_Outcome):
    status: Literal["accepted"] = "accepted"
    run_id: str
    #: The older run of the same concurrency key whose cancellation was requested (policy ``supersede``).
    superseded_run_id: str | None = None


class Queued(_Outcome):
    """Waiting behind the active run of its concurrency key (policy ``queue``); it starts when that ends."""

    status: Literal["queued"] = "queued"
    run_id: str
    position: int
    active_run_id: str | None


class Debounced(_Outcome):
    """Held as its concurrency key's latest event until no newer one arrived for ``debounce_s`` (``until``)."""

    status: Literal["debounced"] = "debounced"
    run_id: str
    until: datetime


class Skipped(_Outcome):
    """Refused because a run of its concurrency key is active (policy ``skip``, or a full queue)."""

    status: Literal["skipped"] = "skipped"
    reason: Literal["concurrency_skip"] = "concurrency_skip"
    detail: str
    active_run_id: str | None


class Duplicate(_Outcome):
    status: Literal["duplicate"] = "duplicate"
    run_id: str


@dataclass(frozen=True)
class _Decided:
    """The outcome of a delivery decided by an earlier handling of the same message (not recorded again)."""

    outcome: Accepted | Queued


class DedupeRecord(BaseModel):
    """The value under a dedupe key: which run a source event started, and how far its launch got.

    ``claimed``: a delivery owns the launch and is publishing; ``published``: JetStream acked
    ``run.requested``; ``released``: the claimant failed to publish (or was refused by its concurrency
    key's ``skip``) and gave the claim back; ``queued``: waiting in its concurrency key's queue (a copy of
    the event is a duplicate). A record
    written before claims existed has no ``state`` and reads as ``published``."""

    model_config = ConfigDict(frozen=True)

    trigger_id: str
    source_event_id: str
    run_id: str
    delivery_id: str
    accepted_at: datetime
    expires_at: datetime
    state: ClaimState = "published"
    claimed_at: datetime | None = None


@dataclass(frozen=True)
class TriggerDelivery:
    """One source event handed to one trigger, whatever the trigger's type.

    ``adapter`` is what ``trigger.received`` names (the webhook's source adapter, ``schedule``, ``event``).
    ``causation_id`` and ``correlation_id`` chain an event trigger's events to the CloudEvent that fired
    it (its id, its saga); without them a delivery's events correlate on the run (or the delivery)."""

    trigger: TriggerConfig
    delivery_id: str
    kind: Literal["webhook", "event", "schedule"]
    adapter: str
    source_event_id: str | None
    source_event_type: str | None
    body_bytes: int = 0
    #: The launch depth a run of this delivery has (LaunchSource.depth; event triggers, TRG-6).
    depth: int = 0
    causation_id: str | None = None
    correlation_id: str | None = None
    #: A rerun (:func:`.redrive.rerun`): its number, the run it runs again, who asked. Its run id is new, and so
    #: is its dedupe claim (:func:`claim_id`): the original event's claim keeps naming the original run.
    rerun: int | None = None
    rerun_of: str | None = None
    requested_by: str | None = None
    #: The raw body's SHA-256 (hex) of a webhook delivery whose signature covers the body only and whose event id
    #: comes from a header (:func:`.intake.replay_guarded`): its launch claims :func:`body_key` too ("Replays" in the
    #: module docstring). ``None`` for every other delivery, and for a re-drive or a rerun (no body is kept).
    body_sha256: str | None = None


# --------------------------------------------------------------------------- decisions (pure)
def dedupe_key(trigger_id: str, source_event_id: str) -> str:
    return derive_id("dd", trigger_id, source_event_id)


def body_key(trigger_id: str, body_sha256: str) -> str:
    """The second dedupe key of a replay-guarded delivery: its trigger and raw body (``db-``: never an event's key)."""
    return derive_id("db", trigger_id, body_sha256)


def claim_id(delivery: TriggerDelivery | QueuedLaunch, event_id: str) -> str:
    """What a delivery's dedupe claim is keyed by (with its trigger id): the source event's id, but for a rerun,
    whose own (derived) delivery id is the one launch the claim guards (a retried rerun is that launch again)."""
    return event_id if delivery.rerun is None else delivery.delivery_id


def _envelope(delivery: TriggerDelivery, *, run_id: str | None, tenant: str | None, id: str) -> dict[str, Any]:
    return {
        "source": SOURCE,
        "id": id,
        "run_id": run_id,
        "correlation_id": delivery.correlation_id or run_id or delivery.delivery_id,
        "actor": ACTOR,
        "tenant": tenant,
    }


def received_event(delivery: TriggerDelivery, *, run_id: str | None, tenant: str | None) -> EncodedEvent:
    """``trigger.received`` of ``delivery`` (one per delivery: the id is derived from the delivery id)."""
    return encode_event(
        TriggerReceived(
            trigger_id=delivery.trigger.id,
            delivery_id=delivery.delivery_id,
            adapter=delivery.adapter,
            source_event_id=delivery.source_event_id,
            source_event_type=delivery.source_event_type,
            body_bytes=delivery.body_bytes,
        ),
        causation_id=delivery.causation_id,
        **_envelope(delivery, run_id=run_id, tenant=tenant, id=derive_id("evt", delivery.delivery_id, "received")),
    )


def rejected_event(
    delivery: TriggerDelivery,
    reason: RejectReason,
    detail: str,
    *,
    run_id: str | None,
    tenant: str | None,
    causation_id: str,
) -> EncodedEvent:
    """``trigger.rejected`` of ``delivery``, caused by its ``trigger.received`` (``causation_id``)."""
    return encode_event(
        TriggerRejected(
            trigger_id=delivery.trigger.id,
            delivery_id=delivery.delivery_id,
            reason=reason,
            detail=detail[:1000],
            source_event_id=delivery.source_event_id,
            run_id=run_id,
            depth=delivery.depth if delivery.kind == "event" else None,
        ),
        causation_id=causation_id,
        **_envelope(delivery, run_id=run_id, tenant=tenant, id=derive_id("evt", delivery.delivery_id, "rejected")),
    )


def refusal_events(
    delivery: TriggerDelivery, reason: RejectReason, detail: str, *, run_id: str | None, tenant: str | None
) -> tuple[EncodedEvent, EncodedEvent]:
    """The pair a delivery that starts no run journals: ``trigger.received`` + ``trigger.rejected``."""
    received = received_event(delivery, run_id=run_id, tenant=tenant)
    rejected = rejected_event(delivery, reason, detail, run_id=run_id, tenant=tenant, causation_id=received.id)
    return received, rejected


def launch_events(
    delivery: TriggerDelivery,
    event: NormalizedEvent,
    *,
    run_id: str,
    title: str,
    causation_id: str,
    human: HumanPolicy,
    input: dict[str, Any] | None = None,
    with_payload: bool = False,
    payload_limit: int | None = None,
) -> tuple[EncodedEvent, EncodedEvent]:
    """``trigger.accepted`` and ``run.requested``, with ids derived from the run: redelivery reuses them.

    ``human`` is the trigger's ``human.policy()`` (SEC-1: from its config, never from the event).
    ``input`` is the agent input the trigger's mapping produced (:func:`.mapping.agent_input`); ``None``:
    the event's payload. ``with_payload``: the run's ``event`` keeps its payload (otherwise it is carried
    once, as the input) -- unless ``run.requested``'s data with it would be larger than ``payload_limit`` bytes:
    then it goes without, its ``event.metadata.payload_omitted`` saying why (:func:`_payload_omitted`)."""
    trigger = delivery.trigger
    accepted = encode_event(
        TriggerAccepted(
            trigger_id=trigger.id,
            delivery_id=delivery.delivery_id,
            source_event_id=event.id,
            run_id=run_id,
            agent=trigger.agent,
        ),
        causation_id=causation_id,
        **_envelope(delivery, run_id=run_id, tenant=event.tenant, id=derive_id("evt", run_id, "trigger.accepted")),
    )
    requested = encode_event(
        RunRequested(
            run_id=run_id,
            agent=trigger.agent,
            title=title[:200],
            launch=LaunchSource(
                kind=delivery.kind,
                trigger_id=trigger.id,
                delivery_id=delivery.delivery_id,
                depth=delivery.depth,
                rerun_of=delivery.rerun_of,
                requested_by=delivery.requested_by,
            ),
            event=event if with_payload else _without_payload(event),
            input=event.payload if input is None else input,
            human=human,
        ),
        causation_id=accepted.id,
        **_envelope(delivery, run_id=run_id, tenant=event.tenant, id=derive_id("evt", run_id, "run.requested")),
    )
    if with_payload and payload_limit is not None and len(requested.data_json) > payload_limit:
        return launch_events(
            delivery,
            _payload_omitted(event, len(requested.data_json), payload_limit),
            run_id=run_id,
            title=title,
            causation_id=causation_id,
            human=human,
            input=event.payload if input is None else input,
        )
    return accepted, requested


def _payload_omitted(event: NormalizedEvent, size: int, limit: int) -> NormalizedEvent:
    """``event`` without its payload, its metadata saying why (``payload_omitted``): ``run.requested`` with the
    payload as well as the input would be ``size`` bytes, past ``limit`` (:meth:`Launcher.payload_limit`)."""
    why = (
        f"run.requested would be {size} bytes with the original payload as well as the input, past {limit} bytes "
        "(half the bus's max_payload: the run's record must hold it and what the run adds); the input holds "
        "what the trigger's mapping took from it"
    )
    return event.model_copy(update={"payload": {}, "metadata": {**event.metadata, "payload_omitted": why}})


def _queued_launch(
    delivery: TriggerDelivery,
    event: NormalizedEvent,
    run_id: str,
    title: str,
    mapped: dict[str, Any],
    with_payload: bool,
) -> QueuedLaunch:
    """What a delivery needs to be launched later from its concurrency key's queue."""
    return QueuedLaunch(
        trigger_id=delivery.trigger.id,
        delivery_id=delivery.delivery_id,
        kind=delivery.kind,
        adapter=delivery.adapter,
        source_event_id=delivery.source_event_id,
        source_event_type=delivery.source_event_type,
        body_bytes=delivery.body_bytes,
        depth=delivery.depth,
        causation_id=delivery.causation_id,
        correlation_id=delivery.correlation_id,
        run_id=run_id,
        title=title[:200],
        event=event,
        input=mapped,
        with_payload=with_payload,
        rerun=delivery.rerun,
        rerun_of=delivery.rerun_of,
        requested_by=delivery.requested_by,
    )


def _delivery_of(launch: QueuedLaunch, trigger: TriggerConfig) -> TriggerDelivery:
    """The delivery a stored launch was made from."""
    return TriggerDelivery(
        trigger=trigger,
        delivery_id=launch.delivery_id,
        kind=launch.kind,
        adapter=launch.adapter,
        source_event_id=launch.source_event_id,
        source_event_type=launch.source_event_type,
        body_bytes=launch.body_bytes,
        depth=launch.depth,
        causation_id=launch.causation_id,
        correlation_id=launch.correlation_id,
        rerun=launch.rerun,
        rerun_of=launch.rerun_of,
        requested_by=launch.requested_by,
    )


def waiting_rejected(launch: QueuedLaunch, reason: RejectReason, detail: str) -> EncodedEvent:
    """``trigger.rejected`` of a queued or debounced delivery, from its stored launch alone (its trigger may be
    gone): the event :func:`rejected_event` makes of the same delivery."""
    return encode_event(
        TriggerRejected(
            trigger_id=launch.trigger_id,
            delivery_id=launch.delivery_id,
            reason=reason,
            detail=detail[:1000],
            source_event_id=launch.source_event_id,
            run_id=None,
            depth=launch.depth if launch.kind == "event" else None,
        ),
        causation_id=derive_id("evt", launch.delivery_id, "received"),
        source=SOURCE,
        id=derive_id("evt", launch.delivery_id, "rejected"),
        run_id=None,
        correlation_id=launch.correlation_id or launch.delivery_id,
        actor=ACTOR,
        tenant=launch.event.tenant,
    )


def lost_rejected(trigger_id: str, delivery_id: str, record: DeliveryRecord | None, detail: str) -> EncodedEvent:
    """``trigger.rejected(launch_lost)`` of a queued or debounced delivery whose stored launch is gone, from what its
    delivery record still says (``None``: only its ids). Same id and causation as :func:`waiting_rejected`: one
    delivery is refused once, whichever way."""
    event = record.event if record is not None else None
    return encode_event(
        TriggerRejected(
            trigger_id=trigger_id,
            delivery_id=delivery_id,
            reason="launch_lost",
            detail=detail[:1000],
            source_event_id=_event_id_of(record),
            run_id=None,
            depth=record.depth if record is not None and record.kind == "event" else None,
        ),
        causation_id=derive_id("evt", delivery_id, "received"),
        source=SOURCE,
        id=derive_id("evt", delivery_id, "rejected"),
        run_id=None,
        correlation_id=(record.correlation_id if record is not None else None) or delivery_id,
        actor=ACTOR,
        tenant=event.tenant if event is not None else None,
    )


def _event_id_of(record: DeliveryRecord | None) -> str | None:
    """The normalized event id a delivery's record names (its dedupe claim's key), if any."""
    if record is None:
        return None
    return record.event.id if record.event is not None else record.source_event_id


def _without_payload(event: NormalizedEvent) -> NormalizedEvent:
    """``event`` with an empty payload. Not re-validated: every field comes from ``event``, which was
    built through the validating constructor, and ``{}`` is a valid payload (a copy: ``model_construct``
    costs about twice as much)."""
    return event.model_copy(update={"payload": {}})


#: A ``claimed`` record's state as its JSON has it, and the ``published`` mark's (:func:`_published`).
_CLAIMED = b'"state":"claimed"'
_PUBLISHED = b'"state":"published"'


def _published(claim: DedupeRecord, encoded: bytes | None) -> bytes:
    """The ``published`` mark of ``claim`` as stored: the claim's JSON as it was written (``encoded``) with
    its state replaced -- the one place a quote can stand unescaped before ``:`` is a key, and the record has
    one ``state`` -- or, without it, the claim copied and encoded (a Literal state: nothing to re-validate)."""
    if encoded is not None and claim.state == "claimed":
        marked = encoded.replace(_CLAIMED, _PUBLISHED, 1)
        if marked != encoded:  # else the JSON no longer reads as expected: never store the claim unmarked
            return marked
    return claim.model_copy(update={"state": "published"}).model_dump_json().encode()


async def _unless_taken(call: Awaitable[object]) -> bool:
    """``call`` (a create-if-absent or a compare-and-set) done: ``False`` when the key was taken or changed meanwhile
    (``AlreadyExists``, ``Conflict``), caught here so that :meth:`Launcher.io` does not count it a bus failure."""
    try:
        await call
    except (AlreadyExists, Conflict):
        return False
    return True


async def _raise(error: BusError) -> None:
    """``error`` raised where :meth:`Launcher.io` maps it (a write's outcome, as ``publish_many`` raises it)."""
    raise error


def _marked(run_id: str) -> Settle:
    """What the outcome of a claim's ``published`` mark says (logged only: the run is accepted either way)."""

    async def settle(results: list[PublishResult | BusError]) -> None:
        (marked,) = results
        if isinstance(marked, Conflict):
            log.info("launch.claim_taken_over")  # a redelivery took a stale claim over; it published the same ids
        elif not isinstance(marked, PublishResult):
            # run.requested is durable: it is accepted. A copy after the lease republishes the same ids
            # (deduplicated) instead of answering duplicate: harmless.
            log.warning("launch.claim_not_marked_published", run_id=run_id, error=repr(marked))

    return settle


# --------------------------------------------------------------------------- effects
class Launcher:
    """Carries deliveries out on the bus: the dedupe claim, the pipelined publish, the claim's release.

    Every bus failure becomes :class:`BusUnavailable` (a webhook answers 503; a consumer retries), an
    unpublishable event :class:`BodyTooLarge`."""

    def __init__(self, bus: Bus, *, retry_after_s: int, claim_lease_s: float = 10.0) -> None:
        self.bus = bus
        self._retry_after_s = retry_after_s
        self._claim_lease_s = claim_lease_s
        self._store: Store[DedupeRecord] | None = None
        self._policies: dict[str, tuple[TriggerConfig, HumanPolicy]] = {}
        self.flow = FlowControl(self)
        self.deliveries = Deliveries(bus)
        #: The writes that follow a launch's answer (the claim's mark, the delivery's record): :mod:`.behind`.
        self.behind = WriteBehind.of(bus)
        self.pipeline = bus.pipeline  # the connection's one reply subscription

    @property
    def payload_limit(self) -> int:
        """The largest ``run.requested`` (its data, in bytes) that also carries its event's original payload
        beside a mapped input: half the server's ``max_payload`` (NATS' default 1 MiB: 512 KiB), so that the
        run's record, which holds the input and the event, still has room for what the run adds (its result,
        the provider's reply). A larger one goes without the payload (:func:`launch_events`)."""
        return self.bus.nc.max_payload // 2

    async def publish(self, events: Sequence[Envelope | EncodedEvent]) -> None:
        """Publish ``events`` together (one round trip, every ack awaited): :class:`BusUnavailable` unless
        JetStream stored every one (those it did are deduplicated by id when a retry publishes them again)."""
        await self.io(self.bus.publish_many(events))

    async def _publish_recorded(
        self,
        events: Sequence[Envelope | EncodedEvent],
        draft: Draft,
        state: DeliveryState,
        *,
        run_id: str | None = None,
        reason: str | None = None,
        detail: str | None = None,
    ) -> None:
        """:meth:`publish` ``events`` with the delivery's record in ``state`` (:meth:`.deliveries.Deliveries.writes`)
        in the same pipelined round: the answer that follows finds its record stored, no round trip added. Raises as
        :meth:`publish` when an event was not stored (``draft.recorded`` then says whether the record was: the caller
        corrects it to ``failed``); a record the bus did not take is handled as behind the answer
        (:meth:`.deliveries.Deliveries.written`: written again in the background). A record too large for the server
        does not go with the events (``draft.recorded`` stays ``None``: written behind, as before)."""
        record = self.deliveries.writes(draft, state, run_id=run_id, reason=reason, detail=detail)
        if len(record[0].payload) > self.bus.nc.max_payload:
            await self.publish(events)
            return
        writes = [event_write(event) for event in events]
        results = await self.send([*writes, *record])
        stored = results[len(writes) :]
        draft.recorded = isinstance(stored[0], PublishResult)
        failed = next((result for result in results[: len(writes)] if not isinstance(result, PublishResult)), None)
        if failed is not None:  # as publish(): the first failure, as BusUnavailable or BodyTooLarge
            await self.io(_raise(failed))
        await self.deliveries.written(draft, state, record, stored, run_id=run_id, reason=reason, detail=detail)

    async def send(self, writes: list[Write]) -> list[PublishResult | BusError]:
        """Pipelined writes (:class:`temporality_bus.Pipeline`), the outcome of each; :class:`BusUnavailable`
        when the bus is not connected, :class:`BodyTooLarge` when one can never be written."""
        return await self.io(self.pipeline.send(writes))

    async def launch(
        self,
        delivery: TriggerDelivery,
        event: NormalizedEvent,
        run_id: str,
        title: str,
        mapped: dict[str, Any],
        *,
        with_payload: bool = False,
        concurrency_key: str | None = None,
        redrive_of: str | None = None,
    ) -> Accepted | Duplicate | Queued | Skipped | Debounced:
        """Start the run of ``event`` for ``delivery``'s trigger at most once (the claim, module docstring).

        ``concurrency_key``: the event's key under the trigger's ``concurrency`` (``None``: no flow control).
        The delivery's processing state is recorded (:mod:`.deliveries`): received, then its outcome, or
        failed when the bus did not acknowledge (the error propagates: the sender or the consumer retries).
        ``redrive_of``: the delivery this one re-drives."""
        draft = await self.deliveries.draft(delivery, event=event, title=title, redrive_of=redrive_of)
        try:
            outcome = await self._launch(
                delivery,
                event,
                run_id,
                title,
                mapped,
                with_payload=with_payload,
                concurrency_key=concurrency_key,
                draft=draft,
            )
        except Exception as exc:
            detail = getattr(exc, "detail", None) or repr(exc)
            if isinstance(exc, BusUnavailable):
                detail += " (the sender, or the bus, retries: the claim was released)"
            log.warning(
                "launch.failed",
                trigger_id=delivery.trigger.id,
                delivery_id=delivery.delivery_id,
                run_id=run_id,
                error=detail,
            )
            if draft.recorded:
                # stored with events that were not (all) stored: the record must not say what they would have
                await self.deliveries.record(
                    delivery, "failed", event=event, title=title, detail=detail, redrive_of=redrive_of, keep_run=False
                )
            else:
                self.deliveries.finish(draft, "failed", detail=detail)
            raise
        if isinstance(outcome, _Decided):
            return outcome.outcome  # recorded when it was decided
        if draft.recorded is not None:
            return outcome  # recorded with its events (_publish_recorded)
        # Not recorded with its events (too large for one message): written behind the answer (.behind).
        finish = self.deliveries.finish
        if isinstance(outcome, Accepted):
            finish(draft, "accepted", run_id=outcome.run_id)
        elif isinstance(outcome, Duplicate):
            finish(draft, "rejected", run_id=outcome.run_id, reason="duplicate", detail="already accepted as this run")
        elif isinstance(outcome, Skipped):
            finish(draft, "rejected", reason=outcome.reason, detail=outcome.detail)
        else:
            finish(draft, outcome.status, run_id=outcome.run_id)
        return outcome

    async def refuse(
        self,
        delivery: TriggerDelivery,
        reason: RejectReason,
        detail: str,
        *,
        tenant: str | None,
        event: NormalizedEvent | None = None,
        title: str | None = None,
        redrive_of: str | None = None,
        recorded_as: str | None = None,
    ) -> None:
        """Journal a delivery that starts no run (``trigger.received`` + ``trigger.rejected``) and record it
        (``redrive_of``: the delivery it re-drives). ``recorded_as``: the record's reason when it is more precise
        than the journal's (``trigger.rejected`` takes the protocol's reasons only): ``test_notification``
        (journaled ``unsupported_event``), ``mapping_failed`` (journaled ``invalid_payload``)."""
        await self.publish(refusal_events(delivery, reason, detail, run_id=None, tenant=tenant))
        await self.deliveries.record(
            delivery,
            "rejected",
            event=event,
            title=title,
            reason=recorded_as or reason,
            detail=detail,
            redrive_of=redrive_of,
        )

    async def _launch(
        self,
        delivery: TriggerDelivery,
        event: NormalizedEvent,
        run_id: str,
        title: str,
        mapped: dict[str, Any],
        *,
        with_payload: bool,
        concurrency_key: str | None,
        draft: Draft,
    ) -> Accepted | Duplicate | Queued | Skipped | Debounced | _Decided:
        key = dedupe_key(delivery.trigger.id, claim_id(delivery, event.id))
        store = self._store or await self.dedupe()  # (opened once: no coroutine per delivery after)
        received = received_event(delivery, run_id=run_id, tenant=event.tenant)
        won = await self._claim(store, key, delivery, event, run_id)
        if isinstance(won, DedupeRecord):
            # The run the key names: this event's (run_id), or, for a replayed body, the run its first delivery
            # started under its own event id (answered, journaled and recorded with that run, never this one's).
            first = won.run_id
            if won.source_event_id != event.id:
                detail = (
                    f"the same signed body was already delivered as source event {won.source_event_id} (run {first}, "
                    f"delivery {won.delivery_id}): a replay of it under source event {event.id} starts no run"
                )
                received = received_event(delivery, run_id=first, tenant=event.tenant)
            else:
                detail = f"source event {event.id} was already accepted as run {first} (delivery {won.delivery_id})"
                if first != run_id:
                    received = received_event(delivery, run_id=first, tenant=event.tenant)
            rejected = rejected_event(
                delivery, "duplicate", detail, run_id=first, tenant=event.tenant, causation_id=received.id
            )
            duplicate = "already accepted as this run"
            await self._publish_recorded(
                (received, rejected), draft, "rejected", run_id=first, reason="duplicate", detail=duplicate
            )
            return Duplicate(delivery_id=delivery.delivery_id, run_id=first)

        claim, revision, claim_json = won
        cancel: tuple[Envelope, ...] = ()
        superseded: str | None = None
        flow_controlled = concurrency_key is not None and delivery.trigger.concurrency is not None
        if flow_controlled and revision is None:
            # this very delivery again (a redelivered message), already decided: its decision stands (deciding
            # again could let an old event take its key back from a newer run)
            log.info("launch.already_decided", state=claim.state)
            if claim.state == "queued":
                return _Decided(Queued(delivery_id=delivery.delivery_id, run_id=run_id, position=0, active_run_id=None))
            return _Decided(Accepted(delivery_id=delivery.delivery_id, run_id=run_id))
        if concurrency_key is not None and delivery.trigger.concurrency is not None:
            queued = _queued_launch(delivery, event, run_id, title, mapped, with_payload)
            try:
                decision = await self.flow.admit(delivery, queued, concurrency_key)
            except Exception:
                if revision is not None:
                    await self._release(store, key, claim, revision)
                raise
            if isinstance(decision, Skip):
                rejected = rejected_event(
                    delivery,
                    "concurrency_skip",
                    decision.detail,
                    run_id=None,
                    tenant=event.tenant,
                    causation_id=received.id,
                )
                await self._publish_recorded(
                    (received, rejected), draft, "rejected", reason="concurrency_skip", detail=decision.detail
                )
                if revision is not None:
                    await self._release(store, key, claim, revision)  # a redelivery (or a re-drive) decides again
                return Skipped(delivery_id=delivery.delivery_id, detail=decision.detail, active_run_id=decision.active)
            if isinstance(decision, Wait | Debounce):
                held: tuple[Envelope | EncodedEvent, ...] = (received,)
                replaced = decision.replaced if isinstance(decision, Debounce) else None
                if replaced is not None:
                    held += (self._debounced_away(replaced, delivery),)
                waiting: Literal["debounced", "queued"] = "debounced" if isinstance(decision, Debounce) else "queued"
                await self._publish_recorded(held, draft, waiting, run_id=run_id)
                if replaced is not None:
                    await self.deliveries.record(
                        _delivery_of(replaced, delivery.trigger),
                        "rejected",
                        reason="debounced",
                        detail=f"a newer event arrived within the debounce window (delivery {delivery.delivery_id})",
                    )
                if revision is not None:
                    try:
                        await self.io(store.update(key, evolve(claim, state="queued"), revision))
                    except Conflict:
                        log.info("launch.claim_taken_over")
                if isinstance(decision, Debounce):
                    return Debounced(delivery_id=delivery.delivery_id, run_id=run_id, until=decision.until)
                return Queued(
                    delivery_id=delivery.delivery_id,
                    run_id=run_id,
                    position=decision.position,
                    active_run_id=decision.active,
                )
            if decision.cancel is not None:
                cancel, superseded = (decision.cancel,), decision.superseded
        accepted, requested = launch_events(
            delivery,
            event,
            run_id=run_id,
            title=title,
            causation_id=received.id,
            human=self._policy(delivery.trigger),
            input=mapped,
            with_payload=with_payload,
            payload_limit=self.payload_limit,
        )
        try:
            await self._publish_recorded((received, accepted, requested, *cancel), draft, "accepted", run_id=run_id)
        except Exception:
            if revision is not None:
                await self._release(store, key, claim, revision)
            raise
        # Every event is stored: the run is accepted. The claim's mark goes out after (never with) the events --
        # "published" must not be stored for an unstored run.requested -- and behind the answer (.behind).
        if revision is not None:  # (None: ours, already marked published)
            mark = kv_write(BUCKET_DEDUPE.name, key, _published(claim, claim_json), revision=revision)
            self.behind.add((mark,), _marked(run_id))
        return Accepted(delivery_id=delivery.delivery_id, run_id=run_id, superseded_run_id=superseded)

    def _debounced_away(self, older: QueuedLaunch, newer: TriggerDelivery) -> EncodedEvent:
        """``trigger.rejected(debounced)`` of the older event a newer one replaced in the debounce window."""
        delivery = _delivery_of(older, newer.trigger)
        detail = f"a newer event of the same concurrency key arrived within the debounce window (delivery {newer.delivery_id})"
        rejected = rejected_event(
            delivery,
            "debounced",
            detail,
            run_id=None,
            tenant=older.event.tenant,
            causation_id=derive_id("evt", older.delivery_id, "received"),
        )
        return rejected

    async def launch_debounced(self, launch: QueuedLaunch, trigger: TriggerConfig, key: str) -> None:
        """A debounce window ended on ``launch`` (still its key's latest event): start, queue or refuse it
        under the trigger's policy (its ``trigger.received`` went out when it arrived). Nothing when a newer event
        replaced it since the firing read the key (``Passed``: that event's delivery refused this one)."""
        delivery = _delivery_of(launch, trigger)
        decision = await self.flow.admit(delivery, launch, key, fired=True)
        if isinstance(decision, Start):
            await self.start_queued(launch, trigger, cancel=decision.cancel)
        elif isinstance(decision, Skip):
            received_id = derive_id("evt", launch.delivery_id, "received")
            rejected = rejected_event(
                delivery,
                "concurrency_skip",
                decision.detail,
                run_id=None,
                tenant=launch.event.tenant,
                causation_id=received_id,
            )
            await self.publish((rejected,))
            await self.deliveries.record(delivery, "rejected", reason="concurrency_skip", detail=decision.detail)
            # as a webhook's skip: the claim is given back, so a copy of the event decides again
            await self._release_waiting(dedupe_key(trigger.id, claim_id(launch, launch.event.id)), launch.delivery_id)
        log.info("launch.debounce_ended", run_id=launch.run_id, decision=type(decision).__name__.lower())

    async def start_queued(
        self, launch: QueuedLaunch, trigger: TriggerConfig, *, cancel: Envelope | None = None
    ) -> None:
        """Publish a queued (or debounced) delivery's ``trigger.accepted`` + ``run.requested`` (its
        ``trigger.received`` went out when it arrived), with a superseded run's ``run.cancel_requested``;
        every id derives from the runs, so a repeat is deduplicated."""
        delivery = _delivery_of(launch, trigger)
        received_id = derive_id("evt", launch.delivery_id, "received")
        accepted, requested = launch_events(
            delivery,
            launch.event,
            run_id=launch.run_id,
            title=launch.title,
            causation_id=received_id,
            human=self._policy(delivery.trigger),
            input=launch.input,
            with_payload=launch.with_payload,
            payload_limit=self.payload_limit,
        )
        await self.publish((accepted, requested) if cancel is None else (accepted, requested, cancel))
        await self.deliveries.record(delivery, "accepted", run_id=launch.run_id)

    async def drop_waiting(
        self,
        trigger_id: str,
        ref: QueuedRef,
        launch: QueuedLaunch | None,
        *,
        reason: RejectReason,
        detail: str,
    ) -> None:
        """A queued or debounced delivery (``ref``) that will never start: its trigger was deleted (``reason``
        ``disabled``), or its stored launch is gone (``launch`` ``None``, ``reason`` ``launch_lost``: the event is
        made from the delivery's record, :func:`lost_rejected`).

        ``trigger.rejected(reason)`` is journaled (caused by its ``trigger.received``; the id derives from the
        delivery, so a repeat is one event), its record becomes ``rejected`` with that reason (an operator can
        re-drive it from its record's event), and its dedupe claim (``queued``) is released, so a copy of the
        event decides again instead of being a duplicate of a run that never starts. A record already
        ``accepted`` (an earlier handling started the run) changes nothing."""
        log.error(
            "concurrency.waiting_dropped",
            trigger_id=trigger_id,
            run_id=ref.run_id,
            delivery_id=ref.delivery_id,
            reason=reason,
            detail=detail,
        )
        record, started = await self.deliveries.settle_waiting(
            trigger_id, ref.delivery_id, "rejected", reason=reason, detail=detail
        )
        if started:
            return
        if launch is not None:
            await self.publish((waiting_rejected(launch, reason, detail),))
        else:
            await self.publish((lost_rejected(trigger_id, ref.delivery_id, record, detail),))
        event_id = launch.event.id if launch is not None else _event_id_of(record)
        if launch is not None:
            event_id = claim_id(launch, launch.event.id)
        elif record is not None and record.rerun is not None:
            event_id = record.delivery_id  # a rerun's claim (claim_id)
        if event_id is not None:
            await self._release_waiting(dedupe_key(trigger_id, event_id), ref.delivery_id)

    async def _release_waiting(self, key: str, delivery_id: str) -> None:
        """Release the ``queued`` claim of ``delivery_id`` (compare-and-set: a newer claim is left alone)."""
        store = await self.dedupe()
        found = await self.io(store.get(key))
        if found is None or found.value.delivery_id != delivery_id or found.value.state != "queued":
            return
        try:
            await self.io(store.update(key, evolve(found.value, state="released"), found.revision))
        except Conflict:
            log.info("launch.claim_taken_over")

    def _policy(self, trigger: TriggerConfig) -> HumanPolicy:
        """The trigger's human policy as it goes on the wire, built once per trigger (both are frozen)."""
        cached = self._policies.get(trigger.id)
        if cached is None or cached[0] is not trigger:
            cached = self._policies[trigger.id] = (trigger, trigger.human.policy())
        return cached[1]

    async def dedupe(self) -> Store[DedupeRecord]:
        """The ``trigger-dedupe`` bucket (opened once)."""
        if self._store is None:
            self._store = await self.io(self.bus.store(BUCKET_DEDUPE, DedupeRecord))
        return self._store

    async def _claim(
        self,
        store: Store[DedupeRecord],
        key: str,
        delivery: TriggerDelivery,
        event: NormalizedEvent,
        run_id: str,
    ) -> tuple[DedupeRecord, int | None, bytes | None] | DedupeRecord:
        """Own the launch of ``event`` (the claim, its revision -- ``None``: this delivery's own claim, already
        published -- and its JSON as written, when this call wrote it), or the record of the delivery that
        did. The first create-if-absent is a pipelined write (no re-validation of the claim, built by its
        validating constructor here)."""
        trigger = delivery.trigger
        lease = timedelta(seconds=self._claim_lease_s)
        deadline = asyncio.get_running_loop().time() + self._claim_lease_s + 5 * _POLL_S
        first = True
        body = None if delivery.body_sha256 is None else body_key(trigger.id, delivery.body_sha256)
        #: The body key's create (a replay-guarded delivery): not created -> read it once the event's claim is won.
        body_result: PublishResult | BusError | None = None
        while True:
            now = datetime.now(UTC)
            claim = DedupeRecord(
                trigger_id=trigger.id,
                source_event_id=event.id,
                run_id=run_id,
                delivery_id=delivery.delivery_id,
                accepted_at=now,
                expires_at=now + timedelta(days=trigger.deduplication.ttl_days),
                state="claimed",
                claimed_at=now,
            )
            if first:  # the claim alone: the delivery's record goes with its events (round trip 2)
                encoded = claim.__pydantic_serializer__.to_json(claim)  # model_dump_json()'s JSON, as bytes
                writes = [kv_write(BUCKET_DEDUPE.name, key, encoded, revision=0)]
                if body is not None:  # a replay-guarded delivery: its body's key in the same round trip
                    writes.append(kv_write(BUCKET_DEDUPE.name, body, encoded, revision=0))
                results = await self.send(writes)
                first = False
                if body is not None:
                    body_result = results[1]
                if isinstance(results[0], PublishResult):
                    if body is None or isinstance(body_result, PublishResult):  # (the hot path: no extra await)
                        return claim, results[0].seq, encoded
                    return await self._won(store, key, body, body_result, claim, results[0].seq, encoded)
                if not isinstance(results[0], Conflict):  # (a Conflict: the key exists, read it below)
                    log.warning("launch.bus_unavailable", error=repr(results[0]))
                    raise BusUnavailable(
                        "the event bus did not acknowledge in time; retry later", self._retry_after_s
                    ) from results[0]
            else:
                try:
                    created = await self.io(store.create(key, claim))
                except AlreadyExists:
                    pass
                else:
                    return await self._won(store, key, body, body_result, claim, created, None)
            await self.behind.settled()  # a mark of this replica still queued: read it, not the claim before it
            existing = await self.io(store.get(key))
            if existing is None:
                continue  # gone between the two calls (bucket TTL): claim again
            record = existing.value
            # The time as of this read (the claim above was built before two round trips): whether its lease
            # is over is judged on it, so a takeover due before the deadline below happens before it.
            now = datetime.now(UTC)
            if record.delivery_id == delivery.delivery_id and record.expires_at > now:
                # this very delivery again (a redelivered bus message): finish what it started
                if record.state in ("published", "queued"):
                    return record, None, None
                try:
                    return claim, await self.io(store.update(key, claim, existing.revision)), None
                except Conflict:
                    continue
            stale = (
                record.expires_at <= now
                or record.state == "released"
                or (record.state == "claimed" and (record.claimed_at or record.accepted_at) + lease <= now)
            )
            if stale:
                if record.state == "claimed" and record.expires_at > now:
                    log.warning("launch.stale_claim_taken_over", claimed_by=record.delivery_id)
                try:
                    taken = await self.io(store.update(key, claim, existing.revision))
                except Conflict:
                    continue  # another delivery took it over first
                return await self._won(store, key, body, body_result, claim, taken, None)
            if record.state in ("published", "queued"):
                return record
            # Another delivery holds a fresh claim and is publishing: wait for its outcome.
            if asyncio.get_running_loop().time() > deadline:
                raise BusUnavailable(
                    "another delivery of this event is still being published; retry later", self._retry_after_s
                )
            await asyncio.sleep(_POLL_S)

    async def _won(
        self,
        store: Store[DedupeRecord],
        key: str,
        body: str | None,
        body_result: PublishResult | BusError | None,
        claim: DedupeRecord,
        revision: int,
        encoded: bytes | None,
    ) -> tuple[DedupeRecord, int | None, bytes | None] | DedupeRecord:
        """The event id's claim is this delivery's (created or taken over): ``_claim``'s answer, once the body's key
        (a replay-guarded delivery whose body key was not created) says the body is not another event's."""
        if body is not None and not isinstance(body_result, PublishResult):
            replayed = await self._replayed(store, key, body, claim, revision, body_result)
            if replayed is not None:
                return replayed
        return claim, revision, encoded

    async def _replayed(
        self,
        store: Store[DedupeRecord],
        key: str,
        body: str,
        claim: DedupeRecord,
        revision: int,
        result: BusError | None,
    ) -> DedupeRecord | None:
        """The event id's claim (``key``, at ``revision``) is won but the body's key (``body``) was not created
        (``result``): the record of the delivery whose run this body already names (a replay: the claim is marked
        ``published`` naming that run), or ``None`` when the body is this event's own, or past its window (the
        launch goes on). A body key the bus did not take is a bus failure: the claim is released, 503."""
        try:
            if not isinstance(result, Conflict):
                log.warning("launch.bus_unavailable", error=repr(result))
                raise BusUnavailable("the event bus did not acknowledge in time; retry later", self._retry_after_s)
            found = await self.io(store.get(body))
            if found is None or found.value.expires_at <= datetime.now(UTC):
                # gone or past its window: this body is new again, from now on this event's (a race lost to a
                # concurrent copy leaves that copy's: one of them starts a run, as for a body seen the first time)
                if found is None:
                    await self.io(_unless_taken(store.create(body, claim)))
                else:
                    await self.io(_unless_taken(store.update(body, claim, found.revision)))
                return None
            if found.value.run_id == claim.run_id:
                return None  # this event's own body: a retry of its delivery id (after a 503, a skip, a crash)
            seen = found.value
            mark = DedupeRecord(
                trigger_id=claim.trigger_id,
                source_event_id=seen.source_event_id,
                run_id=seen.run_id,
                delivery_id=seen.delivery_id,
                accepted_at=claim.accepted_at,
                expires_at=claim.expires_at,
                state="published",
                claimed_at=claim.claimed_at,
            )
            if not await self.io(_unless_taken(store.update(key, mark, revision))):
                log.info("launch.claim_taken_over")
        except Exception:
            await self._release(store, key, claim, revision)
            raise
        log.warning(
            "launch.body_replayed",
            trigger_id=claim.trigger_id,
            source_event_id=claim.source_event_id,
            first_source_event_id=seen.source_event_id,
            run_id=seen.run_id,
        )
        return seen

    async def _release(self, store: Store[DedupeRecord], key: str, claim: DedupeRecord, revision: int) -> None:
        """Give a claim back after a failed publish, so a retry need not wait for the lease."""
        try:
            await self.io(store.update(key, evolve(claim, state="released"), revision))
        except Exception as exc:
            log.warning("launch.claim_not_released", error=repr(exc))

    async def io(self, call: Awaitable[T]) -> T:
        """Run one bus call; anything NATS-side becomes :class:`BusUnavailable` (503, the sender retries) -- but
        a lost compare-and-set (:class:`Conflict`, a :class:`TransientError` too) is raised as it is: every caller
        of an update here handles it (until 7 December it became a 503 and those handlers never ran)."""
        if not self.bus.nc.is_connected:
            if asyncio.iscoroutine(call):
                call.close()
            raise BusUnavailable("the event bus is not connected; retry later", self._retry_after_s)
        try:
            return await call
        except PermanentError as exc:  # e.g. larger than the server's max_payload: retrying cannot help
            log.warning("launch.unpublishable", error=repr(exc))
            raise BodyTooLarge(f"the normalized event cannot be published: {exc}") from exc
        except Conflict:  # the bus answered: a compare-and-set lost its race; the caller decides (re-read, give way)
            raise
        except Contended as exc:  # the bus answered: too many deliveries writing the same key at once
            log.warning("launch.contended", bucket=exc.bucket, key=exc.key, attempts=exc.attempts)
            raise BusUnavailable(
                f"too many deliveries are changing the same state ({exc.bucket}) at once; retry later",
                self._retry_after_s,
            ) from exc
        except (TransientError, nats.errors.Error, TimeoutError) as exc:
            log.warning("launch.bus_unavailable", error=repr(exc))
            raise BusUnavailable("the event bus did not acknowledge in time; retry later", self._retry_after_s) from exc
