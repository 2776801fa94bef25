"""Intake of ``human.requested``: check, persist, deliver, announce, arm the deadline.

Run by :class:`temporality_bus.Consumer` on ``CONSUMERS["human-interaction-requests"]``. The
decisions (:func:`authorize`, :func:`channel_candidates`) are pure; :class:`RequestHandler` does
the I/O in an order where every step is idempotent under redelivery:

1. SEC-1: the recipient must be ``user:<id>``, listed in the run's ``allowed_recipients`` and known to
   the directory; otherwise ``human.rejected`` (deterministic id) and nothing is stored. The policy is
   this service's own projection of the run's ``run.requested`` (:mod:`.policies`: the trigger's
   configuration), never the copy in ``human.requested``; it replaces that copy (timeout chain included).
   Not projected yet: retried with backoff, then refused.
2. Persist the record first (create-if-absent; on redelivery continue with the stored one), so an
   answer arriving before the notification is never lost. Just after, index it under its run
   (``runs.index_new_request``: with the deadline and who may answer it, the inbox's index too); if the
   run already ended (or withdrew it), cancel it here -- told by the replica's mirror once it has applied that
   run entry, without a read (:mod:`.runs` says why the order makes that safe). A redelivery that finds it
   cancelled so publishes its ``human.withdrawn`` when the record does not say that was done (the delivery that
   cancelled it failed before: nothing else would ever publish it).
3. Arm the deadline as a JetStream message schedule (deterministic ``Nats-Msg-Id``: a repeat is
   deduplicated, and the deadline handler ignores a request that is no longer pending) *before*
   delivering: a request whose delivery keeps failing (and is finally dead-lettered) still expires
   with its timeout policy (HUM-8) instead of leaving its run waiting forever.
4. Deliver along the profile (HUM-2): the preferred channel first, then the fallback order; a channel
   whose adapter does not run here, is down, has no identity for the person or refuses the delivery
   is skipped for the next. Record the channel, the sent copy (what the transport needs to edit it and
   bind replies) and the failed attempts in one compare-and-set. The web inbox sends nothing (its delivery is
   the stored record): when it is the first channel with an adapter here, its delivery is made before step 2
   and stored in the create, with no compare-and-set (:func:`.delivery.deliver_with_record`); a request the
   intake then cancels (its run ended first) has it taken back in the cancel's compare-and-set.
   (Before it is stored the record passes the egress policy, :mod:`.egress`: secrets in the title, the
   question, the context and the options are redacted, the counts kept in ``redactions``.)
5. Once delivered, arm the timer of the timeout policy chain's first step (a reminder or the
   escalation, :mod:`.chain`; deduplicated per step, so a redelivery arms nothing new).
6. Publish ``human.notified`` (deterministic id) with ``channel``, ``fallback_from`` and
   ``failed_attempts`` (each channel tried before, and why it failed): every attempt is journaled.

**Given up** (:meth:`RequestHandler.on_dead_letter`, the consumer's dead-letter hook): an intake that fails for good
before step 3 -- between the record and its run entry (every delivery failing to write ``human-channels``, ~80 s of
them), or before the record -- would leave its run waiting forever (no deadline is armed yet) and a stored question
no inbox, sweep, run end or start lists. The hook completes a stored request without delivering it (run entry,
the run's end checked, deadline, chain step, ``human.notified`` if delivered: it is listed and expires with its
timeout policy, HUM-8), and for one never stored stores a ``cancelled`` stand-in (``intake_failed``; none of the
question) and publishes ``human.rejected`` (``intake_failed``), so the run resumes with that error and no later copy
of the event asks the question. Nothing of it runs on the normal path: no request to the bus is added there.

The writes of steps 5 and 6 -- the chain's first step, ``human.notified`` -- and, for a web inbox question (its
delivery is the stored record), step 3's deadline before them go out together in one pipelined round trip
(``bus.pipeline.send``, in that order), not one after the other; a channel that sends (Telegram, Matrix, a group)
still has its deadline armed alone before it sends. Each write of the round is stored or not on its own:
``human.notified`` can be stored while the deadline's (or the chain step's) write failed (each failed write is
logged as ``request.write_failed``; the stored event as ``request.notified`` with ``timers_failed`` naming those
timers). Any failed write fails the handler, and the redelivery writes all of them again under the same msg
ids: the missing timer is armed then, what was stored is deduplicated. Until then the question is announced
without that timer; should every delivery fail, the dead-letter hook (below) arms it.

A ``group:<id>`` recipient (listed itself in ``policy.allowed_recipients``) is asked through the same
path: its members are fixed in the record when it is stored (``members``), and step 4 runs for each
member in turn, on that member's own preferred channel and fallback, one compare-and-set per member
reached (a redelivery skips the members who already have a copy). Any member may answer; the first
valid answer is bound (the one compare-and-set of :mod:`.answers`) and every copy, on every member's
channel, is edited to say who answered. A member no channel reaches is listed in ``failed_attempts``
(``error`` starts with the member); only when no member at all can be reached is it transient.
``human.notified`` is published once for the request: ``channel`` is the first member's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal

import structlog

from temporality_bus import (
    AlreadyExists,
    Bus,
    Delivery,
    NotFound,
    PermanentError,
    PublishResult,
    TransientError,
    Versioned,
    evolve,
)
from temporality_bus.pipeline import Write, event_write
from temporality_human_interaction.chain import configured_steps, next_step, plan
from temporality_human_interaction.channels import ChannelAdapter, DeliveryReceipt
from temporality_human_interaction.channels.refs import ref_key
from temporality_human_interaction.delivery import deliver_along, deliver_with_record
from temporality_human_interaction.directory import (
    Directory,
    UserProfile,
    group_id_of,
    recipient_for,
    user_id_of,
)
from temporality_human_interaction.egress import DEFAULT_POLICY, EgressPolicy
from temporality_human_interaction.events import RejectReason, notified_event, rejected_event, rejected_event_of
from temporality_human_interaction.inbox import answerers, mark_run_entry_ended
from temporality_human_interaction.mirror import ChannelMirror
from temporality_human_interaction.parking import park, parked_event, unpark
from temporality_human_interaction.policies import PolicyPending, PolicyUnknown, RunPolicies, asks_nobody
from temporality_human_interaction.records import (
    HumanRequestRecord,
    RecentRecords,
    RequestStore,
    SentCopy,
    is_request_id,
    open_store,
)
from temporality_human_interaction.runs import cancel_pending, index_new_request, index_request, run_ended, withdrawn
from temporality_human_interaction.timers import arm_deadline, chain_step_write, deadline_write
from temporality_protocol import Envelope, HumanRejected, HumanRequested, HumanRequestState, ProtocolError
from temporality_protocol.events import MAX_TEXT, DeliveryAttempt

if TYPE_CHECKING:
    from temporality_human_interaction.metrics import RequestObserver

__all__ = [
    "ChannelChoice",
    "Member",
    "Refusal",
    "RequestHandler",
    "Route",
    "authorize",
    "channel_candidates",
]

log = structlog.get_logger(__name__)
#: What each write of the intake's last pipelined round is (its outcome logged as such).
_IntakeWrite = Literal["deadline", "chain", "notified"]

#: A ``human.requested`` is stamped a moment after the run-executor computed its deadline from the same
#: policy: a deadline within this much of ``time + max_timeout_s`` is the executor's own, not a widening.
_DEADLINE_SLACK = timedelta(seconds=60)


@dataclass(frozen=True)
class Refusal:
    reason: RejectReason
    detail: str


@dataclass(frozen=True)
class Member:
    """One person a request goes to: ``user:<id>`` and their profile."""

    recipient: str
    profile: UserProfile


@dataclass(frozen=True)
class Route:
    """Who is asked: one person, or every member of a group (``group`` True)."""

    members: tuple[Member, ...]
    group: bool = False

    @property
    def profile(self) -> UserProfile:
        """The (first) person's profile: whose preferred channel ``human.notified`` reports."""
        return self.members[0].profile


@dataclass(frozen=True)
class ChannelChoice:
    channel: str
    #: The preferred channel this one stands in for (``human.notified.fallback_from``), if any.
    fallback_from: str | None


def authorize(payload: HumanRequested, directory: Directory) -> Route | Refusal:
    """SEC-1 and basic sanity: may this run ask this person, and can the person answer at all?"""
    user_id, group_id = user_id_of(payload.recipient), group_id_of(payload.recipient)
    if user_id is None and group_id is None:
        return Refusal(
            "recipient_not_allowed", f"recipient {payload.recipient!r} is not of the form user:<id> or group:<id>"
        )
    if payload.recipient not in payload.policy.allowed_recipients:
        return Refusal(
            "recipient_not_allowed",
            f"{payload.recipient} is not among the recipients this run's trigger allows",
        )
    route = route_of(payload.recipient, directory)
    if isinstance(route, Refusal):
        return route
    if not is_request_id(payload.request_id):
        return Refusal("invalid_request", "request_id must be 1-128 characters of A-Z a-z 0-9 _ -")
    option_ids = [o.id for o in payload.options]
    if len(set(option_ids)) != len(option_ids):
        return Refusal("invalid_request", "option ids must be unique")
    if not option_ids and not payload.allow_free_text:
        return Refusal("invalid_request", "no options and no free text: the person could not answer")
    on_timeout = payload.policy.on_timeout
    if on_timeout.action == "default" and on_timeout.default_option not in option_ids:
        return Refusal("invalid_request", f"the timeout default {on_timeout.default_option!r} is not an option")
    return route


def route_of(recipient: str, directory: Directory) -> Route | Refusal:
    """The people behind ``recipient`` as the directory stands now (a group: its members still in it)."""
    user_id = user_id_of(recipient)
    if user_id is not None:
        profile = directory.get(user_id)
        if profile is None:
            return Refusal("unknown_recipient", f"{recipient} is not in the user directory")
        return Route((Member(recipient, profile),))
    group_id = group_id_of(recipient)
    group = directory.group(group_id) if group_id is not None else None
    if group is None:
        return Refusal("unknown_recipient", f"{recipient} is not a group of the user directory")
    members = tuple(
        Member(recipient_for(m), profile) for m in group.members if (profile := directory.get(m)) is not None
    )
    if not members:
        return Refusal("unknown_recipient", f"none of the members of {recipient} is in the user directory")
    return Route(members, group=True)


def channel_candidates(profile: UserProfile, adapters: Mapping[str, ChannelAdapter]) -> list[ChannelChoice]:
    """HUM-2: the profile's channels in preference order, keeping those whose adapter is available now."""
    choices: list[ChannelChoice] = []
    for name in profile.channel_order():
        adapter = adapters.get(name)
        if adapter is not None and adapter.available and adapter.reaches(profile):
            choices.append(ChannelChoice(name, None if name == profile.preferred else profile.preferred))
    return choices


class RequestHandler:
    """The ``human.requested`` handler; :meth:`handle` is what the consumer calls."""

    def __init__(
        self,
        bus: Bus,
        directory: Directory,
        adapters: Mapping[str, ChannelAdapter],
        *,
        egress: EgressPolicy | None = None,
        policies: RunPolicies | None = None,
        observer: RequestObserver | None = None,
        mirror: ChannelMirror | None = None,
        recent: RecentRecords | None = None,
    ) -> None:
        self._bus = bus
        #: ``human-channels`` as this replica's watch sees it (the run entry's mark when a request is cancelled).
        self._mirror = mirror
        #: Where the record as delivered is left for the answer's compare-and-set (:class:`~.records.RecentRecords`).
        self._recent = recent
        #: Told each request this handler cancelled at intake (its run had ended): the wait-time histogram.
        self._observer = observer
        self._directory = directory
        self._adapters = dict(adapters)
        self._egress = egress or DEFAULT_POLICY
        #: SEC-1: the runs' policies as this service projected them from ``run.requested`` (:mod:`.policies`).
        #: ``None`` trusts the event's copy (unit tests of the handler alone); the service always passes one.
        self._policies = policies

    async def handle(self, event: Envelope, delivery: Delivery | None = None) -> None:
        payload = event.payload(HumanRequested)  # invalid data -> ProtocolError -> dead-lettered
        with structlog.contextvars.bound_contextvars(request_id=payload.request_id, run_id=payload.run_id):
            if self._policies is not None and asks_nobody(payload.policy):  # no policy is stored for such a run
                detail = f"run {payload.run_id}'s policy allows no recipient: nobody may be asked"
                await self._reject(event, payload, Refusal("recipient_not_allowed", detail))
                return
            if self._policies is not None:
                try:
                    projected = await self._policies.get(payload.run_id, delivery)
                except PolicyUnknown as unknown:
                    await self._reject(event, payload, Refusal("recipient_not_allowed", str(unknown)))
                    return
                except PolicyPending:  # the projection is catching up: wait on durable timers (.parking)
                    await park(self._bus, event, payload.run_id, payload.request_id, payload.expires_at)
                    if await self._policies.lookup(payload.run_id) is not None:  # came meanwhile: take it now
                        await self.resume_parked(payload.run_id, payload.request_id, final=False)
                    return
                projected = projected.for_question(payload.options)  # as the executor applied it (HumanPolicy)
                if projected != payload.policy:
                    log.warning(
                        "request.policy_differs",
                        detail="human.requested carries another policy than its run.requested: the latter applies",
                        claimed=payload.policy.allowed_recipients,
                        projected=projected.allowed_recipients,
                    )
                payload = payload.model_copy(update={"policy": projected})
                # the executor computed the deadline from its copy: never longer than the trigger allows
                latest = event.time + timedelta(seconds=projected.max_timeout_s) + _DEADLINE_SLACK
                if payload.expires_at > latest:
                    log.warning(
                        "request.deadline_capped", claimed=payload.expires_at.isoformat(), to=latest.isoformat()
                    )
                    payload = payload.model_copy(update={"expires_at": latest, "timeout_s": projected.max_timeout_s})
            await self._handle(event, payload)

    async def _handle(self, event: Envelope, payload: HumanRequested) -> None:
        decision = authorize(payload, self._directory)
        if isinstance(decision, Refusal):
            if decision.reason == "unknown_recipient" and await self._stored_before(payload):
                return
            await self._reject(event, payload, decision)
            return
        store = await open_store(self._bus)
        reachable = [m for m in decision.members if channel_candidates(m.profile, self._adapters)]
        members = [m.recipient for m in decision.members] if decision.group else []
        # The record first, then its run entry (runs.py says why the run's end then never misses it): a create that
        # finds the id stored already (a redelivery, or another delivery of the same event) reads the stored one.
        #: The record as this call stored it (value and revision): the delivery's compare-and-set starts from it
        #: instead of reading it back (``Store.modify(known=...)``: a stale one only costs that read again).
        known: Versioned[HumanRequestRecord] | None = None
        stored = None if reachable else await store.get(payload.request_id)
        if stored is None:
            if not reachable:
                orders = "; ".join(f"{m.recipient}: {m.profile.channel_order()}" for m in decision.members)
                detail = f"no channel has an available adapter ({orders})"
                if not decision.group:
                    detail = f"none of {decision.profile.channel_order()} has an available adapter"
                await self._reject(event, payload, Refusal("no_channel", detail))
                return
            # SEC-1 / HUM-5: secrets never reach the store, so no channel, API or reminder can show them.
            record = self._egress.redact_record(HumanRequestRecord.from_requested(event, payload, members))
            if record.redactions:
                log.info("request.redacted", redacted=record.redactions)
            if not decision.group:  # the web inbox: its delivery is the record, stored with it (no second write)
                record = await self._delivered_with_record(record, decision.profile)
            try:
                known = Versioned(record, await store.create(payload.request_id, record))
            except AlreadyExists:
                log.info("request.already_stored")
                stored = await store.get(payload.request_id)
                if stored is None:  # pragma: no cover - requests are never deleted
                    raise TransientError(f"request {payload.request_id} vanished after AlreadyExists") from None
                record = stored.value
            else:
                if record.channel is not None:  # the web inbox delivery stored with it: made, and counted now
                    self._count_delivered(record.channel)
                    if self._recent is not None:  # the answer's compare-and-set base
                        self._recent.put(payload.request_id, known)
                log.info("request.stored", recipient=payload.recipient, expires_at=record.expires_at.isoformat())
                dropped = configured_steps(record.policy.on_timeout) - len(plan(record))
                if dropped:  # the deadline wins: say so, the trigger's chain does not fit this timeout
                    log.warning("chain.steps_beyond_deadline", dropped=dropped, timeout_s=payload.timeout_s)
        else:
            record = stored.value
            log.info("request.redelivered", status=record.status.value, channel=record.channel)
        if record.run_id != payload.run_id or record.recipient != payload.recipient:
            raise PermanentError(
                f"request id {payload.request_id} is already used by run {record.run_id} for {record.recipient}"
            )
        if record.pending:  # index it under its run, then check the run has not ended meanwhile (runs.py)
            ended = await self._indexed(record, created=known is not None)
            if ended is not None:
                # A web inbox delivery stored with the record stays in it: the inbox listed the request from its
                # create, so it was delivered, and is announced below like any delivered request (human.notified
                # whenever the record has a channel, whichever cancel won and on every redelivery).
                cancelled = await cancel_pending(
                    self._bus, record.request_id, ended, None, self._observer, self._mirror
                )
                record = cancelled or record
                known = None
        else:  # cancelled by a delivery before this one, which may have failed before its human.withdrawn
            record = await self._announce_withdrawal(record)

        #: The writes that end the intake, sent together in one pipelined round trip (in this order): the deadline
        #: (unless armed before a channel sends below), the chain's next step, ``human.notified``. Each is stored or
        #: not on its own: ``human.notified`` may be stored while a timer's write failed (the module's docstring).
        writes: list[tuple[_IntakeWrite, Write]] = []
        if record.pending:  # before delivery: a request that can never be delivered still expires (HUM-8)
            if decision.group or record.channel is None:  # a channel sends below: armed before it does
                await self._schedule_deadline(record)
            else:  # the web inbox's delivery is the record, stored already: armed with what follows
                writes.append(("deadline", deadline_write(self._bus, record.request_id, record.expires_at)))
        if record.pending and not decision.group and record.channel is None:
            receipt, failures = await self._deliver(record, decision.profile)
            record = await self._record_delivery(store, record.request_id, receipt, failures, known=known)
        elif record.pending and decision.group:
            record = await self._deliver_to_members(store, record, decision)
        step = next_step(record)
        if record.pending and record.channel is not None and step is not None:
            # delivered: the timeout policy's chain starts (HUM-8). ``record`` is this call's copy: an answer bound
            # (or a cancel) since it was stored still gets the step armed -- the inbox lists the request from the
            # create on. Its firing reads the record and does nothing for a request no longer pending
            # (deadlines.py): one timer, not re-read here to save it.
            writes.append(("chain", chain_step_write(self._bus, record.request_id, step.index, step.at)))
        fallback_from = None
        if record.channel is not None:
            fallback_from = None if record.channel == decision.profile.preferred else decision.profile.preferred
            truncated = self._egress.truncated(record, record.channel)
            notified = notified_event(record, channel=record.channel, fallback_from=fallback_from, truncated=truncated)
            writes.append(("notified", event_write(notified)))
        # one round trip; any failure fails the handler after the others are stored: its redelivery sends them all
        # again (same msg ids: the failed one is written then, the stored ones are deduplicated)
        outcomes = await self._bus.pipeline.send([write for _, write in writes]) if writes else []
        failed = [
            (what, outcome)
            for (what, _), outcome in zip(writes, outcomes, strict=True)
            if not isinstance(outcome, PublishResult)
        ]
        for (what, _), outcome in zip(writes, outcomes, strict=True):
            if not isinstance(outcome, PublishResult):
                log.warning("request.write_failed", write=what, error=repr(outcome))
            elif what == "deadline":
                log.info("deadline.scheduled", at=record.expires_at.isoformat(), duplicate=outcome.duplicate)
            elif what == "chain" and step is not None:
                log.info(
                    "chain.step_armed",
                    step=step.index,
                    kind=step.kind,
                    at=step.at.isoformat(),
                    duplicate=outcome.duplicate,
                )
            elif what == "notified":
                # stored, whatever else failed: ``timers_failed`` names a timer this delivery did not arm (the
                # redelivery arms it)
                log.info(
                    "request.notified",
                    channel=record.channel,
                    fallback_from=fallback_from,
                    failed=[f.channel for f in record.failed_deliveries],
                    timers_failed=[w for w, _ in failed],
                )
        if failed:
            raise failed[0][1]

    async def _delivered_with_record(self, record: HumanRequestRecord, profile: UserProfile) -> HumanRequestRecord:
        """``record`` with its delivery, when the person's first channel with an adapter here delivers by the stored
        record itself (the web inbox: :func:`.delivery.deliver_with_record`): the create then stores the channel, the
        sent copy and the channels tried before (none of them has an adapter here), and no compare-and-set after it
        records them. Otherwise ``record`` as it is, delivered once it is stored (a channel that sends)."""
        delivered = await deliver_with_record(self._adapters, record, profile)
        if delivered is None:
            return record
        receipt, failures = delivered
        copy = SentCopy(
            channel=receipt.channel,
            reference=receipt.reference or record.request_id,
            address=receipt.address,
            sent_at=datetime.now(UTC),
        )
        return evolve(record, channel=receipt.channel, deliveries=[copy], failed_deliveries=failures)

    def _count_delivered(self, channel: str) -> None:
        """Count the delivery stored with the record this call created (:meth:`_delivered_with_record`), once:
        made before the create, it is counted only when the create succeeded (not for a record another delivery
        stored first, whose intake counted its own)."""
        adapter = self._adapters.get(channel)
        if adapter is not None:
            adapter.count("delivered")

    async def _indexed(self, record: HumanRequestRecord, *, created: bool) -> str | None:
        """Index the stored ``record`` under its run (its run entry: create-if-absent), then say why its run no longer
        needs it (:meth:`_ended`). ``created``: this call created the record just before."""
        if not created:  # a redelivery, or another delivery stored it first: index the stored record as it is
            await index_request(self._bus, record.run_id, record.request_id, record.expires_at, answerers(record))
            return await self._ended(record)
        indexed_at = await index_new_request(
            self._bus, record.run_id, record.request_id, record.expires_at, answerers(record)
        )
        return await self._ended(record, indexed_at)

    async def _ended(self, record: HumanRequestRecord, indexed_at: int | None = None) -> str | None:
        """Why ``record``'s run no longer needs it: the event type that ended the run (``runend.<run>``),
        ``not_needed`` when the run withdrew it (HUM-7, ``withdrawn.<run>.<id>``), None when neither.

        Asked once the record is stored and then its run entry: the run's end (or the withdrawal) writes its marker
        and then looks for the run's requests (the run entries) and their records, so one of the two sees the
        other. ``indexed_at``: the revision of the run entry this call created, after the record -- then the
        replica's mirror answers once it has applied that revision (no read): a marker written before the entry
        is in it; one written after it found the entry, and the record stored before the entry, and cancelled it
        (runs.py). Otherwise (a redelivery, an entry there already, the mirror's watch down or not there in
        time) both markers are read from the bucket."""
        run_id, request_id = record.run_id, record.request_id
        mirror = self._mirror
        if indexed_at is not None and mirror is not None and await mirror.reached(indexed_at):
            ended_by = mirror.get(ref_key("runend", run_id))
            ended = ended_by.value if ended_by is not None else None
            taken_back = mirror.get(ref_key("withdrawn", run_id, request_id)) is not None
        else:
            # both markers read at once (one round trip): the withdrawal's is read for nothing when the run ended
            ended, taken_back = await asyncio.gather(
                run_ended(self._bus, run_id), withdrawn(self._bus, run_id, request_id)
            )
        if ended is None and taken_back:
            ended = "not_needed"  # HUM-7: its run withdrew it before it was stored
        return ended

    async def _stored_before(self, payload: HumanRequested) -> bool:
        """A redelivery of a request stored before its recipient left the directory (the directory is live):
        never reject a request that exists. It is completed as stored (:meth:`_complete_stored`: indexed under its
        run, its deadline re-armed -- deduplicated) and expires with its timeout policy; if it was delivered, its
        ``human.notified`` is published again (same id)."""
        got = await (await open_store(self._bus)).get(payload.request_id)
        if got is None or got.value.run_id != payload.run_id or got.value.recipient != payload.recipient:
            return False
        record = got.value
        log.warning("request.recipient_left_directory", recipient=record.recipient, status=record.status.value)
        await self._complete_stored(record)
        return True

    async def on_dead_letter(self, message: Envelope | bytes, delivery: Delivery, error: BaseException) -> None:
        """The consumer gives a ``human.requested`` up (a permanent error, every delivery spent -- e.g. ~80 s of
        failed bus writes --, or a delivery past the limit that never ran the handler): the intake's last word, so
        that the run that asked is never left waiting forever and no stored question is left that nothing lists.

        * The request is stored (for this run and recipient): it is completed as stored, without delivering it
          (:meth:`_complete_stored`): its run entry (the inbox, the sweep, the run's end and the start find it
          there), the run's end or withdrawal checked, its deadline (and the chain's next step) armed,
          ``human.notified`` published again if it was delivered -- so it expires with its timeout policy (HUM-8)
          unless it is answered first, as a request whose every delivery failed does.
        * It is not stored: a record ``cancelled`` with :attr:`~.records.HumanRequestRecord.intake_failed` is
          stored in its place (create-if-absent: an intake of the same event that stores the question first wins,
          and is completed as above), indexed as ended, and ``human.rejected`` (reason ``intake_failed``, the detail
          saying the intake failed and why; deterministic id) resumes the run with that error. The record keeps a
          later delivery of the same event (one published again after the duplicate window) from asking the
          question after the run was told.
        * Its id is another run's (or recipient's) request, or the event does not read: ``human.rejected``
          (``invalid_request``) only -- the same refusal whichever delivery comes.

        Idempotent (create-if-absent, claims, deterministic ids): the runner calls it again until it succeeds --
        a failing hook (the bus still failing) is retried as the message's dead-lettering is, never skipped."""
        if not isinstance(message, Envelope) or message.type != HumanRequested.EVENT_TYPE:
            return
        # (redacted: an error may quote what it failed on -- a validation error the event's data)
        why = self._egress.redact_text(
            f"given up after {delivery.num_delivered} deliveries: {type(error).__name__}: {error}"
        )
        try:
            payload = message.payload(HumanRequested)
        except ProtocolError:
            await self._reject_unreadable(message, why)
            return
        with structlog.contextvars.bound_contextvars(request_id=payload.request_id, run_id=payload.run_id):
            log.warning("request.dead_lettered", error=repr(error), deliveries=delivery.num_delivered)
            if not is_request_id(payload.request_id):  # refused the same way by any delivery: nothing to store
                await self._reject(message, payload, Refusal("invalid_request", why[:MAX_TEXT]))
                return
            store = await open_store(self._bus)
            got = await store.get(payload.request_id)
            if got is None:
                # the stand-in keeps none of the question (never checked nor redacted: it may be a request SEC-1 would
                # refuse), nothing is to fire for it (its deadline: now), and it asks nobody
                now = datetime.now(UTC)
                stand_in = HumanRequestRecord.from_requested(message, payload).moved_to(
                    HumanRequestState.CANCELLED,
                    title="",
                    question="",
                    context="",
                    options=[],
                    answer_schema=None,
                    source_link=None,
                    expires_at=min(payload.expires_at.astimezone(UTC), now),
                    ended_at=now,
                    intake_failed=why[:MAX_TEXT],
                )
                try:
                    await store.create(payload.request_id, stand_in)
                except AlreadyExists:  # an intake of the same event stored the question meanwhile: completed below
                    got = await store.get(payload.request_id)
                    if got is None:  # pragma: no cover - requests are never deleted
                        raise TransientError(f"request {payload.request_id} vanished after AlreadyExists") from None
                else:
                    log.warning("request.intake_failed", detail=stand_in.intake_failed)
            record = got.value if got is not None else stand_in
            if record.run_id != payload.run_id or record.recipient != payload.recipient:
                detail = (
                    f"request id {payload.request_id} is already used by run {record.run_id} for {record.recipient}"
                )
                await self._reject(message, payload, Refusal("invalid_request", detail))
                return
            record = await self._complete_stored(record)
            if record.intake_failed is not None:
                detail = f"human-interaction could not take the request in ({record.intake_failed})"[:MAX_TEXT]
                await self._reject(message, payload, Refusal("intake_failed", detail))

    async def _complete_stored(self, record: HumanRequestRecord) -> HumanRequestRecord:
        """What makes a stored request listed, ended with its run and expiring, as its intake does, without
        delivering it (a redelivery that cannot deliver any more, or the intake's dead-letter hook): its run
        entry (create-if-absent), the run's end and withdrawal markers read from the bucket (cancelled if either
        is there), then -- while it is pending -- its deadline and the chain's next step, and ``human.notified``
        when it was delivered, in one pipelined round (the intake's msg ids: a repeat is deduplicated). A request
        that ended has its run entry marked ended. The record as it stands after."""
        if record.pending:
            await index_request(self._bus, record.run_id, record.request_id, record.expires_at, answerers(record))
            ended = await self._ended(record)  # (no revision of its own: both markers read from the bucket)
            if ended is not None:
                cancelled = await cancel_pending(
                    self._bus, record.request_id, ended, None, self._observer, self._mirror
                )
                record = cancelled or record
        else:  # its run entry marked ended (created so when missing): listed by no inbox, purged in time
            record = await self._announce_withdrawal(record)  # a cancel before this call may not have said so
            await mark_run_entry_ended(self._bus, record, self._mirror)
        writes: list[tuple[_IntakeWrite, Write]] = []
        if record.pending:
            writes.append(("deadline", deadline_write(self._bus, record.request_id, record.expires_at)))
            step = next_step(record)
            if record.channel is not None and step is not None:
                writes.append(("chain", chain_step_write(self._bus, record.request_id, step.index, step.at)))
        if record.channel is not None:
            truncated = self._egress.truncated(record, record.channel)
            fallback_from = self._fallback_from(record)
            notified = notified_event(record, channel=record.channel, fallback_from=fallback_from, truncated=truncated)
            writes.append(("notified", event_write(notified)))
        outcomes = await self._bus.pipeline.send([write for _, write in writes]) if writes else []
        for (what, _), outcome in zip(writes, outcomes, strict=True):
            if not isinstance(outcome, PublishResult):
                log.warning("request.write_failed", write=what, error=repr(outcome))
                raise outcome
        log.info("request.completed_as_stored", status=record.status.value, channel=record.channel)
        return record

    async def _announce_withdrawal(self, record: HumanRequestRecord) -> HumanRequestRecord:
        """Publish the ``human.withdrawn`` still owed for ``record``: one cancelled because its run ended or withdrew
        it (not a stand-in the intake gave up on, ``intake_failed``) whose record does not say it was published.
        A delivery before this one cancelled it here and then failed (a timeout on the publish, a crash) before its
        event was on the bus; this delivery finds it no longer pending, so does not cancel it, and nothing else
        would ever publish it. :func:`.runs.cancel_pending` (safe to repeat: it cancels nothing more) publishes it,
        with the reason the cancel stored, then marks the record. The record as it stands after."""
        if (
            record.status is not HumanRequestState.CANCELLED
            or record.withdrawal_published
            or record.intake_failed is not None
        ):
            return record
        # the reason the cancelling compare-and-set stored; a record cancelled before it was stored: the markers'
        because = record.withdrawn_because or await self._ended(record)
        if because is None:
            log.warning("request.withdrawal_unnamed", status=record.status.value)
            return record
        log.info("request.withdrawal_owed", because=because)
        announced = await cancel_pending(self._bus, record.request_id, because, None, self._observer, self._mirror)
        return announced or record

    def _fallback_from(self, record: HumanRequestRecord) -> str | None:
        """``human.notified.fallback_from`` for ``record``'s channel: the preferred channel of the (first) person
        asked, as the directory says now, when another channel carried it."""
        route = route_of(record.recipient, self._directory)
        if isinstance(route, Refusal) or record.channel == route.profile.preferred:
            return None
        return route.profile.preferred

    async def _reject_unreadable(self, event: Envelope, why: str) -> None:
        """``human.rejected`` (``invalid_request``) for a ``human.requested`` whose data does not read, when it
        names its request and run at all (otherwise nobody waits on it that could be told)."""
        data = event.data
        request_id, run_id, recipient = data.get("request_id"), data.get("run_id"), data.get("recipient")
        if not isinstance(request_id, str) or not isinstance(run_id, str):
            return
        rejected = HumanRejected(
            request_id=request_id,
            run_id=run_id,
            recipient=recipient if isinstance(recipient, str) else "",
            reason="invalid_request",
            detail=f"the request does not read ({why})"[:MAX_TEXT],
        )
        await self._bus.publish(rejected_event_of(event, rejected))
        log.warning("request.rejected", reason="invalid_request", detail=rejected.detail, request_id=request_id)

    async def resume_parked(self, run_id: str, request_id: str, *, final: bool) -> None:
        """A parked request's timer fired (:mod:`.parking`): take it in once its run's policy is known; at its
        deadline (``final``) without one, refuse it. Either way the parked entry goes, after the intake
        (idempotent: a crash in between takes it in again on the timer's redelivery)."""
        event = await parked_event(self._bus, run_id, request_id)
        if event is None:
            log.info("request.parked_gone", request_id=request_id)  # taken in already (another firing)
            return
        if self._policies is not None and not final and await self._policies.lookup(run_id) is None:
            log.info("request.still_parked", request_id=request_id)
            return
        with structlog.contextvars.bound_contextvars(resumed_from="parked"):
            await self.handle(event, None)  # no delivery: a policy still unknown is refused, never parked again
        await unpark(self._bus, run_id, request_id)

    async def _reject(self, event: Envelope, payload: HumanRequested, refusal: Refusal) -> None:
        await self._bus.publish(rejected_event(event, payload, refusal.reason, refusal.detail))
        log.warning("request.rejected", reason=refusal.reason, detail=refusal.detail, recipient=payload.recipient)

    async def _deliver(
        self, record: HumanRequestRecord, profile: UserProfile
    ) -> tuple[DeliveryReceipt, list[DeliveryAttempt]]:
        """HUM-2: the profile's channels in order until one carries the question (:func:`.delivery.deliver_along`);
        all failing is transient (the consumer retries with backoff)."""
        return await deliver_along(self._adapters, record, profile)

    async def _deliver_to_members(
        self, store: RequestStore, record: HumanRequestRecord, route: Route
    ) -> HumanRequestRecord:
        """A group request: each member (of those fixed in the record) not reached yet, on their own channels."""
        profiles = {m.recipient: m.profile for m in route.members}
        unreachable: list[DeliveryAttempt] = []
        for member in record.members:
            if record.reached(member):
                continue
            profile = profiles.get(member)
            if profile is None:
                unreachable.append(DeliveryAttempt(channel="none", error=f"{member}: no longer in the directory"))
                continue
            try:
                receipt, failures = await self._deliver(record, profile)
            except TransientError as exc:
                unreachable.append(DeliveryAttempt(channel="none", error=f"{member}: {exc}"[:MAX_TEXT]))
                continue
            failures = [DeliveryAttempt(channel=f.channel, error=f"{member}: {f.error}"[:MAX_TEXT]) for f in failures]
            record = await self._record_delivery(store, record.request_id, receipt, failures, recipient=member)
        if not record.deliveries:
            detail = "; ".join(f.error for f in unreachable) or "no member"
            raise TransientError(f"request {record.request_id} reached no member of {record.recipient}: {detail}")
        if unreachable:
            record = await self._record_failures(store, record.request_id, unreachable)
        return record

    async def _record_failures(
        self, store: RequestStore, key: str, failures: list[DeliveryAttempt]
    ) -> HumanRequestRecord:
        def record(current: HumanRequestRecord) -> HumanRequestRecord | None:
            new = [f for f in failures if f not in current.failed_deliveries]
            return evolve(current, failed_deliveries=[*current.failed_deliveries, *new]) if new else None

        try:
            return (await store.modify(key, record)).value
        except NotFound:  # pragma: no cover - requests are never deleted
            raise TransientError(f"request {key} vanished") from None

    async def _record_delivery(
        self,
        store: RequestStore,
        key: str,
        receipt: DeliveryReceipt,
        failures: list[DeliveryAttempt],
        *,
        recipient: str | None = None,
        known: Versioned[HumanRequestRecord] | None = None,
    ) -> HumanRequestRecord:
        """Record the channel that carried the question and the sent copy (to bind replies and edit it later).

        ``recipient``: the group member this copy went to (a group request has one copy per member).
        ``known``: the record as this intake stored it (the compare-and-set proves it still current)."""
        copy = SentCopy(
            channel=receipt.channel,
            reference=receipt.reference or key,
            address=receipt.address,
            sent_at=datetime.now(UTC),
            recipient=recipient,
        )

        def record(current: HumanRequestRecord) -> HumanRequestRecord | None:
            if recipient is None and current.channel is not None:  # another delivery of the same message won
                return None
            if recipient is not None and current.reached(recipient):
                return None
            return evolve(
                current,
                channel=current.channel or receipt.channel,
                deliveries=[*current.deliveries, copy],
                failed_deliveries=[*current.failed_deliveries, *failures] if recipient else failures,
            )

        try:
            written = await store.modify(key, record, known=known)
        except NotFound:  # pragma: no cover - requests are never deleted
            raise TransientError(f"request {key} vanished") from None
        if self._recent is not None and written.changed:
            self._recent.put(key, written)
        return written.value

    async def _schedule_deadline(self, record: HumanRequestRecord) -> None:
        result = await arm_deadline(self._bus, record.request_id, record.expires_at)
        log.info("deadline.scheduled", at=record.expires_at.isoformat(), duplicate=result.duplicate)
